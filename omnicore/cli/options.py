"""The voice and generation options of say, batch and script, and what they mean to
`OmniVoice.generate` (`gen_kwargs`)."""

from __future__ import annotations

import argparse


def _seed(value: str) -> int:
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {value!r}") from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {seed}")
    return seed


def add_generation_options(sp) -> None:
    g = sp.add_argument_group("voice and generation")
    g.add_argument("--language", help="language name or code, e.g. English / en (default: agnostic)")
    g.add_argument("--instruct", help="voice design, e.g. 'female, low pitch, british accent'")
    g.add_argument("--duration", type=float, help="fixed output length in seconds (overrides --speed)")
    g.add_argument("--speed", type=float, help="speaking rate factor, >1 faster (default 1.0)")
    g.add_argument("--steps", type=int, default=32, help="unmasking steps (default 32; 16 is faster)")
    g.add_argument("--guidance", type=float, default=2.0, help="classifier-free guidance scale (default 2.0)")
    g.add_argument("--seed", type=_seed, help="random seed (>= 0): same seed, same audio")
    g.add_argument("--greedy", action="store_true",
                   help="deterministic decoding (position and class temperature 0)")
    g.add_argument("--no-denoise", action="store_true", help="omit the <|denoise|> token when cloning")
    g.add_argument("--no-postprocess", action="store_true",
                   help="keep silences; only loudness, fades and padding are applied")
    g.add_argument("--normalize-text", action="store_true",
                   help="read numbers, dates, currency as words first, as the reference's "
                        "normalize_text (needs pip install 'omnicore[tn]')")


def gen_kwargs(args) -> dict:
    kw = dict(language=args.language, instruct=args.instruct, duration=args.duration,
              speed=args.speed, num_step=args.steps, guidance_scale=args.guidance, seed=args.seed,
              denoise=not args.no_denoise, postprocess_output=not args.no_postprocess)
    if args.greedy:
        kw.update(position_temperature=0.0, class_temperature=0.0)
    if getattr(args, "normalize_text", False):
        kw["normalize_text"] = True
    # Knobs only the reference's flags (infer, infer-batch) set; absent from say/batch.
    for key in _REFERENCE_GEN_KEYS:
        if getattr(args, key, None) is not None:
            kw[key] = getattr(args, key)
    return kw


_REFERENCE_GEN_KEYS = ("t_shift", "layer_penalty_factor", "position_temperature",
                       "class_temperature", "audio_chunk_duration", "audio_chunk_threshold",
                       "preprocess_prompt")
