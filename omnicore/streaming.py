"""Streaming synthesis: audio starts after the first clause, the rest is made while it plays.

This module is the streaming sink: a reader thread (text fragments -> chunks), a worker thread
that submits each chunk's pass to the model's engine (`engine.Engine`, shared with every other
caller) and decodes it progressively. The pieces it uses live with their kind: the chunking rule
(`text.TextChunker`, `text.plan_chunk`), the incremental post-processing and the writers
(`audio.SilenceTrimmer`, `audio.StreamJoiner`, `audio.AudioFileWriter`); they are re-exported
here.

OmniVoice is non-autoregressive: it writes a whole utterance at once, so the audio of one
generation pass cannot start before that pass is over. The way to a short time-to-first-audio
is to split the text and pipeline the pieces:

    text (string, or fragments as they arrive)
      -> TextChunker         short first chunk, then sentence-sized chunks (the rule below)
      -> worker thread       chunk k: unmask -> codes [C, T_k] -> windowed decode (W frames, then
                             4 W at a time, with overlap, so the first samples come before the
                             chunk is decoded) -> per-chunk silence trim -> incremental join
      -> consumer            iterates float32 pieces at 24 kHz while the worker makes chunk k+1

The concatenated pieces equal `generate_chunks(...)` (the same plan run synchronously, each
chunk decoded in one shot and joined with `audio.cross_fade_chunks` / `audio.fade_and_pad`) up
to float32 rounding: the same codes and post-processing, but the windows' decode GEMMs have
other row counts, which some BLAS kernels (OpenBLAS's Haswell sgemm) round differently. The
tests check every sample within 1e-5 (a third of an int16 step, so 16-bit output is within one
step; a 10 ms block within rounding of the trimmer's -50 dBFS threshold could still be cut
differently). Text arriving in fragments gives the same audio as the whole string, bit for bit.

Chunking rule (`ChunkRule`), measured in seconds of speech estimated the way the model sizes
its output (the reference's character weights, "Nice to meet you." = 1 s):
    chunk 0   ends at the first sentence OR clause end (. ! ? ; , : ... and full-width forms)
              once it holds >= 2 s of speech (or at a word break once >= 6 s: unpunctuated text)
    chunk k   ends at the first sentence end once >= 5 s, at a clause end once >= 10 s, or at a
              word break once >= 15 s (the reference's long-form chunk size)
A mark ends a sentence only when whitespace follows it (so "3.5", "a,b", "Dr." and "p.m." do
not) or, for full-width marks, when any character follows; the end of the input ends the last
chunk.
Each decision needs only the text read so far, which is why text arriving in fragments (LLM
tokens) splits exactly as the whole string does.
A first chunk under ~2 s would sound choppy and, in auto / design mode, make a poor voice
reference for the rest (why these sizes: benchmarks/README.md, design notes).

Voice: with a voice prompt (ref_audio / voice_clone_prompt) every chunk is conditioned on it;
otherwise chunk 0 is generated freely and its codes + text are the reference of later chunks,
as the long-form path does. Chunk k is unmasked with child k of `seed` (`engine.pass_seed`),
as chunk k of `generate_chunks` is: chunks draw independent noise, reproducibly.

Post-processing (the reference normalises the whole utterance, which a stream cannot see):
    silence   (postprocess_output) per chunk, by `SilenceTrimmer`: 10 ms blocks under -50 dBFS;
              leading / trailing quiet kept to 100 ms, inner pauses to 500 ms on each side of the
              cut (a pause of up to 1 s is kept whole). Same thresholds as the reference's
              `remove_silence`, but decidable as samples arrive and on float samples, not pydub's
              int16 1-ms grid.
    joins     `audio.cross_fade_chunks` semantics: 100 ms fade-out, 100 ms of zeros, 100 ms fade-in.
    loudness  with a voice prompt: the reference's fixed `ref_rms` scale (exact). Without one:
              the peak of the FIRST decoded window (the first W frames of chunk 0, before
              trimming) is scaled to 0.5 and that gain is kept for the whole stream, so later
              louder passages may exceed 0.5 (headroom to 1.0: 6 dB); writers clip at 1.0.
    edges     `audio.fade_and_pad`: fade in / out and 0.1 s of zeros at both ends.
    pauses    a pause mark ([pause:1.5s], <break time="500ms"/>; `text.PauseScanner`) ends the
              chunk before it and comes out, in order, as exactly its zeros (`StreamJoiner.pause`):
              the edges next to it keep none of their quiet and ramp over 10 ms instead of the
              cross-fade (`audio.join_chunks`), as `generate` does for the same marks. Chunks
              after a pause are sized at the text's own pace (`text.plan_chunk`, own_pace).
The stream holds back only what these rules leave undecided: a chunk's quiet tail (until sound
resumes or the chunk ends), the last 100 ms of the utterance (the next join or the final fade
touches them) and, at the very start, the first 0.2 s (the fade-in is min(0.1 s, half the
length) long); and a chunk's trailing quiet (at most 100 ms) until the next piece of text says
whether a pause mark follows it (whole text: at once; text in fragments: when the next chunk
or mark is complete).

Cancellation: leaving the loop (break, `close()`, the stream being garbage-collected) stops the
worker within one unmasking step or decode window and joins it. Exceptions in the worker (or in
the text source) are re-raised by the consumer's `next()` as the same object.

Dimension legend:
    C  codebooks (8)    T  frames of one chunk (25 per second)    W  frames of a first decode window
    L  samples (24 000 per second)                                 B  samples per 10 ms block
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Iterator

import numpy as np

from .audio.streamjoin import SilenceTrimmer, StreamJoiner, join_offline, peak_gain, rms_gain
from .engine import PassSpec, pass_seed
from .errors import AudioError, CancelledError, InputError
from .model import codec as codec_mod
from .model.config import GenerationConfig, resolve_generation_config, validate_seed
from .text import frontend, limits, normalize, planner
from .text.planner import ChunkRule, TextChunker, split_text
from .voice import Synthesis

__all__ = ["SpeechStream", "stream", "generate_chunks"]

# ---------------------------------------------------------------------------------------------
# The plan: chunk texts -> codes, one voice throughout
# ---------------------------------------------------------------------------------------------


class _Plan:
    """Everything resolved up front, plus chunk 0's result once it exists (the voice reference
    in auto / design mode). Used by both the streamed and the synchronous path.

    The limits of `generate` apply (text.py): pad/fade lengths, seeds, the voice prompt's
    values, frames and memory of every pass (each chunk is one pass) and the output of the
    whole call. With the whole text known they are checked before anything runs (`expect`);
    text that arrives in fragments is checked chunk by chunk."""

    def __init__(self, model, *, language, ref_audio, ref_text, voice_clone_prompt, instruct,
                 duration, speed, seed, on_step, generation_config, gen_kwargs, whole_text,
                 normalize_text=False):
        self.gen = resolve_generation_config(generation_config, gen_kwargs)
        for name, v in (("language", language), ("instruct", instruct), ("speed", speed),
                        ("duration", duration), ("voice_clone_prompt", voice_clone_prompt)):
            if isinstance(v, (list, tuple)):
                raise InputError(f"{name}: stream() speaks one text; give one value (for several "
                                 "texts, call it once per text)")
        if isinstance(ref_audio, list):
            raise InputError("ref_audio: stream() speaks one text; give one reference clip")
        if voice_clone_prompt is not None:
            voice_clone_prompt = model.check_prompt(voice_clone_prompt)
        elif ref_audio is not None:
            if ref_text is None or (isinstance(ref_text, str) and not ref_text.strip()):
                raise InputError("ref_text is required with ref_audio: pass the transcript of the "
                                 "reference audio")
            limits.validate_ref_text(ref_text)
        if on_step is not None and not callable(on_step):
            raise InputError(f"on_step must be a function (step, num_steps) or None, got "
                             f"{type(on_step).__name__}")
        limits.validate_edges(self.gen.pad_duration, self.gen.fade_duration)
        self.model = model
        self.language = frontend.resolve_language(language)
        self._instruct_raw = instruct
        self.instruct = frontend.resolve_instruct(instruct, None)  # validate now; re-resolved on chunk 0
        self.speed = limits.validate_speed(speed)
        self.duration = limits.validate_duration(duration)
        if self.duration is not None and whole_text is None:
            raise InputError("duration needs the whole text in advance; with streamed text input "
                             "use speed= instead")
        # normalize_text: each chunk is normalised as it is checked and spoken (the chunker
        # reads the text as written, so fragments and the whole string split alike).
        self._normalize = normalize.chunk_normalizer(normalize_text, self.language)
        self.whole_text = whole_text
        self.seed, self.on_step = validate_seed(seed, 1)[0], on_step
        self.prompt = voice_clone_prompt
        self._ref_audio, self._ref_text = ref_audio, ref_text
        self.pace = 1.0 if self.speed is None else self.speed
        self.first: planner.ChunkPlan | None = None  # chunk 0's pass: the later chunks' voice
        self.ref0_codes: np.ndarray | None = None  # its codes, in auto / design mode
        self.encode_s = 0.0
        self.total_frames = 0  # frames generated and paused so far, against text.MAX_DURATION_S
        self.paused = False  # a pause mark came after a chunk: later chunks are sized own_pace
        self._chunks: list | None = None  # all chunks (and Pauses), when the whole text is known
        self._voice_ready = self._ref_audio is None or self.prompt is not None
        if self._voice_ready:
            self._fix_pace()

    def _fix_pace(self) -> None:
        """With `duration`, every chunk is spoken at estimate / requested frames."""
        if self.duration is not None:
            p = self.prompt
            self.pace, _ = planner.plan_pace(
                self._normalize(self.whole_text), p.ref_text if p else None,
                p.ref_audio_tokens.shape[1] if p else None, duration=self.duration,
                frame_rate=self.model.frame_rate)

    def expect(self, chunks: list) -> None:
        """The whole text's chunks (and Pauses) are known: check every pass now (or, when a
        reference clip still has to be encoded, right after that)."""
        self._chunks = [c if isinstance(c, planner.Pause) else self._normalize(c) for c in chunks]
        if not any(isinstance(c, str) for c in self._chunks):
            raise _nothing_to_say(bool(self._chunks))
        if self._voice_ready:
            self._check_chunks()

    def _check_chunks(self) -> None:
        texts = [c for c in self._chunks if isinstance(c, str)]
        instruct = self.instruct
        if self._instruct_raw is not None and texts:  # as codes() resolves it on chunk 0
            instruct = frontend.resolve_instruct(self._instruct_raw, texts[0])
        first, total, specs, paused = None, 0, [], False
        for item in self._chunks:
            if isinstance(item, planner.Pause):
                total = limits.check_total_frames(total + planner.pause_frames_of(item.seconds),
                                                    self.model.frame_rate)
                paused = paused or first is not None
                continue
            plan = self._chunk_plan(item, first, paused)
            first = first or plan
            total = limits.check_total_frames(total + plan.frames, self.model.frame_rate)
            specs.append(self._spec(plan, instruct, len(specs),
                                    after=0 if plan.reference == "chunk0" else None))
        self.model.engine.check(specs)  # every pass's rows and memory, before any runs

    def _chunk_plan(self, chunk: str, first, own_pace: bool = False) -> planner.ChunkPlan:
        p = self.prompt
        plan = planner.plan_chunk(chunk, first, p.ref_text if p else None,
                                   p.ref_audio_tokens.shape[1] if p else None, self.pace,
                                   own_pace=own_pace)
        limits.check_pass_frames(plan.frames, chunk, self.model.frame_rate)
        return plan

    def add_pause(self, seconds: float) -> int:
        """A pause mark came: counted against the output limit; its length in samples."""
        self.total_frames = limits.check_total_frames(
            self.total_frames + planner.pause_frames_of(seconds), self.model.frame_rate)
        self.paused = self.paused or self.first is not None
        return planner.pause_samples(seconds, self.model.sampling_rate)

    def _spec(self, plan: planner.ChunkPlan, instruct, k: int, after=None,
              ref_codes=None) -> PassSpec:
        """Chunk k's pass; it draws from child k of the seed (engine.pass_seed), as chunk k of
        the synchronous path does."""
        if plan.reference == "prompt":
            ref_codes = self.prompt.ref_audio_tokens
        return PassSpec(plan.text, plan.frames, self.language, instruct, plan.ref_text,
                        ref_codes, pass_seed(self.seed, k), self.gen, after)

    def prepare_voice(self) -> None:
        """Encode the reference clip (slow: done in the worker) and fix the pace for duration."""
        if not self._voice_ready:
            t0 = time.perf_counter()
            self.prompt = self.model.create_voice_clone_prompt(self._ref_audio, self._ref_text,
                                                               self.gen.preprocess_prompt)
            self.encode_s = time.perf_counter() - t0
            self._voice_ready = True
            self._fix_pace()
            if self._chunks is not None:
                self._check_chunks()

    def gain(self, first_window: np.ndarray):
        return rms_gain(self.prompt.ref_rms) if self.prompt is not None else peak_gain(first_window)

    def codes(self, k: int, chunk: str, on_step=None, shared=None) -> tuple[np.ndarray, np.ndarray]:
        """Unmask chunk k on the model's engine: codes [C, T_k] and fill steps [C, T_k]."""
        chunk = limits.validate_text(self._normalize(limits.validate_text(chunk)))
        if k == 0 and self._instruct_raw is not None:
            # As generate() decides an instruct's language from its text, here from chunk 0's
            # (the only text known when a stream starts), for whole and fragmented input alike.
            self.instruct = frontend.resolve_instruct(self._instruct_raw, chunk)
        plan = self._chunk_plan(chunk, self.first, self.paused)
        self.total_frames = limits.check_total_frames(self.total_frames + plan.frames,
                                                        self.model.frame_rate)
        spec = self._spec(plan, self.instruct, k, ref_codes=self.ref0_codes)
        request = self.model.engine.submit([spec], on_step or self.on_step)
        if shared is not None:
            shared.request = request  # so that closing the stream cancels it at once
            if shared.cancel.is_set():
                request.cancel()
        try:
            (codes, steps), = request.result()
        except BaseException:
            request.cancel()
            raise
        if k == 0:
            self.first = plan
            if self.prompt is None:
                self.ref0_codes = codes
        return codes, steps


def _nothing_to_say(had_pauses: bool) -> InputError:
    if had_pauses:
        return InputError("text has only pause marks and nothing to speak: put words between them.")
    return InputError("text is empty (or only whitespace): pass the words to speak.")


def _text_source(text, rule: ChunkRule | None):
    """(whole text or None, iterator of fragments)."""
    if isinstance(text, str):
        limits.validate_text(text)
        return text, iter([text])
    if isinstance(text, (bytes, bytearray)):
        raise InputError("text must be str (decode bytes first), or an iterable of str fragments")
    try:
        return None, iter(text)
    except TypeError:
        raise InputError(f"text must be a string or an iterable of strings, got {type(text).__name__}") from None


def _chunks_of(fragments: Iterator[str], rule: ChunkRule | None) -> Iterator[str]:
    chunker = TextChunker(rule)
    for frag in fragments:
        yield from chunker.feed(frag)
    yield from chunker.flush()


LATER_WINDOWS = 4  # windows after a chunk's first are this many times longer


def decode_windows(codec, codes: np.ndarray, first: int) -> Iterator[np.ndarray]:
    """Decode codes [C, T] progressively: frames [0, first), then `LATER_WINDOWS * first` frames
    at a time, each with the decoder's receptive field of context (`codec.decode_stream`)."""
    return codec_mod.decode_stream(codec.params, codes, codec.cfg, chunk_frames=first,
                                   later_frames=LATER_WINDOWS * first)


def _check_window(decode_frames) -> int:
    if isinstance(decode_frames, bool) or not isinstance(decode_frames, int) or decode_frames < 1:
        raise InputError(f"decode_frames must be a positive integer, got {decode_frames!r}")
    return decode_frames


def generate_chunks(model, text, *, language=None, ref_audio=None, ref_text=None,
                    voice_clone_prompt=None, instruct=None, duration=None, speed=None, seed=None,
                    on_step=None, generation_config: GenerationConfig | None = None,
                    rule: ChunkRule | None = None, decode_frames: int = 25,
                    normalize_text: bool = False, **gen_kwargs):
    """The non-streamed twin of `stream`: the same chunks, the same per-chunk generation (chunk
    k from child k of the seed, the same voice reference), run synchronously; each chunk decoded in ONE shot
    (`codec.decode`), trimmed whole (`trim_chunk`), joined with `audio.cross_fade_chunks`, scaled
    (fixed gain, see module docstring) and finished with `audio.fade_and_pad`.
    `decode_frames` only sets the window whose peak fixes the gain. Returns a `Synthesis`.
    """
    decode_frames = _check_window(decode_frames)
    whole, fragments = _text_source(text, rule)
    plan = _Plan(model, language=language, ref_audio=ref_audio, ref_text=ref_text,
                 voice_clone_prompt=voice_clone_prompt, instruct=instruct, duration=duration,
                 speed=speed, seed=seed, on_step=on_step, generation_config=generation_config,
                 gen_kwargs=gen_kwargs, whole_text=whole, normalize_text=normalize_text)
    if whole is not None:
        plan.expect(split_text(whole, rule))  # every pass checked before the first runs
    t0 = time.perf_counter()
    plan.prepare_voice()
    chunks, codes, steps = [], [], []
    marks: list[int | None] = [None]  # per chunk boundary: a pause's samples, or no mark
    items = list(_chunks_of(fragments, rule))
    for item in items:
        if isinstance(item, planner.Pause):
            marks[-1] = (marks[-1] or 0) + plan.add_pause(item.seconds)
            continue
        c, s = plan.codes(len(chunks), item)
        chunks.append(item)
        codes.append(c)
        steps.append(s)
        marks.append(None)
    if not chunks:
        raise _nothing_to_say(bool(items))
    t1 = time.perf_counter()
    wavs = [model.codec.decode(c) for c in codes]  # [C, T_k] -> [960 * T_k]
    t2 = time.perf_counter()
    gain = plan.gain(wavs[0][:decode_frames * model.codec.hop_length])
    wav, spans = join_offline(wavs, gain, postprocess=plan.gen.postprocess_output,
                              pad_duration=plan.gen.pad_duration,
                              fade_duration=plan.gen.fade_duration, sr=model.sampling_rate,
                              pauses=marks)
    t3 = time.perf_counter()
    timings = {"unmask": t1 - t0 - plan.encode_s, "decode": t2 - t1, "postprocess": t3 - t2}
    if plan.encode_s:
        timings["encode"] = plan.encode_s
    return Synthesis(audio=np.ascontiguousarray(wav, np.float32), codes=np.concatenate(codes, axis=1),
                     fill_steps=np.concatenate(steps, axis=1).astype(np.int16),
                     num_steps=plan.gen.num_step, timings=timings, text_chunks=chunks,
                     sample_rate=model.sampling_rate, pauses=tuple(spans))


# ---------------------------------------------------------------------------------------------
# The stream: a worker thread (and a text-reader thread for fragment input)
# ---------------------------------------------------------------------------------------------


class _Cancelled(Exception):
    """Raised inside the worker to unwind when the consumer has gone."""


_END = object()


class _Shared:
    """What the consumer and the threads share (never the SpeechStream itself, so that dropping
    the stream lets it be collected and its finaliser stop the threads)."""

    def __init__(self, lookahead: int):
        self.cancel = threading.Event()
        self.cond = threading.Condition()
        self.out: queue.Queue = queue.Queue()        # ("audio", chunk, samples) / ("end",) / ("error", exc)
        self.texts: queue.Queue = queue.Queue()      # chunk texts, _END, or ("error", exc)
        self.lookahead = lookahead
        self.emitted = 0                              # audio pieces put on `out`
        self.taken = 0                                # ... and taken by the consumer
        self.marks: list[int] = []                    # `emitted` after each chunk ended
        self.threads: list[threading.Thread] = []
        self.stats: list[dict] = []                   # per chunk: text, frames, timings
        self.request = None                           # the engine request of the current chunk

    def check(self) -> None:
        if self.cancel.is_set():
            raise _Cancelled

    def put_audio(self, joiner: "StreamJoiner", x: np.ndarray) -> None:
        if len(x):
            with self.cond:
                self.emitted += 1
            self.out.put(("audio", joiner.released_chunk, x))

    def wait_turn(self, k: int) -> None:
        """Start chunk k only once the consumer has taken all audio up to chunk k-1-lookahead."""
        j = k - 1 - self.lookahead
        with self.cond:
            while j >= 0 and self.taken < self.marks[j] and not self.cancel.is_set():
                self.cond.wait()
        self.check()


def _shutdown(shared: _Shared) -> None:
    """Stop and join the threads (idempotent; the stream's finaliser)."""
    shared.cancel.set()
    if shared.request is not None:
        shared.request.cancel()  # the chunk on the engine leaves before its next step
    with shared.cond:
        shared.cond.notify_all()
    shared.texts.put(_END)  # wakes a worker waiting for text
    me = threading.current_thread()
    for t in shared.threads:
        if t is not me and t.name.startswith("omnicore-stream-worker"):
            t.join()
    for t in shared.threads:
        if t is not me and t.name.startswith("omnicore-stream-reader"):
            # A reader blocked inside the caller's text source cannot be interrupted: it ends
            # when the source yields its next fragment (or ends). Don't hang on it.
            t.join(timeout=1.0)


def _reader(shared: _Shared, fragments: Iterator[str], rule: ChunkRule | None) -> None:
    try:
        chunker = TextChunker(rule)
        for frag in fragments:
            if shared.cancel.is_set():
                break
            for chunk in chunker.feed(frag):
                shared.texts.put(chunk)
        else:
            for chunk in chunker.flush():
                shared.texts.put(chunk)
            shared.texts.put(_END)
    except BaseException as exc:  # surfaces in the consumer, same object
        shared.texts.put(("error", exc))
    finally:
        if shared.cancel.is_set():
            close = getattr(fragments, "close", None)  # let a generator source clean up
            if close is not None:
                try:
                    close()
                except Exception:
                    pass


def _next_text(shared: _Shared):
    item = shared.texts.get()
    shared.check()
    if isinstance(item, tuple):
        raise item[1]
    return item


def _worker(shared: _Shared, model, plan: _Plan, decode_frames: int) -> None:
    try:
        codec = model.codec
        t_start = time.perf_counter()
        plan.prepare_voice()
        joiner = StreamJoiner(model.sampling_rate, plan.gen.pad_duration, plan.gen.fade_duration)
        user_on_step = plan.on_step

        def on_step(step: int, total: int) -> None:
            if user_on_step is not None:
                user_on_step(step, total)
            shared.check()

        k, after_pause, had_pauses = 0, False, False
        while True:
            chunk = _next_text(shared)
            if chunk is _END:
                break
            if isinstance(chunk, planner.Pause):  # silence, in order, with its edges ramped
                shared.put_audio(joiner, joiner.pause(plan.add_pause(chunk.seconds)))
                after_pause = had_pauses = True
                continue
            # A chunk, not a pause, follows the last one: its trailing quiet goes out now.
            shared.put_audio(joiner, joiner.keep_tail())
            shared.wait_turn(k)
            t0 = time.perf_counter()
            try:
                codes, _ = plan.codes(k, chunk, on_step, shared)
            except CancelledError:
                shared.check()  # closed by the consumer: unwind quietly
                raise
            t1 = time.perf_counter()
            stat = {"text": chunk, "frames": int(codes.shape[1]), "start_s": t0 - t_start,
                    "unmask_s": t1 - t0}
            shared.stats.append(stat)
            # an edge next to a pause keeps none of its quiet: the pause is the silence there
            trimmer = (SilenceTrimmer(model.sampling_rate, lead_ms=0 if after_pause else 100)
                       if plan.gen.postprocess_output else None)
            after_pause = False
            joiner.start_chunk()
            for wav in decode_windows(codec, codes, decode_frames):
                shared.check()
                if not np.isfinite(wav).all():
                    raise AudioError("decoded audio contains NaN or infinite samples (a decoding fault); "
                                     "nothing to save")
                if joiner.gain is None:
                    joiner.set_gain(plan.gain(wav))
                shared.put_audio(joiner, joiner.push(trimmer.push(wav) if trimmer else wav))
            tail = None
            if trimmer is not None:
                body, tail = trimmer.end_parts()
                shared.put_audio(joiner, joiner.push(body))
            shared.put_audio(joiner, joiner.end_chunk(tail))
            stat["decode_s"] = time.perf_counter() - t1
            with shared.cond:
                shared.marks.append(shared.emitted)
            k += 1
        if not joiner.chunk_starts:
            raise _nothing_to_say(had_pauses)
        shared.put_audio(joiner, joiner.finish())
        shared.out.put(("end",))
    except _Cancelled:
        shared.out.put(("end",))
    except BaseException as exc:
        shared.out.put(("error", exc))


class SpeechStream:
    """Iterator of float32 audio pieces (24 kHz) of one utterance; see `stream`.

    Attributes filled as it runs: `text_chunks` (chunk texts started), `chunk_stats` (per chunk:
    text, frames, unmask_s, decode_s, start_s from the stream's start), `first_audio_s`
    (seconds from the call to the first piece handed out) and `chunk_first_s` (per chunk, seconds
    from the call to the first piece containing its audio). `close()` (or leaving a `with` block,
    or dropping the stream) stops the work.
    """

    def __init__(self, shared: _Shared, sample_rate: int, t0: float):
        self._shared = shared
        self.sample_rate = sample_rate
        self._t0 = t0
        self._done = False
        self.first_audio_s: float | None = None
        self.chunk_first_s: list[float] = []
        self._finalizer = weakref.finalize(self, _shutdown, shared)

    @property
    def text_chunks(self) -> list[str]:
        return [s["text"] for s in self._shared.stats]

    @property
    def chunk_stats(self) -> list[dict]:
        return list(self._shared.stats)

    def __iter__(self) -> "SpeechStream":
        return self

    def __next__(self) -> np.ndarray:
        if self._done:
            raise StopIteration
        item = self._shared.out.get()
        if item[0] == "audio":
            _, k, x = item
            now = time.perf_counter() - self._t0
            if self.first_audio_s is None:
                self.first_audio_s = now
            while len(self.chunk_first_s) <= k:
                self.chunk_first_s.append(now)
            with self._shared.cond:
                self._shared.taken += 1
                self._shared.cond.notify_all()
            return x
        self._done = True
        self._finalizer()  # joins the threads: nothing left running after the last piece
        if item[0] == "error":
            raise item[1]
        raise StopIteration

    def close(self) -> None:
        """Stop generating; returns once the worker thread has ended."""
        self._done = True
        self._shared.out.put(("end",))  # wakes a consumer blocked in another thread
        self._finalizer()

    def __enter__(self) -> "SpeechStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stream(model, text, *, language=None, ref_audio=None, ref_text=None, voice_clone_prompt=None,
           instruct=None, duration=None, speed=None, seed=None, on_step=None,
           generation_config: GenerationConfig | None = None, rule: ChunkRule | None = None,
           decode_frames: int = 25, lookahead: int = 1, normalize_text: bool = False,
           **gen_kwargs) -> SpeechStream:
    """Speak `text` as a stream of float32 audio pieces at `model.sampling_rate`.

    text: a string, or an iterable of str fragments (e.g. LLM tokens), read as they arrive in a
    reader thread; each chunk starts as soon as its end is confirmed. Same keyword arguments as
    `generate` (one text only; `audio_chunk_duration` / `audio_chunk_threshold` are accepted and
    unused: `rule` decides the chunks; `duration` needs a string). on_step is called from the
    worker thread. decode_frames: frames of each chunk's first decode window (W; later windows are
    4 W: see `decode_windows`); the first window's peak also sets the gain without a voice
    prompt. lookahead: chunks the worker may
    finish beyond the one being consumed (1 = chunk k+1 is made while chunk k is consumed).
    normalize_text: as in `generate`, but chunk by chunk (chunks are cut from the text as written).
    Argument errors raise here; errors met while generating are raised by `next()`.
    """
    decode_frames = _check_window(decode_frames)
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
        raise InputError(f"lookahead must be an integer >= 0, got {lookahead!r}")
    if rule is not None and not isinstance(rule, ChunkRule):
        raise InputError("rule must be a ChunkRule")
    whole, fragments = _text_source(text, rule)
    plan = _Plan(model, language=language, ref_audio=ref_audio, ref_text=ref_text,
                 voice_clone_prompt=voice_clone_prompt, instruct=instruct, duration=duration,
                 speed=speed, seed=seed, on_step=on_step, generation_config=generation_config,
                 gen_kwargs=gen_kwargs, whole_text=whole, normalize_text=normalize_text)
    t0 = time.perf_counter()
    shared = _Shared(lookahead)
    if whole is not None:
        chunks = split_text(whole, rule)
        plan.expect(chunks)  # argument errors raise here, before the worker starts
        for chunk in chunks:
            shared.texts.put(chunk)
        shared.texts.put(_END)
    else:
        shared.threads.append(threading.Thread(target=_reader, args=(shared, fragments, rule),
                                               name="omnicore-stream-reader", daemon=True))
    shared.threads.append(threading.Thread(target=_worker, args=(shared, model, plan, decode_frames),
                                           name="omnicore-stream-worker", daemon=True))
    for t in shared.threads:
        t.start()
    return SpeechStream(shared, model.sampling_rate, t0)


