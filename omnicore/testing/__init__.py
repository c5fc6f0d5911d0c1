"""Test machinery, kept out of the model: what proves on a CPU that the model's device path
would run on a GPU.

    strictxp.py    the strict test backend (OMNICORE_BACKEND=strict): arrays that refuse what
                   CuPy refuses, and any float64
    transfers.py   host <-> device transfers counted, and recorded work checked for host round
                   trips (what a CUDA graph could not hold)

The configuration step (omnicore.settings.configure) installs the strict backend when asked;
tests, benchmarks and tools/ import these modules directly. The product never does otherwise.
"""
