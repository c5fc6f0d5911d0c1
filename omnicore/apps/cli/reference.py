"""`omnicore infer` / `omnicore infer-batch`: the reference's `omnivoice-infer` /
`omnivoice-infer-batch` flags, verbatim, run by `say` / `batch` (a script ports by changing the
command name)."""

from __future__ import annotations

import argparse

from ...errors import ConfigError, InputError
from . import common
from .batch import cmd_batch
from .options import add_reference_options
from .say import cmd_say


def _select_device(device: str | None) -> None:
    """--device (torch's names) -> omnicore's array backend: cpu -> numpy, cuda[:N] -> CuPy on
    GPU N. The backend is chosen once per process (settings.configure), so this runs first."""
    if device is None:  # the reference auto-detects; omnicore keeps OMNICORE_BACKEND (numpy)
        return
    kind, _, index = device.strip().lower().partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise InputError(f"--device {device!r}: omnicore runs on cpu (numpy) or cuda / cuda:N "
                         "(an NVIDIA GPU through CuPy); mps and xpu are not supported")
    backend = "numpy" if kind == "cpu" else "cupy"
    if backend == "cupy":
        import importlib.util

        if importlib.util.find_spec("cupy") is None:
            raise InputError(f"--device {device} runs omnicore on CuPy, which is not installed: "
                             "pip install 'omnicore[gpu]' (needs CUDA 12), or use --device cpu")
    from ...model import backend as array_backend
    from ...machinery.settings import configure

    try:
        configure(backend=backend)
    except ConfigError:
        raise InputError(f"--device {device}: this process already runs omnicore on "
                         f"{array_backend.name()}; set OMNICORE_BACKEND={backend} before starting it") from None
    if backend == "cupy" and index:
        array_backend.xp.cuda.Device(int(index)).use()


def cmd_infer(args) -> int:
    """`omnivoice-infer` -> `say` with the same values. Every infer flag lands where say's own
    option does (args.<name>, the generation knobs under their GenerationConfig names); the
    say options infer lacks are off."""
    _select_device(args.device)
    say = argparse.Namespace(**vars(args), text_file=None, voice=None, stream=False, raw=False,
                             seed=None, greedy=False)
    return cmd_say(say)


# omnivoice-infer-batch's multi-GPU scheduling: accepted, without effect here.
_GPU_ONLY = {"nj_per_gpu": 1, "batch_duration": 1000.0, "batch_size": 0, "warmup": 0}


def cmd_infer_batch(args) -> int:
    """`omnivoice-infer-batch` -> `batch` with the same values; --lang_id, when given, replaces
    every line's language_id (as the reference does), null or not."""
    ignored = [f"--{k} {getattr(args, k)}" for k, default in _GPU_ONLY.items()
               if getattr(args, k) != default]
    if ignored:
        common.log(args, f"note: {', '.join(ignored)} ignored: they schedule GPU worker processes; "
                         "omnicore runs the jobs one after another in this process")
    batch = argparse.Namespace(
        **vars(args), jsonl=args.test_list, out_dir=args.res_dir, language=args.lang_id,
        instruct=None, duration=None, speed=None, seed=None, greedy=False,
        job_overrides={} if args.lang_id is None else {"language": args.lang_id})
    return cmd_batch(batch)


# The GenerationConfig fields each reference command takes as `--<field>`, in its order.
_KNOBS = ("num_step", "guidance_scale", "t_shift", "denoise", "postprocess_output",
          "layer_penalty_factor", "position_temperature", "class_temperature", "profile")
_BATCH_KNOBS = ("audio_chunk_duration", "audio_chunk_threshold", "preprocess_prompt")


def add_parsers(sub) -> None:
    """`infer` and `infer-batch`: the reference's flag names, types and defaults."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    i = sub.add_parser("infer", help="omnivoice-infer's flags, verbatim (runs `say`)",
                       formatter_class=fmt,
                       description="A drop-in for the reference's `omnivoice-infer`: the same "
                                   "flags, types and defaults; booleans as --denoise False. "
                                   "Runs `omnicore say`. --ref_audio needs --ref_text (omnicore "
                                   "has no ASR to transcribe the clip).")
    i.add_argument("--text", required=True, help="Text to synthesize.")
    i.add_argument("--output", required=True, help="Output audio file (.wav, .flac, .ogg).")
    i.add_argument("--ref_audio", help="Reference audio file path for voice cloning.")
    i.add_argument("--ref_text", help="Transcript of the reference audio.")
    i.add_argument("--instruct", help="Style instruction for voice design mode.")
    i.add_argument("--language", help="Language name (e.g. 'English') or code (e.g. 'en').")
    i.add_argument("--speed", type=float, default=1.0)
    i.add_argument("--duration", type=float, default=None,
                   help="Fixed output duration in seconds (overrides --speed).")
    add_reference_options(i, _KNOBS)
    i.add_argument("--device", default=None,
                   help="cpu (numpy) or cuda / cuda:N (CuPy, the gpu extra); default: "
                        "OMNICORE_BACKEND, else numpy")
    common.add_model_options(i)
    i.set_defaults(func=cmd_infer)

    b = sub.add_parser("infer-batch", help="omnivoice-infer-batch's flags, verbatim (runs `batch`)",
                       formatter_class=fmt,
                       description="A drop-in for the reference's `omnivoice-infer-batch`: the "
                                   "same flags and JSONL test list; writes RES_DIR/<id>.wav. "
                                   "Runs `omnicore batch` (every line is checked before any "
                                   "work; a line with ref_audio needs ref_text).")
    b.add_argument("--test_list", required=True, help="JSONL test list (id, text, ref_audio, "
                   "ref_text, instruct, language_id, duration, speed).")
    b.add_argument("--res_dir", required=True, help="Directory to save the generated audio files.")
    add_reference_options(b, _KNOBS + _BATCH_KNOBS)
    b.add_argument("--lang_id", default=None,
                   help="Language id for every line (replaces the lines' language_id).")
    for name, default in _GPU_ONLY.items():
        b.add_argument(f"--{name}", type=type(default), default=default,
                       help="accepted for compatibility; no effect (GPU worker scheduling)")
    common.add_model_options(b)
    b.set_defaults(func=cmd_infer_batch)
