"""The voice and generation options, and what they mean to `OmniVoice.generate` (`gen_kwargs`).

The generation knobs are the fields of `GenerationConfig` (omnicore.model.config): each option
takes its type and default from the dataclass, and its help from `FIELD_HELP`, the one line
per field below. They come in two spellings:
    say, batch, script      a few fields in this command line's style: --steps, --guidance,
                            --no-denoise, --no-postprocess (`add_generation_options`), and
                            clone-prompt's --no-preprocess (`add_field_option`); the servers
                            whose protocol carries only text and voice (wyoming, mcp) the
                            same, for every text (`add_generation_options(sp, texts=False)`)
    infer, infer-batch      `--<field>` as the reference spells them, booleans as
                            `--denoise False` (`add_reference_options`)
Either way the value lands on `args.<field>`, which is where `gen_kwargs` reads it.
"""

from __future__ import annotations

import argparse
import typing

from ...model.config import FAST_PROFILE, LIVE_PROFILE, PROFILES, GenerationConfig

# The trade-off every --profile help states (docs/performance.md has the measurements).
PROFILE_TRADE_OFF = (
    "fast is approximate: it reuses work between steps (the prompt's keys and values, the "
    "unconditional pass) and takes 16 steps, about 3-4x faster than exact on 2 CPU cores; "
    "what it does to speech quality is not measured on real weights here (docs/performance.md). "
    "live is fast with a stream's first chunk short and in 4 steps")

# What each GenerationConfig field does, in a line: the help of its option.
FIELD_HELP = {
    "num_step": "unmasking steps; fewer is faster",
    "guidance_scale": "classifier-free guidance scale",
    "t_shift": "shape of the unmasking schedule: smaller fills fewer cells in the first steps",
    "layer_penalty_factor": "confidence taken off per codebook index, so coarse codebooks "
                            "are filled first",
    "position_temperature": "noise on the order in which cells are filled (0: by confidence "
                            "alone)",
    "class_temperature": "sampling temperature of each cell's token (0: the most likely one)",
    "denoise": "put the <|denoise|> token in the prompt when cloning",
    "preprocess_prompt": "clean up the reference clip and text (silences cut from the clip, "
                         "an end mark added to the text)",
    "postprocess_output": "remove long silences from the output (loudness, fades and padding "
                          "are always applied)",
    "audio_chunk_duration": "seconds of audio per chunk when a long text is cut",
    "audio_chunk_threshold": "a text estimated longer than this many seconds is cut into chunks",
    "pad_duration": "seconds of silence added at each end of the output",
    "fade_duration": "seconds of fade-in and fade-out at the ends of the output",
    "profile": "exact (the reference's algorithm), fast or live. " + PROFILE_TRADE_OFF,
    "prefix_refresh": "fast profile: the prompt runs in full every this many steps, its keys "
                      "and values reused in between",
    "uncond_every": "fast profile: the unconditional pass runs every this many steps, its "
                    "log-probs reused in between",
    "first_chunk_steps": "a stream's first chunk is unmasked in this many steps (0: the "
                         "steps of the others)",
    "first_chunk_seconds": "a stream's first chunk ends at a clause end after this many "
                           "seconds of speech",
    "first_chunk_max_seconds": "a stream's first chunk with no clause end by then ends at a "
                               "word break after this many seconds of speech (0: three times "
                               "--first-chunk-seconds)",
    "first_audio_seconds": "a stream's first chunk ends at the last word break whose estimated "
                           "unmasking fits this many seconds on this machine (0: no budget; "
                           "live: 3.5)",
}

_FIELD_TYPES = typing.get_type_hints(GenerationConfig)  # field name -> int, float, bool or str
_DEFAULTS = GenerationConfig()
# Fields whose default depends on the profile: their options default to None (the profile's),
# and their help gives each profile's value, from the profiles themselves.
_PROFILE_FIELDS = {"exact": {}, "fast": FAST_PROFILE, "live": LIVE_PROFILE}
_BY_PROFILE = {name: {p: fields.get(name, getattr(_DEFAULTS, name))
                      for p, fields in _PROFILE_FIELDS.items()} for name in FAST_PROFILE}


def _default_help(name: str, profile: str = "exact") -> str:
    """The default of field `name` on a command whose default profile is `profile`."""
    if name in _BY_PROFILE:
        values = _BY_PROFILE[name]
        others = ", ".join(f"{values[p]} with --profile {p}" for p in PROFILES if p != profile)
        return f"(default {values[profile]}, the {profile} profile's; {others})"
    return "(default %(default)s)"


def str2bool(value: str) -> bool:
    """The reference's boolean flags: `--denoise False`, `--postprocess_output no`, ..."""
    v = value.lower()
    if v in ("yes", "true", "t", "y", "1"):
        return True
    if v in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"Boolean value expected (true/false, yes/no, 1/0), got {value!r}")


def _seed(value: str) -> int:
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {value!r}") from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {seed}")
    return seed


def add_field_option(group, name: str, flag: str, profile: str = "exact") -> None:
    """Field `name` as this command line spells it: `flag` takes a value, or, for a field that
    is on by default, the switch `flag` (--no-...) turns it off. `profile`: the command's
    default profile (its help says that profile's default)."""
    default = None if name in _BY_PROFILE else getattr(_DEFAULTS, name)
    if _FIELD_TYPES[name] is bool:
        group.add_argument(flag, dest=name, action="store_false", default=default,
                           help=f"do not {FIELD_HELP[name]}")
    elif name == "profile":
        group.add_argument(flag, dest=name, choices=PROFILES, default=None,
                           help=f"{FIELD_HELP[name]} (default exact)")
    else:
        group.add_argument(flag, dest=name, type=_FIELD_TYPES[name], default=default,
                           metavar=flag.lstrip("-").upper(),
                           help=f"{FIELD_HELP[name]} {_default_help(name, profile)}")


def add_generation_options(sp, texts: bool = True, profile: tuple[str, str] | None = None) -> None:
    """The voice and generation options of say, batch and script; with `texts` False, a
    server's settings for every text (wyoming, mcp: no --instruct or --duration, which belong
    to one text). `profile`: (default, why) of a command whose --profile is not exact."""
    g = sp.add_argument_group("voice and generation" if texts else "generation (every text)")
    g.add_argument("--language", help="language name or code, e.g. English / en (default: agnostic)")
    if texts:
        g.add_argument("--instruct", help="voice design, e.g. 'female, low pitch, british accent'")
        g.add_argument("--duration", type=float, help="fixed output length in seconds (overrides --speed)")
    else:
        sp.set_defaults(instruct=None, duration=None)
    g.add_argument("--speed", type=float, help="speaking rate factor, >1 faster (default 1.0)")
    if profile is None:
        add_field_option(g, "profile", "--profile")
    else:
        g.add_argument("--profile", choices=PROFILES, default=profile[0],
                       help=profile[1] + PROFILE_TRADE_OFF)
    default_profile = "exact" if profile is None else profile[0]
    add_field_option(g, "num_step", "--steps", default_profile)
    add_field_option(g, "prefix_refresh", "--prefix-refresh", default_profile)
    add_field_option(g, "uncond_every", "--uncond-every", default_profile)
    add_field_option(g, "guidance_scale", "--guidance")
    g.add_argument("--seed", type=_seed, help="random seed (>= 0): same seed, same audio")
    g.add_argument("--greedy", action="store_true",
                   help="deterministic decoding (position and class temperature 0)")
    add_field_option(g, "denoise", "--no-denoise")
    add_field_option(g, "postprocess_output", "--no-postprocess")
    g.add_argument("--normalize-text", action="store_true",
                   help="read numbers, dates, currency as words first, as the reference's "
                        "normalize_text (needs pip install 'omnicore[tn]')")


def add_reference_options(sp, names) -> None:
    """`--<field>` for each field in `names`, in that order: the reference's flags."""
    for name in names:
        default = None if name in _BY_PROFILE else getattr(_DEFAULTS, name)
        if _FIELD_TYPES[name] is bool:
            sp.add_argument(f"--{name}", type=str2bool, default=default, metavar="BOOL",
                            help=FIELD_HELP[name])
        elif name == "profile":
            sp.add_argument("--profile", choices=PROFILES, default=None,
                            help=f"{FIELD_HELP[name]} (default exact)")
        else:
            sp.add_argument(f"--{name}", type=_FIELD_TYPES[name], default=default,
                            help=f"{FIELD_HELP[name]} {_default_help(name)}")


def gen_kwargs(args) -> dict:
    """The generate() arguments of a parsed command line: the voice options, and every
    GenerationConfig field the command has an option for."""
    kw = dict(language=args.language, instruct=args.instruct, duration=args.duration,
              speed=args.speed, seed=args.seed)
    # None: not given, the profile's own value (a profile's steps are not the exact 32)
    kw.update({name: getattr(args, name) for name in _FIELD_TYPES
               if getattr(args, name, None) is not None})
    if args.greedy:
        kw.update(position_temperature=0.0, class_temperature=0.0)
    if getattr(args, "normalize_text", False):
        kw["normalize_text"] = True
    return kw
