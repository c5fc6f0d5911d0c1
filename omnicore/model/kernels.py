"""The Numba loops between the backbone's GEMMs, each beside its plain-array twin.

What they compute is written out inline in `spec.layer` (RMSNorm, q/k norm and RoPE, softmax,
SwiGLU: model/spec.py); these are the fast forms of those lines.

Numba where BLAS cannot help, BLAS (through `backend.matmul`) everywhere else. Every Numba loop
`_name_nb` sits beside a plain array twin `name_np` written with `xp`, and the public `name(...)`
is a `jit.Kernel`: on the numpy backend it runs the Numba loop, on any other the twin (or, for
the backbone's hottest loops on CuPy, one CUDA kernel each: end of this file), chosen once.
`tests/test_kernels.py` holds each pair to a stated float32 tolerance (1e-5 to 2e-6): the
loops are compiled with reassociation and FMA contraction, so they are not equal bit for bit.

Here: RMSNorm (alone and fused with the residual add), q/k norm + RoPE, softmax, SwiGLU, and
the all-finite check of loaded weights. The shared machinery (deferred compilation, serial and
parallel twins, the float32 exp) is `jit`; the unmasking loop's scoring is in
`scoring_kernels`, the codec's kernels (convolutions, Snake, GELU, GroupNorm) in `conv_kernels`.

Dimension legend:
    N  rows (tokens) of a flattened [N, D] array   D  hidden size      F  MLP width
    H  query heads   K  key/value heads (H = K * G) E  head dim         L  length of one row
    M  rows of a score matrix [M, L]                C  codebooks        T  target frames
    V  audio vocabulary per codebook
"""

from __future__ import annotations

import math

import numpy as np

from . import jit
from .backend import xp
from .jit import F32 as _F32, FAST, exp_nonpos, prange, row_max


@jit.njit(inline="always", fastmath=FAST, error_model="numpy")
def _inv_rms(row, n, eps):
    ss = _F32(0.0)
    for j in range(n):
        ss += row[j] * row[j]
    return _F32(1.0) / math.sqrt(ss / _F32(n) + eps)


# --- all-finite check of loaded weights ------------------------------------------------------

_EXP_MASK = np.uint32(0x7F800000)  # a float32 is NaN or inf exactly when these bits are all set
_FINITE_BLOCK = 1 << 16  # elements between early-exit tests


@jit.njit(cache=True, nogil=True, error_model="numpy")
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
    bits = flat.view(np.uint32)
    # Read-only whatever the array (Numba types the flag): one compile, not one per flag.
    bits.flags.writeable = False
    return _all_finite_nb(bits)


# ---------------------------------------------------------------------------------------------
# Backbone kernels
#
# Everything between the backbone's GEMMs: RMSNorm (alone and fused with the residual add),
# per-head q/k RMSNorm + rotary embedding, row softmax, SwiGLU. Each writes into a buffer the
# caller owns (the backbone's Workspace), so the hot path allocates nothing.
# ---------------------------------------------------------------------------------------------


# --- RMSNorm ---------------------------------------------------------------------------------


def _rms_norm_impl(x, weight, eps, out):  # x, out [N, D]
    rows, d = x.shape
    for i in prange(rows):
        xr, o = x[i], out[i]  # row views vectorise better than 2-D indexing
        s = _inv_rms(xr, d, eps)
        for j in range(d):
            o[j] = (xr[j] * s) * weight[j]


def _add_rms_norm_impl(x, y, weight, eps, out):  # x += y; out = rms_norm(x)
    rows, d = x.shape
    for i in prange(rows):
        xr, yr, o = x[i], y[i], out[i]
        for j in range(d):
            xr[j] += yr[j]
        s = _inv_rms(xr, d, eps)
        for j in range(d):
            o[j] = (xr[j] * s) * weight[j]


_rms_norm_nb, _rms_norm_nb_par = jit.twice(_rms_norm_impl, fastmath=FAST, pooled=True)
_add_rms_norm_nb, _add_rms_norm_nb_par = jit.twice(_add_rms_norm_impl, fastmath=FAST, pooled=True)


def rms_norm_np(x, weight, eps: float, out=None):
    """Twin of `rms_norm`."""
    x = x.astype(xp.float32, copy=False)
    scale = (1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + xp.float32(eps))).astype(xp.float32)
    if out is None:
        return (x * scale) * weight
    xp.multiply(x, scale, out=out)
    xp.multiply(out, weight, out=out)
    return out


def _rms_norm_cuda(x, weight, eps: float, out=None):
    if not _cuda_ok(x, weight) or (out is not None and not _cuda_ok(out)):
        return rms_norm_np(x, weight, eps, out)
    return _cuda_norm(x, None, weight, eps, xp.empty_like(x) if out is None else out)


@jit.kernel(twin=rms_norm_np, cuda=_rms_norm_cuda)
def rms_norm(x, weight, eps: float, out=None):
    """RMSNorm over the last axis in float32: x * rsqrt(mean(x^2) + eps) * weight.

    x [..., D]; written into `out` (same shape) when given, else into a new array.
    The fast form of `spec.rms_norm`."""
    if x.dtype != _F32 or not x.flags.c_contiguous:
        return rms_norm_np(x, weight, eps, out)
    x2 = x.reshape(-1, x.shape[-1])  # [..., D] -> [N, D]
    res = np.empty_like(x2) if out is None else out.reshape(x2.shape)
    jit.serial_or_parallel(_rms_norm_nb, _rms_norm_nb_par, x2.size, pooled=True)(x2, weight, _F32(eps), res)
    return res.reshape(x.shape)


def add_rms_norm_np(x, y, weight, eps: float, out):
    """Twin of `add_rms_norm`."""
    x += y
    return rms_norm_np(x, weight, eps, out)


def _add_rms_norm_cuda(x, y, weight, eps: float, out):
    if not _cuda_ok(x, y, weight, out):
        return add_rms_norm_np(x, y, weight, eps, out)
    return _cuda_norm(x, y, weight, eps, out)


@jit.kernel(twin=add_rms_norm_np, cuda=_add_rms_norm_cuda)
def add_rms_norm(x, y, weight, eps: float, out):
    """Residual add fused with the next pre-norm: x += y (in place), out = rms_norm(x). [N, D].
    The fast form of `spec.layer`'s residual add and the next `spec.rms_norm`."""
    jit.serial_or_parallel(_add_rms_norm_nb, _add_rms_norm_nb_par, x.size, pooled=True)(x, y, weight, _F32(eps), out)
    return out


# --- q/k RMSNorm + rotary embedding ------------------------------------------------------------


def _qk_norm_rope_impl(q, k, q_weight, k_weight, cos, sin, eps, qg):
    n_tok, e = cos.shape
    half = e // 2
    n_kv = k.shape[1] // e
    n_q = q.shape[1] // e
    group = n_q // n_kv
    for i in prange(n_tok):
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


_qk_norm_rope_nb, _qk_norm_rope_nb_par = jit.twice(_qk_norm_rope_impl, fastmath=FAST, pooled=True)


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


def _qk_norm_rope_cuda(q, k, q_weight, k_weight, cos, sin, eps: float, qg):
    e = cos.shape[1]
    if not (_cuda_ok(q, k, q_weight, k_weight, cos, sin, qg) and e & (e - 1) == 0 and 2 <= e <= 1024):
        return qk_norm_rope_np(q, k, q_weight, k_weight, cos, sin, eps, qg)
    n, n_kv = cos.shape[0], k.shape[1] // e
    _cuda_kernels().qk_norm_rope((n, q.shape[1] // e + n_kv), (e,),
                                 (q, k, q_weight, k_weight, cos, sin, _F32(eps), qg,
                                  np.int32(n), np.int32(q.shape[1] // e), np.int32(n_kv)))
    return qg


@jit.kernel(twin=qk_norm_rope_np, cuda=_qk_norm_rope_cuda)
def qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps: float, qg):
    """Per-head RMSNorm, then half-split rotary embedding, of queries and keys.

    q [N, H*E] -> qg [K, N, G*E]: query heads regrouped by the kv head they read (head
    h = kv*G + g), so that one row's G heads form a single [L*G, E] matrix per kv head.
    k [N, K*E] is normalised and rotated in place. cos, sin [N, E].
    The fast form of the q/k `spec.rms_norm` and `spec.rotate` of `spec.layer`.
    """
    kernel = jit.serial_or_parallel(_qk_norm_rope_nb, _qk_norm_rope_nb_par, q.size, pooled=True)
    kernel(q, k, q_weight, k_weight, cos, sin, _F32(eps), qg)
    return qg


# --- softmax ---------------------------------------------------------------------------------


@jit.njit(inline="always", fastmath=FAST, error_model="numpy")
def _exp_shifted_row(row, n, scale):  # row <- exp(scale*(row - max)) in place; returns the sum
    mx = row_max(row, n)
    tot = _F32(0.0)
    for j in range(n):
        e = exp_nonpos((row[j] - mx) * scale)
        row[j] = e
        tot += e
    return tot


def _softmax_impl(s, scale):  # in place over the rows of s [M, L]
    m, n = s.shape
    for i in prange(m):
        row = s[i]
        inv = _F32(1.0) / _exp_shifted_row(row, n, scale)
        for j in range(n):
            row[j] *= inv


def _softmax_unnormalized_impl(s, scale, inv):  # s <- exp(scale*s - max), inv <- 1 / row sums
    m, n = s.shape
    for i in prange(m):
        inv[i] = _F32(1.0) / _exp_shifted_row(s[i], n, scale)


def _scale_heads_into_impl(o, inv, dst):
    # dst [L, K*G*E] <- o [K, L*G, E] with row (kv, l*G + g) scaled by inv[kv*L*G + l*G + g],
    # landing at dst[l, (kv*G + g)*E : ...] (query head h = kv*G + g, the checkpoint's order)
    n_kv, lg, e = o.shape
    n_tok = dst.shape[0]
    group = lg // n_tok
    for l in prange(n_tok):
        out = dst[l]
        for kv in range(n_kv):
            for g in range(group):
                r = l * group + g
                src, f = o[kv, r], inv[kv * lg + r]
                base = (kv * group + g) * e
                for j in range(e):
                    out[base + j] = src[j] * f


_softmax_nb, _softmax_nb_par = jit.twice(_softmax_impl, fastmath=FAST)
_softmax_unnormalized_nb, _softmax_unnormalized_nb_par = jit.twice(_softmax_unnormalized_impl, fastmath=FAST, pooled=True)
_scale_heads_into_nb, _scale_heads_into_nb_par = jit.twice(_scale_heads_into_impl, fastmath=FAST, pooled=True)


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


def _softmax_rows_cuda(s, scale: float, inv=None):
    if inv is None or not _cuda_ok(s, inv):
        return softmax_rows_np(s, scale, inv)
    _cuda_kernels().softmax((s.shape[0],), (_CUDA_THREADS,), (s, _F32(scale), inv, np.int32(s.shape[1])))
    return s


@jit.kernel(twin=softmax_rows_np, cuda=_softmax_rows_cuda)
def softmax_rows(s, scale: float, inv=None):
    """In place: s [M, L] <- softmax(scale * s) along L (attention probabilities).

    With `inv` [M] given, the rows are left unnormalised (exp(scale * s - row max)) and inv gets
    1 / row sum: attention then scales the [M, E] output rows instead of the [M, L] weights
    (one pass over the larger array saved).
    The fast form of the attention softmax of `spec.layer`.
    """
    if inv is None:
        jit.serial_or_parallel(_softmax_nb, _softmax_nb_par, s.size)(s, _F32(scale))
    else:
        kernel = jit.serial_or_parallel(_softmax_unnormalized_nb, _softmax_unnormalized_nb_par, s.size, pooled=True)
        kernel(s, _F32(scale), inv)
    return s


def scale_heads_into_np(o, inv, dst):
    """Twin of `scale_heads_into`."""
    n_kv, lg, e = o.shape
    scaled = o * inv.reshape(n_kv, lg, 1)  # [K, L*G, E]
    dst[...] = scaled.reshape(n_kv, dst.shape[0], -1, e).transpose(1, 0, 2, 3).reshape(dst.shape[0], -1)
    return dst


@jit.kernel(twin=scale_heads_into_np)
def scale_heads_into(o, inv, dst):
    """Attention output of one row, normalised and put in head order: o [K, L*G, E] (kv head
    kv's G query heads stacked position-major), inv [K*L*G] (1 / softmax row sums) ->
    dst [L, K*G*E] with query head h = kv*G + g at columns h*E .. h*E + E."""
    jit.serial_or_parallel(_scale_heads_into_nb, _scale_heads_into_nb_par, o.size, pooled=True)(o, inv, dst)
    return dst


# --- SwiGLU ----------------------------------------------------------------------------------


def _swiglu_impl(gate, up):  # gate [N, F] <- silu(gate) * up
    rows, f = gate.shape
    for i in prange(rows):
        g_row, u_row = gate[i], up[i]
        for j in range(f):
            g = g_row[j]
            e = exp_nonpos(-abs(g))  # sigmoid from exp(-|g|) only, which never overflows
            num = g if g >= _F32(0.0) else g * e  # g * sigmoid(g) = num / (1 + e)
            g_row[j] = (num / (_F32(1.0) + e)) * u_row[j]


_swiglu_nb, _swiglu_nb_par = jit.twice(_swiglu_impl, fastmath=FAST, pooled=True)


def swiglu_np(gate, up):
    """Twin of `swiglu` (x * sigmoid(x) written with tanh: no exp overflow for very negative x)."""
    gate *= xp.float32(0.5) + xp.float32(0.5) * xp.tanh(xp.float32(0.5) * gate)
    gate *= up
    return gate


def _swiglu_cuda(gate, up):
    if not _cuda_ok(gate, up):
        return swiglu_np(gate, up)
    _cuda_kernels().swiglu(up, gate)
    return gate


@jit.kernel(twin=swiglu_np, cuda=_swiglu_cuda)
def swiglu(gate, up):
    """In place: gate [N, F] <- silu(gate) * up (Qwen3's gated MLP activation).
    The fast form of the SwiGLU of `spec.layer`."""
    jit.serial_or_parallel(_swiglu_nb, _swiglu_nb_par, gate.size, pooled=True)(gate, up)
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
    return all(a.dtype == _F32 and a.flags.c_contiguous for a in arrays)


def _cuda_norm(x, y, weight, eps, out):
    D = x.shape[-1]
    rows = x.size // max(D, 1)
    _cuda_kernels().add_rms_norm((rows,), (_CUDA_THREADS,),
                                 (x, x if y is None else y, weight, _F32(eps), out, np.int32(D),
                                  np.int32(y is not None)))
    return out
