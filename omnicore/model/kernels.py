"""Compute kernels: the shared machinery, and the Numba loops between the backbone's GEMMs.

Numba where BLAS cannot help, BLAS (through `xp.matmul`) everywhere else. Every Numba kernel
`_name_nb` sits beside a plain array twin `name_np` written with `xp`, and the public
`name(...)` picks one of them. That choice is made in the kernel modules and only there: Numba
compiles for numpy arrays on the CPU, so with the CuPy backend (`IS_NUMPY` false) the twins run
instead (or, for the backbone's hottest loops, one CUDA kernel each: end of this file).
`tests/test_kernels.py` checks each pair agrees.

Here: thread pools and the serial/parallel pair of every kernel (`_twice`, `_pick`), the
vectorisable float32 exp the other kernels build on, the all-finite check of loaded weights,
and the backbone's kernels (RMSNorm, q/k norm + RoPE, softmax, SwiGLU). The unmasking loop's
scoring is in `scoring_kernels`, the codec's kernels (convolutions, Snake, GELU, GroupNorm) in
`conv_kernels`.

Dimension legend:
    N  rows (tokens) of a flattened [N, D] array   D  hidden size      F  MLP width
    H  query heads   K  key/value heads (H = K * G) E  head dim         L  length of one row
    M  rows of a score matrix [M, L]                C  codebooks        T  target frames
    V  audio vocabulary per codebook
"""

from __future__ import annotations

import math
import os
import sys
import threading
import types

import numpy as np

from .backend import IS_CUPY, IS_NUMPY, xp
from ..errors import ConfigError

_THREADS = os.environ.get("OMNICORE_NUM_THREADS", "").strip()
if _THREADS and not (_THREADS.isdigit() and int(_THREADS) > 0):
    raise ConfigError(f"OMNICORE_NUM_THREADS={_THREADS!r}: expected a positive integer (threads)")
if _THREADS and "numba" not in sys.modules:
    # Numba sizes its pool once, when it is imported; set before that, this is process-wide.
    os.environ["NUMBA_NUM_THREADS"] = _THREADS

import numba as nb  # noqa: E402
from numba.core import types as _nbtypes  # noqa: E402
from numba.extending import intrinsic as _intrinsic  # noqa: E402

_F32 = np.float32


def set_num_threads(n: int) -> None:
    """Use `n` threads for the BLAS under numpy (every GEMM) and for Numba's kernels.

    BLAS is resized through threadpoolctl when that is installed (without it, set
    OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS before starting Python). Numba's
    setting made here holds for the calling thread; the environment variable
    OMNICORE_NUM_THREADS, read when omnicore is imported, sizes Numba's pool for the whole
    process and then calls this. By default both pools use every core.
    """
    nb.set_num_threads(max(1, min(int(n), nb.config.NUMBA_NUM_THREADS)))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(int(n), user_api="blas")


if _THREADS:
    set_num_threads(int(_THREADS))


# ---------------------------------------------------------------------------------------------
# Serial and parallel kernels
# ---------------------------------------------------------------------------------------------

# Numba's thread pool is off by default: a parallel region waits for the cores that BLAS's
# spinning workers hold (benchmarks/README.md, design notes). OMNICORE_PARALLEL_KERNELS=1 turns
# the parallel twins on, for machines where BLAS leaves cores idle.
PARALLEL_KERNELS = os.environ.get("OMNICORE_PARALLEL_KERNELS", "").strip() == "1"
# Work below this many elements runs on one thread: spawning threads costs more than it saves.
_PARALLEL_MIN = 1 << 16


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


def _pick(serial, parallel, size):
    """The parallel twin for big enough work when parallel kernels are on, else the serial one."""
    return _serialised(parallel) if PARALLEL_KERNELS and size >= _PARALLEL_MIN else serial


def _twice(fn, **opts):
    """Compile `fn` (written with nb.prange) once serial and once parallel.

    error_model="numpy" (also on every helper below): with Numba's default, Python's, every
    float division checks for zero to raise ZeroDivisionError, and that branch stops LLVM from
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
    return nb.njit(cache=True, **opts)(fn), nb.njit(cache=True, parallel=True, **opts)(par)


# ---------------------------------------------------------------------------------------------
# Float32 helpers that vectorise
#
# So that the loops around them vectorise, exp() is our own float32 polynomial (`_exp_nonpos`)
# and a running max is kept in 16 lanes (`_row_max`). Results that would be subnormal are
# flushed to 0: later arithmetic on them is far slower, and they cannot change a sum holding
# exp(0) = 1. (Why: benchmarks/README.md, design notes.)
# ---------------------------------------------------------------------------------------------

_FAST = {"contract", "reassoc", "nsz"}  # FMA contraction and reordered sums; NaN and inf kept
_LANES = 16
_EXP_MIN = np.float32(-87.33)  # exp below this is subnormal in float32


@_intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 `bits` (a free reinterpretation)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(_nbtypes.float32))
    return _nbtypes.float32(_nbtypes.int32), codegen


@nb.njit(inline="always", fastmath={"contract"}, error_model="numpy")
def _exp_nonpos(x):
    """exp(x) for float32 x <= 0, within 1.5 ulp; 0 instead of a subnormal (x < -87.33).

    exp(x) = 2**n * exp(r) with n = round(x / ln 2) and |r| <= ln(2)/2 (ln 2 split in two
    parts so r is exact), exp(r) by a degree-7 polynomial (Cephes' expf coefficients), 2**n
    built directly in the exponent bits (-126 <= n <= 0 here).

    conv_kernels' GELU and scoring_kernels inline it, and Numba's on-disk cache only notices edits to the file a
    function is defined in: after changing this, delete omnicore/model/__pycache__.
    """
    # Branch-free (a select at the end) and n kept in float32: both keep the loop around it
    # vectorised (AVX2 has no int64 <-> float conversion; float32 -> int32 is one instruction).
    xc = max(x, _EXP_MIN)  # keeps 2**n a normal number; such results are replaced by 0 below
    n = np.floor(xc * _F32(1.44269504) + _F32(0.5))
    r = (xc - n * _F32(0.693359375)) - n * _F32(-2.12194440e-4)
    p = _F32(1.9875691500e-4)
    p = p * r + _F32(1.3981999507e-3)
    p = p * r + _F32(8.3334519073e-3)
    p = p * r + _F32(4.1665795894e-2)
    p = p * r + _F32(1.6666665459e-1)
    p = p * r + _F32(5.0000001201e-1)
    y = p * (r * r) + r + _F32(1.0)
    y = y * _f32_from_bits(np.int32((np.int32(n) + 127) << 23))
    return _F32(0.0) if x < _EXP_MIN else y


@nb.njit(inline="always", fastmath=_FAST, error_model="numpy")
def _row_max(row, n):
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


@nb.njit(inline="always", fastmath=_FAST, error_model="numpy")
def _inv_rms(row, n, eps):
    ss = _F32(0.0)
    for j in range(n):
        ss += row[j] * row[j]
    return _F32(1.0) / math.sqrt(ss / _F32(n) + eps)


# --- all-finite check of loaded weights ------------------------------------------------------

_EXP_MASK = np.uint32(0x7F800000)  # a float32 is NaN or inf exactly when these bits are all set
_FINITE_BLOCK = 1 << 16  # elements between early-exit tests


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _all_finite_nb(bits):  # bits [N] uint32: a float32 array's bit patterns
    # The max of the exponent fields is an integer reduction, so LLVM vectorises it (a float
    # test per element would not); checked once per block to stop early on a bad tensor.
    n = bits.size
    for start in range(0, n, _FINITE_BLOCK):
        top = np.uint32(0)
        for i in range(start, min(start + _FINITE_BLOCK, n)):
            top = max(top, bits[i] & _EXP_MASK)
        if top == _EXP_MASK:
            return False
    return True


def all_finite_np(x) -> bool:
    """Twin of `all_finite`."""
    return bool(xp.isfinite(x).all())


def all_finite(x) -> bool:
    """True when the float array `x` holds no NaN and no infinity (no temporary arrays).

    Host arrays (weights as they are read) take the Numba kernel whatever the backend."""
    if not isinstance(x, np.ndarray):
        return all_finite_np(x)
    if x.dtype != np.float32:
        return bool(np.isfinite(x).all())
    flat = x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)  # [N]
    return _all_finite_nb(flat.view(np.uint32))


# ---------------------------------------------------------------------------------------------
# Backbone and scoring kernels
#
# Everything between the backbone's GEMMs: RMSNorm (alone and fused with the residual add),
# per-head q/k RMSNorm + rotary embedding, row softmax, SwiGLU, and the guided scoring of the
# unmasking loop. Each writes into a buffer the caller owns (the backbone's Workspace), so the
# hot path allocates nothing.
# ---------------------------------------------------------------------------------------------


# --- RMSNorm ---------------------------------------------------------------------------------


def _rms_norm_impl(x, weight, eps, out):  # x, out [N, D]
    rows, d = x.shape
    for i in nb.prange(rows):
        xr, o = x[i], out[i]  # row views vectorise better than 2-D indexing
        s = _inv_rms(xr, d, eps)
        for j in range(d):
            o[j] = (xr[j] * s) * weight[j]


def _add_rms_norm_impl(x, y, weight, eps, out):  # x += y; out = rms_norm(x)
    rows, d = x.shape
    for i in nb.prange(rows):
        xr, yr, o = x[i], y[i], out[i]
        for j in range(d):
            xr[j] += yr[j]
        s = _inv_rms(xr, d, eps)
        for j in range(d):
            o[j] = (xr[j] * s) * weight[j]


_rms_norm_nb, _rms_norm_nb_par = _twice(_rms_norm_impl, fastmath=_FAST)
_add_rms_norm_nb, _add_rms_norm_nb_par = _twice(_add_rms_norm_impl, fastmath=_FAST)


def rms_norm_np(x, weight, eps: float, out=None):
    """Twin of `rms_norm`."""
    x = x.astype(xp.float32, copy=False)
    scale = (1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + xp.float32(eps))).astype(xp.float32)
    if out is None:
        return (x * scale) * weight
    xp.multiply(x, scale, out=out)
    xp.multiply(out, weight, out=out)
    return out


def rms_norm(x, weight, eps: float, out=None):
    """RMSNorm over the last axis in float32: x * rsqrt(mean(x^2) + eps) * weight.

    x [..., D]; written into `out` (same shape) when given, else into a new array."""
    if _cuda_ok(x, weight) and (out is None or _cuda_ok(out)):
        return _cuda_norm(x, None, weight, eps, xp.empty_like(x) if out is None else out)
    if not IS_NUMPY or x.dtype != _F32 or not x.flags.c_contiguous:
        return rms_norm_np(x, weight, eps, out)
    x2 = x.reshape(-1, x.shape[-1])  # [..., D] -> [N, D]
    res = np.empty_like(x2) if out is None else out.reshape(x2.shape)
    _pick(_rms_norm_nb, _rms_norm_nb_par, x2.size)(x2, weight, _F32(eps), res)
    return res.reshape(x.shape)


def add_rms_norm_np(x, y, weight, eps: float, out):
    """Twin of `add_rms_norm`."""
    x += y
    return rms_norm_np(x, weight, eps, out)


def add_rms_norm(x, y, weight, eps: float, out):
    """Residual add fused with the next pre-norm: x += y (in place), out = rms_norm(x). [N, D]."""
    if _cuda_ok(x, y, weight, out):
        return _cuda_norm(x, y, weight, eps, out)
    if not IS_NUMPY:
        return add_rms_norm_np(x, y, weight, eps, out)
    _pick(_add_rms_norm_nb, _add_rms_norm_nb_par, x.size)(x, y, weight, _F32(eps), out)
    return out


# --- q/k RMSNorm + rotary embedding ------------------------------------------------------------


def _qk_norm_rope_impl(q, k, q_weight, k_weight, cos, sin, eps, qg):
    n_tok, e = cos.shape
    half = e // 2
    n_kv = k.shape[1] // e
    n_q = q.shape[1] // e
    group = n_q // n_kv
    for i in nb.prange(n_tok):
        # 1-D views of one head / one position: with them LLVM vectorises the loops below,
        # which it does not when they index the 2-D and 3-D arrays directly
        c, s_ = cos[i], sin[i]
        tmp = np.empty(e, dtype=np.float32)
        for h in range(n_q + n_kv):
            if h < n_q:
                src, w = q[i, h * e:(h + 1) * e], q_weight
            else:
                src, w = k[i, (h - n_q) * e:(h - n_q + 1) * e], k_weight
            ss = _F32(0.0)
            for j in range(e):
                ss += src[j] * src[j]
            scale = _F32(1.0) / math.sqrt(ss / _F32(e) + eps)
            for j in range(half):  # half-split rotation: (a, b) -> (a cos - b sin, b cos + a sin)
                a = (src[j] * scale) * w[j]
                b = (src[j + half] * scale) * w[j + half]
                tmp[j] = a * c[j] - b * s_[j]
                tmp[j + half] = b * c[j + half] + a * s_[j + half]
            if h < n_q:  # query head h joins its kv head's group: qg[h // G, i, (h % G)*E:]
                dst = qg[h // group, i, (h % group) * e:(h % group + 1) * e]
            else:  # keys are rotated in place
                dst = src
            for j in range(e):
                dst[j] = tmp[j]


_qk_norm_rope_nb, _qk_norm_rope_nb_par = _twice(_qk_norm_rope_impl, fastmath=_FAST)


def _rotate_half_split(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + xp.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def qk_norm_rope_np(q, k, q_weight, k_weight, cos, sin, eps: float, qg):
    """Twin of `qk_norm_rope`."""
    n, e = cos.shape
    n_kv = k.shape[1] // e
    c, s = cos[:, None, :], sin[:, None, :]  # [N, 1, E]
    qr = _rotate_half_split(rms_norm_np(q.reshape(n, -1, e), q_weight, eps), c, s)  # [N, H, E]
    qg[...] = qr.reshape(n, n_kv, -1).transpose(1, 0, 2)  # [N, H, E] -> [K, N, G*E]
    k[...] = _rotate_half_split(rms_norm_np(k.reshape(n, n_kv, e), k_weight, eps), c, s).reshape(n, -1)
    return qg


def qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps: float, qg):
    """Per-head RMSNorm, then half-split rotary embedding, of queries and keys.

    q [N, H*E] -> qg [K, N, G*E]: query heads regrouped by the kv head they read (head
    h = kv*G + g), so that one row's G heads form a single [L*G, E] matrix per kv head.
    k [N, K*E] is normalised and rotated in place. cos, sin [N, E].
    """
    e = cos.shape[1]
    if _cuda_ok(q, k, q_weight, k_weight, cos, sin, qg) and e & (e - 1) == 0 and 2 <= e <= 1024:
        n, n_kv = cos.shape[0], k.shape[1] // e
        _cuda_kernels().qk_norm_rope((n, q.shape[1] // e + n_kv), (e,),
                                     (q, k, q_weight, k_weight, cos, sin, _F32(eps), qg,
                                      np.int32(n), np.int32(q.shape[1] // e), np.int32(n_kv)))
        return qg
    if not IS_NUMPY:
        return qk_norm_rope_np(q, k, q_weight, k_weight, cos, sin, eps, qg)
    _pick(_qk_norm_rope_nb, _qk_norm_rope_nb_par, q.size)(q, k, q_weight, k_weight, cos, sin, _F32(eps), qg)
    return qg


# --- softmax ---------------------------------------------------------------------------------


@nb.njit(inline="always", fastmath=_FAST, error_model="numpy")
def _exp_shifted_row(row, n, scale):  # row <- exp(scale*(row - max)) in place; returns the sum
    mx = _row_max(row, n)
    tot = _F32(0.0)
    for j in range(n):
        e = _exp_nonpos((row[j] - mx) * scale)
        row[j] = e
        tot += e
    return tot


def _softmax_impl(s, scale):  # in place over the rows of s [M, L]
    m, n = s.shape
    for i in nb.prange(m):
        row = s[i]
        inv = _F32(1.0) / _exp_shifted_row(row, n, scale)
        for j in range(n):
            row[j] *= inv


def _softmax_unnormalized_impl(s, scale, inv):  # s <- exp(scale*s - max), inv <- 1 / row sums
    m, n = s.shape
    for i in nb.prange(m):
        inv[i] = _F32(1.0) / _exp_shifted_row(s[i], n, scale)


def _scale_heads_into_impl(o, inv, dst):
    # dst [L, K*G*E] <- o [K, L*G, E] with row (kv, l*G + g) scaled by inv[kv*L*G + l*G + g],
    # landing at dst[l, (kv*G + g)*E : ...] (query head h = kv*G + g, the checkpoint's order)
    n_kv, lg, e = o.shape
    n_tok = dst.shape[0]
    group = lg // n_tok
    for l in nb.prange(n_tok):
        out = dst[l]
        for kv in range(n_kv):
            for g in range(group):
                r = l * group + g
                src, f = o[kv, r], inv[kv * lg + r]
                base = (kv * group + g) * e
                for j in range(e):
                    out[base + j] = src[j] * f


_softmax_nb, _softmax_nb_par = _twice(_softmax_impl, fastmath=_FAST)
_softmax_unnormalized_nb, _softmax_unnormalized_nb_par = _twice(_softmax_unnormalized_impl, fastmath=_FAST)
_scale_heads_into_nb, _scale_heads_into_nb_par = _twice(_scale_heads_into_impl, fastmath=_FAST)


def softmax_rows_np(s, scale: float, inv=None):
    """Twin of `softmax_rows`."""
    s *= xp.float32(scale)
    s -= s.max(axis=-1, keepdims=True)
    xp.exp(s, out=s)
    if inv is None:
        s /= s.sum(axis=-1, keepdims=True)
    else:
        inv[...] = 1 / s.sum(axis=-1)
    return s


def softmax_rows(s, scale: float, inv=None):
    """In place: s [M, L] <- softmax(scale * s) along L (attention probabilities).

    With `inv` [M] given, the rows are left unnormalised (exp(scale * s - row max)) and inv gets
    1 / row sum: attention then scales the [M, E] output rows instead of the [M, L] weights
    (one pass over the larger array saved).
    """
    if inv is not None and _cuda_ok(s, inv):
        _cuda_kernels().softmax((s.shape[0],), (_CUDA_THREADS,), (s, _F32(scale), inv, np.int32(s.shape[1])))
        return s
    if not IS_NUMPY:
        return softmax_rows_np(s, scale, inv)
    if inv is None:
        _pick(_softmax_nb, _softmax_nb_par, s.size)(s, _F32(scale))
    else:
        _pick(_softmax_unnormalized_nb, _softmax_unnormalized_nb_par, s.size)(s, _F32(scale), inv)
    return s


def scale_heads_into_np(o, inv, dst):
    """Twin of `scale_heads_into`."""
    n_kv, lg, e = o.shape
    scaled = o * inv.reshape(n_kv, lg, 1)  # [K, L*G, E]
    dst[...] = scaled.reshape(n_kv, dst.shape[0], -1, e).transpose(1, 0, 2, 3).reshape(dst.shape[0], -1)
    return dst


def scale_heads_into(o, inv, dst):
    """Attention output of one row, normalised and put in head order: o [K, L*G, E] (kv head
    kv's G query heads stacked position-major), inv [K*L*G] (1 / softmax row sums) ->
    dst [L, K*G*E] with query head h = kv*G + g at columns h*E .. h*E + E."""
    if not IS_NUMPY:
        return scale_heads_into_np(o, inv, dst)
    _pick(_scale_heads_into_nb, _scale_heads_into_nb_par, o.size)(o, inv, dst)
    return dst


# --- SwiGLU ----------------------------------------------------------------------------------


def _swiglu_impl(gate, up):  # gate [N, F] <- silu(gate) * up
    rows, f = gate.shape
    for i in nb.prange(rows):
        g_row, u_row = gate[i], up[i]
        for j in range(f):
            g = g_row[j]
            e = _exp_nonpos(-abs(g))  # sigmoid from exp(-|g|) only, which never overflows
            num = g if g >= _F32(0.0) else g * e  # g * sigmoid(g) = num / (1 + e)
            g_row[j] = (num / (_F32(1.0) + e)) * u_row[j]


_swiglu_nb, _swiglu_nb_par = _twice(_swiglu_impl, fastmath=_FAST)


def swiglu_np(gate, up):
    """Twin of `swiglu` (x * sigmoid(x) written with tanh: no exp overflow for very negative x)."""
    gate *= xp.float32(0.5) + xp.float32(0.5) * xp.tanh(xp.float32(0.5) * gate)
    gate *= up
    return gate


def swiglu(gate, up):
    """In place: gate [N, F] <- silu(gate) * up (Qwen3's gated MLP activation)."""
    if _cuda_ok(gate, up):
        _cuda_kernels().swiglu(up, gate)
        return gate
    if not IS_NUMPY:
        return swiglu_np(gate, up)
    _pick(_swiglu_nb, _swiglu_nb_par, gate.size)(gate, up)
    return gate


# --- CUDA twins (CuPy backend) -----------------------------------------------------------------
# On the GPU the plain twins above launch several kernels each (a norm is six); these do each
# operation in one pass, with the Numba kernels' order of operations (float32 throughout, tree
# sums instead of sequential ones). `tests/test_strict_backend.py` checks them against the twins
# on a CUDA machine.

_CUDA_SOURCE = r"""
__device__ float block_sum(float v, float* buf) {  // blockDim.x a power of two, <= 1024
    unsigned t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    float total = buf[0];
    __syncthreads();
    return total;
}

__device__ float block_max(float v, float* buf) {
    unsigned t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] = fmaxf(buf[t], buf[t + s]);
        __syncthreads();
    }
    float total = buf[0];
    __syncthreads();
    return total;
}

// one block per row of x [rows, D]: x += y when add (in place), out = x * rsqrt(mean(x^2) + eps) * w
extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* w, float eps,
                                        float* out, int D, int add) {
    __shared__ float buf[1024];
    long long base = (long long)blockIdx.x * D;
    float ss = 0.f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float v = x[base + j];
        if (add) { v += y[base + j]; x[base + j] = v; }
        ss += v * v;
    }
    float scale = 1.f / sqrtf(block_sum(ss, buf) / (float)D + eps);
    for (int j = threadIdx.x; j < D; j += blockDim.x) out[base + j] = (x[base + j] * scale) * w[j];
}

// block (token i, head h of H query + K key heads), E threads: per-head RMSNorm, half-split RoPE;
// queries go to qg [K, N, G*E] (head h = kv*G + g), keys are rewritten in place
extern "C" __global__ void qk_norm_rope(const float* q, float* k, const float* qw, const float* kw,
                                        const float* cos_t, const float* sin_t, float eps,
                                        float* qg, int N, int H, int K) {
    __shared__ float buf[1024];
    int i = blockIdx.x, h = blockIdx.y, j = threadIdx.x, E = blockDim.x, half = E / 2;
    int p = j < half ? j + half : j - half;
    const float* src = h < H ? q + ((long long)i * H + h) * E : k + ((long long)i * K + (h - H)) * E;
    const float* w = h < H ? qw : kw;
    float v = src[j], u = src[p];
    float scale = 1.f / sqrtf(block_sum(v * v, buf) / (float)E + eps);  // every read is done here
    float a = (v * scale) * w[j], b = (u * scale) * w[p];
    float c = cos_t[(long long)i * E + j], s = sin_t[(long long)i * E + j];
    float r = j < half ? a * c - b * s : a * c + b * s;
    if (h < H) {
        int G = H / K;
        qg[((long long)(h / G) * N + i) * (G * E) + (h % G) * E + j] = r;
    } else {
        k[((long long)i * K + (h - H)) * E + j] = r;
    }
}

// one block per row of s [M, L]: s <- exp(scale*s - max), inv <- 1 / row sum
extern "C" __global__ void softmax_unnormalized(float* s, float scale, float* inv, int L) {
    __shared__ float buf[1024];
    long long base = (long long)blockIdx.x * L;
    float m = __int_as_float(0xff800000);  // -inf
    for (int j = threadIdx.x; j < L; j += blockDim.x) m = fmaxf(m, s[base + j] * scale);
    m = block_max(m, buf);
    float acc = 0.f;
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        float e = expf(s[base + j] * scale - m);
        s[base + j] = e;
        acc += e;
    }
    float total = block_sum(acc, buf);
    if (threadIdx.x == 0) inv[blockIdx.x] = 1.f / total;
}
"""

_CUDA_THREADS = 256


class _CudaKernels:
    """The kernels of _CUDA_SOURCE, compiled by CuPy (NVRTC, cached on disk) at first use."""

    def __init__(self):
        mod = xp.RawModule(code=_CUDA_SOURCE, options=("--std=c++14",))
        self.add_rms_norm = mod.get_function("add_rms_norm")
        self.qk_norm_rope = mod.get_function("qk_norm_rope")
        self.softmax = mod.get_function("softmax_unnormalized")
        # silu(g) * u with tanh (no exp overflow), as the twin
        self.swiglu = xp.ElementwiseKernel(
            "float32 up", "float32 gate",
            "gate = (gate * (0.5f + 0.5f * tanhf(0.5f * gate))) * up", "omnicore_swiglu")


_cuda = None


def _cuda_kernels():
    global _cuda
    if _cuda is None:
        _cuda = _CudaKernels()
    return _cuda


def _cuda_ok(*arrays) -> bool:
    return IS_CUPY and all(a.dtype == _F32 and a.flags.c_contiguous for a in arrays)


def _cuda_norm(x, y, weight, eps, out):
    D = x.shape[-1]
    rows = x.size // max(D, 1)
    _cuda_kernels().add_rms_norm((rows,), (_CUDA_THREADS,),
                                 (x, x if y is None else y, weight, _F32(eps), out, np.int32(D),
                                  np.int32(y is not None)))
    return out
