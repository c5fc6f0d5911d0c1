"""Optional text normalisation: numbers, dates, times, currency ... written out as words.

Opt-in, as in the reference (`generate(..., normalize_text=True)`, `omnicore say
--normalize-text`): "2345" -> "two thousand three hundred forty five", "199" -> its Chinese
reading. The model reads digits poorly, so this helps text with numbers; it is off by default so
that the default output stays the reference's default output.

    language zh           WeTextProcessing's Chinese normaliser
    language en           WeTextProcessing's English normaliser
    any other language    num2words for bare integers ("123" -> "einhundertdreiundzwanzig");
                          a language num2words lacks keeps its digits
    no language           zh if the text has a CJK ideograph, else en

OmniVoice's inline control syntax survives: every `[...]` span (non-verbal tags such as
`[laughter]`, CMU pronunciations such as `[B EY1 S]`, whose stress digits would otherwise be
read as numbers) and, for Chinese, uppercase pinyin with a tone digit (`NI3`) are held out
verbatim; the text between them is normalised piece by piece, keeping the whitespace at each
piece's ends (the normalisers strip it, which would glue words to a tag).

This module mirrors the reference's `omnivoice.utils.text.normalize_text` line for line and
calls the same libraries with the same arguments, so the output is the reference's, string for
string (tests/test_normalize.py checks a few hundred cases dumped from it). One consequence
worth knowing: the reference asks the Chinese normaliser to keep interjections, erhua,
traditional characters and full-width forms, but WeTextProcessing's wheel ships prebuilt FSTs
(built with its defaults) and loads them whatever the arguments, so "啊，" is dropped, "那儿"
becomes "那", "體" becomes "体" and "，" becomes ",". omnicore does the same.

The libraries are the optional `tn` extra (pip install 'omnicore[tn]': WeTextProcessing,
pynini, num2words), imported on first use. The reference returns the text unchanged for other
languages when num2words is missing; here a missing library is a ConfigError whatever the
language, so that asking for normalisation never silently does nothing.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from typing import Callable

from ..errors import ConfigError, InputError
from .frontend import ID_TO_NAME, NAME_TO_ID

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'omnicore[tn]'"

# Any [...] span: non-verbal tags and CMU pronunciations alike.
_BRACKET_TAG_RE = re.compile(r"\[[^\[\]]*\]")
# Uppercase pinyin followed by a tone digit 1-5 (Chinese pronunciation control).
_PINYIN_TONE_RE = re.compile(r"[A-Z]+[1-5]")
_CJK_RE = re.compile(r"[\u4e00-\u9fff]")
_DIGITS_RE = re.compile(r"\d+")



def _missing(package: str, exc: ImportError) -> ConfigError:
    return ConfigError(
        f"normalize_text=True needs {package}, which is not importable ({exc}); install the "
        f"text-normalisation extra: {INSTALL_HINT} (WeTextProcessing, pynini, num2words; pynini "
        "has no wheel for macOS arm64: take it from conda-forge first, "
        "`conda install -c conda-forge pynini`), or leave normalize_text off.")


class _Lazy:
    """One WeTextProcessing normaliser, built on first use and shared by every thread.

    Building reads ~8 MB of FSTs (about 1 s for Chinese, 3 s for English) and normalising runs
    pynini code that is not documented as thread-safe, so both happen under a lock."""

    def __init__(self, module: str, kwargs: dict):
        self.module, self.kwargs = module, kwargs
        self.lock = threading.Lock()
        self.instance = None

    def load(self) -> "_Lazy":
        with self.lock:
            if self.instance is None:
                self.instance = self._build()
        return self

    def __call__(self, text: str) -> str:
        with self.lock:
            return self.instance.normalize(text)

    def _build(self):
        import importlib

        try:
            cls = importlib.import_module(self.module).Normalizer
        except ImportError as exc:
            raise _missing("WeTextProcessing (with pynini)", exc) from None
        # Its logger prints three INFO lines per normaliser about the cached FSTs; not ours to show.
        wetext = logging.getLogger("wetext")
        level = wetext.level
        wetext.setLevel(max(level, logging.WARNING))
        try:
            return cls(**self.kwargs)
        finally:
            wetext.setLevel(level)


# The reference's arguments exactly (see the module docstring for what the shipped FSTs do).
_ZH = _Lazy("tn.chinese.normalizer", dict(remove_interjections=False, remove_erhua=False,
                                          traditional_to_simple=False, remove_puncts=False,
                                          full_to_half=False))
_EN = _Lazy("tn.english.normalizer", {})


def _num2words():
    try:
        from num2words import num2words
    except ImportError as exc:
        raise _missing("num2words", exc) from None
    return num2words


def resolve_lang_code(language: str | None, text: str) -> str:
    """"zh", "en" or another language id for `text`: an id or English name (any case, as the
    reference lower-cases it), else the string itself lower-cased (num2words may know it);
    None, "" or "none" pick zh / en by the presence of a CJK ideograph."""
    if language is not None:
        if not isinstance(language, str):
            raise InputError(f"language must be a string or None, got {type(language).__name__}")
        code = language.strip().lower()
        if code and code != "none":
            if code in ("zh", "en") or code in ID_TO_NAME:
                return code
            return NAME_TO_ID.get(code, code)
    return "zh" if _CJK_RE.search(text) else "en"


def _num2words_segment(text: str, lang: str) -> str:
    num2words = _num2words()

    def repl(match):
        try:
            return num2words(int(match.group()), lang=lang)
        except Exception:  # a language or value num2words does not handle: keep the digits
            return match.group()

    return _DIGITS_RE.sub(repl, text)


def _normalize_segment(fn: Callable[[str], str], segment: str) -> str:
    """`fn` on the stripped segment, its edge whitespace put back; unchanged if `fn` fails."""
    if not segment.strip():
        return segment
    lead = segment[: len(segment) - len(segment.lstrip())]
    trail = segment[len(segment.rstrip()):]
    try:
        core = fn(segment.strip())
    except Exception as exc:  # the reference keeps such a segment as it was; so do we
        logger.warning("Text normalization failed on a segment (%s); keeping it unchanged.",
                       type(exc).__name__)
        return segment
    return lead + core + trail


def _apply_with_protection(text: str, fn: Callable[[str], str], protect_pinyin: bool) -> str:
    """`fn` on the text between protected spans, the spans themselves verbatim."""
    spans = [m.span() for m in _BRACKET_TAG_RE.finditer(text)]
    if protect_pinyin:
        spans += [m.span() for m in _PINYIN_TONE_RE.finditer(text)]
    if not spans:
        return _normalize_segment(fn, text)
    spans.sort()
    merged: list[list[int]] = []  # overlapping or touching spans become one
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, last = [], 0
    for start, end in merged:
        if start > last:
            out.append(_normalize_segment(fn, text[last:start]))
        out.append(text[start:end])
        last = end
    if last < len(text):
        out.append(_normalize_segment(fn, text[last:]))
    return "".join(out)


def normalize_text(text: str, language: str | None = None) -> str:
    """`text` with numbers, dates, currency ... in words; see the module docstring.

    language: an id ("en", "zh", "de") or English name ("German"); None picks zh / en by script.
    Empty or whitespace-only text comes back as it is. Raises ConfigError when the library the
    language needs is not installed (pip install 'omnicore[tn]').
    """
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
    if language is not None and not isinstance(language, str):
        raise InputError(f"language must be a string or None, got {type(language).__name__}")
    return _normalize(text, language)


@functools.lru_cache(maxsize=512)  # streaming checks a chunk before it speaks it: one run each
def _normalize(text: str, language: str | None) -> str:
    if not text.strip():
        return text
    code = resolve_lang_code(language, text)
    # The library is loaded first, so that a missing one is an error even for text that has
    # nothing to normalise outside its tags.
    if code == "zh":
        return _apply_with_protection(text, _ZH.load(), protect_pinyin=True)
    if code == "en":
        return _apply_with_protection(text, _EN.load(), protect_pinyin=False)
    _num2words()  # missing: one clear error, not a silent no-op
    return _apply_with_protection(text, lambda s: _num2words_segment(s, code), protect_pinyin=False)


def check_flag(enabled: object) -> bool:
    if not isinstance(enabled, bool):
        raise InputError(f"normalize_text must be True or False, got {enabled!r}")
    return enabled


def chunk_normalizer(enabled: object, language: str | None) -> Callable[[str], str]:
    """For text spoken piece by piece (streaming): a function normalising one piece in
    `language` (already resolved), or the identity when normalisation is off."""
    if not check_flag(enabled):
        return lambda text: text
    return lambda text: normalize_text(text, language)
