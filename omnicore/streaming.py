"""Streaming synthesis: audio starts after the first clause, the rest is made while it plays.

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
Why not a shorter first chunk: the model plans a chunk's duration and intonation as one complete
utterance, so a 1-2 word chunk comes out as an isolated, rushed phrase with a falling end and
then a join gap (choppy "Well. I think."); in auto / voice-design mode the first chunk's audio
is also the voice reference of every later chunk, and a reference under ~2 s gives an unstable
voice and speaking rate (the reference's duration estimate treats outputs under 2 s (50
frames) specially for the same reason). Later chunks are longer because every pass re-reads the
voice reference (fixed cost per pass) and every join adds a 0.1 s pause.

Voice: with a voice prompt (ref_audio / voice_clone_prompt) every chunk is conditioned on it;
otherwise chunk 0 is generated freely and its codes + text are the reference of later chunks,
as the long-form path does. Each chunk is unmasked with the same `seed`.

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
The stream holds back only what these rules leave undecided: a chunk's quiet tail (until sound
resumes or the chunk ends), the last 100 ms of the utterance (the next join or the final fade
touches them) and, at the very start, the first 0.2 s (the fade-in is min(0.1 s, half the
length) long).

Cancellation: leaving the loop (break, `close()`, the stream being garbage-collected) stops the
worker within one unmasking step or decode window and joins it. Exceptions in the worker (or in
the text source) are re-raised by the consumer's `next()` as the same object.

Dimension legend:
    C  codebooks (8)    T  frames of one chunk (25 per second)    W  frames of a first decode window
    L  samples (24 000 per second)                                 B  samples per 10 ms block
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from . import audio, codec as codec_mod, normalize, text as text_mod
from .config import GenerationConfig
from .errors import AudioError, InputError

__all__ = ["ChunkRule", "TextChunker", "split_text", "SilenceTrimmer", "StreamJoiner",
           "SpeechStream", "stream", "generate_chunks"]

# ---------------------------------------------------------------------------------------------
# Text: where chunks end
# ---------------------------------------------------------------------------------------------

_SENTENCE_MARKS = frozenset(".!?;…。！？；")
_CLAUSE_MARKS = frozenset(",:，：、")
# Full-width marks end a sentence without a following space (CJK text has none).
_FULL_WIDTH = frozenset("。！？；，：、…")
# Closing quotes and brackets right after a mark stay with the chunk that the mark ends.
_CLOSERS = frozenset("\"'”’)]}»」』】》）")
# A "." after one of these words (or a single letter: an initial; or a word with another ".",
# as in "p.m." or "U.S.") ends no sentence.
_ABBREVIATIONS = frozenset(
    "mr. mrs. ms. dr. prof. sr. jr. st. mt. vs. etc. e.g. i.e. no. fig. approx. inc. ltd. "
    "co. corp. dept. gen. gov. sen. rep. capt. col. lt. sgt. jan. feb. mar. apr. jun. jul. "
    "aug. sep. sept. oct. nov. dec.".split())

# The model's duration yardstick: "Nice to meet you." lasts 25 frames = 1 s.
_SECONDS_PER_WEIGHT = 1.0 / text_mod.text_weight("Nice to meet you.")


@dataclass(frozen=True)
class ChunkRule:
    """Where streamed text is cut, in seconds of estimated speech (see the module docstring)."""

    first_seconds: float = 2.0        # chunk 0 ends at a sentence or clause end after this much
    first_max_seconds: float = 6.0    # ... or at a word break after this much
    seconds: float = 5.0              # later chunks end at a sentence end after this much
    clause_seconds: float = 10.0      # ... or at a clause end after this much
    max_seconds: float = 15.0         # ... or at a word break after this much

    def __post_init__(self):
        for name in ("first_seconds", "first_max_seconds", "seconds", "clause_seconds", "max_seconds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
                raise InputError(f"ChunkRule.{name} must be a finite number >= 0, got {v!r}")


class TextChunker:
    """Incremental splitter: `feed(fragment)` returns the chunks that fragment completed,
    `flush()` the rest at the end of the input. Splitting a string in one `feed` or in any
    fragmentation gives the same chunks (every decision looks only at text already read)."""

    def __init__(self, rule: ChunkRule | None = None):
        self.rule = rule or ChunkRule()
        self.count = 0          # chunks emitted so far
        self._chars: list[str] = []   # the current chunk (leading whitespace skipped)
        self._weight = 0.0      # its estimated weight (seconds / _SECONDS_PER_WEIGHT)
        self._word_start = 0    # index in _chars where the current whitespace-free run starts
        self._mark: str | None = None  # "sentence" / "clause": a mark run awaiting confirmation
        self._mark_wide = False  # the last mark of that run is full-width

    # -- decisions ----------------------------------------------------------------------------

    def _seconds(self) -> float:
        return self._weight * _SECONDS_PER_WEIGHT

    def _ends_at_mark(self, kind: str) -> bool:
        s, r = self._seconds(), self.rule
        if self.count == 0:
            return s >= r.first_seconds
        return s >= (r.seconds if kind == "sentence" else r.clause_seconds)

    def _ends_at_space(self) -> bool:
        r = self.rule
        return self._seconds() >= (r.first_max_seconds if self.count == 0 else r.max_seconds)

    def _emit(self, out: list[str]) -> None:
        chunk = "".join(self._chars).strip()
        self._chars, self._weight, self._word_start = [], 0.0, 0
        if chunk:
            out.append(chunk)
            self.count += 1

    # -- input --------------------------------------------------------------------------------

    def feed(self, fragment: str) -> list[str]:
        if not isinstance(fragment, str):
            raise InputError(f"streamed text must come as str fragments, got {type(fragment).__name__}")
        out: list[str] = []
        for ch in fragment:
            if self._mark is not None:
                if ch in _SENTENCE_MARKS or ch in _CLAUSE_MARKS or ch in _CLOSERS:
                    if ch in _SENTENCE_MARKS:  # "?!", "...": the strongest mark of a run counts
                        self._mark = "sentence"
                    if ch not in _CLOSERS:
                        self._mark_wide = ch in _FULL_WIDTH
                    self._append(ch)
                    continue
                kind, wide = self._mark, self._mark_wide
                self._mark = None
                if (ch.isspace() or wide) and self._ends_at_mark(kind):
                    self._emit(out)  # the mark run is confirmed: the chunk ends before `ch`
            if not self._chars and ch.isspace():
                continue  # a chunk never starts with whitespace
            if ch.isspace():
                if self._ends_at_space():
                    self._emit(out)
                    continue
                self._append(ch)
                self._word_start = len(self._chars)
                continue
            self._append(ch)
            if ch in _SENTENCE_MARKS or ch in _CLAUSE_MARKS:
                word = "".join(self._chars[self._word_start:]).lower()
                if ch == "." and (word in _ABBREVIATIONS or "." in word[:-1]
                                  or (len(word) == 2 and word[0].isalpha())):
                    continue  # "Dr." / "e.g." / "p.m." / "U.S." / an initial "J."
                self._mark = "sentence" if ch in _SENTENCE_MARKS else "clause"
                self._mark_wide = ch in _FULL_WIDTH
        return out

    def _append(self, ch: str) -> None:
        self._chars.append(ch)
        self._weight += text_mod.char_weight(ch)

    def flush(self) -> list[str]:
        """End of input: the rest is the last chunk (nothing when it is only whitespace)."""
        out: list[str] = []
        self._mark = None
        self._emit(out)
        return out


def split_text(text: str, rule: ChunkRule | None = None) -> list[str]:
    """The chunks `stream` speaks for `text` (whole or in fragments: the same list)."""
    chunker = TextChunker(rule)
    return chunker.feed(text) + chunker.flush()


# ---------------------------------------------------------------------------------------------
# Audio: per-chunk silence trim and the incremental join
# ---------------------------------------------------------------------------------------------

SILENCE_DB = -50.0           # the reference's remove_silence threshold
_QUIET_RMS = 10.0 ** (SILENCE_DB / 20.0)
BLOCK_MS = 10
CROSS_FADE_S = 0.3           # audio.cross_fade_chunks' default: fade-out, gap, fade-in of 0.1 s each


class SilenceTrimmer:
    """Trim one chunk's silences as its samples arrive (see the module docstring).

    `push(x)` returns the samples that are decided; `end()` the rest. Blocks are counted from
    the chunk start and partial blocks wait, so how the chunk is cut into pushes never matters.
    Output samples are the input samples (no requantisation).
    """

    def __init__(self, sr: int = audio.SAMPLE_RATE, lead_ms: int = 100, trail_ms: int = 100,
                 inner_ms: int = 500):
        self.block = sr * BLOCK_MS // 1000                       # B samples
        self.lead, self.trail, self.inner = lead_ms // BLOCK_MS, trail_ms // BLOCK_MS, inner_ms // BLOCK_MS
        self._head_keep = max(self.inner, self.trail)           # quiet blocks kept from a run's start
        self._tail_keep = max(self.inner, self.lead)            # ... and from its end
        self._partial = np.zeros(0, np.float32)
        self._quiet: list[np.ndarray] = []                       # the pending quiet run (capped)
        self._quiet_n = 0                                        # its true length in blocks
        self._sounding = False                                   # a loud block was seen

    def _on_block(self, blk: np.ndarray, quiet: bool, out: list[np.ndarray]) -> None:
        if quiet:
            self._quiet.append(blk)
            self._quiet_n += 1
            if len(self._quiet) > self._head_keep + self._tail_keep:
                del self._quiet[self._head_keep]  # middle of a long pause: never emitted
            return
        q, n = self._quiet, self._quiet_n
        if not self._sounding:
            out.extend(q[len(q) - min(self.lead, len(q)):])     # leading quiet -> last 100 ms
        elif n <= 2 * self.inner:
            out.extend(q)                                       # a short pause stays whole
        else:
            out.extend(q[:self.inner] + q[len(q) - self.inner:])  # a long pause -> 2 x 500 ms
        self._quiet, self._quiet_n, self._sounding = [], 0, True
        out.append(blk)

    def push(self, x: np.ndarray) -> np.ndarray:
        buf = np.concatenate([self._partial, np.asarray(x, np.float32)])
        out: list[np.ndarray] = []
        n_full = len(buf) // self.block * self.block
        blocks = buf[:n_full].reshape(-1, self.block)  # [L] -> [L/B, B]
        quiet = np.sqrt(np.mean(blocks * blocks, axis=1)) <= _QUIET_RMS  # [L/B]
        for blk, q in zip(blocks, quiet):
            self._on_block(blk, bool(q), out)
        self._partial = buf[n_full:]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def end(self) -> np.ndarray:
        out: list[np.ndarray] = []
        if len(self._partial):
            p = self._partial
            self._on_block(p, bool(np.sqrt(np.mean(p * p)) <= _QUIET_RMS), out)
            self._partial = np.zeros(0, np.float32)
        if self._sounding:
            out.extend(self._quiet[:self.trail])               # trailing quiet -> first 100 ms
        self._quiet, self._quiet_n = [], 0
        return np.concatenate(out) if out else np.zeros(0, np.float32)


def trim_chunk(wav: np.ndarray, sr: int = audio.SAMPLE_RATE) -> np.ndarray:
    """`SilenceTrimmer` on a whole chunk at once (the non-streamed path)."""
    t = SilenceTrimmer(sr)
    return np.concatenate([t.push(wav), t.end()])


def peak_gain(first_window: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Loudness without a voice prompt: the first window's peak goes to 0.5 (the reference's
    `peak_normalize` expression, with the peak fixed in advance)."""
    peak = np.abs(np.asarray(first_window, np.float32)).max() if len(first_window) else np.float32(0)
    if peak > 1e-6:
        return lambda x: x / peak * audio.PEAK_TARGET
    return lambda x: x


def rms_gain(ref_rms: float) -> Callable[[np.ndarray], np.ndarray]:
    """Loudness with a voice prompt: the reference's fixed scale (exactly `match_output_volume`)."""
    return lambda x: audio.match_output_volume(x, ref_rms)


class StreamJoiner:
    """Join trimmed chunks into the utterance incrementally, releasing each sample once no later
    input can change it. The released samples, concatenated, equal

        fade_and_pad(gain(cross_fade_chunks(chunks)), pad, fade)

    bit for bit. Call `start_chunk()`, `push(x)` per piece, `end_chunk()`, ..., then `finish()`;
    `set_gain(fn)` before the first sample can be released. `push`, `end_chunk` and `finish`
    return the float32 samples they release (often none).
    """

    def __init__(self, sr: int = audio.SAMPLE_RATE, pad_duration: float = 0.1,
                 fade_duration: float = 0.1):
        self.xfade = int(CROSS_FADE_S * sr) // 3
        self.fade, self.pad = int(fade_duration * sr), int(pad_duration * sr)
        self.hold = max(self.xfade, self.fade)   # the last samples a join or the final fade may touch
        self.gain: Callable[[np.ndarray], np.ndarray] | None = None
        self.chunk_starts: list[int] = []        # merged index where each chunk's samples begin
        self._held = np.zeros(0, np.float32)     # merged samples [held_start, merged_len), pre-gain
        self._held_start = 0
        self._merged = 0
        self._head: np.ndarray | None = None      # a chunk's first samples awaiting their fade-in
        self._started = False                     # the leading pad went out
        self.released_chunk = 0                   # last chunk with samples released so far

    def set_gain(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self.gain = fn

    def _append(self, x: np.ndarray) -> None:
        if len(x):
            self._held = np.concatenate([self._held, x])
            self._merged += len(x)

    def start_chunk(self) -> None:
        if self.chunk_starts:  # a join: fade the merged tail out, then a gap of zeros
            n_out = min(self.xfade, self._merged)
            if n_out > 0:
                self._held[len(self._held) - n_out:] *= np.linspace(1, 0, n_out, dtype=np.float32)
            self._append(np.zeros(self.xfade, np.float32))
            self._head = np.zeros(0, np.float32)
        self.chunk_starts.append(self._merged)

    def _resolve_head(self, final: bool) -> None:
        h = self._head
        if h is None or (len(h) < self.xfade and not final):
            return
        n_in = min(self.xfade, len(h))
        h = h.copy()
        if n_in > 0:
            h[:n_in] *= np.linspace(0, 1, n_in, dtype=np.float32)
        self._head = None
        self._append(h)

    def push(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if self._head is not None:
            self._head = np.concatenate([self._head, x])
            self._resolve_head(final=False)
        else:
            self._append(x)
        return self._release(final=False)

    def end_chunk(self) -> np.ndarray:
        self._resolve_head(final=True)
        return self._release(final=False)

    def finish(self) -> np.ndarray:
        return self._release(final=True)

    def _release(self, final: bool) -> np.ndarray:
        total, a = self._merged, self._held_start
        if final:
            if total == 0:
                return np.zeros(0, np.float32)  # fade_and_pad leaves empty audio unpadded
            stop, k = total, min(self.fade, total // 2)  # fade_and_pad's rule, length now known
        else:
            if total < 2 * self.fade:  # the fade-in length min(fade, L // 2) is not known yet
                return np.zeros(0, np.float32)
            stop, k = total - self.hold, self.fade
            if stop <= a:
                return np.zeros(0, np.float32)
        if self.gain is None:
            raise RuntimeError("StreamJoiner: set_gain() before releasing audio")
        seg = np.array(self.gain(self._held[:stop - a]), np.float32, copy=True)
        if a < k:  # the utterance's fade-in
            n = min(k, stop) - a
            seg[:n] *= np.linspace(0, 1, k, dtype=np.float32)[a:a + n]
        if final and k > 0:  # the utterance's fade-out (hold >= fade: all still held)
            seg[len(seg) - k:] *= np.linspace(1, 0, k, dtype=np.float32)
        self._held = self._held[stop - a:]
        self._held_start = stop
        self.released_chunk = max(i for i, s in enumerate(self.chunk_starts) if s < stop or i == 0)
        parts = [seg]
        if not self._started:
            parts.insert(0, np.zeros(self.pad, np.float32))
            self._started = True
        if final:
            parts.append(np.zeros(self.pad, np.float32))
        return np.concatenate(parts)


def join_offline(chunks: list[np.ndarray], gain, *, postprocess: bool, pad_duration: float,
                 fade_duration: float, sr: int = audio.SAMPLE_RATE) -> np.ndarray:
    """The non-streamed join of decoded chunks, from the library's one-shot functions."""
    for c in chunks:
        if not np.isfinite(c).all():
            raise AudioError("decoded audio contains NaN or infinite samples (a decoding fault); nothing to save")
    pieces = [trim_chunk(c, sr) if postprocess else np.asarray(c, np.float32) for c in chunks]
    wav = audio.cross_fade_chunks(pieces, sr, silence_duration=CROSS_FADE_S)
    if wav.shape[-1] == 0:
        return wav
    return audio.fade_and_pad(np.asarray(gain(wav), np.float32), pad_duration, fade_duration, sr)


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
        from .pipeline import resolve_generation_config

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
            text_mod.validate_ref_text(ref_text)
        if on_step is not None and not callable(on_step):
            raise InputError(f"on_step must be a function (step, num_steps) or None, got "
                             f"{type(on_step).__name__}")
        text_mod.validate_edges(self.gen.pad_duration, self.gen.fade_duration)
        self.model = model
        self.language = text_mod.resolve_language(language)
        self._instruct_raw = instruct
        self.instruct = text_mod.resolve_instruct(instruct, None)  # validate now; re-resolved on chunk 0
        self.speed = text_mod.validate_speed(speed)
        self.duration = text_mod.validate_duration(duration)
        if self.duration is not None and whole_text is None:
            raise InputError("duration needs the whole text in advance; with streamed text input "
                             "use speed= instead")
        # normalize_text: each chunk is normalised as it is checked and spoken (the chunker
        # reads the text as written, so fragments and the whole string split alike).
        self._normalize = normalize.chunk_normalizer(normalize_text, self.language)
        self.whole_text = whole_text
        self.seed, self.on_step = text_mod.validate_seed(seed, 1)[0], on_step
        self.prompt = voice_clone_prompt
        self._ref_audio, self._ref_text = ref_audio, ref_text
        self.pace = 1.0 if self.speed is None else self.speed
        self.ref0: tuple[str, np.ndarray] | None = None  # (chunk 0 text, codes) in auto / design
        self.encode_s = 0.0
        self.total_frames = 0  # frames generated so far, against text.MAX_DURATION_S
        self._chunks: list[str] | None = None  # all chunk texts, when the whole text is known
        self._voice_ready = self._ref_audio is None or self.prompt is not None
        if self._voice_ready:
            self._fix_pace()

    def _fix_pace(self) -> None:
        """With `duration`, every chunk is spoken at estimate / requested frames."""
        if self.duration is not None:
            p = self.prompt
            estimate = text_mod.estimate_target_frames(
                self._normalize(self.whole_text), p.ref_text if p else None,
                p.ref_audio_tokens.shape[1] if p else None)
            self.pace = estimate / max(1, int(self.duration * self.model.frame_rate))

    def expect(self, chunks: list[str]) -> None:
        """The whole text's chunks are known: check every pass now (or, when a reference clip
        still has to be encoded, right after that)."""
        self._chunks = [self._normalize(c) for c in chunks]
        if self._voice_ready:
            self._check_chunks()

    def _check_chunks(self) -> None:
        from .pipeline import _Item

        frames0, total = None, 0
        gen, C = self.gen, self.model.config.num_audio_codebook
        instruct = self.instruct
        if self._instruct_raw is not None and self._chunks:  # as codes() resolves it on chunk 0
            instruct = text_mod.resolve_instruct(self._instruct_raw, self._chunks[0])
        for k, chunk in enumerate(self._chunks):
            ref_text, ref_codes = self._reference(k, chunk)
            if k > 0 and self.prompt is None:  # chunk 0's codes do not exist yet: same shape
                ref_codes = np.zeros((C, frames0), np.int64)
            frames = self._frames(chunk, ref_text, ref_codes)
            frames0 = frames if k == 0 else frames0
            total = text_mod.check_total_frames(total + frames, self.model.frame_rate)
            item = _Item(chunk, frames, self.language, instruct, ref_text, ref_codes, None)
            rows, num_out = self.model._rows(item, gen)
            text_mod.check_pass_memory(self.model.config, rows, num_out, gen.class_temperature > 0)

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

    def _reference(self, k: int, chunk: str):
        """(ref_text, ref_codes) of chunk k: the voice prompt, else chunk 0's text and codes."""
        if self.prompt is not None:
            return self.prompt.ref_text, self.prompt.ref_audio_tokens
        if k > 0:
            return self.ref0 if self.ref0 is not None else (self._chunks[0], None)
        return None, None

    def _frames(self, chunk: str, ref_text, ref_codes) -> int:
        frames = text_mod.estimate_target_frames(
            chunk, ref_text, None if ref_codes is None else ref_codes.shape[1], speed=self.pace)
        return text_mod.check_pass_frames(frames, chunk, self.model.frame_rate)

    def codes(self, k: int, chunk: str, on_step=None) -> tuple[np.ndarray, np.ndarray]:
        """Unmask chunk k: codes [C, T_k] and fill steps [C, T_k]."""
        from .pipeline import _Item

        chunk = text_mod.validate_text(self._normalize(text_mod.validate_text(chunk)))
        if k == 0 and self._instruct_raw is not None:
            # As generate() decides an instruct's language from its text, here from chunk 0's
            # (the only text known when a stream starts), for whole and fragmented input alike.
            self.instruct = text_mod.resolve_instruct(self._instruct_raw, chunk)
        ref_text, ref_codes = self._reference(k, chunk)
        ref_rms = self.prompt.ref_rms if self.prompt is not None else None
        frames = self._frames(chunk, ref_text, ref_codes)
        self.total_frames = text_mod.check_total_frames(self.total_frames + frames,
                                                        self.model.frame_rate)
        item = _Item(chunk, frames, self.language, self.instruct, ref_text, ref_codes, ref_rms)
        codes, steps = self.model._unmask([item], self.gen, self.seed, on_step or self.on_step)
        if k == 0 and self.prompt is None:
            self.ref0 = (chunk, codes[0])
        return codes[0], steps[0]


def _text_source(text, rule: ChunkRule | None):
    """(whole text or None, iterator of fragments)."""
    if isinstance(text, str):
        text_mod.validate_text(text)
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
    at a time. Each window is decoded with the decoder's receptive field of context on both sides
    (as `codec.decode_stream` does), so the pieces join into the one-shot `codec.decode` up to
    float32 rounding. A short first window gives the chunk's first samples early; longer later
    ones cut the overlap cost (1.8x the one-shot work at 25 frames, 1.2x at 100)."""
    context = max(codec_mod.decoder_receptive_field(codec.cfg))
    hop, t_ = codec.hop_length, codes.shape[1]
    start = 0
    while start < t_:
        stop = min(t_, start + (first if start == 0 else LATER_WINDOWS * first))
        lo, hi = max(0, start - context), min(t_, stop + context)
        wav = codec_mod.decode(codec.params, codes[:, lo:hi], codec.cfg)  # [C, hi-lo] -> [hop*(hi-lo)]
        yield wav[(start - lo) * hop:(stop - lo) * hop]  # -> [hop*(stop-start)]
        start = stop


def _check_window(decode_frames) -> int:
    if isinstance(decode_frames, bool) or not isinstance(decode_frames, int) or decode_frames < 1:
        raise InputError(f"decode_frames must be a positive integer, got {decode_frames!r}")
    return decode_frames


def generate_chunks(model, text, *, language=None, ref_audio=None, ref_text=None,
                    voice_clone_prompt=None, instruct=None, duration=None, speed=None, seed=None,
                    on_step=None, generation_config: GenerationConfig | None = None,
                    rule: ChunkRule | None = None, decode_frames: int = 25,
                    normalize_text: bool = False, **gen_kwargs):
    """The non-streamed twin of `stream`: the same chunks, the same per-chunk generation (same
    seed, same voice reference), run synchronously; each chunk decoded in ONE shot
    (`codec.decode`), trimmed whole (`trim_chunk`), joined with `audio.cross_fade_chunks`, scaled
    (fixed gain, see module docstring) and finished with `audio.fade_and_pad`.
    `decode_frames` only sets the window whose peak fixes the gain. Returns a `Synthesis`.
    """
    from .pipeline import Synthesis

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
    for k, chunk in enumerate(_chunks_of(fragments, rule)):
        c, s = plan.codes(k, chunk)
        chunks.append(chunk)
        codes.append(c)
        steps.append(s)
    if not chunks:
        raise InputError("text is empty (or only whitespace): pass the words to speak.")
    t1 = time.perf_counter()
    wavs = [model.codec.decode(c) for c in codes]  # [C, T_k] -> [960 * T_k]
    t2 = time.perf_counter()
    gain = plan.gain(wavs[0][:decode_frames * model.codec.hop_length])
    wav = join_offline(wavs, gain, postprocess=plan.gen.postprocess_output,
                       pad_duration=plan.gen.pad_duration, fade_duration=plan.gen.fade_duration,
                       sr=model.sampling_rate)
    t3 = time.perf_counter()
    timings = {"unmask": t1 - t0 - plan.encode_s, "decode": t2 - t1, "postprocess": t3 - t2}
    if plan.encode_s:
        timings["encode"] = plan.encode_s
    return Synthesis(audio=np.ascontiguousarray(wav, np.float32), codes=np.concatenate(codes, axis=1),
                     fill_steps=np.concatenate(steps, axis=1).astype(np.int16),
                     num_steps=plan.gen.num_step, timings=timings, text_chunks=chunks,
                     sample_rate=model.sampling_rate)


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

        for k in itertools.count():
            chunk = _next_text(shared)
            if chunk is _END:
                break
            shared.wait_turn(k)
            t0 = time.perf_counter()
            codes, _ = plan.codes(k, chunk, on_step)
            t1 = time.perf_counter()
            stat = {"text": chunk, "frames": int(codes.shape[1]), "start_s": t0 - t_start,
                    "unmask_s": t1 - t0}
            shared.stats.append(stat)
            trimmer = SilenceTrimmer(model.sampling_rate) if plan.gen.postprocess_output else None
            joiner.start_chunk()
            for wav in decode_windows(codec, codes, decode_frames):
                shared.check()
                if not np.isfinite(wav).all():
                    raise AudioError("decoded audio contains NaN or infinite samples (a decoding fault); "
                                     "nothing to save")
                if joiner.gain is None:
                    joiner.set_gain(plan.gain(wav))
                shared.put_audio(joiner, joiner.push(trimmer.push(wav) if trimmer else wav))
            if trimmer is not None:
                shared.put_audio(joiner, joiner.push(trimmer.end()))
            shared.put_audio(joiner, joiner.end_chunk())
            stat["decode_s"] = time.perf_counter() - t1
            with shared.cond:
                shared.marks.append(shared.emitted)
        if not joiner.chunk_starts:
            raise InputError("text is empty (or only whitespace): pass the words to speak.")
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


# ---------------------------------------------------------------------------------------------
# Writers: audio to a file or a pipe as it comes
# ---------------------------------------------------------------------------------------------


def to_pcm16(x: np.ndarray) -> np.ndarray:
    """float32 -> little-endian int16 samples as soundfile writes a PCM_16 WAV (floor of
    x * 32768, clipped to the int16 range; measured), so raw output equals the WAV's samples."""
    scaled = np.floor(np.asarray(x, np.float32) * np.float32(32768))
    return np.clip(scaled, -32768, 32767).astype("<i2")


class RawPcmWriter:
    """Raw 16-bit little-endian mono PCM to a binary stream (e.g. stdout for
    `| aplay -r 24000 -f S16_LE -c 1`), flushed after every piece."""

    def __init__(self, fh):
        self.fh = fh
        self.samples = 0

    def write(self, x: np.ndarray) -> None:
        self.fh.write(to_pcm16(x).tobytes())
        self.fh.flush()
        self.samples += len(x)

    def commit(self) -> None:
        self.fh.flush()

    def abort(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest) -> None:
        self.abort() if exc_type else self.commit()


class AudioFileWriter:
    """Write audio pieces to `path` as they come, atomically (through `audio.AtomicOutput`): the
    samples go to a temporary file in the same folder (for WAV, a header whose sizes libsndfile
    fixes up on close); `commit()` flushes, syncs and renames it over `path`; `abort()` (or an
    exception leaving a `with` block) removes it, so `path` is never half written. The format
    follows the extension (.wav, .flac, .ogg, ...; .raw / .pcm or raw=True: headerless 16-bit
    PCM); WAV and FLAC are 16-bit, samples clipped. The path is checked here, before any audio
    is made."""

    def __init__(self, path, sr: int = audio.SAMPLE_RATE, *, raw: bool = False):
        import os

        import soundfile as sf

        self.path = os.fspath(path)
        self.sr = sr
        self.samples = 0
        self._sf = self._out = None
        ext = os.path.splitext(self.path)[1].lstrip(".").upper()
        self._raw = raw or ext in ("RAW", "PCM")
        audio.check_output_path(self.path, AudioError)  # "it is a folder" says more than "no format"
        if not self._raw:
            try:
                ext, subtype = audio.audio_format(self.path)
            except AudioError:
                raise AudioError(f"cannot tell the audio format of {self.path!r}; use an extension "
                                 "such as .wav, .flac, .ogg (or .raw for headerless PCM)") from None
            self._int = subtype.startswith("PCM")
        self._out = audio.AtomicOutput(self.path, AudioError)
        try:
            if not self._raw:
                self._sf = sf.SoundFile(self._out.fh, "w", samplerate=sr, channels=1, format=ext,
                                        subtype=subtype)
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise self._out.failed(exc) from None
            raise

    def write(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32)
        if not np.isfinite(x).all():
            self.abort()
            raise AudioError(f"audio for {self.path!r} contains NaN or infinite samples; nothing was written")
        if self._out is None:
            raise AudioError(f"{self.path!r} was already committed or aborted")
        try:
            if self._sf is None:
                self._out.fh.write(to_pcm16(x).tobytes())
            else:
                self._sf.write(np.clip(x, -1.0, 1.0) if self._int else x)
        except BaseException as exc:
            err = self._out.failed(exc)
            self.abort()
            if isinstance(exc, Exception):
                raise err from None
            raise
        self.samples += len(x)

    def commit(self) -> None:
        if self.samples == 0:
            self.abort()
            raise AudioError(f"refusing to write empty audio to {self.path!r}")
        if self._out is None:
            raise AudioError(f"{self.path!r} was already committed or aborted")
        out = self._out
        try:
            if self._sf is not None:
                self._sf.close()  # writes the final header sizes
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise out.failed(exc) from None
            raise
        self._out = None
        out.commit()  # removes the temporary file itself on failure

    def abort(self) -> None:
        """Remove the temporary file (idempotent; never raises)."""
        sfile, self._sf = self._sf, None
        try:
            if sfile is not None and not sfile.closed:
                sfile.close()
        except Exception:  # a header that cannot be finished: the file is thrown away anyway
            pass
        out, self._out = self._out, None
        if out is not None:
            out.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest) -> None:
        self.abort() if exc_type else self.commit()
