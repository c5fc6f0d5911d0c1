"""Streaming synthesis on the tiny checkpoint: the streamed pieces, joined, are the offline
composition of the same passes (`offline_twin`: one-shot decodes joined by `join_offline`) to
float32 rounding (STREAM_ATOL); text fragments
split exactly as the whole text and give the same audio bit for bit; early exits leave no threads;
worker errors reach the consumer as the same object; `omnicore say --stream` / `--raw`.
Incremental text and audio helpers are property-tested against their one-shot forms."""

import gc
import io
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore import OmniVoice
from omnicore.audio import postprocess, streamjoin, writers
from omnicore.audio.postprocess import fade_and_pad, join_chunks
from omnicore.text import planner
from omnicore import streaming as S
from omnicore.apps.cli import main
from omnicore.errors import AudioError, InputError
from omnicore.model.config import GenerationConfig, resolve_generation_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
SPEECH = str(ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav")
SR = 24000

PARAGRAPH = ("Hello there, this is a small test of streaming speech. The second sentence is here, "
             "and it goes on for a while! Is this the third one? Finally, the fourth sentence ends "
             "the paragraph.")
# Small chunks so that the tiny model makes three of them quickly.
RULE = planner.ChunkRule(first_seconds=1.0, seconds=2.0)
FAST = dict(num_step=3, seed=7)
# Stream vs synchronous generation: the same codes, but the stream decodes in overlapping windows,
# and BLAS kernels such as OpenBLAS's Haswell sgemm round a GEMM row differently with the GEMM's
# row count, so samples differ by rounding. Measured max |diff| <= 2.4e-6 (Haswell), 1.4e-6
# (Katmai), 0 (Sandybridge, Nehalem) on samples of peak ~0.5; the bound is a third of an int16 step.
STREAM_ATOL = 1e-5
WINDOW_TOL = 2e-5  # decode windows vs one-shot, relative: test_codec.CHUNK_TOL (measured <= 2.6e-6 here)


def _live_stream_threads():
    return [t for t in threading.enumerate() if t.name.startswith("omnicore-stream")]


def _wait_no_threads(timeout=10.0):
    end = time.monotonic() + timeout
    while _live_stream_threads() and time.monotonic() < end:
        time.sleep(0.02)
    return _live_stream_threads()


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


def trim_chunk(wav: np.ndarray, lead_ms: int = 100, trail_ms: int = 100) -> np.ndarray:
    """`SilenceTrimmer` on a whole chunk at once."""
    t = streamjoin.SilenceTrimmer(SR, lead_ms, trail_ms)
    return np.concatenate([t.push(wav), t.end()])


def join_offline(chunks, gain, *, postprocess: bool, pad_duration: float, fade_duration: float,
                 pauses=None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """What a stream's pieces must join into, from the library's one-shot functions: each
    decoded chunk trimmed whole, `join_chunks`, the gain, `fade_and_pad`.
    Returns the audio and the (start, length) of every pause's zeros in it. `pauses`: see
    `join_chunks` (None: no pause marks); a chunk's edge next to a pause keeps none of its quiet."""
    marks = list(pauses) if pauses is not None else [None] * (len(chunks) + 1)
    pieces = [trim_chunk(c, 0 if marks[i] is not None else 100, 0 if marks[i + 1] is not None else 100)
              if postprocess else np.asarray(c, np.float32) for i, c in enumerate(chunks)]
    wav, spans = join_chunks(pieces, marks, SR, silence_duration=streamjoin.CROSS_FADE_S)
    if wav.shape[-1] == 0:
        return wav, []
    pad = int(pad_duration * SR)
    return (fade_and_pad(np.asarray(gain(wav), np.float32), pad_duration, fade_duration, SR),
            [(start + pad, n) for start, n in spans])


def offline_twin(model, text, *, decode_frames: int = 25, **kw):
    """A stream of `text` run to its end, and its synchronous twin: the same passes' codes,
    each chunk decoded in ONE shot (`codec.decode`), trimmed whole and joined by
    `join_offline` with the gain the stream uses (the voice prompt's loudness, else the peak of
    chunk 0's first `decode_frames` frames)."""
    st = model.stream(text, decode_frames=decode_frames, **kw)
    streamed = np.concatenate(list(st))
    codes = [s["codes"] for s in st.chunk_stats]
    wavs = [model.codec.decode(c) for c in codes]  # [C, T_k] -> [960 * T_k]
    gen = resolve_generation_config(None, {k: v for k, v in kw.items()
                                           if k in GenerationConfig.__dataclass_fields__})
    prompt = kw.get("voice_clone_prompt")
    gain = (streamjoin.rms_gain(prompt.ref_rms) if prompt is not None
            else streamjoin.peak_gain(wavs[0][:decode_frames * model.codec.hop_length]))
    assert model.sampling_rate == SR
    audio, spans = join_offline(
        wavs, gain, postprocess=gen.postprocess_output, pad_duration=gen.pad_duration,
        fade_duration=gen.fade_duration, pauses=st.pause_samples)
    return SimpleNamespace(audio=audio, streamed=streamed, codes=np.concatenate(codes, axis=1),
                           text_chunks=[s["text"] for s in st.chunk_stats], pauses=tuple(spans))


@pytest.fixture(scope="module")
def offline(model):
    return offline_twin(model, PARAGRAPH, rule=RULE, **FAST)


# ---------------------------------------------------------------------------------------------
# Text chunking
# ---------------------------------------------------------------------------------------------


def test_default_rule_first_chunk_is_a_clause_then_sentences():
    text = ("Well, I think so. The meeting starts at 3.5 p.m. with Dr. Smith and the team, "
            "e.g. the new engineers. After that we will review the plan, talk about the budget, "
            "and decide what comes next for everyone involved. Thanks!")
    chunks = planner.split_text(text)
    # "Well," and "Well, I think so." are under 2 s of speech: chunk 0 runs on to the next clause.
    assert chunks[0] == "Well, I think so. The meeting starts at 3.5 p.m. with Dr. Smith and the team,"
    assert "3.5" in chunks[0] and "Dr. Smith" in chunks[0]  # no split inside numbers / after titles
    assert chunks[1].startswith("e.g. the new engineers.")
    assert " ".join(chunks) == " ".join(text.split())  # nothing lost, nothing reordered
    assert len(chunks) == 3 and chunks[2] == "Thanks!"
    # Later chunks end at sentence ends (>= 5 s each, or the end of the text), not at commas.
    assert all(c[-1] in ".!?" for c in chunks[1:])


def test_chinese_full_width_marks_split_without_spaces():
    text = "你好，今天天气很好。我们一起去公园散步吧！然后回家吃饭，休息一下。"
    chunks = planner.split_text(text, planner.ChunkRule(first_seconds=0.5, seconds=1.0))
    assert "".join(chunks) == text and len(chunks) >= 2
    assert chunks[0].endswith(("，", "。"))


def test_unpunctuated_text_is_cut_at_word_breaks():
    text = " ".join(["word"] * 200)
    chunks = planner.split_text(text)
    assert len(chunks) > 3 and " ".join(chunks) == text
    assert len(chunks[0]) < len(chunks[1])  # chunk 0 at ~6 s, later ones at ~15 s


_TEXT_ALPHABET = st.sampled_from(list("abc de.,!?;:\"') 3…。，\n"))


@settings(max_examples=60, deadline=None)
@given(st.text(_TEXT_ALPHABET, min_size=0, max_size=300), st.lists(st.integers(1, 9), max_size=80),
       st.floats(0.0, 3.0), st.floats(0.0, 6.0))
def test_fragments_split_exactly_as_the_whole_text(text, cuts, first, later):
    rule = planner.ChunkRule(first_seconds=first, first_max_seconds=first * 3, seconds=later,
                       clause_seconds=later * 2, max_seconds=later * 3)
    whole = planner.split_text(text, rule)
    chunker, got, i = planner.TextChunker(rule), [], 0
    for n in cuts:
        got += chunker.feed(text[i:i + n])
        i += n
    got += chunker.feed(text[i:]) + chunker.flush()
    assert got == whole
    assert all(c and c == c.strip() for c in got)
    assert "".join(got).replace(" ", "").replace("\n", "") == "".join(text.split())


def test_chunker_rejects_non_text():
    with pytest.raises(InputError):
        planner.TextChunker().feed(b"bytes")
    with pytest.raises(InputError):
        planner.ChunkRule(first_seconds=-1)


# ---------------------------------------------------------------------------------------------
# Incremental audio helpers against their one-shot forms
# ---------------------------------------------------------------------------------------------


def _tone(seconds, amp=0.3, seed=0):
    rng = np.random.default_rng(seed)
    return (amp * rng.standard_normal(int(seconds * SR))).astype(np.float32)


def _quiet(seconds):
    return np.full(int(seconds * SR), 1e-4, np.float32)


def test_silence_trimmer_rules():
    wav = np.concatenate([_quiet(0.5), _tone(0.4), _quiet(1.5), _tone(0.3, seed=1), _quiet(0.3),
                          _tone(0.2, seed=2), _quiet(0.8)])
    out = trim_chunk(wav)
    # lead 0.5 -> 0.1, pause 1.5 -> 2 x 0.5, pause 0.3 kept, tail 0.8 -> 0.1
    assert len(out) == int(SR * (0.1 + 0.4 + 1.0 + 0.3 + 0.3 + 0.2 + 0.1))
    assert np.array_equal(out[int(0.1 * SR):int(0.5 * SR)], wav[int(0.5 * SR):int(0.9 * SR)])
    assert len(trim_chunk(_quiet(1.0))) == 0
    loud = _tone(1.0)
    assert np.array_equal(trim_chunk(loud), loud)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 200)), min_size=1, max_size=12),
       st.lists(st.integers(1, 9000), min_size=1, max_size=30))
def test_silence_trimmer_is_independent_of_how_samples_arrive(segments, cuts):
    wav = np.concatenate([(_tone(n / 100, seed=n) if loud else _quiet(n / 100)) for loud, n in segments])
    t, parts, i = streamjoin.SilenceTrimmer(SR), [], 0
    for n in cuts:
        parts.append(t.push(wav[i:i + n]))
        i += n
    parts += [t.push(wav[i:]), t.end()]
    assert np.array_equal(np.concatenate(parts), trim_chunk(wav))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30000), min_size=1, max_size=5), st.integers(1, 12000),
       st.booleans(), st.booleans(), st.sampled_from([0.0, 0.05, 0.1]), st.sampled_from([0.0, 0.1]),
       st.lists(st.one_of(st.none(), st.lists(st.integers(0, 5000), min_size=1, max_size=2)),
                min_size=6, max_size=6))
def test_joiner_equals_join_chunks_and_fade_and_pad(lengths, piece, postprocess, with_rms, fade,
                                                     pad, marks):
    """The stream's joiner (pieces of any size, pause marks between, before and after chunks,
    one or two marks in a row) releases exactly the offline join, bit for bit."""
    rng = np.random.default_rng(sum(lengths) + piece)
    chunks = [np.concatenate([_quiet(0.2), (0.2 * rng.standard_normal(n)).astype(np.float32), _quiet(0.3)])
              if n else np.zeros(0, np.float32) for n in lengths]
    marks = marks[:len(chunks) + 1]  # per boundary: None, or the pauses of one or two marks
    gain = S.rms_gain(0.03) if with_rms else S.peak_gain(chunks[0][:piece])
    pauses = [None if m is None else sum(m) for m in marks]
    want, spans = join_offline(chunks, gain, postprocess=postprocess, pad_duration=pad,
                                 fade_duration=fade, pauses=pauses)
    if all(p is None for p in pauses):  # without marks: the reference's cross-fade
        np.testing.assert_array_equal(want, join_offline(
            chunks, gain, postprocess=postprocess, pad_duration=pad, fade_duration=fade)[0])
    j, out = streamjoin.StreamJoiner(SR, pad, fade), []
    j.set_gain(gain)
    for k, c in enumerate(chunks):
        for n in marks[k] or ():
            out.append(j.pause(n))
        out.append(j.keep_tail())
        j.start_chunk()
        tr = streamjoin.SilenceTrimmer(SR, lead_ms=0 if marks[k] else 100) if postprocess else None
        for i in range(0, len(c), piece):
            x = c[i:i + piece]
            out.append(j.push(tr.push(x) if tr else x))
        tail = None
        if tr:
            body, tail = tr.end_parts()
            out.append(j.push(body))
        out.append(j.end_chunk(tail))
    for n in marks[-1] or ():
        out.append(j.pause(n))
    out.append(j.finish())
    got = np.concatenate(out)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    for start, n in spans:  # every pause is exactly its zeros
        assert not want[start:start + n].any()
    if len(want):  # (nothing at all, not even a pause's zeros: no audio, no spans)
        assert [n for _, n in spans] == [p for p in pauses if p is not None]


def test_join_offline_is_the_reference_post_processing_without_trim():
    a, b = _tone(0.5), _tone(0.7, seed=3)
    gain = S.rms_gain(0.05)
    want = postprocess.postprocess_output([a, b], 0.05, postprocess=False)
    assert np.array_equal(join_offline([a, b], gain, postprocess=False, pad_duration=0.1,
                                         fade_duration=0.1)[0], want)


# ---------------------------------------------------------------------------------------------
# The stream on the tiny model
# ---------------------------------------------------------------------------------------------


def _close(got, want):
    """Same length, and every sample within STREAM_ATOL."""
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got.astype(np.float64) - want).max() <= STREAM_ATOL


@pytest.mark.parametrize("frames", [1, 25, 26, 137])
def test_decode_windows_match_the_one_shot_decode(model, frames):
    codes = np.random.default_rng(frames).integers(0, 1024, (8, frames))
    pieces = list(S.decode_windows(model.codec, codes, 25))
    assert [len(p) // 960 for p in pieces][:2] == [min(25, frames), min(100, frames - 25)][:len(pieces)]
    got, want = np.concatenate(pieces), model.codec.decode(codes)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= WINDOW_TOL * np.abs(want).max()


@pytest.fixture(scope="module")
def streamed(model):
    """The stream of PARAGRAPH and its pieces."""
    st_ = model.stream(PARAGRAPH, rule=RULE, **FAST)
    return st_, list(st_)


def test_stream_matches_the_offline_composition(streamed, offline):
    st_, pieces = streamed
    got = np.concatenate(pieces)
    assert st_.text_chunks == offline.text_chunks == planner.split_text(PARAGRAPH, RULE)
    assert len(offline.text_chunks) == 3
    _close(got, offline.audio)
    assert np.std(got) > 1e-3 and len(np.unique(offline.codes[0])) > 5  # a non-trivial case
    # Progressive decode: the first piece is the first 25-frame window (plus the leading pad,
    # minus the 100 ms a join may still fade), well before chunk 0 is fully decoded.
    frames0 = st_.chunk_stats[0]["frames"]
    assert frames0 > 25 and len(pieces[0]) == 25 * 960
    assert len(st_.chunk_first_s) == 3 and st_.first_audio_s == st_.chunk_first_s[0]
    assert not _wait_no_threads()


def test_same_seed_same_stream_other_seed_differs(model):
    text = "Seeds decide the sampled tokens."
    a, b, c = (np.concatenate(list(model.stream(text, num_step=2, seed=s))) for s in (7, 7, 8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_text_fragments_give_the_same_audio(model, streamed):
    def tokens():  # an LLM-like source: a few characters at a time
        rng = np.random.default_rng(0)
        i = 0
        while i < len(PARAGRAPH):
            n = int(rng.integers(1, 6))
            yield PARAGRAPH[i:i + n]
            i += n

    st_ = model.stream(tokens(), rule=RULE, **FAST)
    got = np.concatenate(list(st_))
    whole, pieces = streamed
    assert st_.text_chunks == whole.text_chunks
    # the same chunks make the same codes and the same decode windows: equal bit for bit
    assert np.array_equal(got, np.concatenate(pieces))
    assert not _wait_no_threads()


def test_clone_stream_matches_synchronous_and_uses_prompt_loudness(model):
    prompt = model.create_voice_clone_prompt(SPEECH, "The quick brown fox jumps over the lazy dog.")
    text = "Cloned voices stay the same, chunk after chunk. Here is the second sentence of it."
    kw = dict(voice_clone_prompt=prompt, rule=RULE, num_step=2, seed=1, postprocess_output=False)
    want = offline_twin(model, text, **kw)
    got = np.concatenate(list(model.stream(text, **kw)))
    assert len(want.text_chunks) == 2
    _close(got, want.audio)


def test_single_chunk_without_trim_equals_generate(model):
    # One chunk, a decode window covering it (so the gain is the whole chunk's peak), no silence
    # trim: the stream is exactly the ordinary generate().
    text = "Just one short sentence."
    want = model.generate(text, num_step=3, seed=5, postprocess_output=False)[0]
    got = np.concatenate(list(model.stream(text, num_step=3, seed=5, postprocess_output=False,
                                           decode_frames=10_000)))
    assert np.array_equal(got, want)


PAUSED = ("Hello there, this is a small test of pauses. [pause:700ms] The second part comes "
          "after a pause! <break time='1s'/> And a third.")


def test_pauses_in_a_stream_match_synchronous_generation(model):
    """Pause marks in streamed text come out as their exact silence, in order: the stream is
    the synchronous chunked generation with the same marks (to rounding), the same for text
    arriving in fragments that cut through the marks."""
    items = planner.split_text(PAUSED, RULE)
    assert [round(x.seconds, 3) for x in items if isinstance(x, planner.Pause)] == [0.7, 1.0]
    want = offline_twin(model, PAUSED, rule=RULE, **FAST)
    assert want.text_chunks == [x for x in items if isinstance(x, str)]
    assert [n for _, n in want.pauses] == [16800, 24000]
    for start, n in want.pauses:
        assert not want.audio[start:start + n].any()
        assert want.audio[start - 1] != 0 and want.audio[start + n] != 0
    got = np.concatenate(list(model.stream(PAUSED, rule=RULE, **FAST)))
    _close(got, want.audio)
    frags = (PAUSED[i:i + 4] for i in range(0, len(PAUSED), 4))  # "[pa" "use:" ...
    assert np.array_equal(np.concatenate(list(model.stream(frags, rule=RULE, **FAST))), got)
    assert not _wait_no_threads()


def test_paused_stream_equals_generate(model):
    # One chunk per segment, one decode window per chunk, the prompt's fixed loudness and no
    # silence trim: what generate() makes of the same pauses, sample for sample.
    prompt = model.create_voice_clone_prompt(SPEECH, "The quick brown fox jumps over the lazy dog.")
    text = "Hello there. [pause:1s] How are you today? [pause:0.25s]"
    kw = dict(voice_clone_prompt=prompt, num_step=3, seed=2, postprocess_output=False)
    want = model.synthesize(text, **kw)[0]
    st_ = model.stream(text, decode_frames=10_000, **kw)
    got = np.concatenate(list(st_))
    assert st_.text_chunks == want.text_chunks == ["Hello there.", "How are you today?"]
    _close(got, want.audio)
    assert [n for _, n in want.pauses] == [24000, 6000]


def test_break_close_and_garbage_collection_stop_the_worker(model):
    steps = []
    on_step = lambda s, n: steps.append(s)  # noqa: E731
    for piece in model.stream(PARAGRAPH, rule=RULE, on_step=on_step, **FAST):
        break
    gc.collect()
    assert not _wait_no_threads()
    n = len(steps)
    time.sleep(0.3)
    assert len(steps) == n  # nothing keeps computing after the threads are gone

    st_ = model.stream(PARAGRAPH, rule=RULE, **FAST)
    next(st_)
    assert st_.close() is True  # it cut the stream short: the doors count that
    assert not _live_stream_threads()  # close() returns after the worker has ended
    with pytest.raises(StopIteration):
        next(st_)
    assert st_.close() is False  # once

    st_ = model.stream("Hi.", **FAST)
    list(st_)
    assert st_.close() is False  # it ran to its end: nothing was cut

    st_ = model.stream(PARAGRAPH, rule=RULE, **FAST)  # never iterated
    del st_
    gc.collect()
    assert not _wait_no_threads()


def test_cancel_closes_a_generator_text_source(model):
    closed = threading.Event()

    def source():
        try:
            yield "The first sentence is long enough to start speaking now. "
            while True:
                yield "more "
                time.sleep(0.01)
        finally:
            closed.set()

    with model.stream(source(), rule=RULE, **FAST) as st_:
        next(st_)
    assert not _wait_no_threads() and closed.wait(5)


def test_lookahead_bounds_work_ahead_of_the_consumer(model):
    st_ = model.stream(PARAGRAPH, rule=RULE, lookahead=1, **FAST)
    next(st_)  # the consumer holds chunk 0's first piece and stops reading
    end = time.monotonic() + 60
    while time.monotonic() < end and not (len(st_.chunk_stats) == 2 and "decode_s" in st_.chunk_stats[1]):
        time.sleep(0.02)
    time.sleep(0.3)
    assert len(st_.chunk_stats) == 2  # chunk 1 made in advance; chunk 2 waits for the consumer
    rest = list(st_)
    assert len(st_.chunk_stats) == 3 and rest


class _SourceBroke(RuntimeError):
    pass


def test_worker_errors_reach_the_consumer(model):
    err = _SourceBroke("upstream failed")

    def source():
        yield "The first sentence is long enough to be spoken. "
        raise err

    with pytest.raises(_SourceBroke) as info:
        list(model.stream(source(), rule=RULE, **FAST))
    assert info.value is err

    def bad():
        yield "Hello there. "
        yield 42

    with pytest.raises(InputError, match="str fragments"):
        list(model.stream(bad(), **FAST))
    st_ = model.stream("Hello there.", ref_audio="/no/such/ref.wav", ref_text="hi", **FAST)
    with pytest.raises(AudioError, match="such"):
        next(st_)
    with pytest.raises(InputError, match="empty"):
        list(model.stream(iter(["  ", "\n"]), **FAST))
    assert not _wait_no_threads()


def test_bad_arguments_fail_at_the_call(model):
    with pytest.raises(InputError, match="unknown"):
        model.stream("Hi.", bogus=1)
    with pytest.raises(InputError, match="duration"):
        model.stream(iter(["Hi."]), duration=2.0)
    with pytest.raises(InputError, match="one text"):
        model.stream("Hi.", language=["en", "fr"])
    with pytest.raises(InputError, match="empty"):
        model.stream("   ")
    with pytest.raises(InputError):
        model.stream(12)
    with pytest.raises(InputError, match="decode_frames"):
        model.stream("Hi.", decode_frames=0)
    with pytest.raises(InputError, match="robot"):
        model.stream("Hi.", instruct="robot voice")
    assert not _live_stream_threads()


def test_duration_sets_the_pace_of_every_chunk(model):
    # The pace (whole-text estimate / requested frames) divides every chunk's estimate, as the
    # long-form path does (later chunks take chunk 0, already paced, as their yardstick).
    short = offline_twin(model, PARAGRAPH, rule=RULE, duration=3.0, num_step=1, seed=0)
    long = offline_twin(model, PARAGRAPH, rule=RULE, duration=6.0, num_step=1, seed=0)
    assert short.text_chunks == long.text_chunks
    assert long.codes.shape[1] > 1.5 * short.codes.shape[1]


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


CLI = ["--model", str(TINY), "--steps", "3", "--seed", "7", "-q"]
SAY = "Hello there, this is a streaming test. Here is the second sentence of it."


def test_cli_stream_wav_raw_and_stdin(model, tmp_path, monkeypatch, capsysbinary):
    want = offline_twin(model, SAY, num_step=3, seed=7).audio
    out = tmp_path / "s.wav"
    assert main(["say", SAY, "--stream", "-o", str(out), *CLI]) == 0
    wav16, sr = sf.read(out, dtype="int16")
    assert sr == SR and len(wav16) == len(want)
    # within STREAM_ATOL before quantising, so a sample can cross an int16 step, never two
    assert np.abs(wav16.astype(np.int32) - writers.to_pcm16(want)).max() <= 1

    capsysbinary.readouterr()
    assert main(["say", SAY, "--raw", *CLI]) == 0
    raw = np.frombuffer(capsysbinary.readouterr().out, "<i2")
    assert np.array_equal(raw, wav16)  # stdout PCM == the WAV's samples

    monkeypatch.setattr(sys, "stdin", io.StringIO(SAY))
    out2 = tmp_path / "stdin.wav"
    assert main(["say", "--stream", "-o", str(out2), *CLI]) == 0
    assert np.array_equal(sf.read(out2, dtype="int16")[0], wav16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.wav", "stdin.wav"]  # no temp files


def test_cli_stream_errors_leave_no_file(tmp_path, capsys):
    assert main(["say", SAY, "--stream", *CLI]) == 2  # stdout needs --raw
    assert "--raw" in capsys.readouterr().err
    assert main(["say", SAY, "--stream", "-o", str(tmp_path / "x.wav"), "--ref-audio", "/no/such.wav",
                 "--ref-text", "x", *CLI]) == 2
    assert "such.wav" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_file_writer_is_atomic(tmp_path):
    path = tmp_path / "a.wav"
    with pytest.raises(RuntimeError):
        with writers.AudioFileWriter(path) as w:
            w.write(_tone(0.2))
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    with writers.AudioFileWriter(path) as w:
        w.write(_tone(0.2))
        w.write(_tone(0.1, seed=1))
    data, sr = sf.read(path, dtype="float32")
    assert sr == SR and len(data) == int(0.3 * SR)
    with pytest.raises(AudioError):
        writers.AudioFileWriter(tmp_path / "a.xyz")
    assert [p.name for p in tmp_path.iterdir()] == ["a.wav"]
