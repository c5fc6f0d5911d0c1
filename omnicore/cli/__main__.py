"""`python -m omnicore.cli ...`: the `omnicore` command, for a checkout without the console script."""

import sys

from . import main

sys.exit(main())
