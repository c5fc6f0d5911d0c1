"""Stop: a visitor ends their own run at the engine's next unmasking step.

Each synthesis of a session registers a `Run` on the page's `Board` under the session's id
(gradio's session hash: one per browser tab, one per `gradio_client.Client`). The run's
progress callback (`Run.on_step`, called once per unmasking step with the engine's count) is
where a stop takes effect: once `Run.stop` has been called, the next step raises `Stopped`,
which cancels the engine's ticket (an exception from a progress callback does: engine.Ticket)
so its passes leave before the engine's next iteration. A stream is also closed at once
(`SpeechStream.close` may be called from another thread), which ends a decode between two
windows. `stop` waits for the run to end and says at which step it did.
"""

from __future__ import annotations

import threading


class Stopped(Exception):
    """Raised by a run's progress callback once its visitor has pressed Stop."""


class Run:
    """One synthesis as Stop sees it: the last step the engine reported, and whether and when
    a stop was asked for."""

    def __init__(self):
        self._lock = threading.Lock()
        self._closers: list = []
        self.ended = threading.Event()
        self.step = (0, 0)          # (step, of steps) last reported
        self.asked_after = None     # the step reported last when Stop came
        self.stopped_at = None      # the step whose report ended the run

    @property
    def asked(self) -> bool:
        return self.asked_after is not None

    def on_step(self, step: int, total: int) -> None:
        """The progress callback: record the step, or end the run when a stop was asked."""
        with self._lock:  # a stop lands between two reports, never inside one
            if self.asked:
                self.stopped_at = (step, total)
                raise Stopped
            self.step = (step, total)

    def on_close(self, close) -> None:
        """Call `close()` when stopped (a stream's close)."""
        with self._lock:
            asked = self.asked
            self._closers.append(close)
        if asked:
            close()

    def stop(self) -> None:
        with self._lock:
            if self.asked:
                return
            self.asked_after = self.step
            closers = list(self._closers)
        for close in closers:
            close()

    def report(self) -> str:
        """What the page says about a stopped run."""
        at = self.stopped_at or self.asked_after
        done, total = at
        where = f" after step {done} of {total}" if total else " before its first step"
        return (f"**Stopped**{where} (Stop came after step {self.asked_after[0]}): the engine "
                "left the work at its next step.")


class Board:
    """The running syntheses, by session."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}

    def start(self, session: str | None) -> Run:
        run = Run()
        if session:
            with self._lock:
                self._runs[session] = run
        return run

    def end(self, session: str | None, run: Run) -> None:
        run.ended.set()
        if session:
            with self._lock:
                if self._runs.get(session) is run:
                    del self._runs[session]

    def stop(self, session: str | None, wait_s: float = 60.0) -> Run | None:
        """Stop the session's run and wait (at most `wait_s`) for it to end; None when
        nothing of this session was running."""
        with self._lock:
            run = self._runs.get(session) if session else None
        if run is None:
            return None
        run.stop()
        run.ended.wait(wait_s)
        return run
