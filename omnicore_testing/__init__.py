"""Test machinery, kept out of the installed package: what proves on a CPU that the model's device path
would run on a GPU.

    strictxp.py    the strict test backend (OMNICORE_BACKEND=strict): arrays that refuse what
                   CuPy refuses, and any float64
    transfers.py   host <-> device transfers counted, and recorded work checked for host round
                   trips (what a CUDA graph could not hold)

It stands beside `omnicore/` in a source checkout and is not shipped in the wheel. The configuration
step (omnicore.machinery.settings.configure) installs the strict backend when asked for it;
tests, benchmarks and tools/ import these modules directly, and nothing else in omnicore does.
"""
