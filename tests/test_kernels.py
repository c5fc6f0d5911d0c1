"""Kernel twins agree (Numba vs plain-array), and the GEMM convolutions match direct formulas."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore import kernels as K

SETTINGS = settings(max_examples=25, deadline=None)


def _rng(seed):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------------------------
# Direct (slow, float64) definitions of what torch computes
# --------------------------------------------------------------------------------------------


def conv1d_direct(x, w, b, stride=1, dilation=1, padding=0, groups=1):
    """x [B, T, Cin], torch weight w [Cout, Cin/groups, K] -> [B, To, Cout], float64."""
    x = np.pad(x.astype(np.float64), ((0, 0), (padding, padding), (0, 0)))
    bsz, t, cin = x.shape
    cout, cg, k = w.shape
    t_out = (t - dilation * (k - 1) - 1) // stride + 1
    y = np.zeros((bsz, t_out, cout))
    og = cout // groups
    for o in range(cout):
        g = o // og
        for kk in range(k):
            rows = x[:, kk * dilation: kk * dilation + stride * (t_out - 1) + 1: stride, g * cg:(g + 1) * cg]
            y[:, :, o] += rows @ w[o, :, kk].astype(np.float64)
    if b is not None:
        y += b
    return y


def conv_transpose1d_direct(x, w, b, stride, padding, output_padding):
    """x [B, T, Cin], torch weight [Cin, Cout, K] -> [B, To, Cout], float64, by definition."""
    bsz, t, cin = x.shape
    _, cout, k = w.shape
    full = np.zeros((bsz, (t - 1) * stride + k + output_padding, cout))
    for i in range(t):
        for kk in range(k):
            full[:, i * stride + kk] += x[:, i].astype(np.float64) @ w[:, :, kk]
    t_out = (t - 1) * stride - 2 * padding + k + output_padding
    y = full[:, padding:padding + t_out]
    return y + b if b is not None else y


def rel_err(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


# --------------------------------------------------------------------------------------------
# Twins
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(n=st.integers(1, 300), c=st.integers(1, 40), scale=st.sampled_from([0.1, 3.0, 300.0]), seed=st.integers(0, 99))
def test_snake_twins_agree(n, c, scale, seed):
    rng = _rng(seed)
    x = (scale * rng.standard_normal((n, c))).astype(np.float32)
    alpha = (0.05 + 2 * rng.random(c)).astype(np.float32)
    inv = (1 / (alpha + np.float32(1e-9))).astype(np.float32)
    ref = x.astype(np.float64) + inv * np.sin((alpha * x).astype(np.float64)) ** 2  # alpha*x rounded first
    for y in (K.snake(x, alpha, inv), K.snake_np(x, alpha, inv), K._snake_nb(x, alpha, inv),
              K._snake_nb_par(x, alpha, inv)):
        assert y.dtype == np.float32 and y.shape == x.shape
        # the only rounding left is float32 output: within a few ulp of the largest term
        assert np.abs(y - ref).max() <= 4e-7 * max(np.abs(ref).max(), 1.0)


def test_snake_keeps_leading_shape_and_nonfinite():
    x = np.array([[[0.0, np.nan], [np.inf, 1.0]]], np.float32)  # [1, 2, 2]
    a = np.ones(2, np.float32)
    y = K.snake(x, a, a)
    assert y.shape == x.shape and y[0, 0, 0] == 0 and np.isnan(y[0, 0, 1]) and not np.isfinite(y[0, 1, 0])


@SETTINGS
@given(n=st.integers(1, 5000), scale=st.sampled_from([0.5, 3.0, 20.0]), seed=st.integers(0, 99))
def test_gelu_twins_agree(n, scale, seed):
    x = (scale * _rng(seed).standard_normal(n)).astype(np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    for y in (K.gelu(x), K.gelu_np(x), K._gelu_nb(x), K._gelu_nb_par(x)):
        assert y.dtype == np.float32
        # absolute error against the exact erf form stays at float32 rounding of |x|
        assert np.all(np.abs(y - exact) <= 2e-7 * np.maximum(np.abs(x), 1e-3) + 1e-12)


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 200), groups=st.sampled_from([1, 2, 4]),
       cg=st.integers(1, 6), offset=st.sampled_from([0.0, 50.0]), seed=st.integers(0, 99))
def test_group_norm_twins_agree(b, t, groups, cg, offset, seed):
    rng = _rng(seed)
    c = groups * cg
    x = (offset + rng.standard_normal((b, t, c))).astype(np.float32)
    w, bias = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    g = x.astype(np.float64).reshape(b, t, groups, cg)
    mean = g.mean(axis=(1, 3), keepdims=True)
    var = g.var(axis=(1, 3), keepdims=True)
    ref = ((g - mean) / np.sqrt(var + 1e-5)).reshape(b, t, c) * w + bias
    for y in (K.group_norm(x, groups, w, bias, 1e-5), K.group_norm_np(x, groups, w, bias, 1e-5)):
        assert y.dtype == np.float32 and y.shape == x.shape
        assert np.abs(y - ref).max() <= 1e-5 * max(np.abs(ref).max(), 1.0)


def test_group_norm_of_constant_channel_is_finite():
    x = np.full((1, 50, 3), 0.25, np.float32)  # zero variance: normalised to 0, then bias
    y = K.group_norm(x, 3, np.ones(3, np.float32), np.arange(3, dtype=np.float32))
    assert np.allclose(y, np.arange(3)[None, None], atol=1e-6)


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 40), stride=st.integers(1, 8), kmul=st.sampled_from([1, 2, 3]),
       c=st.integers(1, 5), seed=st.integers(0, 99))
def test_overlap_add_twins_agree(b, t, stride, kmul, c, seed):
    k = kmul * stride
    cols = _rng(seed).standard_normal((b, t, k, c)).astype(np.float32)
    full = (t - 1) * stride + k
    ref = np.zeros((b, full + 2, c))
    for i in range(t):
        ref[:, i * stride:i * stride + k] += cols[:, i]
    for start, length in ((0, full), (min(2, full - 1), full - min(2, full - 1)), (1, full + 1)):
        want = ref[:, start:start + length]
        for y in (K.overlap_add(cols, stride, start, length), K.overlap_add_np(cols, stride, start, length),
                  K._overlap_add_nb(cols, stride, start, length), K._overlap_add_nb_par(cols, stride, start, length)):
            assert y.shape == (b, length, c)
            assert np.abs(y - want).max() <= 1e-5


def test_parallel_threshold_paths_both_used():
    # the public functions pick the serial kernel for small inputs and the parallel one above the
    # threshold; both must give the same numbers
    rng = _rng(0)
    big = rng.standard_normal((K._PARALLEL_MIN // 8 + 1, 8)).astype(np.float32)
    a = np.full(8, 0.7, np.float32)
    assert np.array_equal(K.snake(big, a, 1 / a), K._snake_nb(big, a, 1 / a))
    assert np.array_equal(K.gelu(big), K._gelu_nb(big.reshape(-1)).reshape(big.shape))


# --------------------------------------------------------------------------------------------
# GEMM convolutions vs the definitions
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 60), cin=st.integers(1, 9), cout=st.integers(1, 7),
       k=st.integers(1, 10), stride=st.integers(1, 5), dilation=st.integers(1, 4), padding=st.integers(0, 6),
       bias=st.booleans(), seed=st.integers(0, 99))
def test_conv1d_matches_definition(b, t, cin, cout, k, stride, dilation, padding, bias, seed):
    rng = _rng(seed)
    if t + 2 * padding < dilation * (k - 1) + 1:
        t = dilation * (k - 1) + 1  # keep at least one output step
    x = rng.standard_normal((b, t, cin)).astype(np.float32)
    w = rng.standard_normal((cout, cin, k)).astype(np.float32)
    bb = rng.standard_normal(cout).astype(np.float32) if bias else None
    y = K.conv1d(x, K.conv_weight(w), bb, stride=stride, dilation=dilation, padding=padding)
    ref = conv1d_direct(x, w, bb, stride, dilation, padding)
    assert y.shape == ref.shape == (b, K.conv_out_len(t, k, stride, dilation, padding), cout)
    assert y.dtype == np.float32
    assert rel_err(y, ref) <= 1e-5


def test_conv1d_too_short_input_is_an_error():
    with pytest.raises(ValueError):
        K.conv1d(np.zeros((1, 3, 2), np.float32), np.zeros((7, 2, 2), np.float32))


@SETTINGS
@given(t=st.integers(1, 40), groups=st.sampled_from([1, 2, 4]), cg=st.integers(1, 5),
       k=st.integers(1, 12), seed=st.integers(0, 99))
def test_grouped_conv1d_matches_definition(t, groups, cg, k, seed):
    rng = _rng(seed)
    c = groups * cg
    x = rng.standard_normal((1, t, c)).astype(np.float32)
    w = rng.standard_normal((c, cg, k)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    y = K.grouped_conv1d(x, K.grouped_conv_weight(w, groups), bias, padding=k // 2)
    ref = conv1d_direct(x, w, bias, padding=k // 2, groups=groups)
    assert y.shape == ref.shape
    assert rel_err(y, ref) <= 1e-5


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 30), cin=st.integers(1, 8), cout=st.integers(1, 6),
       stride=st.integers(1, 8), seed=st.integers(0, 99))
def test_conv_transpose1d_matches_definition(b, t, cin, cout, stride, seed):
    # the DAC decoder's shape rule: kernel 2s, padding ceil(s/2), output padding s % 2 -> T*s steps
    rng = _rng(seed)
    k, pad, opad = 2 * stride, math.ceil(stride / 2), stride % 2
    x = rng.standard_normal((b, t, cin)).astype(np.float32)
    w = rng.standard_normal((cin, cout, k)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    y = K.conv_transpose1d(x, K.conv_transpose_weight(w), bias, kernel_size=k, stride=stride,
                           padding=pad, output_padding=opad)
    ref = conv_transpose1d_direct(x, w, bias, stride, pad, opad)
    assert y.shape == ref.shape == (b, t * stride, cout)
    assert rel_err(y, ref) <= 1e-5
