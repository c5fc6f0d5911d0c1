"""The `omnicore` command line.

    omnicore say "Hello there." -o hello.wav                    # auto voice
    omnicore say "Hello." --instruct "female, low pitch" -o a.wav   # voice design
    omnicore say "Hello." --ref-audio me.wav --ref-text "..." -o b.wav  # voice cloning
    omnicore say "Wait. [pause:1.5s] Now." --instruct male -o c.wav --save-voice m.npz  # a pause; keep the voice
    omnicore clone-prompt me.wav --ref-text "..." -o me.npz     # save a voice, reuse with --voice
    llm ... | omnicore say --stream --raw | aplay -r 24000 -f S16_LE -c 1   # speak as text arrives
    omnicore batch jobs.jsonl --out-dir out/                    # many utterances
    omnicore batch jobs.jsonl --out-dir out/ --ray              # the same on Ray actors, resumable
    omnicore codec encode in.wav -o codes.npy | decode codes.npy -o out.wav | roundtrip in.wav -o rt.wav
    omnicore languages --search port                            # the ids --language takes
    omnicore warmup                                             # compile the kernels now (images)

Every failure is one `omnicore: error: ...` line on stderr, without a traceback. Exit status:
0 done (also when stdout's reader leaves early, as `| head -1` does: quietly, no message); 2
refused before or while working (bad arguments, text, audio, voice or model files, an output
path that cannot be written or that is one of the inputs); 1 an operating-system failure (e.g.
no space on stdout), some `batch` jobs failed, or `languages --search` found none; 130 Ctrl-C;
143 SIGTERM; 129 SIGHUP. Outputs are written atomically: a failed, interrupted or terminated
command leaves no partial or temporary file, and an existing output is replaced only by a
complete new one.

One module per family of commands, each with its parser next to what it runs:
    say.py        say (also --stream) and clone-prompt
    batch.py      batch, locally or on Ray (--ray)
    script.py     script (several speakers, one file)
    codec.py      codec encode / decode / roundtrip
    serve.py      serve (the HTTP server), wyoming (Home Assistant), mcp (LLM agents)
    languages.py  languages (what --language takes)
    warmup.py     warmup (compile the kernels ahead of the first run)
    reference.py  infer / infer-batch: the reference's command lines, verbatim
    options.py    the voice and generation options, and what they mean to generate()
    progress.py   progress on a terminal: chunk or job i/n, step, ETA
    common.py     what they share: --model, loading the model, stderr lines (and warnings),
                  output checks
This file wires them into one parser and runs a command (`main`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from ... import __version__
from ...machinery.checkpoint import HUB_REPO
from ...errors import OmniCoreError
from . import batch, codec, languages, reference, say, script, serve, warmup
from .common import compile_notice, drop_stdout, error, warnings_as_lines


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one `omnicore: error:` line like every other failure
    (argparse prints the whole usage first); sub-command parsers are of this class too."""

    def error(self, message):
        self.exit(2, f"omnicore: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="omnicore",
        description="OmniVoice text-to-speech (600+ languages, voice cloning and voice design) "
                    "running on numpy: no torch needed.",
        epilog=f"The first run downloads {HUB_REPO} (~3.3 GB) into the Hugging Face cache. "
               "Offline smoke test: --model weights/tiny-random (random weights: noise).")
    p.add_argument("--version", action="version", version=f"omnicore {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    say.add_parsers(sub)  # say, clone-prompt
    batch.add_parser(sub)
    script.add_parser(sub)
    serve.add_parser(sub)
    warmup.add_parser(sub)
    codec.add_parser(sub)
    languages.add_parser(sub)
    reference.add_parsers(sub)  # infer, infer-batch
    return p


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP as an exception, raised in the main thread: every writer removes its
    temporary file on the way out, as for Ctrl-C (the default action kills the process on the
    spot, leaving it behind)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_CLEAN_EXIT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _on_signal(signum, frame):
    for sig in _CLEAN_EXIT_SIGNALS:  # a second signal must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise _Terminated(signum)


def main(argv=None) -> int:
    # The handlers belong to the command, not to whoever imports omnicore (or calls main() in a
    # test): installed here, put back on return. Python only allows it in the main thread; a
    # signal the caller ignores (nohup) stays ignored.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _CLEAN_EXIT_SIGNALS:
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                previous[sig] = signal.signal(sig, _on_signal)
    try:
        args = build_parser().parse_args(argv)
        with warnings_as_lines(), compile_notice(args):
            status = args.func(args)
        sys.stdout.flush()  # now, so a reader gone early is seen here, not at interpreter exit
        return status
    except BrokenPipeError:  # the reader went away (`omnicore languages | head -1`): end
        drop_stdout()         # quietly with success, as `say --stream --raw | player` always did
        return 0
    except OmniCoreError as exc:
        error(exc)
        return 2
    except _Terminated as exc:
        error(f"terminated ({signal.Signals(exc.signum).name}); no partial output was kept")
        return 128 + exc.signum
    except KeyboardInterrupt:
        error("interrupted; no partial output was kept")
        return 130
    except MemoryError:
        error("out of memory; use shorter text or a shorter reference clip")
        return 1
    except OSError as exc:  # omnicore wraps its own file errors; this is e.g. stdin or stderr
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        error(f"{exc.strerror or exc}{where}")
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
