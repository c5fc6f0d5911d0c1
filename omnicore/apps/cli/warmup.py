"""`omnicore warmup`: get a machine ready for the doors, then exit (omnicore.machinery.warmup):
compile every kernel a model will use, measure the machine's rate, and make the doors' default
voice in the voices folder.

For a container build or an image, so that the first run after it starts warm: run it in the
image, as the user and with the NUMBA_CACHE_DIR and voices folder the service will have
(docs/configuration.md, "Kernel cache"; docs/cli.md, "warmup").
"""

from __future__ import annotations

from ...audio.writers import write_bytes_atomic
from . import common
from .options import PROFILE_TRADE_OFF


def cmd_warmup(args) -> int:
    from ...model import jit
    from ...machinery.warmup import measure_rate, warm_up
    from ..server.library import VoiceLibrary, default_folder
    from ..server.voices import make_presets

    args.model_profile = args.profile
    model = common.load_model(args)
    done = warm_up(model, args.paths or None,
                   on_path=lambda path, s: common.log(args, f"  {path}: {s:.1f} s"))
    folder = jit.cache_folder()
    where = (f"the kernel cache in {folder}" if isinstance(folder, str)
             else "memory only (no folder for the kernel cache can be written)")
    if not done.seconds:
        common.log(args, f"warm already: every kernel is in {where}")
    else:
        common.log(args, f"warm: {', '.join(done.seconds)} of {args.model} in "
                         f"{done.total_s:.1f} s, {done.compiled} kernels compiled in "
                         f"{done.compile_s:.1f} s into {where}")
    common.log(args, f"rate: {measure_rate(model, keep=write_bytes_atomic) / 1e9:.1f} GFLOP/s on this machine "
                     "(the estimates of voice making and of a stream's chunk 0 use it)")
    if args.voices:
        voices = VoiceLibrary(args.voices_dir or default_folder())
        made = make_presets(model, voices, args.voices, lambda line: common.log(args, line))
        have = [v for v in args.voices if v not in made]
        common.log(args, f"voices in {voices.folder}: "
                         + ", ".join([f"{v} made" for v in made] + [f"{v} there already"
                                                                     for v in have]))
    return 0


def add_parser(sub) -> None:
    from ...machinery.warmup import PATHS
    from ...model.config import PROFILES
    from ..server.voices import DOOR_VOICE, PRESET_VOICES
    from .serve import DOOR_PROFILE

    w = sub.add_parser("warmup", help="compile the kernels and make the default voice now, so "
                                      "the first request is fast",
                       description="Compile (or load from the kernel cache) every kernel the "
                                   "model will use: generate, stream, the clone encoder and "
                                   "decode, each on a little input; measure this machine's "
                                   "rate (FLOP/s); and make the doors' default voice in the "
                                   "voices folder. Numba keeps the kernels in its cache, once "
                                   "per machine, and the voice is kept, once per folder; run "
                                   "this in a container build or an image so that the first "
                                   "request does not pay for either.")
    common.add_model_options(w)
    w.add_argument("--paths", nargs="+", choices=PATHS, metavar="PATH",
                   help=f"only these paths ({', '.join(PATHS)}; default: all of them)")
    w.add_argument("--voices", nargs="*", default=[DOOR_VOICE], choices=list(PRESET_VOICES),
                   metavar="PRESET", help="the presets to make where the voices folder lacks "
                                          "them (default: %(default)s, the doors' default; "
                                          "--voices alone: none)")
    w.add_argument("--voices-dir", help="the voices folder the doors will use (default: "
                                        "OMNICORE_VOICES_DIR, else the user's data folder)")
    w.add_argument("--profile", choices=PROFILES, default=DOOR_PROFILE,
                   help="the profile whose kernels are warmed: the doors' (default: "
                        "%(default)s; exact: the reference's steps). Voices are always made at "
                        "exact, so a voice made here is the one a door makes. " + PROFILE_TRADE_OFF)
    w.set_defaults(func=cmd_warmup)
