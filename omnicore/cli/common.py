"""What every command shares: the model options, loading the model, stderr lines, and the
output checks made before any work.

The commands call `load_model` through this module (`common.load_model`), so that a test can
replace it in one place.
"""

from __future__ import annotations

import os
import sys
import time

from ..errors import InputError

DEFAULT_MODEL = os.environ.get("OMNICORE_MODEL", "k2-fsa/OmniVoice")


def add_model_options(sp) -> None:
    """--model and --quiet, which every command takes."""
    sp.add_argument("--model", default=DEFAULT_MODEL,
                    help="checkpoint directory or hub repo id (default: %(default)s; env OMNICORE_MODEL)")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress or summary on stderr")


def log(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr)


def error(msg) -> None:
    print(f"omnicore: error: {msg}", file=sys.stderr)


def progress(enabled: bool):
    """A one-line step counter on stderr; only on a terminal, so logs don't fill with \r lines."""
    if not enabled or not sys.stderr.isatty():
        return None

    def on_step(step: int, total: int) -> None:  # step counts from 1
        sys.stderr.write(f"\r  unmasking step {step}/{total}")
        if step == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return on_step


def load_model(args):
    from ..pipeline import OmniVoice

    t0 = time.perf_counter()
    model = OmniVoice.from_pretrained(args.model)
    log(args, f"loaded {args.model} in {time.perf_counter() - t0:.1f} s")
    return model


def same_file(a, b) -> bool:
    """Whether paths `a` and `b` name one file: after symbolic links, and hard links too."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one of them does not exist (yet)
        return False


def check_output(path, inputs: dict, error=InputError, *, audio_file: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written (missing folder, a folder or
    device, an unknown audio extension) or that would replace one of the command's own inputs
    (`inputs`: what it is -> path or None)."""
    from ..audio import writers

    for what, src in inputs.items():
        if src and same_file(path, src):
            raise InputError(f"output {os.fspath(path)!r} is the same file as {what} {os.fspath(src)!r}; "
                             "writing it would destroy the input: choose another output name")
    writers.check_output_path(path, error)
    if audio_file:
        writers.audio_format(path)
    writers.AtomicOutput(path, error).abort()  # a folder that takes no new file (read-only, /proc)
