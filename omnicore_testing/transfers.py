"""Host <-> device transfers, counted, and device work that a CUDA graph could not record.

`start()` puts a counter on the model's transfers (omnicore.model.backend.set_observer): each
`to_device` / `to_numpy` that moves data is counted by kind, and so are, under the strict
backend, device scalars read back to Python (`float(a)`, `int(a)`, `bool(a)`, `a.item()`,
`a.tolist()`, kind "scalar"): on CuPy each of those is a copy and a synchronisation too.
`CheckedReplay` is the strict backend's stand-in for a CUDA graph: from the second call on it
refuses, with `CaptureError`, a host round trip inside the recorded work.
"""

from __future__ import annotations

import threading

from omnicore.model import backend

KINDS = ("to_device", "to_numpy", "scalar")
_counts = dict.fromkeys(KINDS, 0)
_lock = threading.Lock()
_capturing = threading.local()


class CaptureError(RuntimeError):
    """Device work passed to `backend.replay` reached for the host (a transfer, a scalar read or
    a data-sized result): a CUDA graph cannot record that."""


def count(kind: str) -> None:
    """One event: a transfer ("to_device", "to_numpy", "scalar") or a "sync" (an operation
    whose result size is data: no data moved, so not counted, but refused while capturing)."""
    if getattr(_capturing, "on", False):
        raise CaptureError(f"a host round trip ({kind}) inside work recorded by backend.replay: "
                           "a CUDA graph cannot hold it; move it out of the replayed function")
    if kind == "sync":
        return
    with _lock:
        _counts[kind] += 1


def start() -> None:
    """Count the model's transfers from now on (idempotent)."""
    backend.set_observer(count)


def transfers() -> dict:
    """Transfers counted so far, by kind: "to_device", "to_numpy" (calls that moved data; a
    to_numpy of a host array, a to_device of a device array and anything on the numpy backend
    move nothing and are not counted) and "scalar" (device scalars read by Python; seen by the
    strict backend only)."""
    with _lock:
        return dict(_counts)


def transfer_total() -> int:
    """All transfers so far, every kind (compare two readings to count a stretch of work)."""
    with _lock:
        return sum(_counts.values())


def _refill(dst, src) -> None:
    if isinstance(dst, (list, tuple)):
        for d, s_ in zip(dst, src, strict=True):
            _refill(d, s_)
    else:
        dst[...] = src


class CheckedReplay:
    """What `backend.replay` keeps per key under the strict backend: fn runs at every call, but
    from the second call on a transfer, scalar read or data-sized result inside it is a
    CaptureError, and the first call's arrays are handed back, refilled, as a graph replay
    would."""

    def __init__(self):
        self.out = None

    def __call__(self, fn):
        if self.out is None:
            self.out = fn()
            return self.out
        _capturing.on = True
        try:
            new = fn()
        finally:
            _capturing.on = False
        backend.note_graph("captured")
        _refill(self.out, new)
        return self.out
