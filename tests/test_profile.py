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
* the profile reaches every front door: from_pretrained's default, a call's own, the settings;
* "live" (fast, and a stream's chunk 0 short and in its own steps): with its two knobs at their
  exact settings it streams exactly what fast streams (and with fast's knobs at 1, what exact
  streams), in every mode, alone and packed; chunk 0 runs its own number of engine steps, on
  the same engine, and is cut where first_chunk_seconds says.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from omnicore import GenerationConfig, OmniVoice
from omnicore.errors import ConfigError, InputError
from omnicore.model import cost, fast_profile, packed_unmasking, unmasking
from omnicore.engine import PassSpec
from omnicore.model.config import (FAST_PROFILE, FIRST_CHUNK_SECONDS, LIVE_PROFILE,
                                   resolve_generation_config)
from omnicore.model.tokenizer import prepare_item
from omnicore.text.planner import ChunkRule, split_text

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "weights" / "tiny-random"
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
CLIP_TEXT = (ROOT / "tests" / "fixtures" / "audio" / "speech.txt").read_text().strip()
TEXT = "The weather is lovely today, so let us go out for a long walk by the river."
GREEDY = dict(position_temperature=0.0, class_temperature=0.0)
MODES = {"auto": {}, "design": {"instruct": "female, low pitch"},
         "clone": {"ref_audio": str(CLIP), "ref_text": CLIP_TEXT}}


def _auto_quick(names):
    """The modes of a stream test whose every mode runs several streams: auto in the quick
    loop, the others slow (the full suite runs them all; each stays one parameter)."""
    return [pytest.param(m, marks=() if m == "auto" else pytest.mark.slow) for m in names]


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
    monkeypatch.setattr(fast_profile, "make_prompt_cache",
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


# ---------------------------------------------------------------------------------------------
# The live profile: fast, and a stream's chunk 0 short and in its own steps
# ---------------------------------------------------------------------------------------------

# Three chunks at the default rule, two at live's: a clause of ~1.3 s, then sentences.
STREAM_TEXT = ("Lights off, please. The thermostat is set to twenty-one degrees tonight. "
               "Goodnight, and sleep well until the morning comes.")
# The live knobs at their exact settings: nothing of live's own is left but fast.
LIVE_AT_EXACT = dict(first_chunk_steps=0, first_chunk_seconds=FIRST_CHUNK_SECONDS,
                     first_chunk_max_seconds=0.0, first_audio_seconds=0.0)
MAX_LONG_STEPS = 1000  # a request that outlasts a whole stream (it is cancelled after it)


@pytest.fixture(scope="module")
def clone_prompt(model):
    return model.create_voice_clone_prompt(str(CLIP), ref_text=CLIP_TEXT)


def _voice(mode, clone_prompt):
    return {"voice_clone_prompt": clone_prompt} if mode == "clone" else MODES[mode]


def _streamed(model, text, **kw):
    """A stream run to its end: (audio, per-chunk codes, chunk texts)."""
    st = model.stream(text, **kw)
    audio = np.concatenate(list(st))
    return audio, [c["codes"] for c in st.chunk_stats], st.text_chunks


def test_live_settings_and_bounds():
    live = GenerationConfig.for_profile("live")
    assert {k: getattr(live, k) for k in LIVE_PROFILE} == LIVE_PROFILE
    assert {k: LIVE_PROFILE[k] for k in FAST_PROFILE} == FAST_PROFILE  # fast underneath
    assert (live.first_chunk_steps, live.first_chunk_seconds) == (4, 1.0)
    assert resolve_generation_config(None, {"profile": "live"}) == live
    assert resolve_generation_config(None, {}, "live") == live  # the model's default profile
    # the exact settings are the defaults, and None is 0
    exact = GenerationConfig()
    assert (exact.first_chunk_steps, exact.first_chunk_seconds) == (0, FIRST_CHUNK_SECONDS)
    assert GenerationConfig(first_chunk_steps=None) == exact
    # chunk 0's settings: its own steps, nothing else changed; the other chunks as given
    assert live.for_chunk(0) == GenerationConfig(**{**live.__dict__, "num_step": 4})
    assert live.for_chunk(1) is live and exact.for_chunk(0) is exact
    # like num_step they size the work, so exact takes them too (each pass stays exact)
    assert GenerationConfig(first_chunk_steps=8, first_chunk_seconds=1.0).for_chunk(0).num_step == 8
    # the default rule comes back at the exact setting
    assert ChunkRule.with_first(FIRST_CHUNK_SECONDS) == ChunkRule()
    assert ChunkRule.with_first(1.0) == ChunkRule(first_seconds=1.0, first_max_seconds=3.0)
    # live caps chunk 0 at a word break after 2 s (a cap never comes before the clause's cut)
    assert live.first_chunk_max_seconds == 2.0 and exact.first_chunk_max_seconds == 0.0
    assert ChunkRule.with_first(1.0, None, 2.0) == ChunkRule(first_seconds=1.0, first_max_seconds=2.0)
    assert ChunkRule.with_first(3.0, None, 2.0).first_max_seconds == 3.0
    for bad in (dict(first_chunk_steps=-1), dict(first_chunk_steps=1001), dict(first_chunk_steps=2.0),
                dict(first_chunk_steps=True), dict(first_chunk_steps="4"),
                dict(first_chunk_seconds=0.4), dict(first_chunk_seconds=15.5),
                dict(first_chunk_seconds=float("nan")), dict(first_chunk_seconds=float("inf")),
                dict(first_chunk_seconds=True), dict(first_chunk_seconds="1"),
                dict(first_audio_seconds=-1.0), dict(first_audio_seconds=0.05),
                dict(first_audio_seconds=61.0), dict(first_audio_seconds=float("nan")),
                dict(first_audio_seconds="3"), dict(first_chunk_max_seconds=0.4),
                dict(first_chunk_max_seconds=15.5), dict(first_chunk_max_seconds=float("nan")),
                dict(first_chunk_max_seconds=True), dict(first_chunk_max_seconds="2")):
        for profile in ("exact", "live"):
            with pytest.raises(InputError, match=next(iter(bad))):
                GenerationConfig.for_profile(profile, **bad)
    with pytest.raises(InputError, match="first_chunk_steps"):
        resolve_generation_config(None, {"profile": "live", "first_chunk_steps": 0.5})


def test_a_bad_live_knob_is_refused_when_the_stream_is_called(model):
    for bad in (dict(first_chunk_steps=-2), dict(first_chunk_seconds=0.0)):
        with pytest.raises(InputError, match=next(iter(bad))):
            model.stream(STREAM_TEXT, profile="live", **bad)
        with pytest.raises(InputError, match=next(iter(bad))):
            model.synthesize(STREAM_TEXT, profile="live", **bad)
    assert not [t for t in threading.enumerate() if t.name.startswith("omnicore-stream")]


@pytest.mark.parametrize("mode", _auto_quick(MODES))
def test_live_with_its_knobs_at_exact_settings_streams_what_fast_and_exact_stream(model, mode,
                                                                                 clone_prompt):
    """Bit for bit, every chunk's codes and the audio: live at (0, 2 s) is fast; live with
    fast's knobs at 1 too is exact. And live's own knobs change the stream (the test can
    fail), while generate() ignores them (its audio comes all at once)."""
    kw = dict(num_step=4, seed=5, **_voice(mode, clone_prompt))
    fast = _streamed(model, STREAM_TEXT, profile="fast", **kw)
    live = _streamed(model, STREAM_TEXT, profile="live", **LIVE_AT_EXACT, **kw)
    exact = _streamed(model, STREAM_TEXT, **kw)
    live1 = _streamed(model, STREAM_TEXT, profile="live", prefix_refresh=1, uncond_every=1,
                      **LIVE_AT_EXACT, **kw)
    assert len(fast[1]) == 2  # chunk 0, and a later chunk conditioned on it (or the prompt)
    for got, want in ((live, fast), (live1, exact)):
        assert got[2] == want[2]
        for a, b in zip(got[1], want[1], strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(got[0], want[0])
    assert _streamed(model, STREAM_TEXT, profile="live", **kw)[2] != fast[2]  # a shorter chunk 0
    steps = _streamed(model, STREAM_TEXT, profile="live", first_chunk_steps=2,
                      first_chunk_seconds=FIRST_CHUNK_SECONDS, first_chunk_max_seconds=0.0, **kw)
    assert steps[2] == fast[2] and not np.array_equal(steps[1][0], fast[1][0])  # its own steps
    np.testing.assert_array_equal(model.synthesize(STREAM_TEXT, profile="live", **kw)[0].codes,
                                  model.synthesize(STREAM_TEXT, profile="fast", **kw)[0].codes)


def _steps_per_request(model, run):
    """How many engine iterations each request (ticket) ran in, in the order they started."""
    seen = []
    model.engine.trace = lambda ids: seen.append(sorted(set(ids)))
    try:
        out = run()
    finally:
        model.engine.trace = None
    counts = {}
    for ids in seen:
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
    return [counts[i] for i in sorted(counts)], seen, out


@pytest.mark.parametrize("mode", _auto_quick(MODES))
def test_chunk_0_runs_its_own_steps_and_the_others_the_profiles(model, mode, clone_prompt):
    kw = dict(profile="live", num_step=5, first_chunk_steps=2, seed=3, **_voice(mode, clone_prompt))
    progress = []
    counts, _, (_, codes, chunks) = _steps_per_request(model, lambda: _streamed(
        model, STREAM_TEXT, on_step=lambda step, total: progress.append((step, total)), **kw))
    assert len(chunks) == 2 and counts == [2, 5]  # one request per chunk, one step per iteration
    assert progress == [(1, 2), (2, 2)] + [(s, 5) for s in range(1, 6)]
    counts, _, _ = _steps_per_request(model, lambda: _streamed(
        model, STREAM_TEXT, **{**kw, "first_chunk_steps": 0}))
    assert counts == [5, 5]


def test_chunk_0_packs_with_other_passes_on_the_one_engine(model, clone_prompt):
    """Chunk 0's pass (its own steps) in one engine request with an exact pass and a fast one
    of other lengths: every pass computes what it computes alone, and they share iterations
    (the shorter ones leave early)."""
    cfg = model.config
    live = GenerationConfig.for_profile("live", num_step=6, first_chunk_steps=3)
    ref = clone_prompt.ref_audio_tokens
    specs = [PassSpec("Lights off, please.", 30, "en", None, None, None, 1, live.for_chunk(0)),
             PassSpec(TEXT, 45, "en", None, CLIP_TEXT, ref, 2, GenerationConfig(num_step=4)),
             PassSpec(TEXT, 40, None, "female, low pitch", None, None, 3,
                      GenerationConfig.for_profile("fast", num_step=5)),
             # the same as the first, at live's exact settings: it is fast's pass
             PassSpec("Lights off, please.", 30, "en", None, None, None, 1,
                      GenerationConfig.for_profile("live", num_step=6, **LIVE_AT_EXACT).for_chunk(0))]
    alone = [model.engine.run([s])[0] for s in specs]
    fast_alone = model.engine.run([PassSpec("Lights off, please.", 30, "en", None, None, None, 1,
                                            GenerationConfig.for_profile("fast", num_step=6))])[0]
    widths, seen, packed = _steps_per_request(model, lambda: model.engine.run(specs))
    assert widths == [6] and [len(ids) for ids in seen] == [1] * 6  # one request, 6 iterations
    for a, b in zip(packed, alone, strict=True):
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_array_equal(a.fill_steps, b.fill_steps)
    assert packed[0].fill_steps.max() == 2 and packed[1].fill_steps.max() == 3  # own steps
    np.testing.assert_array_equal(packed[3].codes, fast_alone.codes)
    assert cfg.num_audio_codebook == packed[0].codes.shape[0]


def test_the_first_chunk_follows_first_chunk_seconds(model):
    """Chunk 0 ends where ChunkRule.with_first(first_chunk_seconds) says, for whole text and
    fragments alike; the exact setting keeps the default rule; a rule given wins."""
    kw = dict(num_step=2, seed=1)
    want = {s: split_text(STREAM_TEXT, ChunkRule.with_first(s)) for s in (0.5, 1.0, 2.0, 4.0)}
    assert len({w[0] for w in want.values()}) >= 3  # the knob moves the cut on this text
    assert want[2.0] == split_text(STREAM_TEXT)
    for seconds, chunks in want.items():
        st = model.stream(STREAM_TEXT, profile="live", first_chunk_seconds=seconds,
                          first_chunk_max_seconds=0.0, **kw)
        list(st)
        assert st.text_chunks == chunks, seconds
    frags = (STREAM_TEXT[i:i + 3] for i in range(0, len(STREAM_TEXT), 3))  # as an LLM writes
    st = model.stream(frags, profile="live", **kw)
    list(st)
    assert st.text_chunks == split_text(STREAM_TEXT, ChunkRule.with_first(1.0, None, 2.0))
    # a reply with no clause end in its first 2 s: live cuts it at the word break after 2 s,
    # where the exact setting's cap (3x first_chunk_seconds) would wait for 3 s of words
    live_cut = split_text(EARLY_CLAUSE, ChunkRule.with_first(1.0, None, 2.0))
    assert len(live_cut[0]) < len(split_text(EARLY_CLAUSE, ChunkRule.with_first(1.0))[0])
    frags = (EARLY_CLAUSE[i:i + 4] for i in range(0, len(EARLY_CLAUSE), 4))
    st = model.stream(frags, profile="live", first_audio_seconds=0.0, **kw)
    list(st)
    assert st.text_chunks == live_cut
    st = model.stream(STREAM_TEXT, profile="live", rule=ChunkRule(), **kw)
    list(st)
    assert st.text_chunks == want[2.0]


def test_the_model_may_default_to_live(model):
    live_model = OmniVoice(model.model_dir, model.config, model.params, model.tokenizer,
                           model.codec, profile="live")
    kw = dict(num_step=3, seed=2)
    a = _streamed(live_model, STREAM_TEXT, **kw)
    b = _streamed(model, STREAM_TEXT, profile="live", **kw)
    assert a[2] == b[2]
    np.testing.assert_array_equal(a[0], b[0])


def test_a_live_streams_chunk_0_packs_with_a_running_request(model):
    """A live stream started while a long request runs: its chunk 0 (its own steps) shares that
    request's forwards, and the stream is what it is alone, bit for bit."""
    kw = dict(profile="live", num_step=4, first_chunk_steps=2, seed=8, **GREEDY)
    alone = _streamed(model, STREAM_TEXT, **kw)
    # cheaper per step than chunk 0, so the engine's least-work-first rule runs it alongside
    long = PassSpec("Hi.", 10, "en", None, None, None, 0, GenerationConfig(num_step=MAX_LONG_STEPS))
    seen, started = [], threading.Event()

    def trace(ids):
        seen.append(set(ids))
        started.set()
    model.engine.trace = trace
    ticket = model.engine.submit([long])
    try:
        assert started.wait(60), "the long request never ran"
        packed = _streamed(model, STREAM_TEXT, **kw)
        assert not ticket.done(), "the long request ended before the stream: lengthen it"
    finally:
        ticket.cancel()
        model.engine.trace = None
    chunk0 = min(i for ids in seen for i in ids if i > ticket.id)
    assert any({ticket.id, chunk0} <= ids for ids in seen)  # chunk 0 ran packed with it
    assert sum(chunk0 in ids for ids in seen) == 2  # in its own 2 steps
    assert packed[2] == alone[2]
    for a, b in zip(packed[1], alone[1], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(packed[0], alone[0])



# -- chunk 0 cut by the first-audio budget ------------------------------------------------------

# A first clause that ends too early ("Okay,"), then none; and no punctuation at all.
EARLY_CLAUSE = ("Okay, so the living room lights are now off and the kitchen lights are dimmed "
                "to twenty percent for the rest of the evening.")
NO_PUNCTUATION = ("turning off the living room lights and dimming the kitchen ones to twenty "
                  "percent for the rest of the evening")


@pytest.fixture
def rate():
    """Set the machine's rate (settings.configure) for one test; put back after."""
    from omnicore.machinery import settings

    before = settings.current().rate
    yield lambda value: settings.configure(rate=value)
    settings.configure(rate=before)


def _plan(model, **kw):
    from omnicore.streaming import _Plan

    args = dict(language=None, ref_audio=None, ref_text=None, voice_clone_prompt=None,
                instruct=None, duration=None, speed=None, seed=None, on_step=None,
                generation_config=None, gen_kwargs={"profile": "live"}, whole_text=EARLY_CLAUSE)
    return _Plan(model, **{**args, **kw})


def test_frames_within_is_the_most_that_fits(model):
    gen = GenerationConfig.for_profile("live").for_chunk(0)
    for prompt, flops in ((30, 5e8), (176, 3e9), (10, 1e6)):
        T = cost.frames_within(model.config, gen, prompt, True, flops, 400, 0.2)
        assert T == 0 or cost.pass_flops(model.config, gen, prompt + int(np.ceil(0.2 * T)), T,
                                         True) <= flops
        assert T == 400 or cost.pass_flops(model.config, gen, prompt + int(np.ceil(0.2 * (T + 1))),
                                           T + 1, True) > flops


def test_seconds_within_sizes_chunk_0_within_its_frames(clone_prompt):
    """The speech seconds_within allows is planned at most those frames (plan_chunk, with the
    voice prompt's pace or the yardstick's, at a speed), and a word more would not be."""
    from omnicore.text.planner import plan_chunk, seconds_within

    words = NO_PUNCTUATION.split()
    ref = (clone_prompt.ref_text, clone_prompt.ref_audio_tokens.shape[1])
    for ref_text, ref_frames in ((None, None), ref):
        for pace in (1.0, 1.5):
            for frames in (20, 50, 90):
                budget = seconds_within(frames, ref_text, ref_frames, pace)
                only_budget = ChunkRule(first_max_seconds=15.0, first_budget_seconds=budget)
                chunk = split_text(NO_PUNCTUATION, only_budget)[0]
                n = len(chunk.split())  # one word at least, whatever it costs
                assert n == 1 or plan_chunk(chunk, None, ref_text, ref_frames, pace).frames <= frames
                more = " ".join(words[:n + 1])  # (frames are truncated: a word more reaches them)
                assert plan_chunk(more, None, ref_text, ref_frames, pace).frames >= frames


def test_the_chunker_cuts_chunk_0_at_the_last_word_break_within_its_budget():
    """Whatever the punctuation, chunk 0 ends at the last word break within the budget (one
    word at least), fragments as the whole; no budget, or one it never reaches, is the rule as
    it was; the later chunks are cut as before."""
    from omnicore.text.frontend import text_weight

    second = 1 / text_weight("Nice to meet you.")
    for text in (EARLY_CLAUSE, NO_PUNCTUATION):
        old = split_text(text, ChunkRule.with_first(1.0))
        assert split_text(text, ChunkRule.with_first(1.0, 15.0)) == old
        for budget in (0.01, 0.5, 1.2, 2.0):
            chunks = split_text(text, ChunkRule.with_first(1.0, budget))
            first, words = chunks[0], text.split()
            n = len(first.split())
            assert first == " ".join(words[:n]) and n >= 1
            assert n == 1 or text_weight(first) * second <= budget
            assert text_weight(" ".join(words[:n + 1])) * second > budget
            assert " ".join(chunks[1:]).split() == words[n:]  # nothing lost or moved
            frags = [text[i:i + 3] for i in range(0, len(text), 3)]
            from omnicore.text.planner import TextChunker

            chunker = TextChunker(ChunkRule.with_first(1.0, budget))
            assert [c for f in frags for c in chunker.feed(f)] + chunker.flush() == chunks
    assert split_text(EARLY_CLAUSE, ChunkRule.with_first(1.0))[0].endswith("off and the")  # 3 s cap
    assert split_text(EARLY_CLAUSE, ChunkRule.with_first(1.0, 1.2))[0] == "Okay, so the living"


def test_a_slower_machine_gets_a_shorter_chunk_0(model, clone_prompt):
    """chunk 0's budget in speech falls with the rate and with the prompt's length, and is
    none at all for the exact setting (first_audio_seconds 0)."""
    for kw in ({}, {"voice_clone_prompt": clone_prompt}):
        plan = _plan(model, **kw)
        seconds = [plan.first_budget(r) for r in (2e8, 4e8, 8e8, 1.6e9)]
        assert seconds == sorted(seconds) and seconds[0] < seconds[-1], seconds
    auto, voiced = _plan(model), _plan(model, voice_clone_prompt=clone_prompt)
    assert voiced.first_budget(4e8) < auto.first_budget(4e8)  # the prompt's rows cost too


def test_a_live_stream_cuts_chunk_0_where_the_machine_rate_says(model, rate):
    """Through stream(): the rate in force sets chunk 0's budget (whole text and fragments
    alike); a rule given wins."""
    kw = dict(profile="live", num_step=2, seed=1)
    for value in (5e7, 1e8):
        rate(value)
        want = split_text(NO_PUNCTUATION, ChunkRule.with_first(1.0, _plan(model).first_budget(value)))
        assert want != split_text(NO_PUNCTUATION, ChunkRule.with_first(1.0))  # it binds here
        st = model.stream(NO_PUNCTUATION, **kw)
        list(st)
        assert st.text_chunks == want
        st = model.stream(iter(NO_PUNCTUATION[i:i + 4] for i in range(0, len(NO_PUNCTUATION), 4)), **kw)
        list(st)
        assert st.text_chunks == want
    st = model.stream(NO_PUNCTUATION, rule=ChunkRule.with_first(1.0), **kw)
    list(st)
    assert st.text_chunks == split_text(NO_PUNCTUATION, ChunkRule.with_first(1.0))


@pytest.mark.parametrize("mode", _auto_quick(["auto", "clone"]))
def test_at_its_exact_setting_the_budget_changes_no_code(model, clone_prompt, rate, mode):
    """first_audio_seconds=0 on a machine slow enough for the budget to bind: the stream's
    chunks and codes are those of the rule without a budget (as before it existed), alone and
    packed with a running request."""
    rate(1e8)
    kw = dict(profile="live", num_step=4, first_chunk_steps=2, seed=8,
              **_voice(mode, clone_prompt), **GREEDY)
    live_rule = ChunkRule.with_first(1.0, None, LIVE_PROFILE["first_chunk_max_seconds"])
    before = _streamed(model, NO_PUNCTUATION, rule=live_rule, **kw)
    assert _plan(model, **_voice(mode, clone_prompt)).first_budget(1e8) < 2.0  # it would bind
    alone = _streamed(model, NO_PUNCTUATION, first_audio_seconds=0.0, **kw)
    assert alone[2] == before[2]
    for a, b in zip(alone[1], before[1], strict=True):
        np.testing.assert_array_equal(a, b)
    long = PassSpec("Hi.", 10, "en", None, None, None, 0, GenerationConfig(num_step=MAX_LONG_STEPS))
    seen, started = [], threading.Event()

    def trace(ids):
        seen.append(set(ids))
        started.set()
    model.engine.trace = trace
    ticket = model.engine.submit([long])
    try:
        assert started.wait(60), "the long request never ran"
        packed = _streamed(model, NO_PUNCTUATION, first_audio_seconds=0.0, **kw)
        assert not ticket.done(), "the long request ended before the stream: lengthen it"
    finally:
        ticket.cancel()
        model.engine.trace = None
    assert any(len(ids) > 1 and ticket.id in ids for ids in seen)  # it ran packed
    assert packed[2] == before[2]
    for a, b in zip(packed[1], before[1], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_the_step_profiles_combine_with_the_int8_precision(model):
    """Precision is chosen at load, the step profile per call: at int8 the profiles keep their
    identities (fast with both knobs at 1 is exact bit for bit; live at exact's chunking streams
    what fast streams), since activation scales are per token and a row's targets alone
    quantise as in the whole row. And int8 changes the numbers (the test can fail)."""
    m8 = OmniVoice.from_pretrained(CKPT, precision="int8", profile="live")
    assert (m8.precision, m8.profile) == ("int8", "live")
    kw = dict(num_step=6, seed=5)
    exact = m8.synthesize(TEXT, profile="exact", **kw)[0]
    ones = m8.synthesize(TEXT, profile="fast", prefix_refresh=1, uncond_every=1, **kw)[0]
    np.testing.assert_array_equal(ones.codes, exact.codes)
    np.testing.assert_array_equal(ones.audio, exact.audio)
    assert not np.array_equal(m8.synthesize(TEXT, profile="fast", **kw)[0].codes, exact.codes)
    assert not np.array_equal(model.synthesize(TEXT, **kw)[0].codes, exact.codes)
    fast = _streamed(m8, STREAM_TEXT, profile="fast", num_step=4, seed=5)
    live = _streamed(m8, STREAM_TEXT, **LIVE_AT_EXACT, num_step=4, seed=5)  # the model's default
    assert live[2] == fast[2]
    for a, b in zip(live[1], fast[1], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(live[0], fast[0])
