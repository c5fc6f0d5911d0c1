"""The planner: pause marks, sentence chunks, and the passes one text becomes.

    split_pauses        [pause:1.5s] / <break time="2s"/> marks -> segments and their silences
    chunk_text          long text -> the reference's sentence-packed chunks (pack_sentences)
    plan_synthesis      the whole plan of one call: per segment its chunks, pace and frames
    plan_pace/_chunk    the same rules, chunk by chunk, for the stream
    TextChunker         streamed text -> chunks as it arrives: a short first one, then sentences

There are two sentence splitters on purpose: ``pack_sentences`` reproduces the reference's
chunks character for character (tests pin them), while the stream's ``TextChunker`` cuts
incrementally, early and at clause marks, which the reference never does.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, replace

from ..errors import InputError
from ..model.config import FIRST_CHUNK_MAX_FACTOR, FIRST_CHUNK_SECONDS, FRAME_RATE, real_number
from .frontend import char_weight, estimate_target_frames, frames_of_weight, shorten, text_weight
from .limits import (MAX_DURATION_S, check_pass_frames, validate_duration, validate_ref_frames,
                     validate_speed, validate_text)

# The longest silence of one mark. A minute is far beyond any pause in speech, so more is a typo
# (500s for 500ms); all pauses of a call also count against MAX_DURATION_S with its speech.
MAX_PAUSE_S = 60.0
# A mark is at most this many characters from its "[" / "<" to its "]" / ">"; longer, it is
# unclosed (and a stream must not hold text back for a closer that never comes).
_MAX_MARK_CHARS = 100
_MARK_KEYWORDS = {"[": "pause", "<": "break"}
_MARK_CLOSERS = {"[": "]", "<": ">"}
_WORD_CHAR = re.compile(r"\w")
_PAUSE_LENGTH = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)\s*", re.IGNORECASE)
_BREAK_ATTR = re.compile(r"""\s*([A-Za-z_][\w-]*)\s*=\s*("[^"]*"|'[^']*'|[^\s"'/>]+)""")
_PAUSE_SYNTAX = "[pause:1.5s], [pause:500ms] or <break time=\"500ms\"/>"


@dataclass(frozen=True)
class Pause:
    """A pause mark: ``seconds`` of silence, written at character ``at`` (from 0) of the text."""

    seconds: float
    at: int = 0


def pause_frames_of(seconds: float, frame_rate: float = FRAME_RATE) -> int:
    """Pause seconds in code frames, rounded up: what they count against a call's length limits."""
    return math.ceil(seconds * frame_rate)


def pause_samples(seconds: float, sr: int) -> int:
    """A pause's length in whole samples at ``sr`` (24 kHz: 1.5 s -> 36000, 500 ms -> 12000)."""
    return int(round(seconds * sr))


def _pause_error(mark: str, at: int, why: str) -> InputError:
    return InputError(f"pause mark {shorten(mark, 60)!r} at character {at}: {why}. Write "
                      f"{_PAUSE_SYNTAX}, at most {MAX_PAUSE_S:g} s each.")


def _parse_mark(mark: str, at: int) -> Pause:
    """The pause of one complete mark ("[pause:...]" or "<break .../>"), else InputError."""
    if mark[0] == "[":
        rest = mark[1:-1].strip()[len("pause"):].lstrip()
        if not rest.startswith(":"):
            raise _pause_error(mark, at, "the length follows a colon")
        value = rest[1:]
    else:
        inner = mark[1:-1].strip()[len("break"):]
        inner = inner[:-1] if inner.endswith("/") else inner
        attrs, pos = {}, 0
        while inner[pos:].strip():
            m = _BREAK_ATTR.match(inner, pos)
            if m is None:
                raise _pause_error(mark, at, "its attributes cannot be read")
            name, val = m[1].lower(), m[2]
            if name not in ("time", "strength"):  # SSML's strength is accepted, time decides
                raise _pause_error(mark, at, f"unknown attribute {name!r}")
            attrs[name] = val[1:-1] if val[:1] in "\"'" else val
            pos = m.end()
        if "time" not in attrs:
            raise _pause_error(mark, at, "a break needs its time")
        value = attrs["time"]
    m = _PAUSE_LENGTH.fullmatch(value)
    if m is None:
        raise _pause_error(mark, at, f"{value.strip()!r} is not a length (a number >= 0 "
                                     "followed by s or ms)")
    seconds = float(m[1]) / (1000.0 if m[2].lower() == "ms" else 1.0)
    if seconds > MAX_PAUSE_S:
        raise _pause_error(mark, at, f"{seconds:g} s is over the limit of {MAX_PAUSE_S:g} s "
                                     "per pause")
    return Pause(seconds, at)


class PauseScanner:
    """Finds pause marks in text as it arrives: ``feed(fragment)`` returns the spoken text and
    the ``Pause``s that the fragment completed, in order (text pieces as strings); ``flush()``
    the rest at the end of the input. A possible mark (``[pause``, ``<break``, any case) is held
    back until its closing ``]`` / ``>``; any other ``[`` or ``<`` (a tag such as
    ``[laughter]``) is text. Every decision looks only at text already read, so a text gives
    the same pieces in any fragmentation. A malformed or unclosed mark is an InputError naming
    its character offset."""

    def __init__(self):
        self.pos = 0                    # characters read
        self._cand: list[str] = []      # a possible mark being read ("[" or "<" first)
        self._at = 0                    # its offset
        self._is_mark = False           # its keyword was read: it must parse

    def feed(self, fragment: str) -> list:
        out: list = []
        for ch in fragment:
            self._char(ch, self.pos, out)
            self.pos += 1
        return out

    def flush(self) -> list:
        out: list = []
        while self._cand:  # releasing "[[pau" leaves "[pau" pending: repeat
            if self._is_mark:
                raise _pause_error("".join(self._cand), self._at, "it is not closed")
            self._release(out)
        return out

    @staticmethod
    def _text(out: list, s: str) -> None:
        if out and isinstance(out[-1], str):
            out[-1] += s
        else:
            out.append(s)

    def _char(self, ch: str, at: int, out: list) -> None:
        if not self._cand:
            if ch in _MARK_KEYWORDS:
                self._cand, self._at, self._is_mark = [ch], at, False
            else:
                self._text(out, ch)
            return
        self._cand.append(ch)
        opener = self._cand[0]
        if self._is_mark:
            if ch == _MARK_CLOSERS[opener]:
                mark, self._cand = "".join(self._cand), []
                out.append(_parse_mark(mark, self._at))
            elif len(self._cand) > _MAX_MARK_CHARS:
                raise _pause_error("".join(self._cand), self._at,
                                   f"no closing {_MARK_CLOSERS[opener]!r} within "
                                   f"{_MAX_MARK_CHARS} characters")
            return
        keyword = _MARK_KEYWORDS[opener]
        body = "".join(self._cand[1:]).lstrip().lower()
        if len(body) <= len(keyword):
            if not keyword.startswith(body) or len(self._cand) > _MAX_MARK_CHARS:
                self._release(out)
            return
        # The character after the keyword decides: "[pause:" is a mark, "[pauses" text.
        if body.startswith(keyword) and not _WORD_CHAR.match(body[len(keyword)]):
            self._is_mark = True
            if ch == _MARK_CLOSERS[opener]:  # "[pause]", "<break>": complete, and malformed
                mark, self._cand = "".join(self._cand), []
                out.append(_parse_mark(mark, self._at))
        else:
            self._release(out)

    def _release(self, out: list) -> None:
        """Not a mark after all: its first character is text, the rest is read again."""
        cand, at = self._cand, self._at
        self._cand, self._is_mark = [], False
        self._text(out, cand[0])
        for i, c in enumerate(cand[1:], 1):
            self._char(c, at + i, out)


@dataclass(frozen=True)
class PausedText:
    """A text split at its pause marks. ``segments``: the spoken text between marks, as written
    (text that is only whitespace between two marks is dropped and their pauses add up);
    ``pauses``: seconds of silence before the first segment, between each two and after the
    last (``len(pauses) == len(segments) + 1``); ``marked``: the text had a mark at all."""

    segments: tuple[str, ...]
    pauses: tuple[float, ...]
    marked: bool

    def map(self, fn) -> "PausedText":
        """The same pauses with ``fn`` applied to every segment (e.g. text normalisation)."""
        return PausedText(tuple(fn(s) for s in self.segments), self.pauses, self.marked)

    @property
    def spoken(self) -> str:
        """The segments joined by spaces: what is said, without the marks."""
        return " ".join(s.strip() for s in self.segments) if self.marked else self.segments[0]


def split_pauses(text: str) -> PausedText:
    """``text`` split at its pause marks (see ``PauseScanner``): ``[pause:1.5s]``,
    ``[pause:500ms]``, SSML ``<break time="2s"/>`` (``time`` in s or ms, 0 .. ``MAX_PAUSE_S``).
    Other bracketed tags (``[laughter]``, ``[B EY1 S]``) are text. InputError with the
    character offset for a malformed mark, and for a text of marks only."""
    if "[" not in text and "<" not in text:
        return PausedText((text,), (0.0, 0.0), False)
    scanner = PauseScanner()
    pieces = scanner.feed(text) + scanner.flush()
    if not any(isinstance(p, Pause) for p in pieces):
        return PausedText((text,), (0.0, 0.0), False)
    segments: list[str] = []
    pauses = [0.0]
    current = ""
    for piece in pieces:
        if isinstance(piece, Pause):
            if piece.seconds == 0:  # a pause of nothing: the mark is removed, the text goes on
                continue
            if current.strip():
                segments.append(current)
                pauses.append(0.0)
            current = ""
            pauses[-1] += piece.seconds
        else:
            current += piece
    if current.strip():
        segments.append(current)
        pauses.append(0.0)
    if not segments:
        raise InputError("text has only pause marks and nothing to speak: put words between "
                         f"them (pauses are written {_PAUSE_SYNTAX}).")
    return PausedText(tuple(segments), tuple(pauses), True)


# ---------------------------------------------------------------------------
# Long text: sentence chunking and the generation plan
# ---------------------------------------------------------------------------

# A sentence ends after one of these (the ASCII and full-width forms).
_SENTENCE_ENDS = frozenset(".,;:!?。，；：！？")
# Closing quotes/brackets (and sentence marks) at the start of a new sentence belong to the
# previous one. The reference's list, which its chunks must match: it has the opening “ ‘ and >,
# and lacks ) } » 』 (the stream's rule corrects both: _STREAM_CLOSERS).
_CLOSERS = frozenset("\"'“”‘’）]》>」】")
# A "." right after one of these words does not end the sentence. Matching is case-sensitive
# and on the whole whitespace-delimited word; note that the first "." of "e.g." or "i.e." still
# splits (the word is "e." then), as in the reference. The stream uses it too, in any case.
_ABBREVIATIONS = frozenset(
    "Mr. Mrs. Ms. Dr. Prof. Sr. Jr. Rev. Fr. Hon. Pres. Gov. Capt. Gen. Sen. Rep. Col. Maj. "
    "Lt. Cmdr. Sgt. Cpl. Co. Corp. Inc. Ltd. Est. Dept. St. Ave. Blvd. Rd. Mt. Ft. No. "
    "Jan. Feb. Mar. Apr. Aug. Sep. Sept. Oct. Nov. Dec. i.e. e.g. vs. Vs. Etc. approx. fig. "
    "def.".split()
)
# Chunks shorter than this many characters are merged into a neighbour.
_MIN_CHUNK_CHARS = 3


def pack_sentences(text: str, chunk_len: int, min_chunk_len: int | None = None) -> list[str]:
    """Split ``text`` at sentence marks and pack the pieces into chunks of <= ``chunk_len``
    characters, exactly as the reference's sentence chunker does.

    1. Sentences end after any of ``. , ; : ! ?`` and their full-width forms, except a ``"."``
       ending an abbreviation; marks and closing quotes right after a split join the previous
       sentence.
    2. Consecutive sentences are packed greedily while the chunk stays within ``chunk_len``
       characters; a longer sentence becomes a chunk of its own (it is never cut).
    3. With ``min_chunk_len``, a chunk shorter than that joins the previous chunk; a short
       first chunk takes the second one in.
    Chunks are stripped; blank chunks are dropped.
    """
    sentences: list[list[str]] = []
    current: list[str] = []
    word_start = 0  # index in `current` where its last whitespace-free run starts
    for char in text:
        if not current and sentences and (char in _SENTENCE_ENDS or char in _CLOSERS):
            sentences[-1].append(char)
            continue
        current.append(char)
        if char.isspace():
            word_start = len(current)
        elif char in _SENTENCE_ENDS:
            if char == "." and "".join(current[word_start:]) in _ABBREVIATIONS:
                continue
            sentences.append(current)
            current, word_start = [], 0
    if current:
        sentences.append(current)

    packed: list[list[str]] = []
    chunk: list[str] = []
    for sentence in sentences:
        if len(chunk) + len(sentence) <= chunk_len:
            chunk.extend(sentence)
        else:
            if chunk:
                packed.append(chunk)
            chunk = list(sentence)
    if chunk:
        packed.append(chunk)

    if min_chunk_len is not None:
        first_is_short = bool(packed) and len(packed[0]) < min_chunk_len
        merged: list[list[str]] = []
        for i, chunk in enumerate(packed):
            if (i == 1 and first_is_short) or (merged and len(chunk) < min_chunk_len):
                merged[-1].extend(chunk)
            else:
                merged.append(list(chunk))
        packed = merged

    stripped = ("".join(chunk).strip() for chunk in packed)
    return [chunk for chunk in stripped if chunk]


def chunk_text(
    text: str, frames: int, chunk_duration: float = 15.0, frame_rate: int = FRAME_RATE
) -> list[str]:
    """Chunk texts of a long item whose target length is ``frames``, as the reference makes them.

    The chunk size in characters is ``chunk_duration`` seconds at the item's own frames per
    character (``frames / len(text)``), so a slow ``speed`` or a long ``duration`` gives shorter
    chunks; chunks under 3 characters are merged (see ``pack_sentences``). Only items longer
    than the chunk threshold (30 s by default) are chunked; see ``plan_synthesis``.
    """
    if not text:
        return []
    if isinstance(frames, bool) or not isinstance(frames, numbers.Integral) or frames < 1:
        raise InputError(f"frames must be a positive integer, got {frames!r}.")
    frames_per_char = frames / len(text)
    chunk_chars = int(chunk_duration * frame_rate / frames_per_char)
    return pack_sentences(text, chunk_chars, min_chunk_len=_MIN_CHUNK_CHARS)


@dataclass(frozen=True)
class ChunkPlan:
    """One generation pass.

    ``reference`` says which voice reference the pass is conditioned on:
        ``"prompt"``  the caller's voice prompt (its codes; ``ref_text`` is the prompt's text)
        ``"chunk0"``  the codes generated for chunk 0 of this item (``ref_text`` = chunk 0's
                      text, and those codes are exactly ``chunks[0].frames`` long)
        ``None``      no reference (auto / voice-design mode, or chunk 0 of a long text there)

    ``segment`` is the index of the text segment (between pause marks) the pass speaks.
    """

    text: str
    frames: int
    reference: str | None
    ref_text: str | None
    segment: int = 0


@dataclass(frozen=True)
class SynthesisPlan:
    """How the reference generates one text item.

    ``frames`` is the item's target length (estimate, or the ``duration`` override); it decides
    chunking. ``speed`` is the factor every chunk estimate is divided by: the user's speed, or
    with ``duration`` the ratio estimate / requested frames, so chunks share the requested pace.
    ``chunks`` is a single pass with the whole (unstripped) text and ``frames`` when ``chunked``
    is false; otherwise the passes in order.

    ``pauses``: seconds of silence from pause marks before segment 0, between each two segments
    and after the last (see ``split_pauses``); a chunk's ``segment`` says where it belongs.
    """

    frames: int
    speed: float
    chunked: bool
    chunks: tuple[ChunkPlan, ...]
    pauses: tuple[float, ...] = (0.0, 0.0)

    @property
    def paused(self) -> bool:
        """The text had pause marks that change the output (a pause, or several segments)."""
        return len(self.pauses) > 2 or any(p > 0 for p in self.pauses)

    @property
    def pause_frames(self) -> int:
        """All pauses in frames (rounded up), for the limits on a call's output."""
        return pause_frames_of(sum(self.pauses))


def plan_pace(text: str, ref_text: str | None, num_ref_frames: int | None, *,
              speed: float | None = None, duration: float | None = None,
              frame_rate: int = FRAME_RATE) -> tuple[float, int]:
    """(pace, frames) of a whole text: with ``duration`` the pace is estimate / requested frames
    (so every chunk of it shares the requested pace), else the speed (1.0 when None)."""
    if duration is not None:
        estimate = estimate_target_frames(text, ref_text, num_ref_frames)
        frames = max(1, int(duration * frame_rate))
        return estimate / frames, frames
    pace = 1.0 if speed is None else speed
    return pace, estimate_target_frames(text, ref_text, num_ref_frames, pace)


def plan_chunk(text: str, first: ChunkPlan | None, ref_text: str | None,
               num_ref_frames: int | None, pace: float, own_pace: bool = False) -> ChunkPlan:
    """The pass of one chunk of a long text (the long-form rule and the streamed one alike):
    with a voice prompt (``num_ref_frames`` given) it is the reference; otherwise chunk 0
    (``first`` None) has none and every later chunk uses chunk 0's text and generated codes
    (exactly ``first.frames`` long). Frames are the chunk's own estimate at ``pace``: against
    the voice prompt, or against chunk 0 as the reference does; with ``own_pace`` (a chunk after
    a pause mark) against the default yardstick chunk 0 itself was sized by, since a first
    segment cut short by a pause is stretched by the short-output boost and would stretch
    every later chunk with it."""
    if num_ref_frames is not None:
        return ChunkPlan(text, estimate_target_frames(text, ref_text, num_ref_frames, pace),
                         "prompt", ref_text)
    if first is None:
        return ChunkPlan(text, estimate_target_frames(text, None, None, pace), None, None)
    if own_pace:
        return ChunkPlan(text, estimate_target_frames(text, None, None, pace), "chunk0", first.text)
    return ChunkPlan(text, estimate_target_frames(text, first.text, first.frames, pace),
                     "chunk0", first.text)


def plan_synthesis(
    text: "str | PausedText",
    ref_text: str | None = None,
    num_ref_frames: int | None = None,
    *,
    speed: float | None = None,
    duration: float | None = None,
    chunk_duration: float = 15.0,
    chunk_threshold: float = 30.0,
    frame_rate: int = FRAME_RATE,
) -> SynthesisPlan:
    """Target lengths and chunk texts for one item, as the reference's ``generate()`` makes them.

    ``ref_text``/``num_ref_frames`` describe the voice prompt (its text after any
    ``add_punctuation``, and its code length); leave both ``None`` in auto and design modes.
    ``speed``/``duration`` are the user's overrides; ``duration`` (seconds) wins over ``speed``.

    Items whose target exceeds ``chunk_threshold`` seconds are split with ``chunk_text`` into
    chunks of about ``chunk_duration`` seconds, and every chunk's length is estimated again.
    With a voice prompt, every chunk uses it. Without one, chunk 0 is generated first with no
    reference, and each later chunk uses chunk 0's generated codes as its voice reference and
    chunk 0's text as ``ref_text`` - which keeps one voice across chunks, and also means those
    passes get the ``<|denoise|>`` token (when denoise is on), since they have reference codes.
    Language and instruct are the item's for every chunk. The chunks' audio is decoded one by
    one and cross-faded.

    In a batch, the reference runs the chunks of all long items chunk index by chunk index,
    and needs all long items to have a voice prompt or none to have one.

    Pause marks (``[pause:1.5s]``, ``<break time="500ms"/>``; ``text`` may also come split
    already, as a ``PausedText``) cut the text into segments. Each segment (stripped) is
    planned as a text of its own at the shared pace (with ``duration``: the segments' summed
    estimates / requested frames, so their lengths add up to it; the pauses come on top),
    chunked when it is longer than
    ``chunk_threshold``; its passes follow the rule above across segments, so without a voice
    prompt chunk 0 (of segment 0) is the voice of every later pass, and with one every pass uses
    it. Passes after the first inner mark are sized at the pace itself (``plan_chunk``'s
    ``own_pace``), not by chunk 0's length. ``pauses`` gives the silences; a text without marks
    is planned exactly as before.
    """
    paused = text if isinstance(text, PausedText) else split_pauses(validate_text(text))
    segments = tuple(validate_text(seg.strip() if paused.marked else seg) for seg in paused.segments)
    text = paused.spoken
    speed = validate_speed(speed)
    duration = validate_duration(duration)
    chunk_duration = real_number(chunk_duration, "chunk_duration")
    chunk_threshold = real_number(chunk_threshold, "chunk_threshold")
    if chunk_duration <= 0:
        raise InputError(
            f"chunk_duration must be > 0 seconds, got {chunk_duration:g}; to keep long text in "
            "one pass, raise chunk_threshold instead."
        )
    if chunk_threshold < 0:
        raise InputError(f"chunk_threshold must be >= 0 seconds, got {chunk_threshold:g}.")

    if len(segments) == 1:
        pace, frames = plan_pace(text, ref_text, num_ref_frames, speed=speed, duration=duration,
                                 frame_rate=frame_rate)
    else:  # the segments' own estimates add up to the speech (the short-output boost is not linear)
        if duration is not None:
            frames = max(1, int(duration * frame_rate))
            pace = sum(estimate_target_frames(seg, ref_text, num_ref_frames) for seg in segments) / frames
        else:
            pace = 1.0 if speed is None else speed
        seg_frames = [estimate_target_frames(seg, ref_text, num_ref_frames, pace) for seg in segments]
        if duration is None:
            frames = sum(seg_frames)
    pause_frames = pause_frames_of(sum(paused.pauses), frame_rate)
    if frames + pause_frames > MAX_DURATION_S * frame_rate:
        pauses = f" and {sum(paused.pauses):g} s of pauses" if pause_frames else ""
        raise InputError(
            f"this text at speed {pace:g}{pauses} would last about "
            f"{(frames + pause_frames) / frame_rate / 60:.0f} minutes; the limit is "
            f"{MAX_DURATION_S / 60:g} minutes per call. Raise the speed or split the text into "
            "several calls."
        )

    has_prompt = num_ref_frames is not None
    if has_prompt:
        validate_ref_frames(num_ref_frames)
    if len(segments) == 1:
        plan = _plan_one(text, frames, pace, ref_text, num_ref_frames, chunk_duration,
                         chunk_threshold, frame_rate, duration is not None)
        return SynthesisPlan(plan.frames, plan.speed, plan.chunked, plan.chunks, paused.pauses)

    chunks: tuple[ChunkPlan, ...] = ()
    for i, segment in enumerate(segments):
        # Chunked like a text of its own: by its own estimate, against the voice prompt or the
        # default yardstick (chunk 0's codes do not exist yet when the plan is made).
        pieces = ([segment] if seg_frames[i] <= int(chunk_threshold * frame_rate)
                  else chunk_text(segment, seg_frames[i], chunk_duration, frame_rate))
        for piece in pieces:
            chunk = plan_chunk(piece, chunks[0] if chunks else None, ref_text, num_ref_frames,
                               pace, own_pace=i > 0)
            chunks += (ChunkPlan(chunk.text, chunk.frames, chunk.reference, chunk.ref_text, i),)
        if i == 0 and duration is not None:  # the chunks sized against chunk 0
            chunks = fit_duration(chunks, seg_frames[0])
    for chunk in chunks:  # one sentence longer than a pass is never cut: refuse it up front
        check_pass_frames(chunk.frames, chunk.text, frame_rate)
    return SynthesisPlan(frames, pace, len(chunks) > 1, chunks, paused.pauses)


def fit_duration(chunks: tuple[ChunkPlan, ...], frames: int) -> tuple[ChunkPlan, ...]:
    """The chunks of a text given a duration, resized to last ``frames`` in all (within a frame
    per chunk): chunk 0 as planned, the later ones share what it leaves in proportion to their
    planned lengths.

    A deliberate deviation from the reference (docs/correctness.md, "Deliberate deviations").
    It plans every chunk after chunk 0 against chunk 0, whose length already carries the pace
    the duration sets, and then divides by that pace a second time: 31 s asked of a text whose
    own estimate is 18 s gives 47.7 s.
    """
    if len(chunks) < 2:
        return chunks
    first, rest = chunks[0], chunks[1:]
    left, planned = max(frames - first.frames, len(rest)), sum(c.frames for c in rest)
    return (first,) + tuple(replace(c, frames=max(1, left * c.frames // planned)) for c in rest)


def _plan_one(text: str, frames: int, pace: float, ref_text, num_ref_frames, chunk_duration,
              chunk_threshold, frame_rate, duration: bool) -> SynthesisPlan:
    """The reference's plan of one text (no pause marks): one pass, or chunks past the
    threshold (with ``duration``, `fit_duration`'s chunk lengths)."""
    has_prompt = num_ref_frames is not None
    if frames <= int(chunk_threshold * frame_rate):
        only = ChunkPlan(text, check_pass_frames(frames, text, frame_rate),
                         "prompt" if has_prompt else None, ref_text)
        return SynthesisPlan(frames, pace, False, (only,))

    pieces = chunk_text(text, frames, chunk_duration, frame_rate)
    chunks: tuple[ChunkPlan, ...] = ()
    for piece in pieces:
        chunks += (plan_chunk(piece, chunks[0] if chunks else None, ref_text, num_ref_frames,
                              pace),)
    if duration:
        chunks = fit_duration(chunks, frames)
    for chunk in chunks:  # one sentence longer than a pass is never cut: refuse it up front
        check_pass_frames(chunk.frames, chunk.text, frame_rate)
    return SynthesisPlan(frames, pace, True, chunks)


# ---------------------------------------------------------------------------------------------
# Streamed text: where chunks end (a shorter first chunk for an early first audio)
# ---------------------------------------------------------------------------------------------

_STREAM_SENTENCE_MARKS = frozenset(".!?;…。！？；")
_STREAM_CLAUSE_MARKS = frozenset(",:，：、")
# Full-width marks end a sentence without a following space (CJK text has none).
_STREAM_FULL_WIDTH = frozenset("。！？；，：、…")
# Closing quotes and brackets right after a mark stay with the chunk that the mark ends: the
# chunker's table without its opening quotes, with the closing brackets it lacks.
_STREAM_CLOSERS = (_CLOSERS - frozenset("“‘>")) | frozenset(")}»』")
# A "." after one of these words (or a single letter: an initial; or a word with another ".",
# as in "p.m." or "U.S.") ends no sentence: the chunker's table in any case, and two months it
# lacks.
_STREAM_ABBREVIATIONS = frozenset(w.lower() for w in _ABBREVIATIONS) | {"jun.", "jul."}

# The model's duration yardstick: "Nice to meet you." lasts 25 frames = 1 s.
_SECONDS_PER_WEIGHT = 1.0 / text_weight("Nice to meet you.")


@dataclass(frozen=True)
class ChunkRule:
    """Where streamed text is cut, in seconds of estimated speech (docs/streaming.md)."""

    # chunk 0 ends at a sentence or clause end after this much (2 s), or at a word break after
    # this much (6 s); GenerationConfig.first_chunk_seconds sets both (`with_first`)
    first_seconds: float = FIRST_CHUNK_SECONDS
    first_max_seconds: float = FIRST_CHUNK_MAX_FACTOR * FIRST_CHUNK_SECONDS
    seconds: float = 5.0              # later chunks end at a sentence end after this much
    clause_seconds: float = 10.0      # ... or at a clause end after this much
    max_seconds: float = 15.0         # ... or at a word break after this much
    # chunk 0's budget (None: none): whatever the punctuation, it ends at the last word break
    # within this much speech (the most a first audio target lets this machine make in time:
    # streaming.first_chunk_budget), and always holds one word at least
    first_budget_seconds: float | None = None

    def __post_init__(self):
        for name in ("first_seconds", "first_max_seconds", "seconds", "clause_seconds", "max_seconds",
                     "first_budget_seconds"):
            v = getattr(self, name)
            if v is None and name == "first_budget_seconds":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
                raise InputError(f"ChunkRule.{name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def with_first(cls, seconds: float, budget_seconds: float | None = None,
                   max_seconds: float | None = None) -> "ChunkRule":
        """The default rule with chunk 0 ending at a sentence or clause end after `seconds` of
        speech, or at a word break after `max_seconds` (0 or None: FIRST_CHUNK_MAX_FACTOR times
        `seconds`; never before `seconds`; a stream's GenerationConfig.first_chunk_seconds and
        first_chunk_max_seconds: at 2 s and None this is the default rule itself), or within
        `budget_seconds` (first_budget_seconds)."""
        cap = max(max_seconds, seconds) if max_seconds else FIRST_CHUNK_MAX_FACTOR * seconds
        return cls(first_seconds=seconds, first_max_seconds=cap, first_budget_seconds=budget_seconds)


class TextChunker:
    """Incremental splitter: `feed(fragment)` returns the chunks that fragment completed,
    `flush()` the rest at the end of the input. Splitting a string in one `feed` or in any
    fragmentation gives the same chunks (every decision looks only at text already read).
    A pause mark (`PauseScanner`) ends the current chunk and comes out as a `Pause` after it,
    in order with the chunk strings."""

    def __init__(self, rule: ChunkRule | None = None):
        self.rule = rule or ChunkRule()
        self._pauses = PauseScanner()
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

    def feed(self, fragment: str) -> list:
        if not isinstance(fragment, str):
            raise InputError(f"streamed text must come as str fragments, got {type(fragment).__name__}")
        out: list = []
        for piece in self._pauses.feed(fragment):
            self._piece(piece, out)
        return out

    def _piece(self, piece, out: list) -> None:
        if isinstance(piece, Pause):  # the chunk ends at the mark, the pause follows it
            if piece.seconds > 0:  # (a pause of nothing: the mark is removed, the text goes on)
                self._mark = None
                self._emit(out)
                out.append(piece)
            return
        for ch in piece:
            if self._mark is not None:
                if ch in _STREAM_SENTENCE_MARKS or ch in _STREAM_CLAUSE_MARKS or ch in _STREAM_CLOSERS:
                    if ch in _STREAM_SENTENCE_MARKS:  # "?!", "...": the strongest mark of a run counts
                        self._mark = "sentence"
                    if ch not in _STREAM_CLOSERS:
                        self._mark_wide = ch in _STREAM_FULL_WIDTH
                    self._append(ch, out)
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
                self._append(ch)  # a break: the word before it was checked as it came
                self._word_start = len(self._chars)
                continue
            self._append(ch, out)
            if ch in _STREAM_SENTENCE_MARKS or ch in _STREAM_CLAUSE_MARKS:
                word = "".join(self._chars[self._word_start:]).lower()
                if ch == "." and (word in _STREAM_ABBREVIATIONS or "." in word[:-1]
                                  or (len(word) == 2 and word[0].isalpha())):
                    continue  # "Dr." / "e.g." / "p.m." / "U.S." / an initial "J."
                self._mark = "sentence" if ch in _STREAM_SENTENCE_MARKS else "clause"
                self._mark_wide = ch in _STREAM_FULL_WIDTH

    def _append(self, ch: str, out: list | None = None) -> None:
        self._chars.append(ch)
        self._weight += char_weight(ch)
        budget = self.rule.first_budget_seconds
        if (self.count == 0 and budget is not None and self._word_start > 0
                and self._seconds() > budget and out is not None):
            self._cut_before_word(out)

    def _cut_before_word(self, out: list) -> None:
        """Chunk 0 is over its budget inside a word: it ends at the word break before that
        word, and the word so far begins the next chunk."""
        word = self._chars[self._word_start:]
        self._chars = self._chars[:self._word_start]
        self._emit(out)
        for ch in word:
            self._append(ch)

    def flush(self) -> list:
        """End of input: the rest is the last chunk (nothing when it is only whitespace)."""
        out: list = []
        for piece in self._pauses.flush():
            self._piece(piece, out)
        self._mark = None
        self._emit(out)
        return out


def seconds_within(frames: int, ref_text: str | None, num_ref_frames: int | None,
                   pace: float = 1.0, most: float = 15.0) -> float:
    """The most speech, in the chunker's seconds (up to `most`), whose chunk 0 `plan_chunk`
    sizes at `frames` frames or fewer: against the voice prompt, else the default yardstick,
    short-output boost and `pace` included (ChunkRule.first_budget_seconds from a frame
    budget). The estimate grows with the text's weight: bisection."""
    if num_ref_frames is None or not ref_text:
        ref_text, num_ref_frames = "Nice to meet you.", FRAME_RATE  # frontend's yardstick

    def fits(seconds):
        return frames_of_weight(seconds / _SECONDS_PER_WEIGHT, ref_text, num_ref_frames) / pace <= frames

    lo, hi = 0.0, float(most)
    if fits(hi):
        return hi
    for _ in range(40):  # to well under a character's weight
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def split_text(text: str, rule: ChunkRule | None = None) -> list:
    """The chunks `stream` speaks for `text` (whole or in fragments: the same list): strings,
    and a `Pause` where a pause mark was."""
    chunker = TextChunker(rule)
    return chunker.feed(text) + chunker.flush()
