"""The codec's compute kernels: convolutions as GEMMs, and the Numba loops between them.

The fast forms of `spec.conv1d`, `spec.conv_transpose1d`, `spec.snake`, `spec.res_unit` and the
HuBERT branch's `spec.gelu` and `spec.layer_norm` (its GroupNorm is `layer_norm` over time,
per channel) in model/spec.py.

Snake (DAC), GELU and GroupNorm (HuBERT), the plain, grouped and transposed convolutions, and
the DAC residual unit fused chunk by chunk. Like every kernel module, each Numba kernel
`_name_nb` sits beside a plain array twin `name_np` written with `xp`, and the public
`name(...)` is a `jit.Kernel` that runs one of them (the twins on any backend but numpy); the
shared machinery (deferred compilation, serial/parallel pairs, the float32 exp) is `jit`. `tests/test_conv_kernels.py`
holds each pair to a stated float32 tolerance (fastmath loops: not bit for bit), and the
convolutions to their definitions.

Activations are time-major, `[B, T, C]`, so a convolution tap is a contiguous block of rows
and a convolution is a handful of GEMMs on views of the input, or im2col + one GEMM where
that gives BLAS a deeper inner dimension (the codec's narrow residual units: `dac_res_unit`).

Dimension legend:
    B  batch                      T  time steps of the input     To  time steps of the output
    C  channels (Cin in, Cout out) K  kernel taps                 G  groups, Cg = C / G
    N  rows of a flattened [N, C] array                          M  taps per output phase

Weight layouts (made once by the stage loaders, never per call):
    conv1d            torch [Cout, Cin, K]     -> [K, Cin, Cout]          (conv_weight)
    grouped conv1d    torch [C, Cg, K]         -> [K, G, Cg, Cg]          (grouped_conv_weight)
    conv_transpose1d  torch [Cin, Cout, K]     -> [M*Cin, stride*Cout]    (conv_transpose_weight, polyphase)
"""

from __future__ import annotations

import math
import os

import numpy as np

from . import jit
from .backend import xp
from .jit import F32 as _F32, exp_nonpos, prange

# ---------------------------------------------------------------------------------------------
# Layout conversions (called by loaders)
# ---------------------------------------------------------------------------------------------


def conv_weight(w: np.ndarray) -> np.ndarray:
    """torch Conv1d weight [Cout, Cin, K] -> [K, Cin, Cout], so that tap k is `x @ w[k]`."""
    return np.ascontiguousarray(np.transpose(w, (2, 1, 0)), dtype=_F32)


def grouped_conv_weight(w: np.ndarray, groups: int) -> np.ndarray:
    """torch grouped Conv1d weight [C, Cg, K] -> [K, G, Cg_in, Cg_out]."""
    c, cg, k = w.shape
    w = w.reshape(groups, c // groups, cg, k)  # [G, Cg_out, Cg_in, K]
    return np.ascontiguousarray(np.transpose(w, (3, 0, 2, 1)), dtype=_F32)  # -> [K, G, Cg_in, Cg_out]


def conv_transpose_weight(w: np.ndarray, stride: int) -> np.ndarray:
    """torch ConvTranspose1d weight [Cin, Cout, K] -> polyphase [M*Cin, stride*Cout], M = ceil(K/stride).

    Output step q*stride + p (phase p) sums x[q - j] @ w[:, :, p + j*stride] over j < M, so row
    block j and column block p hold tap p + j*stride (zero where that is past K): one GEMM
    on the M shifted copies of x gives the output directly in time order.
    """
    cin, cout, k = w.shape
    m = -(-k // stride)
    out = np.zeros((m, cin, stride, cout), _F32)  # [M, Cin, stride, Cout]
    for j in range(m):
        for p in range(min(stride, k - j * stride)):
            out[j, :, p, :] = w[:, :, p + j * stride]
    return out.reshape(m * cin, stride * cout)


# ---------------------------------------------------------------------------------------------
# Snake: x + sin(alpha * x)^2 / alpha   (per-channel alpha; DAC's activation)
# ---------------------------------------------------------------------------------------------

# The element-wise kernels write into arrays numpy allocated: numpy asks for huge pages on big
# arrays, while an array allocated inside a kernel faults in one 4 KiB page at a time.

# sin^2 has period pi, and on the half-period pieces it is sin^2(r) or cos^2(r) = 1 - sin^2(r)
# (never below 1/2 there, so no cancellation): reduce by multiples of pi/2 to |r| <= pi/4.
_TWO_OVER_PI = _F32(0.63661977)
# pi/2 in three float32 parts; the first has 8 significant bits so k * part is exact for
# |k| < 2^16 (Cody-Waite, as in Cephes' sinf)
_HALF_PI_PARTS = (_F32(1.5703125), _F32(4.837512969970703125e-4), _F32(7.54978995489188216e-8))
# sin(r) = r + r^3 P(r^2) on |r| <= pi/4 (Cephes' sinf minimax coefficients, ~1 ulp)
_SIN_POLY = (_F32(-1.9515295891e-4), _F32(8.3321608736e-3), _F32(-1.6666654611e-1))


@jit.njit(inline="always", fastmath={"contract"}, error_model="numpy")
def _snake_value(v, alpha, inv_alpha):
    # All float32 (8 lanes per AVX2 op; float64 would be 4), with the reference's own
    # float32 accuracy: within 3 ulp of the larger term, like torch's x + sin(a x)^2 / a.
    # (|a x| beyond 2^16 pi/2 loses digits in the reduction, but there the sin^2 term is
    # below 1/|a x| of |x| and the sum is still within an ulp.)
    y = alpha * v  # rounded to float32 first, as in the reference
    k = np.floor(y * _TWO_OVER_PI + _F32(0.5))
    r = ((y - k * _HALF_PI_PARTS[0]) - k * _HALF_PI_PARTS[1]) - k * _HALF_PI_PARTS[2]
    r2 = r * r
    s = r + r * r2 * (_SIN_POLY[2] + r2 * (_SIN_POLY[1] + r2 * _SIN_POLY[0]))
    s2 = s * s
    odd = k - _F32(2.0) * np.floor(k * _F32(0.5))  # 1.0 for odd k (a float: AVX2-vectorisable)
    return v + inv_alpha * (s2 + odd * (_F32(1.0) - _F32(2.0) * s2))


def _snake_impl(x, alpha, inv_alpha, out):  # x, out [N, C] float32
    n, c = x.shape
    for i in prange(n):
        for j in range(c):
            out[i, j] = _snake_value(x[i, j], alpha[j], inv_alpha[j])


_snake_nb, _snake_nb_par = jit.twice(_snake_impl, fastmath={"contract"})


def snake_np(x, alpha, inv_alpha):
    """Twin of `snake`. `inv_alpha` is 1 / (alpha + 1e-9), precomputed at load like the reference's."""
    s = xp.sin(alpha * x)
    return x + inv_alpha * (s * s)


@jit.kernel(twin=snake_np)
def snake(x, alpha, inv_alpha):
    """Snake activation over the last axis of x [..., C] with per-channel alpha, inv_alpha [C].
    The fast form of `spec.snake`."""
    flat = np.ascontiguousarray(x, dtype=_F32).reshape(-1, x.shape[-1])  # [..., C] -> [N, C]
    out = np.empty_like(flat)
    jit.serial_or_parallel(_snake_nb, _snake_nb_par, flat.size)(flat, alpha, inv_alpha, out)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# GELU with the exact erf (HuBERT uses the erf form, not the tanh approximation)
# ---------------------------------------------------------------------------------------------


@jit.njit(inline="always", fastmath={"contract"}, error_model="numpy")
def _gelu_value(v):
    """x * Phi(x) = 0.5 x erfc(-x / sqrt 2) in float32, vectorisable.

    erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a/2), with the 9th-degree P of Numerical
    Recipes' erfcc (relative error < 1.2e-7 for every a >= 0), and our float32 exp: libm's
    erf is a scalar call per element, which LLVM cannot vectorise.
    """
    z = v * _F32(-0.70710678)  # erfc's argument
    a = abs(z)
    t = _F32(1.0) / (_F32(1.0) + _F32(0.5) * a)
    p = _F32(0.17087277)
    p = p * t + _F32(-0.82215223)
    p = p * t + _F32(1.48851587)
    p = p * t + _F32(-1.13520398)
    p = p * t + _F32(0.27886807)
    p = p * t + _F32(-0.18628806)
    p = p * t + _F32(0.09678418)
    p = p * t + _F32(0.37409196)
    p = p * t + _F32(1.00002368)
    p = p * t + _F32(-1.26551223)
    r = t * exp_nonpos(p - a * a)  # erfc(|z|); the exponent is <= 0 up to rounding
    half_x = _F32(0.5) * v
    # z >= 0 (x <= 0): erfc(z) = r; z < 0: erfc(z) = 2 - r
    return half_x * r if z >= 0 else v - half_x * r


def _gelu_impl(x, out):  # x, out [N] float32
    for i in prange(x.size):
        out[i] = _gelu_value(x[i])


_gelu_nb, _gelu_nb_par = jit.twice(_gelu_impl, fastmath={"contract"})


# erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a/2): P's coefficients, highest degree first
# (Numerical Recipes' erfcc; relative error < 1.2e-7 for every a >= 0)
_ERFC_POLY = tuple(_F32(c) for c in (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807,
                                     -0.18628806, 0.09678418, 0.37409196, 1.00002368, -1.26551223))


def gelu_np(x):
    """Twin of `gelu`: the kernel's float32 formula step for step, with xp.exp for its exp
    (both within 1 ulp), so the two agree to float32 rounding; float32 throughout."""
    x = x.astype(xp.float32, copy=False)
    z = x * _F32(-0.70710678)  # erfc's argument
    a = xp.abs(z)
    t = _F32(1.0) / (_F32(1.0) + _F32(0.5) * a)
    p = t * _ERFC_POLY[0] + _ERFC_POLY[1]
    for c in _ERFC_POLY[2:]:
        p = p * t + c
    r = t * xp.exp(p - a * a)  # erfc(|z|)
    half_x = _F32(0.5) * x
    # z >= 0 (x <= 0): erfc(z) = r; z < 0: erfc(z) = 2 - r
    return xp.where(z >= 0, half_x * r, x - half_x * r)


@jit.kernel(twin=gelu_np)
def gelu(x):
    """GELU(x) = x * Phi(x) with the exact Gaussian CDF, elementwise, float32 out.
    The fast form of `spec.gelu`."""
    flat = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    out = np.empty_like(flat)
    jit.serial_or_parallel(_gelu_nb, _gelu_nb_par, flat.size)(flat, out)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# GroupNorm over (time x channels-of-the-group), per batch item
# ---------------------------------------------------------------------------------------------


@jit.njit(cache=True, nogil=True, error_model="numpy")
def _group_norm_nb(x, num_groups, weight, bias, eps, out):  # x, out [B, T, C] float32
    b_, t_, c_ = x.shape
    cg = c_ // num_groups
    count = t_ * cg
    for b in range(b_):
        # Row-major passes with per-channel float64 accumulators: one sweep over memory each.
        acc = np.zeros(c_, np.float64)
        for t in range(t_):
            for c in range(c_):
                acc[c] += x[b, t, c]
        mean = np.zeros(num_groups, np.float64)
        for c in range(c_):
            mean[c // cg] += acc[c]
        mean /= count
        mean_c = np.empty(c_, np.float64)  # per channel: no integer division in the loop below,
        for c in range(c_):  # which kept it scalar
            mean_c[c] = mean[c // cg]
        acc[:] = 0.0
        for t in range(t_):
            for c in range(c_):
                d = x[b, t, c] - mean_c[c]
                acc[c] += d * d
        var = np.zeros(num_groups, np.float64)
        for c in range(c_):
            var[c // cg] += acc[c]
        centre = np.empty(c_, np.float32)
        centre_lo = np.empty(c_, np.float32)  # what rounding the mean to float32 left out
        scale = np.empty(c_, np.float32)
        for c in range(c_):
            centre[c] = mean[c // cg]
            centre_lo[c] = mean[c // cg] - centre[c]
            scale[c] = weight[c] / math.sqrt(var[c // cg] / count + eps)
        # ((x - mean_hi) - mean_lo) * scale + bias: unlike x * scale + (bias - mean * scale)
        # this does not cancel catastrophically when the mean is large against the spread
        # (x - mean_hi is exact near the mean; a float32 mean alone is off by up to half an
        # ulp of the mean, which a small spread magnifies)
        for t in range(t_):
            for c in range(c_):
                out[b, t, c] = ((x[b, t, c] - centre[c]) - centre_lo[c]) * scale[c] + bias[c]


def group_norm_np(x, num_groups, weight, bias, eps):
    """Twin of `group_norm`, in float32 (the kernel accumulates in float64; the two differ by
    float32 rounding). Each (item, group) is summed as one contiguous row of T*Cg values, which
    numpy sums pairwise and CuPy as a tree (error growing with log n, not n), and the mean is
    refined by a second pass over the centred values; then ((x - mean) - shift) * scale + bias:
    x - mean is exact near the mean, and the small correction is applied separately instead of
    rounding mean + shift to one float32 (the kernel rounds its float64 mean once)."""
    b_, t_, c_ = x.shape
    cg = c_ // num_groups
    rows = xp.ascontiguousarray(x.reshape(b_, t_, num_groups, cg).transpose(0, 2, 1, 3))  # -> [B, G, T, Cg]
    rows = rows.reshape(b_, num_groups, t_ * cg)  # [B, G, T*Cg]
    n = _F32(t_ * cg)
    mean = rows.sum(axis=-1, keepdims=True) / n  # [B, G, 1]
    d = rows - mean
    shift = d.sum(axis=-1, keepdims=True) / n  # what rounding left out of the first mean
    d -= shift
    var = (d * d).sum(axis=-1, keepdims=True) / n  # [B, G, 1]
    def per_channel(g):  # [B, G, 1] -> [B, 1, C]
        return xp.broadcast_to(g, (b_, num_groups, cg)).reshape(b_, 1, c_)

    scale = (weight.reshape(num_groups, cg) / xp.sqrt(var + _F32(eps))).reshape(b_, 1, c_)  # -> [B, 1, C]
    return ((x - per_channel(mean)) - per_channel(shift)) * scale + bias


@jit.kernel(twin=group_norm_np)
def group_norm(x, num_groups: int, weight, bias, eps: float = 1e-5):
    """torch.nn.GroupNorm on time-major x [B, T, C]: statistics over the whole clip per group.
    The fast form of `spec.layer_norm` over time (HuBERT's first conv layer)."""
    x = np.ascontiguousarray(x, dtype=_F32)
    out = np.empty_like(x)
    _group_norm_nb(x, num_groups, weight, bias, eps, out)
    return out


# ---------------------------------------------------------------------------------------------
# Convolutions as GEMMs (conv1d, grouped: xp only, so no twins; transposed: Numba + twin)
# ---------------------------------------------------------------------------------------------


def pad_time(x, left: int, right: int):
    """Zero-pad the time axis of x [B, T, C] -> [B, left + T + right, C]."""
    if left == 0 and right == 0:
        return x
    b_, t_, c_ = x.shape
    out = xp.zeros((b_, left + t_ + right, c_), dtype=x.dtype)
    out[:, left:left + t_] = x
    return out


def conv_out_len(t: int, k: int, stride: int = 1, dilation: int = 1, padding: int = 0) -> int:
    """Output length of a torch Conv1d (floor division, like PyTorch)."""
    return (t + 2 * padding - dilation * (k - 1) - 1) // stride + 1


def conv1d(x, w, b=None, *, stride: int = 1, dilation: int = 1, padding: int = 0):
    """torch.nn.functional.conv1d on time-major data: x [B, T, Cin], w [K, Cin, Cout] -> [B, To, Cout].

    Tap k contributes `x[:, k*dilation + stride*t] @ w[k]`: one GEMM on a strided view of the
    padded input per tap, accumulated in place (strided convs: one GEMM per `stride` taps).
    The fast form of `spec.conv1d`.
    """
    k_, cin, cout = w.shape
    x = pad_time(x, padding, padding)
    t_out = conv_out_len(x.shape[1], k_, stride, dilation)
    if t_out <= 0:
        raise ValueError(f"conv1d: input of {x.shape[1]} steps (padded) is shorter than the kernel span")
    span = stride * (t_out - 1) + 1
    if cin * k_ <= 32:
        # Tiny inner dimension (the Cin = 1 waveform convs): one GEMM on gathered taps is
        # cheaper than K rank-Cin updates of a wide output.
        taps = xp.stack([x[:, k * dilation:k * dilation + span:stride] for k in range(k_)], axis=2)
        y = taps.reshape(x.shape[0], t_out, k_ * cin) @ w.reshape(k_ * cin, cout)  # [B, To, K*Cin] -> [B, To, Cout]
    elif stride > 1 and dilation == 1 and k_ % stride == 0:
        # Strided conv: with the input viewed as rows of `stride` consecutive steps, output t
        # reads rows t .. t + M - 1, so M = K / stride GEMMs with a stride*Cin-deep inner dimension
        # replace K GEMMs that are only Cin deep (DAC's k = 2 * stride convs: 2 instead of 16).
        # (Kernels that are not a multiple of the stride, like HuBERT's 3-tap stride-2 convs,
        # stay per tap: padding the input for the row view costs a full copy, more than the
        # deeper GEMMs save.)
        m = -(-k_ // stride)
        need = (t_out + m - 1) * stride
        x = pad_time(x, 0, max(0, need - x.shape[1]))[:, :need]  # extra zero rows are never read
        xr = x.reshape(x.shape[0], t_out + m - 1, stride * cin)  # [B, T', Cin] -> [B, T'/s, s*Cin] (view)
        y = None
        for j in range(m):
            n_taps = min(stride, k_ - j * stride)
            wj = w[j * stride:j * stride + n_taps].reshape(n_taps * cin, cout)  # taps j*s.. as one matrix
            part = xr[:, j:j + t_out, :n_taps * cin] @ wj  # [B, To, n*Cin] @ [n*Cin, Cout] -> [B, To, Cout]
            y = part if y is None else y + part
    else:
        y = x[:, 0:span:stride] @ w[0]  # [B, To, Cin] @ [Cin, Cout] -> [B, To, Cout]
        part = xp.empty_like(y)
        for k in range(1, k_):
            xp.matmul(x[:, k * dilation:k * dilation + span:stride], w[k], out=part)
            y += part
    if b is not None:
        y += b
    return y


def grouped_conv1d(x, w, b=None, *, padding: int = 0):
    """Grouped stride-1 conv: x [B, T, C], w [K, G, Cg, Cg] (grouped_conv_weight) -> [B, To, C].
    The fast form of the grouped positional conv of `spec.hubert_states`."""
    k_, g_, cg, cg_out = w.shape
    x = pad_time(x, padding, padding)
    b_, t_, c_ = x.shape
    t_out = t_ - k_ + 1
    xg = x.reshape(b_, t_, g_, cg).transpose(0, 2, 1, 3)  # [B, T, C] -> [B, G, T, Cg] (view)
    y = xg[:, :, 0:t_out] @ w[0]  # [B, G, To, Cg] @ [G, Cg, Cg] -> [B, G, To, Cg]
    part = xp.empty_like(y)
    for k in range(1, k_):
        xp.matmul(xg[:, :, k:k + t_out], w[k], out=part)
        y += part
    y = y.transpose(0, 2, 1, 3).reshape(b_, t_out, g_ * cg_out)  # [B, G, To, Cg] -> [B, To, C]
    if b is not None:
        y += b
    return y


def _transpose_steps(t_in: int, m: int, stride: int, padding: int, t_out: int) -> int:
    """Uncropped polyphase output steps q needed to cover output rows [padding, padding + To)."""
    return max(t_in + m - 1, -(-(padding + t_out) // stride))


def conv_transpose1d_np(x, w, b, *, kernel_size: int, stride: int, padding: int = 0, output_padding: int = 0):
    """Twin of `conv_transpose1d`: the whole polyphase GEMM at once."""
    b_, t_, cin = x.shape
    m, cout = w.shape[0] // cin, w.shape[1] // stride
    t_out = (t_ - 1) * stride - 2 * padding + kernel_size + output_padding
    q_ = _transpose_steps(t_, m, stride, padding, t_out)
    xpad = pad_time(x, m - 1, q_ - t_)  # x[q - j] at row q + m - 1 - j
    cols = xp.concatenate([xpad[:, m - 1 - j:m - 1 - j + q_] for j in range(m)], axis=2)  # [B, Q, M*Cin]
    y = (cols @ w).reshape(b_, q_ * stride, cout)[:, padding:padding + t_out]  # [B, Q, s*Cout] -> [B, To, Cout]
    return y + b if b is not None else y


def _shift_taps_impl(x, start, cols):  # cols[i, j*C + c] = x[start + i - j, c] (0 outside x)
    t_, c = x.shape
    m = cols.shape[1] // c
    for i in prange(cols.shape[0]):
        for j in range(m):
            src = start + i - j
            if 0 <= src < t_:
                for k in range(c):
                    cols[i, j * c + k] = x[src, k]
            else:
                for k in range(c):
                    cols[i, j * c + k] = _F32(0.0)


def _add_bias_impl(src, bias, dst):  # dst <- src + bias
    for i in prange(dst.shape[0]):
        for j in range(dst.shape[1]):
            dst[i, j] = src[i, j] + bias[j]


_shift_taps_nb, _shift_taps_nb_par = jit.twice(_shift_taps_impl)
_add_bias_nb, _add_bias_nb_par = jit.twice(_add_bias_impl)
# Chunk of the shifted copies: the time hardly depends on it across a wide range, and larger
# chunks would compute mostly padding in the widest, shortest layer (benchmarks/README.md).
_TRANSPOSE_CHUNK_BYTES = 1 << 21


@jit.kernel(twin=conv_transpose1d_np)
def conv_transpose1d(x, w, b, *, kernel_size: int, stride: int, padding: int = 0, output_padding: int = 0):
    """torch ConvTranspose1d: x [B, T, Cin], w [M*Cin, stride*Cout] (conv_transpose_weight) -> [B, To, Cout].

    To = (T - 1)*stride - 2*padding + K + output_padding. Polyphase form: the M shifted copies
    of x side by side times w give `stride` consecutive output steps per row, already in time
    order, so there is no overlap-add pass. Chunks of a fixed number of rows (shape-stable
    GEMMs, like `dac_res_unit`: rows do not depend on where a chunk starts).
    The fast form of `spec.conv_transpose1d`.
    """
    b_, t_, cin = x.shape
    if x.dtype != _F32:
        return conv_transpose1d_np(x, w, b, kernel_size=kernel_size, stride=stride, padding=padding,
                                   output_padding=output_padding)
    m, cout = w.shape[0] // cin, w.shape[1] // stride
    t_out = (t_ - 1) * stride - 2 * padding + kernel_size + output_padding
    q_ = _transpose_steps(t_, m, stride, padding, t_out)
    rows = max(1, _TRANSPOSE_CHUNK_BYTES // (4 * m * cin))
    cols = np.empty((rows, m * cin), _F32)
    yc = np.empty((rows, stride * cout), _F32)
    zero = np.zeros(cout, _F32)
    out = np.empty((b_, t_out, cout), _F32)
    shift_taps = jit.serial_or_parallel(_shift_taps_nb, _shift_taps_nb_par, rows * m * cin)
    add_bias = jit.serial_or_parallel(_add_bias_nb, _add_bias_nb_par, rows * m * cin)
    for bi in range(b_):
        xb = np.ascontiguousarray(x[bi])
        for q0 in range(0, q_, rows):
            shift_taps(xb, q0, cols)
            np.matmul(cols, w, out=yc)  # [rows, M*Cin] @ [M*Cin, s*Cout] -> [rows, s*Cout]
            flat = yc.reshape(rows * stride, cout)  # uncropped output steps q0*s ...
            lo = max(0, padding - q0 * stride)  # first kept step of this chunk
            hi = min(rows * stride, padding + t_out - q0 * stride)
            if hi > lo:
                o = q0 * stride + lo - padding
                add_bias(flat[lo:hi], zero if b is None else b, out[bi, o:o + hi - lo])
    return out


# ---------------------------------------------------------------------------------------------
# DAC residual unit, fused per chunk of time
# ---------------------------------------------------------------------------------------------


def _snake_taps_impl(x, alpha, inv_alpha, start, dilation, win, cols):
    # win [n + (K-1)*d, C] <- snake(x[start + i]), zero outside x (the conv pads after Snake);
    # cols [n, K*C] <- the K dilated taps of every output row (im2col)
    t_, c = x.shape
    for i in prange(win.shape[0]):
        src = start + i
        if 0 <= src < t_:
            for j in range(c):
                win[i, j] = _snake_value(x[src, j], alpha[j], inv_alpha[j])
        else:
            for j in range(c):
                win[i, j] = _F32(0.0)
    k_ = cols.shape[1] // c
    for i in prange(cols.shape[0]):
        for k in range(k_):
            for j in range(c):
                cols[i, k * c + j] = win[i + k * dilation, j]


def _bias_snake_impl(h, bias, alpha, inv_alpha):  # in place: h <- snake(h + bias)
    for i in prange(h.shape[0]):
        for j in range(h.shape[1]):
            h[i, j] = _snake_value(h[i, j] + bias[j], alpha[j], inv_alpha[j])


def _bias_residual_impl(y, bias, x, out):  # out <- x + (y + bias)
    for i in prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = x[i, j] + (y[i, j] + bias[j])


_snake_taps_nb, _snake_taps_nb_par = jit.twice(_snake_taps_impl, fastmath={"contract"})
_bias_snake_nb, _bias_snake_nb_par = jit.twice(_bias_snake_impl, fastmath={"contract"})
_bias_residual_nb, _bias_residual_nb_par = jit.twice(_bias_residual_impl)

# Units at most this wide run chunk by chunk (im2col + one GEMM per chunk); wider ones as
# per-tap GEMMs, which BLAS already runs near its peak there (benchmarks/README.md).
_RES_UNIT_MAX_C = 256


def _cache_size_bytes(text: str) -> int:
    """sysfs cache size text ("512K", "2M", "1048576") -> bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * scale


def _l2_bytes(base: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """One core's L2 cache in bytes, from sysfs or glibc; 1 MiB when neither says."""
    try:
        for entry in sorted(os.listdir(base)):
            d = os.path.join(base, entry)
            with open(os.path.join(d, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            if level == "2" and kind in ("Unified", "Data"):
                with open(os.path.join(d, "size")) as f:
                    return _cache_size_bytes(f.read())
    except (OSError, ValueError):
        pass
    try:
        n = os.sysconf("SC_LEVEL2_CACHE_SIZE")
        if n > 0:
            return int(n)
    except (ValueError, OSError, AttributeError):
        pass
    return 1 << 20


# im2col chunk size: 4x one core's L2, within [1, 8] MiB. The im2col chunk is written by one
# kernel and read back by BLAS's packing; past a few L2s it goes out to L3 and memory, below
# about one the GEMMs get too short (benchmarks/README.md, design notes). Read from the machine
# at the first use, not at import. The row cap keeps very narrow layers (tiny test models) from
# computing mostly padding.
_RES_UNIT_CHUNK_BYTES: int | None = None
_RES_UNIT_MAX_ROWS = 16384


def _res_unit_chunk_bytes() -> int:
    global _RES_UNIT_CHUNK_BYTES
    if _RES_UNIT_CHUNK_BYTES is None:
        _RES_UNIT_CHUNK_BYTES = min(8 << 20, max(1 << 20, 4 * _l2_bytes()))
    return _RES_UNIT_CHUNK_BYTES


def dac_res_unit_np(x, alpha1, inv1, w7, b7, dilation: int, alpha2, inv2, w1, b1):
    """Twin of `dac_res_unit`: the plain composition of snake and conv1d."""
    pad = (w7.shape[0] - 1) * dilation // 2
    y = snake(x, alpha1, inv1)
    y = conv1d(y, w7, b7, dilation=dilation, padding=pad)
    y = snake(y, alpha2, inv2)
    return x + conv1d(y, w1, b1)


@jit.kernel(twin=dac_res_unit_np)
def dac_res_unit(x, alpha1, inv1, w7, b7, dilation: int, alpha2, inv2, w1, b1):
    """DAC residual unit on x [B, T, C]: x + conv_k1(snake(conv_K(snake(x), dilated, 'same'))).

    w7 [K, C, C], w1 [1, C, C] in the conv_weight layout. Narrow units are computed one chunk
    of time at a time: Snake, padding and im2col of the chunk's input window (one kernel), the
    K-tap conv as one GEMM, bias + Snake, the 1x1 conv, bias + residual -- the intermediate
    arrays never leave the cache, and the K-tap GEMM has a K*C-deep inner dimension instead
    of K separate C-deep ones.

    Every chunk has the same number of rows (the last one is padded), so each GEMM has the same
    shape wherever the chunk boundaries fall. A row's result still depends on them by rounding:
    some BLAS kernels (OpenBLAS's Haswell sgemm) round a row differently with its position in
    the GEMM, so a windowed (streaming) decode matches the one-shot decode to float32 rounding,
    not bit for bit (sizes: benchmarks/README.md).
    The fast form of `spec.res_unit`.
    """
    k_, c, _ = w7.shape
    if c > _RES_UNIT_MAX_C or x.dtype != _F32:
        return dac_res_unit_np(x, alpha1, inv1, w7, b7, dilation, alpha2, inv2, w1, b1)
    b_, t_, _ = x.shape
    pad = (k_ - 1) * dilation // 2
    rows = max(1, min(_RES_UNIT_MAX_ROWS, _res_unit_chunk_bytes() // (4 * k_ * c)))  # depends on the layer only
    win = np.empty((rows + 2 * pad, c), _F32)
    cols = np.empty((rows, k_ * c), _F32)
    h = np.empty((rows, c), _F32)
    y = np.empty((rows, c), _F32)
    w_taps = w7.reshape(k_ * c, c)  # [K, Cin, Cout] -> [K*Cin, Cout], rows (k, cin) like cols
    out = np.empty_like(x)
    size = rows * k_ * c
    snake_taps = jit.serial_or_parallel(_snake_taps_nb, _snake_taps_nb_par, size)
    bias_snake = jit.serial_or_parallel(_bias_snake_nb, _bias_snake_nb_par, size)
    bias_residual = jit.serial_or_parallel(_bias_residual_nb, _bias_residual_nb_par, size)
    for b in range(b_):
        xb = np.ascontiguousarray(x[b])
        for s in range(0, t_, rows):
            n = min(rows, t_ - s)  # rows past the end are computed from zeros and dropped
            snake_taps(xb, alpha1, inv1, s - pad, dilation, win, cols)
            np.matmul(cols, w_taps, out=h)  # [rows, K*C] @ [K*C, C] -> [rows, C]
            bias_snake(h, b7, alpha2, inv2)
            np.matmul(h, w1[0], out=y)  # [rows, C] @ [C, C] -> [rows, C]
            bias_residual(y[:n], b1, xb[s:s + n], out[b, s:s + n])
    return out
