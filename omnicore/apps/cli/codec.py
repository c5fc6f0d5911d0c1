"""`omnicore codec encode | decode | roundtrip`: the Higgs audio codec alone, audio <-> codes.

Dimensions: C codebooks (8 in the released codec), T frames (25 per second), L samples (24 kHz).
"""

from __future__ import annotations

import numpy as np

from ...errors import AudioError, InputError
from . import common


def _codec(args):
    from ...pipeline import Codec
    from ...machinery.checkpoint import resolve_codec_dir, resolve_model_dir

    path = resolve_model_dir(args.model)
    return Codec(path if (path / "model.safetensors").is_file() and not (path / "audio_tokenizer").is_dir()
                 else resolve_codec_dir(path))


def cmd_codec_encode(args) -> int:
    from ...audio import loading

    common.check_output(args.output, {"the input": args.input})
    codec = _codec(args)
    wav = loading.load_audio(args.input, codec.sampling_rate)  # [L] mono at the codec's rate
    codes = codec.encode(wav, codec.sampling_rate)  # [C, T]
    _save_npy(args.output, codes)
    common.log(args, f"wrote {args.output}: codes {list(codes.shape)} "
                     f"({codes.shape[1] / codec.frame_rate:.2f} s)")
    return 0


def _save_npy(path, arr) -> None:
    from ...audio import writers

    writers.write_atomic(path, lambda fh: np.save(fh, arr), InputError)


def _load_codes(path, num_codebooks: int, codebook_size: int) -> np.ndarray:
    try:
        codes = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{path}: not a .npy array of codes ({exc})") from None
    if codes.ndim != 2 or codes.dtype.kind not in "iu" or not 1 <= codes.shape[0] <= num_codebooks:
        raise InputError(f"{path}: expected integer codes of shape [codebooks<={num_codebooks}, T], "
                         f"got {codes.dtype} {list(codes.shape)}")
    if codes.size == 0 or codes.min() < 0 or codes.max() >= codebook_size:
        raise InputError(f"{path}: codes must lie in [0, {codebook_size}) and T must be >= 1")
    return codes.astype(np.int64)


def cmd_codec_decode(args) -> int:
    from ...audio import writers

    common.check_output(args.output, {"the input": args.input}, AudioError, audio_file=True)
    codec = _codec(args)
    codes = _load_codes(args.input, codec.cfg.num_quantizers, codec.cfg.codebook_size)
    wav = codec.decode(codes)  # [C, T] -> [L]
    writers.write_audio_atomic(args.output, wav, codec.sampling_rate)
    common.log(args, f"wrote {args.output}: {len(wav) / codec.sampling_rate:.2f} s")
    return 0


def cmd_codec_roundtrip(args) -> int:
    from ...audio import loading, writers

    common.check_output(args.output, {"the input": args.input}, AudioError, audio_file=True)
    codec = _codec(args)
    wav = loading.load_audio(args.input, codec.sampling_rate)
    codes = codec.encode(wav, codec.sampling_rate)  # [L] -> [C, T]
    out = codec.decode(codes)  # [C, T] -> [L']
    writers.write_audio_atomic(args.output, out, codec.sampling_rate)
    common.log(args, f"wrote {args.output}: {codes.shape[1]} frames -> "
                     f"{len(out) / codec.sampling_rate:.2f} s")
    return 0


def add_parser(sub) -> None:
    from ... import __version__

    k = sub.add_parser("codec", help="the Higgs audio codec alone: encode, decode, round-trip",
                       description="The Higgs audio codec alone. --model, --precision and -q "
                                   "go after the action (`codec encode in.wav -o c.npy -q`).")
    k.add_argument("--version", action="version", version=f"omnicore {__version__}")
    ksub = k.add_subparsers(dest="codec_command", required=True, metavar="ACTION")
    for name, func, helptext, in_help, out_help in (
            ("encode", cmd_codec_encode, "audio file -> codes .npy [8, T]", "input audio (any rate/channels)", "output .npy"),
            ("decode", cmd_codec_decode, "codes .npy -> 24 kHz audio file", "codes .npy", "output audio file"),
            ("roundtrip", cmd_codec_roundtrip, "audio -> codes -> audio", "input audio", "output audio file")):
        sp = ksub.add_parser(name, help=helptext)
        sp.add_argument("input", help=in_help)
        sp.add_argument("-o", "--output", required=True, help=out_help)
        common.add_model_options(sp)
        sp.set_defaults(func=func)
