"""Kernel twins agree (Numba vs plain-array), and the GEMM convolutions match direct formulas."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.model import kernels as K

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


def _call(kernel, x, *args):
    """Run an element-wise kernel that writes into an output like x; return the output."""
    out = np.empty_like(x)
    kernel(x, *args, out)
    return out


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
    for y in (K.snake(x, alpha, inv), K.snake_np(x, alpha, inv), _call(K._snake_nb, x, alpha, inv),
              _call(K._snake_nb_par, x, alpha, inv)):
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
    # absolute error against the exact erf form stays at float32 rounding of |x|; the twin
    # runs the same float32 formula as separate array operations, each rounded (the kernel
    # contracts multiply-adds into FMAs): measured <= 2.4e-7 |x| against 2e-7 |x|
    for y, tol in ((K.gelu(x), 2e-7), (K.gelu_np(x), 4e-7), (_call(K._gelu_nb, x), 2e-7), (_call(K._gelu_nb_par, x), 2e-7)):
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
    for y in (K.group_norm(x, groups, w, bias, 1e-5), K.group_norm_np(x, groups, w, bias, 1e-5)):
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
    for y in (K.group_norm(x, groups, w, bias, 1e-5), K.group_norm_np(x, groups, w, bias, 1e-5)):
        assert np.abs(y - ref).max() <= 1e-6 * max(np.abs(ref).max(), 1.0)  # measured <= 1.8e-7


def test_group_norm_of_constant_channel_is_finite():
    x = np.full((1, 50, 3), 0.25, np.float32)  # zero variance: normalised to 0, then bias
    y = K.group_norm(x, 3, np.ones(3, np.float32), np.arange(3, dtype=np.float32))
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
    wp = K.conv_transpose_weight(w, stride)
    old = K._TRANSPOSE_CHUNK_BYTES
    try:
        for chunk in (old, 4 * wp.shape[0] * 2):
            K._TRANSPOSE_CHUNK_BYTES = chunk
            for fn in (K.conv_transpose1d, K.conv_transpose1d_np):
                y = fn(x, wp, None, kernel_size=k, stride=stride, padding=pad, output_padding=opad)
                assert y.shape == ref.shape
                assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    finally:
        K._TRANSPOSE_CHUNK_BYTES = old


def test_l2_size_from_sysfs_layout(tmp_path):
    # the residual units' chunk follows the L2 size: parse sysfs's layout, skip L1/L3 entries
    for i, (level, kind, size) in enumerate([("1", "Data", "32K"), ("1", "Instruction", "32K"),
                                             ("2", "Unified", "512K"), ("3", "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size + "\n")):
            (d / name).write_text(text)
    assert K._l2_bytes(str(tmp_path)) == 512 << 10
    assert K._cache_size_bytes("2M") == 2 << 20 and K._cache_size_bytes("1048576") == 1 << 20
    assert K._l2_bytes(str(tmp_path / "missing")) > 0  # glibc's answer, or the 1 MiB default
    assert 1 << 20 <= K._RES_UNIT_CHUNK_BYTES <= 8 << 20


def test_parallel_threshold_paths_both_used(monkeypatch):
    # with parallel kernels on (OMNICORE_PARALLEL_KERNELS=1) the public functions pick the serial
    # kernel for small inputs and the parallel one above the threshold; both give the same numbers
    rng = _rng(0)
    big = rng.standard_normal((K._PARALLEL_MIN // 8 + 1, 8)).astype(np.float32)
    a = np.full(8, 0.7, np.float32)
    assert K._pick(K._snake_nb, K._snake_nb_par, big.size) is K._snake_nb  # off by default
    monkeypatch.setattr(K, "PARALLEL_KERNELS", True)
    assert K._pick(K._snake_nb, K._snake_nb_par, big.size).__wrapped__ is K._snake_nb_par  # under a lock
    assert K._pick(K._snake_nb, K._snake_nb_par, 8) is K._snake_nb
    assert np.array_equal(K.snake(big, a, 1 / a), _call(K._snake_nb, big, a, 1 / a))
    assert np.array_equal(K.gelu(big), _call(K._gelu_nb, big.reshape(-1)).reshape(big.shape))


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
    ref = conv_transpose1d_direct(x, w, bias, stride, pad, opad)
    old = K._TRANSPOSE_CHUNK_BYTES
    try:
        for chunk in (old, 4 * 2 * cin * 3):  # one chunk, and chunks of 3 rows
            K._TRANSPOSE_CHUNK_BYTES = chunk
            for y in (K.conv_transpose1d(x, K.conv_transpose_weight(w, stride), bias, kernel_size=k,
                                         stride=stride, padding=pad, output_padding=opad),
                      K.conv_transpose1d_np(x, K.conv_transpose_weight(w, stride), bias, kernel_size=k,
                                            stride=stride, padding=pad, output_padding=opad)):
                assert y.shape == ref.shape == (b, t * stride, cout)
                assert rel_err(y, ref) <= 1e-5
    finally:
        K._TRANSPOSE_CHUNK_BYTES = old


# --------------------------------------------------------------------------------------------
# Backbone and scoring kernels: every Numba kernel, serial and parallel,
# against its plain-array twin and a float64 definition
# --------------------------------------------------------------------------------------------

F32_TINY = np.finfo(np.float32).tiny


def _rms_f64(x, w, eps=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def test_exp_polynomial_within_one_ulp_and_flushes_subnormals():
    x = np.concatenate([-np.geomspace(1e-8, 110, 20000), [0.0, -87.3, -87.34, -103.0, -np.inf]]).astype(np.float32)
    got = np.array([K._exp_nonpos(v) for v in x], np.float32)
    want = np.exp(x.astype(np.float64))
    normal = want >= F32_TINY
    assert np.all(np.abs(got[normal] - want[normal]) <= 1.5 * np.spacing(want[normal].astype(np.float32)))
    # where the exact result is subnormal the kernel gives 0 (never a subnormal)
    assert np.all((got[~normal] == 0) | (got[~normal] >= F32_TINY))
    assert got[x == -np.inf][0] == 0 and got[x == 0][0] == 1


def test_parallel_twins_have_their_own_cache_entries():
    # Numba caches by function name: the parallel twin must be a separately named function
    for ser, par in ((K._softmax_nb, K._softmax_nb_par), (K._snake_nb, K._snake_nb_par)):
        assert par.py_func.__qualname__ == ser.py_func.__qualname__ + "_par"
        assert par.targetoptions.get("parallel") and not ser.targetoptions.get("parallel")


@SETTINGS
@given(n=st.integers(1, 70), d=st.sampled_from([1, 7, 16, 64, 1024]), scale=st.sampled_from([1e-3, 1.0, 1e3]),
       seed=st.integers(0, 99))
def test_rms_norm_twins_agree(n, d, scale, seed):
    rng = _rng(seed)
    x = (scale * rng.standard_normal((n, d))).astype(np.float32)
    w = rng.uniform(0.5, 1.5, d).astype(np.float32)
    want = _rms_f64(x, w)
    outs = [K.rms_norm(x, w, 1e-6), K.rms_norm_np(x, w, 1e-6)]
    for kern in (K._rms_norm_nb, K._rms_norm_nb_par):
        out = np.empty_like(x)
        kern(x, w, np.float32(1e-6), out)
        outs.append(out)
    for y in outs:
        assert y.dtype == np.float32 and rel_err(y, want) <= 1e-6


@SETTINGS
@given(n=st.integers(1, 70), d=st.sampled_from([8, 64, 1024]), seed=st.integers(0, 99))
def test_add_rms_norm_twins_agree(n, d, seed):
    rng = _rng(seed)
    x0 = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, d).astype(np.float32)
    want_x = x0.astype(np.float64) + y
    for fn in (K.add_rms_norm, K.add_rms_norm_np,
               lambda *a: K._add_rms_norm_nb(*a[:3], np.float32(a[3]), a[4]),
               lambda *a: K._add_rms_norm_nb_par(*a[:3], np.float32(a[3]), a[4])):
        x, out = x0.copy(), np.empty_like(x0)
        fn(x, y, w, 1e-6, out)
        assert rel_err(x, want_x) <= 1e-7
        assert rel_err(out, _rms_f64(want_x, w)) <= 1e-6


@SETTINGS
@given(n=st.integers(1, 40), kv=st.sampled_from([1, 2, 8]), group=st.sampled_from([1, 2, 4]),
       e=st.sampled_from([2, 16, 128]), seed=st.integers(0, 99))
def test_qk_norm_rope_twins_agree(n, kv, group, e, seed):
    rng = _rng(seed)
    h = kv * group
    q = rng.standard_normal((n, h * e)).astype(np.float32)
    k0 = rng.standard_normal((n, kv * e)).astype(np.float32)
    qw, kw = rng.uniform(2, 4, e).astype(np.float32), rng.uniform(2, 4, e).astype(np.float32)
    ang = np.arange(n)[:, None] * rng.uniform(0, 1, e // 2)[None]
    ang = np.concatenate([ang, ang], 1)  # half-split tables
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def rope(x):  # float64 definition: x [n, heads, e]
        half = e // 2
        return x * cos[:, None] + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin[:, None]

    want_q = rope(_rms_f64(q.reshape(n, h, e), qw))  # [n, H, E]
    want_q = want_q.reshape(n, kv, group * e).transpose(1, 0, 2)  # -> [K, n, G*E]
    want_k = rope(_rms_f64(k0.reshape(n, kv, e), kw)).reshape(n, kv * e)
    for fn in (K.qk_norm_rope, K.qk_norm_rope_np,
               lambda *a: K._qk_norm_rope_nb(*a[:6], np.float32(a[6]), a[7]),
               lambda *a: K._qk_norm_rope_nb_par(*a[:6], np.float32(a[6]), a[7])):
        k, qg = k0.copy(), np.full((kv, n, group * e), np.nan, np.float32)
        fn(q, k, qw, kw, cos, sin, 1e-6, qg)
        assert np.abs(qg - want_q).max() <= 4e-6 * np.abs(want_q).max()
        assert np.abs(k - want_k).max() <= 4e-6 * np.abs(want_k).max()


@SETTINGS
@given(m=st.integers(1, 40), n=st.integers(1, 300), spread=st.sampled_from([1.0, 30.0, 1e4]),
       seed=st.integers(0, 99))
def test_softmax_twins_agree_and_never_emit_subnormals(m, n, spread, seed):
    s0 = (spread * _rng(seed).standard_normal((m, n))).astype(np.float32)
    scale = 0.0884
    z = s0.astype(np.float64) * np.float32(scale)
    want = np.exp(z - z.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    for fn in (K.softmax_rows, K.softmax_rows_np, lambda s, c: K._softmax_nb(s, np.float32(c)),
               lambda s, c: K._softmax_nb_par(s, np.float32(c))):
        s = s0.copy()
        fn(s, scale)
        # float32 rounding of the scaled scores moves each exponent by up to ~|z| ulp, the rest
        # is rounding relative to the row's largest probability (>= 1/n)
        zulp = 2 * np.finfo(np.float32).eps * np.abs(z).max(1, keepdims=True)
        assert np.all(np.abs(s - want) <= 2e-6 * want.max(1, keepdims=True) + zulp * want + F32_TINY)
    s = s0.copy()
    K.softmax_rows(s, scale)
    assert not np.any((s > 0) & (s < F32_TINY))  # subnormals would slow every later GEMM


@SETTINGS
@given(n=st.integers(1, 40), f=st.integers(1, 300), scale=st.sampled_from([1.0, 10.0, 200.0]),
       seed=st.integers(0, 99))
def test_swiglu_twins_agree(n, f, scale, seed):
    rng = _rng(seed)
    g0 = (scale * rng.standard_normal((n, f))).astype(np.float32)
    u = rng.standard_normal((n, f)).astype(np.float32)
    g64 = g0.astype(np.float64)
    with np.errstate(over="ignore"):  # exp(200) overflows to inf in float64 too: sigmoid 0
        want = g64 / (1 + np.exp(-g64)) * u
    for fn in (K.swiglu, K.swiglu_np, K._swiglu_nb, K._swiglu_nb_par):
        g = g0.copy()
        fn(g, u)
        assert np.all(np.isfinite(g))
        assert np.all(np.abs(g - want) <= 4e-7 * np.abs(g64 * u) + 1e-30)


@SETTINGS
@given(c=st.integers(1, 8), t=st.integers(1, 30), v=st.sampled_from([3, 17, 1025]),
       guidance=st.sampled_from([0.0, 2.0, 3.5]), with_uncond=st.booleans(),
       scale=st.sampled_from([1.0, 8.0, 60.0]), seed=st.integers(0, 99))
def test_guided_scores_twins_agree(c, t, v, guidance, with_uncond, scale, seed):
    rng = _rng(seed)
    # the kernel receives [C, T, V] views of the heads' [T, C, V] output, as the backbone gives them
    cond = (scale * rng.standard_normal((t, c, v))).astype(np.float32).transpose(1, 0, 2)
    uncond = (scale * rng.standard_normal((t, c, v))).astype(np.float32).transpose(1, 0, 2) if with_uncond else None
    mask = v - 1

    def lsm(x):
        return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))

    c64 = lsm(cond.astype(np.float64))
    want = lsm(c64 + guidance * (c64 - lsm(uncond.astype(np.float64)))) if with_uncond and guidance else c64
    want[..., mask] = -np.inf
    for fn in (K.guided_scores, K.guided_scores_np):
        lp, tokens, conf = fn(cond, uncond, guidance, mask)
        assert lp.shape == (c, t, v) and tokens.dtype == np.int64 and conf.dtype == np.float32
        assert np.isneginf(lp[..., mask]).all()
        err = np.abs(lp[..., :mask] - want[..., :mask]).max() if v > 1 else 0.0
        assert err <= 2e-6 * (1 + 2 * guidance) * max(1.0, np.abs(want[..., :mask]).max())
        np.testing.assert_array_equal(conf, lp.max(-1))
        np.testing.assert_array_equal(tokens, lp.argmax(-1))  # first index of the maximum


def test_guided_scores_ties_take_the_first_index():
    cond = np.zeros((2, 3, 9), np.float32)
    cond[:, :, [2, 5]] = 4.0  # two equal best tokens per cell
    for fn in (K.guided_scores, K.guided_scores_np):
        _, tokens, _ = fn(cond, cond.copy(), 2.0, 8)
        assert (tokens == 2).all()


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 90), c=st.sampled_from([1, 3, 16, 40]),
       dilation=st.sampled_from([1, 3, 9]), chunk_rows=st.sampled_from([1, 5, 64, 1000]),
       seed=st.integers(0, 99))
def test_dac_res_unit_chunked_matches_plain(b, t, c, dilation, chunk_rows, seed):
    rng = _rng(seed)
    x = rng.standard_normal((b, t, c)).astype(np.float32)
    w7 = (rng.standard_normal((7, c, c)) / np.sqrt(7 * c)).astype(np.float32)
    w1 = (rng.standard_normal((1, c, c)) / np.sqrt(c)).astype(np.float32)
    b7, b1 = (0.1 * rng.standard_normal((2, c))).astype(np.float32)
    a1, a2 = rng.uniform(0.5, 1.5, (2, c)).astype(np.float32)
    args = (a1, (1 / a1).astype(np.float32), w7, b7, dilation, a2, (1 / a2).astype(np.float32), w1, b1)
    want = K.dac_res_unit_np(x, *args)
    old = K._RES_UNIT_CHUNK_BYTES, K.PARALLEL_KERNELS, K._PARALLEL_MIN
    try:  # chunks of `chunk_rows` rows (many chunks, chunks shorter than the padding); both kernels
        K._RES_UNIT_CHUNK_BYTES = 4 * 7 * c * chunk_rows
        K._PARALLEL_MIN = 1
        for parallel in (False, True):
            K.PARALLEL_KERNELS = parallel
            got = K.dac_res_unit(x, *args)
            assert got.shape == x.shape and got.dtype == np.float32
            assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()
    finally:
        K._RES_UNIT_CHUNK_BYTES, K.PARALLEL_KERNELS, K._PARALLEL_MIN = old


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
    full = K.dac_res_unit(x, *args)
    part = K.dac_res_unit(x[:, a:a + length], *args)
    assert rel_err(part[:, pad:length - pad], full[:, a + pad:a + length - pad]) <= 2e-6
    assert rel_err(part[:, pad:length - pad], full[:, a + pad + 1:a + length - pad + 1]) > 0.1


def test_omnicore_num_threads_sizes_the_pools():
    import os
    import subprocess
    import sys

    code = ("from omnicore.model import kernels; import threading, numba; "
            "out = [numba.get_num_threads()]; "
            "t = threading.Thread(target=lambda: out.append(numba.get_num_threads())); t.start(); t.join(); "
            "print(numba.config.NUMBA_NUM_THREADS, *out)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMNICORE_NUM_THREADS="1", PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "1"]  # the pool, this thread and any other thread
    env["OMNICORE_NUM_THREADS"] = "two"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "OMNICORE_NUM_THREADS" in bad.stderr and "ConfigError" in bad.stderr


@SETTINGS
@given(m=st.integers(1, 40), n=st.integers(1, 200), seed=st.integers(0, 99))
def test_unnormalised_softmax_and_row_scaling_twins_agree(m, n, seed):
    s0 = (20 * _rng(seed).standard_normal((m, n))).astype(np.float32)
    want = s0.copy()
    K.softmax_rows_np(want, 0.1)
    for fn in (K.softmax_rows, K.softmax_rows_np,
               lambda s, c, inv: K._softmax_unnormalized_nb(s, np.float32(c), inv),
               lambda s, c, inv: K._softmax_unnormalized_nb_par(s, np.float32(c), inv)):
        s, inv = s0.copy(), np.empty(m, np.float32)
        fn(s, 0.1, inv)
        assert s.max(1).min() == 1.0  # exp(0) at each row's maximum: unnormalised
        assert np.abs(s * inv[:, None] - want).max() <= 2e-6


@SETTINGS
@given(length=st.integers(1, 30), kv=st.sampled_from([1, 2, 8]), group=st.sampled_from([1, 2, 4]),
       e=st.sampled_from([1, 8, 128]), seed=st.integers(0, 99))
def test_scale_heads_into_puts_heads_in_checkpoint_order(length, kv, group, e, seed):
    rng = _rng(seed)
    o = rng.standard_normal((kv, length * group, e)).astype(np.float32)
    inv = rng.uniform(0.1, 2, kv * length * group).astype(np.float32)
    want = np.empty((length, kv * group * e), np.float32)
    for k in range(kv):
        for g in range(group):
            h = k * group + g  # query head h reads kv head h // G
            rows = np.arange(length) * group + g
            want[:, h * e:(h + 1) * e] = o[k, rows] * inv[k * length * group + rows][:, None]
    for fn in (K.scale_heads_into, K.scale_heads_into_np, K._scale_heads_into_nb, K._scale_heads_into_nb_par):
        full = np.full((length + 3, kv * group * e), np.nan, np.float32)
        fn(o, inv, full[1:length + 1])
        np.testing.assert_allclose(full[1:length + 1], want, rtol=1e-6)
        assert np.isnan(full[0]).all() and np.isnan(full[length + 1:]).all()
