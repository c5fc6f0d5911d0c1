"""The state behind every route: the model and its engine, the voice library, the worker
threads, admission and the Prometheus metrics. Handlers reach it as `request.app.state.server`.

Admission is one block, `async with server.slot(gone) as slot:` (count the request in, 429
when `max_queue` are in flight, 503 while the server drains for shutdown; wait for a run slot;
give both back however the block ends). A stream's response outlives its handler, so its body
takes the release over (`slot.hand_over()`) and gives the slot back when the stream ends.

Shutdown: `drain()` refuses new work; `stop_all()` stops what is in flight (each slot's work
fails at its next step with the 503, and what a slot registered with `on_stop` runs: a stream
closes); `close()` then waits for the worker threads, so nothing computes after the server
has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ...audio.writers import write_bytes_atomic
from ...errors import CancelledError
from .library import VoiceLibrary
from .protocol import MODEL_ALIASES, HTTPError, shutting_down, warming_up
from .voices import check_voice, make_presets, resolve_voice, startup_voices

# Tokens packed into one engine iteration: from one short pass to the default budget's order.
TOKEN_BUCKETS = tuple(2 ** k for k in range(5, 17))
TTFB_BUCKETS = (.05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 120, 300)
# From a GPU's fraction of real time to full size on a few CPU cores (benchmarks/README.md).
RTF_BUCKETS = (.05, .1, .25, .5, 1, 2, 5, 10, 20, 50)


@contextlib.asynccontextmanager
async def client_gone(request):
    """A task that completes the moment the client disconnects, watched while the block runs
    (enter it once the body is read: it takes over the request's receive channel)."""
    async def listen():
        while (await request.receive())["type"] != "http.disconnect":
            pass
    gone = asyncio.ensure_future(listen())
    try:
        yield gone
    finally:
        gone.cancel()  # a stream's response watches the connection itself


class Slot:
    """One admitted request's place: its client's `gone`, the `cancelled` flag that stops its
    work (`stopping` too when the server stops it), and the release of its place, done once."""

    def __init__(self, server: "ServerState", gone: asyncio.Future):
        self.gone = gone
        self.cancelled = threading.Event()
        self.stopping = False
        self.handed_over = False
        self._server = server
        self._released = False
        self._on_stop: list = []

    def on_step(self, step: int, total: int) -> None:
        """The model's per-step callback: a request whose client left stops at its next step
        (CancelledError, which cancels its passes in the engine); one the server stops, with
        the 503 its client is told."""
        if self.cancelled.is_set():
            if self.stopping:
                raise shutting_down()
            raise CancelledError("the client disconnected")

    def on_stop(self, fn) -> None:
        """Call `fn()` (on the event loop) if the server stops this slot's work (now, if it
        already has)."""
        self._on_stop.append(fn)
        if self.stopping:
            fn()

    def stop(self) -> None:
        """The server is going: the work fails at its next step, and the stop hooks run."""
        self.stopping = True
        self.cancelled.set()
        for fn in self._on_stop:
            fn()

    async def run(self, fn, *args):
        """fn(*args) in a worker thread; when the client leaves first, `cancelled` makes the
        work's next step raise CancelledError (the request ends as a 499)."""
        fut = asyncio.wrap_future(self._server.pool.submit(fn, *args))
        try:
            await asyncio.wait({fut, self.gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the awaiting task was cancelled (an MCP request's cancel)
            self.cancelled.set()
            raise
        if not fut.done():
            self.cancelled.set()
        return await fut

    def hand_over(self) -> None:
        """The block no longer releases the slot: the caller (a stream's body) calls
        `release` when it ends."""
        self.handed_over = True

    def release(self) -> None:
        """Give the run slot and the place back (a no-op the second time)."""
        if not self._released:
            self._released = True
            self._server._release(self)


class ServerState:
    """Model, voices, worker threads, bounded in-flight count, metrics."""

    def __init__(self, model, voices_dir=None, api_key: str | None = None, max_queue: int = 16,
                 model_name: str = "omnivoice", max_concurrency: int | None = None,
                 metrics_public: bool = False, idle_timeout: float = 30.0,
                 require_consent: bool | None = None, voice_aliases: dict | None = None,
                 default_voice: str | None = None):
        self.model = model
        self.engine = model.engine
        # require_consent sets (True) or lifts (False) the folder's policy; None keeps it.
        self.voices = VoiceLibrary(voices_dir, require_consent)
        self.api_key = api_key or None
        self.metrics_public = metrics_public
        self.ui_path: str | None = None  # where the demo is mounted, if it is
        self.idle_timeout = idle_timeout  # a WebSocket with nothing to say and no message closes
        self.draining = False
        self.warming = False  # warm_up_in_background is compiling the kernels: not ready yet
        self._compiles = None  # the CompileWatch that logs compiles, once warm_up opened it
        self._stopped = False
        self.max_queue = max_queue
        # Requests synthesising at once (None: all admitted ones; the engine packs them). 1 is
        # the one-at-a-time server that benchmarks compare the engine with.
        self.run_slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.model_name = model_name
        # What /v1/models lists and a speech request's `model` may name: all this one model.
        self.model_ids = list(dict.fromkeys([model_name, *MODEL_ALIASES]))
        self.voice_aliases = dict(voice_aliases or {})  # name -> library voice (--voice-alias)
        # The presets made before the door is ready (warm_up): its default voice, its aliases'.
        self.startup_voices = startup_voices(default_voice, self.voice_aliases)
        self.pool = ThreadPoolExecutor(max_workers=max_queue + 4, thread_name_prefix="omnicore-serve")
        self._in_flight = 0
        self._slot_waiting = 0  # admitted, waiting for a run slot
        self._slots: set[Slot] = set()  # admitted and not released: what stop_all stops
        self._lock = threading.Lock()
        self.registry = CollectorRegistry()
        self.m_requests = Counter("omnicore_requests", "HTTP requests by route and status",
                                  ["route", "status"], registry=self.registry)
        self.m_in_flight = Gauge("omnicore_requests_in_flight", "speech requests admitted",
                                 registry=self.registry)
        self.m_queue = Gauge("omnicore_queue_depth", "speech requests admitted and not yet "
                             "synthesising: waiting for a run slot or queued in the engine",
                             registry=self.registry)
        self.m_passes = Gauge("omnicore_engine_passes", "engine passes by state (active: in the "
                              "engine's packed iterations; waiting: queued)", ["state"],
                              registry=self.registry)
        self.m_tokens = Histogram("omnicore_engine_tokens_per_iteration", "tokens packed into one "
                                  "engine iteration (every row of every pass it ran)",
                                  buckets=TOKEN_BUCKETS, registry=self.registry)
        self.m_ttfb = Histogram("omnicore_ttfb_seconds", "time to the first audio byte",
                                buckets=TTFB_BUCKETS, registry=self.registry)
        self.m_rtf = Histogram("omnicore_rtf", "synthesis seconds per audio second",
                               buckets=RTF_BUCKETS, registry=self.registry)
        self.m_cancelled = Counter("omnicore_streams_cancelled", "streams closed before their end "
                                   "(a client gone, a cancel or barge-in, an error), through any "
                                   "door: their passes were cancelled", registry=self.registry)
        self.m_timeouts = Counter("omnicore_timeouts", "connections closed by the server's clocks: "
                                  "send (the client stopped reading for --send-timeout) or idle "
                                  "(nothing received for --idle-timeout)", ["kind"],
                                  registry=self.registry)
        for kind in ("send", "idle"):
            self.m_timeouts.labels(kind)
        self.m_prompts = Gauge("omnicore_voice_prompts", "library voice prompts asked for "
                               "(lookups) and parsed from their files (loads) since start: each "
                               "file loads once per process, so 1 - loads/lookups is the prompt "
                               "cache's hit rate", ["event"], registry=self.registry)
        # More Prometheus text after this process's own (a Ray Serve replica's: the cluster's
        # voice affinity, ray_serve.py), or None.
        self.metrics_extra = None
        # Every iteration is observed on the engine thread, right after it ran (a scrape-time
        # sample would miss most of them).
        previous = self.engine.trace

        def on_iteration(ids):
            self.m_tokens.observe(self.engine.load().last_tokens)
            if previous is not None:
                previous(ids)
        self.engine.trace = on_iteration

    @property
    def require_consent(self) -> bool:
        """Whether cloned voices need a consent recording's id: the folder's policy, read now
        (VoiceLibrary.require_consent), so every server on the folder keeps it."""
        return self.voices.require_consent

    def voice(self, voice, on_step=None):
        """A request's `voice` -> its prompt (voices.resolve_voice, with the aliases); blocking:
        a preset's first use designs it."""
        return resolve_voice(self.model, self.voices, voice, on_step, self.voice_aliases)

    def check_voice(self, voice) -> None:
        """A 404 now, before admission, for a `voice` that is neither a library voice, a preset
        nor an alias (voices.check_voice), and a 409 for a voice another codec made;
        blocking: it reads the folder."""
        check_voice(self.voices, voice, self.voice_aliases, self.model)

    async def in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # -- admission ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def slot(self, gone: asyncio.Future):
        """Admission as one block: count the request in (429 when max_queue are in flight), wait
        for a run slot (a client that leaves meanwhile never runs: CancelledError), and give
        both back when the block ends, however it ends, unless the slot was handed over."""
        await self._admit(gone)
        held = Slot(self, gone)
        with self._lock:
            self._slots.add(held)
        if self._stopped:  # admitted from the run-slot queue after stop_all: it never runs
            held.release()
            raise shutting_down()
        try:
            yield held
        finally:
            if not held.handed_over:
                held.release()

    async def _admit(self, gone: asyncio.Future) -> None:
        with self._lock:
            if self.draining:
                raise shutting_down()
            if self.warming:
                raise warming_up()
            if self._in_flight >= self.max_queue:
                raise HTTPError(429, f"the server is busy ({self.max_queue} requests in flight); "
                                     "retry shortly", None, "queue_full", {"Retry-After": "1"})
            self._in_flight += 1
            self.m_in_flight.set(self._in_flight)
        if self.run_slots is None:
            return
        with self._lock:
            self._slot_waiting += 1
        slot = asyncio.ensure_future(self.run_slots.acquire())
        try:
            await asyncio.wait({slot, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not slot.done():
                raise CancelledError("the client disconnected while waiting for a run slot")
        except BaseException:  # it never ran: give back whatever it holds
            if not slot.done():
                slot.cancel()
                await asyncio.gather(slot, return_exceptions=True)
            if slot.done() and not slot.cancelled():
                self.run_slots.release()
            self._leave()
            raise
        finally:
            with self._lock:
                self._slot_waiting -= 1

    def _release(self, slot: Slot) -> None:
        """Undo a successful `_admit` (through Slot.release only)."""
        with self._lock:
            self._slots.discard(slot)
        if self.run_slots is not None:
            self.run_slots.release()
        self._leave()

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self.m_in_flight.set(self._in_flight)

    # -- start-up -------------------------------------------------------------------------------

    def warm_up_in_background(self) -> threading.Thread:
        """Warm up (`warm_up`) in a thread while the port is open: /health and speech requests
        say "warming up" (503 with Retry-After) until it is done, so that no client waits for a
        compile or for its voice to be made, and the log says how long it took."""
        self.warming = True

        def run():
            try:
                self.warm_up(logging.getLogger("uvicorn.error"))
            finally:
                self.warming = False
        thread = threading.Thread(target=run, name="omnicore-warmup", daemon=True)
        thread.start()
        return thread

    def warm_up(self, log) -> None:
        """Get ready (blocking), saying what it does and how long it took: compile the kernels
        (omnicore.machinery.warmup), measure the machine's rate unless it is known, and make
        the door's default voice and its aliases' targets where the library lacks them
        (voices.make_presets: "making voice alloy: about N s, once"), then "Ready". What a
        front door without a health probe (Wyoming, MCP) does before it listens. From here on,
        for the server's life, the log says when a kernel compiles ("compiling kernels, once
        per machine: about N s"), as a request that meets one would wait for it."""
        from ...machinery.warmup import CompileWatch, measure_rate, measured_rate, warm_up

        if self._compiles is None:
            self._compiles = CompileWatch(log.info).__enter__()  # closed in close()
        t0 = time.perf_counter()
        try:
            done = warm_up(self.model)
            if done.seconds:
                log.info("Kernels: %d compiled in %.1f s (warm-up %.1f s)", done.compiled,
                         done.compile_s, done.total_s)
            if measured_rate(self.model) is None:
                log.info("Rate: %.0f GFLOP/s measured (kept beside the kernel cache)",
                         measure_rate(self.model, keep=write_bytes_atomic) / 1e9)
        except Exception:  # serve anyway: each request then reports what is wrong
            log.exception("Warm-up failed; serving without it")
        try:
            made = make_presets(self.model, self.voices, self.startup_voices, log.info)
        except Exception:  # the first request for it makes it, or says what is wrong
            log.exception("Making the default voice failed; its first request makes it")
            made = []
        log.info("Ready in %.1f s%s", time.perf_counter() - t0,
                 f" (made {', '.join(made)})" if made else
                 "" if not self.startup_voices else
                 f" ({', '.join(self.startup_voices)} made before)")

    # -- shutdown -------------------------------------------------------------------------------

    def drain(self) -> None:
        """Admit nothing more (503 with Retry-After); what is in flight goes on."""
        with self._lock:
            self.draining = True

    def stop_all(self) -> int:
        """Stop every admitted request now (see Slot.stop); returns how many."""
        with self._lock:
            self._stopped = True
            slots = list(self._slots)
        for slot in slots:
            slot.stop()
        return len(slots)

    def close(self, timeout: float = 30.0) -> bool:
        """After stop_all: wait (up to `timeout` s in all) for the worker threads to end and the
        engine to hold no pass. Blocking; True when everything stopped in time."""
        deadline = time.monotonic() + timeout
        if self._compiles is not None:
            self._compiles.__exit__(None, None, None)
        pool = threading.Thread(target=self.pool.shutdown, kwargs={"cancel_futures": True},
                                name="omnicore-serve-close", daemon=True)
        pool.start()
        pool.join(timeout)
        while True:
            ld = self.engine.load()
            idle = ld.active_passes + ld.waiting_passes == 0
            if idle or time.monotonic() > deadline:
                return idle and not pool.is_alive()
            time.sleep(0.01)

    # -- auth and load --------------------------------------------------------------------------

    def authorized(self, header: str | None) -> bool:
        """`Authorization: Bearer KEY` with the server's key (always true without one). The
        keys are compared as SHA-256 digests in constant time: neither the key's characters
        nor its length show in the timing."""
        if self.api_key is None:
            return True
        scheme, _, token = (header or "").strip().partition(" ")
        got = hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()
        want = hashlib.sha256(self.api_key.encode("utf-8", "surrogateescape")).digest()
        return hmac.compare_digest(got, want) and scheme.lower() == "bearer"

    def load(self) -> dict:
        """Requests in flight and queued, and the engine's own view (Engine.load). The slots
        are read first: a stream's passes leave the engine before its slot comes back, so a
        cut stream never shows as passes beside a free slot."""
        with self._lock:
            in_flight, slot_waiting = self._in_flight, self._slot_waiting
        ld = self.engine.load()
        queued = slot_waiting + ld.waiting_requests
        return {"in_flight": in_flight, "queued": queued,
                "engine_passes": ld.active_passes + ld.waiting_passes, "engine": asdict(ld)}
