"""Progress while `say` and the local `batch` work, as the Ray batch reports it: which of how many
(chunk i/n, job k/n), the unmasking step, and an ETA.

    StatusLine        one line on stderr rewritten in place ("\\r"); log lines pass above it
    SynthesisProgress `on_step` of one synthesize call: chunk(s) i/n, step, ETA
    BatchProgress     the running jobs' steps and the batch's ETA

The live line is drawn only on a terminal and without --quiet (`StatusLine(args)`), so that a
log never fills with "\\r" lines; the lines a command logs (each batch job, the summary) are
printed either way, unless --quiet. An ETA is the time so far scaled by the work left: for `say`
the frames of the passes still to run, for a batch its jobs (the running ones by their steps);
omnicore.apps.cluster.format_eta writes it, as for the Ray batch. The time so far leaves out what
was spent compiling kernels (`compile_seconds`, a clock of the compiles so far: they happen
once per machine, mostly in the first step, and would make the first ETAs minutes long).
"""

from __future__ import annotations

import sys
import threading
import time

from ..cluster import format_eta, job_line
from . import common


class StatusLine:
    """A status line on stderr, redrawn in place; `log` prints a line above it. Thread-safe:
    batch jobs report from their own threads."""

    def __init__(self, args):
        self.quiet = getattr(args, "quiet", False)
        self.live = not self.quiet and sys.stderr.isatty()
        self._text = ""
        self._lock = threading.Lock()

    def show(self, text: str) -> None:
        if self.live:
            with self._lock:
                self._text = text
                self._draw(text)

    def log(self, msg: str) -> None:
        """A line that stays (unless --quiet), with the status line drawn again below it."""
        if not self.quiet:
            self._above(lambda: print(msg, file=sys.stderr))

    def error(self, msg) -> None:
        """An `omnicore: error:` line (also with --quiet), the status line below it."""
        self._above(lambda: common.error(msg))

    def _above(self, write) -> None:
        with self._lock:
            if self._text:
                self._draw("")
            write()
            if self._text:
                self._draw(self._text)

    def close(self) -> None:
        """Clear the status line (before the command's last lines)."""
        with self._lock:
            if self._text:
                self._draw("")
                self._text = ""

    @staticmethod
    def _draw(text: str) -> None:
        sys.stderr.write("\r\033[K" + text)  # to the line's start, clear it, write
        sys.stderr.flush()


def _eta(started: float, done: float, compiled: float = 0.0) -> str:
    """Time left when the fraction `done` of the work took the time since `started`, less the
    `compiled` seconds of it spent compiling kernels."""
    if done <= 0:
        return "?"
    work = max(time.perf_counter() - started - compiled, 0.0)
    return format_eta(work / done * (1 - done))


class SynthesisProgress:
    """Progress of one `synthesize` call: `plan(specs)` when its passes are known, then
    `on_step(step, num_steps)` from the engine. `compile_seconds()`: the compiles' clock.

    The engine runs the passes that depend on no other first (chunk 0 of an auto or designed
    voice; every chunk of a cloned one), packed into shared forwards, then the ones that take
    chunk 0 as their reference: the step counter starts again at each of these groups. Each
    group's work is counted in the frames of its passes."""

    def __init__(self, status: StatusLine, compile_seconds=None):
        self.status = status
        self.compile_seconds = compile_seconds or (lambda: 0.0)
        self.groups: list[list[int]] = []
        self.frames: list[int] = []
        self.n = 0
        self.group = 0
        self.last_step = 0
        self.done = 0.0
        self.started = time.perf_counter()
        self.compiled0 = self.compile_seconds()

    def plan(self, specs) -> None:
        first = [i for i, s in enumerate(specs) if s.after is None]
        later = [i for i, s in enumerate(specs) if s.after is not None]
        self.groups = [g for g in (first, later) if g]
        self.frames = [sum(specs[i].frames for i in g) for g in self.groups]
        self.n = len(specs)
        self.started = time.perf_counter()  # the passes' work, after the text and voice are ready
        self.compiled0 = self.compile_seconds()

    def on_step(self, step: int, total: int) -> None:
        if not self.groups:
            return
        if step < self.last_step and self.group + 1 < len(self.groups):
            self.group += 1
        self.last_step = step
        g = self.groups[self.group]
        # a group too large for one packing runs in rounds: never let the fraction go back
        self.done = max(self.done, (sum(self.frames[:self.group])
                                    + self.frames[self.group] * step / total) / sum(self.frames))
        which = f"chunk {g[0] + 1}" if len(g) == 1 else f"chunks {g[0] + 1}-{g[-1] + 1}"
        eta = _eta(self.started, self.done, self.compile_seconds() - self.compiled0)
        self.status.show(f"  {which}/{self.n} | step {step}/{total} | ETA {eta}")


class BatchProgress:
    """Progress of a local batch of `total` jobs: `on_step(k)` is job k's step callback (called
    in its thread), `finished(k, what, seconds)` logs a job's line once it is over."""

    def __init__(self, status: StatusLine, total: int, compile_seconds=None):
        self.status, self.total = status, total
        self.compile_seconds = compile_seconds or (lambda: 0.0)
        self.started = time.perf_counter()
        self.compiled0 = self.compile_seconds()
        self.steps: dict[int, tuple[int, int]] = {}  # running job -> (step, num_steps)
        self.over = 0  # jobs written or failed
        self.audio_s = 0.0
        self._lock = threading.Lock()

    def _eta(self) -> str:
        """From the jobs over and the steps of the running ones (they run side by side)."""
        partial = sum(step / n for step, n in self.steps.values())
        return _eta(self.started, (self.over + partial) / self.total,
                    self.compile_seconds() - self.compiled0)

    def _running(self) -> str:
        """The status line: the running jobs, the least advanced one's step, the ETA."""
        if not self.steps:
            return ""
        k = sorted(self.steps)
        jobs = f"job {k[0]}" if len(k) == 1 else f"jobs {k[0]}-{k[-1]}"
        step, n = min(self.steps.values())
        return f"  {jobs}/{self.total} | step {step}/{n} | ETA {self._eta()}"

    def on_step(self, k: int):
        def on_step(step: int, total: int) -> None:
            with self._lock:
                self.steps[k] = (step, total)
                line = self._running()
            self.status.show(line)
        return on_step

    def finished(self, k: int, what: str, seconds: float | None) -> None:
        """Job k is over: `seconds` of audio written to `what`, or None: it failed (its error is
        reported apart). Logs the job's line, as the Ray batch does."""
        with self._lock:
            self.steps.pop(k, None)
            self.over += 1
            self.audio_s += seconds or 0.0
            eta, line = self._eta(), self._running()
        self.status.show(line)
        outcome = f"{seconds:.1f} s" if seconds is not None else "failed"
        self.status.log(job_line(k, self.total, what, outcome, self.audio_s, eta))
