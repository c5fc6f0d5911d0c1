"""Streaming synthesis: audio starts after the first clause, the rest is made while it plays.

OmniVoice writes a whole utterance at once (no autoregression), so one pass's audio cannot
start before the pass ends; the way to an early first audio is to cut the text and pipeline the
pieces:

    text (a string, or fragments as they arrive)
      -> planner.TextChunker   a short first chunk, then sentence-sized ones
      -> worker thread         chunk k: a pass on the model's engine -> codes [C, T_k] -> windowed
                               decode (W frames, then 4 W at a time) -> per-chunk silence trim ->
                               the incremental join (audio/streamjoin.py)
      -> consumer              iterates float32 pieces while the worker makes chunk k+1

Each call is checked and resolved like `generate` (request.build_requests); the voice follows
the long-form rule (a voice prompt conditions every chunk, else chunk 0's codes are the later
chunks' reference) and chunk k draws from child k of the seed. For an early first audio,
GenerationConfig.first_chunk_seconds moves chunk 0's cut and first_chunk_steps gives chunk 0
its own step count (the live profile sets both). The pieces joined equal the
offline composition of the same passes (one-shot decodes, trimmed whole, joined by
`postprocess.join_chunks`) up to float32 rounding; text in fragments gives the same audio as
the whole string, bit for bit. The chunking rule, the post-processing a stream can and cannot
do like `generate`, and what it holds back are in docs/streaming.md.

Cancellation: leaving the loop (break, `close()`, the stream being collected) stops the worker
within one unmasking step or decode window and joins it. Errors in the worker or the text source
are re-raised by the consumer's `next()` as the same object.

Dimension legend:
    C  codebooks (8)    T  frames of one chunk (25 per second)    W  frames of a first decode window
    L  samples (24 000 per second)
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Iterator

import numpy as np

from .audio.streamjoin import SilenceTrimmer, StreamJoiner, peak_gain, rms_gain
from .engine import PassResult
from .errors import AudioError, CancelledError, InputError
from .machinery import warmup
from .model import cost, higgs_codec
from .model import tokenizer as tok_mod
from .model.config import GenerationConfig
from .request import build_requests
from .text import limits, planner
from .text.planner import ChunkRule, TextChunker, split_text

__all__ = ["SpeechStream", "stream"]

# Text tokens per frame of speech, for a chunk 0 budget (the text is in the pass's rows): about
# 5 BPE tokens per second of English speech, a little over what it takes.
TEXT_TOKENS_PER_FRAME = 0.2

# ---------------------------------------------------------------------------------------------
# The plan: chunk texts -> codes, one voice throughout
# ---------------------------------------------------------------------------------------------


class _Plan:
    """One stream's request (request.build_requests: every argument checked once, as for
    `generate`), plus what its chunks settle as they run: the pace, chunk 0's pass and, in
    auto / design mode, chunk 0's codes (the later chunks' voice reference).

    The limits of `generate` apply: frames and memory of every pass (each chunk is one pass)
    and the output of the whole call. With the whole text known they are checked before
    anything runs (`expect`); text that arrives in fragments is checked chunk by chunk."""

    def __init__(self, model, *, language, ref_audio, ref_text, voice_clone_prompt, instruct,
                 duration, speed, seed, on_step, generation_config, gen_kwargs, whole_text,
                 normalize_text=False):
        for name, v in (("language", language), ("instruct", instruct), ("speed", speed),
                        ("duration", duration), ("voice_clone_prompt", voice_clone_prompt)):
            if isinstance(v, (list, tuple)):
                raise InputError(f"{name}: stream() speaks one text; give one value (for several "
                                 "texts, call it once per text)")
        if isinstance(ref_audio, list):
            raise InputError("ref_audio: stream() speaks one text; give one reference clip")
        if duration is not None and whole_text is None:
            raise InputError("duration needs the whole text in advance; with streamed text input "
                             "use speed= instead")
        # encode=False: the clip is encoded on the worker thread (prepare_voice), not here.
        self.request, = build_requests(
            model, None, language=language, ref_audio=ref_audio, ref_text=ref_text,
            voice_clone_prompt=voice_clone_prompt, instruct=instruct, duration=duration,
            speed=speed, seed=seed, on_step=on_step, generation_config=generation_config,
            normalize_text=normalize_text, gen_kwargs=gen_kwargs, encode=False)
        self.gen = self.request.gen
        self.model, self.on_step, self.whole_text = model, on_step, whole_text
        self.instruct = self.request.instruct_for(None)  # re-resolved on chunk 0's text
        self.pace = 1.0 if self.request.speed is None else self.request.speed
        self.first: planner.ChunkPlan | None = None  # chunk 0's pass: the later chunks' voice
        self.ref0_codes: np.ndarray | None = None  # its codes, in auto / design mode
        self.total_frames = 0  # frames generated and paused so far, against MAX_DURATION_S
        self.paused = False  # a pause mark came after a chunk: later chunks are sized own_pace
        self._chunks: list | None = None  # all chunks (and Pauses), when the whole text is known
        if self.request.voice_ready:
            self._fix_pace()

    @property
    def encode_s(self) -> float:
        return self.request.encode_s

    def _fix_pace(self) -> None:
        """With `duration`, every chunk is spoken at estimate / requested frames."""
        r = self.request
        if r.duration is not None:
            self.pace, _ = planner.plan_pace(r.normalize(self.whole_text), r.ref_text, r.ref_frames,
                                             duration=r.duration, frame_rate=self.model.frame_rate)

    def expect(self, chunks: list) -> None:
        """The whole text's chunks (and Pauses) are known: check every pass now (or, when a
        reference clip still has to be encoded, right after that)."""
        self._chunks = [c if isinstance(c, planner.Pause) else self.request.normalize(c)
                        for c in chunks]
        if not any(isinstance(c, str) for c in self._chunks):
            raise _nothing_to_say(bool(self._chunks))
        if self.request.voice_ready:
            self._check_chunks()

    def _check_chunks(self) -> None:
        texts = [c for c in self._chunks if isinstance(c, str)]
        instruct = self.request.instruct_for(texts[0]) if texts else self.instruct
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
            specs.append(self.request.spec(plan, len(specs), instruct, first=0, streamed=True))
        self.model.engine.check(specs)  # every pass's rows and memory, before any runs

    def _chunk_plan(self, chunk: str, first, own_pace: bool = False) -> planner.ChunkPlan:
        r = self.request
        plan = planner.plan_chunk(chunk, first, r.ref_text, r.ref_frames, self.pace,
                                  own_pace=own_pace)
        limits.check_pass_frames(plan.frames, chunk, self.model.frame_rate)
        return plan

    def add_pause(self, seconds: float) -> int:
        """A pause mark came: counted against the output limit; its length in samples."""
        self.total_frames = limits.check_total_frames(
            self.total_frames + planner.pause_frames_of(seconds), self.model.frame_rate)
        self.paused = self.paused or self.first is not None
        return planner.pause_samples(seconds, self.model.sampling_rate)

    def prepare_voice(self) -> None:
        """Encode the reference clip (slow: done in the worker) and fix the pace for duration."""
        if not self.request.voice_ready:
            self.request.encode_voice(self.model)
            self._fix_pace()
            if self._chunks is not None:
                self._check_chunks()

    def first_budget(self, rate: float) -> float:
        """Chunk 0's budget (GenerationConfig.first_audio_seconds) as the chunker measures
        speech: the most frames whose unmasking at `rate` FLOP/s fits it (cost.frames_within:
        chunk 0's own steps, this voice's prompt, the text growing with the speech), then the
        most speech that plan_chunk sizes within those frames (planner.seconds_within)."""
        r, model, gen = self.request, self.model, self.gen.for_chunk(0)
        ref_text, ref = r.ref_text, None
        if r.prompt is not None:
            ref = r.prompt.ref_audio_tokens  # [C, R]
        elif r.clip is not None:  # not encoded yet: its length from the clip, roughly
            ref_text = r.clip[1]
            ref = np.zeros((model.config.num_audio_codebook,
                            _clip_frames(r.clip[0], model.frame_rate)), np.int64)  # [C, R]
        item = tok_mod.prepare_item(model.tokenizer, model.config, "a", 1, ref_text=ref_text,
                                    ref_codes=ref, lang=r.language, instruct=self.instruct,
                                    denoise=gen.denoise)
        prompt = item.input_ids.shape[1] - 2  # less the one target frame and the one text token
        most = planner.ChunkRule().max_seconds
        frames = cost.frames_within(model.config, gen, prompt, gen.guidance_scale != 0,
                                    gen.first_audio_seconds * rate,
                                    int(most * model.frame_rate), TEXT_TOKENS_PER_FRAME)
        return planner.seconds_within(frames, r.ref_text, r.ref_frames, self.pace, most)

    def gain(self, first_window: np.ndarray):
        prompt = self.request.prompt
        return rms_gain(prompt.ref_rms) if prompt is not None else peak_gain(first_window)

    def codes(self, k: int, chunk: str, on_step=None, shared=None) -> PassResult:
        """Unmask chunk k on the model's engine: its codes [C, T_k] and fill steps [C, T_k]."""
        chunk = limits.validate_text(self.request.normalize(limits.validate_text(chunk)))
        if k == 0:
            # As generate() decides an instruct's language from its text, here from chunk 0's
            # (the only text known when a stream starts), for whole and fragmented input alike.
            self.instruct = self.request.instruct_for(chunk)
        plan = self._chunk_plan(chunk, self.first, self.paused)
        self.total_frames = limits.check_total_frames(self.total_frames + plan.frames,
                                                      self.model.frame_rate)
        spec = self.request.spec(plan, k, self.instruct, chunk0_codes=self.ref0_codes,
                                 streamed=True)  # chunk 0: its own steps (first_chunk_steps)
        ticket = self.model.engine.submit([spec], on_step or self.on_step)
        if shared is not None:
            shared.ticket = ticket  # so that closing the stream cancels it at once
            if shared.cancel.is_set():
                ticket.cancel()
        try:
            result, = ticket.result()
        except BaseException:
            ticket.cancel()
            raise
        if k == 0:
            self.first = plan
            if self.request.prompt is None:
                self.ref0_codes = result.codes
        return result


def _clip_frames(audio, frame_rate: int) -> int:
    """Frames of a reference clip not encoded yet ((waveform, rate) or a file), 0 when it
    cannot be told now (encoding it then says what is wrong)."""
    try:
        if isinstance(audio, tuple):
            seconds = len(audio[0]) / audio[1]
        else:
            import soundfile

            seconds = soundfile.info(str(audio)).duration
    except Exception:  # noqa: BLE001 - any unreadable clip is refused when it is encoded
        return 0
    return int(seconds * frame_rate)


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


LATER_WINDOWS = 4  # windows after a chunk's first are this many times longer


def decode_windows(codec, codes: np.ndarray, first: int) -> Iterator[np.ndarray]:
    """Decode codes [C, T] progressively: frames [0, first), then `LATER_WINDOWS * first` frames
    at a time, each with the decoder's receptive field of context (`higgs_codec.decode_stream`)."""
    return higgs_codec.decode_stream(codec.params, codes, codec.cfg, chunk_frames=first,
                                   later_frames=LATER_WINDOWS * first)


def _check_window(decode_frames) -> int:
    if isinstance(decode_frames, bool) or not isinstance(decode_frames, int) or decode_frames < 1:
        raise InputError(f"decode_frames must be a positive integer, got {decode_frames!r}")
    return decode_frames


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
        self.stats: list[dict] = []                   # per chunk: text, frames, codes, timings
        self.pauses: list[int | None] = [None]        # per chunk boundary: pause samples or None
        self.ticket = None                            # the current chunk's engine.Ticket

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
    if shared.ticket is not None:
        shared.ticket.cancel()  # the chunk on the engine leaves before its next step
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
                n = plan.add_pause(chunk.seconds)
                shared.pauses[-1] = (shared.pauses[-1] or 0) + n
                shared.put_audio(joiner, joiner.pause(n))
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
            stat = {"text": chunk, "frames": int(codes.shape[1]), "codes": codes,
                    "start_s": t0 - t_start, "unmask_s": t1 - t0}
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
            shared.pauses.append(None)
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
    text, frames, codes, unmask_s, decode_s, start_s from the stream's start), `pause_samples`,
    `first_audio_s`
    (seconds from the call to the first piece handed out) and `chunk_first_s` (per chunk, seconds
    from the call to the first piece containing its audio). `close()` (or leaving a `with` block,
    or dropping the stream) stops the work.
    """

    def __init__(self, shared: _Shared, sample_rate: int, t0: float):
        self._shared = shared
        self.sample_rate = sample_rate
        self._t0 = t0
        self._done = False
        # whether it ran to its natural end, and whether it was closed: `close` tells a door
        # whether it cut the stream short, once (two threads may close one stream)
        self._ended = self._closed = False
        self._close_lock = threading.Lock()
        self.first_audio_s: float | None = None
        self.chunk_first_s: list[float] = []
        self._finalizer = weakref.finalize(self, _shutdown, shared)

    @property
    def text_chunks(self) -> list[str]:
        return [s["text"] for s in self._shared.stats]

    @property
    def chunk_stats(self) -> list[dict]:
        return list(self._shared.stats)

    @property
    def pause_samples(self) -> list[int | None]:
        """Per chunk boundary (before chunk 0, between chunks, after the last): the samples of
        silence that pause marks put there, or None."""
        return list(self._shared.pauses)

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
        if item[0] != "error":
            with self._close_lock:  # (an "end" that close() put there is not the natural end)
                self._ended = not self._closed
        self._finalizer()  # joins the threads: nothing left running after the last piece
        if item[0] == "error":
            raise item[1]
        raise StopIteration

    def close(self) -> bool:
        """Stop generating; returns once the worker thread has ended. True when this call cut
        the stream short: the first close of a stream that had not run to its end (one that
        failed, or was still speaking)."""
        with self._close_lock:
            cut = not self._closed and not self._ended
            self._closed = True
        self._done = True
        self._shared.out.put(("end",))  # wakes a consumer blocked in another thread
        self._finalizer()
        return cut

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
    unused: `rule` decides the chunks, by default `ChunkRule.with_first(first_chunk_seconds, ...,
    first_chunk_max_seconds)`, and a `rule` given wins over both; chunk 0 is unmasked in
    `first_chunk_steps` steps when that is set; `duration` needs a string). on_step is called
    from the worker thread. decode_frames: frames of each chunk's first decode window (W; later windows are
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
    if rule is None:  # the default rule, chunk 0 cut where the settings say (2 s unless live)
        budget = None
        if plan.gen.first_audio_seconds:  # and within what this machine makes in time
            budget = plan.first_budget(warmup.rate(model))
        rule = ChunkRule.with_first(plan.gen.first_chunk_seconds, budget,
                                    plan.gen.first_chunk_max_seconds)
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


