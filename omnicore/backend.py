"""The one place where omnicore chooses its array library.

Model code does `from omnicore.backend import xp` and writes `xp.matmul(...)`, never `np.`
for arrays that live on the compute device. With the default backend `xp` *is* numpy, so the
code reads exactly like plain numpy. Setting OMNICORE_BACKEND=cupy (with the `gpu` extra
installed) swaps in CuPy, which mirrors the numpy API on an NVIDIA GPU.

Numba kernels only accept numpy arrays; `omnicore.kernels` picks its plain-xp twins when the
backend is not numpy (that choice, too, is made once, in kernels.py, from `IS_NUMPY`).
"""

import os

import numpy as np

from .errors import ConfigError

BACKEND = os.environ.get("OMNICORE_BACKEND", "numpy").strip().lower() or "numpy"

if BACKEND == "numpy":
    xp = np
elif BACKEND == "cupy":
    try:
        import cupy as xp  # type: ignore[no-redef]
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ConfigError(
            "OMNICORE_BACKEND=cupy but CuPy is not importable; install the GPU extra "
            "(pip install 'omnicore[gpu]') on a machine with CUDA 12, or unset OMNICORE_BACKEND."
        ) from exc
else:
    raise ConfigError(f"OMNICORE_BACKEND={BACKEND!r} is not one of 'numpy', 'cupy'.")

IS_NUMPY = xp is np


def to_numpy(a):
    """Bring an array back to host memory as a numpy array (no copy when already numpy)."""
    if IS_NUMPY:
        return np.asarray(a)
    return xp.asnumpy(a)


def to_device(a, dtype=None):
    """Move a host array onto the compute device (a no-op view with the numpy backend)."""
    return xp.asarray(a, dtype=dtype)


def f32(a) -> np.ndarray:
    """A C-contiguous float32 host array (weights are converted once, at load)."""
    return np.ascontiguousarray(a, dtype=np.float32)
