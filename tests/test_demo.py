"""The Gradio demo (demo/app.py), run for real on the tiny random checkpoint.

One app server is started for the session (conftest.demo_server), on 127.0.0.1 and a free
port, exactly as a user would start it (`python demo/app.py --model weights/tiny-random`), with
two synthesis slots (`--concurrency 2`) so that two requests really run at once. It is then driven two ways:
  * through `gradio_client`, the API a Hugging Face Space exposes (every tab is an endpoint);
  * from a real headless Chromium (Debian's `chromium` + `chromium-driver`, through selenium):
    fill each tab, generate, check that the page shows a playable WAV and the unmasking view,
    and keep screenshots as CI artefacts (their folder is printed; set OMNICORE_ARTIFACTS_DIR
    to choose it).
The tiny checkpoint's audio is noise, so the checks are about plumbing, not about speech. With
CI=true a missing gradio, selenium or browser is a failure, elsewhere a skip with the reason.

The server starts as a Space does: it times the model (demo/presets.py), opens with the speed
preset that fits the first-audio goal, streaming on when ffmpeg is there, and makes the examples.
Requests that check the unmasking view ask for `stream=False`; every run reports the estimate
of its wait beside the measured time (how close they come is benchmarked, not asserted).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import examples_made, missing
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "demo" / "app.py"
CKPT = ROOT / "weights" / "tiny-random"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
STEPS = 4  # few unmasking steps keep every request short; the picture still has 4 colours
REQUEST_S = 120


try:
    import gradio  # noqa: F401
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError, ValidationError
except ImportError:
    missing("gradio", "pip install -e '.[demo]'")

sys.path.insert(0, str(ROOT / "demo"))
import presets  # noqa: E402  (demo/presets.py: quality presets and the wait estimate)
import visuals  # noqa: E402  (demo/visuals.py: the demo's image rendering)
import visitor  # noqa: E402  (demo/visitor.py: what the page says to a visitor)

pytestmark = pytest.mark.slow

ONE_PIECE = dict(stream=False)  # the unmasking view exists only for a run in one piece

# ------------------------------------------------------------------------------------------------
# Fixtures: the app server, a reference clip, the client
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(demo_server):
    """Base URL of the running demo on the tiny checkpoint (conftest.demo_server: one for the
    session, which test_api_validation's refusals share)."""
    return demo_server.url


@pytest.fixture(scope="module")
def client(server):
    return Client(server, verbose=False)


@pytest.fixture(scope="module")
def ref_wav(tmp_path_factory) -> Path:
    """A 2 s voiced-like clip at 16 kHz (the demo must resample it): harmonics under a syllable
    envelope, plus a little noise and silence at both ends for the clean-up to trim."""
    sr = 16000
    t = np.arange(int(2.0 * sr)) / sr
    f0 = 140.0 + 20.0 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = np.clip(np.sin(2 * np.pi * 2.0 * t), 0.0, None) ** 0.5
    clip = 0.2 * voiced * envelope + 0.003 * np.random.default_rng(0).standard_normal(len(t))
    clip = np.concatenate([np.zeros(sr // 4), clip, np.zeros(sr // 4)]).astype(np.float32)
    path = tmp_path_factory.mktemp("ref") / "reference.wav"
    sf.write(path, clip, sr)
    return path


def _check_wav(data: bytes) -> np.ndarray:
    """A playable WAV: RIFF/WAVE header, 24 kHz, non-empty, finite, not silent."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:16]
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == 24000
    assert audio.ndim == 1 and len(audio) > 2400, audio.shape
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0
    return audio


def _check_unmasking_png(data: bytes, steps: int = STEPS) -> None:
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert img.shape[1] == 1000 and img.shape[0] > 200, img.shape
    # every step's colour shows up in the grid (top-left area holds the codebook rows)
    grid = img[34:34 + 8 * 24, 64:908].reshape(-1, 3)
    step_colours = visuals.colormap(np.linspace(0, 1, steps, dtype=np.float32))
    for c in step_colours:
        assert (np.abs(grid.astype(int) - c).sum(axis=1) == 0).any(), f"step colour {c} missing"


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


# ------------------------------------------------------------------------------------------------
# The pictures (no server needed)
# ------------------------------------------------------------------------------------------------


def test_unmasking_view_colours_cells_by_step():
    fill = np.array([[0, 1, 2, 3], [3, 2, 1, 0]], dtype=np.int16).repeat(4, axis=0)  # [8, 4]
    img = visuals.render_unmasking(fill, num_steps=4)
    assert img.dtype == np.uint8 and img.shape[1] == 1000 and img.shape[2] == 3
    # the cell of row 0 / frame 0 (step 1) and of row 0 / frame 3 (step 4) differ in colour and
    # match the colour map's ends
    cell_w = (1000 - 64 - 92) / 4
    first = img[34 + 10, 64 + int(0.5 * cell_w)]
    last = img[34 + 10, 64 + int(3.5 * cell_w)]
    np.testing.assert_array_equal(first, visuals.colormap(np.float32(0.0)))
    np.testing.assert_array_equal(last, visuals.colormap(np.float32(1.0)))
    with pytest.raises(ValueError):
        visuals.render_unmasking(np.zeros((8, 0), np.int16), 4)


def test_waveform_view_handles_short_and_silent_audio():
    for audio in (np.zeros(100, np.float32), np.sin(np.arange(48000) / 5.0).astype(np.float32)):
        img = visuals.render_waveform(audio, 24000)
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[1] == 1000
    loud = visuals.render_waveform(np.sin(np.arange(48000) / 5.0).astype(np.float32), 24000)
    quiet = visuals.render_waveform(np.zeros(48000, np.float32), 24000)
    assert not np.array_equal(loud, quiet)


# ------------------------------------------------------------------------------------------------
# What the page says to a visitor (demo/visitor.py; no server needed)
# ------------------------------------------------------------------------------------------------

DEVELOPER_WORDS = ("ref_text", "num_step", "preprocess_prompt", "instruct", "omnicore ",
                   "ffmpeg", "`", "pip install", "Traceback")


def _visitor_worded(line: str) -> None:
    """One short line: no server path, no command, no parameter name."""
    assert "\n" not in line and len(line) <= 120, line
    assert not re.search(r"(^|[\s'\"(])/\w", line), line  # a path
    assert not any(word in line for word in DEVELOPER_WORDS), line


def test_library_errors_become_one_visitor_line(tmp_path):
    """Real errors of the library, which name paths, commands and parameters for developers,
    become one line in the page's words, about the field they concern."""
    from omnicore import VoiceClonePrompt
    from omnicore.audio.loading import load_audio
    from omnicore.errors import OmniCoreError
    from omnicore.text import limits
    from omnicore.text.frontend import resolve_instruct

    junk_wav, junk_npz = tmp_path / "clip.wav", tmp_path / "voice.npz"
    junk_wav.write_bytes(b"junk" * 100)
    junk_npz.write_bytes(b"junk" * 100)
    raised = {}
    for name, call in (("clip", lambda: load_audio(str(junk_wav))),
                       ("voice file", lambda: VoiceClonePrompt.load(junk_npz)),
                       ("text", lambda: limits.validate_text("x" * (limits.MAX_TEXT_CHARS + 1))),
                       ("text", lambda: limits.validate_text("   ")),
                       ("transcript", lambda: limits.require_ref_text(None)),
                       ("description", lambda: resolve_instruct("femal", None))):
        with pytest.raises(OmniCoreError) as err:
            call()
        raised.setdefault(name, []).append(err.value)
    assert str(tmp_path) in str(raised["clip"][0]) and "`" in str(raised["voice file"][0])
    for field, errors in raised.items():
        for exc in errors:
            got_field, line = visitor.visitor_line(exc, text_cap=1000)
            assert got_field == field, (exc, got_field)
            _visitor_worded(line)
    assert visitor.visitor_line(raised["description"][0])[1] == "Did you mean 'female'?"
    assert "1,000 characters" in visitor.visitor_line(raised["text"][0], text_cap=1000)[1]


def test_a_voice_description_is_read_strictly_then_as_prose():
    """Picker items are read as they are; a near miss is "did you mean" first; a combination
    the model cannot do is one line; anything else is prose, mapped as the HTTP server maps
    OpenAI's `instructions`, and the page says what it understood and what it left out."""
    from omnicore.text.prose import instruct_from_prose

    assert visitor.read_instruct("female, british accent")[0] == "female, british accent"
    assert visitor.read_instruct("femal, british accent") == (None, None,
                                                              "Did you mean 'female'?")
    _, _, both = visitor.read_instruct("male, british accent, 四川话")
    assert both == "Pick an English accent or a Chinese dialect, not both."
    prose = "A warm, calm middle-aged man with a deep voice"
    read, understood, problem = visitor.read_instruct(prose)
    assert problem is None and read == instruct_from_prose(prose)[0]
    assert understood == ("Understood as: middle-aged, male, low pitch; left out: "
                          "'A warm, calm'.")
    assert visitor.read_instruct("hello there")[2].startswith("No voice words found")
    for line in (both, visitor.read_instruct("hello there")[2]):
        _visitor_worded(line)


@pytest.mark.parametrize("measured", [False, True], ids=["no-estimates", "estimates"])
def test_every_answer_that_reads_the_description_ends_in_its_live_check(tiny_model, measured,
                                                                         monkeypatch, tmp_path):
    """Gradio wipes a field's validator message when the first message of any answer to an
    event that reads the field arrives. The description's problem is shown live by a check (a
    validator) and stays only if a check's answer is the last: so every event that reads the
    description is chained to that check, or checks it itself (Generate). Unchained, the
    wait's estimate, when slower than the check, erased the line it had just shown."""
    import app  # demo/app.py

    monkeypatch.setenv("GRADIO_EXAMPLES_CACHE", str(tmp_path))  # else the app sets its own
    rate = presets.Rate(forward_s=0.01, flops_per_s=1e10, decode_s=0.01, decode_frame_s=1e-4,
                        encode_s_per_s=0.01, measured_s=1.0) if measured else None
    demo = app.build_demo(tiny_model, defaults=presets.PageDefaults(rate=rate))
    fns = list(demo.fns.values())
    field = next(c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "instruct")
    reads = [f for f in fns if any(i is field for i in f.inputs)]
    checks = [f for f in reads if f.validator is not None]
    assert checks and len(reads) > len(checks)
    for f in reads:
        if f.validator is None:
            after = [g for g in checks if g.trigger_after == f._id
                     and not g.trigger_only_on_success]
            assert after, f"{f.name} reads the description and no check follows it"
    estimates = [f for f in reads if f.name == "waits"]
    assert len(estimates) == measured


def test_clip_checks_warn_in_the_page_words():
    """The page asks for 3-10 s: a 0.2 s clip is warned about; a transcript the clip cannot
    hold gets the pace warning the API gives (same check, on the cleaned clip)."""
    from omnicore.text.frontend import reference_pace_problem

    short = visitor.clip_notes(0.2, "Hi.")
    assert short and short[0].startswith("The clip is 0.2 s long") and "3-10 s" in short[0]
    words = " ".join(["The quick brown fox jumps over the lazy dog."] * 3)  # 27 words
    assert reference_pace_problem(words, 2.0)  # what the API warns about
    paced = visitor.clip_notes(3.0, words, spoken_s=2.0)
    assert paced == ["The transcript looks too long for 2.0 s of speech: type only the words "
                     "the clip says."]
    assert visitor.clip_notes(5.0, "Just a few words here.", spoken_s=1.6) == []
    for line in short + paced:
        _visitor_worded(line)


def test_language_search_finds_native_names_and_codes_first():
    """The picker filters its labels by substring, in the list's order (gradio's dropdown):
    native names and codes are in the labels, the most spoken languages first."""
    labels = [label for label, _ in visitor.language_choices()]
    assert len(labels) == len(set(labels)) == 646

    def first(query):
        return next(label for label in labels if query.lower() in label.lower())
    assert first("日本").startswith("Japanese") and first("ja").startswith("Japanese")
    assert first("Deutsch").startswith("German") and first("de").startswith("German")
    assert first("中文").startswith("Chinese") and first("Español").startswith("Spanish")


# ------------------------------------------------------------------------------------------------
# The Space files
# ------------------------------------------------------------------------------------------------


def _requirement_names(lines) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~;\[ @]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_space_requirements_cover_omnicore_runtime_dependencies():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _requirement_names(project["dependencies"]) | {"gradio"}
    have = _requirement_names((ROOT / "demo" / "requirements.txt").read_text().splitlines())
    assert wanted <= have, f"demo/requirements.txt lacks {sorted(wanted - have)}"


def test_space_front_matter():
    import yaml  # a gradio dependency

    text = (ROOT / "demo" / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["sdk"] == "gradio"
    assert (ROOT / "demo" / meta["app_file"]).is_file()
    # the Space runs the gradio major version the tests run
    assert str(meta["sdk_version"]).split(".")[0] == gradio.__version__.split(".")[0]
    assert "k2-fsa/OmniVoice" in meta["models"]


@pytest.mark.subprocess
def test_default_model_is_the_hub_checkpoint_and_offline_fails_clearly(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               GRADIO_ANALYTICS_ENABLED="False")
    env.pop("OMNICORE_MODEL", None)
    run = subprocess.run([sys.executable, str(APP)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "k2-fsa/OmniVoice" in run.stderr and run.stderr.startswith("error:")
    assert "Traceback" not in run.stderr


# ------------------------------------------------------------------------------------------------
# gradio_client: the Space's API
# ------------------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_api_auto_voice(client):
    audio, wave, grid, timings, _ = client.predict(
        text="Hello from the tiny model.", num_step=STEPS, seed=1, api_name="/auto", **ONE_PIECE)
    _check_wav(_read(audio))
    _check_unmasking_png(_read(grid))
    assert Path(wave).stat().st_size > 1000
    assert "RTF" in timings and "unmask" in timings and "seed **1**" in timings


@pytest.mark.subprocess
def test_api_fast_profile_runs_and_an_unknown_one_is_refused(client):
    """The page's Profile setting: "fast" runs the approximate profile (other audio than exact
    for the same seed); an unknown one is refused with the choices."""
    runs = {}
    for profile in ("exact", "fast"):
        audio, *_ = client.predict(text="Hello from the tiny model.", num_step=STEPS, seed=1,
                                   position_temperature=0.0, profile=profile, api_name="/auto",
                                   **ONE_PIECE)
        runs[profile] = _check_wav(_read(audio))
    assert len(runs["exact"]) != len(runs["fast"]) or not np.array_equal(runs["exact"], runs["fast"])
    # refused when it joins the queue (gradio checks a choice before the validators run): an
    # HTTP 400 whose detail names the choices
    with pytest.raises(Exception) as err:
        client.predict(text="Hi.", num_step=STEPS, profile="turbo", api_name="/auto", **ONE_PIECE)
    detail = err.value.response.json()["detail"]
    assert "'turbo'" in detail and "['exact', 'fast']" in detail, detail


@pytest.mark.subprocess
def test_api_voice_design_and_its_instruct_check(client):
    audio, _, grid, _, _ = client.predict(
        text="Good evening.", instruct="female, british accent", num_step=STEPS, seed=2,
        api_name="/design", **ONE_PIECE)
    _check_wav(_read(audio))
    _check_unmasking_png(_read(grid))
    ok = client.predict(instruct="Female, British Accent", text="Hi.", api_name="/check_instruct")
    assert ok == "✓ The model reads: female, british accent."


@pytest.mark.subprocess
def test_api_invalid_instruct_is_explained(client):
    """An impossible description is one line, on the description field, before any work; a
    near miss is "did you mean" first; a prose description is what the page understood."""
    msg = client.predict(instruct="male, british accent, 四川话", text="Hi.",
                         api_name="/check_instruct")
    assert msg == "⚠ Pick an English accent or a Chinese dialect, not both."
    with pytest.raises(ValidationError) as err:
        client.predict(text="Hi.", instruct="male, british accent, 四川话", num_step=STEPS,
                       api_name="/design")
    assert "instruct: Pick an English accent or a Chinese dialect" in str(err.value)
    with pytest.raises(ValidationError) as err:
        client.predict(text="Hi.", instruct="mal", num_step=STEPS, api_name="/design")
    assert "instruct: Did you mean 'male'?" in str(err.value)
    said = client.predict(instruct="a calm old man", text="Hi.", api_name="/check_instruct")
    assert said == "✓ Understood as: elderly, male; left out: 'a calm'."


@pytest.mark.subprocess
def test_api_bad_input_gives_typed_messages(client, tmp_path):
    """Each input problem is one visitor line, named by its field, before any work."""
    with pytest.raises(ValidationError) as err:
        client.predict(text="   ", num_step=STEPS, api_name="/auto")
    assert "text: Type some text to speak." in str(err.value)
    with pytest.raises(ValidationError) as err:  # over the page's cap (the library's is 20,000)
        client.predict(text="x" * 1001, num_step=STEPS, api_name="/auto")
    assert "at most 1,000 characters" in str(err.value)
    with pytest.raises(ValidationError) as err:
        client.predict(text="Hi.", ref_audio=None, voice_prompt_file=None, num_step=STEPS,
                       api_name="/clone")
    assert "Add a voice clip" in str(err.value)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a voice prompt")
    with pytest.raises(ValidationError) as err:
        client.predict(text="Hi.", ref_audio=None, voice_prompt_file=handle_file(str(junk)),
                       num_step=STEPS, api_name="/clone")
    assert "This voice file cannot be read" in str(err.value)
    for line in str(err.value).splitlines()[1:]:
        _visitor_worded(line.split(": ", 1)[1])


@pytest.mark.subprocess
def test_api_voice_clone_from_clip_and_from_saved_prompt(client, ref_wav):
    from omnicore import VoiceClonePrompt

    audio, _, grid, timings, _ = client.predict(
        text="Cloned speech.", ref_audio=handle_file(str(ref_wav)),
        ref_text="A short reference sentence.", voice_prompt_file=None, num_step=STEPS, seed=3,
        api_name="/clone", **ONE_PIECE)
    _check_wav(_read(audio))
    _check_unmasking_png(_read(grid))
    assert "encode" in timings  # the clip went through the codec encoder
    npz = client.predict(ref_audio=handle_file(str(ref_wav)),
                         ref_text="A short reference sentence.", api_name="/make_voice_prompt")
    prompt = VoiceClonePrompt.load(npz)
    assert prompt.ref_audio_tokens.shape[0] == 8 and prompt.ref_audio_tokens.shape[1] > 0
    assert prompt.ref_text.startswith("A short reference sentence")
    audio2, _, _, timings2, _ = client.predict(
        text="Cloned speech.", ref_audio=None, voice_prompt_file=handle_file(npz),
        num_step=STEPS, seed=3, api_name="/clone", **ONE_PIECE)
    _check_wav(_read(audio2))
    assert "encode" not in timings2  # a saved prompt skips the encoder


@pytest.mark.subprocess
def test_api_keep_this_voice(server, ref_wav):
    """"Keep this voice" saves the session's last result (here a design) as a voice prompt with
    exactly its codes and text; the clone endpoint then speaks with it. A session without a
    result is told to generate first. Pause marks in the text are just text to the demo."""
    from omnicore import OmniVoice, VoiceClonePrompt

    client = Client(server, verbose=False)  # a session of its own
    with pytest.raises(AppError) as err:
        client.predict(api_name="/keep_voice")
    assert "Generate speech first" in str(err.value)
    text = "Keep this voice. [pause:0.5s] It is mine."
    client.predict(text=text, instruct="female, low pitch", num_step=STEPS, seed=9,
                   api_name="/design", **ONE_PIECE)
    npz = client.predict(api_name="/keep_voice")
    kept = VoiceClonePrompt.load(npz)
    want = OmniVoice.from_pretrained(CKPT).synthesize(text, instruct="female, low pitch",
                                                      num_step=STEPS, seed=9)[0]
    np.testing.assert_array_equal(kept.ref_audio_tokens, want.codes)
    assert kept.ref_text == "Keep this voice. It is mine."
    audio, *_ = client.predict(text="Now in the kept voice.", ref_audio=None,
                               voice_prompt_file=handle_file(npz), num_step=STEPS, seed=9,
                               api_name="/clone")
    _check_wav(_read(audio))


@pytest.mark.subprocess
def test_api_streaming_option(client):
    """With stream=True the endpoint yields audio pieces to the streaming player while it
    generates; the final audio and timings come from the same pieces; no unmasking view."""
    if not shutil.which("ffmpeg"):  # gradio encodes streamed audio with it (on this machine)
        missing("ffmpeg", "apt-get install -y ffmpeg")
    job = client.submit(text="Streaming from the tiny model. It is noise, but it flows.",
                        num_step=STEPS, seed=6, stream=True, api_name="/auto")
    audio, wave, grid, timings, _ = job.result(timeout=REQUEST_S)
    _check_wav(_read(audio))
    assert Path(wave).stat().st_size > 1000
    assert grid is None and "No unmasking view for a streamed run" in timings
    assert "first audio after" in timings and "seed **6**" in timings
    # every yield before the final one fed the streaming player (an HLS playlist of the
    # pieces so far) and left the other outputs alone
    *steps, last = job.outputs()
    assert last[0] == audio and steps, job.outputs()
    played = [o[4] for o in steps if isinstance(o[4], str)]
    assert played and all(p.endswith(".m3u8") for p in played), steps
    assert all(isinstance(o[0], dict) for o in steps)  # gr.skip(): final audio only at the end
    with pytest.raises(ValidationError) as err:  # errors are the same visitor lines
        client.predict(text="   ", num_step=STEPS, stream=True, api_name="/auto")
    assert "Type some text to speak." in str(err.value)
    with pytest.raises(ValidationError) as err:
        client.predict(text="Hi.", instruct="mal", num_step=STEPS, stream=True,
                       api_name="/design")
    assert "Did you mean 'male'?" in str(err.value)


@pytest.mark.subprocess
def test_api_normalize_text_option(client):
    """The 'Read numbers as words' setting: the audio of the text written out. Where the tn
    extra does not import (a Space: pynini has no wheel for its Python) the page does not offer
    it, and an API caller who asks is told in one line."""
    import importlib.util

    ask = dict(num_step=STEPS, seed=7, language="en", api_name="/auto", **ONE_PIECE)
    if not all(importlib.util.find_spec(m) for m in ("tn", "pynini", "num2words")):  # the tn extra
        with pytest.raises(AppError) as err:
            client.predict(text="I have 3 cats.", normalize_text=True, **ask)
        assert "Reading numbers as words is not available" in str(err.value)
        missing("the tn extra", "pip install -e '.[tn]'")
    spoken = client.predict(text="I have 3 cats.", normalize_text=True, **ask)
    written = client.predict(text="I have three cats.", **ask)
    assert _read(spoken[0]) == _read(written[0])
    assert _read(client.predict(text="I have 3 cats.", **ask)[0]) != _read(written[0])


@pytest.mark.subprocess
def test_progress_reports_unmasking_steps(client):
    job = client.submit(text="Watching the progress of the unmasking steps.", num_step=32, seed=4,
                        api_name="/auto", **ONE_PIECE)
    seen = set()
    deadline = time.monotonic() + REQUEST_S
    while not job.done() and time.monotonic() < deadline:
        for unit in job.status().progress_data or ():
            seen.add((unit.index, unit.length, unit.unit, unit.desc))
        time.sleep(0.02)
    _check_wav(_read(job.result(timeout=REQUEST_S)[0]))
    assert seen, "no progress update arrived while 32 steps ran"
    assert all(length == 32 and unit == "steps" and desc == "Unmasking"
               for _, length, unit, desc in seen), seen
    assert all(0 < index <= 32 for index, *_ in seen), seen


def _defaults(client) -> dict:
    """The /auto endpoint's parameter defaults: what a caller who sets nothing gets."""
    info = client.view_api(return_format="dict", print_info=False)
    return {p["parameter_name"]: p["parameter_default"]
            for p in info["named_endpoints"]["/auto"]["parameters"]}


@pytest.mark.subprocess
def test_defaults_are_the_preset_chosen_for_this_machine(client):
    """Called with its defaults, the demo runs the steps of a quality preset (the reference's
    num_step only: every other setting is GenerationConfig's), streamed when ffmpeg is there."""
    from omnicore import GenerationConfig

    defaults = _defaults(client)
    assert defaults["num_step"] in presets.PRESETS.values(), defaults
    assert defaults["stream"] is (shutil.which("ffmpeg") is not None)
    gen = GenerationConfig()
    for name in ("guidance_scale", "t_shift", "layer_penalty_factor", "position_temperature",
                 "class_temperature"):
        assert defaults[name] == getattr(gen, name), name


def _seconds(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, (pattern, text)
    return float(found.group(1))


ESTIMATE_TEXT = ("The kettle clicked off just as the rain started drumming on the window. Please "
                 "leave the parcel with the neighbour, at number twelve. Our train was late.")


@pytest.mark.subprocess
@pytest.mark.parametrize("stream", [False, True], ids=["one-piece", "streamed"])
def test_each_run_shows_the_estimate_made_before_it(client, stream):
    """Every run reports the estimate made before it (from the plan's FLOPs and the rate timed at
    start-up, kept up to date by earlier runs) beside the time it took: for a stream, the first
    audio and all of it. How close the two come depends on the machine and its load: that is
    measured by benchmarks/bench_space.py, and what the estimate is made of by test_presets.py."""
    if stream and not shutil.which("ffmpeg"):
        missing("ffmpeg", "apt-get install -y ffmpeg")
    *_, timings, _ = client.predict(text=ESTIMATE_TEXT, num_step=8, seed=21, stream=stream,
                                    api_name="/auto")
    if stream:
        first = _seconds(r"Estimated before the run: first audio after ([\d.]+) s", timings)
        total = _seconds(r"all of it after ([\d.]+) s", timings)
        assert 0 < first <= total, timings
        assert _seconds(r"first audio after \*\*([\d.]+) s", timings) > 0
    else:
        assert _seconds(r"Estimated before the run: ([\d.]+) s", timings) > 0
        assert _seconds(r"it took ([\d.]+) s", timings) > 0


@pytest.mark.subprocess
def test_the_examples_are_made_before_the_page_is_served(demo_server):
    """A visitor who comes as soon as the demo answers never shares the cores with the
    examples being made: they were all made before the server listened (a Space reports
    ready when its port answers), and gradio found them in its cache at launch."""
    made = examples_made(demo_server.cache)
    assert made >= 3 and demo_server.examples == made, (demo_server, made)
    log = demo_server.log.read_text()
    assert log.rindex("Caching examples at") < log.index("Running on local URL") < log.index(
        "Using cache from"), log


@pytest.mark.subprocess
def test_two_concurrent_requests_run_at_once_with_the_right_results(server):
    """The server runs with --concurrency 2: two requests from two clients are generating at the
    same time (each reports a step before the other's last one: with one slot the second would
    wait in the queue until the first had reported its last), and each returns the audio it
    returns alone.
    Greedy cell choice (position_temperature 0): the engine packs both into shared forwards, and
    only greedy decisions are independent of the pack bit for bit (a Gumbel draw within GEMM
    rounding of a tie may flip with the pack's row count); one int16 step of room."""
    from gradio_client.utils import Status

    steps = 32
    requests = {11: "Request number eleven, with enough words to keep the model busy a while.",
                12: "Request twelve is another sentence, said in another voice entirely."}
    greedy = dict(num_step=steps, position_temperature=0.0, api_name="/auto", **ONE_PIECE)
    jobs = [Client(server, verbose=False).submit(text=text, seed=seed, **greedy)
            for seed, text in requests.items()]

    def step(job) -> int | None:
        """The unmasking step a job reports now, or None (queued, or past its last step)."""
        st = job.status()
        units = st.progress_data or []
        if st.code == Status.PROGRESS and units and units[0].index is not None:
            return units[0].index if units[0].index < units[0].length else None
        return None
    together = []  # (step, step): both mid-run at the same look
    deadline = time.monotonic() + 2 * REQUEST_S
    while not all(j.done() for j in jobs) and time.monotonic() < deadline and not together:
        steps_now = [step(j) for j in jobs]
        if None not in steps_now:
            together.append(tuple(steps_now))
        time.sleep(0.005)
    results = [j.result(timeout=REQUEST_S) for j in jobs]
    assert together, "the two requests never both reported a step short of their last"
    together = [_check_wav(_read(r[0])) for r in results]
    assert "seed **11**" in results[0][3] and "seed **12**" in results[1][3]
    assert not (len(together[0]) == len(together[1]) and np.array_equal(*together))
    client = Client(server, verbose=False)
    for (seed, text), got in zip(requests.items(), together):
        alone = _check_wav(_read(client.predict(text=text, seed=seed, **greedy)[0]))
        assert alone.shape == got.shape
        assert np.abs(alone - got).max() <= 2.0 ** -15 * 1.01


# ------------------------------------------------------------------------------------------------
# A real browser
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        missing("headless Chromium", "apt-get install -y chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium", "pip install selenium")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1400,2300", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    # explicit driver path: selenium must not try to download a driver or a browser
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def artefacts():
    folder = Path(os.environ.get("OMNICORE_ARTIFACTS_DIR")
                  or tempfile.mkdtemp(prefix="omnicore-demo-screenshots-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Page:
    """What a person does on the page, in selenium terms."""

    def __init__(self, driver, url: str, shots: Path):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.d, self.url, self.shots, self.By = driver, url, shots, By
        self.wait = lambda timeout=REQUEST_S: WebDriverWait(driver, timeout, poll_frequency=0.2)

    def css(self, selector: str):
        return self.d.find_element(self.By.CSS_SELECTOR, selector)

    def open(self) -> None:
        self.d.get(self.url)
        self.wait(60).until(lambda d: d.find_elements(self.By.CSS_SELECTOR, "#auto-go"))

    def open_settings(self) -> None:
        """Unfold the settings (folded when the page opens)."""
        if not self.visible("#steps"):
            self.d.find_element(self.By.XPATH, "//*[@id='settings']//button[contains(., "
                                "'Settings')] | //*[@id='settings']//*[normalize-space()="
                                "'Settings']").click()
            self.wait(10).until(lambda d: self.visible("#steps"))

    def rect(self, selector: str) -> dict:
        """The element's box in page coordinates (top from the top of the document)."""
        return self.d.execute_script(
            "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
            "return {top: r.top + window.scrollY, bottom: r.bottom + window.scrollY,"
            " view_top: r.top, view_bottom: r.bottom};", selector)

    def page_text(self) -> str:
        return self.d.find_element(self.By.TAG_NAME, "body").text

    def times_shown(self, text: str) -> int:
        """How many elements show `text` to the eye. Gradio's screen-reader announcer (a
        1-pixel live region that repeats a validator's message for a moment, so that a
        screen reader says it) is left out: selenium counts it as displayed."""
        return self.d.execute_script("""
            const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
            let n = 0;
            while (walk.nextNode()) {
              const e = walk.currentNode.parentElement;
              n += walk.currentNode.nodeValue.includes(arguments[0]) && !e.closest('.sr-only')
                   && e.offsetParent !== null;
            }
            return n;""", text)

    def tab(self, name: str) -> None:
        self.d.find_element(self.By.XPATH,
                            f"//button[@role='tab' and normalize-space()='{name}']").click()

    def type(self, selector: str, text: str) -> None:
        """Replace the field's text as a person who pastes all but its last character and
        types that one: the browser inserts the paste in one input event (typed key by key,
        every keystroke is a change the page answers with several requests: seconds of a busy
        page for one sentence), and the last key is a real keystroke (gradio's `input` event
        follows keys)."""
        from selenium.webdriver.common.keys import Keys

        box = self.css(selector)
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(Keys.DELETE)
        if len(text) > 1:
            self.d.execute_cdp_cmd("Input.insertText", {"text": text[:-1]})  # the focused field
        box.send_keys(text[-1:])
        box.send_keys(Keys.TAB)  # commit, as leaving the field does

    def pick(self, picker: str, label: str) -> None:
        box = self.css(f"#{picker} input")
        self.d.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
        box.click()
        option = f"#{picker} li[role=option][aria-label=\"{label}\"]"
        self.wait(10).until(lambda d: d.find_elements(self.By.CSS_SELECTOR, option))
        self.d.execute_script("arguments[0].scrollIntoView({block: 'nearest'})",
                              self.css(option))
        self.css(option).click()

    def value(self, selector: str) -> str:
        return self.css(selector).get_attribute("value")

    def audio_src(self) -> str:
        found = self.d.find_elements(self.By.CSS_SELECTOR, "#audio-out audio")
        return (found[0].get_attribute("src") or "") if found else ""

    def generate(self, button: str) -> bytes:
        """Click a Generate button; wait for a new audio and unmasking image; return the WAV."""
        before = self.audio_src()
        grid_before = self.image_src("#unmasking-view")
        self.css(button).click()
        self.wait().until(lambda d: self.audio_src() not in ("", before)
                          and self.image_src("#unmasking-view") not in ("", grid_before))
        with urllib.request.urlopen(self.audio_src(), timeout=30) as r:
            return r.read()

    def players(self) -> list[str]:
        """The ids of the audio players a visitor sees (shown, and holding audio)."""
        return self.d.execute_script(
            "return [...document.querySelectorAll('audio')].filter(a => a.offsetParent !== null"
            " && a.getAttribute('src')).map(a => a.closest('[id]')?.id);")

    def result_done(self) -> bool:
        """Whether the timings show a finished run (in one piece, or streamed)."""
        said = self.css("#timings").text
        return "RTF" in said and "Example made" not in said

    def result_audio(self) -> np.ndarray:
        """The audio of the one player that shows the result, as its Download button gives
        it: the WAV of a run in one piece, or the whole stream of a streamed run."""
        shown = self.players()
        assert len(shown) == 1, shown  # one player holds the result
        link = self.css(f"#{shown[0]} a[data-testid=download-link]")
        data = self.fetch(link.get_attribute("href"))
        if shown[0] == "audio-out":
            return _check_wav(data)
        audio, sr = sf.read(io.BytesIO(data))  # the stream, combined (MP3)
        assert sr == 24000 and len(audio) > 0.5 * sr and np.abs(audio).max() > 0.01
        return audio

    def image_src(self, block: str) -> str:
        imgs = self.d.find_elements(self.By.CSS_SELECTOR, f"{block} img")
        loaded = [i for i in imgs
                  if self.d.execute_script("return arguments[0].naturalWidth", i) > 0]
        return loaded[0].get_attribute("src") if loaded else ""

    def fetch(self, src: str) -> bytes:
        with urllib.request.urlopen(src, timeout=30) as r:
            return r.read()

    def visible(self, selector: str) -> bool:
        return self.d.execute_script(  # in the page: the element may be re-rendered meanwhile
            "const e = document.querySelector(arguments[0]);"
            "return !!e && e.offsetParent !== null;", selector)

    def overlap(self, block: str, a: str, b: str) -> float:
        """Pixels of overlap between the first `a` and the first `b` inside `block`."""
        return self.d.execute_script("""
            const root = document.querySelector(arguments[0]);
            const a = root.querySelector(arguments[1]).getBoundingClientRect();
            const b = root.querySelector(arguments[2]).getBoundingClientRect();
            const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
            const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
            return Math.max(w, 0) * Math.max(h, 0);""", block, a, b)

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.d.save_screenshot(str(path))
        return path


@pytest.mark.subprocess
@pytest.mark.browser
def test_browser_all_tabs(server, browser, artefacts, ref_wav, capsys):
    page = Page(browser, server, artefacts)
    page.open()
    assert "omnicore" in browser.title
    with capsys.disabled():
        print(f"\n[demo] browser screenshots in {artefacts}")

    # What it opens with: the quality preset chosen for this machine (in the folded settings),
    # the estimate of the wait above each Generate button, and examples that play at once
    page.open_settings()
    chosen = [e.get_attribute("value") for e in
              browser.find_elements(page.By.CSS_SELECTOR, "#preset input") if e.is_selected()]
    assert len(chosen) == 1 and chosen[0] in presets.PRESETS, chosen
    assert page.value("#steps input[type=number]") == str(presets.PRESETS[chosen[0]])
    page.tab("Auto voice")
    page.wait(30).until(lambda d: "on this machine" in page.css("#auto-estimate").text)
    assert f"{presets.PRESETS[chosen[0]]} steps" in page.css("#auto-estimate").text
    page.screenshot("0-opened")
    example = page.d.find_element(page.By.XPATH, "//*[@id='auto-examples']//button[contains("
                                  "., 'This is OmniVoice running on numpy')]")
    example.click()  # played from the cache: the timings are the run made at start-up
    page.wait(30).until(lambda d: page.audio_src() and page.image_src("#unmasking-view"))
    assert "Example made at start-up" in page.css("#timings").text
    assert "This is OmniVoice running on numpy" in page.value("#auto-text textarea")
    _check_wav(page.fetch(page.audio_src()))
    page.screenshot("1-cached-example")

    # shared settings (unfolded above): few steps, fixed seed, in one piece (the unmasking view
    # needs it): the streaming player goes away, and a run in one piece leaves it alone
    import importlib.util  # "Read numbers as words" is offered only where the tn extra imports

    tn = all(importlib.util.find_spec(m) for m in ("tn", "pynini", "num2words"))
    assert page.visible("#normalize-text") == tn
    page.type("#steps input[type=number]", str(STEPS))
    page.type("#seed input", "5")
    if page.css("#stream input").is_selected():
        page.css("#stream input").click()
    page.wait(20).until(lambda d: not page.visible("#stream-out"))
    # 4 steps match no preset: the server's answer to the change clears the choice
    page.wait(20).until(lambda d: not any(e.is_selected() for e in
                                          d.find_elements(page.By.CSS_SELECTOR, "#preset input")))
    page.wait(20).until(lambda d: f"{STEPS} steps, heard when it is done"
                        in page.css("#auto-estimate").text)

    # Auto voice
    page.type("#auto-text textarea", "Testing the auto voice in a real browser.")
    _check_wav(page.generate("#auto-go"))
    _check_unmasking_png(page.fetch(page.image_src("#unmasking-view")))
    assert page.image_src("#waveform-view")
    assert "RTF" in page.css("#timings").text and "Estimated before the run" in page.css(
        "#timings").text
    assert not page.visible("#stream-out")
    page.screenshot("2-auto-voice")

    # Voice design: pickers compose the instruct; the line under it says what the model reads
    page.tab("Voice design")
    page.type("#design-text textarea", "Testing voice design.")
    page.pick("pick-gender", "Female / 女")
    page.pick("pick-accent", "British Accent / 英国口音")
    page.wait(20).until(lambda d: page.value("#instruct textarea") == "female, british accent")
    page.wait(20).until(lambda d: "The model reads: female, british accent"
                        in page.css("#instruct-status").text)
    _check_wav(page.generate("#design-go"))
    page.screenshot("3-voice-design")

    # ... an invalid combination is one line on the field, live and again on Generate: once
    # on the page, no toast, no estimate line repeating it
    page.pick("pick-dialect", "Sichuan Dialect / 四川话")
    both = "Pick an English accent or a Chinese dialect, not both."
    page.wait(20).until(lambda d: both in page.css("#instruct").text)
    page.css("#design-go").click()
    page.wait(20).until(lambda d: both in page.css("#instruct").text)
    time.sleep(1)  # what a toast would need to show up (none may)
    assert page.times_shown(both) == 1, page.page_text()
    assert not page.d.find_elements(page.By.CSS_SELECTOR, "[data-testid='toast-body']")
    assert "Traceback" not in page.page_text()
    page.screenshot("4-invalid-instruct")

    # a free description goes through the HTTP server's prose mapping and says what it read
    page.type("#instruct textarea", "A warm, calm middle-aged man with a deep voice")
    page.wait(20).until(lambda d: "Understood as: middle-aged, male, low pitch"
                        in page.css("#instruct-status").text)
    assert "Did you mean" not in page.css("#instruct").text

    # Voice clone: upload a clip, type its transcript, generate; then save a voice prompt. The
    # upload slots' labels stay clear of their upload icons.
    page.tab("Voice clone")
    for slot in ("#ref-audio", "#voice-file"):
        assert page.overlap(slot, "[data-testid=block-label]", "[data-testid=upload-icon]") == 0
    page.type("#clone-text textarea", "Testing the voice clone.")
    page.css("#ref-audio input[type=file]").send_keys(str(ref_wav))
    page.wait(30).until(lambda d: d.find_elements(page.By.CSS_SELECTOR, "#ref-audio audio, "
                                                  "#ref-audio [data-testid*=waveform]"))
    page.type("#ref-text textarea", "A short reference sentence.")
    _check_wav(page.generate("#clone-go"))
    page.css("#save-voice").click()
    link = "#voice-file a[href*='.npz']"
    page.wait().until(lambda d: d.find_elements(page.By.CSS_SELECTOR, link))
    npz = page.fetch(page.css(link).get_attribute("href"))
    assert npz[:2] == b"PK"  # an .npz is a zip archive
    page.screenshot("5-voice-clone")

    # Streamed: the streaming player is back and plays the pieces; the timings say when the
    # first audio came and what was estimated
    if shutil.which("ffmpeg"):
        page.tab("Auto voice")
        page.css("#stream input").click()
        page.wait(20).until(lambda d: page.visible("#stream-out"))
        page.type("#auto-text textarea", "Streaming in the browser. The first piece plays first.")
        page.css("#auto-go").click()
        page.wait().until(lambda d: "first audio after" in page.css("#timings").text)
        # one player holds the result: the streaming one, with the whole stream to download
        # (the normal player has the same audio, for API callers, and is not shown)
        page.wait(20).until(lambda d: page.players() == ["stream-out"])
        assert page.visible("#stream-out [aria-label=Download], #stream-out [title=Download]")
        page.result_audio()
        page.screenshot("6-streamed")
        # an example plays in the normal player, which comes back alone
        example = page.d.find_element(page.By.XPATH, "//*[@id='auto-examples']//button["
                                      "contains(., 'The kettle clicked off')]")
        example.click()
        page.wait(30).until(lambda d: page.players() == ["audio-out"])
    for name in ("0-opened", "1-cached-example", "2-auto-voice", "3-voice-design",
                 "4-invalid-instruct", "5-voice-clone"):
        assert (artefacts / f"{name}.png").stat().st_size > 10_000


class _Viewport:
    """The browser as a screen of this size (a phone: mobile, touch), for one test."""

    def __init__(self, driver, width: int, height: int, mobile: bool = False):
        self.d, self.metrics = driver, dict(width=width, height=height, deviceScaleFactor=1,
                                            mobile=mobile)

    def __enter__(self):
        self.d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", self.metrics)
        self.d.execute_cdp_cmd("Emulation.setTouchEmulationEnabled",
                               {"enabled": self.metrics["mobile"]})
        return self

    def __exit__(self, *exc):
        self.d.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": False})
        self.d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@pytest.mark.subprocess
@pytest.mark.browser
def test_browser_first_screen_speaks_in_one_click(server, browser, artefacts):
    """At 1366x900 the page opens on the auto voice with a text filled in, one line of intro
    (the rest folded under "How it works"), the settings folded, and Generate with its Stop
    above the fold; one click on Generate, with nothing uploaded or changed, gives speech."""
    with _Viewport(browser, 1366, 900):
        page = Page(browser, server, artefacts)
        page.open()
        assert page.value("#auto-text textarea").strip()
        assert page.visible("#auto-go") and page.visible("#auto-stop")
        assert page.rect("#auto-go")["view_bottom"] <= 900, page.rect("#auto-go")
        assert not page.visible("#steps") and not page.visible("#preset")  # folded
        intro = page.css("#intro").text.strip().splitlines()
        assert len(intro) == 2, intro  # the title and one line
        assert "bidirectional" not in page.page_text()  # "How it works" is folded
        assert "1,000 characters" in page.css("#auto-text").text  # the cap, in the box
        page.screenshot("first-screen-desktop")
        page.css("#auto-go").click()
        page.wait().until(lambda d: page.result_done())
        page.result_audio()  # in the one player shown
        assert "Traceback" not in page.page_text()


@pytest.mark.subprocess
@pytest.mark.browser
def test_browser_phone_layout_puts_the_result_in_view(server, browser, artefacts):
    """At 390x844 (a phone) the auto voice is the open tab, Generate is on the first screen,
    the result sits less than 1,000 px below it (the settings are folded), and pressing
    Generate scrolls to the result."""
    with _Viewport(browser, 390, 844, mobile=True):
        page = Page(browser, server, artefacts)
        page.open()
        assert page.visible("#auto-text") and page.value("#auto-text textarea").strip()
        go, out = page.rect("#auto-go"), page.rect("#result")
        assert go["view_bottom"] <= 844, go
        assert 0 < out["top"] - go["bottom"] < 1000, (go, out)
        page.screenshot("first-screen-phone")
        page.css("#auto-go").click()
        page.wait(20).until(lambda d: -1 <= page.rect("#result")["view_top"] < 844)
        page.wait().until(lambda d: page.result_done())
        page.result_audio()
        assert -1 <= page.rect("#result")["view_top"] < 844  # scrolled to it (to a pixel)


# Each shown dropdown's value against its box: the text's width (measured in the input's own font)
# must fit the input's content box, and that box must end before the arrow starts.
CLIPPED_PICKERS = """
const out = [];
for (const p of document.querySelectorAll('.omni-picker')) {
  if (p.offsetParent === null) continue;
  const input = p.querySelector('input'), arrow = p.querySelector('.icon-wrap');
  const cs = getComputedStyle(input), box = input.getBoundingClientRect();
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
  const room = input.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  const text = ctx.measureText(input.value).width;
  const end = box.right - parseFloat(cs.paddingRight);
  if (text > room + 0.5 || input.scrollWidth > input.clientWidth
      || (arrow && end > arrow.getBoundingClientRect().left + 0.5))
    out.push(`${p.id}: '${input.value}' needs ${text.toFixed(0)} px, has ${room.toFixed(0)};`
             + ` the text ends at ${end.toFixed(0)}, the arrow starts at`
             + ` ${arrow ? arrow.getBoundingClientRect().left.toFixed(0) : 'none'}`);
}
return out;"""

# Words of the shown table headers that a line break cuts in two ("chun k"): a word laid out on
# more than one line has client rectangles at more than one height.
BROKEN_HEADER_WORDS = """
const out = [];
for (const th of document.querySelectorAll('th')) {
  if (th.offsetParent === null) continue;
  const walk = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode())
    for (const m of n.data.matchAll(/\\S+/g)) {
      const r = document.createRange();
      r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
      const lines = new Set([...r.getClientRects()].filter(x => x.width > 0)
                            .map(x => Math.round(x.top)));
      if (lines.size > 1) out.push(m[0]);
    }
}
return out;"""


@pytest.mark.subprocess
@pytest.mark.browser
@pytest.mark.parametrize("size", [(1366, 900), (390, 844)], ids=["desktop", "phone"])
def test_browser_pickers_and_table_headers_show_whole_values(server, browser, artefacts, size):
    """At 1366x900 and on a phone, each voice picker shows its longest value whole and clear
    of its arrow, and so does the language picker with the longest of the first languages it
    lists (a rarer, longer name ends in an ellipsis before the arrow); the timings tables (a
    run in one piece and a streamed one) break their headers between words only."""
    width, height = size
    with _Viewport(browser, width, height, mobile=width < 768):
        page = Page(browser, server, artefacts)
        page.open()
        example = page.d.find_element(page.By.XPATH, "//*[@id='auto-examples']//button["
                                      "contains(., 'This is OmniVoice running on numpy')]")
        page.d.execute_script("arguments[0].scrollIntoView({block: 'center'})", example)
        example.click()  # cached: its table at once
        page.wait(30).until(lambda d: "seconds" in page.css("#timings").text)
        assert page.d.execute_script(BROKEN_HEADER_WORDS) == []
        if shutil.which("ffmpeg"):  # streamed: the table per chunk
            page.type("#auto-text textarea", "Headers, measured. A second sentence.")
            page.css("#auto-go").click()
            page.wait().until(lambda d: "first audio after" in page.css("#timings").text)
            assert "chunk" in page.css("#timings").text
            assert page.d.execute_script(BROKEN_HEADER_WORDS) == []

        page.open_settings()
        labels = [label for label, _ in visitor.language_choices()[:40]]
        page.pick("language", max(labels, key=len))
        page.tab("Voice design")
        for cat, choices in visitor.picker_items().items():
            page.pick(f"pick-{cat}", max((label for label, _ in choices), key=len))
        assert page.d.execute_script(CLIPPED_PICKERS) == []
        page.screenshot(f"pickers-{width}x{height}")


def _stop_report(text: str) -> tuple[int, int, int]:
    """(step the run ended at, of steps, step reported last when Stop came) from the page."""
    found = re.search(r"Stopped\*?\*? after step (\d+) of (\d+) \(Stop came after step (\d+)\)",
                      text)
    assert found, text
    return tuple(int(g) for g in found.groups())


@pytest.mark.subprocess
def test_api_stop_ends_the_sessions_run_within_one_step(server):
    """/stop (the Stop button) ends the caller's own run at the engine's next step: the run
    returns at once with the step it ended at, at most one after the step reported last when
    the stop came; a session with nothing running is told so."""
    from gradio_client.utils import Status

    client = Client(server, verbose=False)
    assert client.predict(api_name="/stop") == "Nothing of yours is running."
    text = ("A long run to stop, with enough words in it to keep the engine busy. " * 15)[:990]
    job = client.submit(text=text, num_step=64, seed=1, api_name="/auto", **ONE_PIECE)
    deadline = time.monotonic() + REQUEST_S
    while time.monotonic() < deadline and not job.done():
        st = job.status()
        if st.code == Status.PROGRESS and st.progress_data and st.progress_data[0].index:
            break
        time.sleep(0.01)
    said = client.predict(api_name="/stop")
    ended, total, asked = _stop_report(said)
    assert total == 64 and ended <= asked + 1 and ended < total, said
    audio, wave, grid, timings, _ = job.result(timeout=REQUEST_S)
    assert _stop_report(timings) == (ended, total, asked)
    assert isinstance(audio, dict)  # gr.skip(): no audio, the player is left as it was


@pytest.mark.subprocess
@pytest.mark.browser
def test_browser_stop_ends_a_long_run_within_one_step(server, browser, artefacts):
    """Stop, pressed while a long text is being made ("Piece 1 of n" on the progress bar when
    streamed), ends the run at the next unmasking step, and the page says where."""
    page = Page(browser, server, artefacts)
    page.open()
    text = ("A long run to stop, with enough words in it to keep the engine busy. " * 15)[:990]
    page.type("#auto-text textarea", text)
    page.css("#auto-go").click()
    streamed = shutil.which("ffmpeg") is not None  # the page streams by default then
    mark = r"Piece 1 of (\d+)" if streamed else r"Unmasking"
    page.wait().until(lambda d: re.search(mark, page.page_text()))
    if streamed:
        assert int(re.search(mark, page.page_text()).group(1)) > 1
    page.css("#auto-stop").click()
    page.wait().until(lambda d: "Stopped" in page.css("#timings").text)
    ended, total, asked = _stop_report(page.css("#timings").text)
    # Stop took effect at the next step. The counts are the piece's when streamed: a Stop
    # after a piece's second-last step ends the run at its last, one after its last step (a
    # slow moment: Stop came as piece 1 ended) ends it there, and no later piece is made.
    assert asked <= total and ended <= min(asked + 1, total)
    page.screenshot("7-stopped")


@pytest.mark.subprocess
@pytest.mark.browser
def test_browser_error_lines_name_no_path_or_command(server, browser, artefacts, ref_wav,
                                                   demo_server):
    """A file that is no voice file is one line on its field, in the page's words, with no
    server path and no command; a 0.2 s clip and a transcript too long for a clip are warned
    about in the page's words, and the voice is still made."""
    page = Page(browser, server, artefacts)
    page.open()
    page.tab("Voice clone")
    junk = artefacts / "not-a-voice.npz"
    junk.write_bytes(b"not a voice prompt")
    page.css("#voice-file input[type=file]").send_keys(str(junk))
    page.wait(30).until(lambda d: "not-a-voice" in page.css("#voice-file").text)
    page.css("#clone-go").click()
    line = "This voice file cannot be read: use a .npz file saved by this page."
    page.wait(30).until(lambda d: line in page.css("#voice-file").text)
    body = page.page_text()
    assert page.times_shown(line) == 1, body
    assert "/tmp" not in body and str(artefacts) not in body and "clone-prompt" not in body
    _visitor_worded(line)
    page.screenshot("8-error-line")

    # a short clip with a long transcript: two warnings, then the voice
    page.open()
    page.tab("Voice clone")
    sr = 16000
    t = np.arange(int(0.2 * sr)) / sr
    short = artefacts / "short-clip.wav"
    sf.write(short, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), sr)
    page.css("#ref-audio input[type=file]").send_keys(str(short))
    page.wait(30).until(lambda d: d.find_elements(page.By.CSS_SELECTOR, "#ref-audio audio, "
                                                  "#ref-audio [data-testid*=waveform]"))
    page.type("#ref-text textarea", " ".join(["The quick brown fox jumps over the lazy dog."]
                                             * 3))
    page.type("#clone-text textarea", "Hello.")
    page.css("#clone-go").click()

    def toasts() -> str:  # gradio groups toasts of a kind: one element may hold both
        return " ".join(t.text for t in browser.find_elements(page.By.CSS_SELECTOR,
                                                               "[data-testid='toast-body']"))
    page.wait(60).until(lambda d: "The transcript looks too long" in toasts())
    said = toasts()
    assert "The clip is 0.2 s long" in said and "3-10 s" in said, said
    assert "The transcript looks too long" in said, said
    assert "busy" not in said, demo_server.log.read_text()[-3000:]
    page.screenshot("9-clip-warnings")
