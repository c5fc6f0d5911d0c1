"""The unmasking engine: one thread per model runs every pass of every caller, packed together.

    caller threads (generate, stream, batch, demo)         engine thread (owns the forward)
      plan -> [PassSpec, ...] -> Engine.submit -> Ticket    loop, one iteration at a time:
      Ticket.result(): runs progress callbacks,               1. admit ready passes (their
        returns codes once every pass retired                    dependencies done) FIFO within
      decode + post-process in the caller's thread               the token budget
                                                              2. pack the rows of the active
                                                                 passes of the requests
                                                                 `schedule` picks into one
                                                                 forward_rows
                                                              3. score, pick and fill every pass,
                                                                 each by its own cells per step,
                                                                 in one call each
                                                                 (packed_unmasking.iterate)
                                                              4. retire finished passes; drop
                                                                 cancelled ones

A request, here, is the passes one call submits together (the chunks of its texts); `Engine.submit`
hands back its `Ticket`. (`request.Request`, one text's checked settings, is what those passes
are built from.)

Continuous batching: a pass joins at the next iteration, whatever step the others are at, so
no request waits for another to finish; passes of one request that do not depend on each other
(the chunks of a long text with a voice prompt, the items of a batch) run side by side. In auto /
design mode a long text's chunks 1..n depend on chunk 0 (its codes are their voice reference):
they are prepared and admitted when chunk 0 retires.

Scheduling is per request (its passes always run together): each iteration runs the request with
the least work left and every request whose forward costs at most SIMILAR_COST times as much;
a costlier one sits out, so a short request arriving during a long one does not pay for the long
one's rows every step. No starvation: a request that sits out runs again as soon as the others
have run HOLD times its own per-iteration cost since it last ran (`schedule`).

Randomness: pass k of a request seeded with s draws from child k of `SeedSequence(s)`
(`pass_seed`: what `SeedSequence(s).spawn(n)[k]` gives), so the chunks of one text draw
independent noise rather than the same stream again, and the result stays reproducible.

A pass's codes do not depend on which passes share its forward: each pass has its own cells
per step, step index and random generator, and the rows are independent in the backbone
(positions restart per row, attention is per row). Only float rounding of the shared GEMMs can differ with
the pack (OpenBLAS's Haswell sgemm rounds a row by the GEMM's row count), which changes a
decision only where two candidates tie to within that rounding: never for greedy settings on the
tiny test checkpoint (tested token-exact), but possible for a Gumbel draw (temperatures > 0) and
for near-ties of real weights, as between any two BLAS builds.

Dimension legend: C codebooks, T target frames of a pass, R reference frames, N packed tokens.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from .errors import CancelledError, InputError
from .model import cost, packed_unmasking, tokenizer as tok_mod, unmasking
from .model.config import GenerationConfig, validate_sampling

__all__ = ["PassSpec", "Ticket", "Engine", "EngineLoad", "default_token_budget", "pass_seed",
           "schedule"]

IDLE_EXIT_S = 10.0  # the worker thread ends after this long without work
# Costs are cost.forward_flops of a request's rows. Requests costing up to SIMILAR_COST times the
# least-work request per iteration share its forwards (packing similar work is cheap per row).
SIMILAR_COST = 2.0
# A request sitting out runs once the others have run HOLD x its own per-iteration cost, so it
# keeps about 1 / (1 + HOLD) of the compute however much short work arrives.
HOLD = 2.0


class _Idle(Exception):
    """Unwinds the worker thread when it has been idle for IDLE_EXIT_S."""


@dataclass(frozen=True)
class PassSpec:
    """One unmasking pass to run: a chunk of text, its length, its voice.

    `after` is the index (within the same request) of the pass whose generated codes become
    this pass's reference codes (auto / design long text: chunk 0); `ref_codes` is then None
    and `ref_text` is that pass's text. `seed` is what the pass's generator is made from
    (`np.random.default_rng(seed)`): None, an integer, or a `SeedSequence` (`pass_seed`).
    """

    text: str
    frames: int
    language: str | None
    instruct: str | None
    ref_text: str | None
    ref_codes: np.ndarray | None  # int64 [C, R]
    seed: int | np.random.SeedSequence | None
    gen: GenerationConfig
    after: int | None = None


class PassResult(NamedTuple):
    """What one pass made: its codes and the step (from 0) at which each cell was filled."""

    codes: np.ndarray       # int64 [C, T]
    fill_steps: np.ndarray  # int64 [C, T]


@dataclass(frozen=True)
class EngineLoad:
    """A snapshot of what the engine holds (`Engine.load`). A request is active when one of
    its passes is in the active set, waiting otherwise (queued behind the token budget, or
    waiting for the pass its others depend on)."""

    waiting_requests: int
    active_requests: int
    waiting_passes: int
    active_passes: int
    iterations: int   # iterations run so far
    last_tokens: int  # packed tokens (every row of every pass) of the last iteration's forward


def pass_seed(seed: int | None, k: int) -> np.random.SeedSequence | None:
    """The random stream of pass k (from 0) of a text seeded with `seed`: child k of
    `SeedSequence(seed)`, the same as `SeedSequence(seed).spawn(n)[k]` for any n > k. The chunks
    of one text (its passes in plan order, streamed or not) thus draw independent noise, a text
    gives the same result alone or in a batch, and None stays fresh entropy for every pass."""
    return None if seed is None else np.random.SeedSequence(seed, spawn_key=(k,))


def schedule(costs: Sequence[float], work: Sequence[float], held: Sequence[float]
             ) -> tuple[list[bool], list[float]]:
    """Which requests run this iteration, and their `held` after it, from each one's
    per-iteration cost, work left (cost x steps left, summed over its passes) and `held` (the
    cost others ran since it last ran).

    The request with the least work left runs (the first of equals), with every request that
    costs at most SIMILAR_COST times as much per iteration; a costlier one sits out, unless it
    has been held for HOLD times its own cost. So a request sits out at most until the others
    have run HOLD x its per-iteration cost, overshooting by less than one iteration."""
    head = min(range(len(costs)), key=lambda i: (work[i], i))
    runs = [c <= SIMILAR_COST * costs[head] or h >= HOLD * c for c, h in zip(costs, held)]
    ran = sum(c for c, run in zip(costs, runs) if run)
    return runs, [0 if run else h + ran for run, h in zip(runs, held)]


def default_token_budget(cfg) -> int:
    """Packed tokens per iteration whose working memory stays within cost.MAX_PASS_BYTES (the
    bound every single pass is held to), from the model's per-token cost in cost.forward_bytes."""
    per_token = cost.forward_bytes(cfg, [2], [0]) - cost.forward_bytes(cfg, [1], [0])
    return max(1, cost.MAX_PASS_BYTES // per_token)


class Ticket:
    """The caller's handle of one submitted request (the passes of one call), future-like:
    `result()` waits for the codes of every pass and runs the progress callback in the waiting
    thread; `cancel()` stops it."""

    def __init__(self, engine: "Engine", specs: Sequence[PassSpec], on_step):
        self.engine = engine
        self.specs = list(specs)
        self.on_step = on_step
        self.id = next(engine._ids)
        # Progress and the outcome are handed over under one condition: the engine only appends
        # (it never waits for the caller); at most num_steps entries can pile up.
        self._handoff = threading.Condition(threading.Lock())
        self._progress: list[tuple[int, int]] = []  # (step, num_steps) not yet reported
        self._cancel = threading.Event()
        self._finished = threading.Event()
        self._results: list[PassResult | None] = [None] * len(self.specs)
        self._left = len(self.specs)
        self._error: BaseException | None = None
        self._outcome: tuple | None = None  # (kind, exception) once finished
        self._held = 0  # cost (FLOPs) of the iterations run without it since it last ran

    # -- caller side ----------------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop the request: its passes leave the engine before its next iteration."""
        if not self._finished.is_set():
            self._cancel.set()
            self.engine._wake()

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> list[PassResult]:
        """A `PassResult` per pass, in submission order.

        Raises CancelledError when cancelled, the worker's exception when a pass failed, and
        TimeoutError after `timeout` seconds. An exception from the progress callback cancels
        the request and propagates."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._handoff:
                while self._outcome is None and not self._progress:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("the request did not finish in time")
                    self._handoff.wait(left)
                progress, self._progress = self._progress, []
                ev = self._outcome
            if progress:  # the callback runs outside the lock: it may be slow
                for step in progress:
                    try:
                        self.on_step(*step)
                    except BaseException:
                        self.cancel()
                        raise
                continue
            kind = ev[0]
            if kind == "done":
                return list(self._results)
            if kind == "cancelled":
                raise CancelledError("the request was cancelled")
            raise ev[1]

    # -- engine side ----------------------------------------------------------------------------

    def _finish(self, kind: str, exc: BaseException | None = None) -> None:
        if not self._finished.is_set():
            self._finished.set()
            self._error = exc
            with self._handoff:
                self._outcome = (kind, exc)
                self._handoff.notify_all()

    def _report(self, step: int, num_steps: int) -> None:
        """Progress for the caller's on_step, in order."""
        with self._handoff:
            self._progress.append((step, num_steps))
            self._handoff.notify_all()


class _Pass:
    """A submitted pass: its spec, its rows once prepared, its unmasking state once admitted."""

    def __init__(self, ticket: Ticket, index: int):
        self.ticket, self.index = ticket, index
        self.spec = ticket.specs[index]
        self.prepared: tok_mod.PreparedItem | None = None
        self.state: unmasking.PassState | None = None
        self.cost = 0  # cost.forward_flops of its rows in a mean iteration, set on admission

    def work(self) -> int:
        """What running it to the end still costs."""
        return self.cost * (len(self.state.cells_per_step) - self.state.step)

    def ready(self) -> bool:
        a = self.spec.after
        return a is None or self.ticket._results[a] is not None


class Engine:
    """Runs the unmasking passes of every request on one model, packed into shared forwards.

    One worker thread (started on first use, a daemon; it ends after IDLE_EXIT_S without work)
    owns the forward. `max_tokens` bounds the packed tokens of one iteration (default:
    `default_token_budget`) and cost.forward_bytes of the pack stays within
    cost.MAX_PASS_BYTES; passes beyond either wait, first come first served. A pass alone is
    always admitted (its memory was checked at submit).
    `trace`, when set, is called on the engine thread after each iteration with the request ids
    of the passes it ran (for tests, benchmarks and metrics; `load()` then describes that
    iteration).
    """

    def __init__(self, params, cfg, tokenizer, max_tokens: int | None = None):
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise InputError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.params, self.cfg, self.tokenizer = params, cfg, tokenizer
        self.max_tokens = max_tokens or default_token_budget(cfg)
        self.trace: Callable[[list[int]], None] | None = None
        self.iterations = 0
        self._last_tokens = 0
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._waiting: deque[_Pass] = deque()
        self._active: list[_Pass] = []
        self._thread: threading.Thread | None = None
        self._cache = packed_unmasking.PackCache()

    # -- submitting -----------------------------------------------------------------------------

    def prepare(self, spec: PassSpec, ref_codes=None) -> tok_mod.PreparedItem:
        ref = spec.ref_codes if ref_codes is None else ref_codes
        return tok_mod.prepare_item(self.tokenizer, self.cfg, spec.text, spec.frames,
                                    ref_text=spec.ref_text, ref_codes=ref, lang=spec.language,
                                    instruct=spec.instruct, denoise=spec.gen.denoise)

    def check(self, specs: Sequence[PassSpec]) -> list[tok_mod.PreparedItem | None]:
        """Check every pass's inputs and memory (InputError) before any of them runs; returns
        the prepared rows of the passes that depend on no other (None for the others)."""
        prepared = []
        for spec in specs:
            validate_sampling(spec.gen)
            if spec.after is None:
                item = self.prepare(spec)
            else:  # zeros of the reference pass's length stand in: the same row lengths
                if not 0 <= spec.after < len(specs) or specs[spec.after].after is not None:
                    raise InputError("a pass can only depend on an independent pass of its request")
                C = self.cfg.num_audio_codebook
                item = self.prepare(spec, np.zeros((C, specs[spec.after].frames), np.int64))
            rows, num_out, kept = self._rows(item, spec.gen)
            cost.check_pass_memory(self.cfg, rows, num_out, spec.gen.class_temperature > 0, kept)
            prepared.append(item if spec.after is None else None)
        return prepared

    def submit(self, specs: Sequence[PassSpec], on_step: Callable[[int, int], None] | None = None
               ) -> Ticket:
        """Queue the passes of one request; returns its `Ticket`. Inputs and memory are checked
        here, in the caller's thread (InputError before anything is queued). on_step(step,
        num_steps) is called from `Ticket.result()` after iterations that advanced the request
        (step = the least advanced of its passes that ran), in order, each once; the engine
        never waits for the callback."""
        if not specs:
            raise InputError("a request needs at least one pass")
        prepared = self.check(specs)
        ticket = Ticket(self, specs, on_step)
        passes = [_Pass(ticket, i) for i in range(len(specs))]
        for p, item in zip(passes, prepared):
            p.prepared = item
        with self._cond:
            self._waiting.extend(passes)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="omnicore-engine",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return ticket

    def run(self, specs: Sequence[PassSpec], on_step=None) -> list[PassResult]:
        """submit + result; a KeyboardInterrupt (or any exception) while waiting cancels it."""
        ticket = self.submit(specs, on_step)
        try:
            return ticket.result()
        except BaseException:
            ticket.cancel()
            raise

    def load(self) -> EngineLoad:
        """What the engine holds now (thread-safe, read-only). A finished request's leftover
        passes are not counted; a cancelled one counts until the engine drops it, which it does
        before its next iteration."""
        with self._cond:
            active = [p for p in self._active if not p.ticket._finished.is_set()]
            waiting = [p for p in self._waiting if not p.ticket._finished.is_set()]
            active_ids = {p.ticket.id for p in active}
            waiting_ids = {p.ticket.id for p in waiting} - active_ids
            return EngineLoad(len(waiting_ids), len(active_ids), len(waiting), len(active),
                              self.iterations, self._last_tokens)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the worker -----------------------------------------------------------------------------

    def _rows(self, item: tok_mod.PreparedItem, gen) -> tuple[list[int], list[int], int]:
        """A pass's whole rows (the largest step's), as cost.forward_bytes takes them, and what
        it keeps between steps (cost.kept_bytes: the fast profile's prompt cache and logits)."""
        T, guided = item.num_target, gen.guidance_scale != 0
        rows = [item.input_ids.shape[1]] + ([T] if guided else [])
        kept = cost.kept_bytes(self.cfg, gen, item.input_ids.shape[1] - T, T, guided)
        return rows, [T] * len(rows), kept

    def _fits(self, passes: list[_Pass]) -> bool:
        """The pack of `passes` within the token budget and cost.MAX_PASS_BYTES of memory: the
        forward of all their whole rows, and what each keeps between steps."""
        lengths, num_out, kept = [], [], 0
        for p in passes:
            rows, outs, keeps = self._rows(p.prepared, p.spec.gen)
            lengths, num_out, kept = lengths + rows, num_out + outs, kept + keeps
        sampling = any(p.spec.gen.class_temperature > 0 for p in passes)
        return (sum(lengths) <= self.max_tokens and cost.forward_bytes(
            self.cfg, lengths, num_out, sampling) + kept <= cost.MAX_PASS_BYTES)

    def _admit(self) -> None:
        """Move ready waiting passes to the active set, FIFO, within the token budget."""
        kept: deque[_Pass] = deque()
        blocked = False
        while self._waiting:
            p = self._waiting.popleft()
            ticket = p.ticket
            if ticket._finished.is_set():
                continue  # cancelled or failed: drop
            if blocked or not p.ready():
                kept.append(p)
                continue
            try:
                if p.prepared is None:  # the reference pass just retired: its codes are the voice
                    p.prepared = self.prepare(p.spec, ticket._results[p.spec.after][0])
            except BaseException as exc:  # surfaces in the caller's result()
                ticket._finish("error", exc)
                continue
            if self._active and not self._fits(self._active + [p]):
                blocked = True  # first come first served: later passes do not overtake it
                kept.append(p)
                continue
            try:  # its buffers (and the fast profile's cache) once it fits
                p.state = unmasking.PassState(p.prepared, p.spec.gen, p.spec.seed, self.cfg)
                gen, T = p.spec.gen, p.prepared.num_target
                p.cost = cost.pass_flops(self.cfg, gen, p.state.prompt, T,
                                         p.state.use_uncond) // gen.num_step
            except BaseException as exc:
                ticket._finish("error", exc)
                continue
            self._active.append(p)
        self._waiting = kept

    @staticmethod
    def _select(active: list[_Pass]) -> list[_Pass]:
        """The passes this iteration runs: those of the requests `schedule` picks."""
        tickets = list(dict.fromkeys(p.ticket for p in active))  # in admission order
        cost = {t: 0 for t in tickets}
        work = dict(cost)
        for p in active:
            cost[p.ticket] += p.cost
            work[p.ticket] += p.work()
        runs, held = schedule([cost[t] for t in tickets], [work[t] for t in tickets],
                              [t._held for t in tickets])
        for t, h in zip(tickets, held):
            t._held = h
        chosen = {t for t, run in zip(tickets, runs) if run}
        return [p for p in active if p.ticket in chosen]

    def _run(self) -> None:
        while True:
            try:
                self._iteration()
            except _Idle:
                return
            except BaseException as exc:  # never die silently: every waiting caller hears of it
                with self._cond:
                    for p in list(self._active) + list(self._waiting):
                        p.ticket._finish("error", exc)
                    self._active, self._waiting = [], deque()
                self._cache = packed_unmasking.PackCache()

    def _iteration(self) -> None:
        while True:
            with self._cond:
                self._active = [p for p in self._active if not p.ticket._finished.is_set()]
                for p in list(self._active) + list(self._waiting):
                    if p.ticket._cancel.is_set():
                        p.ticket._finish("cancelled")
                self._active = [p for p in self._active if not p.ticket._finished.is_set()]
                self._admit()
                if not self._active:
                    if not self._waiting and not self._cond.wait(IDLE_EXIT_S) and not self._waiting:
                        # Idle: end the thread, so a dropped model's weights can be freed
                        # (the thread holds the engine); the next submit starts a new one.
                        self._thread = None
                        raise _Idle
                    continue
                active = self._select(self._active)
                tokens = sum(ids.shape[1] for p in active for ids, *_ in p.state.rows_now())
            try:
                packed_unmasking.iterate(self.params, self.cfg, [p.state for p in active],
                                         self._cache)
            except BaseException as exc:  # the shared forward failed: every pass in it fails
                for p in active:
                    p.ticket._finish("error", exc)
                self._cache = packed_unmasking.PackCache()
                return
            with self._cond:
                self.iterations += 1
                self._last_tokens = tokens
            self._after_iteration(active)
            return

    def _after_iteration(self, active: list[_Pass]) -> None:
        progress: dict[int, tuple[Ticket, int]] = {}
        for p in active:
            ticket, s = p.ticket, p.state
            prev = progress.get(ticket.id)
            progress[ticket.id] = (ticket, s.step if prev is None else min(prev[1], s.step))
        for ticket, step in progress.values():
            if ticket.on_step is not None and not ticket._finished.is_set():
                ticket._report(step, ticket.specs[0].gen.num_step)
        with self._cond:
            for p in active:
                if p.state.done and p in self._active:
                    self._active.remove(p)
                    ticket = p.ticket
                    ticket._results[p.index] = PassResult(p.state.codes(), p.state.fill_step)
                    p.state = None  # its buffers go now, not when the request is collected
                    ticket._left -= 1
                    if ticket._left == 0:
                        ticket._finish("done")
        if self.trace is not None:
            try:
                self.trace([p.ticket.id for p in active])
            except Exception:  # a diagnostic hook must not stop the engine
                pass
