"""The backbone and scoring kernels: each Numba kernel, serial and parallel, agrees with its
plain-array twin and a float64 definition (the codec's kernels: test_conv_kernels.py; the shared
machinery: test_jit.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.model import kernels as K
from omnicore.model import scoring_kernels as SK
from omnicore.model.packed_unmasking import ScorePlan

SETTINGS = settings(max_examples=25, deadline=None)


def _rng(seed):
    return np.random.default_rng(seed)


def rel_err(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


# --------------------------------------------------------------------------------------------
# Backbone and scoring kernels: every Numba kernel, serial and parallel,
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
    for fn in (SK.guided_scores, SK.guided_scores_np):
        lp, tokens, conf = fn(cond, uncond, guidance, mask)
        assert lp.shape == (c, t, v) and tokens.dtype == np.int64 and conf.dtype == np.float32
        assert np.isneginf(lp[..., mask]).all()
        err = np.abs(lp[..., :mask] - want[..., :mask]).max() if v > 1 else 0.0
        assert err <= 2e-6 * (1 + 2 * guidance) * max(1.0, np.abs(want[..., :mask]).max())
        np.testing.assert_array_equal(conf, lp.max(-1))
        np.testing.assert_array_equal(tokens, lp.argmax(-1))  # first index of the maximum


@pytest.mark.parametrize("guidance", [0.0, 2.0])
def test_confidence_of_a_sure_cell_keeps_float32_relative_precision(guidance):
    """A near-certain cell's confidence, -log(1 + rest) with rest far below 1, to float32's
    relative precision: summing 1 + rest as one float32 would leave it only 6e-8 absolute, and
    near-tied confidences of two such cells are told apart below that."""
    rng = _rng(7)
    cond = (3 * rng.standard_normal((40, 8, 1025))).astype(np.float32)
    uncond = (3 * rng.standard_normal((40, 8, 1025))).astype(np.float32)
    best = rng.integers(0, 1024, size=(40, 8))
    lead = rng.uniform(12, 40, size=(40, 8, 1)) if guidance == 0 else rng.uniform(3, 14, size=(40, 8, 1))
    np.put_along_axis(cond, best[..., None], lead.astype(np.float32), -1)
    cond, uncond = cond.transpose(1, 0, 2), uncond.transpose(1, 0, 2)

    def lsm(x):  # float64, the sum of exp as 1 + the rest too (else float64 too keeps 1e-16)
        d = x - x.max(-1, keepdims=True)
        return d - np.log1p(np.where(d < 0, np.exp(d), 0).sum(-1, keepdims=True))

    c64 = lsm(cond.astype(np.float64))
    want = lsm(c64 + guidance * (c64 - lsm(uncond.astype(np.float64)))) if guidance else c64
    want = want[..., :1024].max(-1)
    assert want.max() < 0 and np.mean((want > -1e-3) & (want < -1e-10)) > 0.15  # many sure cells
    for fn in (SK.guided_scores, SK.guided_scores_np):
        _, _, conf = fn(cond, uncond if guidance else None, guidance, 1024)
        assert np.all(np.abs(conf - want) <= 1e-5 * np.abs(want))


def test_guided_scores_ties_take_the_first_index():
    cond = np.zeros((2, 3, 9), np.float32)
    cond[:, :, [2, 5]] = 4.0  # two equal best tokens per cell
    for fn in (SK.guided_scores, SK.guided_scores_np):
        _, tokens, _ = fn(cond, cond.copy(), 2.0, 8)
        assert (tokens == 2).all()


def _plan(rng, Ts, guided, guidance, penalty, temperature, C):
    """A ScorePlan of passes with target lengths Ts laid out as unmasking packs them: the
    conditional target rows first, then the unconditional ones; in the ids, every pass's
    conditional row (a prompt of 3 + b tokens, then its targets), then the unconditional rows."""
    B = len(Ts)
    cond_row = np.cumsum([0] + Ts[:-1])
    uncond_row, u = [], sum(Ts)
    for b in range(B):
        uncond_row.append(u if guided[b] else -1)
        u += Ts[b] if guided[b] else 0
    lengths = [3 + b + Ts[b] for b in range(B)] + [Ts[b] for b in range(B) if guided[b]]
    starts = np.cumsum([0] + lengths[:-1])
    cond_col = [starts[b] + lengths[b] - Ts[b] for b in range(B)]
    ucols, j = [], B
    for b in range(B):
        ucols.append(starts[j] if guided[b] else -1)
        j += guided[b]
    plan = ScorePlan(Ts, cond_row, uncond_row, cond_col, ucols, guidance, penalty, temperature,
                     C, np.asarray)
    return plan, u, sum(lengths)


@SETTINGS
@given(Ts=st.lists(st.integers(1, 12), min_size=1, max_size=5), v=st.sampled_from([3, 17, 1025]),
       data=st.data(), seed=st.integers(0, 99))
def test_packed_scores_twins_agree_with_scoring_each_pass(Ts, v, data, seed):
    rng, C = _rng(seed), 3
    B = len(Ts)
    guided = data.draw(st.lists(st.booleans(), min_size=B, max_size=B))
    guidance = [data.draw(st.sampled_from([0.0, 2.0, 3.5])) if g else 0.0 for g in guided]
    plan, n, _ = _plan(rng, Ts, guided, guidance, [5.0] * B, [0.0] * B, C)
    # the heads' [n, C, V] output, scored through its [C, n, V] view as the backbone returns it
    logits = (20 * rng.standard_normal((n, C, v))).astype(np.float32)
    outs = [fn(logits, plan, v - 1) for fn in (SK.packed_scores, SK.packed_scores_np)]
    kern = [SK._packed_scores_nb, SK._packed_scores_nb_par]
    h = plan.host
    for fn in kern:
        pred, conf = np.empty(plan.num_cells, np.int64), np.empty(plan.num_cells, np.float32)
        fn(logits, h["cond_row"], h["uncond_row"], h["T"], h["cell_off"], h["guidance"], v - 1, pred, conf)
        outs.append((pred, conf))
    view = logits.transpose(1, 0, 2)  # [C, n, V]
    for b, T in enumerate(Ts):
        r, u, off = h["cond_row"][b], h["uncond_row"][b], h["cell_off"][b]
        cells = slice(off, off + C * T)
        for fn, got in ((SK.guided_scores, outs[0]), (SK.guided_scores_np, outs[1]),
                        (SK.guided_scores, outs[2])):
            _, tokens, conf = fn(view[:, r:r + T], view[:, u:u + T] if u >= 0 else None,
                                 guidance[b], v - 1)
            # the same arithmetic per cell: bit for bit, whatever the other passes
            np.testing.assert_array_equal(got[0][cells], tokens.reshape(-1))
            np.testing.assert_array_equal(got[1][cells], conf.reshape(-1))
        # The parallel compile may contract c + g * (c - u) into an FMA where the serial one
        # does not (or the reverse): the same cells to a few float32 roundings of the logits.
        np.testing.assert_allclose(outs[3][1][cells], outs[2][1][cells], rtol=1e-4, atol=1e-5)


@SETTINGS
@given(Ts=st.lists(st.integers(1, 9), min_size=1, max_size=5), data=st.data(),
       seed=st.integers(0, 99))
def test_pick_fill_twins_agree_with_choosing_cells_pass_by_pass(Ts, data, seed):
    from omnicore.model import unmasking as um
    from omnicore.model.config import GenerationConfig

    rng, C, mask = _rng(seed), 3, 9
    B = len(Ts)
    guided = data.draw(st.lists(st.booleans(), min_size=B, max_size=B))
    temps = data.draw(st.lists(st.sampled_from([0.0, 5.0]), min_size=B, max_size=B))
    pens = data.draw(st.lists(st.sampled_from([0.0, 5.0]), min_size=B, max_size=B))
    plan, _, N = _plan(rng, Ts, guided, [2.0 if g else 0.0 for g in guided], pens, temps, C)
    cells = plan.num_cells
    # coarse confidences: ties across cells and codebooks happen
    conf = rng.integers(-6, 0, cells).astype(np.float32)
    pred = rng.integers(0, mask, cells).astype(np.int64)
    noise = rng.gumbel(size=cells).astype(np.float32)
    tokens0 = np.where(rng.random(cells) < 0.4, rng.integers(0, mask, cells), mask).astype(np.int64)
    fill0 = np.where(tokens0 != mask, 0, -1).astype(np.int64)
    off = plan.host["cell_off"]
    k = np.array([data.draw(st.integers(0, int((tokens0[off[b]:off[b + 1]] == mask).sum())))
                  for b in range(B)], np.int64)
    step = rng.integers(1, 5, B).astype(np.int64)
    ids0 = rng.integers(0, mask, (C, N)).astype(np.int64)
    for b, T in enumerate(Ts):  # the invariant: every row's targets are its pass's tokens
        for col in (plan.host["cond_col"][b], plan.host["uncond_col"][b]):
            if col >= 0:
                ids0[:, col:col + T] = tokens0[off[b]:off[b + 1]].reshape(C, T)
    got = []
    for fn in (SK.pick_fill, SK.pick_fill_np):
        tokens, fill, ids = tokens0.copy(), fill0.copy(), ids0.copy()
        fn(pred, conf, noise, k, step, plan, mask, tokens, fill, ids)
        got.append((tokens, fill, ids))
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)
    tokens, fill, ids = got[0]
    for b, T in enumerate(Ts):  # the one-pass definition
        sl = slice(off[b], off[b + 1])
        gen = GenerationConfig(layer_penalty_factor=pens[b], position_temperature=temps[b])
        chosen = um.choose_cells(conf[sl].reshape(C, T), tokens0[sl].reshape(C, T) != mask, int(k[b]),
                                 gen, noise[sl].reshape(C, T) if temps[b] else None)
        want = tokens0[sl].copy()
        want[chosen] = pred[sl][chosen]
        np.testing.assert_array_equal(tokens[sl], want)
        assert (fill[sl][chosen] == step[b]).all() and (fill[sl] == step[b]).sum() == k[b]
        col = plan.host["cond_col"][b]
        np.testing.assert_array_equal(want.reshape(C, T), ids[:, col:col + T])
        if guided[b]:
            uc = plan.host["uncond_col"][b]
            np.testing.assert_array_equal(ids[:, uc:uc + T], ids[:, col:col + T])


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


def test_packed_scores_twin_is_the_same_in_slices(monkeypatch):
    rng, C, v = _rng(3), 4, 33
    Ts = [5, 2, 7]
    plan, n, _ = _plan(rng, Ts, [True, False, True], [2.0, 0.0, 2.0], [5.0] * 3, [0.0] * 3, C)
    logits = (20 * rng.standard_normal((n, C, v))).astype(np.float32)
    whole = SK.packed_scores_np(logits, plan, v - 1)
    monkeypatch.setattr(SK, "TWIN_SLICE_CELLS", 1)  # slices of the longest pass's cells, 28
    sliced = SK.packed_scores_np(logits, plan, v - 1)
    for a, b in zip(whole, sliced):
        np.testing.assert_array_equal(a, b)
