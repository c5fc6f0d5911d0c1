"""The generation profiles: "exact" (the default, the reference's algorithm) and "fast" (the
prompt's keys and values reused between refresh steps, the unconditional pass every few steps,
16 steps). What is tested here, on the tiny checkpoint, numpy backend (the strict backend's
side is in tests/test_strict_backend.py):

* fast with prefix_refresh=1 and uncond_every=1 makes exact's codes and audio bit for bit, in
  auto, design and clone modes, through the engine like every call;
* each knob alone changes only what it says: the rows each step runs, and nothing before the
  first step that differs;
* the engine runs the readable loop's fast profile (unmasking.generate_codes, with its caches),
  packed with exact passes, streamed and seeded;
* what a fast pass keeps between steps is counted before anything is allocated;
* the profile reaches every front door: from_pretrained's default, a call's own, the settings.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from omnicore import GenerationConfig, OmniVoice
from omnicore.errors import ConfigError, InputError
from omnicore.model import cost, packed_unmasking, unmasking
from omnicore.model.config import FAST_PROFILE, resolve_generation_config
from omnicore.model.tokenizer import prepare_item

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "weights" / "tiny-random"
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
CLIP_TEXT = (ROOT / "tests" / "fixtures" / "audio" / "speech.txt").read_text().strip()
TEXT = "The weather is lovely today, so let us go out for a long walk by the river."
GREEDY = dict(position_temperature=0.0, class_temperature=0.0)
MODES = {"auto": {}, "design": {"instruct": "female, low pitch"},
         "clone": {"ref_audio": str(CLIP), "ref_text": CLIP_TEXT}}


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(CKPT)


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


def test_profiles_settings_and_bounds():
    assert GenerationConfig().profile == "exact"
    fast = GenerationConfig.for_profile("fast")
    assert (fast.num_step, fast.prefix_refresh, fast.uncond_every) == (16, 8, 3) == tuple(FAST_PROFILE.values())
    assert GenerationConfig.for_profile("fast", num_step=32).num_step == 32
    assert resolve_generation_config(None, {"profile": "fast", "uncond_every": 2}) == \
        GenerationConfig(profile="fast", num_step=16, prefix_refresh=8, uncond_every=2)
    assert resolve_generation_config(None, {}, "fast") == fast  # the model's default profile
    for bad in (dict(prefix_refresh=2), dict(uncond_every=3)):  # exact means every step in full
        with pytest.raises(InputError, match="profile='fast'"):
            GenerationConfig(**bad)
    for bad in (dict(prefix_refresh=0), dict(uncond_every=1001), dict(prefix_refresh=2.0),
                dict(uncond_every=True), dict(profile="turbo")):
        with pytest.raises(InputError):
            GenerationConfig(**{"profile": "fast", **bad})
    with pytest.raises(InputError, match="profile"):
        GenerationConfig.for_profile("quick")
    with pytest.raises(ConfigError, match="profile"):
        OmniVoice.from_pretrained(CKPT, profile="quick")


# ---------------------------------------------------------------------------------------------
# Fast with its knobs at 1 is exact
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
def test_fast_with_both_knobs_at_one_is_exact_bit_for_bit(model, mode):
    """Every step then runs every row whole (writing the prompt caches it never reads) and
    recomputes the unconditional logits (keeping them, unread): the same arithmetic as exact.
    Seeded sampling, so the noise is drawn alike too."""
    kw = dict(num_step=10, seed=5, **MODES[mode])
    exact = model.synthesize(TEXT, **kw)[0]
    fast = model.synthesize(TEXT, profile="fast", prefix_refresh=1, uncond_every=1, **kw)[0]
    np.testing.assert_array_equal(fast.codes, exact.codes)
    np.testing.assert_array_equal(fast.fill_steps, exact.fill_steps)
    np.testing.assert_array_equal(fast.audio, exact.audio)
    # and the fast profile's own settings do change the codes (the test can fail)
    assert not np.array_equal(model.synthesize(TEXT, profile="fast", **kw)[0].codes, exact.codes)


# ---------------------------------------------------------------------------------------------
# Each knob alone changes only what it says
# ---------------------------------------------------------------------------------------------


def _layouts(model, monkeypatch, **kw):
    """The rows every forward of one call ran: [(lengths, offsets)] per step, and the result."""
    seen, real = [], packed_unmasking.forward_rows

    def spy(params, cfg, ids, audio_mask, pack, *a, **k):
        seen.append((pack.lengths, pack.offsets or (0,) * len(pack.lengths)))
        return real(params, cfg, ids, audio_mask, pack, *a, **k)

    with monkeypatch.context() as mp:
        mp.setattr(packed_unmasking, "forward_rows", spy)
        result = model.synthesize(TEXT, seed=3, **kw)[0]
    return seen, result


@pytest.mark.parametrize("knobs", [dict(prefix_refresh=3, uncond_every=1),
                                   dict(prefix_refresh=1, uncond_every=4),
                                   dict(prefix_refresh=4, uncond_every=3)])
def test_each_knob_changes_only_the_rows_it_names(model, monkeypatch, knobs):
    steps = 9
    exact_rows, exact = _layouts(model, monkeypatch, num_step=steps, **GREEDY)
    fast_rows, fast = _layouts(model, monkeypatch, num_step=steps, profile="fast", **knobs, **GREEDY)
    (L, T), zeros = exact_rows[0][0], (0, 0)
    P = L - T
    assert exact_rows == [((L, T), zeros)] * steps  # exact: both rows whole, every step
    refresh, every = knobs["prefix_refresh"], knobs["uncond_every"]
    want = []
    for step in range(steps):
        cond = (L, 0) if step % refresh == 0 else (T, P)  # whole, or the targets after the prompt
        rows = [cond] + ([(T, 0)] if step % every == 0 else [])
        want.append((tuple(r[0] for r in rows), tuple(r[1] for r in rows)))
    assert fast_rows == want
    # The first step runs exactly what exact runs: the cells it fills are exact's.
    first = exact.fill_steps == 0
    np.testing.assert_array_equal(fast.fill_steps == 0, first)
    np.testing.assert_array_equal(fast.codes[first], exact.codes[first])
    assert fast.codes.shape == exact.codes.shape and len(fast.audio) == len(exact.audio)


def test_the_fast_profile_keeps_exacts_steps_only_when_asked(model, monkeypatch):
    rows, _ = _layouts(model, monkeypatch, profile="fast", **GREEDY)
    assert len(rows) == FAST_PROFILE["num_step"]
    rows, _ = _layouts(model, monkeypatch, profile="fast", num_step=5, **GREEDY)
    assert len(rows) == 5


# ---------------------------------------------------------------------------------------------
# The engine runs the readable loop's fast profile
# ---------------------------------------------------------------------------------------------


def test_the_engine_runs_what_the_readable_loop_computes(model):
    """unmasking.generate_codes (the algorithm as written, its caches included) and the engine
    (packed_unmasking.iterate) give the same codes bit for bit: greedy and seeded, with and
    without a voice reference, passes of different lengths packed together."""
    cfg, tok = model.config, model.tokenizer
    refs = np.random.default_rng(0).integers(0, 1024, (8, 30))
    items = [prepare_item(tok, cfg, TEXT, 40, lang="en"),
             prepare_item(tok, cfg, "Short one.", 17, ref_text="A reference.", ref_codes=refs)]
    for sampling in (GREEDY, dict(position_temperature=5.0, class_temperature=0.7)):
        gen = GenerationConfig(profile="fast", num_step=9, prefix_refresh=4, uncond_every=3, **sampling)
        spec = unmasking.generate_codes(model.params, cfg, items, gen, seed=11)
        states = [unmasking.PassState(it, gen, 11, cfg) for it in items]
        cache = packed_unmasking.PackCache()
        while not all(s.done for s in states):
            packed_unmasking.iterate(model.params, cfg, states, cache)
        for a, s in zip(spec, states):
            np.testing.assert_array_equal(s.codes(), a)


def test_fast_and_exact_requests_share_the_engine(model):
    """A fast and an exact request at once: each gets what it gets alone (its rows packed with
    the other's, its own caches and kept logits)."""
    kw = dict(num_step=8, seed=9)
    alone = {p: model.synthesize(TEXT, profile=p, **kw)[0].codes for p in ("exact", "fast")}
    iterations, out = [], {}
    model.engine.trace = lambda ids: iterations.append(len(set(ids)))
    try:
        threads = [threading.Thread(target=lambda p=p: out.__setitem__(
            p, model.synthesize(TEXT, profile=p, **kw)[0].codes)) for p in alone]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        model.engine.trace = None
    for p in alone:
        np.testing.assert_array_equal(out[p], alone[p])


def test_a_fast_stream_is_seeded_and_labelled_by_its_settings(model):
    text = "First a short sentence. Then a second one follows it, a little longer than the first."
    a = np.concatenate(list(model.stream(text, profile="fast", seed=4)))
    b = np.concatenate(list(model.stream(text, profile="fast", seed=4)))
    np.testing.assert_array_equal(a, b)
    exact = np.concatenate(list(model.stream(text, seed=4)))
    assert not (len(a) == len(exact) and np.array_equal(a, exact))


# ---------------------------------------------------------------------------------------------
# Memory: what a fast pass keeps is counted before anything is allocated
# ---------------------------------------------------------------------------------------------


def test_a_pass_whose_kept_state_would_not_fit_is_refused_first(model, monkeypatch):
    cfg = model.config
    item = prepare_item(model.tokenizer, cfg, TEXT, 60, lang="en")
    L, T = item.input_ids.shape[1], item.num_target
    fast = GenerationConfig.for_profile("fast")
    kept = cost.kept_bytes(cfg, fast, L - T, T, True)
    q = cfg.llm_config
    assert kept == 4 * (q.num_hidden_layers * 2 * (L - T) * q.num_key_value_heads * q.head_dim
                        + cfg.num_audio_codebook * T * cfg.audio_vocab_size)
    assert cost.kept_bytes(cfg, GenerationConfig(), L - T, T, True) == 0
    forward = cost.forward_bytes(cfg, [L, T], [T, T])
    monkeypatch.setattr(cost, "MAX_PASS_BYTES", forward + kept // 2)  # exact fits, fast does not
    allocated = []
    monkeypatch.setattr(unmasking, "make_prompt_cache",
                        lambda *a: allocated.append(a) or pytest.fail("allocated"))
    with pytest.raises(InputError, match="working memory"):
        model.synthesize(TEXT, language="en", duration=60 / 25, profile="fast", **GREEDY)
    with pytest.raises(InputError, match="working memory"):
        unmasking.generate_codes(model.params, cfg, [item], fast)
    assert not allocated
    model.synthesize(TEXT, language="en", duration=60 / 25, num_step=2, **GREEDY)  # exact: admitted


def test_the_engine_counts_what_active_fast_passes_keep(model, monkeypatch):
    """Two fast passes that fit the memory budget one at a time, not together (their kept
    prompt caches and logits), run one after the other; exact passes of the same rows share
    iterations."""
    cfg = model.config
    item = prepare_item(model.tokenizer, cfg, TEXT, 50, lang="en")
    L, T = item.input_ids.shape[1], item.num_target
    fast = GenerationConfig.for_profile("fast", num_step=4)
    kept = cost.kept_bytes(cfg, fast, L - T, T, True)
    both = cost.forward_bytes(cfg, [L, T] * 2, [T] * 4)  # two passes' rows in one forward
    assert cost.forward_bytes(cfg, [L, T], [T, T]) + kept <= both < both + 2 * kept
    monkeypatch.setattr(cost, "MAX_PASS_BYTES", both)  # two exact passes fit, two fast ones not
    for profile, together in (("fast", False), ("exact", True)):
        passes = []
        model.engine.trace = lambda ids: passes.append(len(ids))
        try:
            model.synthesize([TEXT, TEXT], language="en", duration=T / 25, profile=profile,
                             num_step=4, **GREEDY)
        finally:
            model.engine.trace = None
        assert (max(passes) == 2) is together, (profile, passes)


# ---------------------------------------------------------------------------------------------
# Front doors
# ---------------------------------------------------------------------------------------------


def test_the_models_default_profile_and_a_calls_own(model):
    fast_model = OmniVoice(model.model_dir, model.config, model.params, model.tokenizer,
                           model.codec, profile="fast")
    kw = dict(num_step=6, seed=2, duration=1.5)
    a = fast_model.synthesize(TEXT, **kw)[0]
    assert a.num_steps == 6
    np.testing.assert_array_equal(a.codes, model.synthesize(TEXT, profile="fast", **kw)[0].codes)
    np.testing.assert_array_equal(fast_model.synthesize(TEXT, profile="exact", **kw)[0].codes,
                                  model.synthesize(TEXT, **kw)[0].codes)
    assert fast_model.synthesize(TEXT, seed=2, duration=1.5)[0].num_steps == FAST_PROFILE["num_step"]
