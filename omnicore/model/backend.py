"""The one place where omnicore chooses its array library: `xp`.

Model code does `from omnicore.model.backend import xp` and writes `xp.matmul(...)`, never `np.`
for arrays that live on the compute device. With the default backend `xp` holds numpy's
functions, so the code reads exactly like plain numpy. `use("cupy")` (the configuration step
does it for OMNICORE_BACKEND=cupy, with the `gpu` extra installed) swaps in CuPy, which mirrors
the numpy API on an NVIDIA GPU; `use(Device(...))` swaps in a test backend (omnicore_testing's
strict arrays, which refuse what CuPy refuses, on the CPU). The choice is made once per
process: the first use of `xp`, of a transfer or of a kernel fixes it (numpy if `use` was not
called), and `use` then refuses to change it.

Numba kernels only accept numpy arrays; each kernel module's kernels run their plain-xp twins
on any other backend (`jit.Kernel` chooses, from `name()`, at a kernel's first call).

`replay(store, key, fn)` runs device work that repeats unchanged on fixed buffers (a backbone
step) so that repeating it is cheap: on CuPy as a CUDA graph, recorded at the second call.

Every host <-> device copy goes through `to_device` / `to_numpy`; an observer set with
`set_observer` sees each one that moves data (omnicore_testing counts them). With the numpy
backend there are none.
"""

import ctypes
import threading
import types
import weakref

import numpy as np

from ..errors import ConfigError


class Device:
    """What a backend other than numpy provides: its name, its `xp` namespace, how to tell its
    arrays from host ones, the two copies, and (optionally) how to record repeated work:
    `new_replay()` makes the object `replay` keeps per key (None: every call runs fn())."""

    def __init__(self, name: str, namespace, is_device, to_host, from_host, new_replay=None):
        self.name, self.xp = name, namespace
        self.is_device, self.to_host, self.from_host = is_device, to_host, from_host
        self.new_replay = new_replay


_device: Device | None = None  # None: numpy
_fixed = False  # set by the first use: from then on the backend cannot change
_use_lock = threading.Lock()
_observer = None


class _Namespace(types.ModuleType):
    """`xp`: the chosen library's namespace. The first name looked up fixes the backend; each
    name is then kept here, so `xp.f` costs what `np.f` does."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _fix()
        value = getattr(np if _device is None else _device.xp, name)
        setattr(self, name, value)
        return value


xp = _Namespace(__name__ + ".xp")


def _fix() -> None:
    global _fixed
    _fixed = True


def use(backend, graphs: bool = True) -> None:
    """Choose the array library before the model's first array operation: "numpy", "cupy" or
    a `Device` (a test backend). graphs: on CuPy, replay each backbone step as a CUDA graph.
    Choosing the backend in use already does nothing; another one, once the backend has been
    used, is a ConfigError."""
    global _device, _CUBLAS
    with _use_lock:
        wanted = backend if isinstance(backend, str) else backend.name
        if _fixed:
            if wanted != name():
                raise ConfigError(f"the array backend is {name()} already (it is chosen once, before "
                                  f"the first model call); {wanted!r} cannot replace it")
            return
        if backend == "numpy":
            device = None
        elif backend == "cupy":
            device = _cupy_device(graphs)
        elif isinstance(backend, Device):
            device = backend
        else:
            raise ConfigError(f"array backend {backend!r} is not 'numpy' or 'cupy'")
        _device = device
        _CUBLAS = _Cublas() if wanted == "cupy" else None
        _fix()


def name() -> str:
    """The backend in use: "numpy", "cupy" or a test backend's name (fixes it if not yet)."""
    _fix()
    return "numpy" if _device is None else _device.name


def _cupy_device(graphs: bool) -> Device:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ConfigError(
            "OMNICORE_BACKEND=cupy but CuPy is not importable; install the GPU extra for the "
            "machine's CUDA version (pip install 'omnicore[gpu-cuda12]' or 'omnicore[gpu-cuda13]'), "
            "or unset OMNICORE_BACKEND."
        ) from exc
    return Device("cupy", cupy, lambda a: isinstance(a, cupy.ndarray), cupy.asnumpy,
                  lambda a, dtype: cupy.asarray(a, dtype=dtype), _GraphReplay if graphs else None)


def set_observer(fn) -> None:
    """fn(kind) is called for every transfer that moves data, kind "to_device" or "to_numpy"
    (None: no observer). omnicore_testing counts transfers with it."""
    global _observer
    _observer = fn


def _observe(kind: str) -> None:
    if _observer is not None:
        _observer(kind)


def to_numpy(a):
    """Bring an array back to host memory as a numpy array (no copy when already numpy)."""
    if not _fixed:
        _fix()
    if _device is None or not _device.is_device(a):
        return np.asarray(a)
    _observe("to_numpy")
    return _device.to_host(a)


def to_device(a, dtype=None):
    """Move a host array onto the compute device (a no-op view with the numpy backend); a
    device array is returned as it is (converted to `dtype` if given, on the device)."""
    if not _fixed:
        _fix()
    if _device is None:
        return np.asarray(a, dtype=dtype)
    if _device.is_device(a):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    _observe("to_device")
    return _device.from_host(a, dtype)


def f32(a) -> np.ndarray:
    """A C-contiguous float32 host array (weights are converted once, at load)."""
    return np.ascontiguousarray(a, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Precision profiles: what a GEMM's inputs are rounded to
# ---------------------------------------------------------------------------------------------
# "fp32" (exact, the default) leaves them alone. The others give the dtype flow of tensor-core
# GEMMs: inputs (weights once at load, activations before every product) rounded to TF32
# (10-bit mantissa), bfloat16 or float16, products accumulated in float32, and everything
# between the GEMMs (norms, softmax, scoring) kept in float32. Here the rounding is written
# out on float32 arrays (round to nearest even), so every backend runs the same numbers.

#
# "int8" is the CPU's W8A8 profile (model/int8_kernels.py): the backbone's projections are
# quantised once at load, per output channel, and multiply activations quantised per token,
# with exact integer accumulation; the rest stays float32. Its kernels are the CPU's (Numba),
# so it is a numpy-backend profile: `check_precision` refuses it on a device backend, where
# bf16 / fp16 run the tensor cores instead.

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "int8")
ROUNDED = ("tf32", "bf16", "fp16")  # the profiles that round a float32 GEMM's inputs
INT8 = "int8"
_DROP_BITS = {"tf32": 13, "bf16": 16}  # float32 mantissa bits the format does not keep


def check_precision(precision) -> str:
    """The profile's name, or ConfigError for an unknown one, or for "int8" on a device
    backend (it runs on the CPU's int8 units; asking fixes the backend, as a first use does)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}")
    if precision == INT8 and name() != "numpy":
        raise ConfigError(f"precision='int8' is a CPU profile (the CPU's int8 units) and the array "
                          f"backend is {name()}: use bf16 or fp16 there (the tensor cores), or "
                          "the numpy backend (unset OMNICORE_BACKEND) for int8")
    return precision


# On a device, bf16 and fp16 GEMMs take half-precision arrays and accumulate in float32 (the
# tensor cores' own flow): weights stored so at load, activations converted before each product,
# results float32 (`half_gemm`). bfloat16 has no array dtype of its own: its 16 bits live in
# uint16 arrays. On numpy (no such GEMM) the rounding above stands in: the same products.
HALF = ("bf16", "fp16")


def half_gemm(precision: str) -> bool:
    """Whether `precision`'s GEMMs take half-precision arrays here (on a device backend)."""
    if not _fixed:
        _fix()
    return precision in HALF and _device is not None


def to_half(x, precision: str):
    """float32 x -> a new half-precision array of it, rounded to nearest even: float16, or the
    bfloat16 bits as uint16."""
    if precision == "fp16":
        return x.astype(xp.float16)
    bits = xp.ascontiguousarray(x).view(xp.uint32)
    bits = bits + ((bits >> 16) & 1) + xp.uint32(0x7FFF)  # ties to even
    return (bits >> 16).astype(xp.uint16)


def from_half(h, precision: str):
    """A half-precision array (to_half's) -> float32, exactly."""
    if precision == "fp16":
        return h.astype(xp.float32)
    return (h.astype(xp.uint32) << 16).view(xp.float32)


def round_gemm_input(x, precision: str):
    """x (float32) rounded in place to what `precision` feeds a GEMM; returns x."""
    if precision == "fp32":
        return x
    if precision == "fp16":
        x[...] = x.astype(xp.float16)  # out of range -> inf, as a float16 GEMM input
        return x
    drop = _DROP_BITS[precision]
    bits = x.view(xp.uint32)
    bits += ((bits >> drop) & 1) + ((1 << (drop - 1)) - 1)  # ties to even
    bits &= xp.uint32((0xFFFFFFFF >> drop) << drop)
    return x


# ---------------------------------------------------------------------------------------------
# Replayed device work (CUDA graphs)
# ---------------------------------------------------------------------------------------------
# A backbone step is a few thousand small kernels; launched one by one from Python, the launches
# cost more than the GPU's work. Recorded once as a CUDA graph, a step is one launch.

_graph_stats = {"captured": 0, "replayed": 0, "failed": 0}
_stats_lock = threading.Lock()
_live_graphs: "weakref.WeakSet" = weakref.WeakSet()


def graph_stats() -> dict:
    """How `replay` ran so far: graphs "captured" (a test backend: checked calls), "replayed"
    and captures that "failed" (that work then runs kernel by kernel), and "pool_bytes": the
    device memory held now by the live graphs' own pools."""
    with _stats_lock:
        stats = dict(_graph_stats)
    stats["pool_bytes"] = sum(g.pool.total_bytes() for g in list(_live_graphs))
    return stats


def note_graph(event: str) -> None:
    """Count a "captured", "replayed" or "failed" recording (for graph_stats)."""
    with _stats_lock:
        _graph_stats[event] += 1


def replay(store: dict, key, fn):
    """fn() made cheap to repeat: device work on buffers that stay where they are, with no host
    round trip, whose result is the same array (or list of arrays) at every call, overwritten
    by the next one. On CuPy the first call runs as is (compiling kernels, sizing memory), the
    second records fn as a CUDA graph with its own memory pool and later calls replay it; on
    numpy every call is fn(). A test backend may check, from the second call on, that fn does
    nothing a graph could not record.

    store: a dict kept by the owner of the buffers (the graph dies with it); key: everything the
    work depends on besides the buffers' contents."""
    if not _fixed:
        _fix()
    if _device is None or _device.new_replay is None:
        return fn()
    entry = store.get(key)
    if entry is None:
        entry = store[key] = _device.new_replay()
    return entry(fn)


class _GraphReplay:
    def __init__(self):
        self.calls = 0
        self.graph = self.out = None
        self.pool = xp.cuda.MemoryPool()  # the graph's own: nothing else may reuse its blocks
        self.stream = xp.cuda.Stream(non_blocking=True)  # capture cannot use the legacy stream
        _live_graphs.add(self)

    def __call__(self, fn):
        if self.graph is not None:
            self.graph.launch()  # on the current stream, after the work that filled the inputs
            note_graph("replayed")
            return self.out
        self.calls += 1
        if self.calls > 2:  # capture failed before: kernel by kernel
            return fn()
        xp.cuda.Device().synchronize()  # the side stream does not wait for the current one
        try:
            with xp.cuda.using_allocator(self.pool.malloc), self.stream:
                if self.calls == 1:  # plain run: compiles kernels, leaves the pool sized
                    out = fn()
                else:
                    self.out = None
                    self.stream.begin_capture()
                    try:
                        out = fn()
                    finally:
                        graph = self.stream.end_capture()
                    graph.launch(self.stream)
                    self.graph = graph
                    note_graph("captured")
            self.stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - a failed capture degrades to plain launches
            if self.calls == 1:
                raise
            note_graph("failed")
            import logging

            logging.getLogger(__name__).warning("CUDA graph capture failed, running kernel by "
                                                "kernel: %s", exc)
            self.calls = 3
            xp.cuda.Device().synchronize()
            return fn()
        self.out = out
        return out


# ---------------------------------------------------------------------------------------------
# Matrix products that a CUDA graph can record
# ---------------------------------------------------------------------------------------------
# CuPy refuses to issue cuBLAS calls while a stream is being captured, so on CuPy the backbone's
# products call cuBLAS itself (the library CuPy loaded, through ctypes, on CuPy's own handle).
# cuBLAS records fine: alpha and beta are read from the host at capture, and its default
# workspace is allocated when the handle is made.

_F4 = 4  # bytes per float32
_CUDA_R_32F, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT = 0, 68, -1
_CUDA_TYPES = {"fp16": 2, "bf16": 14}  # cudaDataType of float16 and bfloat16 inputs


def matmul(a, b, out=None):
    """a @ b for float32 [..., M, K] @ [..., K, N] (batch shapes equal, or one side 2-D), into
    `out` when given. numpy: np.matmul; CuPy: one cuBLAS call (recordable by `replay`)."""
    if not _CUBLAS or a.dtype != xp.float32 or b.dtype != xp.float32 or min(a.shape + b.shape) == 0:
        return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)
    return _cublas_matmul(a, b, out)


def matmul_half(a, b, precision: str, out=None):
    """a @ b of two half-precision arrays (to_half's, `precision` "bf16" or "fp16"), accumulated
    and returned in float32: on CuPy one cuBLAS GemmEx (tensor cores); on another device backend
    both widened to float32 first, which gives the same products as the rounded float32 GEMM."""
    if _CUBLAS and min(a.shape + b.shape) > 0:
        return _cublas_matmul(a, b, out, _CUDA_TYPES[precision])
    return matmul(from_half(a, precision), from_half(b, precision), out)


def _layout(x):
    """(op, ld) with which cuBLAS reads x's last two axes as the column-major matrix x^T:
    op 0 when rows are contiguous (x^T stored as is), 1 for a transposed view; None otherwise."""
    r, c = x.shape[-2:]
    s0, s1 = x.strides[-2] // x.itemsize, x.strides[-1] // x.itemsize
    if (s1 == 1 or c == 1) and (s0 >= c or r == 1):
        return 0, max(s0 if r > 1 else c, c, 1)
    if (s0 == 1 or r == 1) and (s1 >= r or c == 1):
        return 1, max(s1 if c > 1 else r, r, 1)
    return None


def _batch_stride(x):
    """One element stride that walks x's batch axes in order, 0 for a 2-D x, None if none does."""
    if x.ndim == 2:
        return 0
    stride = None
    expect = None
    for n, s in zip(reversed(x.shape[:-2]), reversed(x.strides[:-2])):
        s //= x.itemsize
        if n == 1:
            continue
        if stride is None:
            stride, expect = s, s * n
        elif s != expect:
            return None
        else:
            expect = s * n
    return stride if stride is not None else 0


def _cublas_matmul(a, b, out, half=None):
    """The cuBLAS call of `matmul` (float32: Sgemm) and `matmul_half` (`half`: the inputs'
    cudaDataType; GemmEx with float32 output and compute)."""
    batch = a.shape[:-2] if a.ndim > 2 else b.shape[:-2]
    if (a.ndim > 2 and b.ndim > 2 and a.shape[:-2] != b.shape[:-2]) or a.shape[-1] != b.shape[-2]:
        return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    ops = []
    for x in (b, a):  # C^T = B^T A^T in cuBLAS's column-major terms
        lay, bs = _layout(x), _batch_stride(x)
        if lay is None or bs is None:
            x = xp.ascontiguousarray(x)
            lay, bs = _layout(x), _batch_stride(x)
        ops.append((x, lay[0], lay[1], bs))
    (pb, opb, ldb, sb), (pa, opa, lda, sa) = ops
    shape = batch + (M, N)
    c = out if (out is not None and out.flags.c_contiguous and out.shape == shape
                and out.dtype == xp.float32) else xp.empty(shape, dtype=xp.float32)
    count = 1
    for n in batch:
        count *= n
    lib, h = _CUBLAS.lib, _CUBLAS.handle()
    lib.cublasSetStream_v2(h, xp.cuda.get_current_stream().ptr)
    lib.cublasSetPointerMode_v2(h, 0)  # alpha, beta on the host
    one, zero = ctypes.addressof(_CUBLAS.one), ctypes.addressof(_CUBLAS.zero)
    if half is not None and count == 1:
        st = lib.cublasGemmEx(h, opb, opa, N, M, K, one, pb.data.ptr, half, ldb, pa.data.ptr,
                              half, lda, zero, c.data.ptr, _CUDA_R_32F, N, _CUBLAS_COMPUTE_32F,
                              _CUBLAS_GEMM_DEFAULT)
    elif half is not None:
        st = lib.cublasGemmStridedBatchedEx(h, opb, opa, N, M, K, one, pb.data.ptr, half, ldb, sb,
                                            pa.data.ptr, half, lda, sa, zero, c.data.ptr,
                                            _CUDA_R_32F, N, M * N, count, _CUBLAS_COMPUTE_32F,
                                            _CUBLAS_GEMM_DEFAULT)
    elif count == 1:
        st = lib.cublasSgemm_v2(h, opb, opa, N, M, K, one, pb.data.ptr, ldb, pa.data.ptr, lda,
                                zero, c.data.ptr, N)
    else:
        st = lib.cublasSgemmStridedBatched(h, opb, opa, N, M, K, one, pb.data.ptr, ldb, sb,
                                           pa.data.ptr, lda, sa, zero, c.data.ptr, N, M * N, count)
    if st != 0:
        raise RuntimeError(f"cuBLAS sgemm failed with status {st} ({a.shape} @ {b.shape})")
    if out is not None and c is not out:
        out[...] = c
        return out
    return c


class _Cublas:
    """libcublas as CuPy loaded it, called through ctypes."""

    def __init__(self):
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cublas  # noqa: F401 - loads libcublas

        major = xp.cuda.runtime.runtimeGetVersion() // 1000
        self.lib = ctypes.CDLL(f"libcublas.so.{major}")
        self.handle = device.get_cublas_handle  # per thread, made on first use
        P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        self.lib.cublasSetStream_v2.argtypes = [P, P]
        self.lib.cublasSetPointerMode_v2.argtypes = [P, I]
        self.lib.cublasSgemm_v2.argtypes = [P, I, I, I, I, I, P, P, I, P, I, P, P, I]
        self.lib.cublasSgemmStridedBatched.argtypes = [P, I, I, I, I, I, P, P, I, L, P, I, L,
                                                       P, P, I, L, I]
        self.lib.cublasGemmEx.argtypes = [P, I, I, I, I, I, P, P, I, I, P, I, I, P, P, I, I, I, I]
        self.lib.cublasGemmStridedBatchedEx.argtypes = [P, I, I, I, I, I, P, P, I, I, L, P, I, I,
                                                        L, P, P, I, I, L, I, I, I]
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)


_CUBLAS = None  # made by use("cupy")
