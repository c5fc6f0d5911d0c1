"""Compute kernels: Numba where BLAS cannot help, BLAS (through `xp.matmul`) everywhere else.

Every Numba kernel `_name_nb` sits beside a plain array twin `name_np` written with `xp`, and the
public `name(...)` picks one of them. That choice is made here and only here: Numba compiles for
numpy arrays on the CPU, so with the CuPy backend (`IS_NUMPY` false) the twins run instead.
`tests/test_kernels.py` checks each pair agrees.

Activations are time-major, `[B, T, C]`, so a convolution tap is a contiguous block of rows
and every convolution is a handful of GEMMs on views of the input (no im2col copies; measured
faster than im2col + one GEMM for every layer shape of the codec).

Dimension legend:
    B  batch                      T  time steps of the input     To  time steps of the output
    C  channels (Cin in, Cout out) K  kernel taps                 G  groups, Cg = C / G
    N  rows of a flattened [N, C] array

Weight layouts (made once by the stage loaders, never per call):
    conv1d            torch [Cout, Cin, K]     -> [K, Cin, Cout]          (conv_weight)
    grouped conv1d    torch [C, Cg, K]         -> [K, G, Cg, Cg]          (grouped_conv_weight)
    conv_transpose1d  torch [Cin, Cout, K]     -> [Cin, K * Cout]         (conv_transpose_weight)
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .backend import IS_NUMPY, xp

_F32 = np.float32

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


def conv_transpose_weight(w: np.ndarray) -> np.ndarray:
    """torch ConvTranspose1d weight [Cin, Cout, K] -> [Cin, K*Cout] for one GEMM per call."""
    cin, cout, k = w.shape
    return np.ascontiguousarray(np.transpose(w, (0, 2, 1)), dtype=_F32).reshape(cin, k * cout)


# ---------------------------------------------------------------------------------------------
# Snake: x + sin(alpha * x)^2 / alpha   (per-channel alpha; DAC's activation)
# ---------------------------------------------------------------------------------------------


# Work below this many elements runs on one thread: spawning threads costs more than it saves.
_PARALLEL_MIN = 1 << 16


def _twice(fn, **opts):
    """Compile `fn` (written with nb.prange) once serial and once parallel."""
    return nb.njit(cache=True, **opts)(fn), nb.njit(cache=True, parallel=True, **opts)(fn)


def _snake_impl(x, alpha, inv_alpha):  # x [N, C] float32
    n, c = x.shape
    out = np.empty_like(x)
    for i in nb.prange(n):
        for j in range(c):
            v = x[i, j]
            # alpha * x is rounded to float32 first, as in the reference. sin^2 has period pi,
            # so reduce by multiples of pi in float64 and use an odd polynomial on [-pi/2, pi/2]
            # (Taylor to r^17, error < 1e-13): unlike a libm sin call, this loop vectorises.
            y = np.float64(alpha[j] * v)
            k = np.floor(y * 0.3183098861837907 + 0.5)
            r = (y - k * 3.141592653589793) - k * 1.2246467991473532e-16
            r2 = r * r
            s = r * (1.0 + r2 * (-1.6666666666666666e-01 + r2 * (8.3333333333333332e-03 + r2 * (
                -1.9841269841269841e-04 + r2 * (2.7557319223985893e-06 + r2 * (-2.5052108385441720e-08 + r2 * (
                    1.6059043836821613e-10 + r2 * -7.6471637318198164e-13)))))))
            out[i, j] = v + inv_alpha[j] * np.float32(s * s)
    return out


_snake_nb, _snake_nb_par = _twice(_snake_impl, fastmath={"contract"})


def snake_np(x, alpha, inv_alpha):
    """Twin of `snake`. `inv_alpha` is 1 / (alpha + 1e-9), precomputed at load like the reference's."""
    s = xp.sin(alpha * x)
    return x + inv_alpha * (s * s)


def snake(x, alpha, inv_alpha):
    """Snake activation over the last axis of x [..., C] with per-channel alpha, inv_alpha [C]."""
    if not IS_NUMPY:
        return snake_np(x, alpha, inv_alpha)
    flat = np.ascontiguousarray(x, dtype=_F32).reshape(-1, x.shape[-1])  # [..., C] -> [N, C]
    kernel = _snake_nb_par if flat.size >= _PARALLEL_MIN else _snake_nb
    return kernel(flat, alpha, inv_alpha).reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# GELU with the exact erf (HuBERT uses the erf form, not the tanh approximation)
# ---------------------------------------------------------------------------------------------


def _gelu_impl(x):  # x [N] float32
    out = np.empty_like(x)
    for i in nb.prange(x.size):
        v = np.float64(x[i])
        out[i] = 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))
    return out


_gelu_nb, _gelu_nb_par = _twice(_gelu_impl)


def _erfc_np(z):
    """erfc for any real z, relative error < 1.2e-7 everywhere (Chebyshev-fitted exponent).

    numpy has no erf; this form keeps the small negative-side GELU values accurate too.
    """
    a = xp.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = (-1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277)))))))))
    r = t * xp.exp(-a * a + poly)
    return xp.where(z >= 0, r, 2.0 - r)


def gelu_np(x):
    """Twin of `gelu`: 0.5 * x * erfc(-x / sqrt 2), evaluated in float64, returned as float32."""
    v = x.astype(xp.float64)
    return (0.5 * v * _erfc_np(-v * 0.7071067811865476)).astype(xp.float32)


def gelu(x):
    """GELU(x) = x * Phi(x) with the exact Gaussian CDF, elementwise, float32 out."""
    if not IS_NUMPY:
        return gelu_np(x)
    flat = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    kernel = _gelu_nb_par if flat.size >= _PARALLEL_MIN else _gelu_nb
    return kernel(flat).reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# GroupNorm over (time x channels-of-the-group), per batch item
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def _group_norm_nb(x, num_groups, weight, bias, eps):  # x [B, T, C] float32
    b_, t_, c_ = x.shape
    cg = c_ // num_groups
    count = t_ * cg
    out = np.empty_like(x)
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
        acc[:] = 0.0
        for t in range(t_):
            for c in range(c_):
                d = x[b, t, c] - mean[c // cg]
                acc[c] += d * d
        var = np.zeros(num_groups, np.float64)
        for c in range(c_):
            var[c // cg] += acc[c]
        centre = np.empty(c_, np.float32)
        scale = np.empty(c_, np.float32)
        for c in range(c_):
            centre[c] = mean[c // cg]
            scale[c] = weight[c] / math.sqrt(var[c // cg] / count + eps)
        # (x - mean) * scale + bias: unlike x * scale + (bias - mean * scale) this does not
        # cancel catastrophically when the mean is large against the spread
        for t in range(t_):
            for c in range(c_):
                out[b, t, c] = (x[b, t, c] - centre[c]) * scale[c] + bias[c]
    return out


def group_norm_np(x, num_groups, weight, bias, eps):
    """Twin of `group_norm` (statistics in float64, output float32)."""
    b_, t_, c_ = x.shape
    g = x.reshape(b_, t_, num_groups, c_ // num_groups).astype(xp.float64)  # [B, T, G, Cg]
    mean = g.mean(axis=(1, 3), keepdims=True)  # [B, 1, G, 1]
    var = ((g - mean) ** 2).mean(axis=(1, 3), keepdims=True)
    y = ((g - mean) / xp.sqrt(var + eps)).reshape(b_, t_, c_)  # -> [B, T, C]
    return (y * weight + bias).astype(xp.float32)


def group_norm(x, num_groups: int, weight, bias, eps: float = 1e-5):
    """torch.nn.GroupNorm on time-major x [B, T, C]: statistics over the whole clip per group."""
    if not IS_NUMPY:
        return group_norm_np(x, num_groups, weight, bias, eps)
    return _group_norm_nb(np.ascontiguousarray(x, dtype=_F32), num_groups, weight, bias, eps)


# ---------------------------------------------------------------------------------------------
# Overlap-add (col2im) for transposed convolutions
# ---------------------------------------------------------------------------------------------


def _overlap_add_impl(cols, stride, start, length):  # cols [B, T, K, C] float32
    b_, t_, k_, c_ = cols.shape
    out = np.zeros((b_, length, c_), np.float32)
    for r in nb.prange(length):
        row = r + start  # row of the uncropped output
        # input steps t whose K taps cover this row: t*stride <= row < t*stride + K
        t_lo = max(0, (row - k_ + stride) // stride)
        t_hi = min(t_ - 1, row // stride)
        for b in range(b_):
            for t in range(t_lo, t_hi + 1):
                k = row - t * stride
                for c in range(c_):
                    out[b, r, c] += cols[b, t, k, c]
    return out


_overlap_add_nb, _overlap_add_nb_par = _twice(_overlap_add_impl)


def overlap_add_np(cols, stride: int, start: int, length: int):
    """Twin of `overlap_add`: scatter-add each tap's rows with a strided slice."""
    b_, t_, k_, c_ = cols.shape
    full = xp.zeros((b_, max((t_ - 1) * stride + k_, start + length), c_), dtype=xp.float32)
    for k in range(k_):  # K is small (2 * stride)
        full[:, k:k + (t_ - 1) * stride + 1:stride] += cols[:, :, k]
    return full[:, start:start + length]


def overlap_add(cols, stride: int, start: int, length: int):
    """Sum cols [B, T, K, C] into rows t*stride + k of an output, keep rows [start, start+length).

    This is the col2im half of a transposed convolution (the GEMM half is `x @ W`).
    """
    if not IS_NUMPY:
        return overlap_add_np(cols, stride, start, length)
    kernel = _overlap_add_nb_par if cols.size >= _PARALLEL_MIN else _overlap_add_nb
    return kernel(np.ascontiguousarray(cols, dtype=_F32), stride, start, length)


# ---------------------------------------------------------------------------------------------
# Convolutions as GEMMs (xp only; no twins needed)
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
    padded input per tap, accumulated in place.
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
    """Grouped stride-1 conv: x [B, T, C], w [K, G, Cg, Cg] (grouped_conv_weight) -> [B, To, C]."""
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


def conv_transpose1d(x, w, b, *, kernel_size: int, stride: int, padding: int = 0, output_padding: int = 0):
    """torch ConvTranspose1d: x [B, T, Cin], w [Cin, K*Cout] (conv_transpose_weight) -> [B, To, Cout].

    To = (T - 1)*stride - 2*padding + K + output_padding. One GEMM gives every tap of every input
    step; `overlap_add` sums them into place and crops `padding` rows on the left.
    """
    b_, t_, _ = x.shape
    cout = w.shape[1] // kernel_size
    t_out = (t_ - 1) * stride - 2 * padding + kernel_size + output_padding
    cols = (x @ w).reshape(b_, t_, kernel_size, cout)  # [B, T, Cin] -> [B, T, K*Cout] -> [B, T, K, Cout]
    y = overlap_add(cols, stride, padding, t_out)  # -> [B, To, Cout]
    if b is not None:
        y += b
    return y
