"""`omnicore infer` / `omnicore infer-batch`: the reference's `omnivoice-infer` /
`omnivoice-infer-batch` flags, verbatim, translated onto `say` / `batch`.

Outputs are compared byte for byte with `say` / `batch` given the same values (tiny checkpoint,
greedy decoding: position and class temperature 0, so no seed is needed); every flag is checked
to be accepted and to reach the generation call with the reference's meaning.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from omnicore.apps import cli
from omnicore.apps.cli.common import DEFAULT_MODEL
from omnicore.model.config import GenerationConfig, resolve_generation_config
from omnicore.pipeline import OmniVoice

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "weights" / "tiny-random")
SPEECH = str(ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav")

# The reference's flags (omnivoice 0.2.1, omnivoice/cli/infer.py and infer_batch.py).
INFER_FLAGS = ["--model", "--text", "--output", "--ref_audio", "--ref_text", "--instruct",
               "--language", "--num_step", "--guidance_scale", "--speed", "--duration",
               "--t_shift", "--denoise", "--postprocess_output", "--layer_penalty_factor",
               "--position_temperature", "--class_temperature", "--device"]
BATCH_FLAGS = ["--model", "--test_list", "--res_dir", "--num_step", "--guidance_scale",
               "--t_shift", "--nj_per_gpu", "--audio_chunk_duration", "--audio_chunk_threshold",
               "--batch_duration", "--batch_size", "--warmup", "--preprocess_prompt",
               "--postprocess_output", "--layer_penalty_factor", "--position_temperature",
               "--class_temperature", "--denoise", "--lang_id"]
GREEDY_INFER = ["--num_step", "3", "--position_temperature", "0", "--class_temperature", "0"]
GREEDY_SAY = ["--steps", "3", "--greedy"]


@pytest.fixture(autouse=True)
def _backend_env(monkeypatch):
    # --device cpu sets OMNICORE_BACKEND for the process; put it back after each test
    monkeypatch.setenv("OMNICORE_BACKEND", "numpy")


@pytest.fixture
def calls(monkeypatch):
    """Every OmniVoice.synthesize call's keyword arguments (the call still runs)."""
    seen = []
    real = OmniVoice.synthesize

    def spy(self, text, **kw):
        seen.append(dict(kw, text=text))
        return real(self, text, **kw)

    monkeypatch.setattr(OmniVoice, "synthesize", spy)
    return seen


def _options(sub: str) -> set[str]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return {o for a in action.choices[sub]._actions for o in a.option_strings}


def test_every_reference_flag_is_accepted():
    assert set(INFER_FLAGS) <= _options("infer")
    assert set(BATCH_FLAGS) <= _options("infer-batch")


def _generation(args):
    """The settings that reach generate(): an option left unset (None) takes the profile's value."""
    kw = {f.name: getattr(args, f.name) for f in fields(GenerationConfig)
          if getattr(args, f.name, None) is not None}
    return resolve_generation_config(None, kw)


def test_defaults_and_boolean_parsing_follow_the_reference():
    p = cli.build_parser()
    a = p.parse_args(["infer", "--text", "x", "--output", "o.wav"])
    g = _generation(a)
    assert a.num_step is None  # the profile's: 32 steps for exact, 16 for fast
    assert (a.model, g.num_step, g.guidance_scale, a.speed, a.duration, g.t_shift, g.denoise,
            g.postprocess_output, g.layer_penalty_factor, g.position_temperature,
            g.class_temperature, a.device) == (DEFAULT_MODEL, 32, 2.0, 1.0, None, 0.1, True,
                                               True, 5.0, 5.0, 0.0, None)
    b = p.parse_args(["infer-batch", "--test_list", "t", "--res_dir", "r"])
    h = _generation(b)
    assert (h.num_step, h.audio_chunk_duration, h.audio_chunk_threshold, b.preprocess_prompt,
            b.lang_id, b.nj_per_gpu, b.batch_size, b.batch_duration, b.warmup) == (
        32, 15.0, 30.0, True, None, 1, 0, 1000.0, 0)
    assert _generation(p.parse_args(["infer", "--text", "x", "--output", "o.wav",
                                      "--profile", "fast"])).num_step == 16
    for word, value in [("True", True), ("false", False), ("YES", True), ("n", False),
                        ("1", True), ("0", False), ("t", True), ("F", False)]:
        assert p.parse_args(["infer", "--text", "x", "--output", "o", "--denoise", word]).denoise is value


def test_bad_boolean_is_one_error_line(capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's usage errors exit, as for every command
        cli.main(["infer", "--text", "x", "--output", "o.wav", "--denoise", "maybe"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("omnicore: error:") and "Boolean value expected" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("infer_args,say_args", [
    ([], []),
    (["--language", "English", "--instruct", "female, low pitch"],
     ["--language", "English", "--instruct", "female, low pitch"]),
    (["--speed", "1.3", "--guidance_scale", "1.5"], ["--speed", "1.3", "--guidance", "1.5"]),
    (["--duration", "1.5", "--postprocess_output", "False"], ["--duration", "1.5", "--no-postprocess"]),
    (["--ref_audio", SPEECH, "--ref_text", "A short reference sentence.", "--denoise", "false"],
     ["--ref-audio", SPEECH, "--ref-text", "A short reference sentence.", "--no-denoise"]),
    (["--device", "cpu"], []),
])
def test_infer_writes_what_say_writes(tmp_path, infer_args, say_args):
    a, b = tmp_path / "infer.wav", tmp_path / "say.wav"
    assert cli.main(["infer", "--model", TINY, "--text", "Hello there, friend.", "--output",
                     str(a), *GREEDY_INFER, *infer_args]) == 0
    assert cli.main(["say", "Hello there, friend.", "-o", str(b), "--model", TINY, "-q",
                     *GREEDY_SAY, *say_args]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_infer_passes_every_knob_with_the_reference_meaning(tmp_path, calls):
    assert cli.main(["infer", "--model", TINY, "--text", "Knobs.", "--output",
                     str(tmp_path / "k.wav"), "--num_step", "2", "--guidance_scale", "1.25",
                     "--speed", "0.9", "--t_shift", "0.3", "--denoise", "no",
                     "--postprocess_output", "yes", "--layer_penalty_factor", "2.5",
                     "--position_temperature", "0.5", "--class_temperature", "0.7",
                     "--language", "en", "--instruct", "male", "-q"]) == 0
    (kw,) = calls
    want = dict(text="Knobs.", language="en", instruct="male", duration=None, speed=0.9,
                num_step=2, guidance_scale=1.25, seed=None, denoise=False,
                postprocess_output=True, t_shift=0.3, layer_penalty_factor=2.5,
                position_temperature=0.5, class_temperature=0.7)
    assert {k: kw.get(k) for k in want} == want


def test_infer_device_errors_are_clear(tmp_path, capsys):
    out = str(tmp_path / "d.wav")
    assert cli.main(["infer", "--model", TINY, "--text", "x", "--output", out, "--device", "mps"]) == 2
    assert "mps" in capsys.readouterr().err
    assert cli.main(["infer", "--model", TINY, "--text", "x", "--output", out, "--device", "cuda:x"]) == 2
    capsys.readouterr()
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert cli.main(["infer", "--model", TINY, "--text", "x", "--output", out,
                         "--device", "cuda"]) == 2
        assert "pip install 'omnicore[gpu]'" in capsys.readouterr().err
    else:  # this process already runs numpy: the message says how to choose CuPy
        assert cli.main(["infer", "--model", TINY, "--text", "x", "--output", out,
                         "--device", "cuda"]) == 2
        assert "OMNICORE_BACKEND=cupy" in capsys.readouterr().err
    assert not Path(out).exists()


def _jobs(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_infer_batch_writes_what_batch_writes(tmp_path, capsys):
    jobs = _jobs(tmp_path / "jobs.jsonl", [
        {"id": "a", "text": "First line.", "language_id": "en"},
        {"id": "b", "text": "Second line, designed.", "instruct": "female", "speed": 1.2},
        {"id": "c", "text": "Third line, cloned.", "ref_audio": SPEECH,
         "ref_text": "A short reference sentence.", "duration": 1.5, "language_name": "English"},
    ])
    assert cli.main(["infer-batch", "--model", TINY, "--test_list", str(jobs), "--res_dir",
                     str(tmp_path / "ref"), *GREEDY_INFER, "--nj_per_gpu", "4",
                     "--batch_size", "8", "--warmup", "2"]) == 0
    err = capsys.readouterr().err
    assert "note:" in err and "--nj_per_gpu 4" in err and "--batch_size 8" in err
    assert "--batch_duration" not in err  # left at its default: nothing to say
    assert cli.main(["batch", str(jobs), "--out-dir", str(tmp_path / "ours"), "--model", TINY,
                     "-q", *GREEDY_SAY]) == 0
    for name in "abc":
        assert (tmp_path / "ref" / f"{name}.wav").read_bytes() == \
            (tmp_path / "ours" / f"{name}.wav").read_bytes(), name


def test_infer_batch_flags_reach_generation(tmp_path, calls):
    jobs = _jobs(tmp_path / "jobs.jsonl", [
        {"id": "a", "text": "One.", "language_id": "zh"},
        {"id": "b", "text": "Two."},
        {"id": "c", "text": "Three.", "ref_audio": SPEECH, "ref_text": "A short reference sentence."},
    ])
    assert cli.main(["infer-batch", "--model", TINY, "--test_list", str(jobs), "--res_dir",
                     str(tmp_path / "r"), "--num_step", "2", "--guidance_scale", "1.5",
                     "--t_shift", "0.2", "--denoise", "False", "--postprocess_output", "0",
                     "--layer_penalty_factor", "3", "--position_temperature", "1",
                     "--class_temperature", "0.5", "--audio_chunk_duration", "10",
                     "--audio_chunk_threshold", "20", "--preprocess_prompt", "false",
                     "--lang_id", "de", "-q"]) == 0
    assert [c["text"] for c in calls] == ["One.", "Two.", "Three."]
    # --lang_id replaces every line's language_id, as the reference's infer_batch does
    assert [c["language"] for c in calls] == ["de", "de", "de"]
    want = dict(num_step=2, guidance_scale=1.5, t_shift=0.2, denoise=False,
                postprocess_output=False, layer_penalty_factor=3.0, position_temperature=1.0,
                class_temperature=0.5, audio_chunk_duration=10.0, audio_chunk_threshold=20.0,
                preprocess_prompt=False)
    for c in calls:
        assert {k: c.get(k) for k in want} == want
    assert calls[2]["ref_audio"] == SPEECH


def test_infer_batch_without_lang_id_keeps_each_line_language(tmp_path, calls):
    jobs = _jobs(tmp_path / "jobs.jsonl", [{"id": "a", "text": "One.", "language_id": "zh"},
                                           {"id": "b", "text": "Two."}])
    assert cli.main(["infer-batch", "--model", TINY, "--test_list", str(jobs), "--res_dir",
                     str(tmp_path / "r"), "--num_step", "2", "-q"]) == 0
    assert [c["language"] for c in calls] == ["zh", None]
