"""The `omnicore` command line on the tiny checkpoint: every sub-command, and errors that exit
non-zero with one message and leave no output file behind."""

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from omnicore.apps.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "weights" / "tiny-random")
SPEECH = str(ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav")
SPEECH16 = str(ROOT / "tests" / "fixtures" / "audio" / "speech_16k_stereo.wav")
FAST = ["--model", TINY, "--steps", "2", "-q"]


def _wav(path):
    data, sr = sf.read(path, dtype="float32")
    assert sr == 24000 and data.ndim == 1 and len(data) > 0 and np.isfinite(data).all()
    return data


def test_help_is_readable(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("say", "clone-prompt", "batch", "codec"):
        assert cmd in out
    with pytest.raises(SystemExit):
        main(["say", "--help"])
    out = capsys.readouterr().out
    for flag in ("--ref-audio", "--ref-text", "--voice", "--instruct", "--language", "--duration",
                 "--speed", "--steps", "--seed", "--guidance", "--text-file"):
        assert flag in out


def test_say_auto_design_and_seed(tmp_path):
    a, b, c = tmp_path / "a.wav", tmp_path / "b.wav", tmp_path / "c.flac"
    assert main(["say", "Hello there.", "-o", str(a), "--seed", "3", *FAST]) == 0
    assert main(["say", "Hello there.", "-o", str(b), "--seed", "3", *FAST]) == 0
    np.testing.assert_array_equal(_wav(a), _wav(b))
    assert main(["say", "Hello there.", "-o", str(c), "--instruct", "female, low pitch",
                 "--language", "English", "--duration", "1.5", *FAST]) == 0
    data, sr = sf.read(c)
    assert sr == 24000 and len(data) > 0


def test_say_reads_stdin_and_text_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Text from standard input."))
    out = tmp_path / "stdin.wav"
    assert main(["say", "-o", str(out), *FAST]) == 0
    _wav(out)
    txt = tmp_path / "t.txt"
    txt.write_text("Text from a file.", encoding="utf-8")
    out2 = tmp_path / "file.wav"
    assert main(["say", "--text-file", str(txt), "-o", str(out2), *FAST]) == 0
    _wav(out2)


def test_clone_prompt_then_say_with_voice(tmp_path):
    voice = tmp_path / "voice.npz"
    assert main(["clone-prompt", SPEECH16, "--ref-text", "The quick brown fox jumps over the lazy dog.",
                 "-o", str(voice), "--model", TINY, "-q"]) == 0
    out1, out2 = tmp_path / "v.wav", tmp_path / "r.wav"
    assert main(["say", "Cloned voice.", "--voice", str(voice), "-o", str(out1), "--greedy", *FAST]) == 0
    assert main(["say", "Cloned voice.", "--ref-audio", SPEECH16, "--ref-text",
                 "The quick brown fox jumps over the lazy dog.", "-o", str(out2), "--greedy", *FAST]) == 0
    np.testing.assert_array_equal(_wav(out1), _wav(out2))


def test_batch_jsonl(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    lines = [{"id": "one", "text": "First line."},
             {"id": "two", "text": "Second line.", "instruct": "male", "language_id": "en", "speed": 1.2},
             {"id": "three", "text": "Third.", "ref_audio": SPEECH, "ref_text": "The quick brown fox.",
              "duration": 1.0}]
    jobs.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["batch", str(jobs), "--out-dir", str(out), *FAST]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["one.wav", "three.wav", "two.wav"]
    assert len(_wav(out / "three.wav")) > 0


def test_codec_commands(tmp_path):
    codes = tmp_path / "codes.npy"
    assert main(["codec", "encode", SPEECH16, "-o", str(codes), "--model", TINY, "-q"]) == 0
    c = np.load(codes)
    assert c.dtype == np.int64 and c.shape[0] == 8 and c.shape[1] > 10
    wav = tmp_path / "dec.wav"
    assert main(["codec", "decode", str(codes), "-o", str(wav), "--model", TINY, "-q"]) == 0
    assert len(_wav(wav)) == 960 * c.shape[1]
    rt = tmp_path / "rt.wav"
    assert main(["codec", "roundtrip", SPEECH, "-o", str(rt), "--model", TINY, "-q"]) == 0
    _wav(rt)


@pytest.mark.parametrize("argv, match", [
    (["say", "", "-o", "{out}"], "empty"),
    (["say", "hi", "-o", "{out}", "--instruct", "robot voice"], "robot"),
    (["say", "hi", "-o", "{out}", "--ref-text", "only text"], "--ref-audio"),
    (["say", "hi", "-o", "{out}", "--ref-audio", "/no/such.wav", "--ref-text", "x"], "such.wav"),
    (["say", "hi", "-o", "{out}", "--voice", "/no/voice.npz"], "not found"),
    (["say", "hi", "-o", "{out}", "--duration", "-2"], "duration"),
    (["say", "hi", "-o", "{dir}/out.xyz"], "xyz|format|extension"),
    (["codec", "decode", "/no/codes.npy", "-o", "{out}"], "codes"),
])
def test_errors_exit_nonzero_without_traceback_or_file(tmp_path, capsys, argv, match):
    out = tmp_path / "out.wav"
    argv = [a.format(out=out, dir=tmp_path) for a in argv]
    argv += ["--model", TINY, "-q"] if argv[0] == "codec" else FAST
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("omnicore: error:") and "Traceback" not in err
    import re
    assert re.search(match, err), err
    assert list(tmp_path.iterdir()) == []


def test_missing_model_is_a_clear_offline_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert main(["say", "hi", "-o", str(tmp_path / "x.wav"), "--model", "k2-fsa/OmniVoice"]) == 2
    err = capsys.readouterr().err
    assert "hf download k2-fsa/OmniVoice" in err and "tiny-random" in err
    assert not (tmp_path / "x.wav").exists()


def test_bad_jsonl(tmp_path, capsys):
    jobs = tmp_path / "bad.jsonl"
    jobs.write_text('{"id": "a"}\n', encoding="utf-8")
    assert main(["batch", str(jobs), "--out-dir", str(tmp_path / "o"), *FAST]) == 2
    assert '"text"' in capsys.readouterr().err
    jobs.write_text('{"id": "../evil", "text": "x"}\n', encoding="utf-8")
    assert main(["batch", str(jobs), "--out-dir", str(tmp_path / "o"), *FAST]) == 2


def test_parser_builds():
    assert build_parser().prog == "omnicore"


# ---------------------------------------------------------------------------------------------
# Refusals before any work, one error line, nothing lost or left behind
# ---------------------------------------------------------------------------------------------


def _one_error_line(err: str, match: str = "") -> str:
    import re

    assert err.startswith("omnicore: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and re.search(match, err), err
    return err


@pytest.fixture
def no_model(monkeypatch):
    """Refusals must come before the (slow) model load: loading is a test failure here."""
    from omnicore.apps.cli import codec, common

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(common, "load_model", refuse)
    monkeypatch.setattr(codec, "_codec", refuse)


def test_output_that_is_an_input_is_refused(tmp_path, capsys, no_model):
    clip = tmp_path / "in.wav"
    clip.write_bytes(Path(SPEECH).read_bytes())
    (tmp_path / "hard.wav").hardlink_to(clip)
    (tmp_path / "link.wav").symlink_to(clip)
    before = clip.read_bytes()
    text = tmp_path / "t.txt"
    text.write_text("Hello.", encoding="utf-8")
    voice = tmp_path / "v.npz"
    voice.write_bytes(b"not read")
    for argv in (["clone-prompt", clip, "--ref-text", "Hi.", "-o", clip],
                 ["clone-prompt", clip, "--ref-text", "Hi.", "-o", tmp_path / "hard.wav"],
                 ["codec", "encode", clip, "-o", tmp_path / "link.wav"],
                 ["codec", "roundtrip", tmp_path / "link.wav", "-o", clip],
                 ["codec", "decode", clip, "-o", clip],
                 ["say", "Hi.", "--ref-audio", clip, "--ref-text", "Hi.", "-o", clip],
                 ["say", "Hi.", "--ref-audio", clip, "--ref-text", "Hi.", "--stream", "-o", tmp_path / "hard.wav"],
                 ["say", "--text-file", text, "--raw", "-o", text],
                 ["say", "Hi.", "--voice", voice, "-o", voice]):
        assert main([str(a) for a in argv] + ["--model", TINY, "-q"]) == 2, argv
        _one_error_line(capsys.readouterr().err, "same file as")
    assert clip.read_bytes() == before and text.read_text() == "Hello." and voice.read_bytes() == b"not read"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.wav", "in.wav", "link.wav", "t.txt", "v.npz"]


def test_unwritable_outputs_are_one_error_line(tmp_path, capsys, no_model):
    (tmp_path / "adir.wav").mkdir()
    (tmp_path / "afile").write_text("keep")
    cases = [
        (["clone-prompt", SPEECH, "--ref-text", "Hi.", "-o", "{d}/nodir/v.npz"], "does not exist"),
        (["clone-prompt", SPEECH, "--ref-text", "Hi.", "-o", "{d}/adir.wav"], "is a folder"),
        (["clone-prompt", SPEECH, "--ref-text", "Hi.", "-o", "/proc/v.npz"], "no file can be created"),
        (["codec", "encode", SPEECH, "-o", "{d}/nodir/c.npy"], "does not exist"),
        (["codec", "decode", SPEECH, "-o", "{d}/out.xyz"], "format"),
        (["say", "Hi.", "-o", "{d}/adir.wav"], "is a folder"),
        (["say", "Hi.", "-o", "/dev/null"], "device"),
        (["say", "Hi.", "--stream", "-o", "{d}/afile/x.wav"], "not a folder"),
        (["batch", "{d}/adir.wav", "--out-dir", "{d}/o"], "cannot read .*Is a directory"),
    ]
    for argv, match in cases:
        assert main([a.format(d=tmp_path) for a in argv] + ["--model", TINY, "-q"]) == 2, argv
        _one_error_line(capsys.readouterr().err, match)
    jobs = tmp_path / "j.jsonl"
    jobs.write_text('{"id": "a", "text": "Hi."}\n', encoding="utf-8")
    assert main(["batch", str(jobs), "--out-dir", str(tmp_path / "afile"), *FAST]) == 2
    _one_error_line(capsys.readouterr().err, "is a file, not a folder")
    (tmp_path / "a.wav").mkdir()  # a folder where job "a" writes
    assert main(["batch", str(jobs), "--out-dir", str(tmp_path), *FAST]) == 2
    _one_error_line(capsys.readouterr().err, "j.jsonl:1: .*is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav", "adir.wav", "afile", "j.jsonl"]
    assert (tmp_path / "afile").read_text() == "keep"


def test_generation_options_come_from_generation_config():
    """One description per GenerationConfig field; every option named after a field (say's
    --steps, infer-batch's --num_step, ...) has the field's default, or None where the default
    is the profile's (the steps: 32 exact, 16 fast); left alone they resolve to the profile's
    settings, exact unless --profile fast."""
    from dataclasses import fields

    from omnicore import GenerationConfig
    from omnicore.apps.cli.options import FIELD_HELP, gen_kwargs
    from omnicore.model.config import FAST_PROFILE, resolve_generation_config

    names = [f.name for f in fields(GenerationConfig)]
    assert sorted(FIELD_HELP) == sorted(names)
    p = build_parser()
    for argv in (["say", "x", "-o", "x.wav"], ["clone-prompt", "a.wav", "--ref-text", "t", "-o", "v.npz"],
                 ["infer-batch", "--test_list", "t", "--res_dir", "r"]):
        args = p.parse_args(argv)
        given = [n for n in names if hasattr(args, n)]
        assert given, argv
        assert all(getattr(args, n) in (getattr(GenerationConfig(), n), None) for n in given), argv
        assert all(getattr(args, n) is None for n in given if n in FAST_PROFILE or n == "profile")
    for argv, profile in ((["say", "x", "-o", "x.wav"], "exact"),
                          (["say", "x", "-o", "x.wav", "--profile", "fast"], "fast")):
        kw = {k: v for k, v in gen_kwargs(p.parse_args(argv)).items() if k in names}
        assert resolve_generation_config(None, kw) == GenerationConfig.for_profile(profile), argv
    assert p.parse_args(["infer", "--text", "x", "--output", "x.wav", "--profile", "fast"]).profile == "fast"
    args = p.parse_args(["say", "x", "-o", "x.wav", "--profile", "fast", "--steps", "32",
                         "--prefix-refresh", "4", "--uncond-every", "2"])
    kw = {k: v for k, v in gen_kwargs(args).items() if k in names}
    assert resolve_generation_config(None, kw) == GenerationConfig(
        profile="fast", num_step=32, prefix_refresh=4, uncond_every=2)


def test_usage_errors_are_one_line(capsys):
    for argv, match in ((["say", "hi", "--seed", "-1"], "--seed: must be a whole number >= 0, got -1"),
                        (["say", "hi", "--seed", "1.5"], "--seed: must be"),
                        (["frobnicate"], "invalid choice"),
                        (["clone-prompt", "x.wav"], "--ref-text")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        _one_error_line(capsys.readouterr().err, match)


def test_interrupts_and_os_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import signal

    import omnicore.apps.cli as cli
    from omnicore.apps.cli import common

    out = str(tmp_path / "x.wav")
    for exc, code, match in ((KeyboardInterrupt(), 130, "interrupted"),
                             (cli._Terminated(signal.SIGTERM), 143, "SIGTERM"),
                             (cli._Terminated(signal.SIGHUP), 129, "SIGHUP"),
                             (OSError(5, "Input/output error", "/some/file"), 1, "Input/output error: /some/file"),
                             (MemoryError(), 1, "out of memory")):
        def load(args, exc=exc):
            raise exc

        monkeypatch.setattr(common, "load_model", load)
        before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
        assert main(["say", "Hi.", "-o", out, *FAST]) == code
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before  # put back
        _one_error_line(capsys.readouterr().err, match)
    assert list(tmp_path.iterdir()) == []


def _batch_file(tmp_path, rows) -> str:
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n",
                    encoding="utf-8")
    return str(path)


def test_batch_is_checked_whole_before_any_work(tmp_path, capsys, no_model):
    rows = [{"id": "a", "text": "One."},
            {"id": "a", "text": "Two."},                              # 2 duplicate
            {"id": "A", "text": "Three."},                            # 3 same file, other case
            {"id": "../x", "text": "Four."},                          # 4 unsafe
            {"id": "b/c", "text": "Five."},                           # 5 unsafe
            {"id": "d", "text": "Six.", "ref_audio": SPEECH, "ref_text": 5},  # 6 mistyped
            "{not json",                                              # 7
            {"id": "e", "text": "Eight.", "speed": -1},               # 8 bad value
            {"id": "f", "text": "Nine.", "ref_audio": SPEECH},        # 9 no transcript
            {"id": "g", "text": "Ten.", "voice": "x"},                # 10 unknown field
            {"id": "h", "text": ""},                                  # 11 empty text
            {"id": "i\u0301", "text": "Twelve."},                     # a decomposed accent
            {"id": "\u00ed", "text": "Thirteen."},                    # 13 the same, composed
            {"id": "k", "text": "Fourteen.", "instruct": "robot"},    # 14 unknown instruct
            {"id": "m", "text": "Fifteen.", "ref_audio": "\ud800.wav", "ref_text": "Hi."}]  # 15
    out = tmp_path / "out"
    assert main(["batch", _batch_file(tmp_path, rows), "--out-dir", str(out), *FAST]) == 2
    err = _one_error_line(capsys.readouterr().err, "13 bad line")
    for n in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11):
        assert f"line {n}:" in err, n
    assert "and 3 more" in err and not out.exists()
    assert main(["batch", _batch_file(tmp_path, rows[14:]), "--out-dir", str(out), *FAST]) == 2
    _one_error_line(capsys.readouterr().err, "line 1: field 'ref_audio' contains an unpaired surrogate")
    assert main(["batch", _batch_file(tmp_path, rows[11:13]), "--out-dir", str(out), *FAST]) == 2
    _one_error_line(capsys.readouterr().err, "line 2: id .* names the same file as .* on line 1 .*Unicode")
    # an output that would replace an input of the batch (a job's ref_audio, the job file)
    clip = tmp_path / "ref.wav"
    clip.write_bytes(Path(SPEECH).read_bytes())
    rows = [{"id": "x", "text": "One."}, {"id": "y", "text": "Two.", "ref_audio": str(clip), "ref_text": "Hi."},
            {"id": "ref", "text": "Three."}]
    assert main(["batch", _batch_file(tmp_path, rows), "--out-dir", str(tmp_path), *FAST]) == 2
    _one_error_line(capsys.readouterr().err, r"jobs.jsonl:3: .*is the ref_audio of line 2")
    assert clip.read_bytes() == Path(SPEECH).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.jsonl", "ref.wav"]


def test_batch_runtime_failures_are_reported_and_the_rest_run(tmp_path, capsys):
    # The reference's format: null means absent, "language_name" (evaluation only) is accepted.
    rows = [{"id": "one", "text": "First line.", "language_id": None, "language_name": "English",
             "instruct": None, "speed": None},
            {"id": "two", "text": "Second.", "ref_audio": str(tmp_path / "missing.wav"), "ref_text": "Hi."},
            {"id": "three", "text": "Third.", "ref_audio": SPEECH, "ref_text": "The quick brown fox.",
             "duration": 1.0}]
    out = tmp_path / "out"
    assert main(["batch", _batch_file(tmp_path, rows), "--out-dir", str(out), *FAST]) == 1
    err = capsys.readouterr().err
    assert _one_error_line(err, r"jobs.jsonl:2: id 'two': .*missing.wav")
    assert sorted(p.name for p in out.iterdir()) == ["one.wav", "three.wav"]
    assert 24000 <= len(_wav(out / "three.wav")) <= 28800  # 1 s asked, + up to 0.1 s padding a side


# ---------------------------------------------------------------------------------------------
# In a child process: signals and a full stdout
# ---------------------------------------------------------------------------------------------


def _cli(*argv):
    return [sys.executable, "-m", "omnicore", *argv, "--model", TINY, "--steps", "2"]


@pytest.mark.subprocess
def test_sigterm_while_streaming_to_a_file_leaves_nothing(tmp_path):
    import signal
    import subprocess

    text = " ".join(f"This is sentence number {i} of a long story." for i in range(200))
    proc = subprocess.Popen(_cli("say", text, "--stream", "-o", str(tmp_path / "out.wav")), cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # the CLI logs the first chunk's arrival
            if "first audio" in line:
                break
        assert [p.name.startswith(".out.wav.") for p in tmp_path.iterdir()] == [True]  # mid-write
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 143
    finally:
        proc.kill()
    _one_error_line(rest, "SIGTERM")
    assert list(tmp_path.iterdir()) == []  # neither out.wav nor its temporary file


@pytest.mark.subprocess
def test_full_stdout_is_one_error_line():
    import subprocess

    with open("/dev/full", "wb") as full:
        proc = subprocess.run(_cli("say", "Hello there. A second sentence.", "--stream", "--raw", "-q"),
                              cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2
    _one_error_line(proc.stderr, "cannot write PCM to stdout .No space left on device")


# ---------------------------------------------------------------------------------------------
# Pause marks and kept voices
# ---------------------------------------------------------------------------------------------


def test_say_speaks_pauses_and_keeps_the_voice(tmp_path):
    from omnicore import OmniVoice, VoiceClonePrompt
    from omnicore.audio import writers

    text = "Wait for it. [pause:1s] Here it is."
    out, voice = tmp_path / "p.wav", tmp_path / "kept.npz"
    assert main(["say", text, "-o", str(out), "--instruct", "female", "--seed", "3",
                 "--save-voice", str(voice), *FAST]) == 0
    model = OmniVoice.from_pretrained(TINY)
    want = model.synthesize(text, instruct="female", seed=3, num_step=2)[0]
    got = _wav(out)
    np.testing.assert_array_equal(got, writers.to_pcm16(want.audio) / np.float32(32768))
    (start, n), = want.pauses
    assert n == 24000 and not got[start:start + n].any()  # the second of silence, in the file
    kept = VoiceClonePrompt.load(voice)
    np.testing.assert_array_equal(kept.ref_audio_tokens, want.codes)
    assert kept.ref_text == "Wait for it. Here it is."
    # the kept voice speaks the next line: the same as passing that prompt
    again = tmp_path / "again.wav"
    assert main(["say", "And again.", "--voice", str(voice), "-o", str(again), "--greedy",
                 *FAST]) == 0
    np.testing.assert_array_equal(_wav(again), writers.to_pcm16(model.generate(
        "And again.", voice_clone_prompt=kept, num_step=2, position_temperature=0.0,
        class_temperature=0.0)[0]) / np.float32(32768))


def test_pause_and_save_voice_refusals_come_before_any_work(tmp_path, capsys, no_model):
    out = tmp_path / "o.wav"
    for argv, match in (
            (["say", "Hi [pause:2min] there", "-o", out], "at character 3: '2min' is not a length"),
            (["say", "[pause:1s]", "-o", out], "only pause marks"),
            (["say", "Hi <break time='9s'", "--stream", "-o", out], "at character 3: it is not closed"),
            (["say", "Hi.", "-o", out, "--save-voice", tmp_path / "no" / "v.npz"], "v.npz"),
            (["say", "Hi.", "-o", out, "--save-voice", out], "same file as --output"),
            (["say", "Hi.", "-o", out, "--stream", "--save-voice", tmp_path / "v.npz"],
             "--save-voice .* does not go with --stream")):
        assert main([str(a) for a in argv] + FAST) == 2, argv
        _one_error_line(capsys.readouterr().err, match)
    rows = [{"id": "a", "text": "Fine. [pause:1s] Fine."}, {"id": "b", "text": "Bad [pause:99s]."}]
    assert main(["batch", _batch_file(tmp_path, rows), "--out-dir", str(tmp_path / "x"), *FAST]) == 2
    _one_error_line(capsys.readouterr().err, "line 2: pause mark '.pause:99s.' at character 4")
    script = tmp_path / "s.txt"
    script.write_text("alice: Hello. [pause:1s] Hi.\nbob: Oops [pause:x]\n", encoding="utf-8")
    assert main(["script", str(script), "-o", str(out), "--auto", "alice", "--auto", "bob",
                 *FAST]) == 2
    _one_error_line(capsys.readouterr().err, r"script line 2 \(bob\): pause mark")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.jsonl", "s.txt"]


def test_batch_and_script_speak_pauses(tmp_path):
    from omnicore import OmniVoice
    from omnicore.audio import writers

    model = OmniVoice.from_pretrained(TINY)
    rows = [{"id": "p", "text": "One. <break time=\"750ms\"/> Two."}]
    assert main(["batch", _batch_file(tmp_path, rows), "--out-dir", str(tmp_path / "b"),
                 "--seed", "4", *FAST]) == 0
    want = model.synthesize(rows[0]["text"], seed=4, num_step=2)[0]
    (start, n), = want.pauses
    got = _wav(tmp_path / "b" / "p.wav")
    assert n == 18000 and not got[start:start + n].any()
    np.testing.assert_array_equal(got, writers.to_pcm16(want.audio) / np.float32(32768))
    script = tmp_path / "s.txt"
    script.write_text("alice: Hello. [pause:0.5s] Hi.\n", encoding="utf-8")
    out = tmp_path / "s.wav"
    assert main(["script", str(script), "-o", str(out), "--auto", "alice", "--seed", "4",
                 *FAST]) == 0
    want = model.synthesize("Hello. [pause:0.5s] Hi.", seed=4, num_step=2)[0]
    np.testing.assert_array_equal(_wav(out), writers.to_pcm16(want.audio) / np.float32(32768))


# ---------------------------------------------------------------------------------------------
# What a first user meets: --version, progress on a terminal, warnings
# ---------------------------------------------------------------------------------------------


def _on_a_terminal(argv, status: int = 0) -> str:
    """Run `argv` (to exit status `status`) with stdout and stderr on a pseudo-terminal, as in
    a user's shell; what it wrote there."""
    import os
    import pty
    import subprocess

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # the terminal closed with the process
                break
            if not data:
                break
            out += data
        assert proc.wait(timeout=300) == status, out.decode(errors="replace")
    finally:
        os.close(master)
        proc.kill()
    return out.decode("utf-8", errors="replace").replace("\x1b[0m", "")  # a library's colour reset


@pytest.mark.subprocess
def test_version():
    import subprocess
    import tomllib

    import omnicore

    out = subprocess.run([sys.executable, "-m", "omnicore", "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out == f"omnicore {version}\n" and omnicore.__version__ == version


LONG = " ".join(f"This is sentence number {i} of a story told in three parts." for i in range(9))


@pytest.mark.subprocess
def test_say_shows_chunks_steps_and_eta_on_a_terminal_only(tmp_path):
    import re
    import subprocess

    argv = _cli("say", LONG, "-o", str(tmp_path / "a.wav"), "--seed", "1")
    shown = _on_a_terminal(argv)
    lines = [ln for ln in re.split(r"\r\n|\r|\x1b\[K", shown) if ln.strip()]
    steps = [ln for ln in lines if "| step" in ln]
    assert steps[0].startswith("  chunk 1/3 | step 1/2 | ETA ")  # chunk 0 first: the voice
    assert any(ln.startswith("  chunks 2-3/3 | step 2/2 | ETA ") for ln in steps), steps  # then both
    assert all(re.fullmatch(r"  chunks? [\d-]+/3 \| step [12]/2 \| ETA (\d:\d\d:\d\d|\?)", ln)
               for ln in steps), steps
    assert "\r\x1b[Kwrote " in shown and "3 chunk(s)" in lines[-1]  # the status line is cleared
    # in a log (stderr not a terminal) only the lines that stay; with -q, nothing at all
    logged = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300).stderr
    assert "\r" not in logged and "| step" not in logged and "3 chunk(s)" in logged
    assert _on_a_terminal([*argv, "-q"]).strip() == ""


@pytest.mark.subprocess
def test_batch_shows_jobs_steps_eta_and_a_summary(tmp_path):
    import re
    import subprocess

    jobs = _batch_file(tmp_path, [{"id": f"j{i}", "text": f"Hello number {i}."} for i in range(5)]
                       + [{"id": "gone", "text": "Hi.", "ref_audio": "gone.wav", "ref_text": "Hi."}])
    argv = _cli("batch", jobs, "--out-dir", str(tmp_path / "out"))
    shown = _on_a_terminal(argv, status=1)  # a job failed
    lines = [ln for ln in re.split(r"\r\n|\r|\x1b\[K", shown) if ln.strip()]
    assert any(re.fullmatch(r"  jobs 1-\d/6 \| step 1/2 \| ETA .*", ln) for ln in lines), lines
    written = [ln for ln in lines if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in written] == [f"[{k}/6" for k in range(1, 7)]
    # each job's own length, then the batch's so far
    first = re.fullmatch(r"\[1/6\] .*j0\.wav: (\d+\.\d) s \| (\d+\.\d) s of audio in all \| "
                         r"ETA \d:\d\d:\d\d", written[0])
    assert first and first[1] == first[2], written[0]
    second = re.fullmatch(r"\[2/6\] .*\.wav: (\d+\.\d) s \| (\d+\.\d) s of audio in all .*",
                          written[1])
    assert second and float(second[2]) > float(second[1]), written[1]
    assert written[-1].startswith("[6/6] id 'gone': failed |")
    assert re.fullmatch(r"5 of 6 jobs written to .*, 1 failed; \d+\.\d s of audio in \d+\.\d s",
                        lines[-1])
    logged = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300).stderr
    assert "\r" not in logged and "| step" not in logged
    assert [ln.split("]")[0] for ln in logged.splitlines() if ln.startswith("[")] == \
        [f"[{k}/6" for k in range(1, 7)]


def test_the_eta_leaves_the_kernels_compile_out(monkeypatch):
    """A first run compiles kernels inside its first step: the ETA counts only the work. Here
    60 s pass before step 1 of 2, 50 of them compiling: 10 s of work for half, 10 s left (not
    a minute); a batch's ETA likewise."""
    from types import SimpleNamespace

    from omnicore.apps.cli import progress

    clock = {"now": 100.0, "compiled": 0.0}
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock["now"])
    shown = []
    status = SimpleNamespace(show=shown.append, log=shown.append)

    say = progress.SynthesisProgress(status, lambda: clock["compiled"])
    say.plan([SimpleNamespace(after=None, frames=50)])
    clock["now"], clock["compiled"] = 160.0, 50.0
    say.on_step(1, 2)
    assert shown[-1] == "  chunk 1/1 | step 1/2 | ETA 0:00:10"

    clock["compiled"] = 80.0  # compiled before the batch began: not the batch's time
    batch = progress.BatchProgress(status, 2, lambda: clock["compiled"])
    clock["now"], clock["compiled"] = 220.0, 130.0
    batch.on_step(1)(1, 2)  # job 1 half done: a quarter of the batch, 10 s of work
    assert shown[-1] == "  job 1/2 | step 1/2 | ETA 0:00:30"


@pytest.mark.subprocess
def test_a_transcript_that_cannot_be_the_clips_is_one_warning_line(tmp_path):
    """The warning reaches a command's user as one line on stderr (also with -q), naming the
    voice file or the batch line it is about; the command still does its work."""
    import subprocess

    def run(*argv):
        argv = [sys.executable, "-m", "omnicore", *argv, "--model", TINY, "-q"]
        if argv[3] != "clone-prompt":
            argv += ["--steps", "2"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stderr.splitlines()

    voice = tmp_path / "v.npz"
    (line,) = run("clone-prompt", SPEECH, "--ref-text", "Hi.", "-o", str(voice))
    assert line.startswith("omnicore: warning: ref_text does not fit its clip: 3 characters")
    assert "a normal speaking rate" in line and voice.is_file()
    (line,) = run("say", "Hello.", "--voice", str(voice), "-o", str(tmp_path / "a.wav"))
    assert line.startswith(f"omnicore: warning: {voice}: ref_text does not fit its clip")
    jobs = _batch_file(tmp_path, [{"id": "a", "text": "Hello.", "ref_audio": SPEECH, "ref_text": "Hi."},
                                  {"id": "b", "text": "Hello.", "ref_audio": SPEECH,
                                   "ref_text": "The quick brown fox jumps over the lazy dog."}])
    (line,) = run("batch", jobs, "--out-dir", str(tmp_path / "out"))
    assert line.startswith(f"omnicore: warning: {jobs}:1: id 'a': ref_text does not fit")


def test_precision_option_loads_the_profile(tmp_path, monkeypatch):
    """--precision on every model command (serve included) reaches from_pretrained; the choices
    are the backend's profiles; a profile changes the numbers, not what the command does."""
    from omnicore import OmniVoice
    from omnicore.apps.cli import common
    from omnicore.model import backend

    assert common.PRECISIONS == backend.PRECISIONS
    p = build_parser()
    assert p.parse_args(["serve", "--precision", "bf16"]).precision == "bf16"
    assert p.parse_args(["wyoming", "--precision", "int8"]).precision == "int8"
    commands = next(a for a in p._actions if a.dest == "command" or hasattr(a, "choices")
                    and isinstance(a.choices, dict)).choices
    offered = {name: next(a.help for a in sp._actions if a.dest == "precision")
               for name, sp in commands.items() if any(a.dest == "precision" for a in sp._actions)}
    assert {"say", "serve", "wyoming", "mcp", "batch", "warmup"} <= set(offered)
    for name, text in offered.items():  # every approximation labelled where it is offered
        assert "fp32 (exact, default)" in text and "int8 (approximate" in text, name
        assert "tf32 / bf16 / fp16 (approximate" in text, name
    assert p.parse_args(["say", "x", "-o", "x.wav"]).precision == "fp32"
    seen = []
    real = OmniVoice.from_pretrained.__func__

    def spy(cls, path, precision="fp32"):
        seen.append(precision)
        return real(cls, path, precision=precision)

    monkeypatch.setattr(OmniVoice, "from_pretrained", classmethod(spy))
    out = tmp_path / "a.wav"
    assert main(["say", "Hello there.", "-o", str(out), "--precision", "fp16", *FAST]) == 0
    assert seen == ["fp16"] and len(_wav(out)) > 0


def _run(argv, cwd=ROOT, env=None, status: int = 0):
    """`omnicore ARGV` as a subprocess from `cwd`: its stdout and stderr, once it exited with
    `status`."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    done = subprocess.run([sys.executable, "-m", "omnicore", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == status, (argv, done.returncode, done.stderr)
    return done.stdout, done.stderr


@pytest.mark.subprocess
def test_a_model_path_is_a_path_and_an_empty_one_is_refused(tmp_path):
    """Run from another folder, `--model weights/tiny-random` is a relative path that is not
    there (not a hub id to download), and the message says where it is; a path-shaped one is
    "no such directory"; an empty --model or OMNICORE_MODEL says it is empty. Each is one line
    before any work, and `COMMAND --version` answers as `--version` does."""
    out = str(tmp_path / "x.wav")
    _, err = _run(["say", "Hi.", "-o", out, "--model", "weights/tiny-random"], cwd=tmp_path,
                  env={"HF_HUB_OFFLINE": "1"}, status=2)
    assert err.startswith("omnicore: error: weights/tiny-random: no such directory relative to")
    assert TINY in err and "hf download" not in err and len(err.splitlines()) == 1
    _, err = _run(["say", "Hi.", "-o", out, "--model", "./models/mine"], cwd=tmp_path, status=2)
    assert "./models/mine: no such directory" in err and "hf download" not in err
    for argv, env in ((["--model", ""], None), ([], {"OMNICORE_MODEL": ""})):
        _, err = _run(["say", "Hi.", "-o", out, *argv], cwd=tmp_path, env=env, status=2)
        assert "the model is empty" in err and len(err.splitlines()) == 1, err
    assert not list(tmp_path.iterdir())
    version, _ = _run(["--version"])
    assert _run(["serve", "--version"])[0] == version and version.startswith("omnicore ")


@pytest.mark.subprocess
def test_an_unknown_language_is_a_warning_line_naming_the_command_that_lists_them(tmp_path):
    """`--language Klingon` speaks language-agnostic, as the reference does, with one
    `omnicore: warning:` line that names `omnicore languages` (not a Python function); that
    command lists the ids and names, or those it --search finds."""
    _, err = _run(["say", "Hello.", "--language", "Klingon", "-o", str(tmp_path / "a.wav"),
                   "--model", TINY, "--steps", "2", "-q"])
    (line,) = err.splitlines()
    assert line.startswith("omnicore: warning: Language 'Klingon' is not supported")
    assert "`omnicore languages`" in line and "supported_language" not in line
    _wav(tmp_path / "a.wav")
    listed, _ = _run(["languages"])
    from omnicore.text.frontend import ID_TO_NAME

    assert len(listed.splitlines()) == len(ID_TO_NAME) and "en\tEnglish" in listed.splitlines()
    found, _ = _run(["languages", "--search", "PORTUG"])
    assert found.splitlines() == ["pt\tPortuguese"]
    out, err = _run(["languages", "--search", "klingon", "-q"], status=1)
    assert out == "" and err == "omnicore: no language matches 'klingon' (no id or name " \
        "contains it); `omnicore languages` lists them all\n"


def _commands(parser, prefix=()):
    """(argv prefix, parser) of every command and action the parser has."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _commands(sub, (*prefix, name))


def test_every_command_takes_the_common_flags():
    """docs/cli.md: every command takes --model, --precision, -q and --version (a command with
    actions, `codec`, takes --version itself, the rest after its action)."""
    from omnicore.apps.cli import build_parser

    commands = list(_commands(build_parser()))
    assert {argv for argv, _ in commands} >= {("languages",), ("codec",), ("codec", "encode")}
    for argv, sub in commands:
        has_actions = any(type(a).__name__ == "_SubParsersAction" for a in sub._actions)
        flags = {"--version"} if has_actions else {"--model", "--precision", "-q", "--version"}
        assert flags <= set(sub._option_string_actions), (argv, flags)


@pytest.mark.subprocess
def test_languages_and_codec_answer_the_common_flags():
    version, _ = _run(["--version"])
    assert _run(["codec", "--version"])[0] == version == _run(["languages", "--version"])[0]
    listed, err = _run(["languages", "--model", TINY, "-q", "--search", "portug"])
    assert listed.splitlines() == ["pt\tPortuguese"] and err == ""


# ---------------------------------------------------------------------------------------------
# First contact: a reader gone early, what --profile trades, an alias to a missing voice
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["languages"], ["languages", "--search", "en"], ["--help"], ["say", "--help"],
    ["say", "Hello there. A second sentence.", "--stream", "--raw", "--model", TINY, "--steps",
     "2", "-q"]], ids=lambda a: " ".join(a[:3]))
@pytest.mark.subprocess
def test_a_reader_gone_early_ends_quietly(argv):
    """`omnicore languages | head -1`: a pipe whose reader has already closed it (as head does
    after its line) ends the command with status 0 and nothing on stderr, as other tools do."""
    import os
    import subprocess

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write is a broken pipe
    try:
        proc = subprocess.run([sys.executable, "-m", "omnicore", *argv], cwd=ROOT,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.subprocess
def test_omnicore_languages_into_head_ends_quietly():
    """`omnicore languages | head -1` with a real head: the pipe is cut to one page, so the
    list (over two pages) cannot all fit before head takes its line and leaves."""
    import fcntl
    import os
    import subprocess

    read, write = os.pipe()
    fcntl.fcntl(write, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
    head = subprocess.Popen(["head", "-n", "1"], stdin=read, stdout=subprocess.PIPE)
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "omnicore", "languages"], cwd=ROOT,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert head.communicate(timeout=60)[0].count(b"\t") == 1
    assert (proc.returncode, proc.stderr) == (0, "")


def test_every_profile_option_states_its_trade_off():
    """Whoever reads --help for --profile learns that fast is approximate, how much faster it
    is, and that its quality is not measured here: in every command that has the option."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    having = []
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if "--profile" in action.option_strings:
                having.append(name)
                for words in ("approximate", "reuses work between steps", "faster",
                              "not measured on real weights", "docs/performance.md"):
                    assert words in action.help, (name, words)
    assert {"say", "batch", "script", "serve", "wyoming", "mcp", "infer"} <= set(having)


def test_the_doors_default_to_live_and_the_rest_to_exact():
    """A server's requests that name no profile get live (its first audio fits a voice
    client's patience on a CPU), and its help says so; say and the batch commands stay
    exact (None: the model's default, exact)."""
    parser = build_parser()
    for door in ("serve", "wyoming", "mcp"):
        assert parser.parse_args([door]).profile == "live", door
        assert parser.parse_args([door, "--profile", "exact"]).profile == "exact", door
    for command in (["say", "Hi."], ["batch", "texts.txt", "--out-dir", "out"]):
        assert parser.parse_args(command).profile is None, command
    sub = next(a for a in parser._actions if a.dest == "command")
    for door in ("serve", "wyoming", "mcp"):
        profile = next(a for a in sub.choices[door]._actions if "--profile" in a.option_strings)
        assert "default live" in profile.help and "exact for the reference's" in profile.help


def test_an_alias_to_a_missing_voice_is_refused_before_the_model_loads(tmp_path, capsys,
                                                                       monkeypatch):
    """`serve --voice-alias alloy=my_voice` without my_voice would answer 404 to every alloy
    request: it is refused at start-up, naming the command that makes the voice."""
    pytest.importorskip("uvicorn")
    import omnicore.apps.server

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(omnicore.apps.server, "server_state", refuse)
    voices = tmp_path / "voices"
    serve = ["serve", "--model", TINY, "--voice-alias", "alloy=my_voice"]
    assert main(serve + ["--voices-dir", str(voices)]) == 2
    err = _one_error_line(capsys.readouterr().err, "alloy=my_voice: no voice 'my_voice'")
    assert "omnicore clone-prompt me.wav" in err and f"{voices / 'my_voice'}.npz" in err
    assert main(serve) == 2  # no --voices-dir: the library starts empty
    _one_error_line(capsys.readouterr().err, "alloy=my_voice needs --voices-dir")


def test_a_profile_dependent_default_is_said_for_the_commands_own_profile():
    """--steps' help names the default of the command's own --profile (live on the doors that
    take it, exact on say), read from the profiles, never a fixed text."""
    from omnicore.apps.cli import build_parser
    from omnicore.model.config import LIVE_PROFILE, GenerationConfig

    commands = dict(_commands(build_parser()))
    for argv, profile, steps in [(("wyoming",), "live", LIVE_PROFILE["num_step"]),
                                 (("mcp",), "live", LIVE_PROFILE["num_step"]),
                                 (("say",), "exact", GenerationConfig().num_step)]:
        sub = commands[argv]
        assert sub.get_default("profile") == (None if profile == "exact" else profile), argv
        text = " ".join(sub._option_string_actions["--steps"].help.split())
        assert f"(default {steps}, the {profile} profile's;" in text, (argv, text)
        assert f"with --profile {profile}" not in text, (argv, text)
