"""What every command shares: the model options, loading the model, stderr lines (omnicore's
warnings among them), and the output checks made before any work.

The commands call `load_model` through this module (`common.load_model`), so that a test can
replace it in one place.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
import time
import warnings

from ...machinery.checkpoint import HUB_REPO
from ...errors import InputError, KernelCacheWarning, RefTextMismatchWarning
from ...model.backend import PRECISIONS

DEFAULT_MODEL = os.environ.get("OMNICORE_MODEL", HUB_REPO)


def add_model_options(sp) -> None:
    """--model, --precision, --quiet and --version, which every command takes."""
    from ... import __version__

    sp.add_argument("--version", action="version", version=f"omnicore {__version__}")
    sp.add_argument("--model", default=DEFAULT_MODEL, type=model_name,
                    help="checkpoint directory or hub repo id (default: %(default)s; env OMNICORE_MODEL)")
    sp.add_argument("--precision", choices=PRECISIONS, default="fp32",
                    help="the backbone's GEMMs: fp32 (exact, default); tf32 / bf16 / fp16 "
                         "(approximate: inputs rounded to that format, float32 accumulation); "
                         "int8 (approximate: int8 weights and activations in the layers' "
                         "projections, on the CPU's int8 units; numpy backend only). "
                         "docs/configuration.md")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress or summary on stderr")


def model_name(value: str) -> str:
    """--model's value (argparse also passes the default, OMNICORE_MODEL's, through it)."""
    if not value.strip():
        raise argparse.ArgumentTypeError(
            "the model is empty (an empty --model, or OMNICORE_MODEL set to nothing): give a "
            f"checkpoint directory or a hub repo id such as {HUB_REPO}")
    return value


def log(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr)


def error_line(msg: str) -> None:
    """A line on stderr, as it is (also with -q)."""
    print(msg, file=sys.stderr)


def error(msg) -> None:
    print(f"omnicore: error: {msg}", file=sys.stderr)


def drop_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit of what is still buffered cannot fail a
    second time (Python would print an 'Exception ignored' report)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def warn(msg) -> None:
    # On a terminal, over a progress line that may be there (it is drawn again at the next step)
    clear = "\r\033[K" if sys.stderr.isatty() else ""
    print(f"{clear}omnicore: warning: {msg}", file=sys.stderr)


_subject = threading.local()  # what the current thread works on, e.g. one batch line


@contextlib.contextmanager
def working_on(what: str):
    """Warnings issued in this thread meanwhile name `what` (e.g. `jobs.jsonl:3: id 'a'`)."""
    _subject.what = what
    try:
        yield
    finally:
        _subject.what = None


# What the library's log messages name as the way to list something, for a command-line user.
LISTINGS = {"languages": "`omnicore languages` lists them all (--search TEXT finds one)"}


class _LogLines(logging.Handler):
    """omnicore's logged warnings as `omnicore: warning:` lines; a message that names how to
    list something (its `listing`) names the command that does instead."""

    def emit(self, record: logging.LogRecord) -> None:
        listing = getattr(record, "listing", None)
        if listing in LISTINGS and record.args:
            record.args = (*record.args[:-1], LISTINGS[listing])
        warn(record.getMessage())


@contextlib.contextmanager
def warnings_as_lines():
    """omnicore's warnings (RefTextMismatchWarning, KernelCacheWarning, and what it logs at
    WARNING) as `omnicore: warning:` lines on stderr, every time, from any thread (a stream's
    worker too); other warnings as Python shows them. Not silenced by --quiet: a warning is
    neither progress nor summary."""
    logger = logging.getLogger("omnicore")
    handler, propagate = _LogLines(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with _warnings_as_lines():
            yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@contextlib.contextmanager
def _warnings_as_lines():
    with warnings.catch_warnings():
        warnings.simplefilter("always", RefTextMismatchWarning)
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, KernelCacheWarning):  # the process's, not a job's
                return warn(message)
            if not issubclass(category, RefTextMismatchWarning):
                return shown(message, category, filename, lineno, file, line)
            what = getattr(_subject, "what", None)
            warn(f"{what}: {message}" if what else message)

        warnings.showwarning = show
        yield


@contextlib.contextmanager
def compile_notice(args):
    """While a command runs: the first run's notice ("compiling kernels, once per machine:
    about N s") as a line on stderr when kernels start compiling (not with --quiet, nor for the
    servers, whose logs say it), and `args.compile_seconds`, the compiles' clock that progress
    leaves out of its ETA."""
    from ...machinery.warmup import CompileWatch

    say = (lambda line: note(args, line)) if getattr(args, "compile_notice", True) else None
    with CompileWatch(say) as watch:
        args.compile_seconds = watch.seconds
        yield watch


def note(args, msg: str) -> None:
    """A line that stays, like `log`, written over a progress line that may be on the
    terminal (it is drawn again at the next step)."""
    if not getattr(args, "quiet", False):
        clear = "\r\033[K" if sys.stderr.isatty() else ""
        print(f"{clear}{msg}", file=sys.stderr)


def load_model(args):
    from ...pipeline import OmniVoice

    t0 = time.perf_counter()
    precision = getattr(args, "precision", "fp32")
    # a command that acts for the doors loads the model with their default profile (warmup)
    profile = {"profile": args.model_profile} if getattr(args, "model_profile", None) else {}
    model = OmniVoice.from_pretrained(args.model, precision=precision, **profile)
    label = "" if precision == "fp32" else f" (precision {precision}, approximate)"
    log(args, f"loaded {args.model}{label} in "
              f"{time.perf_counter() - t0:.1f} s")
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
    from ...audio import writers

    for what, src in inputs.items():
        if src and same_file(path, src):
            raise InputError(f"output {os.fspath(path)!r} is the same file as {what} {os.fspath(src)!r}; "
                             "writing it would destroy the input: choose another output name")
    writers.check_output_path(path, error)
    if audio_file:
        writers.audio_format(path)
    writers.AtomicOutput(path, error).abort()  # a folder that takes no new file (read-only, /proc)
