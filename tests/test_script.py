"""Multi-speaker scripts (omnicore/apps/script.py and `omnicore script`), on the tiny random checkpoint.

What is checked: every malformed script or voice mapping is a typed error naming the line (or
the speaker) before any generation; the joined output is exactly the turns' own audio with
exactly `gap` seconds of zeros between them, as the timings say; a designed or auto speaker's
later turns are conditioned on its first turn (the kept prompt has exactly that turn's codes,
text and loudness); a clip is encoded once per speaker; the CLI writes the audio and the JSON
atomically and refuses bad input with exit status 2 and nothing written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from omnicore import OmniVoice, Synthesis, VoiceClonePrompt
from omnicore.apps import cli
from omnicore.audio import postprocess
from omnicore.text import limits
from omnicore.errors import AudioError, InputError, VoicePromptError
from omnicore.apps.script import (MAX_GAP_S, MAX_SCRIPT_CHARS, MAX_TURNS, check_gap, check_script,
                             load_voices_file, parse_script, parse_voices, synthesize_script)
from omnicore.voice import voice_from_synthesis

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"
STEPS = 4  # few unmasking steps: plumbing, not speech quality
SR = 24000


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(str(TINY))


class Spy:
    """The model, with every synthesize / create_voice_clone_prompt call and result recorded."""

    def __init__(self, model):
        self.model = model
        self.sampling_rate = model.sampling_rate
        self.calls: list[tuple[str, dict, Synthesis]] = []
        self.encoded: list = []

    def synthesize(self, text, **kw):
        out = self.model.synthesize(text, **kw)
        self.calls.append((text, kw, out[0]))
        return out

    def create_voice_clone_prompt(self, ref_audio, ref_text=None, **kw):
        self.encoded.append(ref_audio)
        return self.model.create_voice_clone_prompt(ref_audio, ref_text, **kw)


@pytest.fixture(scope="module")
def saved_voice(model, tmp_path_factory) -> Path:
    """A voice prompt file kept from an auto result."""
    result = model.synthesize("A voice saved earlier.", seed=11, num_step=STEPS)[0]
    path = tmp_path_factory.mktemp("voice") / "carol.npz"
    voice_from_synthesis(result).save(path)
    return path


# ------------------------------------------------------------------------------------------------
# Parsing and validation: typed errors with line numbers, before any generation
# ------------------------------------------------------------------------------------------------


def test_parse_skips_blank_and_comment_lines_and_counts_them():
    lines = parse_script("# a play\n\nalice: Hello there.\n  \nBob ：Hi! Note: colons stay.\n"
                         "Dr. Smith: Next.\n李雷：你好。")
    assert [(ln.line, ln.speaker, ln.text) for ln in lines] == [
        (3, "alice", "Hello there."), (5, "Bob", "Hi! Note: colons stay."),
        (6, "Dr. Smith", "Next."), (7, "李雷", "你好。")]
    pairs = parse_script([("alice", " Hi. "), "bob: Yes."])
    assert [(ln.line, ln.speaker, ln.text) for ln in pairs] == [(1, "alice", "Hi."), (2, "bob", "Yes.")]


@pytest.mark.parametrize("script, match", [
    ("alice: Hi.\nno speaker here", r"script line 2: no speaker in 'no speaker here'"),
    ("alice: Hi.\n\nbob:   ", r"script line 3: bob has nothing to say"),
    (": Hi.", r"script line 1: the speaker name is empty"),
    ("a" * 65 + ": Hi.", r"script line 1: .* is not a speaker name"),
    ("<b>: Hi.", r"script line 1: '<b>' is not a speaker name"),
    ("alice: Hi.\nalice: " + "x" * (limits.MAX_TEXT_CHARS + 1), r"script line 2 \(alice\): text is"),
    ("alice: " + "x" * 15_000 + "\nbob: " + "y" * 5_001, r"20,001 characters of text in all"),
    ("a: x\n" * (MAX_TURNS + 1), rf"script line {MAX_TURNS + 1}: more than 1,000 turns"),
    ("#" * (MAX_SCRIPT_CHARS + 1), r"characters long; the limit is 200,000"),
    ("# only a comment\n\n", r"the script has no turns"),
    (42, r"a script is a string"),
    (["alice: Hi.", ("bob", 3)], r"script line 2: a \(speaker, text\) pair of strings"),
])
def test_malformed_scripts_are_input_errors(script, match):
    with pytest.raises(InputError, match=match):
        parse_script(script)


@pytest.mark.parametrize("script, voices, match", [
    ("alice: Hi.\ncarol: Yo.", {"alice": {}, "bob": {}},
     r"script line 2: unknown speaker 'carol'; the voices given are: alice, bob"),
    ("alice: Hi.", {"alice": {"instruct": "purple"}}, r"script line 1 \(alice\), instruct: "),
    ("alice: " + "x" * (limits.MAX_REF_TEXT_CHARS + 1), {"alice": {}},
     r"script line 1 \(alice\): a speaker without a voice is given one by its first turn"),
    ("alice: Hi.", {"alice": {"voice": "x.npz", "instruct": "male"}},
     r"voices\['alice'\]: give one of voice, ref_audio and instruct, not voice and instruct"),
    ("alice: Hi.", {"alice": {"pitch": "low"}}, r"voices\['alice'\]: unknown key\(s\) 'pitch'"),
    ("alice: Hi.", {"alice": {"ref_text": "Hi."}}, r"ref_text needs ref_audio"),
    ("alice: Hi.", {"alice": {"ref_audio": "/nonexistent.wav", "ref_text": "Hi."}}, r"is not a file"),
    ("alice: Hi.", {"alice": {"seed": -1}}, r"voices\['alice'\]\['seed'\]"),
    ("alice: Hi.", {"alice": {"speed": 0}}, r"voices\['alice'\]\['speed'\]: speed must be > 0"),
    ("alice: Hi.", {"alice": {}, "ALICE": {}}, r"'alice' and 'ALICE' name one speaker"),
    ("alice: Hi.", {"alice": 3}, r"voices\['alice'\] must be a voice file path"),
    ("alice: Hi.", ["alice"], r"voices must be a mapping"),
])
def test_bad_voices_are_input_errors(script, voices, match):
    with pytest.raises(InputError, match=match):
        check_script(script, voices)


def test_missing_voice_file_is_a_voice_prompt_error(tmp_path):
    with pytest.raises(VoicePromptError, match="not found"):
        parse_voices({"alice": "missing.npz"}, tmp_path)


def test_names_match_ignoring_case_and_relative_paths_follow_the_voices_file(tmp_path, saved_voice):
    (tmp_path / "voices").mkdir()
    (tmp_path / "voices" / "c.npz").write_bytes(saved_voice.read_bytes())
    (tmp_path / "voices" / "v.json").write_text(json.dumps({"Carol": {"voice": "c.npz"}}))
    speakers = load_voices_file(tmp_path / "voices" / "v.json")
    lines, speakers = check_script("CAROL: Hi.\ncarol: Again.", speakers)
    assert speakers["Carol"].kind == "voice" and len(lines) == 2
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="expected a JSON object"):
        load_voices_file(tmp_path / "bad.json")


@pytest.mark.parametrize("gap", [-0.1, MAX_GAP_S + 0.1, float("nan"), float("inf"), True, "0.4",
                                 10**400])
def test_bad_gaps_are_input_errors(gap):
    with pytest.raises(InputError, match="gap"):
        check_gap(gap)


def test_gaps_alone_past_the_output_limit_are_refused():
    assert check_gap(0.4, 3) == int(0.4 * SR)
    with pytest.raises(InputError, match="minutes"):
        check_gap(MAX_GAP_S, MAX_TURNS)  # 1,000 turns x 10 s > 2 hours


@pytest.mark.parametrize("key", ["instruct", "voice_clone_prompt", "ref_audio", "duration"])
def test_per_speaker_settings_are_refused_for_the_whole_call(model, key):
    with pytest.raises(InputError, match=f"{key} is set per speaker"):
        synthesize_script(model, "alice: Hi.", {"alice": {}}, **{key: None})


# ------------------------------------------------------------------------------------------------
# Keeping a voice
# ------------------------------------------------------------------------------------------------


def test_voice_from_synthesis_keeps_codes_text_and_loudness(model):
    result = model.synthesize("Keep this voice.", instruct="female, low pitch", seed=5,
                              num_step=STEPS)[0]
    kept = voice_from_synthesis(result)
    assert isinstance(kept, VoiceClonePrompt)
    assert np.array_equal(kept.ref_audio_tokens, result.codes) and kept.ref_audio_tokens.dtype == np.int64
    assert kept.ref_audio_tokens is not result.codes  # the prompt owns its codes
    assert kept.ref_text == "Keep this voice."
    assert kept.ref_rms == pytest.approx(postprocess.reference_rms(result.audio))
    # Reused, it is the prompt of the next call exactly (a saved and loaded copy too).
    again = model.synthesize("Later.", voice_clone_prompt=kept, seed=5, num_step=STEPS)[0]
    assert again.audio.size > 0
    assert voice_from_synthesis(result, "  Other text. ").ref_text == "Other text."


def test_voice_from_synthesis_refuses_what_cannot_be_a_voice():
    def fake(frames, wav):
        return Synthesis(audio=wav, codes=np.ones((8, frames), np.int64),
                         fill_steps=np.zeros((8, frames), np.int16), num_steps=4, timings={},
                         text_chunks=["First part.", "Second part."])
    ok = voice_from_synthesis(fake(10, np.full(960, 0.1, np.float32)))
    assert ok.ref_text == "First part. Second part."
    with pytest.raises(InputError, match="a kept voice holds at most 60 s"):
        voice_from_synthesis(fake(limits.MAX_REF_FRAMES + 1, np.full(960, 0.1, np.float32)))
    with pytest.raises(AudioError, match="silent"):
        voice_from_synthesis(fake(10, np.zeros(960, np.float32)))
    with pytest.raises(InputError, match="the text of the kept voice"):
        voice_from_synthesis(fake(10, np.full(960, 0.1, np.float32)), "x" * 2001)


# ------------------------------------------------------------------------------------------------
# Synthesis: boundaries, kept voices, seeds
# ------------------------------------------------------------------------------------------------

SCRIPT = """# a short scene
alice: Hello there.
bob: Hi! How are you?

carol: Fine, thank you.
alice: Good to hear.
BOB: Indeed.
"""


@pytest.fixture(scope="module")
def scene(model, saved_voice):
    spy = Spy(model)
    voices = {"alice": {"instruct": "female, low pitch", "seed": 3}, "bob": {},
              "carol": {"voice": str(saved_voice)}, "dave": {}}
    result = synthesize_script(spy, SCRIPT, voices, gap=0.25, seed=100, num_step=STEPS)
    return spy, result, saved_voice


def test_turns_are_the_results_joined_by_exactly_the_gap(scene):
    spy, result, _ = scene
    gap_n = int(round(0.25 * SR))
    assert [(t.line, t.speaker) for t in result.turns] == [
        (2, "alice"), (3, "bob"), (5, "carol"), (6, "alice"), (7, "bob")]
    assert result.turns[0].start_sample == 0 and result.turns[-1].end_sample == len(result.audio)
    for turn, (text, _, synth) in zip(result.turns, spy.calls):
        assert text == turn.text
        assert np.array_equal(result.audio[turn.start_sample:turn.end_sample], synth.audio)
        assert np.abs(synth.audio).max() > 0
    for prev, nxt in zip(result.turns, result.turns[1:]):
        assert nxt.start_sample - prev.end_sample == gap_n
        assert not result.audio[prev.end_sample:nxt.start_sample].any()
    timings = result.timings()
    assert timings["gap"] == 0.25 and timings["num_samples"] == len(result.audio)
    for t, row in zip(result.turns, timings["turns"]):
        assert row["start"] == t.start_sample / SR and row["end"] == t.end_sample / SR
        assert (row["start_sample"], row["end_sample"], row["line"]) == (t.start_sample, t.end_sample, t.line)
    assert timings["speakers"] == {"alice": "instruct", "bob": "auto", "carol": "voice", "dave": "auto"}


def test_designed_and_auto_speakers_are_conditioned_on_their_first_turn(scene, model):
    spy, result, saved = scene
    (t_a1, kw_a1, a1), (_, kw_b1, b1), (_, kw_c, _), (t_a2, kw_a2, a2), (_, kw_b2, _) = spy.calls
    assert kw_a1["voice_clone_prompt"] is None and kw_b1["voice_clone_prompt"] is None
    for first_text, first, later_kw, name in (("Hello there.", a1, kw_a2, "alice"),
                                              ("Hi! How are you?", b1, kw_b2, "bob")):
        kept = later_kw["voice_clone_prompt"]
        assert np.array_equal(kept.ref_audio_tokens, first.codes)
        assert kept.ref_text == first_text
        assert kept.ref_rms == pytest.approx(postprocess.reference_rms(first.audio))
        assert result.voices[name] is kept
    assert kw_a1["instruct"] == kw_a2["instruct"] == "female, low pitch"  # design kept, as in chunks
    assert result.voices["dave"] is None  # never spoke
    # The later turn is exactly what the kept voice gives on its own.
    direct = model.synthesize(t_a2, **kw_a2)[0]
    assert np.array_equal(direct.audio, a2.audio)
    # The saved voice file is used as loaded.
    assert np.array_equal(kw_c["voice_clone_prompt"].ref_audio_tokens,
                          VoiceClonePrompt.load(saved).ref_audio_tokens)


def test_seeds_speaker_seed_else_base_plus_turn(scene):
    spy, _, _ = scene
    assert [kw["seed"] for _, kw, _ in spy.calls] == [3, 101, 102, 3, 104]
    assert all(kw["num_step"] == STEPS for _, kw, _ in spy.calls)


def test_a_clip_is_encoded_once_per_speaker(model, tmp_path):
    clip = model.synthesize("A clip to clone, two seconds or so.", seed=2, num_step=STEPS)[0].audio
    sf.write(tmp_path / "erin.wav", clip, SR)
    spy = Spy(model)
    result = synthesize_script(spy, "erin: One.\nerin: Two.\nfrank: Three.",
                               {"erin": {"ref_audio": "erin.wav", "ref_text": "A clip to clone."},
                                "frank": {}, "unused": {"ref_audio": "erin.wav", "ref_text": "x"}},
                               voices_dir=tmp_path, gap=0, num_step=STEPS)
    assert len(spy.encoded) == 1
    assert spy.calls[0][1]["voice_clone_prompt"] is spy.calls[1][1]["voice_clone_prompt"]
    assert result.turns[1].start_sample == result.turns[0].end_sample  # gap 0: back to back


def test_a_failing_turn_names_its_line(model):
    bad = VoiceClonePrompt(np.zeros((4, 10), np.int64), "Hi.", 0.1)  # 4 codebooks, model has 8
    with pytest.raises(InputError, match=r"script line 2 \(bob\): voice_clone_prompt"):
        synthesize_script(model, "alice: Hi.\nbob: Yo.", {"alice": {}, "bob": bad}, num_step=STEPS)


# ------------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------------


def _run(argv, capsys):
    rc = cli.main(argv)
    return rc, capsys.readouterr().err


def test_cli_end_to_end(tmp_path, capsys, saved_voice):
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    (tmp_path / "carol.npz").write_bytes(saved_voice.read_bytes())
    (tmp_path / "voices.json").write_text(json.dumps(
        {"carol": {"voice": "carol.npz"}, "bob": {"instruct": "male"}}))
    out = tmp_path / "out" / "scene.wav"
    out.parent.mkdir()
    rc, err = _run(["script", str(tmp_path / "scene.txt"), "-o", str(out), "--voices",
                    str(tmp_path / "voices.json"), "--instruct", "alice=female, low pitch",
                    "--auto", "bob", "--gap", "0.3", "--seed", "1", "--steps", str(STEPS),
                    "--model", str(TINY)], capsys)
    assert rc == 0, err
    assert "turn 5/5 (line 7, BOB)" in err
    timings = json.loads((tmp_path / "out" / "scene.json").read_text())
    wav, sr = sf.read(out, dtype="float32")
    assert sr == SR and len(wav) == timings["num_samples"]
    assert timings["speakers"] == {"carol": "voice", "bob": "auto", "alice": "instruct"}
    turns = timings["turns"]
    assert [t["speaker"] for t in turns] == ["alice", "bob", "carol", "alice", "bob"]
    for prev, nxt in zip(turns, turns[1:]):
        assert nxt["start_sample"] - prev["end_sample"] == int(0.3 * SR)
        assert not wav[prev["end_sample"]:nxt["start_sample"]].any()  # 16-bit zeros stay zeros
    assert sorted(p.name for p in out.parent.iterdir()) == ["scene.json", "scene.wav"]

    custom = tmp_path / "t.json"
    rc, err = _run(["script", str(tmp_path / "scene.txt"), "-o", str(out), "--timings", str(custom),
                    "--voices", str(tmp_path / "voices.json"), "--auto", "alice", "-q",
                    "--steps", "2", "--model", str(TINY)], capsys)
    assert rc == 0 and err == "" and json.loads(custom.read_text())["gap"] == 0.4


@pytest.mark.parametrize("extra, script, match", [
    ([], "alice: Hi.\nbob: Yo.", r"script line 2: unknown speaker 'bob'"),
    (["--voice", "bob"], "alice: Hi.", r"--voice takes NAME=VALUE"),
    (["--gap", "20"], "alice: Hi.", r"gap is 20.0"),
    (["--duration", "2"], "alice: Hi.", r"--duration would give every turn the same length"),
    (["--instruct", "bob=purple"], "alice: Hi.\nbob: Yo.", r"script line 2 \(bob\), instruct"),
    ([], "alice Hi.", r"script line 1: no speaker"),
])
def test_cli_refuses_bad_input_before_loading_and_writes_nothing(tmp_path, capsys, extra, script, match):
    (tmp_path / "s.txt").write_text(script, encoding="utf-8")
    out = tmp_path / "o.wav"
    # A model path that does not exist: every refusal here comes before the model is loaded.
    rc, err = _run(["script", str(tmp_path / "s.txt"), "-o", str(out), "--auto", "alice",
                    "--model", str(tmp_path / "no-model"), *extra], capsys)
    assert rc == 2
    assert err.startswith("omnicore: error: ") and re.search(match, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.txt"]


def test_cli_refuses_outputs_that_are_inputs(tmp_path, capsys):
    (tmp_path / "s.txt").write_text("alice: Hi.", encoding="utf-8")
    rc, err = _run(["script", str(tmp_path / "s.txt"), "-o", str(tmp_path / "o.wav"), "--timings",
                    str(tmp_path / "s.txt"), "--auto", "alice"], capsys)
    assert rc == 2 and "is the same file as the script" in err
    rc, err = _run(["script", str(tmp_path / "s.txt"), "-o", str(tmp_path / "o.wav"), "--timings",
                    str(tmp_path / "o.wav"), "--auto", "alice"], capsys)
    assert rc == 2 and "is the same file as --output" in err
