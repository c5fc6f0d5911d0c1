"""The iterative unmasking loop, as written to be read (unmasking.py): cells per step bit-exact,
greedy tokens equal to the reference at every step, and the loop's invariants under sampling
(property tests on the tiny checkpoint). Its fast form: test_packed_unmasking.py."""

from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.model import backbone as bb
from omnicore.model import scoring_kernels
from omnicore.model import unmasking as um
from omnicore.model.config import GenerationConfig
from omnicore.errors import InputError
from omnicore.machinery.checkpoint import load_tokenizer
from omnicore.model.tokenizer import PreparedItem, prepare_item


def guided_log_probs(cond_logits, uncond_logits, guidance_scale: float, mask_id: int):
    """Per-cell log-probabilities after guidance, MASK excluded: [C, T, V] -> [C, T, V] (the
    scores the fused scoring kernel fills cells from)."""
    return scoring_kernels.guided_scores(cond_logits, uncond_logits, guidance_scale, mask_id)[0]

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "weights" / "tiny-random"
FIX = ROOT / "tests" / "fixtures" / "reference"
# Confidences are max log-probs after guidance, log_softmax(c + g (c - u)): the logits' float32
# error (about 1e-6 of their ~20 scale) is amplified (1 + 2g) times. Measured max over every
# step of every fixture case: 7.3e-5 (log-prob units).
SCORE_ATOL = 2e-4


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(CKPT)


def _load(name):
    with np.load(FIX / name, allow_pickle=False) as z:
        return dict(z)


def _cases():
    """(npz, item prefixes, generation-settings prefix) of every greedy run the reference dumped."""
    batch = _load("backbone_batch.npz")
    n = sum(k.endswith("_num_target") for k in batch)
    out = [("backbone_batch.npz", [f"item{b}_" for b in range(n)], "gen_")]
    for name in ("tags", "cjk", "noguide"):
        out.append(("backbone_single.npz", [f"{name}_item0_"], f"{name}_gen_"))
    return out


def _gen(d, prefix):
    kw = {k[len(prefix):]: d[k].item() for k in d if k.startswith(prefix)}
    return GenerationConfig(**kw)


def _items(d, prefixes):
    return [PreparedItem(d[p + "input_ids"], d[p + "audio_mask"], int(d[p + "num_target"]))
            for p in prefixes]


# ---------------------------------------------------------------------------------------------
# Schedule
# ---------------------------------------------------------------------------------------------


def test_time_grid_is_bit_exact():
    d = _load("backbone_schedule.npz")
    for a, shift in enumerate(d["shifts"]):
        for n in range(1, d["grids"].shape[1]):
            got = um.time_steps(n, float(shift))
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, d["grids"][a, n, : n + 1], err_msg=f"{n=} {shift=}")


def test_schedule_matches_reference():
    d = _load("backbone_schedule.npz")
    for cells, n, s, counts in zip(d["case_cells"], d["case_steps"], d["case_shift"], d["case_counts"]):
        got = um.cells_per_step(int(cells), int(n), float(s))
        assert got == counts[:n].tolist()
        assert sum(got) == cells and min(got) >= 0


# ---------------------------------------------------------------------------------------------
# Greedy decoding against the reference
# ---------------------------------------------------------------------------------------------


def test_generated_codes_are_diverse(params, cfg):
    """Random weights can collapse greedy codes to one value per row; then a token-exact test
    would prove nothing. The loop's own codes for the reference's first item vary along time
    and were filled over every step (the dump also re-ran the reference in float64 with
    identical codes)."""
    d = _load("backbone_batch.npz")
    assert bool(d["float64_agrees"])
    gen = _gen(d, "gen_")
    codes, fill = um.generate_codes(params, cfg, _items(d, ["item0_"]), gen, return_fill_steps=True)
    codes, fill = codes[0], fill[0]
    assert codes.shape[1] >= 60
    assert min(len(np.unique(row)) for row in codes) >= 10
    assert len(np.unique(codes)) >= 100
    # and cells were filled over many different steps, not all at once
    assert len(np.unique(fill)) == gen.num_step


@pytest.mark.parametrize("npz,prefixes,gen_prefix", _cases())
def test_greedy_predictions_match_reference_at_every_step(params, cfg, npz, prefixes, gen_prefix):
    """Replay each step from the reference's state: predicted tokens of every cell equal,
    confidences within SCORE_ATOL."""
    d = _load(npz)
    gen = _gen(d, gen_prefix)
    items = _items(d, prefixes)
    B, mask_id = len(items), cfg.audio_mask_id
    use_uncond = gen.guidance_scale != 0
    for step in range(gen.num_step):
        rows, num_out = [], []
        states = []
        for it, p in zip(items, prefixes):
            state = np.where(d[p + "fill_step"] < step, d[p + "codes"], mask_id)  # [C, T]
            states.append(state)
            rows.append(np.concatenate([it.input_ids[:, :it.num_prompt], state], axis=1))
        masks = [it.audio_mask for it in items]
        if use_uncond:
            rows += states
            masks += [it.uncond_audio_mask for it in items]
        num_out = [it.num_target for it in items] * (2 if use_uncond else 1)
        pack = bb.make_packing([r.shape[1] for r in rows], cfg)
        logits = bb.forward_rows(params, cfg, np.concatenate(rows, 1), np.concatenate(masks), pack, num_out)
        for b, p in enumerate(prefixes):
            _, tokens, conf = scoring_kernels.guided_scores(
                logits[b], logits[B + b] if use_uncond else None, gen.guidance_scale, mask_id)
            np.testing.assert_array_equal(tokens, d[p + "pred_tokens"][step], err_msg=f"{p} step {step}")
            want = d[p + "scores"][step]
            err = np.abs(conf - want).max()
            assert err <= SCORE_ATOL, f"{p} step {step}: confidence error {err:.2e}"


@pytest.mark.parametrize("npz,prefixes,gen_prefix", _cases())
def test_greedy_codes_and_fill_order_equal_reference(params, cfg, npz, prefixes, gen_prefix):
    d = _load(npz)
    gen = _gen(d, gen_prefix)
    codes, fill = um.generate_codes(params, cfg, _items(d, prefixes), gen, return_fill_steps=True)
    for p, c, f in zip(prefixes, codes, fill):
        assert c.dtype == np.int64
        np.testing.assert_array_equal(c, d[p + "codes"], err_msg=p)
        np.testing.assert_array_equal(f, d[p + "fill_step"], err_msg=p)


# ---------------------------------------------------------------------------------------------
# Sampling pieces
# ---------------------------------------------------------------------------------------------


def test_class_sampling_stays_in_the_top_ten_percent():
    rng = np.random.default_rng(0)
    lp = scoring_kernels.log_softmax_np(rng.standard_normal((8, 50, 1025)).astype(np.float32) * 3)
    lp[..., 1024] = -np.inf
    k = um.class_top_k(1025)
    tokens = um.sample_tokens(lp, 1.0, um.gumbel_noise(np.random.default_rng(1), (8, 50, k)))
    rank = (lp > np.take_along_axis(lp, tokens[..., None], -1)).sum(-1)
    assert rank.max() < 103 and (tokens != lp.argmax(-1)).any()
    cold = um.sample_tokens(lp, 1e-4, um.gumbel_noise(np.random.default_rng(2), (8, 50, k)))
    np.testing.assert_array_equal(cold, lp.argmax(-1))


def test_a_sampled_step_picks_cells_by_confidence_not_by_the_draw(cfg):
    """With class sampling, the cells a step fills are the most confident ones (best log-prob of
    the cell), whatever token the draw gave them."""
    C, T, V = cfg.num_audio_codebook, 6, cfg.audio_vocab_size
    ids = np.full((C, 3 + T), cfg.audio_mask_id, np.int64)
    item = PreparedItem(ids, np.arange(3 + T) >= 3, T)
    gen = GenerationConfig(num_step=4, guidance_scale=0.0, layer_penalty_factor=0.0,
                           position_temperature=0.0, class_temperature=2.0)
    state = um.PassState(item, gen, 5, cfg)
    logits = np.random.default_rng(3).standard_normal((C, T, V)).astype(np.float32)
    _, _, conf = scoring_kernels.guided_scores(logits, None, 0.0, cfg.audio_mask_id)
    um.unmask_step(state, logits)
    k = state.cells_per_step[0]
    filled = np.flatnonzero(state.fill_step.ravel() == 0)
    np.testing.assert_array_equal(np.sort(filled), np.sort(np.argsort(-conf.ravel(), kind="stable")[:k]))
    assert state.step == 1 and (state.codes().ravel()[filled] != cfg.audio_mask_id).all()


def test_guidance_zero_is_plain_log_softmax():
    rng = np.random.default_rng(0)
    c = rng.standard_normal((8, 5, 1025)).astype(np.float32)
    lp = guided_log_probs(c, None, 0.0, 1024)
    want = scoring_kernels.log_softmax_np(c)
    np.testing.assert_allclose(lp[..., :1024], want[..., :1024], rtol=1e-6)
    assert np.isneginf(lp[..., 1024]).all()
    # guidance: log_softmax(c' + g (c' - u')) of the log-softmaxes c', u', before MASK is dropped
    u = rng.standard_normal((8, 5, 1025)).astype(np.float32)
    cl, ul = scoring_kernels.log_softmax_np(c), scoring_kernels.log_softmax_np(u)
    want = scoring_kernels.log_softmax_np(cl + 2.0 * (cl - ul))
    got = guided_log_probs(c, u, 2.0, 1024)
    np.testing.assert_allclose(got[..., :1024], want[..., :1024], rtol=1e-5, atol=1e-5)


def test_seed_list_must_match_batch(params, cfg, tok):
    item = prepare_item(tok, cfg, "hi", 3)
    with pytest.raises(InputError, match="seeds"):
        um.generate_codes(params, cfg, [item, item], GenerationConfig(num_step=2), seed=[1, 2, 3])
    assert um.generate_codes(params, cfg, [], GenerationConfig()) == []


# ---------------------------------------------------------------------------------------------
# Invariants of the loop (property tests)
# ---------------------------------------------------------------------------------------------

_words = st.text(alphabet=st.sampled_from(list("abcdefg hij 你好[]")), min_size=1, max_size=25)


@st.composite
def batches(draw):
    B = draw(st.integers(1, 3))
    specs = []
    for _ in range(B):
        R = draw(st.sampled_from([0, 0, 3, 9]))
        specs.append(dict(text=draw(_words), T=draw(st.integers(1, 18)), R=R,
                          seed=draw(st.integers(0, 1000))))
    gen = GenerationConfig(num_step=draw(st.integers(1, 10)),
                           guidance_scale=draw(st.sampled_from([0.0, 2.0])),
                           t_shift=draw(st.sampled_from([0.1, 0.5, 1.0])),
                           position_temperature=draw(st.sampled_from([0.0, 5.0])),
                           class_temperature=draw(st.sampled_from([0.0, 0.8])))
    return specs, gen


def _prepare(tok, cfg, specs):
    out = []
    for s in specs:
        codes = np.random.default_rng(s["seed"]).integers(0, 1024, (8, s["R"])) if s["R"] else None
        out.append(prepare_item(tok, cfg, s["text"], s["T"], ref_text="ref" if s["R"] else None,
                                ref_codes=codes))
    return out


@settings(max_examples=12, deadline=None)
@given(batches(), st.integers(0, 2**32 - 1))
def test_loop_invariants(params, cfg, tok, case, seed):
    specs, gen = case
    items = _prepare(tok, cfg, specs)
    mask_id = cfg.audio_mask_id
    seen = []  # the packed ids the backbone got at every step

    def spy(params_, cfg_, ids, audio_mask, pack, num_out, **kw):
        seen.append((np.array(ids), pack))
        return bb.forward_rows(params_, cfg_, ids, audio_mask, pack, num_out, **kw)

    steps_reported = []
    with mock.patch.object(um, "forward_rows", side_effect=spy):
        codes, fill = um.generate_codes(params, cfg, items, gen, seed=seed, return_fill_steps=True,
                                        on_step=lambda i, n: steps_reported.append((i, n)))
    assert steps_reported == [(i + 1, gen.num_step) for i in range(gen.num_step)]
    assert len(seen) == gen.num_step
    for b, (it, c, f) in enumerate(zip(items, codes, fill)):
        T = it.num_target
        assert c.shape == (8, T) and c.dtype == np.int64
        assert (c != mask_id).all() and c.min() >= 0  # nothing left masked
        # cells filled per step follow the schedule exactly
        sched = um.cells_per_step(8 * T, gen.num_step, gen.t_shift)
        assert np.bincount(f.ravel(), minlength=gen.num_step).tolist() == sched
        # what the model saw at step s: exactly the cells filled before s, with their final value
        for s, (ids, pack) in enumerate(seen):
            start, L = pack.starts[b], pack.lengths[b]
            target = ids[:, start + L - T:start + L]
            np.testing.assert_array_equal(target, np.where(f < s, c, mask_id))
            np.testing.assert_array_equal(ids[:, start:start + L - T], it.input_ids[:, :-T])  # prompt untouched
            if gen.guidance_scale != 0:  # the unconditional row tracks the same targets
                us, uL = pack.starts[len(items) + b], pack.lengths[len(items) + b]
                assert uL == T
                np.testing.assert_array_equal(ids[:, us:us + T], target)
        assert len(pack.lengths) == len(items) * (2 if gen.guidance_scale != 0 else 1)

    # batch-composition independence: each item alone gives the same codes
    for it, c in zip(items, codes):
        alone = um.generate_codes(params, cfg, [it], gen, seed=seed)[0]
        np.testing.assert_array_equal(alone, c)


def test_seeded_sampling_is_reproducible_and_seed_dependent(params, cfg, tok):
    items = [prepare_item(tok, cfg, "Some words to say.", 20),
             prepare_item(tok, cfg, "Other words", 9, ref_text="ref",
                          ref_codes=np.arange(8 * 6).reshape(8, 6))]
    gen = GenerationConfig(num_step=8, class_temperature=1.0, position_temperature=5.0)
    a = um.generate_codes(params, cfg, items, gen, seed=123)
    b = um.generate_codes(params, cfg, items, gen, seed=123)
    c = um.generate_codes(params, cfg, items, gen, seed=124)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(a, c))
    # one seed per item: item 1 with seed 7 is the same whether or not item 0 is there
    both = um.generate_codes(params, cfg, items, gen, seed=[5, 7])
    only = um.generate_codes(params, cfg, items[1:], gen, seed=[7])
    np.testing.assert_array_equal(both[1], only[0])
    # position noise alone (greedy tokens) also depends on the seed
    gen_pos = GenerationConfig(num_step=8, class_temperature=0.0, position_temperature=5.0)
    p1, f1 = um.generate_codes(params, cfg, items[:1], gen_pos, seed=1, return_fill_steps=True)
    p2, f2 = um.generate_codes(params, cfg, items[:1], gen_pos, seed=2, return_fill_steps=True)
    assert not np.array_equal(f1[0], f2[0])
