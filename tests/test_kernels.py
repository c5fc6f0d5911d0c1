"""The backbone's kernels: each Numba kernel, serial and parallel, agrees with its plain-array
twin and a float64 definition (the scoring kernels: test_scoring_kernels.py; the codec's:
test_conv_kernels.py; the shared machinery: test_jit.py)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.model import kernels as K

SETTINGS = settings(max_examples=25, deadline=None)


def _rng(seed):
    return np.random.default_rng(seed)


def rel_err(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


# --------------------------------------------------------------------------------------------
# Backbone kernels: every Numba kernel, serial and parallel,
# against its plain-array twin and a float64 definition
# --------------------------------------------------------------------------------------------

F32_TINY = np.finfo(np.float32).tiny


def _rms_f64(x, w, eps=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


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
