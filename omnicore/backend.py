"""The one place where omnicore chooses its array library.

Model code does `from omnicore.backend import xp` and writes `xp.matmul(...)`, never `np.`
for arrays that live on the compute device. With the default backend `xp` *is* numpy, so the
code reads exactly like plain numpy. Setting OMNICORE_BACKEND=cupy (with the `gpu` extra
installed) swaps in CuPy, which mirrors the numpy API on an NVIDIA GPU.

Numba kernels only accept numpy arrays; `omnicore.kernels` picks its plain-xp twins when the
backend is not numpy (that choice, too, is made once, in kernels.py, from `IS_NUMPY`).

OMNICORE_BACKEND=strict is a test backend, no faster than numpy: device arrays that are not
numpy arrays and refuse what CuPy refuses (implicit conversion to numpy, host arrays mixed into
device operations, Numba) plus float64 on the device (`omnicore/strictxp.py` lists the rules).
The test suite runs the pipeline under it, so a CPU-only machine proves the CuPy path has no
hidden host round trips and no float64.

Every host <-> device copy goes through `to_device` / `to_numpy`, which count them
(`transfers()`; with the numpy backend there are none, so nothing is counted). Under the strict
backend the counter also sees device scalars read back to Python (`float(a)`, `int(a)`,
`bool(a)`, `a.item()`, `a.tolist()`, kind "scalar"): on CuPy each of those is a copy and a
synchronisation too.
"""

import os
import threading

import numpy as np

from .errors import ConfigError

BACKEND = os.environ.get("OMNICORE_BACKEND", "numpy").strip().lower() or "numpy"

_TRANSFER_KINDS = ("to_device", "to_numpy", "scalar")
_transfers = dict.fromkeys(_TRANSFER_KINDS, 0)
_transfers_lock = threading.Lock()


def _count(kind: str) -> None:
    with _transfers_lock:
        _transfers[kind] += 1


def transfers() -> dict:
    """Host <-> device copies so far, by kind: "to_device", "to_numpy" (calls that moved data;
    a to_numpy of a host array, a to_device of a device array and anything on the numpy
    backend move nothing and are not counted) and "scalar" (device scalars read by Python;
    seen by the strict backend only)."""
    with _transfers_lock:
        return dict(_transfers)


def transfer_total() -> int:
    """All transfers so far, every kind (compare two readings to count a stretch of work)."""
    with _transfers_lock:
        return sum(_transfers.values())


if BACKEND == "numpy":
    xp = np
elif BACKEND == "cupy":
    try:
        import cupy as xp  # type: ignore[no-redef]
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ConfigError(
            "OMNICORE_BACKEND=cupy but CuPy is not importable; install the GPU extra for the "
            "machine's CUDA version (pip install 'omnicore[gpu-cuda12]' or 'omnicore[gpu-cuda13]'), "
            "or unset OMNICORE_BACKEND."
        ) from exc
elif BACKEND == "strict":
    from . import strictxp

    xp = strictxp.make_namespace(_count)  # type: ignore[assignment]
else:
    raise ConfigError(f"OMNICORE_BACKEND={BACKEND!r} is not one of 'numpy', 'cupy', 'strict' "
                      "(strict: a test backend that checks the device code paths on the CPU).")

IS_NUMPY = xp is np
IS_STRICT = BACKEND == "strict"


def _is_device(a) -> bool:
    if IS_NUMPY:
        return False
    return isinstance(a, strictxp.StrictArray) if IS_STRICT else isinstance(a, xp.ndarray)


def to_numpy(a):
    """Bring an array back to host memory as a numpy array (no copy when already numpy)."""
    if not _is_device(a):
        return np.asarray(a)
    _count("to_numpy")
    return strictxp.to_host(a) if IS_STRICT else xp.asnumpy(a)


def to_device(a, dtype=None):
    """Move a host array onto the compute device (a no-op view with the numpy backend); a
    device array is returned as it is (converted to `dtype` if given, on the device)."""
    if IS_NUMPY:
        return np.asarray(a, dtype=dtype)
    if _is_device(a):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    _count("to_device")
    if IS_STRICT:
        return strictxp.from_host(a, dtype)
    return xp.asarray(a, dtype=dtype)


def f32(a) -> np.ndarray:
    """A C-contiguous float32 host array (weights are converted once, at load)."""
    return np.ascontiguousarray(a, dtype=np.float32)
