"""`python -m omnicore ...`: the `omnicore` command, for a checkout without the console script."""

import sys

from .apps.cli import main

if __name__ == "__main__":  # run as a program, not when imported (e.g. by the import tests)
    sys.exit(main())
