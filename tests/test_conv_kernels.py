"""The codec's kernel twins agree (Numba vs plain-array), and the GEMM convolutions match direct formulas."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.model import conv_kernels as CK
from omnicore.model import jit

from test_kernels import SETTINGS, _rng, rel_err  # the twin tests' shared settings and helpers


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


def _call(kernel, x, *args):
    """Run an element-wise kernel that writes into an output like x; return the output."""
    out = np.empty_like(x)
    kernel(x, *args, out)
    return out


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
    for y in (CK.snake(x, alpha, inv), CK.snake_np(x, alpha, inv), _call(CK._snake_nb, x, alpha, inv),
              _call(CK._snake_nb_par, x, alpha, inv)):
        assert y.dtype == np.float32 and y.shape == x.shape
        # the only rounding left is float32 output: within a few ulp of the largest term
        assert np.abs(y - ref).max() <= 4e-7 * max(np.abs(ref).max(), 1.0)


def test_snake_keeps_leading_shape_and_nonfinite():
    x = np.array([[[0.0, np.nan], [np.inf, 1.0]]], np.float32)  # [1, 2, 2]
    a = np.ones(2, np.float32)
    y = CK.snake(x, a, a)
    assert y.shape == x.shape and y[0, 0, 0] == 0 and np.isnan(y[0, 0, 1]) and not np.isfinite(y[0, 1, 0])


@SETTINGS
@given(n=st.integers(1, 5000), scale=st.sampled_from([0.5, 3.0, 20.0]), seed=st.integers(0, 99))
def test_gelu_twins_agree(n, scale, seed):
    x = (scale * _rng(seed).standard_normal(n)).astype(np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    # absolute error against the exact erf form stays at float32 rounding of |x|; the twin
    # runs the same float32 formula as separate array operations, each rounded (the kernel
    # contracts multiply-adds into FMAs): measured <= 2.4e-7 |x| against 2e-7 |x|
    for y, tol in ((CK.gelu(x), 2e-7), (CK.gelu_np(x), 4e-7), (_call(CK._gelu_nb, x), 2e-7), (_call(CK._gelu_nb_par, x), 2e-7)):
        assert y.dtype == np.float32
        assert np.all(np.abs(y - exact) <= tol * np.maximum(np.abs(x), 1e-3) + 1e-12)


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
    for y in (CK.group_norm(x, groups, w, bias, 1e-5), CK.group_norm_np(x, groups, w, bias, 1e-5)):
        assert y.dtype == np.float32 and y.shape == x.shape
        assert np.abs(y - ref).max() <= 1e-5 * max(np.abs(ref).max(), 1.0)


@pytest.mark.parametrize("b, t, groups, cg", [(1, 3, 2, 1), (1, 1, 1, 2), (2, 200, 4, 6), (1, 50000, 2, 3)])
def test_group_norm_small_spread_far_from_zero(b, t, groups, cg):
    """A mean of 50 with a spread of about 1: rounding the mean to float32 alone (half an ulp,
    1.9e-6) would be magnified by 1 / spread (measured 6.9e-5 before the kernel kept the
    rounding error of its mean); long clips: the twin's float32 sums stay accurate."""
    rng = _rng(t)
    c = groups * cg
    x = (50.0 + rng.standard_normal((b, t, c))).astype(np.float32)
    w, bias = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    g = x.astype(np.float64).reshape(b, t, groups, cg)
    mean, var = g.mean(axis=(1, 3), keepdims=True), g.var(axis=(1, 3), keepdims=True)
    ref = ((g - mean) / np.sqrt(var + 1e-5)).reshape(b, t, c) * w + bias
    for y in (CK.group_norm(x, groups, w, bias, 1e-5), CK.group_norm_np(x, groups, w, bias, 1e-5)):
        assert np.abs(y - ref).max() <= 1e-6 * max(np.abs(ref).max(), 1.0)  # measured <= 1.8e-7


def test_group_norm_of_constant_channel_is_finite():
    x = np.full((1, 50, 3), 0.25, np.float32)  # zero variance: normalised to 0, then bias
    y = CK.group_norm(x, 3, np.ones(3, np.float32), np.arange(3, dtype=np.float32))
    assert np.allclose(y, np.arange(3)[None, None], atol=1e-6)


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 40), stride=st.integers(1, 6), k=st.integers(1, 13),
       cin=st.integers(1, 5), cout=st.integers(1, 4), data=st.data())
def test_polyphase_conv_transpose_any_shape(b, t, stride, k, cin, cout, data):
    """The polyphase transposed conv for kernels that are not 2*stride, any padding and output
    padding torch allows, in one chunk and in chunks of 2 rows, against the definition."""
    pad = data.draw(st.integers(0, k - 1))
    opad = data.draw(st.integers(0, stride - 1))
    if (t - 1) * stride - 2 * pad + k + opad <= 0:
        return
    rng = _rng(data.draw(st.integers(0, 99)))
    x = rng.standard_normal((b, t, cin)).astype(np.float32)
    w = rng.standard_normal((cin, cout, k)).astype(np.float32)
    ref = conv_transpose1d_direct(x, w, None, stride, pad, opad)
    wp = CK.conv_transpose_weight(w, stride)
    old = CK._TRANSPOSE_CHUNK_BYTES
    try:
        for chunk in (old, 4 * wp.shape[0] * 2):
            CK._TRANSPOSE_CHUNK_BYTES = chunk
            for fn in (CK.conv_transpose1d, CK.conv_transpose1d_np):
                y = fn(x, wp, None, kernel_size=k, stride=stride, padding=pad, output_padding=opad)
                assert y.shape == ref.shape
                assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    finally:
        CK._TRANSPOSE_CHUNK_BYTES = old


def test_l2_size_from_sysfs_layout(tmp_path):
    # the residual units' chunk follows the L2 size: parse sysfs's layout, skip L1/L3 entries
    for i, (level, kind, size) in enumerate([("1", "Data", "32K"), ("1", "Instruction", "32K"),
                                             ("2", "Unified", "512K"), ("3", "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size + "\n")):
            (d / name).write_text(text)
    assert CK._l2_bytes(str(tmp_path)) == 512 << 10
    assert CK._cache_size_bytes("2M") == 2 << 20 and CK._cache_size_bytes("1048576") == 1 << 20
    assert CK._l2_bytes(str(tmp_path / "missing")) > 0  # glibc's answer, or the 1 MiB default
    assert 1 << 20 <= CK._res_unit_chunk_bytes() <= 8 << 20


def test_parallel_threshold_paths_both_used(monkeypatch):
    # with parallel kernels on (OMNICORE_PARALLEL_KERNELS=1) the public functions pick the serial
    # kernel for small inputs and the parallel one above the threshold; both give the same numbers
    rng = _rng(0)
    big = rng.standard_normal((jit.PARALLEL_MIN // 8 + 1, 8)).astype(np.float32)
    a = np.full(8, 0.7, np.float32)
    assert jit.serial_or_parallel(CK._snake_nb, CK._snake_nb_par, big.size) is CK._snake_nb  # off by default
    monkeypatch.setattr(jit, "PARALLEL_KERNELS", True)
    assert jit.serial_or_parallel(CK._snake_nb, CK._snake_nb_par, big.size).__wrapped__ is CK._snake_nb_par  # under a lock
    assert jit.serial_or_parallel(CK._snake_nb, CK._snake_nb_par, 8) is CK._snake_nb
    assert np.array_equal(CK.snake(big, a, 1 / a), _call(CK._snake_nb, big, a, 1 / a))
    assert np.array_equal(CK.gelu(big), _call(CK._gelu_nb, big.reshape(-1)).reshape(big.shape))


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
    y = CK.conv1d(x, CK.conv_weight(w), bb, stride=stride, dilation=dilation, padding=padding)
    ref = conv1d_direct(x, w, bb, stride, dilation, padding)
    assert y.shape == ref.shape == (b, CK.conv_out_len(t, k, stride, dilation, padding), cout)
    assert y.dtype == np.float32
    assert rel_err(y, ref) <= 1e-5


def test_conv1d_too_short_input_is_an_error():
    with pytest.raises(ValueError):
        CK.conv1d(np.zeros((1, 3, 2), np.float32), np.zeros((7, 2, 2), np.float32))


@SETTINGS
@given(t=st.integers(1, 40), groups=st.sampled_from([1, 2, 4]), cg=st.integers(1, 5),
       k=st.integers(1, 12), seed=st.integers(0, 99))
def test_grouped_conv1d_matches_definition(t, groups, cg, k, seed):
    rng = _rng(seed)
    c = groups * cg
    x = rng.standard_normal((1, t, c)).astype(np.float32)
    w = rng.standard_normal((c, cg, k)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    y = CK.grouped_conv1d(x, CK.grouped_conv_weight(w, groups), bias, padding=k // 2)
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
    ref = conv_transpose1d_direct(x, w, bias, stride, pad, opad)
    old = CK._TRANSPOSE_CHUNK_BYTES
    try:
        for chunk in (old, 4 * 2 * cin * 3):  # one chunk, and chunks of 3 rows
            CK._TRANSPOSE_CHUNK_BYTES = chunk
            for y in (CK.conv_transpose1d(x, CK.conv_transpose_weight(w, stride), bias, kernel_size=k,
                                         stride=stride, padding=pad, output_padding=opad),
                      CK.conv_transpose1d_np(x, CK.conv_transpose_weight(w, stride), bias, kernel_size=k,
                                            stride=stride, padding=pad, output_padding=opad)):
                assert y.shape == ref.shape == (b, t * stride, cout)
                assert rel_err(y, ref) <= 1e-5
    finally:
        CK._TRANSPOSE_CHUNK_BYTES = old


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 90), c=st.sampled_from([1, 3, 16, 40]),
       dilation=st.sampled_from([1, 3, 9]), chunk_rows=st.sampled_from([1, 5, 64, 1000]),
       seed=st.integers(0, 99))
@pytest.mark.slow
def test_dac_res_unit_chunked_matches_plain(b, t, c, dilation, chunk_rows, seed):
    rng = _rng(seed)
    x = rng.standard_normal((b, t, c)).astype(np.float32)
    w7 = (rng.standard_normal((7, c, c)) / np.sqrt(7 * c)).astype(np.float32)
    w1 = (rng.standard_normal((1, c, c)) / np.sqrt(c)).astype(np.float32)
    b7, b1 = (0.1 * rng.standard_normal((2, c))).astype(np.float32)
    a1, a2 = rng.uniform(0.5, 1.5, (2, c)).astype(np.float32)
    args = (a1, (1 / a1).astype(np.float32), w7, b7, dilation, a2, (1 / a2).astype(np.float32), w1, b1)
    want = CK.dac_res_unit_np(x, *args)
    old = CK._RES_UNIT_CHUNK_BYTES, jit.PARALLEL_KERNELS, jit.PARALLEL_MIN
    try:  # chunks of `chunk_rows` rows (many chunks, chunks shorter than the padding); both kernels
        CK._RES_UNIT_CHUNK_BYTES = 4 * 7 * c * chunk_rows
        jit.PARALLEL_MIN = 1
        for parallel in (False, True):
            jit.PARALLEL_KERNELS = parallel
            got = CK.dac_res_unit(x, *args)
            assert got.shape == x.shape and got.dtype == np.float32
            assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()
    finally:
        CK._RES_UNIT_CHUNK_BYTES, jit.PARALLEL_KERNELS, jit.PARALLEL_MIN = old


@settings(max_examples=10, deadline=None)
@given(c=st.sampled_from([4, 8, 32, 64]), a=st.integers(0, 400), length=st.integers(60, 3000),
       seed=st.integers(0, 99))
def test_dac_res_unit_rows_depend_on_the_window_only_by_rounding(c, a, length, seed):
    """A window of the input gives the same rows away from its edges, up to float32 rounding
    (streaming decode relies on it). Not bit for bit: some BLAS kernels (OpenBLAS's Haswell
    sgemm) round a row differently with its position in the GEMM, even at equal GEMM shapes.
    Measured max|diff| / max|rows| <= 3.7e-7 (Haswell), 2.4e-7 (Katmai), 0 (Sandybridge,
    Nehalem); rows one step off differ by O(1)."""
    rng = _rng(seed)
    x = rng.standard_normal((1, 3500, c)).astype(np.float32)
    w7 = (rng.standard_normal((7, c, c)) / np.sqrt(7 * c)).astype(np.float32)
    w1 = (rng.standard_normal((1, c, c)) / np.sqrt(c)).astype(np.float32)
    b7, b1 = (0.1 * rng.standard_normal((2, c))).astype(np.float32)
    al = rng.uniform(0.5, 1.5, c).astype(np.float32)
    args = (al, (1 / al).astype(np.float32), w7, b7, 9, al, (1 / al).astype(np.float32), w1, b1)
    pad = 27
    full = CK.dac_res_unit(x, *args)
    part = CK.dac_res_unit(x[:, a:a + length], *args)
    assert rel_err(part[:, pad:length - pad], full[:, a + pad:a + length - pad]) <= 2e-6
    assert rel_err(part[:, pad:length - pad], full[:, a + pad + 1:a + length - pad + 1]) > 0.1
