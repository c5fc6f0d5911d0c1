"""`omnicore warmup`: compile every kernel a model will use, then exit (omnicore.machinery.warmup).

For a container build or an image, so that the first run after it starts warm: run it in the
image, as the user and with the NUMBA_CACHE_DIR the service will have (docs/configuration.md,
"Kernel cache").
"""

from __future__ import annotations

from . import common


def cmd_warmup(args) -> int:
    from ...model import jit
    from ...machinery.warmup import warm_up

    model = common.load_model(args)
    done = warm_up(model, args.paths or None,
                   on_path=lambda path, s: common.log(args, f"  {path}: {s:.1f} s"))
    folder = jit.cache_folder()
    where = (f"the kernel cache in {folder}" if folder
             else "memory only (no folder for the kernel cache can be written)")
    if not done.seconds:
        common.log(args, f"warm already: every kernel is in {where}")
    else:
        common.log(args, f"warm: {', '.join(done.seconds)} of {args.model} in "
                         f"{done.total_s:.1f} s, {done.compiled} kernels compiled in "
                         f"{done.compile_s:.1f} s into {where}")
    return 0


def add_parser(sub) -> None:
    from ...machinery.warmup import PATHS

    w = sub.add_parser("warmup", help="compile the kernels now, so the first run is fast",
                       description="Compile (or load from the kernel cache) every kernel the "
                                   "model will use: generate, stream, the clone encoder and "
                                   "decode, each on a little input. Numba keeps them in its "
                                   "cache, once per machine; run this in a container build or "
                                   "an image so that the first request does not pay for it.")
    common.add_model_options(w)
    w.add_argument("--paths", nargs="+", choices=PATHS, metavar="PATH",
                   help=f"only these paths ({', '.join(PATHS)}; default: all of them)")
    w.set_defaults(func=cmd_warmup)
