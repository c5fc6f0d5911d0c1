"""Free prose -> voice-design items: what OpenAI's `instructions` ("Speak warmly, like an old
british man") means in the model's instruct vocabulary (``frontend.instruct_vocabulary()``).

Words are matched, not understood: common words for age, gender, pitch, whispering, accents and
dialects (English and Chinese) are mapped onto the vocabulary's items, nothing else is. Every
target below is checked against the vocabulary when this module loads, so the table cannot name
an item the model lacks.
"""

from __future__ import annotations

import re

from .frontend import _FORM_CATEGORY, _VOCABULARY, _has_han, shorten

# Prose phrases (``|``-separated; a space or hyphen also matches the other) -> the vocabulary
# items they name (``,``-separated), by English form (the dialects by their Chinese form). An item after ``~`` is
# implied, used only when the prose names nothing else of its category: "a teenage girl" is a
# teenager, not a child. Accent adjectives and dialect place names are added from the
# vocabulary below, not listed here.
_SYNONYMS = (
    ("old|older|elderly|aged|senior|elder|老人|老年人|年迈|年长|老者", "elderly"),
    ("grandpa|grandfather|old man|老爷爷|老大爷", "elderly, male"),
    ("grandma|grandmother|old woman|old lady|老奶奶|老太太", "elderly, female"),
    ("middle age|middle aged|middle-aged|中年人", "middle-aged"),
    ("young|younger|youthful|young adult|年轻|年轻人", "young adult"),
    ("teen|teens|teenage|teenaged|teenager|adolescent|青少年", "teenager"),
    ("child|children|kid|kids|toddler|小孩|孩子|孩童|小朋友", "child"),
    ("man|men|male|guy|gentleman|gent|masculine|father|dad|男人|男性|男声|男士|男生", "male"),
    ("woman|women|female|lady|ladies|gal|feminine|mother|mom|mum|女人|女性|女声|女士|女生",
     "female"),
    ("boy|男孩", "male, ~child"),
    ("girl|女孩", "female, ~child"),
    ("little boy|young boy|小男孩", "male, child"),
    ("little girl|young girl|小女孩", "female, child"),
    ("very deep|very low|very low pitch|very low pitched|极低", "very low pitch"),
    ("deep|deeper|low pitch|low pitched|low voice|low tone|bass|baritone|低沉|浑厚|低音",
     "low pitch"),
    ("moderate pitch|medium pitch|normal pitch|mid pitch|中音", "moderate pitch"),
    ("high pitch|high pitched|high voice|high tone|squeaky|shrill|soprano|尖细|尖声|高音|高亢",
     "high pitch"),
    ("very high|very high pitch|very high pitched|very squeaky|极高", "very high pitch"),
    ("whisper|whispers|whispering|whispered|whispery|hushed|悄悄话|低语|轻声细语", "whisper"),
    ("english accent|england|uk|scottish|welsh|英式|英音", "british accent"),
    ("america|usa|美国口音|美音", "american accent"),
    ("aussie|australia", "australian accent"),
    ("india", "indian accent"),
    ("canada", "canadian accent"),
    ("korea", "korean accent"),
    ("japan", "japanese accent"),
    ("russia", "russian accent"),
    ("portugal", "portuguese accent"),
    ("sichuanese", "四川话"),
    ("dongbei|northeastern dialect|northeastern chinese", "东北话"),
)


def _norm(phrase: str) -> str:
    """The key of a phrase: lower case, a run of spaces and hyphens as one space."""
    return re.sub(r"[\s-]+", " ", phrase.strip().lower())


def _vocabulary_phrases():
    """The vocabulary's own forms, and the words its labels give: an accent's adjective
    ("british"), its Chinese name ("英国口音"); a dialect's place ("sichuan dialect", "四川口音")."""
    for item in _VOCABULARY:
        target = item.value
        for form in (item.en, item.zh):
            if form is not None:
                yield form, target
        en_label, zh_label = item.label.split(" / ")
        if item.category == "accent":
            yield item.en.removesuffix(" accent"), target
            yield zh_label, target
        elif item.category == "dialect":
            yield en_label, target
            place = item.zh.removesuffix("话")
            yield place + "口音", target
            yield place + "方言", target


def _build_table() -> dict[str, tuple[tuple[str, bool], ...]]:
    """Normalised phrase -> ((vocabulary form, implied?), ...)."""
    table = {_norm(p): ((t, False),) for p, t in _vocabulary_phrases()}
    for phrases, targets in _SYNONYMS:
        items = tuple((t.strip().lstrip("~"), t.strip().startswith("~"))
                      for t in targets.split(","))
        for form, _ in items:
            if form not in _FORM_CATEGORY:  # the table may only name the model's items
                raise AssertionError(f"{form!r} is not a voice-design item")
        for phrase in phrases.split("|"):
            table[_norm(phrase)] = items
    return table


_TABLE = _build_table()


def _pattern(phrase: str) -> str:
    # An English phrase is whole words ("male" is not found in "female", "aged" not in
    # "middle-aged"); a Chinese one any substring.
    body = r"[\s-]+".join(re.escape(w) for w in phrase.split(" "))
    return body if _has_han(phrase) else r"(?<![\w-])" + body + r"(?![\w-])"


# Longest first, so "very deep" wins over "deep" and "british accent" over "british"; a noun
# after an English phrase ("a deep voice", "sichuan dialect") belongs to it.
_PROSE = re.compile(
    "(?P<phrase>" + "|".join(_pattern(p) for p in sorted(_TABLE, key=len, reverse=True)) + ")"
    r"(?:[\s-]+(?:voice|voiced|tone|pitch|pitched|accent|dialect|speaker|register)(?![\w-]))?",
    re.IGNORECASE)
_EDGES = " \t\n\r.,;:!?\"'()[]-–—，。；：！？、（）的"
# A fragment of only these words is glue between items, not an instruction left unused.
_FILLER = frozenset("a an the with in like as and or of voice tone 的 和 一个 一位".split())


def _unused(fragment: str) -> bool:
    words = fragment.strip(_EDGES).lower().replace(",", " ").split()
    return bool(words) and not set(words) <= _FILLER


def _slot(form: str) -> str:
    # An accent and a dialect exclude each other (English vs Chinese speech): one slot.
    cat = _FORM_CATEGORY[form]
    return "accent/dialect" if cat in ("accent", "dialect") else cat


def _written(form: str, phrase: str) -> str:
    """The form to put in the instruct: a vocabulary form as written, else the item's form in
    the phrase's language where it has one."""
    if phrase in _FORM_CATEGORY:
        return phrase
    item = next(i for i in _VOCABULARY if form in (i.en, i.zh))
    return item.zh if _has_han(phrase) and item.zh is not None else item.value


def instruct_from_prose(prose: str | None) -> tuple[str | None, list[str]]:
    """Free prose (OpenAI's `instructions`) -> (the voice-design items it names, as an instruct
    for ``resolve_instruct``, or None; what was ignored, in prose order).

    "Speak warmly, like an old british man" -> ("elderly, british accent, male", ["Speak warmly,
    like an"]). At most one item per category (an accent and a dialect share one): the first
    named is kept, a later different one is reported as ``"woman (gender: kept 'male')"``. An
    implied item ("girl" implies child) gives way silently to a named one. Never raises."""
    if prose is None or not prose.strip():
        return None, []
    matches = [(m, _TABLE[_norm(m.group("phrase"))]) for m in _PROSE.finditer(prose)]
    kept: dict[str, tuple[str, int, str]] = {}  # slot -> (as written, match index, form)
    notes: dict[int, list[str]] = {}
    for implied in (False, True):  # named items first, then implied ones where a slot is free
        for i, (m, items) in enumerate(matches):
            for form, soft in items:
                if soft != implied:
                    continue
                slot = _slot(form)
                if slot not in kept:
                    kept[slot] = (_written(form, _norm(m.group("phrase"))), i, form)
                elif kept[slot][2] != form and not soft:
                    notes.setdefault(i, []).append(f"{slot}: kept {kept[slot][0]!r}")
    ignored, start = [], 0
    for i, (m, _) in enumerate(matches):  # a repeat of a kept item is consumed: nothing lost
        ignored.append(prose[start:m.start()].strip(_EDGES))
        if i in notes:
            ignored.append(f"{m.group()} ({'; '.join(notes[i])})")
        start = m.end()
    ignored.append(prose[start:].strip(_EDGES))
    found = [written for written, _, _ in sorted(kept.values(), key=lambda k: k[1])]
    return (", ".join(found) or None), [shorten(s) for s in ignored if _unused(s)]
