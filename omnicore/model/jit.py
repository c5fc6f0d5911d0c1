"""Numba for the kernel modules: compiled on demand, in serial and parallel twins, and the
choice, made once, of which implementation of a kernel runs.

The kernel modules (`kernels`, `scoring_kernels`, `conv_kernels`) write their loops as plain
Python functions decorated with `njit` (or `twice`) from here. Importing them imports no Numba
and reads no setting: `start()` does, once, before the first kernel runs (the configuration
step, `omnicore.machinery.settings.configure`, calls it; otherwise the first kernel call does, with
Numba's defaults). Numba sizes its thread pool when it is imported, which is why the import
waits for `start`. `start` compiles nothing either: it turns every decorated function into a
Numba dispatcher, which compiles (or loads from the on-disk cache) at its first call.

A public kernel is a `Kernel`: its body runs on the numpy backend (calling the Numba loops),
its plain-array twin written with `xp` runs on every other backend, and an optional CUDA twin
on CuPy. Which one runs is decided at the kernel's first call, from the backend, and never
again: the one place a kernel looks at the backend.

Compiled code is kept in Numba's on-disk kernel cache, so each machine compiles a kernel once;
where no folder for it can be written the kernels are compiled in memory instead, with a
warning. `uncached` and `watch_compiles` say what a first run compiles, and when.

Also here, because every kernel module builds on them: the serial/parallel choice per call
(`serial_or_parallel`), the float32 exp and running max that keep loops vectorised
(`exp_nonpos`, `row_max`), and the fastmath flags they are compiled with.
"""

from __future__ import annotations

import threading
import types
import warnings

import numpy as np

from . import backend
from ..errors import KernelCacheWarning

F32 = np.float32
FAST = {"contract", "reassoc", "nsz"}  # FMA contraction and reordered sums; NaN and inf kept

# ---------------------------------------------------------------------------------------------
# Deferred compilation
# ---------------------------------------------------------------------------------------------

_deferred: list["_Deferred"] = []
_numba = None  # the numba module, once started
_start_lock = threading.RLock()


def prange(*args):
    """numba.prange inside a kernel (`start` puts Numba's in its place); range in plain Python."""
    return range(*args)


_PRANGE = prange  # the stand-in, whatever `prange` names after start

class _Deferred:
    """A function to compile with Numba once `start` has run; until then a stand-in that
    starts Numba when it is called or looked into."""

    def __init__(self, fn, make):
        self.fn, self.make, self.compiled = fn, make, None
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__

    def __call__(self, *args):
        start()
        return self.compiled(*args)

    def __getattr__(self, name):  # py_func, targetoptions, signatures, ...
        if name.startswith("__"):
            raise AttributeError(name)
        start()
        return getattr(self.compiled, name)


def _defer(fn, make):
    if _numba is not None:  # a module imported after start: compile on demand right away
        return make(_numba, fn)
    d = _Deferred(fn, make)
    _deferred.append(d)
    return d


def njit(fn=None, **opts):
    """numba.njit(**opts), applied when Numba starts. Use as `@njit(...)` or `njit(fn, ...)`.
    cache=True keeps the kernel in the kernel cache, when one can be written (`cache_folder`)."""
    def wrap(f):
        return _defer(f, lambda nb, f_: _dispatcher(nb, f_, opts))
    return wrap(fn) if fn is not None else wrap


def intrinsic(fn):
    """numba.extending.intrinsic, applied when Numba starts (`fn` imports numba's types itself)."""
    return _defer(fn, lambda nb, f_: _numba_extending().intrinsic(f_))


def _numba_extending():
    from numba import extending

    return extending


def twice(fn, pooled: bool = False, **opts):
    """`fn` (written with `prange`) compiled twice: serial and parallel, both cached on disk.
    pooled: the parallel twin also runs inside `one_pool` (the int8 profile's kernels).

    error_model="numpy" (also on every helper): with Numba's default, Python's, every float
    division checks for zero to raise ZeroDivisionError, and that branch stops LLVM from
    vectorising any loop that divides (GELU and SwiGLU among them).

    The parallel twin is compiled from a renamed copy of `fn`: Numba names its on-disk cache
    after the function's qualified name and line, not its compile options, so two versions of
    one function would share a cache entry and the second would silently load the first's code.
    """
    par = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_par", fn.__defaults__,
                             fn.__closure__)
    par.__qualname__ = fn.__qualname__ + "_par"
    opts.setdefault("error_model", "numpy")
    # Without the GIL: caller threads (decoding, progress callbacks, a server's event loop)
    # run while the engine thread is inside a kernel, instead of queueing behind it.
    opts.setdefault("nogil", True)
    if pooled:
        POOLED.add(par.__qualname__)
    return njit(fn, cache=True, **opts), njit(par, cache=True, parallel=True, **opts)


# ---------------------------------------------------------------------------------------------
# The kernel cache, and compiles as they happen
#
# Numba compiles a kernel at its first call on a machine and keeps the machine code on disk,
# keyed to the CPU and the source, in the first folder it can write: NUMBA_CACHE_DIR, beside
# the package (__pycache__), the user's cache folder (docs/configuration.md, "Kernel cache").
# Where none can be written, the kernels are compiled in memory instead, in every process.
# `uncached` says which kernels a first call would compile; `watch_compiles` reports compiles
# as they happen (the first run's notice, progress that leaves compile time out).
# ---------------------------------------------------------------------------------------------

_kernels: list = []  # the dispatcher of every kernel asked for with cache=True
_NOT_LOOKED = object()
_cache_folder = _NOT_LOOKED  # where the kernel cache is; None: nowhere
_watchers: list = []  # watch_compiles callbacks
_watch_lock = threading.Lock()
_nesting = threading.local()  # a kernel compiles the kernels it calls within its own compile


def _probe():  # never called: Numba is only asked where its cache would go
    return 0


def cache_folder() -> str | None:
    """The kernel cache's folder, or None when no folder can be written (the kernels are then
    compiled in memory, in every process; a KernelCacheWarning said so once). Starts Numba."""
    start()
    return _cache_folder


def _find_cache_folder(nb) -> str | None:
    try:
        probe = nb.njit(cache=True)(_probe)  # Numba takes the first writable folder, or raises
    except RuntimeError:
        warnings.warn("no folder for the kernel cache can be written (NUMBA_CACHE_DIR, beside the "
                      "package, the user's cache folder): the kernels are compiled in memory, in "
                      "every process; set NUMBA_CACHE_DIR to a writable folder to keep them",
                      KernelCacheWarning, stacklevel=2)
        return None
    return str(getattr(probe._cache, "_cache_path", ""))


def _dispatcher(nb, fn, opts: dict):
    """nb.njit(**opts)(fn); with cache=True kept in the kernel cache, in memory if there is none."""
    global _cache_folder
    if not opts.get("cache"):
        return nb.njit(**opts)(fn)
    if _cache_folder is _NOT_LOOKED:
        _cache_folder = _find_cache_folder(nb)
    kernel = nb.njit(**(opts if _cache_folder is not None else {**opts, "cache": False}))(fn)
    _kernels.append(kernel)
    return kernel


def _ready(kernel) -> bool:
    """Whether calling `kernel` compiles nothing: it has code in this process already, or the
    cache has code for this CPU and this source (Numba's index, read as its loader reads it)."""
    if kernel.overloads:
        return True
    try:
        cache, codegen = kernel._cache, kernel.targetctx.codegen()
        return any(key == cache._index_key(key[0], codegen)
                   for key in cache._cache_file._load_index())
    except Exception:  # no cache on disk, or a Numba whose internals differ: a compile, then
        return False


def called(name: str, parallel: bool, pooled: bool = False) -> bool:
    """Whether a run calls the twin `name` (a kernel's qualified name; `parallel`: a parallel
    twin): serial twins, and parallel ones when parallel kernels are on; where the run's
    backbone is inside `one_pool` (`pooled`), a pooled kernel's parallel twin and not its
    serial one."""
    if pooled and (name if parallel else name + "_par") in POOLED:
        return parallel
    return PARALLEL_KERNELS or not parallel


def uncached(skip=frozenset(), pooled: bool = False) -> list[str]:
    """The kernels whose first call would compile them (parallel twins only when parallel
    kernels are on; none named in `skip`, kernels this run will not call): what a first run on
    this machine still has to compile. pooled: the run's backbone runs inside `one_pool`, so
    a pooled kernel's parallel twin is called and its serial one is not. Starts Numba."""
    start()
    return [k.py_func.__qualname__ for k in _kernels
            if called(k.py_func.__qualname__, bool(k.targetoptions.get("parallel")), pooled)
            and k.py_func.__qualname__ not in skip and not _ready(k)]


def watch_compiles(fn):
    """Call `fn(event, name)` while omnicore's kernels compile: ("start", name) when a kernel
    begins (loading one from the cache is not compiling), ("end", name) when it is done; the
    kernels it calls compile within it, unreported. Called on the compiling thread. Returns
    `stop()`, which ends the watch."""
    with _watch_lock:
        _watchers.append(fn)

    def stop():
        with _watch_lock:
            if fn in _watchers:
                _watchers.remove(fn)
    return stop


def _compile_event(event: str, data) -> None:
    """Numba's "numba:compile" event, passed on for omnicore's outermost kernels."""
    fn = data["dispatcher"].py_func
    if not (getattr(fn, "__module__", None) or "").startswith(__package__.split(".")[0] + "."):
        return  # another library's Numba code, Numba's own, or a function of no module
    depth = getattr(_nesting, "depth", 0) - (event == "end")
    _nesting.depth = depth + (event == "start")
    if depth == 0:
        with _watch_lock:
            watchers = list(_watchers)
        for watcher in watchers:
            watcher(event, fn.__qualname__)


def _listen() -> None:
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, ev):
            _compile_event("start", ev.data)

        def on_end(self, ev):
            _compile_event("end", ev.data)
    event.register("numba:compile", Listener())


def start(threads: int | None = None, parallel: bool | None = None) -> None:
    """Import Numba and make every deferred function a dispatcher (idempotent).

    threads: the kernels' and BLAS's threads (None: all cores). Numba's pool is sized at its
    import, so the configuration step puts NUMBA_NUM_THREADS in the environment before calling
    this; here the calling thread's count and BLAS's pool (through threadpoolctl, when it is
    installed) are set. parallel: whether parallel twins run (None: leave as is)."""
    global _numba, PARALLEL_KERNELS
    with _start_lock:
        if _numba is None:
            import numba

            _listen()
            for d in _deferred:
                d.compiled = d.make(numba, d.fn)
            stand_in = _PRANGE
            swap = {id(d): d.compiled for d in _deferred}
            swap[id(stand_in)] = numba.prange
            # Every kernel module's globals now name the dispatchers (Numba resolves a kernel's
            # callees through them when it compiles), and prange is Numba's.
            for space in {id(d.fn.__globals__): d.fn.__globals__ for d in _deferred}.values():
                for name, value in list(space.items()):
                    if id(value) in swap and (value is stand_in or isinstance(value, _Deferred)):
                        space[name] = swap[id(value)]
            _deferred.clear()
            _numba = numba
    if parallel is not None:
        PARALLEL_KERNELS = bool(parallel)
    if threads is not None:
        set_num_threads(threads)


def started() -> bool:
    return _numba is not None


def set_num_threads(n: int) -> None:
    """Use `n` threads for the BLAS under numpy (every GEMM) and for Numba's kernels.

    BLAS is resized through threadpoolctl when that is installed (without it, set
    OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS before starting Python). Numba's
    setting made here holds for the calling thread, within the pool Numba was started with."""
    start()
    _numba.set_num_threads(max(1, min(int(n), _numba.config.NUMBA_NUM_THREADS)))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        if _openblas():  # numpy's own OpenBLAS, reached directly
            _openblas()[0](max(1, int(n)))
        return
    threadpool_limits(int(n), user_api="blas")


# ---------------------------------------------------------------------------------------------
# One pool of threads for the int8 profile
#
# The int8 profile's GEMMs are Numba kernels, on Numba's pool; attention's products and the
# heads are BLAS's, on OpenBLAS's own pool. After each GEMM OpenBLAS's idle workers spin for
# about 0.1 s before they sleep, and on a small machine Numba's workers then wait behind them
# for a core: two pools on the same cores run slower than one serial kernel. So while the
# int8 backbone runs (`one_pool`), BLAS keeps to the calling thread and the pooled kernels
# (`twice(pooled=True)`) run their parallel twins on Numba's pool.
# ---------------------------------------------------------------------------------------------

POOLED: set[str] = set()  # parallel twins that run inside one_pool
_blas_fns = None  # (set_num_threads, get_num_threads) of numpy's OpenBLAS; () where not found
_pool_lock = threading.Lock()
_pool_users = 0  # threads inside one_pool now
_pool_saved = 0  # BLAS's threads before the first of them entered


def _openblas_candidates() -> list[str]:
    """Paths of the OpenBLAS libraries numpy may run on: those in numpy's own folders first
    (its wheels bundle one), then any other loaded one (Linux's /proc/self/maps)."""
    import glob
    import os

    here = os.path.dirname(np.__file__)
    paths = []
    for pattern in (os.path.join(os.path.dirname(here), "numpy.libs", "*openblas*"),
                    os.path.join(here, ".dylibs", "*openblas*")):
        paths += sorted(glob.glob(pattern))
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            loaded = {line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1].lower()}
    except OSError:
        loaded = set()
    return paths + sorted(p for p in loaded if p.startswith("/") and p not in paths)


def _openblas():
    """numpy's OpenBLAS thread setter and getter (ctypes), found once; () where there is none
    (another BLAS, or none found: then `one_pool` changes nothing)."""
    global _blas_fns
    if _blas_fns is None:
        import ctypes

        _blas_fns = ()
        for path in _openblas_candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""),
                                   ("openblas", "64_"), ("openblas", "")):
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    setter.argtypes, setter.restype = [ctypes.c_int], None
                    getter.argtypes, getter.restype = [], ctypes.c_int
                    _blas_fns = (setter, getter)
                    return _blas_fns
    return _blas_fns


def blas_threads() -> int | None:
    """The threads numpy's OpenBLAS uses now (None where it cannot be reached)."""
    fns = _openblas()
    return int(fns[1]()) if fns else None


class one_pool:
    """`with one_pool(on):` BLAS on the calling thread only, and the pooled kernels' parallel
    twins on, while the block runs (when `on`, and where numpy's OpenBLAS can be reached;
    elsewhere nothing changes). Nested and concurrent blocks are counted: the last to leave
    gives BLAS its threads back. `as` gives whether the pool is in use."""

    def __init__(self, on: bool = True):
        self.on = bool(on) and bool(_openblas())

    def __enter__(self) -> bool:
        global _pool_users, _pool_saved
        if self.on:
            setter, getter = _openblas()
            with _pool_lock:
                if _pool_users == 0:
                    _pool_saved = getter()
                    setter(1)
                _pool_users += 1
        return self.on

    def __exit__(self, *exc) -> None:
        global _pool_users
        if self.on:
            with _pool_lock:
                _pool_users -= 1
                if _pool_users == 0:
                    _openblas()[0](_pool_saved)


def pool_available() -> bool:
    """Whether `one_pool` can take BLAS's threads here (numpy's OpenBLAS was found)."""
    return bool(_openblas())


# ---------------------------------------------------------------------------------------------
# Serial or parallel, per call
# ---------------------------------------------------------------------------------------------

# Numba's thread pool is off by default: a parallel region waits for the cores that BLAS's
# spinning workers hold (benchmarks/README.md, design notes). OMNICORE_PARALLEL_KERNELS=1 turns
# the parallel twins on (through the configuration step), for machines where BLAS leaves cores idle.
PARALLEL_KERNELS = False
# Work below this many elements runs on one thread: spawning threads costs more than it saves.
PARALLEL_MIN = 1 << 16

# One parallel region at a time: Numba's fallback threading layer (workqueue, used when neither
# OpenMP nor TBB loads) aborts the process when two threads enter parallel code at once, and on
# the other layers two regions would only fight over the same cores.
_PARALLEL_LOCK = threading.Lock()


def _serialised(kernel):
    def run(*args):
        with _PARALLEL_LOCK:
            return kernel(*args)
    run.__wrapped__ = kernel
    return run


def serial_or_parallel(serial, parallel, size, pooled: bool = False):
    """The parallel twin for big enough work when parallel kernels are on, or for a pooled
    kernel inside `one_pool`; else the serial one."""
    if pooled and _pool_users > 0:  # one pool: no other threads to wait for, at any size
        return _serialised(parallel)
    return _serialised(parallel) if PARALLEL_KERNELS and size >= PARALLEL_MIN else serial


# ---------------------------------------------------------------------------------------------
# The implementation of a kernel, chosen once
# ---------------------------------------------------------------------------------------------


class Kernel:
    """A public kernel: `host` (the decorated function) on the numpy backend, `cuda` on CuPy
    when given, `twin` (plain `xp`) everywhere else. Chosen at the first call, from the backend
    (which that call fixes if nothing has yet), and kept."""

    def __init__(self, host, twin, cuda=None):
        self.host, self.twin, self.cuda = host, twin, cuda
        self.__name__, self.__doc__ = host.__name__, host.__doc__
        self.__wrapped__ = host
        self._run = None

    def __call__(self, *args, **kwargs):
        run = self._run
        if run is None:
            kind = backend.name()
            run = self._run = (self.host if kind == "numpy" else
                               self.cuda if kind == "cupy" and self.cuda is not None else self.twin)
        return run(*args, **kwargs)


def kernel(twin, cuda=None):
    """Decorator: the function is a kernel's numpy-backend body; `twin` its plain-xp twin."""
    return lambda host: Kernel(host, twin, cuda)


# ---------------------------------------------------------------------------------------------
# Float32 helpers that vectorise
#
# So that the loops around them vectorise, exp() is our own float32 polynomial (`exp_nonpos`)
# and a running max is kept in 16 lanes (`row_max`). Results that would be subnormal are
# flushed to 0: later arithmetic on them is far slower, and they cannot change a sum holding
# exp(0) = 1. (Why: benchmarks/README.md, design notes.)
# ---------------------------------------------------------------------------------------------

_LANES = 16
_EXP_MIN = np.float32(-87.33)  # exp below this is subnormal in float32


@intrinsic
def f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 `bits` (a free reinterpretation)."""
    from numba.core import types as nbtypes

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(nbtypes.float32))
    return nbtypes.float32(nbtypes.int32), codegen


@njit(inline="always", fastmath={"contract"}, error_model="numpy")
def exp_nonpos(x):
    """exp(x) for float32 x <= 0, within 1.5 ulp; 0 instead of a subnormal (x < -87.33).

    exp(x) = 2**n * exp(r) with n = round(x / ln 2) and |r| <= ln(2)/2 (ln 2 split in two
    parts so r is exact), exp(r) by a degree-7 polynomial (Cephes' expf coefficients), 2**n
    built directly in the exponent bits (-126 <= n <= 0 here).

    The kernel modules inline it, and Numba's on-disk cache only notices edits to the file a
    function is defined in: after changing this, delete omnicore/model/__pycache__.
    """
    # Branch-free (a select at the end) and n kept in float32: both keep the loop around it
    # vectorised (AVX2 has no int64 <-> float conversion; float32 -> int32 is one instruction).
    xc = max(x, _EXP_MIN)  # keeps 2**n a normal number; such results are replaced by 0 below
    n = np.floor(xc * F32(1.44269504) + F32(0.5))
    r = (xc - n * F32(0.693359375)) - n * F32(-2.12194440e-4)
    p = F32(1.9875691500e-4)
    p = p * r + F32(1.3981999507e-3)
    p = p * r + F32(8.3334519073e-3)
    p = p * r + F32(4.1665795894e-2)
    p = p * r + F32(1.6666665459e-1)
    p = p * r + F32(5.0000001201e-1)
    y = p * (r * r) + r + F32(1.0)
    y = y * f32_from_bits(np.int32((np.int32(n) + 127) << 23))
    return F32(0.0) if x < _EXP_MIN else y


@njit(inline="always", fastmath=FAST, error_model="numpy")
def row_max(row, n):
    """max(row[:n]) kept in 16 lanes so that it vectorises (NaN-free rows)."""
    acc = np.full(_LANES, -np.inf, dtype=np.float32)
    n16 = n - n % _LANES
    for j in range(0, n16, _LANES):
        for lane in range(_LANES):
            v = row[j + lane]
            acc[lane] = v if v > acc[lane] else acc[lane]
    mx = acc[0]
    for lane in range(1, _LANES):
        mx = acc[lane] if acc[lane] > mx else mx
    for j in range(n16, n):
        mx = row[j] if row[j] > mx else mx
    return mx
