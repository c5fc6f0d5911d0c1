"""Text front-end: languages, voice-design instructs, prompt text, duration estimates, chunking.

Everything here is plain Python on strings (no numpy) and reproduces the reference OmniVoice
package's behaviour exactly for valid input; invalid input raises ``InputError`` with a message
that says what to change, where the reference would crash or silently carry on.

Units used throughout:
    frames   codec frames at ``FRAME_RATE`` (25 per second); a frame is one column of 8 codes
    weight   relative speaking time of one character, 1.0 = one Latin letter
    chars    Python ``str`` characters (code points): the unit of every length here

How ``generate()`` uses this module, per text item (see ``plan_synthesis`` for long text):
    language  -> resolve_language          id for ``<|lang_start|>…<|lang_end|>`` or None
    instruct  -> resolve_instruct(instruct, text)   normalised item list or None
    ref_text  -> add_punctuation           only when a voice prompt is built with preprocessing
    pauses    -> split_pauses              [pause:1.5s] / <break time="2s"/> marks: segments
                                           and their silences (plan_synthesis plans each)
    length    -> estimate_target_frames    target frames (or ``duration`` * 25)
    long text -> chunk_text                chunk texts; plan_synthesis gives the whole plan
                                           (plan_pace, plan_chunk: also the stream's passes)
    streamed  -> TextChunker / split_text  the stream's chunks: a short first one, then sentences
(Joining reference and target text for the prompt is ``omnicore.tokenizer.combine_text``.)

Input limits (``MAX_*`` constants and ``validate_*``/``check_*`` functions, all here) keep the
memory of one call bounded: text length, output per call and per unmasking pass, working memory
of a pass (``forward_bytes``, from the model's dimensions), reference length and transcript,
pad/fade lengths, seeds. The API, the streaming planner, the CLI and the demo all use them.
"""

from __future__ import annotations

import bisect
import difflib
import logging
import math
import numbers
import operator
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from omnicore.errors import InputError
from omnicore.languages import LANGUAGES

__all__ = [
    "FRAME_RATE",
    "MAX_TEXT_CHARS",
    "MAX_DURATION_S",
    "validate_text",
    "validate_speed",
    "validate_duration",
    "MAX_PASS_S",
    "MAX_PASS_FRAMES",
    "MAX_PASS_BYTES",
    "MAX_PASS_POSITIONS",
    "MAX_GUIDANCE",
    "MAX_LAYER_PENALTY",
    "TEMPERATURE_RANGE",
    "T_SHIFT_RANGE",
    "validate_sampling",
    "MAX_REF_S",
    "MAX_REF_FRAMES",
    "MAX_REF_TEXT_CHARS",
    "MAX_EDGE_S",
    "MAX_REF_RMS",
    "MAX_SEED",
    "validate_ref_text",
    "validate_ref_frames",
    "validate_ref_rms",
    "validate_edges",
    "validate_seed",
    "check_total_frames",
    "check_pass_frames",
    "forward_bytes",
    "forward_flops",
    "check_pass_memory",
    "resolve_language",
    "supported_language_ids",
    "supported_language_names",
    "language_display_name",
    "language_choices",
    "InstructItem",
    "instruct_vocabulary",
    "resolve_instruct",
    "add_punctuation",
    "char_weight",
    "text_weight",
    "estimate_target_frames",
    "pack_sentences",
    "chunk_text",
    "ChunkPlan",
    "SynthesisPlan",
    "plan_synthesis",
    "plan_pace",
    "plan_chunk",
    "MAX_PAUSE_S",
    "Pause",
    "PauseScanner",
    "PausedText",
    "split_pauses",
    "pause_samples",
    "ChunkRule",
    "TextChunker",
    "split_text",
]

logger = logging.getLogger(__name__)

FRAME_RATE = 25  # codec frames per second (24 kHz audio, hop 960)

# The reference decides "Chinese or not" by the CJK Unified Ideographs block alone, both for
# instruct language and for the end mark it appends; other Han blocks do not count.
_HAN = re.compile("[\u4e00-\u9fff]")


def _has_han(text: str) -> bool:
    return _HAN.search(text) is not None


# ---------------------------------------------------------------------------
# Input limits
# ---------------------------------------------------------------------------

# About 20 minutes of English speech per call: far beyond any paragraph, yet a wrongly piped
# file fails at once instead of running for hours (why: benchmarks/README.md, design notes).
MAX_TEXT_CHARS = 20_000

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


def _real(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputError(f"{what} must be a number, got {type(value).__name__}.")
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range, e.g. 10**400
        raise InputError(f"{what} must be a finite number, got an integer of "
                         f"{int(value).bit_length()} bits.") from None
    if not math.isfinite(value):
        raise InputError(f"{what} must be a finite number, got {value}.")
    return value


def validate_speed(speed: object) -> float | None:
    """``None`` (default speed) or a finite speed factor > 0 as float; else ``InputError``.

    The reference silently ignores a speed <= 0; here it is an error, since it is never meant.
    """
    if speed is None:
        return None
    value = _real(speed, "speed")
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
    value = _real(duration, "duration")
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

# Working memory of one forward pass (all rows packed together), estimated from the model's
# dimensions by ``forward_bytes``. A fixed budget rather than the machine's free memory, so that
# whether an input is accepted does not depend on what else runs. The default settings need
# about 0.45 GB with the released model (a 10 s voice reference, 30 s of output).
MAX_PASS_BYTES = 4 * 2**30

# Positions of one pass's row: instruct/language/text tokens, reference frames, target frames.
# The longest legitimate row (a 180 s pass with a 60 s reference and both transcripts) is under
# 8,192; a long text squeezed into a short duration is what goes beyond (its tokens all sit in
# one row, and attention is quadratic in the row).
MAX_PASS_POSITIONS = 8192

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

# Seeds feed numpy's default_rng, which takes any non-negative integer; 64 bits is plenty.
MAX_SEED = 2**64 - 1

# Sampling knobs. Scoring runs in float32 (log-probabilities of a few hundred at most), so these
# bounds keep every product and quotient finite: guidance c + g (c - u), the layer penalty times
# a codebook index, a score divided by a temperature, and the shifted schedule. They are far
# outside what changes the output meaningfully (reference defaults: 2, 5, 5, 0, t_shift 0.1).
MAX_GUIDANCE = 100.0
MAX_LAYER_PENALTY = 1000.0
TEMPERATURE_RANGE = (1e-3, 1e3)  # or exactly 0 (greedy / pure confidence order)
T_SHIFT_RANGE = (1e-3, 1e3)


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
    value = _real(ref_rms, what)
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
        value = _real(v, name)
        if not 0 <= value <= MAX_EDGE_S:
            raise InputError(
                f"{name} is {value:g} s; it must lie in [0, {MAX_EDGE_S:g}] s (the reference "
                "uses 0.1 s). Add longer silence to the saved audio instead."
            )
        out.append(value)
    return out[0], out[1]


def validate_seed(seed: object, n: int = 1) -> list[int | None]:
    """One seed per item from ``seed``: ``None`` (fresh entropy), one integer in
    [0, ``MAX_SEED``] for every item, or a list/tuple of ``n`` such integers (or ``None``)."""
    def one(s):
        if s is None:
            return None
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise InputError(f"seed must be an integer >= 0 or None, got {type(s).__name__} {s!r}.")
        if not 0 <= s <= MAX_SEED:
            raise InputError(f"seed must lie in [0, 2**64 - 1], got {s}; use e.g. seed=42.")
        return int(s)

    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise InputError(f"got {len(seed)} seeds for {n} texts; pass one seed or one per text.")
        return [one(s) for s in seed]
    return [one(seed)] * n


def validate_sampling(gen) -> None:
    """The sampling knobs of a ``GenerationConfig`` within the bounds above, else
    ``InputError`` (past them float32 scoring overflows and cells stay masked)."""
    def within(name, lo, hi, zero_ok=False):
        value = _real(getattr(gen, name), name)
        if not (lo <= value <= hi or (zero_ok and value == 0)):
            zero = "0 or " if zero_ok else ""
            raise InputError(f"{name} is {value:g}; it must be {zero}between {lo:g} and {hi:g}.")

    within("guidance_scale", 0.0, MAX_GUIDANCE)
    within("layer_penalty_factor", 0.0, MAX_LAYER_PENALTY)
    within("position_temperature", *TEMPERATURE_RANGE, zero_ok=True)
    within("class_temperature", *TEMPERATURE_RANGE, zero_ok=True)
    within("t_shift", *T_SHIFT_RANGE)


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


def forward_bytes(cfg, lengths, num_out, class_sampling: bool = False) -> int:
    """Estimated peak working memory (bytes) of one forward pass plus scoring, for packed rows
    of ``lengths`` positions whose last ``num_out`` positions are scored, from the model's
    dimensions (``cfg`` an ``OmniVoiceConfig``; float32 throughout).

    Counts what ``backbone.make_packing``/``make_workspace``/``forward_rows`` and the scoring
    allocate: per packed token the residual, norm and sub-block buffers [3 D], query, grouped
    query and attention output [3 H*E], keys and values [2 K*E], the MLP's gate and up [2 F],
    rotary tables and their temporaries [4 E] and the embedding gather [(C+1) D] plus its ids;
    per the longest row its [K, L*G, L] scores with [K, L*G, E] outputs; per scored position
    the heads' logits [C*V] (freed before the next step's forward) and two [D] rows; per item
    the [C, T, V] log-probabilities, or four times that with class sampling (negated copy and
    int64 indices of the top-k selection). Measured on the tiny checkpoint, a pass's peak
    allocations are at least 2/3 of this estimate.
    """
    q = cfg.llm_config
    C, V = cfg.num_audio_codebook, cfg.audio_vocab_size
    D, F, E = q.hidden_size, q.intermediate_size, q.head_dim
    H, K = q.num_attention_heads, q.num_key_value_heads
    G = H // K
    N, L, n = sum(lengths), max(lengths), sum(num_out)
    per_token = 3 * D + 3 * H * E + 2 * K * E + 2 * F + 4 * E + (C + 1) * D + 2 * C
    attention = K * G * L * (L + E + 1)
    logits = n * (C * V + 2 * D)
    scoring = max(num_out) * C * V * (4 if class_sampling else 1)
    return 4 * (N * per_token + attention + logits + scoring)


def forward_flops(cfg, lengths, num_out) -> int:
    """Floating-point operations of the GEMMs of one forward pass over packed rows of
    ``lengths`` positions whose last ``num_out`` positions are scored by the heads: per token
    every layer's projections and MLP, per row its attention scores and weighted values
    (quadratic in its length), per scored position the audio heads. The engine's cost model."""
    q = cfg.llm_config
    D, F, E = q.hidden_size, q.intermediate_size, q.head_dim
    H, K, layers = q.num_attention_heads, q.num_key_value_heads, q.num_hidden_layers
    per_token = 2 * D * (H * E + 2 * K * E) + 2 * H * E * D + 3 * 2 * D * F
    per_square = 2 * 2 * H * E  # q k^T and p v, every head
    heads = 2 * D * cfg.num_audio_codebook * cfg.audio_vocab_size
    return (layers * (per_token * sum(lengths) + per_square * sum(L * L for L in lengths))
            + heads * sum(num_out))


def check_pass_memory(cfg, lengths, num_out, class_sampling: bool = False) -> int:
    """``forward_bytes`` of one pass if its rows have at most ``MAX_PASS_POSITIONS`` positions
    and it fits ``MAX_PASS_BYTES``, else ``InputError``."""
    if max(lengths) > MAX_PASS_POSITIONS:
        raise InputError(
            f"one generation pass would hold {max(lengths):,} positions (text tokens, voice "
            f"reference and {max(num_out) / FRAME_RATE:.1f} s of target); the limit is "
            f"{MAX_PASS_POSITIONS:,}. The text is too long for its duration: ask for a longer "
            "duration or a slower speed, split the text into several calls, or use a shorter "
            "voice reference and transcript."
        )
    need = forward_bytes(cfg, lengths, num_out, class_sampling)
    if need > MAX_PASS_BYTES:
        raise InputError(
            f"one generation pass ({max(lengths):,} positions: prompt, voice reference and "
            f"{max(num_out) / FRAME_RATE:.0f} s of target) would need about {need / 2**30:.1f} "
            f"GiB of working memory; the limit is {MAX_PASS_BYTES / 2**30:g} GiB. Shorten the "
            "sentence (add punctuation so long text is cut into ~15 s pieces), use a shorter "
            "voice reference and transcript, or ask for a shorter duration."
        )
    return need


# ---------------------------------------------------------------------------
# Languages
# ---------------------------------------------------------------------------

_ID_TO_NAME = dict(LANGUAGES)
_NAME_KEY_TO_ID = {name.lower(): lang_id for lang_id, name in LANGUAGES}


def resolve_language(language: str | None) -> str | None:
    """Language id for the prompt, or ``None`` for language-agnostic synthesis.

    Accepts an id exactly as listed (``"en"``, ``"zh"``, ``"yue"``; ids are case-sensitive, as in
    the reference, so ``"EN"`` is not an id) or an English name in any case (``"english"``,
    ``"ENGLISH"``). ``None`` and the string ``"none"`` (any case) mean no language. Anything else
    logs a warning (with a did-you-mean when one is close) and gives ``None``, as the reference
    does. Idempotent: a returned id resolves to itself.
    """
    if language is None:
        return None
    if not isinstance(language, str):
        raise InputError(
            f"language must be a string (an id such as 'en' or a name such as 'English') or "
            f"None, got {type(language).__name__}."
        )
    key = language.lower()
    if key == "none":
        return None
    if language in _ID_TO_NAME:
        return language
    if key in _NAME_KEY_TO_ID:
        return _NAME_KEY_TO_ID[key]
    logger.warning(
        "Language %r is not supported%s; continuing without a language tag "
        "(language-agnostic). Use an id such as 'en', 'zh', 'ja', 'de' or an English name such "
        "as 'English'; supported_language_ids() and supported_language_names() list all %d.",
        language,
        _language_hint(language),
        len(_ID_TO_NAME),
    )
    return None


def _language_hint(language: str) -> str:
    """' (did you mean ...?)' for a near miss of an id or name, else ''."""
    key = language.strip().lower()
    if key in _ID_TO_NAME:
        lang_id = key
    elif key in _NAME_KEY_TO_ID:
        lang_id = _NAME_KEY_TO_ID[key]
    else:
        close = difflib.get_close_matches(key, _NAME_KEY_TO_ID, n=1, cutoff=0.8)
        if not close:
            return ""
        lang_id = _NAME_KEY_TO_ID[close[0]]
    return f" (did you mean {lang_id!r}, {_ID_TO_NAME[lang_id]}?)"


def supported_language_ids() -> frozenset[str]:
    """All language ids the model knows (646)."""
    return frozenset(_ID_TO_NAME)


def supported_language_names() -> frozenset[str]:
    """All language names, lower-case, as the reference lists them."""
    return frozenset(_NAME_KEY_TO_ID)


def language_display_name(lang_id: str) -> str:
    """English display name of a language id (``"en"`` -> ``"English"``); ``InputError`` if
    the id is unknown."""
    try:
        return _ID_TO_NAME[lang_id]
    except (KeyError, TypeError):
        raise InputError(f"unknown language id {lang_id!r}.") from None


def language_choices() -> list[tuple[str, str]]:
    """``(label, id)`` pairs for a searchable picker, e.g. ``("English (en)", "en")``, by name."""
    return [(f"{name} ({lang_id})", lang_id) for lang_id, name in LANGUAGES]


# ---------------------------------------------------------------------------
# Voice-design instructs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class InstructItem:
    """One voice attribute. ``en``/``zh`` are the forms the model reads (``None`` where the
    attribute has no such form: accents are English-only, dialects Chinese-only); ``label`` is a
    bilingual text for pickers (its translations of accents and dialects are display-only)."""

    category: str
    en: str | None
    zh: str | None
    label: str

    @property
    def value(self) -> str:
        """The form to put in an instruct string (resolve_instruct unifies the language)."""
        return self.en if self.en is not None else self.zh


# Each category allows at most one item per instruct.
_VOCABULARY = (
    InstructItem("gender", "male", "男", "Male / 男"),
    InstructItem("gender", "female", "女", "Female / 女"),
    InstructItem("age", "child", "儿童", "Child / 儿童"),
    InstructItem("age", "teenager", "少年", "Teenager / 少年"),
    InstructItem("age", "young adult", "青年", "Young Adult / 青年"),
    InstructItem("age", "middle-aged", "中年", "Middle-aged / 中年"),
    InstructItem("age", "elderly", "老年", "Elderly / 老年"),
    InstructItem("pitch", "very low pitch", "极低音调", "Very Low Pitch / 极低音调"),
    InstructItem("pitch", "low pitch", "低音调", "Low Pitch / 低音调"),
    InstructItem("pitch", "moderate pitch", "中音调", "Moderate Pitch / 中音调"),
    InstructItem("pitch", "high pitch", "高音调", "High Pitch / 高音调"),
    InstructItem("pitch", "very high pitch", "极高音调", "Very High Pitch / 极高音调"),
    InstructItem("style", "whisper", "耳语", "Whisper / 耳语"),
    InstructItem("accent", "american accent", None, "American Accent / 美式口音"),
    InstructItem("accent", "british accent", None, "British Accent / 英国口音"),
    InstructItem("accent", "australian accent", None, "Australian Accent / 澳大利亚口音"),
    InstructItem("accent", "chinese accent", None, "Chinese Accent / 中国口音"),
    InstructItem("accent", "canadian accent", None, "Canadian Accent / 加拿大口音"),
    InstructItem("accent", "indian accent", None, "Indian Accent / 印度口音"),
    InstructItem("accent", "korean accent", None, "Korean Accent / 韩国口音"),
    InstructItem("accent", "portuguese accent", None, "Portuguese Accent / 葡萄牙口音"),
    InstructItem("accent", "russian accent", None, "Russian Accent / 俄罗斯口音"),
    InstructItem("accent", "japanese accent", None, "Japanese Accent / 日本口音"),
    InstructItem("dialect", None, "河南话", "Henan Dialect / 河南话"),
    InstructItem("dialect", None, "陕西话", "Shaanxi Dialect / 陕西话"),
    InstructItem("dialect", None, "四川话", "Sichuan Dialect / 四川话"),
    InstructItem("dialect", None, "贵州话", "Guizhou Dialect / 贵州话"),
    InstructItem("dialect", None, "云南话", "Yunnan Dialect / 云南话"),
    InstructItem("dialect", None, "桂林话", "Guilin Dialect / 桂林话"),
    InstructItem("dialect", None, "济南话", "Jinan Dialect / 济南话"),
    InstructItem("dialect", None, "石家庄话", "Shijiazhuang Dialect / 石家庄话"),
    InstructItem("dialect", None, "甘肃话", "Gansu Dialect / 甘肃话"),
    InstructItem("dialect", None, "宁夏话", "Ningxia Dialect / 宁夏话"),
    InstructItem("dialect", None, "青岛话", "Qingdao Dialect / 青岛话"),
    InstructItem("dialect", None, "东北话", "Northeast Dialect / 东北话"),
)

_CATEGORIES = tuple(dict.fromkeys(item.category for item in _VOCABULARY))
_CATEGORY_NOTE = {"accent": "English speech only", "dialect": "Chinese speech only"}
_EN_TO_ZH = {i.en: i.zh for i in _VOCABULARY if i.en is not None and i.zh is not None}
_ZH_TO_EN = {zh: en for en, zh in _EN_TO_ZH.items()}
_FORM_CATEGORY = {
    form: i.category for i in _VOCABULARY for form in (i.en, i.zh) if form is not None
}
_ALL_FORMS = sorted(_FORM_CATEGORY)

# Items are separated by ASCII or full-width commas, with any whitespace around them.
_INSTRUCT_SEPARATOR = re.compile(r"\s*[,，]\s*")


def instruct_vocabulary() -> dict[str, list[InstructItem]]:
    """Voice-design items by category, in a stable display order (gender, age, pitch, style,
    accent, dialect). At most one item per category may appear in an instruct."""
    return {cat: [i for i in _VOCABULARY if i.category == cat] for cat in _CATEGORIES}


def resolve_instruct(
    instruct: str | None, text: str | None = None, *, use_zh: bool | None = None
) -> str | None:
    """Validate a voice-design instruct and return it in the model's canonical form.

    ``instruct`` is a list of items separated by ``,`` or ``，`` (English items in any case).
    The items are unified into one language: Chinese when the synthesis ``text`` contains a CJK
    ideograph (or ``use_zh=True``; ``use_zh`` overrides ``text``), English otherwise - except
    that a dialect forces Chinese and an accent forces English. The result is joined with
    ``", "`` (English) or ``"，"`` (Chinese). ``None`` or a blank instruct gives ``None``; an
    instruct of separators only gives ``""`` (the reference's value; both mean "no instruct").

    Raises ``InputError`` for an unknown item (naming it, the closest known item and that
    item's category choices), for a dialect together with an accent, and for two items of one
    category (after unification, so ``"male, 男"`` is a clash). Checks run in that order, as
    the reference's do. Idempotent for a fixed language choice.
    """
    if instruct is None:
        return None
    if not isinstance(instruct, str):
        raise InputError(f"instruct must be a string or None, got {type(instruct).__name__}.")
    if use_zh is None:
        if text is not None and not isinstance(text, str):
            raise InputError(f"text must be a string, got {type(text).__name__}.")
        use_zh = bool(text) and _has_han(text)
    stripped = instruct.strip()
    if not stripped:
        return None

    raw_items = [part for part in _INSTRUCT_SEPARATOR.split(stripped) if part]
    keys = [part.strip().lower() for part in raw_items]
    unknown = [(raw, key) for raw, key in zip(raw_items, keys) if key not in _FORM_CATEGORY]
    if unknown:
        raise InputError(_unknown_items_message(stripped, unknown))

    categories = [_FORM_CATEGORY[key] for key in keys]
    if "dialect" in categories and "accent" in categories:
        dialect = keys[categories.index("dialect")]
        accent = keys[categories.index("accent")]
        raise InputError(
            f"instruct {stripped!r} combines a Chinese dialect ({dialect!r}) with an English "
            f"accent ({accent!r}): dialects apply to Chinese speech and accents to English "
            "speech. Keep only one of them."
        )
    if "dialect" in categories:
        use_zh = True
    elif "accent" in categories:
        use_zh = False

    to_language = _EN_TO_ZH if use_zh else _ZH_TO_EN
    unified = [to_language.get(key, key) for key in keys]

    clashes = []
    for cat in _CATEGORIES:
        hits = [item for item, c in zip(unified, categories) if c == cat]
        if len(hits) > 1:
            clashes.append(f"{' vs '.join(repr(h) for h in hits)} ({cat})")
    if clashes:
        raise InputError(
            f"instruct {stripped!r} has more than one item of a category: "
            f"{'; '.join(clashes)}. Keep at most one each of "
            f"{', '.join(_CATEGORIES)}."
        )
    return ("，" if use_zh else ", ").join(unified)


def _category_choices(cat: str) -> str:
    """'gender: male, female / 男，女' - the English and Chinese forms of one category."""
    items = [i for i in _VOCABULARY if i.category == cat]
    en = ", ".join(i.en for i in items if i.en is not None)
    zh = "，".join(i.zh for i in items if i.zh is not None)
    note = f" ({_CATEGORY_NOTE[cat]})" if cat in _CATEGORY_NOTE else ""
    return f"{cat}{note}: " + " / ".join(part for part in (en, zh) if part)


def _unknown_items_message(instruct: str, unknown: list[tuple[str, str]]) -> str:
    lines = [f"unsupported voice-design item(s) in instruct {_clip(instruct)!r}:"]
    list_everything = False
    for raw, key in unknown:
        close = difflib.get_close_matches(key, _ALL_FORMS, n=1, cutoff=0.6)
        if close:
            choices = _category_choices(_FORM_CATEGORY[close[0]])
            lines.append(f"  {_clip(raw)!r}: did you mean {close[0]!r}? Choices for {choices}")
        else:
            lines.append(f"  {_clip(raw)!r}: not a known item")
            list_everything = True
    if list_everything:
        lines.append("Valid items by category:")
        lines += [f"  {_category_choices(cat)}" for cat in _CATEGORIES]
    lines.append(
        "Separate items with commas and use one item per category, all English (e.g. "
        "'female, low pitch, british accent') or all Chinese (e.g. '女，低音调，四川话')."
    )
    return "\n".join(lines)


def _clip(s: str, limit: int = 200) -> str:
    return s if len(s) <= limit else s[:limit] + "…"


# ---------------------------------------------------------------------------
# Prompt text
# ---------------------------------------------------------------------------

# A reference text already ending in one of these keeps its ending.
_END_MARKS = frozenset(";:,.!?…)]}\"'“”‘’；：，。！？、）】")


def add_punctuation(text: str) -> str:
    """Strip ``text`` and give it an end mark when it has none: ``"。"`` if it contains a CJK
    ideograph, else ``"."``. The reference applies this to a voice prompt's reference text (with
    ``preprocess_prompt``), so the target text starts a new sentence after it."""
    text = text.strip()
    if text and text[-1] not in _END_MARKS:
        text += "。" if _has_han(text) else "."
    return text


# ---------------------------------------------------------------------------
# Duration estimate
# ---------------------------------------------------------------------------

# Speaking time per character relative to a Latin letter, by script class.
_WEIGHT = {
    "latin": 1.0,
    "greek": 1.0,
    "cyrillic": 1.0,
    "armenian": 1.0,
    "georgian": 1.0,
    "default": 1.0,
    "hebrew": 1.5,
    "arabic": 1.5,
    "thai_lao": 1.5,
    "indic": 1.8,
    "khmer_myanmar": 1.8,
    "kana": 2.2,
    "hangul": 2.5,
    "cjk": 3.0,  # one ideograph is a whole syllable
    "ethiopic": 3.0,
    "yi": 3.0,
    "digit": 3.5,  # a digit is read as a word or more
    "punctuation": 0.5,  # room for a pause
    "space": 0.2,
    "mark": 0.0,  # combining diacritics ride on their base letter
}

# (last code point, script class) in ascending order; a code point belongs to the first block
# whose end is >= it. Only letters and other non-symbol characters get here (categories
# M/P/S/Z/N are decided first). Adjacent blocks of one class are merged; the reference's own
# boundaries are kept, including its quirks (Greek Extended and general punctuation fall in the
# kana span up to U+309F, and controls count as Latin).
_BLOCKS = (
    (0x02AF, "latin"),  # Basic Latin .. IPA Extensions
    (0x03FF, "greek"),
    (0x052F, "cyrillic"),  # Cyrillic + Supplement
    (0x058F, "armenian"),
    (0x05FF, "hebrew"),
    (0x08FF, "arabic"),  # Arabic, Syriac, Arabic Supplement/Extended, Thaana, NKo, ...
    (0x0DFF, "indic"),  # Devanagari .. Sinhala
    (0x0EFF, "thai_lao"),
    (0x0FFF, "indic"),  # Tibetan
    (0x109F, "khmer_myanmar"),  # Myanmar
    (0x10FF, "georgian"),
    (0x11FF, "hangul"),  # Hangul Jamo
    (0x139F, "ethiopic"),  # Ethiopic + Supplement
    (0x177F, "default"),  # Cherokee, Canadian syllabics, Ogham, Runic, Philippine scripts
    (0x17FF, "khmer_myanmar"),  # Khmer
    (0x18FF, "default"),  # Mongolian, Canadian syllabics extended
    (0x19DF, "indic"),  # Limbu, Tai Le, New Tai Lue
    (0x19FF, "khmer_myanmar"),  # Khmer symbols
    (0x1C7F, "indic"),  # Buginese .. Ol Chiki
    (0x1C8F, "cyrillic"),  # Cyrillic Extended-C
    (0x1CBF, "georgian"),  # Georgian Extended
    (0x1CFF, "indic"),  # Sundanese supplement, Vedic extensions
    (0x1DBF, "latin"),  # phonetic extensions
    (0x1DFF, "default"),  # combining marks supplement
    (0x1EFF, "latin"),  # Latin Extended Additional (Vietnamese)
    (0x30FF, "kana"),  # .. Hiragana, Katakana
    (0x312F, "cjk"),  # Bopomofo
    (0x318F, "hangul"),  # Hangul compatibility jamo
    (0x9FFF, "cjk"),  # .. CJK Unified Ideographs
    (0xA4CF, "yi"),
    (0xA63F, "default"),  # Lisu, Vai
    (0xA69F, "cyrillic"),  # Cyrillic Extended-B
    (0xA6FF, "default"),  # Bamum
    (0xA7FF, "latin"),  # Latin Extended-D
    (0xA82F, "indic"),  # Syloti Nagri
    (0xA87F, "default"),  # Phags-pa
    (0xA95F, "indic"),  # Saurashtra .. Rejang
    (0xA97F, "hangul"),  # Hangul Jamo Extended-A
    (0xA9DF, "indic"),  # Javanese
    (0xA9FF, "khmer_myanmar"),  # Myanmar Extended-B
    (0xAA5F, "indic"),  # Cham
    (0xAA7F, "khmer_myanmar"),  # Myanmar Extended-A
    (0xAAFF, "indic"),  # Tai Viet, Meetei Mayek extensions
    (0xAB2F, "ethiopic"),  # Ethiopic Extended-A
    (0xAB6F, "latin"),  # Latin Extended-E
    (0xABBF, "default"),  # Cherokee supplement
    (0xABFF, "indic"),  # Meetei Mayek
    (0xD7AF, "hangul"),  # Hangul syllables
    (0xFAFF, "cjk"),  # (surrogates, private use) CJK compatibility ideographs
    (0xFDFF, "arabic"),  # Arabic presentation forms A
    (0xFE6F, "default"),  # variation selectors .. small form variants
    (0xFEFF, "arabic"),  # Arabic presentation forms B
    (0xFFEF, "latin"),  # half/full-width forms
)
_BLOCK_ENDS = tuple(end for end, _ in _BLOCKS)
_TATWEEL = 0x0640  # Arabic elongation stroke: no sound of its own

# The estimate's yardstick when there is no voice reference: this text takes one second.
_DEFAULT_REF_TEXT = "Nice to meet you."
_DEFAULT_REF_FRAMES = 25
# Below 50 frames (2 s) the linear estimate is too short to speak naturally; it is raised along
# a cube-root curve that meets the line at 50.
_SHORT_FRAMES = 50
_SHORT_EXPONENT = 1.0 / 3


@lru_cache(maxsize=8192)
def char_weight(char: str) -> float:
    """Speaking weight of one character (see ``_WEIGHT``).

    Uses the running Python's ``unicodedata`` for the general category, as the reference does:
    characters assigned in a newer Unicode version can weigh differently on another Python.
    """
    cp = ord(char)
    if 0x41 <= cp <= 0x5A or 0x61 <= cp <= 0x7A:
        return _WEIGHT["latin"]
    if cp == 0x20:
        return _WEIGHT["space"]
    if cp == _TATWEEL:
        return _WEIGHT["mark"]
    major = unicodedata.category(char)[0]
    if major == "M":
        return _WEIGHT["mark"]
    if major in "PS":
        return _WEIGHT["punctuation"]
    if major == "Z":
        return _WEIGHT["space"]
    if major == "N":
        return _WEIGHT["digit"]
    block = bisect.bisect_left(_BLOCK_ENDS, cp)
    if block < len(_BLOCKS):
        return _WEIGHT[_BLOCKS[block][1]]
    # Supplementary planes: from U+20001 on, CJK extensions dominate (U+20000 itself falls to
    # the default weight in the reference).
    return _WEIGHT["cjk"] if cp > 0x20000 else _WEIGHT["default"]


def text_weight(text: str) -> float:
    """Sum of character weights, added left to right in double precision.

    An explicit loop, not ``sum()``: since Python 3.12 ``sum`` of floats is compensated, which
    would shift the last bits (and occasionally a truncated frame count) against the reference
    run on Python 3.11.
    """
    total = 0
    for char in text:
        total += char_weight(char)
    return total


def _estimate_frames(text: str, ref_text: str, ref_frames: int) -> float:
    """Unrounded frame estimate of ``text`` at the speaking rate of ``ref_text`` in
    ``ref_frames`` frames, with the short-output boost."""
    if ref_frames <= 0 or not ref_text:
        return 0.0
    ref_weight = text_weight(ref_text)
    if ref_weight == 0:
        return 0.0
    weight_per_frame = ref_weight / ref_frames
    frames = text_weight(text) / weight_per_frame
    if frames < _SHORT_FRAMES:
        return _SHORT_FRAMES * (frames / _SHORT_FRAMES) ** _SHORT_EXPONENT
    return frames


def estimate_target_frames(
    text: str, ref_text: str | None = None, num_ref_frames: int | None = None, speed=1.0
) -> int:
    """Number of frames to generate for ``text``, exactly as the reference estimates it.

    With a voice reference (``ref_text`` non-empty and its length ``num_ref_frames``), the
    reference's speaking rate is carried over; otherwise "Nice to meet you." = 25 frames is the
    yardstick. Estimates under 50 frames are boosted (see ``_estimate_frames``), then divided
    by ``speed`` (``None`` = 1.0) and truncated, with a floor of 1 frame.

    An explicit ``duration`` (seconds) is not handled here: it replaces the estimate with
    ``max(1, int(duration * FRAME_RATE))`` - see ``plan_synthesis``.
    """
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}.")
    if ref_text is not None and not isinstance(ref_text, str):
        raise InputError(f"ref_text must be a string or None, got {type(ref_text).__name__}.")
    speed = 1.0 if speed is None else validate_speed(speed)
    if num_ref_frames is not None:
        try:
            num_ref_frames = operator.index(num_ref_frames)
        except TypeError:
            raise InputError(
                f"num_ref_frames must be an integer, got {type(num_ref_frames).__name__}."
            ) from None
    if num_ref_frames is None or not ref_text:
        ref_text, num_ref_frames = _DEFAULT_REF_TEXT, _DEFAULT_REF_FRAMES
    frames = _estimate_frames(text, ref_text, num_ref_frames)
    if speed != 1.0:
        frames = frames / speed
    if not math.isfinite(frames):
        raise InputError(f"speed {speed:g} is too small: the output length overflows.")
    return max(1, int(frames))


# ---------------------------------------------------------------------------
# Pauses: [pause:1.5s], [pause:500ms], <break time="500ms"/>
# ---------------------------------------------------------------------------

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
    return InputError(f"pause mark {_clip(mark, 60)!r} at character {at}: {why}. Write "
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
    chunk_duration = _real(chunk_duration, "chunk_duration")
    chunk_threshold = _real(chunk_threshold, "chunk_threshold")
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
                         chunk_threshold, frame_rate)
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
    for chunk in chunks:  # one sentence longer than a pass is never cut: refuse it up front
        check_pass_frames(chunk.frames, chunk.text, frame_rate)
    return SynthesisPlan(frames, pace, len(chunks) > 1, chunks, paused.pauses)


def _plan_one(text: str, frames: int, pace: float, ref_text, num_ref_frames, chunk_duration,
              chunk_threshold, frame_rate) -> SynthesisPlan:
    """The reference's plan of one text (no pause marks): one pass, or chunks past the
    threshold."""
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
            if ch in _STREAM_SENTENCE_MARKS or ch in _STREAM_CLAUSE_MARKS:
                word = "".join(self._chars[self._word_start:]).lower()
                if ch == "." and (word in _STREAM_ABBREVIATIONS or "." in word[:-1]
                                  or (len(word) == 2 and word[0].isalpha())):
                    continue  # "Dr." / "e.g." / "p.m." / "U.S." / an initial "J."
                self._mark = "sentence" if ch in _STREAM_SENTENCE_MARKS else "clause"
                self._mark_wide = ch in _STREAM_FULL_WIDTH

    def _append(self, ch: str) -> None:
        self._chars.append(ch)
        self._weight += char_weight(ch)

    def flush(self) -> list:
        """End of input: the rest is the last chunk (nothing when it is only whitespace)."""
        out: list = []
        for piece in self._pauses.flush():
            self._piece(piece, out)
        self._mark = None
        self._emit(out)
        return out


def split_text(text: str, rule: ChunkRule | None = None) -> list:
    """The chunks `stream` speaks for `text` (whole or in fragments: the same list): strings,
    and a `Pause` where a pause mark was."""
    chunker = TextChunker(rule)
    return chunker.feed(text) + chunker.flush()
