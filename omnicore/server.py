"""`omnicore serve`: an OpenAI-compatible speech server (Starlette + uvicorn, the `server` extra).

One process, one model, one engine: every request's synthesis runs in a worker thread and the
model's engine packs the passes of all concurrent requests into shared forwards, so requests are
batched continuously instead of serialised.

    POST /v1/audio/speech      OpenAI's fields (+ language, num_step, guidance_scale, seed,
                               duration, normalize_text, denoise and generation knobs)
    GET/POST /v1/voices        the voice library (clone from a clip, or a designed voice kept)
    GET/DELETE /v1/voices/{id}
    GET /v1/models, /health, /metrics
    /ui                        the Gradio demo on the same model (--ui)

Voices are omnicore voice prompts (.npz, written atomically) in the voices folder. The OpenAI
preset names map to designed voices (PRESET_VOICES: instruct + seed); each is generated once on
first use, and its codes are kept as the voice, so every later call speaks with that speaker.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
import json
import re
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .audio import writers
from .errors import AudioError, CancelledError, ConfigError, InputError, OmniCoreError, VoicePromptError
from .model.config import FRAME_RATE, SAMPLE_RATE
from .text import limits

MAX_BODY_BYTES = 1 * 2**20       # a JSON speech request: text is capped at MAX_TEXT_CHARS anyway
MAX_UPLOAD_BYTES = 20 * 2**20    # a reference clip (a 30 s 48 kHz stereo float WAV is ~11 MB)
VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
FORMATS = {"wav": ("WAV", "PCM_16", "audio/wav"), "flac": ("FLAC", "PCM_16", "audio/flac"),
           "mp3": ("MP3", "MPEG_LAYER_III", "audio/mpeg"), "opus": ("OGG", "OPUS", "audio/ogg"),
           "pcm": (None, None, "audio/pcm")}
# Documented designed voices behind OpenAI's preset names: made once on first use, then stored.
PRESET_SAMPLE_TEXT = "Hello! It is a pleasure to meet you, and I hope you have a wonderful day."
PRESET_VOICES = {
    "alloy": ("female, young adult, moderate pitch, american accent", 11),
    "ash": ("male, middle-aged, low pitch, american accent", 12),
    "ballad": ("male, young adult, moderate pitch, british accent", 13),
    "coral": ("female, young adult, high pitch, american accent", 14),
    "echo": ("male, young adult, moderate pitch, american accent", 15),
    "fable": ("male, middle-aged, moderate pitch, british accent", 16),
    "nova": ("female, young adult, moderate pitch, british accent", 17),
    "onyx": ("male, middle-aged, very low pitch, american accent", 18),
    "sage": ("female, middle-aged, low pitch, american accent", 19),
    "shimmer": ("female, young adult, very high pitch, american accent", 20),
    "verse": ("male, teenager, moderate pitch, american accent", 21),
}
# Tokens packed into one engine iteration: from one short pass to the default budget's order.
TOKEN_BUCKETS = tuple(2 ** k for k in range(5, 17))
# Speech-request fields passed through to the generation config (numbers checked there).
_GEN_FIELDS = ("num_step", "guidance_scale", "t_shift", "layer_penalty_factor",
               "position_temperature", "class_temperature", "denoise", "postprocess_output")


class HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def error_body(status: int, message: str, param=None, code=None) -> dict:
    kind = ("invalid_request_error" if status < 500 else "server_error")
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def wav_stream_header(sr: int = SAMPLE_RATE) -> bytes:
    """A 16-bit mono WAV header whose sizes are unknown (0xFFFFFFFF): what streaming players
    accept for audio whose length is not known when the first bytes leave."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sr, sr * 2, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


def encode_audio(wav: np.ndarray, fmt: str, sr: int = SAMPLE_RATE) -> bytes:
    """Whole audio -> bytes of `fmt`; pcm is writers.to_pcm16's samples, the rest via libsndfile."""
    if fmt == "pcm":
        return writers.to_pcm16(wav).tobytes()
    import soundfile as sf

    container, subtype, _ = FORMATS[fmt]
    buf = io.BytesIO()
    data = np.clip(np.asarray(wav, np.float32), -1.0, 1.0)
    sf.write(buf, data, sr, format=container, subtype=subtype)
    return buf.getvalue()


class _Sink:
    """A seekable in-memory file for libsndfile that notes a write before `given`, the bytes
    already handed out (a stream cannot take those back)."""

    def __init__(self):
        self.buf, self.pos, self.given, self.rewrote = bytearray(), 0, 0, False

    def write(self, data) -> int:
        data = bytes(data)
        self.rewrote |= self.pos < self.given
        self.buf[self.pos:self.pos + len(data)] = data
        self.pos += len(data)
        return len(data)

    def read(self, n: int = -1) -> bytes:
        end = len(self.buf) if n is None or n < 0 else self.pos + n
        data = bytes(self.buf[self.pos:end])
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset + (0, self.pos, len(self.buf))[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos


class OpusStream:
    """Ogg Opus encoded piece by piece: libsndfile writes its pages as they fill and never goes
    back, so the bytes handed out so far are those of the whole file. (Its mp3 and flac writers
    rewrite their header at the end, and a header left as first written makes libsndfile misjudge
    the length: those formats are encoded whole.)"""

    def __init__(self, sr: int = SAMPLE_RATE):
        import soundfile as sf

        container, subtype, _ = FORMATS["opus"]
        self._sink = _Sink()
        self._file = sf.SoundFile(self._sink, "w", sr, 1, format=container, subtype=subtype)

    def _take(self) -> bytes:
        if self._sink.rewrote:
            raise AudioError("the opus encoder rewrote bytes that were already sent")
        data = bytes(self._sink.buf[self._sink.given:])
        self._sink.given = len(self._sink.buf)
        return data

    def write(self, wav: np.ndarray) -> bytes:
        """Encode a piece; returns the bytes that are final now (maybe none)."""
        self._file.write(np.clip(np.asarray(wav, np.float32), -1.0, 1.0))
        return self._take()

    def close(self) -> bytes:
        """The rest of the file."""
        self._file.close()
        return self._take()


class VoiceLibrary:
    """Named voice prompts in a folder (`<name>.npz`, or a `<name>.pt` saved by the reference's
    VoiceClonePrompt.save), loaded at start; thread-safe. New voices are written as .npz."""

    def __init__(self, folder: str | Path | None):
        from .voice import VoiceClonePrompt

        self._cls = VoiceClonePrompt
        self.folder = Path(folder) if folder else None
        self._voices: dict[str, object] = {}
        self._lock = threading.Lock()
        self._making: dict[str, threading.Lock] = {}
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            # .pt first, so an .npz of the same name (omnicore's own) wins
            for p in sorted(self.folder.glob("*.pt")) + sorted(self.folder.glob("*.npz")):
                if VOICE_NAME.match(p.stem):
                    try:
                        self._voices[p.stem] = VoiceClonePrompt.load(p)
                    except VoicePromptError:
                        pass  # an unreadable file is skipped, not fatal: it stays for inspection

    @staticmethod
    def check_name(name) -> str:
        if not isinstance(name, str) or not VOICE_NAME.match(name):
            raise HTTPError(400, "voice name must be 1-64 characters of letters, digits, '_' or "
                                 "'-', starting with a letter or digit", "name", "invalid_voice_name")
        return name

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._voices)

    def get(self, name: str):
        with self._lock:
            return self._voices.get(name)

    def add(self, name: str, prompt) -> None:
        with self._lock:
            if name in self._voices:
                raise HTTPError(409, f"voice {name!r} already exists; DELETE it first to replace it",
                                "name", "voice_exists")
            if self.folder is not None:
                prompt.save(self.folder / f"{name}.npz")
            self._voices[name] = prompt

    def delete(self, name: str) -> bool:
        with self._lock:
            if self._voices.pop(name, None) is None:
                return False
            if self.folder is not None:
                for ext in (".npz", ".pt"):
                    (self.folder / f"{name}{ext}").unlink(missing_ok=True)
            return True

    def making_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._making.setdefault(name, threading.Lock())


def describe_voice(name: str, prompt) -> dict:
    codes = np.asarray(prompt.ref_audio_tokens)
    return {"id": name, "object": "voice", "name": name, "ref_text": prompt.ref_text,
            "frames": int(codes.shape[1]), "seconds": codes.shape[1] / FRAME_RATE,
            "preset": PRESET_VOICES.get(name, (None,))[0]}


class Server:
    """The state behind the routes: model, voices, bounded in-flight count, metrics."""

    def __init__(self, model, voices_dir=None, api_key: str | None = None, max_queue: int = 16,
                 model_name: str = "omnivoice", max_concurrency: int | None = None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.model = model
        self.engine = model.engine
        self.voices = VoiceLibrary(voices_dir)
        self.api_key = api_key or None
        self.max_queue = max_queue
        # Requests synthesising at once (None: all admitted ones; the engine packs them). 1 is
        # the one-at-a-time server that benchmarks compare the engine with.
        self.run_slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.model_name = model_name
        self.pool = ThreadPoolExecutor(max_workers=max_queue + 4, thread_name_prefix="omnicore-serve")
        self._in_flight = 0
        self._slot_waiting = 0  # admitted, waiting for a run slot
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
                                buckets=(.05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 120, 300),
                                registry=self.registry)
        # Up to 50: full size on a few CPU cores runs at RTF 4-16.
        self.m_rtf = Histogram("omnicore_rtf", "synthesis seconds per audio second",
                               buckets=(.05, .1, .25, .5, 1, 2, 5, 10, 20, 50), registry=self.registry)
        self.m_cancelled = Counter("omnicore_streams_cancelled", "streams closed before their end "
                                   "(client gone or an error): their passes were cancelled", registry=self.registry)
        # Every iteration is observed on the engine thread, right after it ran (a scrape-time
        # sample would miss most of them).
        previous = self.engine.trace

        def on_iteration(ids):
            self.m_tokens.observe(self.engine.load().last_tokens)
            if previous is not None:
                previous(ids)
        self.engine.trace = on_iteration

    # -- admission ------------------------------------------------------------------------------

    async def admit(self, gone: "asyncio.Future | None" = None) -> None:
        """Count the request in (429 when max_queue are in flight), then wait for a run slot;
        a client that leaves while it waits (`gone` done) never runs (CancelledError)."""
        with self._lock:
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
            await asyncio.wait({slot} | ({gone} if gone is not None else set()),
                               return_when=asyncio.FIRST_COMPLETED)
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

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self.m_in_flight.set(self._in_flight)

    def release(self) -> None:
        """Undo a successful `admit`."""
        if self.run_slots is not None:
            self.run_slots.release()
        self._leave()

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
        """Requests in flight and queued, and the engine's own view (Engine.load)."""
        ld = self.engine.load()
        with self._lock:
            in_flight, queued = self._in_flight, self._slot_waiting + ld.waiting_requests
        return {"in_flight": in_flight, "queued": queued,
                "engine_passes": ld.active_passes + ld.waiting_passes, "engine": asdict(ld)}

    # -- voices ---------------------------------------------------------------------------------

    def designed_voice(self, instruct: str, seed: int, language=None, sample: str | None = None,
                       cancelled: threading.Event | None = None, num_step: int = 32):
        """Generate a sample once (seeded: the same inputs make the same voice) and keep its
        codes as a voice."""
        result = self.model.synthesize(sample or PRESET_SAMPLE_TEXT, instruct=instruct, seed=seed,
                                       language=language, num_step=num_step,
                                       on_step=_cancel_check(cancelled))[0]
        return result.as_voice()

    def resolve_voice(self, voice, cancelled=None):
        """A request's `voice` (a name or {"id": name}) -> a VoiceClonePrompt."""
        if isinstance(voice, dict):
            voice = voice.get("id")
        if not isinstance(voice, str) or not voice:
            raise HTTPError(400, "voice must be a voice name or {\"id\": name}", "voice", "invalid_voice")
        prompt = self.voices.get(voice)
        if prompt is not None:
            return prompt
        if voice in PRESET_VOICES:
            with self.voices.making_lock(voice):  # made once, even by concurrent first uses
                prompt = self.voices.get(voice)
                if prompt is None:
                    instruct, seed = PRESET_VOICES[voice]
                    prompt = self.designed_voice(instruct, seed, cancelled=cancelled)
                    self.voices.add(voice, prompt)
                return prompt
        raise HTTPError(404, f"unknown voice {voice!r}; GET /v1/voices lists them", "voice",
                        "voice_not_found")


def _cancel_check(event: threading.Event | None):
    if event is None:
        return None

    def on_step(step: int, total: int) -> None:
        if event.is_set():
            raise CancelledError("the client disconnected")
    return on_step


def _field(body: dict, name: str, types, default=None, *, check=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise HTTPError(400, f"{name} has the wrong type: {v!r}", name, "invalid_type")
    if not isinstance(v, types):
        raise HTTPError(400, f"{name} has the wrong type: {type(v).__name__}", name, "invalid_type")
    if check is not None and not check(v):
        raise HTTPError(400, f"{name} is out of range: {v!r}", name, "invalid_value")
    return v


def parse_speech(body) -> dict:
    """OpenAI's speech body -> checked fields (HTTPError 400 for a client mistake)."""
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    inp = body.get("input")
    if not isinstance(inp, str) or not inp.strip():
        raise HTTPError(400, "input must be a non-empty string", "input", "invalid_input")
    if len(inp) > limits.MAX_TEXT_CHARS:
        raise HTTPError(400, f"input is {len(inp):,} characters; the limit is "
                             f"{limits.MAX_TEXT_CHARS:,}", "input", "input_too_long")
    fmt = _field(body, "response_format", str, "mp3")
    if fmt == "aac":
        raise HTTPError(400, "response_format 'aac' is not available (no AAC encoder here); use "
                             "mp3, opus, flac, wav or pcm", "response_format", "unsupported_format")
    if fmt not in FORMATS:
        raise HTTPError(400, f"unknown response_format {fmt!r}; one of {', '.join(FORMATS)}",
                        "response_format", "invalid_format")
    stream_format = _field(body, "stream_format", str, None)
    if stream_format not in (None, "audio", "sse"):
        raise HTTPError(400, f"stream_format must be 'audio' or 'sse', got {stream_format!r}",
                        "stream_format", "invalid_value")
    speed = _field(body, "speed", (int, float), None, check=lambda v: 0.25 <= v <= 4.0)
    out = {
        "input": inp, "voice": body.get("voice"), "format": fmt, "stream_format": stream_format,
        "instruct": _field(body, "instructions", str, None) or None,
        "speed": None if speed is None or speed == 1 else float(speed),
        "language": _field(body, "language", str, None),
        "seed": _field(body, "seed", int, None, check=lambda v: v >= 0),
        "duration": _field(body, "duration", (int, float), None, check=lambda v: v > 0),
        "normalize_text": _field(body, "normalize_text", bool, False),
        "gen": {},
    }
    for name in _GEN_FIELDS:
        types = bool if name in ("denoise", "postprocess_output") else (
            int if name == "num_step" else (int, float))
        v = _field(body, name, types, None)
        if v is not None:
            out["gen"][name] = v
    return out


def create_app(server: Server):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    def err_response(e: HTTPError) -> JSONResponse:
        return JSONResponse(error_body(e.status, e.message, e.param, e.code), e.status, e.headers)

    def as_http(exc: BaseException) -> HTTPError:
        if isinstance(exc, HTTPError):
            return exc
        if isinstance(exc, (InputError, AudioError, VoicePromptError)):
            return HTTPError(400, str(exc), None, type(exc).__name__)
        if isinstance(exc, ConfigError):
            return HTTPError(400, str(exc), None, "ConfigError")
        if isinstance(exc, CancelledError):
            return HTTPError(499, str(exc), None, "cancelled")
        if isinstance(exc, OmniCoreError):
            return HTTPError(500, str(exc), None, type(exc).__name__)
        return HTTPError(500, f"internal error ({type(exc).__name__})", None, "internal_error")

    def route(name: str, needs_auth: bool = True):
        """Auth, OpenAI-shaped errors (never a traceback), metrics by status."""
        def wrap(fn):
            async def handler(request: Request):
                try:
                    if needs_auth and not server.authorized(request.headers.get("authorization")):
                        raise HTTPError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                        None, "invalid_api_key", {"WWW-Authenticate": "Bearer"})
                    resp = await fn(request)
                except Exception as exc:  # noqa: BLE001 - every failure becomes JSON
                    resp = err_response(as_http(exc))
                server.m_requests.labels(name, str(resp.status_code)).inc()
                return resp
            return handler
        return wrap

    async def read_json(request: Request, limit: int = MAX_BODY_BYTES):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limit:
            raise HTTPError(413, f"request body over {limit:,} bytes", None, "body_too_large")
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise HTTPError(413, f"request body over {limit:,} bytes", None, "body_too_large")
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise HTTPError(400, "the request body is not valid JSON", None, "invalid_json") from None

    async def in_thread(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(server.pool, fn, *args)

    def watch_disconnect(request: Request) -> asyncio.Task:
        """A task that ends the moment the client disconnects (call once the body is read)."""
        async def listen():
            while (await request.receive())["type"] != "http.disconnect":
                pass
        return asyncio.ensure_future(listen())

    async def until_done(gone: asyncio.Task, fut, cancelled: threading.Event):
        """Wait for a worker-thread result; when the client leaves first, `cancelled` makes the
        worker's next step raise CancelledError, which stops its passes (a 499)."""
        await asyncio.wait({fut, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not fut.done():
            cancelled.set()
        return await fut

    def timings_header(timings: dict) -> str:
        return ", ".join(f"{k}={v:.4f}" for k, v in timings.items())

    def synth_kwargs(req: dict, prompt) -> dict:
        kw = dict(language=req["language"], instruct=req["instruct"], speed=req["speed"],
                  seed=req["seed"], duration=req["duration"], normalize_text=req["normalize_text"],
                  **req["gen"])
        if prompt is not None:
            kw["voice_clone_prompt"] = prompt
        return kw

    @route("speech")
    async def speech(request: Request):
        req = parse_speech(await read_json(request))
        t0 = time.perf_counter()  # queueing counts in the latency a client sees
        gone = watch_disconnect(request)
        try:
            await server.admit(gone)
            try:
                return await speak(req, gone, t0)
            except BaseException:
                server.release()
                raise
        finally:
            gone.cancel()  # a stream's response watches the connection itself

    async def speak(req: dict, gone: asyncio.Task, t0: float):
        """The admitted request: a whole file (slot released here) or a stream response (its
        body releases the slot when it ends)."""
        queued = time.perf_counter() - t0
        cancelled = threading.Event()
        prompt = None
        if req["voice"] is not None:
            prompt = await until_done(gone, asyncio.wrap_future(server.pool.submit(
                server.resolve_voice, req["voice"], cancelled)), cancelled)
        kw = synth_kwargs(req, prompt)
        if req["stream_format"] is None:
            def work():
                r = server.model.synthesize(req["input"], on_step=_cancel_check(cancelled), **kw)[0]
                return r, encode_audio(r.audio, req["format"])
            result, data = await until_done(
                gone, asyncio.wrap_future(server.pool.submit(work)), cancelled)
            total = time.perf_counter() - t0
            secs = len(result.audio) / SAMPLE_RATE
            server.m_ttfb.observe(total)
            server.m_rtf.observe(total / max(secs, 1e-9))
            headers = {"X-Omnicore-Timings": timings_header(dict(queue=queued, **result.timings,
                                                                 total=total)),
                       "X-Omnicore-Audio-Seconds": f"{secs:.3f}"}
            resp = Response(data, 200, headers, media_type=FORMATS[req["format"]][2])
            server.release()
            return resp
        # Streams: the model starts here (argument errors are a 400 before any byte leaves).
        stream = await in_thread(lambda: server.model.stream(req["input"], **kw))
        return stream_response(req, stream, t0, queued)

    def stream_response(req, stream, t0: float, queued: float):
        """The stream's body in the response format: wav, pcm and opus leave piece by piece (wav
        with a header of unknown sizes first); mp3 and flac are encoded once, at the end (see
        OpusStream). SSE carries the same bytes, base64, per event."""
        from sse_starlette.sse import EventSourceResponse
        from starlette.background import BackgroundTask

        fmt = req["format"]
        state = {"ttfb": None, "audio_s": 0.0, "ended": False, "finished": False}

        async def finish():
            """Once, whether the body ran to its end, stopped early or never started (a client
            gone before the first byte: then only the response's background task runs): count
            a stream cut short, stop its passes, free its slot."""
            if state["finished"]:
                return
            state["finished"] = True
            if not state["ended"]:
                server.m_cancelled.inc()
            server.pool.submit(stream.close)  # not awaited: a cancelled task cannot await
            server.release()

        async def pieces():
            """float32 pieces from the SpeechStream, read in a worker thread."""
            while True:
                x = await in_thread(next, stream, None)
                if x is None:
                    state["ended"] = True
                    server.m_rtf.observe((time.perf_counter() - t0) / max(state["audio_s"], 1e-9))
                    return
                if state["ttfb"] is None:
                    state["ttfb"] = time.perf_counter() - t0
                    server.m_ttfb.observe(state["ttfb"])
                state["audio_s"] += len(x) / SAMPLE_RATE
                yield x

        async def encoded():
            if fmt == "opus":
                enc = OpusStream()
                async for x in pieces():
                    data = await in_thread(enc.write, x)
                    if data:
                        yield data
                yield await in_thread(enc.close)
                return
            if fmt not in ("wav", "pcm"):
                parts = [x async for x in pieces()]
                wav = np.concatenate(parts) if parts else np.zeros(0, np.float32)
                yield await in_thread(encode_audio, wav, fmt)
                return
            if fmt == "wav":
                yield wav_stream_header()
            async for x in pieces():
                yield writers.to_pcm16(x).tobytes()

        async def audio_body():
            try:
                async for data in encoded():
                    yield data
            finally:
                await finish()

        async def sse_body():
            try:
                async for data in encoded():
                    yield {"data": json.dumps({"type": "speech.audio.delta",
                                               "audio": base64.b64encode(data).decode("ascii")})}
                total = time.perf_counter() - t0
                yield {"data": json.dumps({
                    "type": "speech.audio.done",
                    "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
                    "audio_seconds": state["audio_s"],
                    "timings": {"queue": queued, "ttfb": state["ttfb"], "total": total}})}
            except OmniCoreError as exc:
                yield {"event": "error", "data": json.dumps(error_body(400, str(exc)))}
            finally:
                await finish()

        headers = {"X-Omnicore-Timings": timings_header(
            {"queue": queued, "start": time.perf_counter() - t0})}
        if req["stream_format"] == "sse":
            return EventSourceResponse(sse_body(), headers=headers, ping=600,
                                       background=BackgroundTask(finish))
        media = "audio/pcm" if fmt == "pcm" else FORMATS[fmt][2]
        return StreamingResponse(audio_body(), media_type=media, headers=headers,
                                 background=BackgroundTask(finish))

    @route("voices")
    async def voices_list(request: Request):
        data = [describe_voice(n, server.voices.get(n)) for n in server.voices.names()]
        presets = [{"id": n, "object": "voice", "name": n, "preset": ins, "seed": seed,
                    "created": False} for n, (ins, seed) in PRESET_VOICES.items()
                   if server.voices.get(n) is None]
        return JSONResponse({"object": "list", "data": data + presets})

    def new_voice_name(name) -> str:
        """A valid name that is neither a voice already (409: DELETE it first) nor one of the
        preset names, which stay the documented designed voices."""
        name = VoiceLibrary.check_name(name)
        if name in PRESET_VOICES:
            raise HTTPError(409, f"{name!r} is a preset voice (a documented designed voice); "
                                 "choose another name", "name", "voice_reserved")
        if server.voices.get(name) is not None:
            raise HTTPError(409, f"voice {name!r} already exists; DELETE it first to replace it",
                            "name", "voice_exists")
        return name

    @route("voices")
    async def voices_create(request: Request):
        ctype = request.headers.get("content-type", "")
        cancelled = threading.Event()
        if ctype.startswith("multipart/form-data"):
            size = request.headers.get("content-length")
            if size is None or not size.isdigit() or int(size) > MAX_UPLOAD_BYTES:
                raise HTTPError(413, f"upload over {MAX_UPLOAD_BYTES:,} bytes (or of unknown "
                                     "length)", "audio", "upload_too_large")
            async with request.form(max_files=1, max_fields=8) as form:
                name = new_voice_name(form.get("name"))
                ref_text = form.get("ref_text")
                upload = form.get("audio")
                if upload is None or isinstance(upload, str):
                    raise HTTPError(400, "multipart field 'audio' (a file) is required", "audio")
                if not isinstance(ref_text, str) or not ref_text.strip():
                    raise HTTPError(400, "multipart field 'ref_text' (the clip's transcript) is "
                                         "required", "ref_text")
                data = await upload.read()

            def work():
                import soundfile as sf
                try:
                    wav, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
                except Exception as exc:  # noqa: BLE001 - any undecodable upload is the client's
                    raise AudioError(f"could not decode the uploaded audio: {exc}") from None
                return server.model.create_voice_clone_prompt((wav.T, sr), ref_text=ref_text)
        else:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise HTTPError(400, "the request body must be a JSON object")
            name = new_voice_name(body.get("name"))
            instruct = _field(body, "instruct", str, None)
            if not instruct:
                raise HTTPError(400, "a designed voice needs 'instruct' (or upload a clip as "
                                     "multipart name + audio + ref_text)", "instruct")
            seed = _field(body, "seed", int, 0, check=lambda v: v >= 0)
            language = _field(body, "language", str, None)
            sample = _field(body, "text", str, None)
            num_step = _field(body, "num_step", int, 32, check=lambda v: 1 <= v <= 1000)

            def work():
                return server.designed_voice(instruct, seed, language, sample, cancelled, num_step)
        gone = watch_disconnect(request)
        try:
            await server.admit(gone)
            try:
                prompt = await until_done(gone, asyncio.wrap_future(server.pool.submit(work)),
                                          cancelled)
            finally:
                server.release()
        finally:
            gone.cancel()
        server.voices.add(name, prompt)  # 409 if another request took the name meanwhile
        return JSONResponse(describe_voice(name, prompt), 201)

    @route("voice")
    async def voice_get(request: Request):
        name = VoiceLibrary.check_name(request.path_params["name"])
        prompt = server.voices.get(name)
        if prompt is None:
            raise HTTPError(404, f"unknown voice {name!r}", "voice", "voice_not_found")
        return JSONResponse(describe_voice(name, prompt))

    @route("voice")
    async def voice_delete(request: Request):
        name = VoiceLibrary.check_name(request.path_params["name"])
        if not server.voices.delete(name):
            raise HTTPError(404, f"unknown voice {name!r}", "voice", "voice_not_found")
        return JSONResponse({"id": name, "object": "voice", "deleted": True})

    @route("models")
    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "omnicore"}
            for n in dict.fromkeys([server.model_name, "tts-1", "tts-1-hd", "gpt-4o-mini-tts"])]})

    @route("health", needs_auth=False)
    async def health(request: Request):
        return JSONResponse({"status": "ok", **server.load()})

    @route("metrics", needs_auth=False)
    async def metrics(request: Request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        ld = server.load()
        server.m_queue.set(ld["queued"])
        server.m_passes.labels("active").set(ld["engine"]["active_passes"])
        server.m_passes.labels("waiting").set(ld["engine"]["waiting_passes"])
        return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc):
        code = getattr(exc, "status_code", 404)
        return JSONResponse(error_body(code, f"{request.method} {request.url.path}: not found"
                                       if code == 404 else "method not allowed"), code)

    routes = [
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/voices", voices_list, methods=["GET"]),
        Route("/v1/voices", voices_create, methods=["POST"]),
        Route("/v1/voices/{name:path}", voice_get, methods=["GET"]),
        Route("/v1/voices/{name:path}", voice_delete, methods=["DELETE"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})


def demo_module():
    """The Gradio demo (demo/app.py of the source checkout, beside the package), imported for
    `--ui`; a ConfigError, before any model loads, when it or gradio is missing."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "demo" / "app.py"
    if not path.is_file():
        raise ConfigError(f"--ui serves the demo of a source checkout ({path} is missing): "
                          "install from the repository with pip install -e '.[server,demo]'")
    if importlib.util.find_spec("gradio") is None:
        raise ConfigError("--ui needs the demo extra: pip install -e '.[server,demo]'")
    spec = importlib.util.spec_from_file_location("omnicore_demo_app", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mount_ui(app, server: Server, demo, model_name: str) -> None:
    """The demo's Blocks on the server's own model (one model, one engine: its jobs are packed
    with the API's requests) at /ui. With an API key the page asks for it as the password."""
    import gradio as gr

    def auth(user: str, password: str) -> bool:
        return server.authorized(f"Bearer {password}")
    blocks = demo.build_demo(server.model, model_name, max_queue=server.max_queue)
    gr.mount_gradio_app(app, blocks, path="/ui",
                        auth=auth if server.api_key is not None else None,
                        auth_message="Any user name; the password is the server's API key.",
                        footer_links=["api", "gradio"], **demo.launch_options())


def serve(model_path: str, host: str = "127.0.0.1", port: int = 8000, voices_dir=None,
          api_key: str | None = None, max_queue: int = 16, log_level: str = "warning",
          max_concurrency: int | None = None, ui: bool = False) -> None:
    """Load the model once and serve until interrupted (with `ui`, the demo at /ui too)."""
    try:
        import uvicorn
    except ImportError:
        raise ConfigError("the server needs its extra: pip install 'omnicore[server]'") from None
    from . import OmniVoice

    demo = demo_module() if ui else None
    model = OmniVoice.from_pretrained(model_path)
    name = Path(str(model_path)).name
    server = Server(model, voices_dir, api_key, max_queue, model_name=name,
                    max_concurrency=max_concurrency)
    app = create_app(server)
    if demo is not None:
        mount_ui(app, server, demo, str(model_path))
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
