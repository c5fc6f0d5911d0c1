"""Text front-end: languages, voice-design instructs, prompt punctuation, duration estimates.

Plain Python on strings, reproducing the reference's behaviour exactly for valid input; invalid
input raises ``InputError`` saying what to change, where the reference would crash or carry on.

Units:
    frames   codec frames (``FRAME_RATE`` = 25 per second); a frame is one column of 8 codes
    weight   relative speaking time of one character, 1.0 = one Latin letter
    chars    Python ``str`` characters (code points): the unit of every length here

Per text item, ``generate()`` asks:
    language  -> resolve_language          id for ``<|lang_start|>…<|lang_end|>`` or None
    instruct  -> resolve_instruct          normalised voice-design items or None
    ref_text  -> add_punctuation           when a voice prompt is built with preprocessing
    length    -> estimate_target_frames    target frames (or ``duration`` * 25)
and of a voice reference, ``reference_pace_problem`` says when its transcript cannot be what
its clip says (the pace they imply is not speech). Free prose ("an old british man") is read
into instruct items by ``prose.instruct_from_prose``.
"""

from __future__ import annotations

import bisect
import difflib
import logging
import math
import operator
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from ..errors import InputError
from ..model.config import FRAME_RATE
from .languages import LANGUAGES
from . import limits
from .limits import validate_speed

logger = logging.getLogger(__name__)

# The reference decides "Chinese or not" by the CJK Unified Ideographs block alone, both for
# instruct language and for the end mark it appends; other Han blocks do not count.
_HAN = re.compile("[\u4e00-\u9fff]")


def _has_han(text: str) -> bool:
    return _HAN.search(text) is not None



# The one language map: id -> English name, and lower-case name -> id.
ID_TO_NAME = dict(LANGUAGES)
NAME_TO_ID = {name.lower(): lang_id for lang_id, name in LANGUAGES}


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
    if language in ID_TO_NAME:
        return language
    if key in NAME_TO_ID:
        return NAME_TO_ID[key]
    logger.warning(
        "Language %r is not supported%s; continuing without a language tag "
        "(language-agnostic). Use an id such as 'en', 'zh', 'ja', 'de' or an English name such "
        "as 'English'; %s.",
        language,
        language_hint(language),
        f"supported_language_ids() and supported_language_names() list all {len(ID_TO_NAME)}",
        extra={"listing": "languages"},  # a front end may name its own way to list them
    )
    return None


def language_hint(language: str) -> str:
    """' (did you mean ...?)' for a near miss of an id or name, else ''."""
    key = language.strip().lower()
    if key in ID_TO_NAME:
        lang_id = key
    elif key in NAME_TO_ID:
        lang_id = NAME_TO_ID[key]
    else:
        close = difflib.get_close_matches(key, NAME_TO_ID, n=1, cutoff=0.8)
        if not close:
            return ""
        lang_id = NAME_TO_ID[close[0]]
    return f" (did you mean {lang_id!r}, {ID_TO_NAME[lang_id]}?)"


def supported_language_ids() -> frozenset[str]:
    """All language ids the model knows (646)."""
    return frozenset(ID_TO_NAME)


def supported_language_names() -> frozenset[str]:
    """All language names, lower-case, as the reference lists them."""
    return frozenset(NAME_TO_ID)


def search_languages(query: str | None = None) -> list[tuple[str, str]]:
    """``(id, name)`` of every language whose id or name contains ``query`` (any case; None or
    blank: all), by name: what `omnicore languages --search` and the MCP tool list."""
    key = (query or "").strip().lower()
    rows = sorted(ID_TO_NAME.items(), key=lambda item: (item[1].lower(), item[0]))
    return [(i, n) for i, n in rows if key in i.lower() or key in n.lower()]


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
    if len(instruct) > limits.MAX_INSTRUCT_CHARS:
        raise InputError(f"instruct is {len(instruct):,} characters; the limit is "
                         f"{limits.MAX_INSTRUCT_CHARS:,}: name the voice-design items only.")
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
    lines = [f"unsupported voice-design item(s) in instruct {shorten(instruct)!r}:"]
    list_everything = False
    for raw, key in unknown:
        close = difflib.get_close_matches(key, _ALL_FORMS, n=1, cutoff=0.6)
        if close:
            choices = _category_choices(_FORM_CATEGORY[close[0]])
            lines.append(f"  {shorten(raw)!r}: did you mean {close[0]!r}? Choices for {choices}")
        else:
            lines.append(f"  {shorten(raw)!r}: not a known item")
            list_everything = True
    if list_everything:
        lines.append("Valid items by category:")
        lines += [f"  {_category_choices(cat)}" for cat in _CATEGORIES]
    lines.append(
        "Separate items with commas and use one item per category, all English (e.g. "
        "'female, low pitch, british accent') or all Chinese (e.g. '女，低音调，四川话')."
    )
    return "\n".join(lines)


def shorten(s: str, limit: int = 200) -> str:
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
    return frames_of_weight(text_weight(text), ref_text, ref_frames)


def frames_of_weight(weight: float, ref_text: str, ref_frames: int) -> float:
    """`_estimate_frames` of a text of `weight` (text_weight): what a planner inverts."""
    if ref_frames <= 0 or not ref_text:
        return 0.0
    ref_weight = text_weight(ref_text)
    if ref_weight == 0:
        return 0.0
    weight_per_frame = ref_weight / ref_frames
    frames = weight / weight_per_frame
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
# Reference pace: does a transcript fit its clip?
# ---------------------------------------------------------------------------

# The weights above measure speaking time in one unit for every script (an ideograph weighs what
# the letters of a syllable weigh), which is why the estimate can carry a clip's pace over to any
# text. The yardstick, "Nice to meet you." in one second, is a normal pace: about 14 units a
# second, some 170 English words a minute. Speech stays well within a factor of 3 of it either
# way (60 to 500 words a minute); a transcript further off is not this clip's (wrong, partial or
# extra words), and every length estimated from it is off by as much.
NORMAL_PACE = text_weight(_DEFAULT_REF_TEXT) / (_DEFAULT_REF_FRAMES / FRAME_RATE)  # units/s
PACE_FACTOR = 3.0
# A clip may keep up to a second of quiet at its ends; the slow side is judged without it.
PACE_EDGE_S = 1.0


def reference_pace_problem(ref_text: str, seconds: float) -> str | None:
    """What is wrong when ``ref_text`` cannot be what is said in ``seconds`` of a voice
    reference (its pace, by the character weights, is more than ``PACE_FACTOR`` from
    ``NORMAL_PACE``), else None. One line of ASCII, naming the pace and what to check."""
    weight = text_weight(ref_text)
    if seconds <= 0 or weight <= 0:
        return None
    expected = weight / NORMAL_PACE  # seconds the transcript takes at a normal pace
    pace = expected / seconds  # 1.0: a normal pace
    if pace > PACE_FACTOR:
        fix = ("is the transcript of this clip alone, with no words that are not spoken in it; "
               "outputs in this voice would be too short, their ends cut")
    elif expected * PACE_FACTOR < seconds - PACE_EDGE_S:
        fix = ("holds every word spoken in the clip (or cut the clip to the words); outputs in "
               "this voice would be too long and drawn out")
    else:
        return None
    return (f"ref_text does not fit its clip: {len(ref_text)} characters take about "
            f"{expected:.1f} s at a normal pace, but the clip is {seconds:.1f} s of audio, "
            f"{pace:.2g}x a normal speaking rate (speech stays within {1 / PACE_FACTOR:.2g}x to "
            f"{PACE_FACTOR:g}x). Check that ref_text {fix}.")
