"""The `omnicore` command line on the tiny checkpoint: every sub-command, and errors that exit
non-zero with one message and leave no output file behind."""

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from omnicore.cli import build_parser, main

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
    assert "huggingface-cli download k2-fsa/OmniVoice" in err and "tiny-random" in err
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
