"""Free prose (OpenAI's `instructions`) read into voice-design items (omnicore.text.prose): the
phrases LiveKit and Pipecat users write, each with the items it must give and what it must
report as ignored; and, for any prose at all, a result the strict reading accepts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.text import frontend, prose
from omnicore.text.prose import instruct_from_prose

# prose -> (the instruct it gives, what it reports as ignored)
CASES = [
    ("Speak warmly, like an old british man", ("elderly, british accent, male",
                                                ["Speak warmly, like an"])),
    ("a deep voice", ("low pitch", [])),
    ("A very deep, gravelly voice", ("very low pitch", ["gravelly voice"])),
    ("Speak in a high-pitched, squeaky voice", ("high pitch", ["Speak in a"])),
    ("You are a friendly young woman", ("young adult, female", ["You are a friendly"])),
    ("a cheerful teenage girl", ("teenager, female", ["a cheerful"])),
    ("Sound like a little girl", ("female, child", ["Sound like a"])),
    ("a kid", ("child", [])),
    ("a boy", ("male, child", [])),
    ("an elderly lady with an Australian accent", ("elderly, female, australian accent", [])),
    ("a middle-aged guy", ("middle-aged, male", [])),
    ("middle aged gentleman, Indian accent", ("middle-aged, male, indian accent", [])),
    ("Whisper softly", ("whisper", ["softly"])),
    ("whispering like a senior man", ("whisper, elderly, male", [])),
    ("in a hushed tone", ("whisper", [])),
    ("Speak with an English accent", ("british accent", ["Speak with an"])),
    ("a Scottish grandpa", ("british accent, elderly, male", [])),
    ("an American woman, upbeat and energetic", ("american accent, female",
                                                 ["upbeat and energetic"])),
    ("Talk like an Aussie bloke", ("australian accent", ["Talk like an", "bloke"])),
    ("Speak calmly, like an elderly man.", ("elderly, male", ["Speak calmly, like an"])),
    ("Speak cheerfully.", (None, ["Speak cheerfully"])),
    ("Be concise and professional", (None, ["Be concise and professional"])),
    ("female, low pitch", ("female, low pitch", [])),
    ("a man or a woman", ("male", ["woman (gender: kept 'male')"])),
    ("a young old man", ("young adult, male", ["old man (age: kept 'young adult')"])),
    ("a girl, elderly", ("female, elderly", [])),  # girl's implied child gives way silently
    ("Sichuan dialect, British accent", ("四川话", ["British accent (accent/dialect: kept "
                                                  "'四川话')"])),
    ("用四川话说", ("四川话", ["用", "说"])),
    ("一位声音低沉的老爷爷", ("低音调, 老年, 男", ["一位声音"])),
    ("温柔的年轻女性", ("青年, 女", ["温柔"])),
    ("小女孩，耳语", ("女, 儿童, 耳语", [])),
    ("东北口音的中年男人", ("东北话, 中年, 男", [])),
    ("male", ("male", [])),
    ("female", ("female", [])),  # "male" is not found inside "female"
    ("a 40-year-old", (None, ["a 40-year-old"])),  # "old" inside a hyphenated word: not a word
    ("   ", (None, [])),
    (None, (None, [])),
]


@pytest.mark.parametrize("text, expected", CASES, ids=[repr(c[0]) for c in CASES])
def test_everyday_prose_gives_the_models_items(text, expected):
    assert instruct_from_prose(text) == expected
    instruct, _ = expected
    if instruct is not None:  # what it gives, the model takes
        assert frontend.resolve_instruct(instruct) is not None


def test_the_table_covers_the_brief_and_names_only_vocabulary_items():
    forms = {f for i in frontend._VOCABULARY for f in (i.en, i.zh) if f is not None}
    assert {form for items in prose._TABLE.values() for form, _ in items} <= forms
    for word in ("old", "elderly", "aged", "senior", "young", "teenage", "child", "kid",
                 "middle-aged", "man", "woman", "guy", "lady", "boy", "girl", "deep", "squeaky",
                 "british", "american", "australian", "indian", "scottish", "whispering",
                 "老人", "年轻", "男人", "女人", "低沉", "耳语"):
        assert prose._norm(word) in prose._TABLE, word
    for item in frontend._VOCABULARY:  # every item can be asked for in prose, by its own name
        assert instruct_from_prose(f"Please use: {item.value}.")[0] == item.value


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted(prose._TABLE) + ["warmly", "and", ",", "very", "-"]),
                max_size=8).map(" ".join) | st.text(max_size=80))
def test_any_prose_gives_an_instruct_the_strict_reading_takes(text):
    """Never raises, one item per category, no accent with a dialect: what comes out is what
    resolve_instruct accepts, for English and Chinese speech."""
    instruct, ignored = instruct_from_prose(text)
    assert all(isinstance(s, str) and s for s in ignored)
    if instruct is not None:
        frontend.resolve_instruct(instruct, "Hello.")
        frontend.resolve_instruct(instruct, "你好。")
