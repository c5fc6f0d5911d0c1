"""How a checkpoint is read: every tensor handed to its stage by exact key, and checked.

Each stage's `load_params` takes its tensors from a `ParamReader` by their checkpoint key
names, with the shape its config implies, and makes every layout change (transposes,
weight-norm folding) there, once. The reader refuses a missing, mis-shaped or non-finite
tensor with a WeightsError naming the file and key, and `finish` refuses a file with tensors
nobody took (a sign of a mismatched config).

Where the tensors come from is not the model's business: a dict of arrays (tests, converted
checkpoints), or a checkpoint file opened by the product (omnicore.machinery.checkpoint.SafetensorsFile),
which also gives a tensor's shape before reading it (`shape_of`), can leave a large table on
disk to be read by rows (`row_table`), and is closed with `close`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from ..errors import WeightsError
from .kernels import all_finite


class ParamReader:
    """Take tensors by exact checkpoint key, with shape checks and an all-keys-used audit.

    `take` is the only way model code gets a tensor, so a renamed, missing, mis-shaped or
    non-finite tensor always surfaces as a WeightsError naming the file and key. `finish` then
    checks that nothing in the file was silently ignored.

    `tensors` maps keys to arrays; read from a file, each tensor is read when it is taken, so
    tensors that are never taken (a skipped encoder half) are never read.
    """

    def __init__(self, tensors: Mapping[str, np.ndarray], file: str | os.PathLike = "<memory>"):
        self.tensors = tensors
        self.file = str(file)
        self.used: set[str] = set()
        self.skipped: set[str] = set()

    def __enter__(self) -> "ParamReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (row tables taken from it stop working); a no-op for a dict."""
        close = getattr(self.tensors, "close", None)
        if close is not None:
            close()

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def _checked_shape(self, key: str, shape) -> None:
        if key not in self.tensors:
            raise WeightsError(f"{self.file}: missing tensor {key!r}; the file does not match "
                               "this model's config (wrong or truncated checkpoint?)")
        shape_of = getattr(self.tensors, "shape_of", None)  # a file: from its header, unread
        have = tuple(shape_of(key)) if shape_of is not None else tuple(np.shape(self.tensors[key]))
        if shape is not None:
            ok = len(shape) == len(have) and all(s is None or s == a for s, a in zip(shape, have))
            if not ok:
                raise WeightsError(f"{self.file}: tensor {key!r} has shape {list(have)}, "
                                   f"the config implies {list(shape)}: checkpoint and config.json "
                                   "do not belong together")

    def take(self, key: str, shape: tuple[int, ...] | None = None, dtype=None) -> np.ndarray:
        """The tensor stored under `key`, checked against `shape` (None entries match any size)
        and, for floats, checked to hold no NaN or infinity."""
        self._checked_shape(key, shape)
        arr = self.tensors[key]
        if dtype is not None:
            if np.dtype(dtype).kind != arr.dtype.kind:
                raise WeightsError(f"{self.file}: tensor {key!r} has dtype {arr.dtype}, expected {np.dtype(dtype)}")
            arr = arr.astype(dtype, copy=False)
        if arr.dtype.kind == "f" and not all_finite(arr):
            bad = np.unravel_index(int(np.argmin(np.isfinite(arr))), arr.shape)
            raise WeightsError(f"{self.file}: tensor {key!r} holds NaN or infinite values (first at "
                               f"index {list(map(int, bad))}, value {arr[bad]}): the checkpoint is "
                               "corrupt; download it again")
        self.used.add(key)
        return arr

    def take_rows(self, key: str, shape: tuple[int, ...] | None = None):
        """A 2-D float tensor read by rows when they are indexed (rows are checked for NaN/inf
        as they are read), for tables far larger than the part a model uses. From an in-memory
        dict this is the (checked) array itself, which indexes the same way."""
        self._checked_shape(key, shape)
        row_table = getattr(self.tensors, "row_table", None)
        if row_table is None:
            return self.take(key, shape, np.float32)
        table = row_table(key)
        self.used.add(key)
        return table

    def skip(self, prefix: str) -> None:
        """Mark every key under `prefix` as deliberately unused (e.g. the codec's encoder half
        when only decoding) so that `finish` accepts them."""
        self.skipped.update(k for k in self.tensors if k.startswith(prefix))

    def finish(self) -> None:
        unused = sorted(set(self.tensors) - self.used - self.skipped)
        if unused:
            shown = ", ".join(repr(k) for k in unused[:5])
            more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
            raise WeightsError(f"{self.file}: {len(unused)} tensor(s) not used by the model: "
                               f"{shown}{more}; the checkpoint does not match its config.json")
