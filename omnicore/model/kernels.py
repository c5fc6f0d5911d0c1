"""Compute kernels: Numba where BLAS cannot help, BLAS (through `xp.matmul`) everywhere else.

Every Numba kernel `_name_nb` sits beside a plain array twin `name_np` written with `xp`, and the
public `name(...)` picks one of them. That choice is made here and only here: Numba compiles for
numpy arrays on the CPU, so with the CuPy backend (`IS_NUMPY` false) the twins run instead.
`tests/test_kernels.py` checks each pair agrees.

Activations are time-major, `[B, T, C]`, so a convolution tap is a contiguous block of rows
and a convolution is a handful of GEMMs on views of the input, or im2col + one GEMM where that
measured faster (the codec's narrow residual units, chunk by chunk: `dac_res_unit`).

Dimension legend:
    B  batch                      T  time steps of the input     To  time steps of the output
    C  channels (Cin in, Cout out) K  kernel taps                 G  groups, Cg = C / G
    N  rows of a flattened [N, C] array

Weight layouts (made once by the stage loaders, never per call):
    conv1d            torch [Cout, Cin, K]     -> [K, Cin, Cout]          (conv_weight)
    grouped conv1d    torch [C, Cg, K]         -> [K, G, Cg, Cg]          (grouped_conv_weight)
    conv_transpose1d  torch [Cin, Cout, K]     -> [M*Cin, stride*Cout]    (conv_transpose_weight, polyphase)
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


# Kernels write into arrays numpy allocated: numpy asks the kernel for huge pages on big
# arrays, while an array allocated inside a kernel faults in 4 KiB pages, and in a VM a fresh
# 33 MB array cost ~16 ms of page faults (HuBERT's first conv layer; benchmarks/README.md).
# Numba's thread pool is off by default: a parallel region waits for cores that BLAS's spinning
# workers hold (measured: benchmarks/README.md, design notes). OMNICORE_PARALLEL_KERNELS=1 turns
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
    vectorising any loop that divides (GELU ran 8x, SwiGLU 2x slower).

    The parallel twin is compiled from a renamed copy of `fn`: Numba names its on-disk cache
    after the function's qualified name and line, not its compile options, so two versions of
    one function would share a cache entry and the second would silently load the first's code.
    """
    par = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_par", fn.__defaults__,
                             fn.__closure__)
    par.__qualname__ = fn.__qualname__ + "_par"
    opts.setdefault("error_model", "numpy")
    return nb.njit(cache=True, **opts)(fn), nb.njit(cache=True, parallel=True, **opts)(par)


# sin^2 has period pi, and on the half-period pieces it is sin^2(r) or cos^2(r) = 1 - sin^2(r)
# (never below 1/2 there, so no cancellation): reduce by multiples of pi/2 to |r| <= pi/4.
_TWO_OVER_PI = _F32(0.63661977)
# pi/2 in three float32 parts; the first has 8 significant bits so k * part is exact for
# |k| < 2^16 (Cody-Waite, as in Cephes' sinf)
_HALF_PI_PARTS = (_F32(1.5703125), _F32(4.837512969970703125e-4), _F32(7.54978995489188216e-8))
# sin(r) = r + r^3 P(r^2) on |r| <= pi/4 (Cephes' sinf minimax coefficients, ~1 ulp)
_SIN_POLY = (_F32(-1.9515295891e-4), _F32(8.3321608736e-3), _F32(-1.6666654611e-1))


@nb.njit(inline="always", fastmath={"contract"}, error_model="numpy")
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
    for i in nb.prange(n):
        for j in range(c):
            out[i, j] = _snake_value(x[i, j], alpha[j], inv_alpha[j])


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
    out = np.empty_like(flat)
    _pick(_snake_nb, _snake_nb_par, flat.size)(flat, alpha, inv_alpha, out)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# GELU with the exact erf (HuBERT uses the erf form, not the tanh approximation)
# ---------------------------------------------------------------------------------------------


def _gelu_impl(x, out):  # x, out [N] float32
    for i in nb.prange(x.size):
        out[i] = _gelu_value(x[i])


_gelu_nb, _gelu_nb_par = _twice(_gelu_impl, fastmath={"contract"})


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


def gelu(x):
    """GELU(x) = x * Phi(x) with the exact Gaussian CDF, elementwise, float32 out."""
    if not IS_NUMPY:
        return gelu_np(x)
    flat = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    out = np.empty_like(flat)
    _pick(_gelu_nb, _gelu_nb_par, flat.size)(flat, out)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# GroupNorm over (time x channels-of-the-group), per batch item
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, error_model="numpy")
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


def group_norm(x, num_groups: int, weight, bias, eps: float = 1e-5):
    """torch.nn.GroupNorm on time-major x [B, T, C]: statistics over the whole clip per group."""
    if not IS_NUMPY:
        return group_norm_np(x, num_groups, weight, bias, eps)
    x = np.ascontiguousarray(x, dtype=_F32)
    out = np.empty_like(x)
    _group_norm_nb(x, num_groups, weight, bias, eps, out)
    return out


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
    padded input per tap, accumulated in place (strided convs: one GEMM per `stride` taps).
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
        # stay per tap: padding the input for the row view costs a full copy; measured slower.)
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
    for i in nb.prange(cols.shape[0]):
        for j in range(m):
            src = start + i - j
            if 0 <= src < t_:
                for k in range(c):
                    cols[i, j * c + k] = x[src, k]
            else:
                for k in range(c):
                    cols[i, j * c + k] = _F32(0.0)


def _add_bias_impl(src, bias, dst):  # dst <- src + bias
    for i in nb.prange(dst.shape[0]):
        for j in range(dst.shape[1]):
            dst[i, j] = src[i, j] + bias[j]


_shift_taps_nb, _shift_taps_nb_par = _twice(_shift_taps_impl)
_add_bias_nb, _add_bias_nb_par = _twice(_add_bias_impl)
# Chunk of the shifted copies: 0.5-8 MiB measured within 5 % of each other at 64-512 input
# channels; bigger chunks than this compute mostly padding at 1024 (only 250 rows there).
_TRANSPOSE_CHUNK_BYTES = 1 << 21


def conv_transpose1d(x, w, b, *, kernel_size: int, stride: int, padding: int = 0, output_padding: int = 0):
    """torch ConvTranspose1d: x [B, T, Cin], w [M*Cin, stride*Cout] (conv_transpose_weight) -> [B, To, Cout].

    To = (T - 1)*stride - 2*padding + K + output_padding. Polyphase form: the M shifted copies
    of x side by side times w give `stride` consecutive output steps per row, already in time
    order, so there is no overlap-add pass. Chunks of a fixed number of rows (shape-stable
    GEMMs, like `dac_res_unit`: rows do not depend on where a chunk starts).
    """
    b_, t_, cin = x.shape
    if not IS_NUMPY or x.dtype != _F32:
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
    shift_taps = _pick(_shift_taps_nb, _shift_taps_nb_par, rows * m * cin)
    add_bias = _pick(_add_bias_nb, _add_bias_nb_par, rows * m * cin)
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


# =============================================================================================
# Backbone and scoring kernels
#
# Everything between the backbone's GEMMs: RMSNorm (alone and fused with the residual add),
# per-head q/k RMSNorm + rotary embedding, row softmax, SwiGLU, and the guided scoring of the
# unmasking loop. Each writes into a buffer the caller owns (the backbone's Workspace), so the
# hot path allocates nothing.
#
# So that these loops vectorise, exp() is our own float32 polynomial (`_exp_nonpos`) and a
# running max is kept in 16 lanes (`_row_max`). Results that would be subnormal are flushed to
# 0: later arithmetic on them is far slower, and they cannot change a sum holding exp(0) = 1.
# (Why and how much: benchmarks/README.md, design notes.)
# =============================================================================================

from numba.core import types as _nbtypes  # noqa: E402
from numba.extending import intrinsic as _intrinsic  # noqa: E402

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
        # 1-D views of one head / one position: with them LLVM vectorises the loops below
        # (indexing the 2-D and 3-D arrays directly inside the loops ran 2.7x slower)
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


# --- guided scoring of the unmasking loop ----------------------------------------------------


@nb.njit(inline="always", fastmath=_FAST, error_model="numpy")
def _log_sum_exp(row, n):
    mx = _row_max(row, n)
    tot = _F32(0.0)
    for j in range(n):
        tot += _exp_nonpos(row[j] - mx)
    return mx, math.log(tot)


def _guided_scores_impl(cond, uncond, guidance, use_uncond, mask_id, lp, tokens, conf):
    # cond, uncond, lp [T, C, V] C-contiguous; tokens [C, T] int64, conf [C, T] float32
    t_, c_, v_ = cond.shape
    for cell in nb.prange(t_ * c_):
        t, c = cell // c_, cell % c_
        x, out = cond[t, c], lp[t, c]
        mx, log_tot = _log_sum_exp(x, v_)
        if use_uncond:
            y = uncond[t, c]
            my, log_tot_u = _log_sum_exp(y, v_)
            for j in range(v_):  # z = cl + g (cl - ul) with cl, ul the two log-softmaxes
                cl = (x[j] - mx) - log_tot
                ul = (y[j] - my) - log_tot_u
                out[j] = cl + guidance * (cl - ul)
            mz, log_tot_z = _log_sum_exp(out, v_)
            for j in range(v_):
                out[j] = (out[j] - mz) - log_tot_z
        else:
            for j in range(v_):
                out[j] = (x[j] - mx) - log_tot
        out[mask_id] = -np.inf  # MASK is never a prediction
        best = _row_max(out, v_)
        arg = 0
        while out[arg] != best:  # first index of the maximum, as argmax
            arg += 1
        tokens[c, t] = arg
        conf[c, t] = best


_guided_scores_nb, _guided_scores_nb_par = _twice(_guided_scores_impl, fastmath=_FAST)


def log_softmax_np(x):
    """Log-softmax over the last axis (the one used everywhere: scoring and its tests)."""
    x = x - x.max(axis=-1, keepdims=True)
    return x - xp.log(xp.exp(x).sum(axis=-1, keepdims=True))


def guided_scores_np(cond, uncond, guidance: float, mask_id: int):
    """Twin of `guided_scores`."""
    if uncond is not None and guidance != 0:
        c, u = log_softmax_np(cond), log_softmax_np(uncond)
        lp = log_softmax_np(c + xp.float32(guidance) * (c - u))
    else:
        lp = log_softmax_np(cond)
    lp[..., mask_id] = -xp.inf
    return lp, lp.argmax(axis=-1).astype(xp.int64), lp.max(axis=-1)


def guided_scores(cond, uncond, guidance: float, mask_id: int):
    """Classifier-free-guided log-probabilities of every cell, its best token and confidence.

    cond, uncond [C, T, V] logits (uncond None, or guidance 0: no guidance) ->
    lp [C, T, V] = log_softmax(c + g (c - u)) of the log-softmaxes c, u, with lp[..., MASK] = -inf;
    tokens [C, T] int64 = argmax lp (first on ties); confidence [C, T] float32 = max lp.
    """
    if not IS_NUMPY:
        return guided_scores_np(cond, uncond, guidance, mask_id)
    use_uncond = uncond is not None and guidance != 0
    # [C, T, V] views of the heads' [T, C, V] output are contiguous again once transposed back
    ct = np.ascontiguousarray(cond.transpose(1, 0, 2), dtype=_F32)  # [C, T, V] -> [T, C, V]
    ut = np.ascontiguousarray(uncond.transpose(1, 0, 2), dtype=_F32) if use_uncond else ct
    c_, t_, v_ = cond.shape
    lp = np.empty((t_, c_, v_), _F32)
    tokens = np.empty((c_, t_), np.int64)
    conf = np.empty((c_, t_), _F32)
    _pick(_guided_scores_nb, _guided_scores_nb_par, ct.size)(
        ct, ut, _F32(guidance), use_uncond, mask_id, lp, tokens, conf)
    return lp.transpose(1, 0, 2), tokens, conf


# --- DAC residual unit, fused per chunk of time ----------------------------------------------


def _snake_taps_impl(x, alpha, inv_alpha, start, dilation, win, cols):
    # win [n + (K-1)*d, C] <- snake(x[start + i]), zero outside x (the conv pads after Snake);
    # cols [n, K*C] <- the K dilated taps of every output row (im2col)
    t_, c = x.shape
    for i in nb.prange(win.shape[0]):
        src = start + i
        if 0 <= src < t_:
            for j in range(c):
                win[i, j] = _snake_value(x[src, j], alpha[j], inv_alpha[j])
        else:
            for j in range(c):
                win[i, j] = _F32(0.0)
    k_ = cols.shape[1] // c
    for i in nb.prange(cols.shape[0]):
        for k in range(k_):
            for j in range(c):
                cols[i, k * c + j] = win[i + k * dilation, j]


def _bias_snake_impl(h, bias, alpha, inv_alpha):  # in place: h <- snake(h + bias)
    for i in nb.prange(h.shape[0]):
        for j in range(h.shape[1]):
            h[i, j] = _snake_value(h[i, j] + bias[j], alpha[j], inv_alpha[j])


def _bias_residual_impl(y, bias, x, out):  # out <- x + (y + bias)
    for i in nb.prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = x[i, j] + (y[i, j] + bias[j])


_snake_taps_nb, _snake_taps_nb_par = _twice(_snake_taps_impl, fastmath={"contract"})
_bias_snake_nb, _bias_snake_nb_par = _twice(_bias_snake_impl, fastmath={"contract"})
_bias_residual_nb, _bias_residual_nb_par = _twice(_bias_residual_impl)

# Units at most this wide run chunk by chunk (im2col + one GEMM per chunk); wider ones as
# per-tap GEMMs, which BLAS already runs near its peak there (measured: benchmarks/README.md).
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
# about one the GEMMs get too short (measured: benchmarks/README.md, design notes). The row cap
# keeps very narrow layers (tiny test models) from computing mostly padding.
_RES_UNIT_CHUNK_BYTES = min(8 << 20, max(1 << 20, 4 * _l2_bytes()))
_RES_UNIT_MAX_ROWS = 16384


def dac_res_unit_np(x, alpha1, inv1, w7, b7, dilation: int, alpha2, inv2, w1, b1):
    """Twin of `dac_res_unit`: the plain composition of snake and conv1d."""
    pad = (w7.shape[0] - 1) * dilation // 2
    y = snake(x, alpha1, inv1)
    y = conv1d(y, w7, b7, dilation=dilation, padding=pad)
    y = snake(y, alpha2, inv2)
    return x + conv1d(y, w1, b1)


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
    the GEMM (measured <= 4e-7 relative on a unit's output; 0 with the Sandybridge kernels), so a
    windowed (streaming) decode matches the one-shot decode to float32 rounding, not bit for bit.
    """
    k_, c, _ = w7.shape
    if not IS_NUMPY or c > _RES_UNIT_MAX_C or x.dtype != _F32:
        return dac_res_unit_np(x, alpha1, inv1, w7, b7, dilation, alpha2, inv2, w1, b1)
    b_, t_, _ = x.shape
    pad = (k_ - 1) * dilation // 2
    rows = max(1, min(_RES_UNIT_MAX_ROWS, _RES_UNIT_CHUNK_BYTES // (4 * k_ * c)))  # depends on the layer only
    win = np.empty((rows + 2 * pad, c), _F32)
    cols = np.empty((rows, k_ * c), _F32)
    h = np.empty((rows, c), _F32)
    y = np.empty((rows, c), _F32)
    w_taps = w7.reshape(k_ * c, c)  # [K, Cin, Cout] -> [K*Cin, Cout], rows (k, cin) like cols
    out = np.empty_like(x)
    size = rows * k_ * c
    snake_taps = _pick(_snake_taps_nb, _snake_taps_nb_par, size)
    bias_snake = _pick(_bias_snake_nb, _bias_snake_nb_par, size)
    bias_residual = _pick(_bias_residual_nb, _bias_residual_nb_par, size)
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


# --- GELU in float32 -------------------------------------------------------------------------


@nb.njit(inline="always", fastmath={"contract"}, error_model="numpy")
def _gelu_value(v):
    """x * Phi(x) = 0.5 x erfc(-x / sqrt 2) in float32, vectorisable.

    erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a/2), with the 9th-degree P of Numerical
    Recipes' erfcc (relative error < 1.2e-7 for every a >= 0), and our float32 exp. The
    float64 libm erf this replaced was a scalar call per element: 10x slower in HuBERT.
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
    r = t * _exp_nonpos(p - a * a)  # erfc(|z|); the exponent is <= 0 up to rounding
    half_x = _F32(0.5) * v
    # z >= 0 (x <= 0): erfc(z) = r; z < 0: erfc(z) = 2 - r
    return half_x * r if z >= 0 else v - half_x * r


# --- all-finite check of loaded weights ------------------------------------------------------

_EXP_MASK = np.uint32(0x7F800000)  # a float32 is NaN or inf exactly when these bits are all set
_FINITE_BLOCK = 1 << 16  # elements between early-exit tests


@nb.njit(cache=True, error_model="numpy")
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
