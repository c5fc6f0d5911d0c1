"""omnicore demo: OmniVoice text-to-speech in the browser, on numpy + Numba, without torch.

    python demo/app.py                              # k2-fsa/OmniVoice from the hub (or its cache)
    python demo/app.py --model weights/tiny-random  # offline smoke checkpoint (its audio is noise)
    OMNICORE_MODEL=/path/to/OmniVoice python demo/app.py

A thin shell over the public API (`omnicore.OmniVoice.synthesize` and friends): every number on
the page comes from a `Synthesis` result. Three tabs (voice clone, voice design, auto voice) share
one settings panel and one output panel; each tab is also an API endpoint (`/clone`, `/design`,
`/auto`, plus `/make_voice_prompt`, `/keep_voice` and `/check_instruct`) for `gradio_client`.
"Keep this voice" (`/keep_voice`) saves the session's last result as a voice prompt file
(`Synthesis.as_voice`) into the clone tab's voice-file slot. Pause marks are just text.

Streaming: with "Stream the audio as it is generated" ticked, the endpoints call
`OmniVoice.stream` instead and yield each audio piece to a separate streaming player as soon as
it exists; the final audio, waveform and timings are filled in from the same pieces at the end.
The unmasking view needs the per-cell fill steps of `synthesize`, which a stream does not give,
so it stays empty in that mode (the timings say so).

Queueing: synthesis is CPU-bound and one model instance serves everyone, so all synthesis
endpoints share one concurrency group of `--concurrency` jobs (default 1: running two at once
only splits the same cores); up to `--max-queue` further requests wait in line (default 16) and
see their place in the queue; beyond that new requests are refused with a "queue full" message.

The wait, said before it starts (presets.py): at start-up the app times the model on this machine
(`presets.measure`) and opens with the speed preset (Fast / Balanced / Best: the reference's
`num_step`, nothing else; the Approximate preset, the fast profile, is offered and labelled but
never chosen for a visitor) whose first audio of a typical input fits the goal of 15 s, streaming
on (on a GPU: Best, not streamed). Above each Generate button the estimate of the wait updates as
the text and settings change (and, when other work keeps the machine's cores busy, says so and
how long it may take instead); the timings compare it with what the run took. A few examples per
tab are made at start-up with those defaults (gradio's example cache), before the server listens
(`make_examples`: a Space reports ready only then), so they play at once and no visitor's first
request shares the cores with them.
With an NVIDIA GPU and CuPy installed the app runs on the CuPy backend. `--no-warmup` (and the
page `omnicore serve --ui` mounts) skips the measurement: the reference's defaults, no estimate,
examples that only fill the inputs.
"""

from __future__ import annotations

import argparse
import atexit
import os
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import gradio as gr
import numpy as np



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

from omnicore import GenerationConfig, OmniVoice, VoiceClonePrompt  # noqa: E402
from omnicore.audio.writers import to_pcm16  # noqa: E402
from omnicore.machinery.checkpoint import HUB_REPO  # noqa: E402
from omnicore.errors import InputError, OmniCoreError  # noqa: E402
from omnicore.model import backend  # noqa: E402
from omnicore.text import limits  # noqa: E402
from omnicore.text.frontend import instruct_vocabulary, language_choices, resolve_instruct  # noqa: E402
from omnicore.text.planner import ChunkRule  # noqa: E402
from omnicore.machinery.warmup import warm_up  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import presets  # noqa: E402
from visuals import render_unmasking, render_waveform  # noqa: E402

DEFAULT_MODEL = HUB_REPO
DEFAULT_CONCURRENCY = 1
DEFAULT_MAX_QUEUE = 16
AUTO_LANGUAGE = "auto"
NO_PICK = "(any)"
SYNTHESIS_GROUP = "synthesis"  # one concurrency group for every endpoint that runs the model
GEN = GenerationConfig()  # the panel's defaults are the API's
# How the page's streams cut text: the library's rule (benchmarks/README.md, "Space", has the
# measurements that chose it).
STREAM_RULE = ChunkRule()
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

_STAGE_NAMES = {
    "encode": "encode (reference clip to codes)",
    "prepare": "prepare (text, language, prompt)",
    "unmask": "unmask (iterative decoding)",
    "decode": "decode (codes to waveform)",
    "postprocess": "post-process (trim, loudness, fades)",
}

INTRO = """\
# omnicore · OmniVoice text-to-speech, no torch
OmniVoice writes speech as a grid of codec tokens: **8 codebooks × 25 frames per second**. It
starts from a fully masked grid and, step by step, fills in the cells it is most sure of, looking
at the whole utterance at once (a bidirectional transformer, not left-to-right). A codec then
turns the grid into a 24 kHz waveform. Pick a mode, press **Generate**, then look at the
**Unmasking view** below the output to see the order in which the grid was written.
Write `[pause:1.5s]` or `<break time="500ms"/>` in the text for exactly that much silence, and
press **Keep this voice** to speak on with a voice you designed (it goes to the clone tab).
"""

UNMASKING_CAPTION = f"""\
**How to read it.** Each cell is one code (row = codebook, column = 40 ms frame); its colour is
the step that filled it, **dark = early, yellow = late**.
* **Schedule**: every step may fill a budget of cells taken from a shifted time grid
  (`t_shift`, {GEN.t_shift:g} by default): very few cells at first, most of them in the last
  steps (left chart). Fewer steps mean bigger jumps.
* **Layer penalty**: a cell's confidence is lowered by `layer penalty × codebook index`, so the
  coarse codebook 0 settles first and the fine-detail codebooks 5-7 last (right chart). Set the
  penalty to 0 in *Unmasking knobs* and the rows mix.
* **Confidence ordering**: within a step's budget the model takes the cells whose predicted
  token has the highest (classifier-free-guided) log-probability; the *position temperature*
  adds random noise to that ranking so the order is spread over time. Set it to 0 to see the
  pure confidence order.
"""

PAUSE_HELP = ('Pauses: [pause:1.5s], [pause:500ms] or <break time="2s"/> give exactly that '
              "much silence (at most 60 s each).")

CSS = """
#unmasking-view img, #waveform-view img { image-rendering: pixelated; object-fit: contain; }
#instruct-status { min-height: 2.5em; }
.omni-footer, .omni-note { font-size: 0.85em; opacity: 0.8; }
"""


# ------------------------------------------------------------------------------------------------
# Helpers: turning UI values into API arguments and results into displays
# ------------------------------------------------------------------------------------------------


def _fail(exc: Exception) -> gr.Error:
    """A user-facing error toast for anything a synthesis call raised (never a traceback box)."""
    if isinstance(exc, OmniCoreError):
        title = {"InputError": "Check your input", "AudioError": "Unusable audio",
                 "VoicePromptError": "Unusable voice prompt file"}.get(type(exc).__name__,
                                                                       "Cannot synthesise")
        return gr.Error(str(exc), title=title, duration=30, print_exception=False)
    traceback.print_exc()  # unexpected: keep the details in the server log for a bug report
    return gr.Error(f"Unexpected {type(exc).__name__}: {exc}. This is a bug in omnicore; the "
                    "server log has the details.", title="Internal error", duration=30,
                    print_exception=False)


def _seed(seed) -> int:
    """-1 (or empty) = a random seed; other values go to the API, which checks them."""
    if seed is None or seed < 0:
        return secrets.randbelow(2**31)
    return seed


def _number(value, name: str, default=None, integer: bool = False):
    """A panel value as a float (or int); an API client may send anything, so anything else
    is an InputError naming the field rather than a crash."""
    if value is None or value == "":
        return default
    try:
        number = float(value)
        if integer:
            if number != int(number):
                raise ValueError
            return int(number)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be a {'whole ' if integer else ''}number, got "
                         f"{value!r}") from None
    return number


def _settings(language, num_step, guidance_scale, speed, duration, seed, denoise,
              postprocess_output, t_shift, layer_penalty_factor, position_temperature,
              class_temperature, profile="exact") -> dict:
    """Shared-panel values -> keyword arguments of OmniVoice.synthesize; the API applies the
    limits (omnicore.text) and says what is wrong."""
    duration = _number(duration, "duration", 0.0)
    speed = _number(speed, "speed", 1.0)
    return dict(
        language=None if language in (None, "", AUTO_LANGUAGE) else language,
        num_step=_number(num_step, "steps", GEN.num_step, integer=True),
        guidance_scale=_number(guidance_scale, "guidance scale", GEN.guidance_scale),
        duration=duration if duration > 0 else None,  # a fixed duration overrides speed
        speed=speed if duration <= 0 and speed != 1.0 else None,
        seed=_seed(_number(seed, "seed", None, integer=True)), denoise=bool(denoise),
        postprocess_output=bool(postprocess_output),
        t_shift=_number(t_shift, "t_shift", GEN.t_shift),
        layer_penalty_factor=_number(layer_penalty_factor, "layer penalty",
                                     GEN.layer_penalty_factor),
        position_temperature=_number(position_temperature, "position temperature",
                                     GEN.position_temperature),
        class_temperature=_number(class_temperature, "class temperature", GEN.class_temperature),
        profile=profile or "exact",  # "fast": approximate (the API refuses another name)
    )


def _checked_settings(*values) -> dict:
    try:
        return _settings(*values)
    except OmniCoreError as exc:
        raise _fail(exc) from None


def _timings_markdown(result, sample_rate: int, seed: int, wall_s: float,
                      estimated_s: float | None = None) -> str:
    audio_s = len(result.audio) / float(sample_rate)
    order = list(_STAGE_NAMES) + [k for k in result.timings if k not in _STAGE_NAMES]
    lines = ["| stage | seconds |", "|---|---:|"]
    for stage in order:
        if stage in result.timings:
            lines.append(f"| {_STAGE_NAMES.get(stage, stage)} | {result.timings[stage]:.3f} |")
    lines.append(f"| **total** (wall clock of the request) | **{wall_s:.3f}** |")
    rtf = wall_s / audio_s if audio_s > 0 else float("inf")
    C, T = result.codes.shape
    chunks = len(result.text_chunks)
    lines += ["", f"**{audio_s:.2f} s** of audio from {C} × {T} codes in {wall_s:.2f} s: "
              f"**RTF {rtf:.2f}** ({'faster' if rtf < 1 else 'slower'} than real time; "
              f"RTF = compute time / audio time) · {result.num_steps} steps"
              f"{f' per chunk × {chunks} text chunks' if chunks > 1 else ''} · seed **{seed}**"]
    if estimated_s is not None:
        lines += ["", f"Estimated before the run: {estimated_s:.2f} s; it took {wall_s:.2f} s."]
    return "\n".join(lines)


def _outputs(model, result, seed: int, wall_s: float, estimated_s: float | None = None):
    sr = model.sampling_rate
    return ((sr, to_pcm16(result.audio)), render_waveform(result.audio, sr, width=760),
            render_unmasking(result.fill_steps, result.num_steps),
            _timings_markdown(result, sr, seed, wall_s, estimated_s))


STREAMED_NOT_KEPT = ("A streamed result cannot be kept as a voice (a stream does not hand back "
                     "its codes): untick streaming, generate, then keep the voice.")


def _keepable(result):
    """What "Keep this voice" saves for a result: its voice prompt, or why there is none."""
    try:
        return result.as_voice()
    except OmniCoreError as exc:  # e.g. longer than a voice prompt may be
        return f"This result cannot be kept as a voice: {exc}"


def _stream_timings_markdown(stream, audio_s: float, seed: int, wall_s: float,
                             estimated: tuple[float, float] | None = None) -> str:
    """What a SpeechStream measured: time to first audio, then unmask / decode per text chunk."""
    lines = ["| chunk | text | frames | unmask s | decode s |", "|---:|---|---:|---:|---:|"]
    for k, st in enumerate(stream.chunk_stats):
        text = st["text"] if len(st["text"]) <= 40 else st["text"][:37] + "..."
        lines.append(f"| {k} | {text.replace('|', '/')} | {st.get('frames', '')} | "
                     f"{st.get('unmask_s', 0.0):.3f} | {st.get('decode_s', 0.0):.3f} |")
    rtf = wall_s / audio_s if audio_s > 0 else float("inf")
    first, n = stream.first_audio_s, len(stream.chunk_stats)
    lines += ["", f"**Streamed**: first audio after **{first:.2f} s**" if first is not None
              else "**Streamed**: no audio", "",
              f"**{audio_s:.2f} s** of audio in {wall_s:.2f} s: **RTF {rtf:.2f}** "
              f"· {n} text chunk{'s' if n != 1 else ''} · seed **{seed}**", ""]
    if estimated is not None:
        lines += [f"Estimated before the run: first audio after {estimated[0]:.2f} s, all of it "
                  f"after {estimated[1]:.2f} s.", ""]
    lines += [
              "The unmasking view is not available in streaming mode (a stream does not report "
              "the per-cell fill steps); untick streaming to see it."]
    return "\n".join(lines)


def _progress_hook(progress):
    def on_step(step: int, num_steps: int) -> None:
        progress((step, num_steps), desc="Unmasking", unit="steps")
    return on_step


def _voice_items():
    """Picker choices per category: [(label, value), ...] with a leading "(any)"."""
    return {cat: [(NO_PICK, "")] + [(item.label, item.value) for item in items]
            for cat, items in instruct_vocabulary().items()}


def compose_instruct(*picked: str) -> str:
    """Join the picked attribute values with commas; resolve_instruct unifies the language."""
    return ", ".join(p for p in picked if p)


def check_instruct(instruct: str, text: str = "") -> str:
    """Markdown telling whether an instruct is valid, and what the model will read."""
    if not instruct or not instruct.strip():
        return "No attributes picked: the model will choose a voice (like *Auto voice*)."
    try:
        resolved = resolve_instruct(instruct, text or None)
    except OmniCoreError as exc:
        return f"⚠ **Invalid instruct.** {exc}"
    return f"✓ Valid: the model will read the instruct `{resolved}`."


# ------------------------------------------------------------------------------------------------
# What the page opens with on this machine
# ------------------------------------------------------------------------------------------------


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


def _warn_pace(prompt) -> None:
    """A note when a voice's transcript cannot be what its clip says (it would speak badly)."""
    problem = prompt.pace_problem()
    if problem:
        gr.Warning(problem, title="Check the transcript")


def build_demo(model, model_name: str = DEFAULT_MODEL, concurrency: int = DEFAULT_CONCURRENCY,
               max_queue: int = DEFAULT_MAX_QUEUE, defaults: presets.PageDefaults | None = None
               ) -> gr.Blocks:
    """The Blocks app for one loaded model (queue configured; call .launch(**launch_options())).
    `defaults` from `measure_defaults`; without them the page opens with the reference's
    settings and shows no estimate."""
    workdir = Path(tempfile.mkdtemp(prefix="omnicore-demo-"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    defaults = defaults or presets.PageDefaults()
    measured = defaults.rate is not None
    tracker = presets.Tracker(defaults.rate) if measured else None
    if measured and not os.environ.get("GRADIO_EXAMPLES_CACHE"):
        # gradio reuses a cache folder it finds (keyed by component ids, not by the model):
        # this process's examples go to its own folder
        os.environ["GRADIO_EXAMPLES_CACHE"] = str(workdir / "examples")

    def planned(streamed: bool, text, kwargs):
        """(the request's planned work, its (first audio, all of it) estimate), or Nones (not
        measured, or bad input: the run itself says what is wrong)."""
        if tracker is None:
            return None, None
        try:
            work = presets.planned_work(model, text, streamed=streamed, rule=STREAM_RULE,
                                        **kwargs)
            return work, presets.estimate(tracker.rate, work)
        except Exception:  # noqa: BLE001 - an estimate never stops a run
            return None, None

    def run(progress, **kwargs):
        seed = kwargs["seed"]
        work, estimated = planned(False, kwargs["text"],
                                  {k: v for k, v in kwargs.items() if k != "text"})
        t0 = time.perf_counter()
        try:
            on_step = _progress_hook(progress) if progress is not None else None
            result = model.synthesize(on_step=on_step, **kwargs)[0]
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, never a trace
            raise _fail(exc) from None
        wall_s = time.perf_counter() - t0
        if work is not None:
            tracker.observe(work, result.timings["unmask"], result.timings["decode"])
        return (_outputs(model, result, seed, wall_s, estimated[1] if estimated else None),
                _keepable(result))

    def run_streamed(progress, text, **kwargs):
        """Yield every piece of `model.stream` to the streaming player, then the final outputs
        (audio and waveform from the concatenated pieces; no unmasking view: see the notes)."""
        seed, sr = kwargs["seed"], model.sampling_rate
        work, estimated = planned(True, text, kwargs)
        t0 = time.perf_counter()
        pieces = []
        try:
            progress(0.0, desc="Streaming")
            with model.stream(text, rule=STREAM_RULE, **kwargs) as stream:
                for piece in stream:
                    pieces.append(piece)
                    yield (gr.skip(), gr.skip(), gr.skip(), gr.skip(), (sr, to_pcm16(piece)),
                           gr.skip())
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, never a trace
            raise _fail(exc) from None
        wall_s = time.perf_counter() - t0
        if work is not None:
            stats = stream.chunk_stats
            tracker.observe(work, sum(st["unmask_s"] for st in stats),
                            sum(st["decode_s"] for st in stats))
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        yield ((sr, to_pcm16(audio)), render_waveform(audio, sr, width=760), None,
               _stream_timings_markdown(stream, len(audio) / float(sr), seed, wall_s, estimated),
               gr.skip(), STREAMED_NOT_KEPT)

    def dispatch(streamed: bool, progress, text, **kwargs):
        """The endpoints are generators: one final yield without streaming (the same outputs
        `run` returns, and nothing for the streaming player), one yield per piece with it. The
        last output is the session's kept-voice state (what "Keep this voice" saves)."""
        if streamed:
            if shutil.which("ffmpeg") is None:  # gradio encodes the streamed pieces with it
                raise gr.Error("Streaming playback needs ffmpeg on the server (apt-get install "
                               "ffmpeg); untick streaming to get the audio in one piece.",
                               title="Streaming unavailable", print_exception=False)
            yield from run_streamed(progress, text, **kwargs)
        else:  # the streaming player is left alone (given None it shows a paused empty stream)
            outputs, kept = run(progress, text=text, **kwargs)
            yield (*outputs, gr.skip(), kept)

    # --- endpoints: parameter names are what gradio_client users see ---

    def clone(text, ref_audio, ref_text, voice_prompt_file, preprocess_prompt, language,
              num_step, guidance_scale, speed, duration, seed, denoise, postprocess_output,
              t_shift, layer_penalty_factor, position_temperature, class_temperature,
              stream=False, normalize_text=False, profile="exact", progress=gr.Progress()):
        kwargs = _checked_settings(language, num_step, guidance_scale, speed, duration, seed,
                                   denoise, postprocess_output, t_shift, layer_penalty_factor,
                                   position_temperature, class_temperature, profile)
        if voice_prompt_file:
            if ref_audio:
                gr.Info("Using the voice prompt file; the reference clip is ignored.")
            try:
                kwargs["voice_clone_prompt"] = VoiceClonePrompt.load(voice_prompt_file)
                _warn_pace(kwargs["voice_clone_prompt"])
            except Exception as exc:  # noqa: BLE001
                raise _fail(exc) from None
        elif ref_audio:
            progress(0.0, desc="Encoding the reference clip")
            kwargs.update(ref_audio=ref_audio, ref_text=ref_text or None,
                          preprocess_prompt=bool(preprocess_prompt))
        else:
            raise gr.Error("Upload or record a reference clip (and type its transcript), or "
                           "load a voice prompt file.", title="No voice to clone",
                           print_exception=False)
        yield from dispatch(stream, progress, text, normalize_text=bool(normalize_text), **kwargs)

    def design(text, instruct, language, num_step, guidance_scale, speed, duration, seed,
               denoise, postprocess_output, t_shift, layer_penalty_factor,
               position_temperature, class_temperature, stream=False, normalize_text=False,
               profile="exact", progress=gr.Progress()):
        kwargs = _checked_settings(language, num_step, guidance_scale, speed, duration, seed,
                                   denoise, postprocess_output, t_shift, layer_penalty_factor,
                                   position_temperature, class_temperature, profile)
        yield from dispatch(stream, progress, text, instruct=instruct or None,
                            normalize_text=bool(normalize_text), **kwargs)

    def auto(text, language, num_step, guidance_scale, speed, duration, seed, denoise,
             postprocess_output, t_shift, layer_penalty_factor, position_temperature,
             class_temperature, stream=False, normalize_text=False, profile="exact",
             progress=gr.Progress()):
        kwargs = _checked_settings(language, num_step, guidance_scale, speed, duration, seed,
                                   denoise, postprocess_output, t_shift, layer_penalty_factor,
                                   position_temperature, class_temperature, profile)
        yield from dispatch(stream, progress, text, normalize_text=bool(normalize_text), **kwargs)

    def save_prompt(prompt, stem: str) -> str:
        """A voice prompt as a new .npz in this demo's folder (offered for download)."""
        path = workdir / f"{stem}-{secrets.token_hex(4)}.npz"
        try:
            prompt.save(path)
        except Exception as exc:  # noqa: BLE001
            raise _fail(exc) from None
        return str(path)

    def make_voice_prompt(ref_audio, ref_text, preprocess_prompt):
        if not ref_audio:
            raise gr.Error("Upload or record a reference clip first.", title="No reference clip",
                           print_exception=False)
        try:
            prompt = model.create_voice_clone_prompt(ref_audio, ref_text=ref_text or None,
                                                     preprocess_prompt=bool(preprocess_prompt))
        except Exception as exc:  # noqa: BLE001
            raise _fail(exc) from None
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
            kwargs = _settings(*values, profile)
        except OmniCoreError as exc:
            return (presets.describe(None, None, 0, str(exc)),) * 3
        kwargs["normalize_text"] = bool(normalize_text)
        steps, rate, load = kwargs["num_step"], tracker.rate, presets.machine_load()

        def line(text, **voice):
            try:
                work = presets.planned_work(model, text, streamed=bool(stream), rule=STREAM_RULE,
                                            **voice, **kwargs)
            except OmniCoreError as exc:
                return presets.describe(rate, None, steps, str(exc))
            return presets.describe(rate, work, steps, load=load)

        if voice_file:
            try:
                clone = line(clone_text, voice_clone_prompt=VoiceClonePrompt.load(voice_file))
            except OmniCoreError as exc:
                clone = presets.describe(rate, None, steps, str(exc))
        elif ref_audio:
            clone = line(clone_text, ref_audio=ref_audio, ref_text=ref_text or None)
        else:
            clone = presets.describe(rate, None, steps, "upload a reference clip (or a voice "
                                     "prompt file).")
        return clone, line(design_text, instruct=instruct or None), line(auto_text)

    def example_outputs(text, **voice):
        """An example as the page makes it with its defaults, in one piece (so that the
        unmasking view is there too)."""
        kwargs = dict(num_step=presets.PRESETS[defaults.preset], seed=EXAMPLE_SEED)
        outputs, _ = run(None, text=text, **voice, **kwargs)
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
    with gr.Blocks(title="omnicore · OmniVoice TTS", analytics_enabled=False,
                   delete_cache=(3600, 7200)) as demo:
        gr.Markdown(INTRO)
        gr.Markdown(f"Model: `{model_name}` · {model.sampling_rate} Hz"
                    + (" · ⚠️ **random smoke-test weights: the audio is noise**, the pictures "
                       "still show how decoding works." if is_random else ""))
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                with gr.Tabs():
                    with gr.Tab("Voice clone", id="clone") as clone_tab:
                        clone_text = gr.Textbox(label="Text to speak", lines=3, info=PAUSE_HELP,
                                                elem_id="clone-text",
                                                max_length=limits.MAX_TEXT_CHARS,
                                                value="This is my voice, cloned from a short clip.")
                        with gr.Row():
                            # Short labels: gradio draws them over the upload area.
                            ref_audio = gr.Audio(label="Reference clip",
                                                 sources=["upload", "microphone"],
                                                 type="filepath", elem_id="ref-audio")
                            with gr.Column():
                                ref_text = gr.Textbox("", label="Transcript of the reference clip",
                                                      lines=3, elem_id="ref-text",
                                                      max_length=limits.MAX_REF_TEXT_CHARS,
                                                      info="Required: omnicore has no speech "
                                                           "recogniser.")
                                preprocess = gr.Checkbox(GEN.preprocess_prompt,
                                                         label="Clean up the clip (trim "
                                                               "silences, normalise loudness)")
                        with gr.Row():
                            voice_file = gr.File(label="Voice prompt file",
                                                 file_types=[".npz", ".pt"], elem_id="voice-file")
                            save_voice = gr.Button("Save the clip as a voice prompt",
                                                   elem_id="save-voice")
                        gr.Markdown(f"The clip: 3-10 s of clean speech (at most "
                                    f"{limits.MAX_REF_S:g} s). A voice prompt file (.npz, or a "
                                    ".pt saved by omnivoice) is used instead of the clip when set.",
                                    elem_classes=["omni-note"])
                        clone_wait = gr.Markdown(elem_id="clone-estimate")
                        clone_btn = gr.Button("Generate", variant="primary", elem_id="clone-go")
                    with gr.Tab("Voice design", id="design") as design_tab:
                        design_text = gr.Textbox(label="Text to speak", lines=3, info=PAUSE_HELP,
                                                 elem_id="design-text",
                                                 max_length=limits.MAX_TEXT_CHARS,
                                                 value="Good evening. Here is tonight's forecast.")
                        pickers = []
                        items = _voice_items()
                        notes = {"accent": "English speech only", "dialect": "Chinese speech only"}
                        cats = list(items)
                        for row in (cats[:3], cats[3:]):
                            with gr.Row():
                                for cat in row:
                                    pickers.append(gr.Dropdown(
                                        items[cat], value="", label=cat.capitalize(),
                                        info=notes.get(cat), elem_id=f"pick-{cat}"))
                        instruct = gr.Textbox("", label="Instruct (composed from the pickers; "
                                              "you may edit it)", elem_id="instruct",
                                              placeholder="e.g. female, young adult, "
                                                          "british accent")
                        instruct_status = gr.Markdown(check_instruct(""), elem_id="instruct-status")
                        design_wait = gr.Markdown(elem_id="design-estimate")
                        design_btn = gr.Button("Generate", variant="primary", elem_id="design-go")
                    with gr.Tab("Auto voice", id="auto") as auto_tab:
                        auto_text = gr.Textbox(label="Text to speak", lines=3, elem_id="auto-text",
                                               info=PAUSE_HELP,
                                               max_length=limits.MAX_TEXT_CHARS,
                                               value="Hello! Nobody told me what to sound like, "
                                                     "so I picked a voice myself.")
                        gr.Markdown("No reference and no instruct: the model invents a voice. "
                                    "Fix the seed to get the same voice again.")
                        auto_wait = gr.Markdown(elem_id="auto-estimate")
                        auto_btn = gr.Button("Generate", variant="primary", elem_id="auto-go")

                with gr.Accordion("Settings", open=True):
                    language = gr.Dropdown([("Auto (from the text)", AUTO_LANGUAGE)]
                                           + language_choices(), value=AUTO_LANGUAGE,
                                           label=f"Language ({len(language_choices())} "
                                                 "supported; type to search)",
                                           filterable=True, elem_id="language")
                    steps_of = ", ".join(f"{name} {n}" for name, n in presets.PRESETS.items())
                    preset = gr.Radio(list(presets.PRESETS) + [presets.APPROXIMATE],
                                      value=defaults.preset, label="Speed", elem_id="preset",
                                      info=f"Unmasking steps: {steps_of} (the reference's "
                                           "default). Fewer steps: sooner, a little rougher. "
                                           f"{presets.APPROXIMATE}: 16 steps of the fast profile, "
                                           "approximate.")
                    profile = gr.Radio([("Exact", "exact"), ("Fast (approximate)", "fast")],
                                       value="exact", label="Profile", elem_id="profile",
                                       info="Fast reuses the prompt's keys and values and the "
                                            "unconditional pass between refresh steps: faster, "
                                            "and an approximation whose effect on speech has "
                                            "not been measured here (docs/performance.md).")
                    with gr.Row():
                        num_step = gr.Slider(1, 64, value=presets.PRESETS[defaults.preset],
                                             step=1, label="Unmasking steps", elem_id="steps")
                        guidance = gr.Slider(0.0, 5.0, value=GEN.guidance_scale, step=0.1,
                                             label="Guidance scale (classifier-free)")
                    with gr.Row():
                        speed = gr.Slider(0.5, 2.0, value=1.0, step=0.05,
                                          label="Speed (when the duration is estimated)")
                        # The API's limits: the whole output, and one unmasking pass (a
                        # sentence is never cut, so a short text is one pass).
                        duration = gr.Number(0, label="Fixed duration in seconds (0 = estimate "
                                             "from the text)", minimum=0,
                                             maximum=limits.MAX_DURATION_S,
                                             info=f"At most {limits.MAX_PASS_S:g} s per "
                                                  "sentence; longer text is cut at sentence "
                                                  "marks.")
                    with gr.Row():
                        seed = gr.Number(-1, precision=0, label="Seed (-1 = random)",
                                         elem_id="seed")
                        denoise = gr.Checkbox(GEN.denoise, label="Denoise (clone mode)")
                        postprocess = gr.Checkbox(GEN.postprocess_output,
                                                  label="Post-process (trim, fades)")
                    streamed = gr.Checkbox(defaults.streamed,
                                           label="Stream the audio as it is generated",
                                           elem_id="stream",
                                           info="Plays in the streaming player while the rest "
                                                "is made (text cut into chunks); no unmasking "
                                                "view in this mode.")
                    normalized = gr.Checkbox(False, label="Read numbers as words (text "
                                             "normalisation)", elem_id="normalize-text",
                                             info="'$45.50 on 5 Jan 2024' -> 'forty five point "
                                                  "five dollars on ...'; needs the tn extra.")
                    with gr.Accordion("Unmasking knobs", open=False):
                        with gr.Row():
                            t_shift = gr.Slider(0.01, 1.0, value=GEN.t_shift, step=0.01,
                                                label="t_shift (schedule: small = slow start)")
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
                audio_out = gr.Audio(label="Generated speech", type="numpy", format="wav",
                                     interactive=False, buttons=["download"], elem_id="audio-out",
                                     # the browser's own player: the waveform is drawn below
                                     waveform_options=gr.WaveformOptions(
                                         show_recording_waveform=False))
                stream_out = gr.Audio(label="Streaming playback", streaming=True, autoplay=True,
                                      interactive=False, elem_id="stream-out",
                                      visible=defaults.streamed)
                wave_img = gr.Image(label="Waveform and spectrogram", type="numpy", format="png",
                                    interactive=False, show_label=False, elem_id="waveform-view",
                                    buttons=["download", "fullscreen"])
                keep_btn = gr.Button("Keep this voice", elem_id="keep-voice", size="sm")
                timings = gr.Markdown("Timings per stage appear here after a run.",
                                      label="Timings", elem_id="timings")

        gr.Markdown("## Unmasking view")
        unmask_img = gr.Image(label="Unmasking view", type="numpy",
                              format="png", interactive=False, show_label=False,
                              elem_id="unmasking-view",
                              buttons=["download", "fullscreen"])
        gr.Markdown(UNMASKING_CAPTION)
        gr.Markdown(f"Requests are queued: {concurrency} synthesis at a time, up to {max_queue} "
                    "waiting; your place in the queue shows on the output while you wait. "
                    "Model weights: OmniVoice (CC-BY-NC 4.0) and the Higgs Audio V2 codec "
                    "(Boson community licence), downloaded from the Hugging Face Hub.",
                    elem_classes=["omni-footer"])

        settings = [language, num_step, guidance, speed, duration, seed, denoise, postprocess,
                    t_shift, layer_penalty, pos_temp, class_temp, streamed, normalized, profile]
        last_voice = gr.State(None)  # per session: the last result's voice, or why none
        outputs = [audio_out, wave_img, unmask_img, timings, stream_out, last_voice]
        synth = dict(concurrency_limit=concurrency, concurrency_id=SYNTHESIS_GROUP)
        clone_btn.click(clone, [clone_text, ref_audio, ref_text, voice_file, preprocess, *settings],
                        outputs, api_name="clone", **synth)
        design_btn.click(design, [design_text, instruct, *settings], outputs, api_name="design",
                         **synth)
        auto_btn.click(auto, [auto_text, *settings], outputs, api_name="auto", **synth)
        save_voice.click(make_voice_prompt, [ref_audio, ref_text, preprocess], voice_file,
                         api_name="make_voice_prompt", **synth)

        # Cheap UI helpers run outside the synthesis group, so they stay instant under load.
        quick = dict(concurrency_limit=None, show_progress="hidden")
        private = dict(api_visibility="private", **quick)
        keep_btn.click(keep_voice, [last_voice], voice_file, api_name="keep_voice", **quick)
        for picker in pickers:
            picker.change(compose_instruct, pickers, instruct, api_visibility="private", **quick)
        instruct.change(check_instruct, [instruct, design_text], instruct_status,
                        api_name="check_instruct", **quick)
        design_text.change(check_instruct, [instruct, design_text], instruct_status,
                           api_visibility="private", **quick)

        streamed.change(lambda on: gr.update(visible=bool(on)), streamed, stream_out, **private)
        # Speed presets set the steps and the profile; settings no preset has clear the preset.
        preset.input(presets.preset_settings, preset, [num_step, profile], **private)
        for knob in (num_step, profile):
            knob.input(presets.preset_of, [num_step, profile], preset, **private)

        # The wait, estimated as the inputs change (tokenising the text: cheap, never queued).
        if measured:
            tab_inputs = [clone_text, ref_audio, ref_text, voice_file, design_text, instruct,
                          auto_text]
            gr.on([c.change for c in tab_inputs + settings] + [demo.load], waits,
                  tab_inputs + settings, [clone_wait, design_wait, auto_wait],
                  trigger_mode="always_last", **private)

        # Examples: made once at start-up with the page's defaults, then played from the cache.
        shown = [audio_out, wave_img, unmask_img, timings]
        cache = dict(cache_examples=measured, cache_mode="eager")
        with clone_tab:
            gr.Examples(CLONE_EXAMPLES, [clone_text, ref_audio, ref_text], shown, example_clone,
                        label="Example (a synthetic espeak-ng voice)", elem_id="clone-examples",
                        **cache)
        with design_tab:
            gr.Examples(DESIGN_EXAMPLES, [design_text, instruct], shown, example_design,
                        label="Examples", elem_id="design-examples", **cache)
        with auto_tab:
            gr.Examples(AUTO_EXAMPLES, [auto_text], shown, example_auto, label="Examples",
                        elem_id="auto-examples", **cache)

    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue)
    return demo


def launch_options() -> dict:
    """Theme and CSS (gradio 6 takes them in launch)."""
    theme = gr.themes.Soft(primary_hue="violet", secondary_hue="teal",
                           font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "monospace"])
    return dict(theme=theme, css=CSS)


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
    p.add_argument("--no-warmup", action="store_true",
                   help="skip timing the model at start-up (it compiles the kernels, sets the "
                        "speed preset and the estimates, and makes the examples): the page "
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
    demo = build_demo(model, args.model, args.concurrency, args.max_queue, defaults)
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
