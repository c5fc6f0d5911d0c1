"""omnicore demo: OmniVoice text-to-speech in the browser, on numpy + Numba, without torch.

    python demo/app.py                              # k2-fsa/OmniVoice from the hub (or its cache)
    python demo/app.py --model weights/tiny-random  # offline smoke checkpoint (its audio is noise)
    OMNICORE_MODEL=/path/to/OmniVoice python demo/app.py

A thin shell over the public API (`omnicore.OmniVoice.synthesize` and friends): every number on
the page comes from a `Synthesis` result. It opens on the auto voice with a text filled in, so
one click on Generate speaks; voice design and voice clone are the other tabs, the settings are
folded away. Each tab is also an API endpoint (`/auto`, `/design`, `/clone`, plus `/stop`,
`/make_voice_prompt`, `/keep_voice` and `/check_instruct`) for `gradio_client`. "Keep this
voice" saves the session's last result as a voice file for the clone tab. Pause marks are text.

Visitors' words (visitor.py): a problem is one line in the page's terms on the field it is about
(gradio's validators, before the run), or one toast for what only the run finds; never a
parameter name, a command or a server path (the library's message goes to the server log).
A voice description is read strictly when it is made of the pickers' items, else as prose by
the mapping the HTTP server uses, and the page says what it understood. Texts are capped at
`--max-chars` (1,000 by default, for a public page; the library's 20,000 at most).

The runs themselves are runs.py's: the page's values as the API's arguments, a run in one piece
or streamed, and Stop (stopping.py: the session's run ends at the engine's next unmasking step).
Streaming (on by default on a CPU): the endpoints call `OmniVoice.stream` and yield each piece to
the streaming player ("Piece k of n" on the progress bar), which then holds the result (one
player is shown: the normal one for a run in one piece or an example). The unmasking view needs
the fill steps of a run in one piece; the page says so.

Queueing: synthesis is CPU-bound and one model serves everyone, so the synthesis endpoints share
one concurrency group of `--concurrency` jobs (default 1); up to `--max-queue` more wait (default
16) and see their place; beyond that a request is refused with "queue full". Stop and the other
helpers run outside that group.

The wait, said before it starts (presets.py): at start-up the app times the model here and opens
with the quality preset whose first audio of a typical input fits the goal of 15 s, streaming on
(on a GPU: Best, in one piece). Above each Generate button the estimate updates as the inputs
change; the timings compare it with what the run took. The examples are made at start-up with
those defaults, before the server listens, so they play at once. `--no-warmup` (and the page
`omnicore serve --ui` mounts) skips the measurement: the reference's defaults, no estimate.
With an NVIDIA GPU and CuPy installed the app runs on the CuPy backend.
"""

from __future__ import annotations

import argparse
import atexit
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import gradio as gr



def use_gpu_when_present() -> None:
    """Run on the CuPy backend when an NVIDIA GPU is there and CuPy is installed (a GPU Space's
    requirements), unless OMNICORE_BACKEND says otherwise. The backend is read once, when the
    model loads (omnicore.machinery.settings.configure), so this runs before that."""
    if os.environ.get("OMNICORE_BACKEND"):
        return
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            os.environ["OMNICORE_BACKEND"] = "cupy"
    except Exception:  # noqa: BLE001 - no CuPy, no driver or no device: numpy on the CPU
        pass


if __name__ == "__main__":
    use_gpu_when_present()

try:
    import omnicore  # noqa: F401
except ImportError:  # a source checkout without `pip install -e .`: use the package beside demo/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omnicore import OmniVoice, VoiceClonePrompt  # noqa: E402
from omnicore.machinery.checkpoint import HUB_REPO  # noqa: E402
from omnicore.errors import OmniCoreError  # noqa: E402
from omnicore.model import backend  # noqa: E402
from omnicore.text import limits  # noqa: E402
from omnicore.model.config import FRAME_RATE  # noqa: E402
from omnicore.machinery.warmup import warm_up  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import presets  # noqa: E402
import visitor  # noqa: E402
from wording import (CSS, HEAD, HOW_IT_WORKS, INTRO, PAUSE_HELP, SCROLL_TO_OUTPUT,  # noqa: E402
                     UNMASKING_CAPTION)
from runs import (AUTO_LANGUAGE, GEN, STREAM_RULE, Runs, api_kwargs,  # noqa: E402
                  checked_api_kwargs, fail)

DEFAULT_MODEL = HUB_REPO
DEFAULT_CONCURRENCY = 1
DEFAULT_MAX_QUEUE = 16
# The public page's cap on the text (one visitor's request holds the queue's one slot for as
# long as it runs); --max-chars raises it up to the library's limit for a private server.
DEFAULT_MAX_CHARS = 1_000
SYNTHESIS_GROUP = "synthesis"  # one concurrency group for every endpoint that runs the model
DEMO_DIR = Path(__file__).resolve().parent
# The clone tab's example voice: a synthetic espeak-ng clip shipped with the demo (the test
# suite's reference clip), with its transcript.
VOICE_CLIP = DEMO_DIR / "examples" / "fox.flac"
VOICE_CLIP_TEXT = "The quick brown fox jumps over the lazy dog."
# Examples per tab, made once at start-up with the page's defaults (seed EXAMPLE_SEED).
EXAMPLE_SEED = 0
AUTO_EXAMPLES = [
    ["Hello! This is OmniVoice running on numpy. It speaks more than six hundred languages."],
    ["The kettle clicked off just as the rain started drumming on the kitchen window."],
]
DESIGN_EXAMPLES = [
    ["Good evening. Here is tonight's forecast.", "female, low pitch, british accent"],
    ["今天早上天气很好，我们一起去公园散步吧。", "male, young adult"],
]
CLONE_EXAMPLES = [
    ["Please leave the parcel with the neighbour at number twelve.", str(VOICE_CLIP),
     VOICE_CLIP_TEXT],
]

# ------------------------------------------------------------------------------------------------
# What the page opens with on this machine
# ------------------------------------------------------------------------------------------------


def normalization_installed() -> bool:
    """Whether "Read numbers as words" can work here: the tn extra imports (WeTextProcessing
    needs pynini, which has no wheel for every Python on PyPI: a Space may lack it)."""
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("tn", "pynini", "num2words"))


def measure_defaults(model) -> presets.PageDefaults:
    """Time the model here (presets.measure) and pick the defaults: on a GPU the reference's
    32 steps in one piece; on a CPU streaming (when ffmpeg can carry it) with the preset that
    meets the first-audio goal for a typical input."""
    rate = presets.measure(model, clip=(VOICE_CLIP, VOICE_CLIP_TEXT))
    if backend.name() == "cupy":
        return presets.PageDefaults("Best", False, rate)
    return presets.PageDefaults(presets.default_preset(model, rate, STREAM_RULE),
                                shutil.which("ffmpeg") is not None, rate)


# ------------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------------


def picker_width(labels) -> int:
    """A dropdown's least width in pixels that shows its longest label whole beside the arrow:
    about 8 px per Latin character and 16 px per CJK one at the page's font size, plus the
    box's padding and the arrow (tests/test_demo.py measures it in Chromium at both sizes)."""
    def text_px(label: str) -> int:
        return sum(16 if ord(ch) >= 0x2E80 else 8 for ch in label)

    return max(map(text_px, labels), default=0) + 88


def one_player(streamed) -> tuple:
    """Which player is shown, (normal, streaming): the one the next run plays in."""
    return gr.update(visible=not streamed), gr.update(visible=bool(streamed))


def _warn(notes) -> None:
    for note in notes:
        gr.Warning(note, title="Check the clip")


def _warn_pace(prompt) -> None:
    """A note when a voice's transcript cannot be what its clip says (it would speak badly)."""
    seconds = prompt.ref_audio_tokens.shape[-1] / float(FRAME_RATE)
    _warn([n for n in visitor.clip_notes(seconds, prompt.ref_text) if "transcript" in n])


def build_demo(model, model_name: str = DEFAULT_MODEL, concurrency: int = DEFAULT_CONCURRENCY,
               max_queue: int = DEFAULT_MAX_QUEUE, defaults: presets.PageDefaults | None = None,
               max_chars: int = DEFAULT_MAX_CHARS) -> gr.Blocks:
    """The Blocks app for one loaded model (queue configured; call .launch(**launch_options())).
    `defaults` from `measure_defaults`; without them the page opens with the reference's
    settings and shows no estimate. `max_chars`: the page's cap on the text (the library's
    limit at most)."""
    text_cap = max(1, min(int(max_chars), limits.MAX_TEXT_CHARS))
    can_normalize = normalization_installed()
    workdir = Path(tempfile.mkdtemp(prefix="omnicore-demo-"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    defaults = defaults or presets.PageDefaults()
    measured = defaults.rate is not None
    tracker = presets.Tracker(defaults.rate) if measured else None
    if measured and not os.environ.get("GRADIO_EXAMPLES_CACHE"):
        # gradio reuses a cache folder it finds (keyed by component ids, not by the model):
        # this process's examples go to its own folder
        os.environ["GRADIO_EXAMPLES_CACHE"] = str(workdir / "examples")

    runs = Runs(model, tracker, text_cap, can_normalize)

    # --- validators: a problem found before the run is shown on its field, once ---

    ok = gr.validate(True, "")

    def _check(problem):
        return gr.validate(problem is None, problem or "")

    def validate_clone(text, ref_audio, ref_text, voice_prompt_file, *rest):
        clip = transcript = voice = None
        if voice_prompt_file:
            voice = visitor.voice_file_problem(voice_prompt_file)
        elif not ref_audio:
            clip = "Add a voice clip (3-10 s of speech) or a voice file."
        else:
            if visitor.clip_seconds(ref_audio) is None:
                clip = "This clip cannot be read: try a WAV, MP3 or FLAC recording."
            if not (ref_text or "").strip():
                transcript = "Type what the clip says."
        checks = [runs.text_problem(text), clip, transcript, voice]
        return [_check(problem) for problem in checks] + [ok] * len(rest)

    def validate_design(text, instruct, *rest):
        return [_check(runs.text_problem(text)),
                _check(visitor.read_instruct(instruct, text)[2])] + [ok] * len(rest)

    def validate_auto(text, *rest):
        return [_check(runs.text_problem(text))] + [ok] * len(rest)

    # --- endpoints: parameter names are what gradio_client users see ---

    def clone(text, ref_audio, ref_text, voice_prompt_file, preprocess_prompt, language,
              num_step, guidance_scale, speed, duration, seed, denoise, postprocess_output,
              t_shift, layer_penalty_factor, position_temperature, class_temperature,
              stream=False, normalize_text=False, profile="exact", request: gr.Request = None,
              progress=gr.Progress()):
        kwargs = checked_api_kwargs(language, num_step, guidance_scale, speed, duration, seed,
                                   denoise, postprocess_output, t_shift, layer_penalty_factor,
                                   position_temperature, class_temperature, profile)
        if voice_prompt_file:
            if ref_audio:
                gr.Info("Using the voice file; the voice clip is not used.")
            try:
                kwargs["voice_clone_prompt"] = VoiceClonePrompt.load(voice_prompt_file)
            except Exception as exc:  # noqa: BLE001
                raise fail(exc) from None
            _warn_pace(kwargs["voice_clone_prompt"])
        elif ref_audio:
            if not (ref_text or "").strip():
                raise gr.Error("Type what the clip says.", title="Check the transcript",
                               print_exception=False)
            _warn(visitor.clip_notes(visitor.clip_seconds(ref_audio), ref_text,
                                     visitor.spoken_seconds(model, ref_audio, preprocess_prompt)))
            progress(0.0, desc="Encoding the voice clip")
            kwargs.update(ref_audio=ref_audio, ref_text=ref_text,
                          preprocess_prompt=bool(preprocess_prompt))
        else:
            raise gr.Error("Add a voice clip (3-10 s of speech) or a voice file.",
                           title="Check the clip", print_exception=False)
        yield from runs.dispatch(stream, progress, request, text,
                            normalize_text=runs.normalize_flag(normalize_text), **kwargs)

    def design(text, instruct, language, num_step, guidance_scale, speed, duration, seed,
               denoise, postprocess_output, t_shift, layer_penalty_factor,
               position_temperature, class_temperature, stream=False, normalize_text=False,
               profile="exact", request: gr.Request = None, progress=gr.Progress()):
        kwargs = checked_api_kwargs(language, num_step, guidance_scale, speed, duration, seed,
                                   denoise, postprocess_output, t_shift, layer_penalty_factor,
                                   position_temperature, class_temperature, profile)
        read, _, problem = visitor.read_instruct(instruct, text)
        if problem:
            raise gr.Error(problem, title="Check the description", print_exception=False)
        yield from runs.dispatch(stream, progress, request, text, instruct=read,
                            normalize_text=runs.normalize_flag(normalize_text), **kwargs)

    def auto(text, language, num_step, guidance_scale, speed, duration, seed, denoise,
             postprocess_output, t_shift, layer_penalty_factor, position_temperature,
             class_temperature, stream=False, normalize_text=False, profile="exact",
             request: gr.Request = None, progress=gr.Progress()):
        kwargs = checked_api_kwargs(language, num_step, guidance_scale, speed, duration, seed,
                                   denoise, postprocess_output, t_shift, layer_penalty_factor,
                                   position_temperature, class_temperature, profile)
        yield from runs.dispatch(stream, progress, request, text,
                            normalize_text=runs.normalize_flag(normalize_text), **kwargs)

    def save_prompt(prompt, stem: str) -> str:
        """A voice prompt as a new .npz in this demo's folder (offered for download)."""
        path = workdir / f"{stem}-{secrets.token_hex(4)}.npz"
        try:
            prompt.save(path)
        except Exception as exc:  # noqa: BLE001
            raise fail(exc) from None
        return str(path)

    def make_voice_prompt(ref_audio, ref_text, preprocess_prompt):
        if not ref_audio:
            raise gr.Error("Upload or record a reference clip first.", title="No reference clip",
                           print_exception=False)
        try:
            prompt = model.create_voice_clone_prompt(ref_audio, ref_text=ref_text or None,
                                                     preprocess_prompt=bool(preprocess_prompt))
        except Exception as exc:  # noqa: BLE001
            raise fail(exc) from None
        path = save_prompt(prompt, "voice")
        gr.Info(f"Voice prompt saved ({prompt.ref_audio_tokens.shape[1]} frames): download it "
                "to reuse this voice without re-encoding the clip.")
        _warn_pace(prompt)
        return path

    def keep_voice(kept=None):
        """The last result of this session as a voice prompt file (into the clone tab's
        voice-file slot: used there, and offered for download)."""
        if kept is None:
            raise gr.Error("Generate speech first (voice design or auto voice), then keep its "
                           "voice.", title="Nothing to keep", print_exception=False)
        if isinstance(kept, str):
            raise gr.Error(kept, title="Cannot keep this voice", print_exception=False)
        path = save_prompt(kept, "kept-voice")
        gr.Info(f"Voice kept ({kept.ref_audio_tokens.shape[1]} frames of \"{kept.ref_text[:40]}\"):"
                " the Voice clone tab now speaks with it; download the file there to reuse it.")
        return path

    def waits(clone_text, ref_audio, ref_text, voice_file, design_text, instruct, auto_text,
              *settings):
        """The estimate line of each tab (clone, design, auto) for the inputs as they are."""
        *values, stream, normalize_text, profile = settings
        try:
            kwargs = api_kwargs(*values, profile)
        except OmniCoreError:  # the run says what is wrong, on its field: not here again
            return ("",) * 3
        kwargs["normalize_text"] = bool(normalize_text)
        steps, rate, load = kwargs["num_step"], tracker.rate, presets.machine_load()

        def line(text, **voice):
            try:
                work = presets.planned_work(model, text, streamed=bool(stream), rule=STREAM_RULE,
                                            **voice, **kwargs)
            except OmniCoreError:
                return ""
            return presets.describe(rate, work, steps, load=load)

        if voice_file:
            try:
                clone = line(clone_text, voice_clone_prompt=VoiceClonePrompt.load(voice_file))
            except OmniCoreError:
                clone = ""
        elif ref_audio:
            clone = line(clone_text, ref_audio=ref_audio, ref_text=ref_text or None)
        else:
            clone = ""
        described = visitor.read_instruct(instruct, design_text)[0]
        return clone, line(design_text, instruct=described), line(auto_text)

    def example_outputs(text, **voice):
        """An example as the page makes it with its defaults, in one piece (so that the
        unmasking view is there too)."""
        kwargs = dict(num_step=presets.PRESETS[defaults.preset], seed=EXAMPLE_SEED)
        outputs, _ = runs.run(None, text=text, **voice, **kwargs)
        *shown, timings_md = outputs
        return (*shown, f"Example made at start-up with the {defaults.preset} preset "
                        f"({kwargs['num_step']} steps, seed {EXAMPLE_SEED}).\n\n" + timings_md)

    def example_auto(text):
        return example_outputs(text)

    def example_design(text, instruct):
        return example_outputs(text, instruct=instruct or None)

    def example_clone(text, ref_audio, ref_text):
        return example_outputs(text, ref_audio=ref_audio, ref_text=ref_text)

    is_random = "random" in str(model_name).lower()
    text_label = f"Text to speak (up to {text_cap:,} characters)"

    def text_box(elem_id: str, value: str) -> gr.Textbox:
        return gr.Textbox(value=value, label=text_label, lines=3, elem_id=elem_id,
                          max_length=text_cap)

    def go_and_stop(kind: str) -> tuple[gr.Button, gr.Button]:
        with gr.Row():
            go = gr.Button("Generate", variant="primary", elem_id=f"{kind}-go", scale=3)
            halt = gr.Button("Stop", variant="stop", elem_id=f"{kind}-stop", scale=1,
                             min_width=80)
        return go, halt

    with gr.Blocks(title="omnicore · OmniVoice TTS", analytics_enabled=False,
                   delete_cache=(3600, 7200)) as demo:
        gr.Markdown(INTRO, elem_id="intro")
        if is_random:
            gr.Markdown("⚠️ **Random smoke-test weights: the audio is noise**; the pictures still "
                        "show how decoding works.", elem_classes=["omni-note"])
        with gr.Accordion("How it works", open=False, elem_id="how-it-works"):
            gr.Markdown(HOW_IT_WORKS)
            gr.Markdown(PAUSE_HELP)
            gr.Markdown(f"Model: `{model_name}` · {model.sampling_rate} Hz")
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                with gr.Tabs(selected="auto"):
                    with gr.Tab("Auto voice", id="auto") as auto_tab:
                        auto_text = text_box("auto-text", "Hello! Nobody told me what to sound "
                                             "like, so I picked a voice myself.")
                        auto_wait = gr.Markdown(elem_id="auto-estimate")
                        auto_btn, auto_stop = go_and_stop("auto")
                    with gr.Tab("Voice design", id="design") as design_tab:
                        design_text = text_box("design-text",
                                               "Good evening. Here is tonight's forecast.")
                        instruct = gr.Textbox("", label="Voice (pick below, or describe it in "
                                              "a few words)", elem_id="instruct",
                                              placeholder="e.g. female, british accent; or: "
                                                          "a calm old man with a deep voice")
                        instruct_line = gr.Markdown("", elem_id="instruct-status")
                        pickers = []
                        items = visitor.picker_items()
                        notes = {"accent": "English speech only", "dialect": "Chinese speech only"}
                        with gr.Row():  # a picker too narrow for its values wraps
                            for cat, choices in items.items():
                                pickers.append(gr.Dropdown(
                                    choices, value="", label=cat.capitalize(),
                                    info=notes.get(cat), elem_id=f"pick-{cat}",
                                    elem_classes=["omni-picker"],
                                    min_width=picker_width(label for label, _ in choices)))
                        design_wait = gr.Markdown(elem_id="design-estimate")
                        design_btn, design_stop = go_and_stop("design")
                    with gr.Tab("Voice clone", id="clone") as clone_tab:
                        clone_text = text_box("clone-text",
                                              "This is my voice, cloned from a short clip.")
                        with gr.Row():
                            # Short labels: gradio draws them over the upload area.
                            ref_audio = gr.Audio(label="Voice clip",
                                                 sources=["upload", "microphone"],
                                                 type="filepath", elem_id="ref-audio")
                            with gr.Column():
                                ref_text = gr.Textbox("", label="What the clip says",
                                                      lines=3, elem_id="ref-text",
                                                      max_length=limits.MAX_REF_TEXT_CHARS)
                                preprocess = gr.Checkbox(GEN.preprocess_prompt,
                                                         label="Clean up the clip (trim "
                                                               "silences, even out loudness)")
                        gr.Markdown("The clip: 3-10 s of clean speech. A voice file (.npz, saved "
                                    "here, or a .pt saved by omnivoice) is used instead when set.",
                                    elem_classes=["omni-note"])
                        with gr.Row():
                            voice_file = gr.File(label="Voice file",
                                                 file_types=[".npz", ".pt"], elem_id="voice-file")
                            save_voice = gr.Button("Save the clip as a voice file",
                                                   elem_id="save-voice")
                        clone_wait = gr.Markdown(elem_id="clone-estimate")
                        clone_btn, clone_stop = go_and_stop("clone")

                with gr.Accordion("Settings", open=False, elem_id="settings"):
                    languages = visitor.language_choices()
                    language = gr.Dropdown([("Auto (from the text)", AUTO_LANGUAGE)] + languages,
                                           value=AUTO_LANGUAGE,
                                           label=f"Language ({len(languages)}; type a name, "
                                                 "native name or code)",
                                           filterable=True, elem_id="language",
                                           elem_classes=["omni-picker"])
                    steps_of = ", ".join(f"{name} {n}" for name, n in presets.PRESETS.items())
                    preset = gr.Radio(list(presets.PRESETS) + [presets.APPROXIMATE],
                                      value=defaults.preset, label="Quality", elem_id="preset",
                                      info=f"Unmasking steps: {steps_of} (the reference's "
                                           "default). Fewer steps: sooner, a little rougher. "
                                           f"{presets.APPROXIMATE}: 16 steps of the fast "
                                           "profile.")
                    profile = gr.Radio([("Exact", "exact"), (presets.APPROXIMATE, "fast")],
                                       value="exact", label="Profile", elem_id="profile",
                                       info="The fast profile reuses the prompt's keys and "
                                            "values and the unconditional pass between refresh "
                                            "steps: faster, and an approximation.")
                    with gr.Row():
                        num_step = gr.Slider(1, 64, value=presets.PRESETS[defaults.preset],
                                             step=1, label="Unmasking steps", elem_id="steps")
                        guidance = gr.Slider(0.0, 5.0, value=GEN.guidance_scale, step=0.1,
                                             label="Guidance (classifier-free)")
                    with gr.Row():
                        speed = gr.Slider(0.5, 2.0, value=1.0, step=0.05, elem_id="speed",
                                          label="Speed (speaking rate)")
                        # The API's limits: the whole output, and one unmasking pass (a
                        # sentence is never cut, so a short text is one pass).
                        duration = gr.Number(0, label="Fixed duration in seconds (0 = from the "
                                             "text; overrides Speed)", minimum=0,
                                             maximum=limits.MAX_DURATION_S,
                                             info=f"At most {limits.MAX_PASS_S:g} s per "
                                                  "sentence; longer text is cut at sentence "
                                                  "marks.")
                    with gr.Row():
                        seed = gr.Number(-1, precision=0, label="Seed (-1 = random)",
                                         elem_id="seed")
                        denoise = gr.Checkbox(GEN.denoise, label="Denoise (voice clone)")
                        postprocess = gr.Checkbox(GEN.postprocess_output,
                                                  label="Post-process (trim, fades)")
                    streamed = gr.Checkbox(defaults.streamed, label="Stream",
                                           elem_id="stream",
                                           info="Play the audio while the rest is made (the "
                                                "text is cut into pieces); the unmasking view "
                                                "needs a run in one piece.")
                    normalized = gr.Checkbox(False, label="Read numbers as words",
                                             elem_id="normalize-text", visible=can_normalize,
                                             info="'$45.50 on 5 Jan 2024' -> 'forty five point "
                                                  "five dollars on ...'")
                    with gr.Accordion("Unmasking knobs", open=False):
                        with gr.Row():
                            t_shift = gr.Slider(0.01, 1.0, value=GEN.t_shift, step=0.01,
                                                label="Schedule shift (small = slow start)")
                            layer_penalty = gr.Slider(0.0, 20.0, step=0.5,
                                                      value=GEN.layer_penalty_factor,
                                                      label="Layer penalty")
                        with gr.Row():
                            pos_temp = gr.Slider(0.0, 20.0, step=0.5,
                                                 value=GEN.position_temperature,
                                                 label="Position temperature (0 = pure "
                                                       "confidence order)")
                            class_temp = gr.Slider(0.0, 2.0, value=GEN.class_temperature, step=0.05,
                                                   label="Class temperature (0 = argmax tokens)")

            with gr.Column(scale=6):
                # One player holds the result: the streaming one for a streamed run (it keeps
                # the whole stream, to play again or download), the other one otherwise. The
                # hidden one still gets its value (API callers read the WAV from it).
                with gr.Column(elem_id="result"):
                    audio_out = gr.Audio(label="Generated speech", type="numpy", format="wav",
                                         interactive=False, buttons=["download"],
                                         elem_id="audio-out", visible=not defaults.streamed,
                                         # the browser's own player: the waveform is drawn below
                                         waveform_options=gr.WaveformOptions(
                                             show_recording_waveform=False))
                    stream_out = gr.Audio(label="Streaming playback", streaming=True,
                                          autoplay=True, interactive=False, buttons=["download"],
                                          elem_id="stream-out", visible=defaults.streamed)
                wave_img = gr.Image(label="Waveform and spectrogram", type="numpy", format="png",
                                    interactive=False, show_label=False, elem_id="waveform-view",
                                    buttons=["download", "fullscreen"])
                keep_btn = gr.Button("Keep this voice", elem_id="keep-voice", size="sm")
                timings = gr.Markdown("Timings per stage appear here after a run.",
                                      label="Timings", elem_id="timings")

        gr.Markdown("## Unmasking view")
        gr.Markdown("Drawn for a run made in one piece: untick *Stream* in the settings and "
                    "generate again to see it.", elem_id="unmasking-note",
                    elem_classes=["omni-note"])
        unmask_img = gr.Image(label="Unmasking view", type="numpy",
                              format="png", interactive=False, show_label=False,
                              elem_id="unmasking-view",
                              buttons=["download", "fullscreen"])
        gr.Markdown(UNMASKING_CAPTION)
        gr.Markdown(f"Requests are queued: {concurrency} synthesis at a time, up to {max_queue} "
                    "waiting; your place in the queue shows on the output while you wait. "
                    f"Texts up to {text_cap:,} characters here. "
                    "Model weights: OmniVoice (CC-BY-NC 4.0) and the Higgs Audio V2 codec "
                    "(Boson community licence), downloaded from the Hugging Face Hub.",
                    elem_classes=["omni-footer"])

        settings = [language, num_step, guidance, speed, duration, seed, denoise, postprocess,
                    t_shift, layer_penalty, pos_temp, class_temp, streamed, normalized, profile]
        last_voice = gr.State(None)  # per session: the last result's voice, or why none
        outputs = [audio_out, wave_img, unmask_img, timings, stream_out, last_voice]
        synth = dict(concurrency_limit=concurrency, concurrency_id=SYNTHESIS_GROUP)
        clone_btn.click(clone, [clone_text, ref_audio, ref_text, voice_file, preprocess, *settings],
                        outputs, api_name="clone", validator=validate_clone, **synth)
        design_btn.click(design, [design_text, instruct, *settings], outputs, api_name="design",
                         validator=validate_design, **synth)
        auto_btn.click(auto, [auto_text, *settings], outputs, api_name="auto",
                       validator=validate_auto, **synth)
        save_voice.click(make_voice_prompt, [ref_audio, ref_text, preprocess], voice_file,
                         api_name="make_voice_prompt", **synth)

        # Cheap UI helpers run outside the synthesis group, so they stay instant under load.
        quick = dict(concurrency_limit=None, show_progress="hidden")
        private = dict(api_visibility="private", **quick)
        # Stop: outside the queue, so it never waits behind the run it stops, nor is refused
        # when the queue is full.
        for i, halt in enumerate((auto_stop, design_stop, clone_stop)):
            halt.click(runs.stop, None, timings, queue=False,
                       **(dict(api_name="stop", **quick) if i == 0 else private))
        players = [audio_out, stream_out]
        for go in (auto_btn, design_btn, clone_btn):  # on a phone the output is below
            go.click(None, js=SCROLL_TO_OUTPUT, **private)
            go.click(one_player, streamed, players, queue=False, **private)
        keep_btn.click(keep_voice, [last_voice], voice_file, api_name="keep_voice", **quick)
        for picker in pickers:
            picker.change(visitor.compose_instruct, pickers, instruct, **private)
        # The description's line says what was understood; a problem shows on the field itself
        # (the validator), live and again on Generate, in one place. API callers ask
        # /check_instruct for either. Gradio wipes a field's message when any answer to an
        # event that reads the field arrives, so each such event is chained to the live check:
        # the last answer is always a check's (else a slow estimate erases what it just said).
        gr.api(visitor.check_instruct, api_name="check_instruct")
        live_check = dict(fn=lambda i, t: None, inputs=[instruct, design_text], outputs=None,
                          validator=lambda i, t: [_check(visitor.read_instruct(i, t)[2]), ok],
                          **private)
        described = [instruct.change, design_text.change]
        gr.on(described, visitor.instruct_status, [instruct, design_text], instruct_line,
              **private).then(**live_check)

        streamed.change(one_player, streamed, players, **private)
        # Quality presets set the steps and the profile; settings no preset has clear the preset.
        preset.input(presets.preset_settings, preset, [num_step, profile], **private)
        for knob in (num_step, profile):
            knob.input(presets.preset_of, [num_step, profile], preset, **private)

        # The wait, estimated as the inputs change (tokenising the text: cheap). Outside the
        # queue: a keystroke each, they would fill it while a clip is read for every one.
        if measured:
            tab_inputs = [clone_text, ref_audio, ref_text, voice_file, design_text, instruct,
                          auto_text]
            gr.on([c.change for c in tab_inputs + settings] + [demo.load], waits,
                  tab_inputs + settings, [clone_wait, design_wait, auto_wait],
                  trigger_mode="always_last", queue=False, **private).then(**live_check)

        # Examples: made once at start-up with the page's defaults, then played from the cache.
        shown = [audio_out, wave_img, unmask_img, timings]
        cache = dict(cache_examples=measured, cache_mode="eager")
        with auto_tab:
            examples = [gr.Examples(AUTO_EXAMPLES, [auto_text], shown, example_auto,
                                    label="Examples", elem_id="auto-examples", **cache)]
        with design_tab:
            examples.append(gr.Examples(DESIGN_EXAMPLES, [design_text, instruct], shown,
                                        example_design, label="Examples",
                                        elem_id="design-examples", **cache))
        with clone_tab:
            examples.append(gr.Examples(CLONE_EXAMPLES, [clone_text, ref_audio, ref_text], shown,
                                        example_clone, elem_id="clone-examples", **cache,
                                        label="Example (a synthetic espeak-ng voice)"))
        for example in examples:  # an example plays in the normal player
            example.dataset.click(lambda: one_player(False), None, players, queue=False,
                                  **private)

    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue)
    return demo


def launch_options() -> dict:
    """Theme and CSS (gradio 6 takes them in launch)."""
    theme = gr.themes.Soft(primary_hue="violet", secondary_hue="teal",
                           font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "monospace"])
    return dict(theme=theme, css=CSS, head=HEAD)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Gradio demo of omnicore (OmniVoice TTS without torch).")
    p.add_argument("--model", default=os.environ.get("OMNICORE_MODEL", DEFAULT_MODEL),
                   help="hub id or local checkpoint dir (default: $OMNICORE_MODEL or "
                        f"{DEFAULT_MODEL}); weights/tiny-random runs offline (noise)")
    p.add_argument("--host", default=None,
                   help="address to listen on (default: gradio's, 127.0.0.1; Spaces set 0.0.0.0)")
    p.add_argument("--port", type=int, default=None, help="port (default: gradio's, 7860)")
    p.add_argument("--concurrency", type=int,
                   default=int(os.environ.get("OMNICORE_DEMO_CONCURRENCY", DEFAULT_CONCURRENCY)),
                   help="syntheses that may run at once (default 1)")
    p.add_argument("--max-queue", type=int,
                   default=int(os.environ.get("OMNICORE_DEMO_MAX_QUEUE", DEFAULT_MAX_QUEUE)),
                   help="requests that may wait in the queue (default 16)")
    p.add_argument("--max-chars", type=int,
                   default=int(os.environ.get("OMNICORE_DEMO_MAX_CHARS", DEFAULT_MAX_CHARS)),
                   help=f"longest text the page takes (default {DEFAULT_MAX_CHARS:,}, for a "
                        f"public page; at most the library's {limits.MAX_TEXT_CHARS:,})")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip timing the model at start-up (it compiles the kernels, sets the "
                        "quality preset and the estimates, and makes the examples): the page "
                        "opens with the reference's settings")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"loading {args.model} ...", flush=True)
    try:
        model = OmniVoice.from_pretrained(args.model)
        defaults = None
        if not args.no_warmup:
            done = warm_up(model, on_path=lambda path, s: print(f"  {path}: {s:.1f} s", flush=True),
                           say=lambda line: print(line, flush=True))
            print(f"{done.compiled} kernels compiled in {done.compile_s:.1f} s" if done.seconds
                  else "kernels in the kernel cache", flush=True)
            print("timing the model on this machine ...", flush=True)
            defaults = measure_defaults(model)
            r = defaults.rate
            print(f"measured in {r.measured_s:.1f} s: {r.flops_per_s / 1e9:.1f} GFLOP/s + "
                  f"{r.forward_s * 1e3:.1f} ms per forward pass; opening with the "
                  f"{defaults.preset} preset ({presets.PRESETS[defaults.preset]} steps), "
                  f"{'streamed' if defaults.streamed else 'in one piece'}", flush=True)
    except OmniCoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    demo = build_demo(model, args.model, args.concurrency, args.max_queue, defaults,
                      args.max_chars)
    make_examples(demo)
    demo.launch(server_name=args.host, server_port=args.port, **launch_options())
    return 0


def make_examples(demo: gr.Blocks) -> None:
    """Make the examples now, before the server listens: gradio would make them once it
    serves, and a visitor who came then (right after a Space starts) would share the cores
    with them. A Space reports ready when its port answers, so it does once they are made;
    at launch gradio finds them in its cache."""
    import asyncio

    if demo.extra_startup_events:
        print("making the examples ...", flush=True)
        asyncio.run(demo.run_extra_startup_events())


if __name__ == "__main__":
    sys.exit(main())
