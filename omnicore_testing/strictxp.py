"""A test backend that behaves like a GPU array library where ports usually break (numpy inside).

`OMNICORE_BACKEND=strict` makes `omnicore.model.backend.xp` the namespace built here (`device()`,
which the configuration step hands to `backend.use`). Its arrays
(`StrictArray`) hold a numpy array and compute with numpy, so results are those of the numpy
code paths run on the same inputs, but they refuse what CuPy refuses, and a little more, so
that a CPU-only test run proves the model code is ready for the device:

* a StrictArray is not a `numpy.ndarray`; `np.asarray(a)`, `np.array(a)` and `a.__array__()`
  raise TypeError, as for a CuPy array, and Numba kernels cannot take one;
* `np.f(a)` (any numpy function or ufunc called on a device array) raises TypeError. CuPy would
  dispatch some of those to itself; refusing them means a `np.` in model code always means host
  data. The one exception is a numpy scalar operand (`np.float32(2) * a`), which is a scalar;
* host arrays never enter device operations implicitly: a numpy array (or a list) as an operand,
  an index or an assigned value, and `xp.asarray(host)` / `xp.array(host)`, raise TypeError.
  The only way in is `backend.to_device` and the only way out `backend.to_numpy`, both counted;
* no float64 (nor complex) array exists on the device: creating one, by any operation, raises
  `Float64OnDevice` (a TypeError), e.g. `xp.zeros(3)` without a dtype, or float32 arrays
  promoted by a float64 numpy scalar;
* `float(a)`, `int(a)`, `bool(a)`, `a.item()` and `a.tolist()` work, as in CuPy, where each is a
  device-to-host copy and a synchronisation: each is counted as a transfer (kind "scalar");
* operations whose result size is data (`nonzero`, boolean-mask indexing, ...) are reported as
  "sync" (CuPy reads the size back): not a transfer, but refused inside recorded device work
  (`backend.replay`), as a CUDA graph capture would fail there.

Reductions and scalar indexing give 0-d device arrays (as CuPy does), not numpy scalars.
"""

from __future__ import annotations

import numbers
import types

import numpy as np

from omnicore.model import backend
from . import transfers

_REFUSED_DTYPE_KINDS = "c"  # complex arrays (any width) are refused like float64


class Float64OnDevice(TypeError):
    """A float64 (or complex) array was about to be created on the device."""


_seen_dtypes: set = set()


def seen_dtypes() -> set:
    """Names of the dtypes of every device array made so far (a test reads this)."""
    return set(_seen_dtypes)


def _check_dtype(a: np.ndarray) -> None:
    _seen_dtypes.add(a.dtype.name)
    if a.dtype == np.float64 or a.dtype == np.longdouble or a.dtype.kind in _REFUSED_DTYPE_KINDS:
        raise Float64OnDevice(
            f"a {a.dtype} array of shape {a.shape} on the device: device code computes in float32 "
            "(pass dtype=xp.float32, or keep float32 operands: a float64 numpy scalar promotes)")


class StrictArray:
    """A device array: a numpy array behind a wall (see the module docstring)."""

    __slots__ = ("_a",)
    __hash__ = None  # type: ignore[assignment]  # mutable, like ndarray

    def __init__(self, a: np.ndarray):
        _check_dtype(a)
        object.__setattr__(self, "_a", a)

    # --- metadata (host values, no transfer) ---------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _wrap(self._a.T))

    def __len__(self):
        return len(self._a)

    def __repr__(self):  # no data: printing would be a transfer
        return f"StrictArray(shape={self._a.shape}, dtype={self._a.dtype})"

    __str__ = __repr__

    def __iter__(self):
        for i in range(len(self._a)):
            yield _wrap(self._a[i])

    # --- the walls ---------------------------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError("implicit conversion of a device array to a numpy array is not allowed "
                        "(as with CuPy): use omnicore.model.backend.to_numpy")

    def __array_function__(self, func, types_, args, kwargs):
        raise TypeError(f"numpy.{func.__name__} called on a device array: use xp.{func.__name__} "
                        "(or bring the data to the host with omnicore.model.backend.to_numpy)")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        # `np.float32(2) * a` reaches numpy first and lands here: a scalar operand is fine.
        if method == "__call__" and not kwargs and any(isinstance(x, np.generic) for x in inputs):
            return _call(ufunc, inputs, {})
        raise TypeError(f"numpy.{ufunc.__name__} called on a device array: use xp.{ufunc.__name__}")

    def __getattr__(self, name):
        # ndarray methods (sum, reshape, astype, argmax, ...) run on the wrapped array; dunder
        # names are never forwarded (numpy would find __array_interface__ and convert).
        if name.startswith("__") or name == "_a" or name in _BLOCKED_METHODS:
            raise AttributeError(f"StrictArray has no attribute {name!r}"
                                 + (" (use omnicore.model.backend.to_numpy)" if name in _BLOCKED_METHODS else ""))
        attr = getattr(self._a, name)
        if not callable(attr):
            raise AttributeError(f"StrictArray does not expose ndarray.{name}")
        return lambda *args, **kwargs: _call(attr, args, kwargs)

    # --- device -> host scalars: allowed, counted (CuPy copies and synchronises here) -------
    def item(self, *args):
        _count("scalar")
        return self._a.item(*args)

    def tolist(self):
        _count("scalar")
        return self._a.tolist()

    def __float__(self):
        _count("scalar")
        return float(self._a)

    def __int__(self):
        _count("scalar")
        return int(self._a)

    def __bool__(self):
        _count("scalar")
        return bool(self._a)

    # --- indexing ----------------------------------------------------------------------
    def __getitem__(self, key):
        key = _unwrap_index(key)
        if any(getattr(k, "dtype", None) == np.bool_ for k in (key if isinstance(key, tuple) else (key,))):
            _count("sync")  # a boolean mask's result size is data: CuPy reads it back and waits
        return _wrap(self._a[key])

    def __setitem__(self, key, value):
        if isinstance(value, list):
            raise TypeError("a Python list assigned into a device array is a hidden host-to-device "
                            "copy: use omnicore.model.backend.to_device")
        self._a[_unwrap_index(key)] = _unwrap(value, "an assigned value")


_BLOCKED_METHODS = frozenset({"get", "tobytes", "tofile", "dump", "dumps", "data", "ctypes", "base"})


def _wrap(x):
    """numpy results -> device values: arrays and numpy scalars become StrictArrays (0-d for
    scalars, as CuPy's reductions return), tuples/lists are mapped, anything else passes."""
    if isinstance(x, np.ndarray):
        return StrictArray(x)
    if isinstance(x, np.generic):
        return StrictArray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _unwrap(x, what: str = "an argument"):
    """Device arrays -> their numpy arrays, recursively through tuples and lists; host numpy
    arrays are refused (they would be an implicit, uncounted transfer)."""
    if isinstance(x, StrictArray):
        return x._a
    if isinstance(x, np.ndarray):
        raise TypeError(f"a host numpy array {x.dtype}{list(x.shape)} passed as {what} of a device "
                        "operation: move it with omnicore.model.backend.to_device")
    if isinstance(x, (tuple, list)):
        return type(x)(_unwrap(v, what) for v in x)
    return x


def _unwrap_index(key):
    if isinstance(key, list):
        raise TypeError("a Python list as a device array index is a hidden host-to-device copy: "
                        "use omnicore.model.backend.to_device")
    if isinstance(key, tuple):
        return tuple(_unwrap_index(k) for k in key)
    return _unwrap(key, "an index")


def _call(fn, args, kwargs):
    out = fn(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
    return _wrap(out)


# --- operators -------------------------------------------------------------------------------


def _binary(ufunc):
    def op(self, other):
        if isinstance(other, list):
            raise TypeError("a Python list as an operand of a device array is a hidden host-to-device "
                            "copy: use omnicore.model.backend.to_device")
        return _call(ufunc, (self, other), {})

    def rop(self, other):
        if isinstance(other, list):
            raise TypeError("a Python list as an operand of a device array is a hidden host-to-device "
                            "copy: use omnicore.model.backend.to_device")
        return _call(ufunc, (other, self), {})

    def iop(self, other):
        ufunc(self._a, _unwrap(other, "an operand"), out=self._a)
        return self

    return op, rop, iop


for _name, _uf in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                   ("truediv", np.true_divide), ("floordiv", np.floor_divide), ("mod", np.remainder),
                   ("pow", np.power), ("matmul", np.matmul), ("and", np.bitwise_and),
                   ("or", np.bitwise_or), ("xor", np.bitwise_xor), ("lshift", np.left_shift),
                   ("rshift", np.right_shift)]:
    _op, _rop, _iop = _binary(_uf)
    setattr(StrictArray, f"__{_name}__", _op)
    setattr(StrictArray, f"__r{_name}__", _rop)
    setattr(StrictArray, f"__i{_name}__", _iop)

for _name, _uf in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                   ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)]:
    setattr(StrictArray, f"__{_name}__", _binary(_uf)[0])

for _name, _uf in [("neg", np.negative), ("pos", np.positive), ("abs", np.absolute),
                   ("invert", np.invert)]:
    setattr(StrictArray, f"__{_name}__", (lambda uf: lambda self: _call(uf, (self,), {}))(_uf))


# --- the xp namespace --------------------------------------------------------------------------


def _refuse_host(name):
    def conv(a, *args, **kwargs):
        if not isinstance(a, StrictArray):
            raise TypeError(f"xp.{name} of host data ({type(a).__name__}) is a host-to-device copy: "
                            "use omnicore.model.backend.to_device, which counts it")
        return _call(getattr(np, name), (a,) + args, kwargs)
    return conv


class _UfuncProxy:
    """xp.add and friends: callable like the ufunc, and its methods (reduce, ...) wrapped."""

    def __init__(self, ufunc):
        self._uf = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, **kwargs):
        return _call(self._uf, args, kwargs)

    def __getattr__(self, name):
        attr = getattr(self._uf, name)
        return (lambda *a, **k: _call(attr, a, k)) if callable(attr) else attr


class StrictNamespace(types.ModuleType):
    """numpy's namespace seen through the wall: functions take and return StrictArrays."""

    def __init__(self, module, name="omnicore_testing.strictxp.xp"):
        super().__init__(name)
        self._np = module

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("asarray", "array", "ascontiguousarray", "asanyarray", "asfortranarray"):
            fn = _refuse_host(name)
        elif name in ("asnumpy", "from_dlpack", "frombuffer", "fromfile", "load", "save", "savez", "random"):
            # random: numpy's generators would hand out host arrays; omnicore draws on the host
            # with numpy and moves the draws with to_device
            raise AttributeError(f"xp.{name} is not part of the strict backend: move data with "
                                 "omnicore.model.backend.to_numpy / to_device")
        elif name == "ndarray":
            fn = StrictArray
        elif name in _SIZE_FROM_DATA:
            fn = (lambda f: lambda *a, **k: (_count("sync"), _call(f, a, k))[1])(getattr(self._np, name))
            fn.__name__ = name
        else:
            attr = getattr(self._np, name)
            if isinstance(attr, (type, numbers.Number, str, bytes)) or attr is None:
                fn = attr  # dtypes (xp.float32 is numpy's scalar type, as in CuPy), constants
            elif isinstance(attr, np.ufunc):
                fn = _UfuncProxy(attr)
            elif isinstance(attr, types.ModuleType):
                fn = StrictNamespace(attr, f"{self.__name__}.{name}")
            elif callable(attr):
                fn = (lambda f: lambda *a, **k: _call(f, a, k))(attr)
                fn.__name__ = name
            else:
                fn = attr
        setattr(self, name, fn)  # cached: looked up once
        return fn


# Functions whose result size depends on the data: CuPy must read a count back (a sync).
_SIZE_FROM_DATA = frozenset({"nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract"})


def _no_count(kind: str) -> None:
    pass


_count = _no_count


def make_namespace(count) -> StrictNamespace:
    """The `xp` of the strict backend; `count(kind)` is called for every scalar read-back
    ("scalar") and every operation whose result size is data ("sync")."""
    global _count
    _count = count
    return StrictNamespace(np)


def to_host(a) -> np.ndarray:
    """A host copy of a device array (what backend.to_numpy does under this backend)."""
    return np.array(a._a, copy=True)


def from_host(a, dtype=None) -> StrictArray:
    """A device copy of host data (what backend.to_device does under this backend)."""
    return StrictArray(np.array(a, dtype=dtype, copy=True))


def device() -> backend.Device:
    """The strict backend for `backend.use`: its transfers and scalar reads counted
    (omnicore_testing.transfers), its replayed work checked for host round trips."""
    transfers.start()
    return backend.Device("strict", make_namespace(transfers.count),
                          lambda a: isinstance(a, StrictArray), to_host, from_host,
                          transfers.CheckedReplay)
