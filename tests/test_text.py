"""Text front-end against the reference's recorded behaviour, plus properties on arbitrary input.

The table cases in fixtures/reference/text_cases.json were produced by running the reference
package (tools/reference/dump_text.py); every comparison here is exact.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.text import frontend, limits, planner
from omnicore.errors import InputError
from omnicore.text.languages import LANGUAGES

CASES = json.loads(
    (Path(__file__).parent / "fixtures" / "reference" / "text_cases.json").read_text("utf-8")
)
FAST = settings(max_examples=150, deadline=None)


# ---------------------------------------------------------------------------
# The fixture itself must be able to catch mistakes
# ---------------------------------------------------------------------------


def test_fixture_is_not_trivial():
    langs = CASES["language"]
    assert any(c["warned"] for c in langs) and any(c["output"] for c in langs)
    kinds = {c.get("kind", "ok") for c in CASES["instruct"]}
    assert kinds == {"ok", "unknown", "conflict", "dialect_with_accent"}
    assert any("，" in (c.get("output") or "") for c in CASES["instruct"])
    assert any(c["unknown"][0][1] for c in CASES["instruct"] if c.get("kind") == "unknown")
    frames = {c["frames"] for c in CASES["duration"]}
    assert len(frames) > 40 and 1 in frames
    plans = [c["plan"] for c in CASES["plan"]]
    assert sum(p["chunked"] and len(p["chunks"]) > 5 for p in plans) > 10
    assert any(p["chunked"] and len(p["chunks"]) == 1 for p in plans)
    assert any(not p["chunked"] for p in plans)
    assert len({len(c["chunks"]) for c in CASES["pack_sentences"]}) > 10


# ---------------------------------------------------------------------------
# Languages
# ---------------------------------------------------------------------------


def test_language_table_matches_reference():
    ours = sorted([lang_id, name.lower()] for lang_id, name in LANGUAGES)
    assert ours == CASES["languages"]
    assert len(frontend.supported_language_ids()) == len(LANGUAGES) == 646
    assert frontend.supported_language_names() == {name for _, name in CASES["languages"]}


@pytest.mark.parametrize("case", CASES["language"], ids=lambda c: repr(c["input"]))
def test_resolve_language_matches_reference(case, caplog):
    with caplog.at_level(logging.WARNING, logger="omnicore.text"):
        assert frontend.resolve_language(case["input"]) == case["output"]
    assert bool(caplog.records) == case["warned"]


def test_unknown_language_warning_says_what_to_do(caplog):
    with caplog.at_level(logging.WARNING, logger="omnicore.text"):
        assert frontend.resolve_language("EN") is None  # ids are case-sensitive, as in the reference
        assert frontend.resolve_language("Englsh") is None
    first, second = (r.getMessage() for r in caplog.records)
    assert "did you mean 'en'" in first and "supported_language_ids()" in first
    assert "did you mean 'en'" in second


def test_language_helpers():
    choices = frontend.language_choices()
    assert ("English (en)", "en") in choices and len(choices) == 646
    assert len({lang_id for _, lang_id in choices}) == 646
    with pytest.raises(InputError):
        frontend.resolve_language(42)


@FAST
@given(st.text(max_size=30))
def test_resolve_language_total_and_idempotent(language):
    lang_id = frontend.resolve_language(language)
    assert lang_id is None or lang_id in frontend.supported_language_ids()
    assert frontend.resolve_language(lang_id) == lang_id


# ---------------------------------------------------------------------------
# Voice-design instructs
# ---------------------------------------------------------------------------


def test_instruct_vocabulary_matches_reference():
    ref = CASES["instruct_vocabulary"]
    vocab = frontend.instruct_vocabulary()
    assert list(vocab) == ["gender", "age", "pitch", "style", "accent", "dialect"]
    items = [i for group in vocab.values() for i in group]
    assert sorted(i.en for i in items if i.en) == ref["valid_en"]
    assert sorted(i.zh for i in items if i.zh) == ref["valid_zh"]
    groups = sorted(sorted(f for i in g for f in (i.en, i.zh) if f) for g in vocab.values())
    assert groups == sorted(ref["exclusive_groups"])
    assert all(i.value in (i.en, i.zh) and " / " in i.label for i in items)


@pytest.mark.parametrize("case", CASES["instruct"], ids=lambda c: repr(c["instruct"]))
def test_resolve_instruct_matches_reference(case):
    if "error" not in case:
        assert frontend.resolve_instruct(case["instruct"], case["text"]) == case["output"]
        return
    with pytest.raises(InputError) as err:
        frontend.resolve_instruct(case["instruct"], case["text"])
    msg = str(err.value)
    if case["kind"] == "unknown":
        for raw, suggestion in case["unknown"]:
            if suggestion:
                assert f"{raw!r}: did you mean {suggestion!r}?" in msg
            else:
                assert f"{raw!r}: not a known item" in msg
    elif case["kind"] == "conflict":
        for group in case["conflicts"]:
            assert " vs ".join(repr(x) for x in group) in msg
    else:
        assert "combines a Chinese dialect" in msg


def test_instruct_error_names_item_suggestion_and_category_choices():
    with pytest.raises(InputError) as err:
        frontend.resolve_instruct("femal, britsh accent, robot")
    msg = str(err.value)
    assert "'femal': did you mean 'female'? Choices for gender: male, female / 男，女" in msg
    assert "did you mean 'british accent'? Choices for accent (English speech only)" in msg
    assert "'robot': not a known item" in msg and "dialect (Chinese speech only):" in msg
    with pytest.raises(ValueError):  # InputError is a ValueError, like the reference's error
        frontend.resolve_instruct("male, female")


def test_an_instruct_over_the_limit_is_refused_before_it_is_read():
    at_limit = ("male, " * 1000)[:limits.MAX_INSTRUCT_CHARS]
    with pytest.raises(InputError, match="male, male"):  # read: one gender too many
        frontend.resolve_instruct(at_limit)
    with pytest.raises(InputError, match="the limit is 4,096"):
        frontend.resolve_instruct(at_limit + "x")


def test_instruct_language_choice():
    assert frontend.resolve_instruct("Male, Low Pitch") == "male, low pitch"
    assert frontend.resolve_instruct("Male, Low Pitch", "你好") == "男，低音调"
    assert frontend.resolve_instruct("male, low pitch", use_zh=True) == "男，低音调"
    assert frontend.resolve_instruct("男，低音调", "你好", use_zh=False) == "male, low pitch"
    assert frontend.resolve_instruct("女, british accent", "你好") == "female, british accent"
    assert frontend.resolve_instruct("female, 四川话") == "女，四川话"
    assert frontend.resolve_instruct(None) is None and frontend.resolve_instruct("  ") is None
    with pytest.raises(InputError):
        frontend.resolve_instruct(["male"])


FORMS = sorted({f for g in frontend.instruct_vocabulary().values() for i in g for f in (i.en, i.zh) if f})


@FAST
@given(st.lists(st.sampled_from(FORMS), max_size=5), st.sampled_from([", ", ",", "，", " ， "]),
       st.booleans())
def test_resolve_instruct_of_vocabulary_is_idempotent(items, sep, use_zh):
    try:
        out = frontend.resolve_instruct(sep.join(items), use_zh=use_zh)
    except InputError:
        return
    if out:
        assert frontend.resolve_instruct(out, use_zh=use_zh) == out
        assert all(part in FORMS for part in out.replace("，", ", ").split(", "))


@FAST
@given(st.text(max_size=40), st.one_of(st.none(), st.text(max_size=10)))
def test_resolve_instruct_total(instruct, text):
    try:
        out = frontend.resolve_instruct(instruct, text)
    except InputError as e:
        assert str(e)
        return
    assert out is None or isinstance(out, str)


# ---------------------------------------------------------------------------
# Reference-text punctuation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES["punctuation"], ids=lambda c: repr(c["input"]))
def test_add_punctuation_matches_reference(case):
    assert frontend.add_punctuation(case["input"]) == case["output"]


@FAST
@given(st.text(max_size=40))
def test_add_punctuation_idempotent(text):
    once = frontend.add_punctuation(text)
    assert frontend.add_punctuation(once) == once


# ---------------------------------------------------------------------------
# Duration estimate
# ---------------------------------------------------------------------------


def test_text_weight_matches_reference_bit_for_bit():
    for case in CASES["weight"]:
        assert frontend.text_weight(case["text"]) == case["weight"], case["text"]


@pytest.mark.parametrize("case", CASES["duration"], ids=lambda c: repr(c["text"][:20]))
def test_estimate_target_frames_matches_reference(case):
    got = frontend.estimate_target_frames(case["text"], case["ref_text"], case["num_ref_frames"],
                                   case["speed"])
    assert got == case["frames"]


def test_estimate_yardstick_and_overrides():
    # "Nice to meet you." is 25 frames of weight; under 50 frames the cube-root boost applies.
    assert frontend.estimate_target_frames("Nice to meet you.") == int(50 * 0.5 ** (1 / 3))
    long = "Nice to meet you. " * 8
    assert frontend.estimate_target_frames(long, "Nice to meet you.", 25) > 50
    assert frontend.estimate_target_frames(long, speed=2.0) < frontend.estimate_target_frames(long)
    for bad in (0, -1.0, float("nan"), float("inf"), "fast", True):
        with pytest.raises(InputError):
            frontend.estimate_target_frames(long, speed=bad)
    with pytest.raises(InputError):
        frontend.estimate_target_frames(long, speed=1e-320)
    with pytest.raises(InputError):
        frontend.estimate_target_frames(long, "ref", 2.5)


@FAST
@given(st.text(max_size=60), st.one_of(st.none(), st.text(max_size=20)),
       st.one_of(st.none(), st.integers(-5, 500)), st.floats(0.1, 10))
def test_estimate_total(text, ref_text, num_ref_frames, speed):
    frames = frontend.estimate_target_frames(text, ref_text, num_ref_frames, speed)
    assert isinstance(frames, int) and frames >= 1


# ---------------------------------------------------------------------------
# Reference pace: a transcript that cannot be what its clip says
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("ref_text, seconds", [
    ("The quick brown fox jumps over the lazy dog.", 3.5),  # the fixture clip and its words
    ("Nice to meet you.", 1.0),  # the yardstick itself
    ("你好，很高兴认识你。", 2.5),  # one syllable an ideograph
    ("こんにちは、お元気ですか。", 2.0),
    ("안녕하세요, 만나서 반갑습니다.", 2.5),
    ("Call 555 0199 now.", 3.0),  # digits are read as words
    ("Hi.", 0.6), ("Yes.", 1.5),  # short: a second of quiet at the ends is allowed
])
def test_transcripts_that_fit_their_clips_pass(ref_text, seconds):
    assert frontend.reference_pace_problem(ref_text, seconds) is None


@pytest.mark.parametrize("ref_text, seconds, pace, says", [
    ("The quick brown fox jumps over the lazy dog. " * 4, 3.5, "3x", "too short, their ends cut"),
    ("你好，很高兴认识你。" * 5, 2.5, "3.5x", "too short"),
    ("Hi.", 3.0, "0.059x", "too long and drawn out"),
    ("The quick brown fox.", 10.0, "0.12x", "holds every word spoken in the clip"),
])
def test_transcripts_that_cannot_be_their_clips_are_named(ref_text, seconds, pace, says):
    problem = frontend.reference_pace_problem(ref_text, seconds)
    assert f"{pace} a normal speaking rate" in problem and says in problem
    assert f"the clip is {seconds:.1f} s of audio" in problem and "Check that ref_text" in problem
    assert problem.isascii() and "\n" not in problem  # fit for a log line and an HTTP header


@FAST
@given(st.text(min_size=1, max_size=80), st.floats(0.5, 1.5))
def test_the_bounds_are_a_factor_of_three_around_a_normal_pace(ref_text, pace):
    """At up to PACE_FACTOR from a normal pace nothing is said; beyond it, the side it is on."""
    expected = frontend.text_weight(ref_text) / frontend.NORMAL_PACE  # seconds at a normal pace
    if expected <= 0:
        assert frontend.reference_pace_problem(ref_text, 5.0) is None
        return
    assert frontend.reference_pace_problem(ref_text, expected / pace) is None
    fast = frontend.reference_pace_problem(ref_text, expected / (frontend.PACE_FACTOR * 1.01))
    assert fast is not None and "too short" in fast
    slow_s = expected * frontend.PACE_FACTOR * 1.01 + frontend.PACE_EDGE_S
    slow = frontend.reference_pace_problem(ref_text, slow_s)
    assert slow is not None and "too long" in slow


# ---------------------------------------------------------------------------
# Chunking and the generation plan
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES["pack_sentences"], ids=lambda c: repr(c["text"][:20]))
def test_pack_sentences_matches_reference(case):
    got = planner.pack_sentences(case["text"], case["chunk_len"], case["min_chunk_len"])
    assert got == case["chunks"]


def _plan_args(case):
    return dict(speed=case["speed"], duration=case["duration"],
                chunk_duration=case.get("audio_chunk_duration", 15.0),
                chunk_threshold=case.get("audio_chunk_threshold", 30.0))


@pytest.mark.parametrize("case", CASES["plan"], ids=lambda c: repr(c["text"][:20]))
def test_plan_synthesis_matches_reference(case):
    want = dict(case["plan"])
    if case["duration"] is not None and want["chunked"]:
        # The deliberate deviation: the reference's chunks, resized to last the duration asked.
        fitted = planner.fit_duration(tuple(planner.ChunkPlan(c["text"], c["frames"], None, None)
                                            for c in want["chunks"]), want["frames"])
        want["chunks"] = [dict(c, frames=f.frames) for c, f in zip(want["chunks"], fitted)]
    plan = planner.plan_synthesis(case["text"], case["ref_text"], case["num_ref_frames"],
                            **_plan_args(case))
    assert (plan.frames, plan.speed, plan.chunked) == (want["frames"], want["speed"],
                                                       want["chunked"])
    got = []
    for chunk in plan.chunks:
        ref_frames = {"prompt": case["num_ref_frames"], "chunk0": plan.chunks[0].frames,
                      None: None}[chunk.reference]
        got.append({"text": chunk.text, "frames": chunk.frames, "ref_text": chunk.ref_text,
                    "ref_frames": ref_frames})
    assert got == want["chunks"]
    if want["chunked"]:
        frames = want["frames"]
        assert planner.chunk_text(case["text"], frames, _plan_args(case)["chunk_duration"]) == [
            c["text"] for c in want["chunks"]]


def test_plan_modes():
    text = "The quick brown fox jumps over the lazy dog. " * 40
    auto = planner.plan_synthesis(text)
    assert auto.chunked and len(auto.chunks) > 2
    assert auto.chunks[0].reference is None
    assert {c.reference for c in auto.chunks[1:]} == {"chunk0"}
    assert {c.ref_text for c in auto.chunks[1:]} == {auto.chunks[0].text}
    clone = planner.plan_synthesis(text, "A reference.", 40)
    assert {c.reference for c in clone.chunks} == {"prompt"}
    short = planner.plan_synthesis("Hello.", duration=2.0)
    assert (short.frames, short.chunked, short.chunks[0].text) == (50, False, "Hello.")


def test_batch_items_are_planned_independently():
    batch = CASES["batch"]
    for i, text in enumerate(batch["texts"]):
        plan = planner.plan_synthesis(text, speed=batch["speed"][i], duration=batch["duration"][i])
        assert plan.frames == batch["frames"][i] and plan.speed == batch["speeds"][i]


@FAST
@given(st.text(min_size=1, max_size=400), st.integers(1, 3000))
def test_chunk_text_keeps_every_character(text, frames):
    chunks = planner.chunk_text(text, frames)
    assert all(c and c == c.strip() for c in chunks)
    assert "".join("".join(chunks).split()) == "".join(text.split())


@FAST
@given(st.text(max_size=300), st.one_of(st.none(), st.floats(allow_nan=True)),
       st.one_of(st.none(), st.floats(allow_nan=True)))
def test_plan_synthesis_total(text, speed, duration):
    try:
        plan = planner.plan_synthesis(text, speed=speed, duration=duration, chunk_threshold=2.0,
                                chunk_duration=1.0)
    except InputError as e:
        assert str(e)
        return
    assert plan.frames >= 1 and plan.chunks and all(c.frames >= 1 for c in plan.chunks)


# ---------------------------------------------------------------------------
# Input limits
# ---------------------------------------------------------------------------


def test_validate_text_limits():
    assert limits.validate_text(" hi ") == " hi "
    assert limits.validate_text("x" * limits.MAX_TEXT_CHARS)
    for bad in ("", " \n\t", "x" * (limits.MAX_TEXT_CHARS + 1), "bad \ud800 surrogate", None, b"hi"):
        with pytest.raises(InputError):
            limits.validate_text(bad)


def test_validate_speed_and_duration():
    assert limits.validate_speed(None) is None and limits.validate_speed(2) == 2.0
    assert limits.validate_duration(None) is None and limits.validate_duration(1.5) == 1.5
    for bad in (0, -1, float("nan"), float("inf"), "1", True):
        with pytest.raises(InputError):
            limits.validate_speed(bad)
        with pytest.raises(InputError):
            limits.validate_duration(bad)
    with pytest.raises(InputError):
        limits.validate_duration(limits.MAX_DURATION_S + 1)
    with pytest.raises(InputError):  # slow enough to exceed the output limit
        planner.plan_synthesis("你" * 19_000, speed=0.5)


@FAST
@given(st.text(max_size=200))
def test_validate_text_total(text):
    try:
        assert limits.validate_text(text) is text
    except InputError as e:
        assert str(e)


# ---------------------------------------------------------------------------
# Pause marks
# ---------------------------------------------------------------------------


def test_pause_marks_split_the_text():
    p = planner.split_pauses('One. [pause:1.5s] Two <break time="500ms"/>three [PAUSE: 250 MS ]'
                       "[pause:1s] four. <break strength='strong' time='2s' />")
    assert p.marked and p.segments == ("One. ", " Two ", "three ", " four. ")
    assert p.pauses == (0.0, 1.5, 0.5, 1.25, 2.0)  # marks in a row add up; a trailing one
    assert p.spoken == "One. Two three four."
    lead = planner.split_pauses("  [pause:0.2s] Hello.")
    assert lead.segments == (" Hello.",) and lead.pauses == (0.2, 0.0)
    assert planner.pause_samples(1.5, 24000) == 36000 and planner.pause_samples(0.5, 24000) == 12000
    assert planner.pause_samples(0.001, 24000) == 24


@pytest.mark.parametrize("text", [
    "Ha [laughter] ha [B EY1 S] [pauses] [pause_2] <breakfast> <br> a < b [ c ] [pau",
    "No marks at all.", "[", "<break", "x [pause"])
def test_other_brackets_are_text(text):
    p = planner.split_pauses(text)
    assert not p.marked and p.segments == (text,) and p.pauses == (0.0, 0.0)
    assert planner.plan_synthesis(text) == planner.plan_synthesis(text)  # planned as any text
    assert planner.split_text(text) == [text.strip()]


def test_a_pause_of_nothing_is_removed():
    p = planner.split_pauses("Hello [pause:0s] there.")
    assert p.marked and p.segments == ("Hello  there.",) and p.pauses == (0.0, 0.0)
    assert not planner.plan_synthesis("Hello [pause:0ms] there.").paused
    assert planner.split_text("Hello [pause:0s] there.") == ["Hello  there."]


@pytest.mark.parametrize("text, at, why", [
    ("Hi [pause:-1s] there", 3, "'-1s' is not a length"),
    ("Hi [pause:61s] there", 3, "61 s is over the limit of 60 s"),
    ("Hi [pause:60001ms] there", 3, "60.001 s is over the limit"),
    ("Hi [pause:2min] there", 3, "'2min' is not a length"),
    ("Hi [pause:1.5] there", 3, "'1.5' is not a length"),
    ("Hi [pause:1e3s] there", 3, "'1e3s' is not a length"),
    ("Hi [pause] there", 3, "the length follows a colon"),
    ("Hi [pause 1s] there", 3, "the length follows a colon"),
    ("Hi [ Pause-ish] there", 3, "the length follows a colon"),
    ("Hi there [pause:1s", 9, "it is not closed"),
    ("Hi [pause:" + "1" * 120 + "s] there", 3, "no closing ']' within 100 characters"),
    ("Hi <break/> there", 3, "a break needs its time"),
    ('Hi <break strength="x"/> there', 3, "a break needs its time"),
    ('Hi <break time="1s" volume="9"/> there', 3, "unknown attribute 'volume'"),
    ('Hi <break time="-5ms"/> there', 3, "'-5ms' is not a length"),
    ('Hi <break time="1s" garbage/> there', 3, "its attributes cannot be read"),
])
def test_malformed_pause_marks_name_their_place(text, at, why):
    with pytest.raises(InputError) as e:
        planner.split_pauses(text)
    assert f"at character {at}: {why}" in str(e.value), str(e.value)
    assert "[pause:1.5s]" in str(e.value)  # says how to write one
    with pytest.raises(InputError):  # the stream's chunker refuses it alike
        planner.split_text(text)


@pytest.mark.parametrize("text", ["[pause:1s]", " [pause:1s] <break time='2s'/>\n"])
def test_a_text_of_pauses_only_is_refused(text):
    with pytest.raises(InputError, match="only pause marks"):
        planner.split_pauses(text)
    with pytest.raises(InputError, match="only pause marks"):
        planner.plan_synthesis(text)


def test_pauses_count_against_the_output_limit():
    planner.plan_synthesis("[pause:60s] a " * 100)  # 100 minutes of pauses: within the 2 hours
    with pytest.raises(InputError, match="7260 s of pauses would last about 122 minutes; the "
                                         "limit is 120 minutes"):
        planner.plan_synthesis("[pause:60s] a " * 121)


def test_plan_of_a_paused_text():
    text = "Hello. [pause:1s] How are you doing today? [pause:250ms]"
    plan = planner.plan_synthesis(text)
    assert plan.paused and plan.pauses == (0.0, 1.0, 0.25) and plan.pause_frames == 32
    first, second = plan.chunks
    assert (first.text, first.segment, first.reference) == ("Hello.", 0, None)
    assert first.frames == frontend.estimate_target_frames("Hello.")
    # later segments: chunk 0's voice, but sized at the text's own pace: "Hello." alone is
    # stretched by the short-output boost, and would stretch them too
    assert (second.text, second.segment, second.reference, second.ref_text) == (
        "How are you doing today?", 1, "chunk0", "Hello.")
    assert second.frames == frontend.estimate_target_frames("How are you doing today?")
    assert second.frames < frontend.estimate_target_frames("How are you doing today?", "Hello.",
                                                    first.frames)
    # with a voice prompt every segment is a pass on the prompt
    prompted = planner.plan_synthesis(text, "A reference.", 60, speed=1.25)
    assert [(c.reference, c.frames) for c in prompted.chunks] == [
        ("prompt", frontend.estimate_target_frames(s, "A reference.", 60, 1.25))
        for s in ("Hello.", "How are you doing today?")]
    # a long segment is chunked as a text of its own; chunk 0 stays the voice of all
    long = "Short start. [pause:0.5s] " + "A sentence of a long paragraph goes on. " * 40
    plan = planner.plan_synthesis(long, chunk_threshold=10, chunk_duration=5)
    assert [c.segment for c in plan.chunks][:2] == [0, 1] and len(plan.chunks) > 4
    assert all(c.reference == "chunk0" and c.ref_text == "Short start." for c in plan.chunks[1:])
    # duration: the spoken text lasts it, the pauses come on top
    fixed = planner.plan_synthesis("One two three. [pause:2s] Four five six.", duration=3.0)
    assert fixed.frames == 75 and abs(sum(c.frames for c in fixed.chunks) - 75) <= 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["Hello there, ", "this is text. ", "[pause:1s]", " ",
                                 "<break time='250ms'/>", "[laugh", "ter] ", "[pa", "use:2s] ",
                                 "Next words"]), min_size=1, max_size=12),
       st.lists(st.integers(1, 200), max_size=6))
def test_pauses_in_fragments_split_as_the_whole(parts, cuts):
    """The stream's chunker finds the same marks, chunks and pauses whatever the fragments."""
    text = "".join(parts)
    try:
        whole = planner.split_text(text)
    except InputError:
        return
    frags, i = [], 0
    for c in sorted(cuts):
        frags.append(text[i:c])
        i = max(i, c)
    frags.append(text[i:])
    chunker = planner.TextChunker()
    got = [x for f in frags for x in chunker.feed(f)] + chunker.flush()
    assert got == whole
    pauses = [x for x in whole if isinstance(x, planner.Pause)]
    assert all(text.startswith(("[", "<"), x.at) for x in pauses)


@pytest.mark.parametrize("abbr", sorted(planner._ABBREVIATIONS))
def test_the_stream_and_the_chunker_share_one_abbreviation_table(abbr):
    """A "." after any abbreviation the reference's chunker knows ends no streamed chunk either
    (in any case), while a plain sentence end does."""
    rule = planner.ChunkRule(first_seconds=0.0, seconds=0.0)
    for word in (abbr, abbr.lower(), abbr.upper()):
        assert planner.split_text(f"Ask {word} Smith now. Then go.", rule) == [
            f"Ask {word} Smith now.", "Then go."]
