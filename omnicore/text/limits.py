"""Input limits: every bound that keeps one call's time and memory finite, and its check.

Each ``MAX_*`` is a bound in the user's units (characters, seconds) and each ``validate_*`` /
``check_*`` raises ``InputError`` saying what to change, before anything is allocated. The API,
the streaming planner, the CLI, the server and the demo all check through these. The sampling
knobs' bounds live beside ``GenerationConfig`` (model/config.py); the memory of one forward is
modelled from the workspace it describes (model/cost.py: ``forward_bytes``).
"""

from __future__ import annotations

from ..errors import AudioError, InputError
from ..model.config import FRAME_RATE, real_number

# ---------------------------------------------------------------------------
# Input limits
# ---------------------------------------------------------------------------

# About 20 minutes of English speech per call: far beyond any paragraph, yet a wrongly piped
# file fails at once instead of running for hours (why: benchmarks/README.md, design notes).
MAX_TEXT_CHARS = 20_000

# A voice-design instruct (or OpenAI's `instructions` prose it is read from): a few dozen
# words name every item there is; the bound keeps the reading of it a few milliseconds.
MAX_INSTRUCT_CHARS = 4_096

# The longest output one call may ask for, explicitly (``duration``) or through a slow ``speed``.
# Two hours covers the estimate of any text within MAX_TEXT_CHARS at normal speed (the heaviest
# script, digits at 3.5, gives about 83 minutes), while a typo such as duration=36000 is refused.
MAX_DURATION_S = 7200.0


def validate_text(text: object) -> str:
    """Return ``text`` unchanged when it is usable as synthesis text, else raise ``InputError``.

    Rejects non-strings, empty or whitespace-only text, text longer than ``MAX_TEXT_CHARS``, and
    text with unpaired UTF-16 surrogates (not encodable as UTF-8, so not tokenizable). The text is
    returned as given (not stripped), because the duration estimate counts its exact characters.
    """
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}.")
    if not text.strip():
        raise InputError("text is empty (or only whitespace): pass the words to speak.")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(
            f"text is {len(text):,} characters long; the limit is {MAX_TEXT_CHARS:,} per call "
            "(about 20 minutes of English speech). Split it into several calls, e.g. by chapter "
            "or paragraph."
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(
            f"text contains an unpaired surrogate code point at character {e.start}; decode the "
            "input as UTF-8 (errors='replace') before passing it."
        ) from None
    return text


def validate_speed(speed: object) -> float | None:
    """``None`` (default speed) or a finite speed factor > 0 as float; else ``InputError``.

    The reference silently ignores a speed <= 0; here it is an error, since it is never meant.
    """
    if speed is None:
        return None
    value = real_number(speed, "speed")
    if value <= 0:
        raise InputError(
            f"speed must be > 0 (1.0 is normal, 1.2 faster, 0.8 slower), got {speed}."
        )
    return value


def validate_duration(duration: object) -> float | None:
    """``None`` (estimate it) or a duration in seconds in (0, MAX_DURATION_S]; else ``InputError``.

    The reference turns a duration <= 0 into a single frame; here it is an error.
    """
    if duration is None:
        return None
    value = real_number(duration, "duration")
    if value <= 0:
        raise InputError(f"duration is in seconds and must be > 0, got {duration}.")
    if value > MAX_DURATION_S:
        raise InputError(
            f"duration {value:g} s is over the limit of {MAX_DURATION_S:g} s per call; split the "
            "text into several calls."
        )
    return value


# Limits that keep one call's memory bounded. Every size that a forward pass allocates grows
# with the length L of one unmasking pass (attention scores [L*G, L] per kv head, activations
# [N, intermediate], logits [8, T, 1025]), so each way of making L large is bounded here, before
# anything is allocated; the API, the streaming planner, the CLI and the demo all use these.

# Target frames of one unmasking pass (a long unpunctuated sentence is one pass): six times the
# reference's 30 s chunking threshold, still within MAX_PASS_BYTES (why: benchmarks/README.md).
MAX_PASS_S = 180.0
MAX_PASS_FRAMES = int(MAX_PASS_S * FRAME_RATE)

# Voice reference audio, in seconds of codec frames; also the longest clip the codec encodes in
# one go. The model was trained on 3-10 s clips and the reference package warns above 20 s;
# every unmasking pass re-reads the whole reference, and the encoder's activations grow with
# the clip (its convolutions run at up to the full 24 kHz rate with 64+ channels).
MAX_REF_S = 60.0
MAX_REF_FRAMES = int(MAX_REF_S * FRAME_RATE)

# Transcript of the voice reference: 60 s of fast speech is about 1,200 characters; its tokens
# sit in every pass.
MAX_REF_TEXT_CHARS = 2_000

# Silence padding and fade lengths (reference default 0.1 s each) act on the whole output.
MAX_EDGE_S = 5.0

# Root mean square of a reference clip, as `audio.reference_rms` measures it on samples in
# [-1, 1]: 1.0 is a full-scale square wave. It only matters below 0.1 (the output is scaled by
# rms / 0.1), so a louder clip may be stored as 1.0 without changing anything.
MAX_REF_RMS = 1.0


def validate_ref_text(ref_text: object, what: str = "ref_text") -> str:
    """``ref_text`` as a usable reference transcript (a non-blank string of at most
    ``MAX_REF_TEXT_CHARS`` characters, UTF-8 encodable), else ``InputError``."""
    if not isinstance(ref_text, str):
        raise InputError(f"{what} must be a string (the transcript of the reference audio), "
                         f"got {type(ref_text).__name__}.")
    if not ref_text.strip():
        raise InputError(f"{what} is empty: pass the transcript of the reference audio.")
    if len(ref_text) > MAX_REF_TEXT_CHARS:
        raise InputError(
            f"{what} is {len(ref_text):,} characters long; the limit is {MAX_REF_TEXT_CHARS:,} "
            f"(a {MAX_REF_S:g} s reference). Use a 3-10 s clip and its transcript."
        )
    try:
        ref_text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(
            f"{what} contains an unpaired surrogate code point at character {e.start}; decode "
            "it as UTF-8 (errors='replace') before passing it."
        ) from None
    return ref_text


def require_ref_text(ref_text: object) -> str:
    """A reference clip's transcript: required (omnicore has no speech recogniser to make one),
    then ``validate_ref_text``."""
    if ref_text is None or (isinstance(ref_text, str) and not ref_text.strip()):
        raise InputError(
            "ref_text is required: pass the transcript of the reference audio. (The reference "
            "package can transcribe it with Whisper; omnicore has no ASR built in.)")
    return validate_ref_text(ref_text)


def validate_ref_frames(frames: int, what: str = "the voice reference") -> int:
    """Reference length in codec frames: 1 .. ``MAX_REF_FRAMES``, else ``InputError``."""
    if frames < 1:
        raise InputError(f"{what} has no audio frames; re-create it from 3-10 s of speech.")
    if frames > MAX_REF_FRAMES:
        raise InputError(
            f"{what} is {frames / FRAME_RATE:.1f} s long ({frames:,} frames); the limit is "
            f"{MAX_REF_S:g} s. Cut the clip to 3-10 s of speech (the model was trained on such "
            "clips) and re-create the voice prompt."
        )
    return frames


def validate_ref_rms(ref_rms: object, what: str = "ref_rms") -> float:
    """Loudness of a reference clip: a finite number in (0, ``MAX_REF_RMS``], else
    ``InputError`` (a negative, zero, NaN or huge value would invert, silence or blow up the
    output)."""
    value = real_number(ref_rms, what)
    if not 0 < value <= MAX_REF_RMS:
        raise InputError(
            f"{what} is {value:g}; the RMS of a reference clip lies in (0, {MAX_REF_RMS:g}]. "
            "Re-create the voice prompt from the audio."
        )
    return value


def validate_edges(pad_duration: object, fade_duration: object) -> tuple[float, float]:
    """Padding and fade lengths in seconds, each in [0, ``MAX_EDGE_S``], else ``InputError``."""
    out = []
    for name, v in (("pad_duration", pad_duration), ("fade_duration", fade_duration)):
        value = real_number(v, name)
        if not 0 <= value <= MAX_EDGE_S:
            raise InputError(
                f"{name} is {value:g} s; it must lie in [0, {MAX_EDGE_S:g}] s (the reference "
                "uses 0.1 s). Add longer silence to the saved audio instead."
            )
        out.append(value)
    return out[0], out[1]


def check_total_frames(frames: int, frame_rate: int = FRAME_RATE) -> int:
    """The whole output of one call, in frames: at most ``MAX_DURATION_S``, else ``InputError``."""
    if frames > MAX_DURATION_S * frame_rate:
        raise InputError(
            f"the output would last about {frames / frame_rate / 60:.0f} minutes in all; the "
            f"limit is {MAX_DURATION_S / 60:g} minutes per call. Split the text into several "
            "calls, raise the speed or lower the duration."
        )
    return frames


def check_pass_frames(frames: int, text: str, frame_rate: int = FRAME_RATE) -> int:
    """Target frames of one unmasking pass: at most ``MAX_PASS_FRAMES``, else ``InputError``."""
    if frames > MAX_PASS_S * frame_rate:
        snippet = text if len(text) <= 40 else text[:37] + "..."
        raise InputError(
            f"one generation pass would be {frames / frame_rate:.0f} s of audio for the text "
            f"{snippet!r}; the limit is {MAX_PASS_S:g} s per pass. Long text is generated in "
            "~15 s pieces cut at sentence marks, but a sentence is never cut: add punctuation "
            "(. , ; ! ?) to split it, or ask for a shorter duration or a faster speed."
        )
    return frames


def check_clip_length(num_samples: int, sample_rate: int) -> None:
    """AudioError when a clip to encode is longer than MAX_REF_S seconds."""
    seconds = num_samples / sample_rate
    if seconds > MAX_REF_S:
        raise AudioError(
            f"the clip is {seconds:.1f} s long; at most {MAX_REF_S:g} s are encoded in "
            "one go (a voice reference works best with 3-10 s of speech). Cut the clip, or "
            "encode a long recording in parts.")
