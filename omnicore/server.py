"""`omnicore serve`: an OpenAI-compatible speech server (Starlette + uvicorn, the `server` extra).

One process, one model, one engine: every request's synthesis runs in a worker thread and the
model's engine packs the passes of all concurrent requests into shared forwards, so requests are
batched continuously instead of serialised.

    POST /v1/audio/speech      OpenAI's fields (+ language, num_step, guidance_scale, seed,
                               duration, normalize_text, denoise and generation knobs)
    GET/POST /v1/voices        the voice library (clone from a clip, or a designed voice kept)
    GET/DELETE /v1/voices/{id}
    GET /v1/models, /health, /metrics

Voices are omnicore voice prompts (.npz, written atomically) in the voices folder. The OpenAI
preset names map to designed voices (PRESET_VOICES: instruct + seed); each is generated once on
first use, and its codes are kept as the voice, so every later call speaks with that speaker.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import io
import json
import re
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import audio, text as text_mod
from .errors import AudioError, CancelledError, ConfigError, InputError, OmniCoreError, VoicePromptError

SAMPLE_RATE = 24000
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
    """Whole audio -> bytes of `fmt`; pcm is audio.to_pcm16's samples, the rest via libsndfile."""
    if fmt == "pcm":
        return audio.to_pcm16(wav).tobytes()
    import soundfile as sf

    container, subtype, _ = FORMATS[fmt]
    buf = io.BytesIO()
    data = np.clip(np.asarray(wav, np.float32), -1.0, 1.0)
    sf.write(buf, data, sr, format=container, subtype=subtype)
    return buf.getvalue()


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
            "frames": int(codes.shape[1]), "seconds": codes.shape[1] / text_mod.FRAME_RATE,
            "preset": PRESET_VOICES.get(name, (None,))[0]}


class Server:
    """The state behind the routes: model, voices, bounded in-flight count, metrics."""

    def __init__(self, model, voices_dir=None, api_key: str | None = None, max_queue: int = 16,
                 model_name: str = "omnivoice", max_concurrency: int | None = None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.model = model
        self.voices = VoiceLibrary(voices_dir)
        self.api_key = api_key or None
        self.max_queue = max_queue
        # Requests synthesising at once (None: all admitted ones; the engine packs them). 1 is
        # the one-at-a-time server that benchmarks compare the engine with.
        self.run_slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.model_name = model_name
        self.pool = ThreadPoolExecutor(max_workers=max_queue + 4, thread_name_prefix="omnicore-serve")
        self._in_flight = 0
        self._lock = threading.Lock()
        self.registry = CollectorRegistry()
        self.m_requests = Counter("omnicore_requests", "HTTP requests by route and status",
                                  ["route", "status"], registry=self.registry)
        self.m_in_flight = Gauge("omnicore_requests_in_flight", "speech requests admitted",
                                 registry=self.registry)
        self.m_passes = Gauge("omnicore_engine_passes", "engine passes active or waiting",
                              registry=self.registry)
        self.m_ttfb = Histogram("omnicore_ttfb_seconds", "time to the first audio byte",
                                buckets=(.05, .1, .25, .5, 1, 2, 5, 10, 30, 60), registry=self.registry)
        self.m_rtf = Histogram("omnicore_rtf", "synthesis seconds per audio second",
                               buckets=(.05, .1, .25, .5, 1, 2, 5, 10), registry=self.registry)
        self.m_cancelled = Counter("omnicore_streams_cancelled", "streams closed before their end "
                                   "(client gone or an error): their passes were cancelled", registry=self.registry)

    # -- admission ------------------------------------------------------------------------------

    async def admit(self) -> None:
        """Count the request in (429 when max_queue are in flight), then wait for a run slot."""
        with self._lock:
            if self._in_flight >= self.max_queue:
                raise HTTPError(429, f"the server is busy ({self.max_queue} requests in flight); "
                                     "retry shortly", None, "queue_full", {"Retry-After": "1"})
            self._in_flight += 1
            self.m_in_flight.set(self._in_flight)
        if self.run_slots is not None:
            try:
                await self.run_slots.acquire()
            except BaseException:  # cancelled while waiting: it never ran
                self._leave()
                raise

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self.m_in_flight.set(self._in_flight)

    def release(self) -> None:
        """Undo a successful `admit`."""
        if self.run_slots is not None:
            self.run_slots.release()
        self._leave()

    def engine_passes(self) -> int:
        eng = getattr(self.model, "_engine", None)
        if eng is None:
            return 0
        return len(getattr(eng, "_active", ())) + len(getattr(eng, "_waiting", ()))

    # -- voices ---------------------------------------------------------------------------------

    def designed_voice(self, instruct: str, seed: int, language=None, sample: str | None = None,
                       cancelled: threading.Event | None = None, num_step: int = 32):
        """Generate a sample once (seeded: the same inputs make the same voice) and keep its
        codes as a voice."""
        from .script import voice_from_synthesis

        result = self.model.synthesize(sample or PRESET_SAMPLE_TEXT, instruct=instruct, seed=seed,
                                       language=language, num_step=num_step,
                                       on_step=_cancel_check(cancelled))[0]
        return voice_from_synthesis(result)

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
    if len(inp) > text_mod.MAX_TEXT_CHARS:
        raise HTTPError(400, f"input is {len(inp):,} characters; the limit is "
                             f"{text_mod.MAX_TEXT_CHARS:,}", "input", "input_too_long")
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
                    if needs_auth and server.api_key is not None:
                        got = request.headers.get("authorization", "")
                        want = f"Bearer {server.api_key}"
                        if not hmac.compare_digest(got.encode(), want.encode()):
                            raise HTTPError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                            None, "invalid_api_key")
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

    async def until_done(request: Request, fut, cancelled: threading.Event):
        """Wait for a worker-thread result; a client that disconnects cancels its passes."""
        while True:
            done, _ = await asyncio.wait({fut}, timeout=0.25)
            if done:
                return fut.result()
            if await request.is_disconnected():
                cancelled.set()

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
        await server.admit()
        released = False
        try:
            t0 = time.perf_counter()
            cancelled = threading.Event()
            prompt = None
            if req["voice"] is not None:
                prompt = await until_done(request, asyncio.wrap_future(server.pool.submit(
                    server.resolve_voice, req["voice"], cancelled)), cancelled)
            kw = synth_kwargs(req, prompt)
            if req["stream_format"] is None:
                def work():
                    r = server.model.synthesize(req["input"], on_step=_cancel_check(cancelled), **kw)[0]
                    return r, encode_audio(r.audio, req["format"])
                result, data = await until_done(
                    request, asyncio.wrap_future(server.pool.submit(work)), cancelled)
                total = time.perf_counter() - t0
                secs = len(result.audio) / SAMPLE_RATE
                server.m_ttfb.observe(total)
                server.m_rtf.observe(total / max(secs, 1e-9))
                timings = dict(result.timings, total=total)
                headers = {"X-Omnicore-Timings": ", ".join(f"{k}={v:.4f}" for k, v in timings.items()),
                           "X-Omnicore-Audio-Seconds": f"{secs:.3f}"}
                return Response(data, 200, headers, media_type=FORMATS[req["format"]][2])
            # Streams: the model starts here (argument errors are a 400 before any byte leaves).
            whole = req["format"] not in ("wav", "pcm") and req["stream_format"] == "audio"
            stream = await in_thread(lambda: server.model.stream(req["input"], **kw))
            released = True  # the generator owns the slot from here
            return stream_response(req, stream, whole, t0)
        finally:
            if not released:
                server.release()

    def stream_response(req, stream, whole: bool, t0: float):
        from sse_starlette.sse import EventSourceResponse

        async def pieces():
            """float32 pieces from the SpeechStream, read in a worker thread; closing it on the
            way out (client gone, error, end) cancels the remaining passes."""
            first, ended = True, False
            try:
                while True:
                    x = await in_thread(next, stream, None)
                    if x is None:
                        ended = True
                        return
                    if first:
                        server.m_ttfb.observe(time.perf_counter() - t0)
                        first = False
                    yield x
            finally:
                if not ended:
                    server.m_cancelled.inc()
                # Not awaited: a cancelled task cannot await; close() stops the passes.
                server.pool.submit(stream.close)

        async def audio_body():
            try:
                if whole:
                    parts = [x async for x in pieces()]
                    wav = np.concatenate(parts) if parts else np.zeros(0, np.float32)
                    yield await in_thread(encode_audio, wav, req["format"])
                    return
                if req["format"] == "wav":
                    yield wav_stream_header()
                async for x in pieces():
                    yield audio.to_pcm16(x).tobytes()
            finally:
                server.release()

        async def sse_body():
            n = 0
            try:
                async for x in pieces():
                    n += len(x)
                    pcm = audio.to_pcm16(x).tobytes()
                    yield {"data": json.dumps({"type": "speech.audio.delta",
                                               "audio": base64.b64encode(pcm).decode("ascii")})}
                yield {"data": json.dumps({"type": "speech.audio.done",
                                           "usage": {"input_tokens": 0, "output_tokens": 0,
                                                     "total_tokens": 0},
                                           "audio_seconds": n / SAMPLE_RATE})}
            except OmniCoreError as exc:
                yield {"event": "error", "data": json.dumps(error_body(400, str(exc)))}
            finally:
                server.release()

        headers = {"X-Omnicore-Timings": f"start={time.perf_counter() - t0:.4f}"}
        if req["stream_format"] == "sse":
            return EventSourceResponse(sse_body(), headers=headers, ping=600)
        media = "audio/pcm" if req["format"] == "pcm" else FORMATS[req["format"]][2]
        return StreamingResponse(audio_body(), media_type=media, headers=headers)

    @route("voices")
    async def voices_list(request: Request):
        data = [describe_voice(n, server.voices.get(n)) for n in server.voices.names()]
        presets = [{"id": n, "object": "voice", "name": n, "preset": ins, "seed": seed,
                    "created": False} for n, (ins, seed) in PRESET_VOICES.items()
                   if server.voices.get(n) is None]
        return JSONResponse({"object": "list", "data": data + presets})

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
                name = VoiceLibrary.check_name(form.get("name"))
                ref_text = form.get("ref_text")
                upload = form.get("audio")
                if upload is None or isinstance(upload, str):
                    raise HTTPError(400, "multipart field 'audio' (a file) is required", "audio")
                if not isinstance(ref_text, str) or not ref_text.strip():
                    raise HTTPError(400, "multipart field 'ref_text' (the clip's transcript) is "
                                         "required", "ref_text")
                data = await upload.read()
            if server.voices.get(name) is not None:
                raise HTTPError(409, f"voice {name!r} already exists; DELETE it first", "name",
                                "voice_exists")

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
            name = VoiceLibrary.check_name(body.get("name"))
            instruct = _field(body, "instruct", str, None)
            if not instruct:
                raise HTTPError(400, "a designed voice needs 'instruct' (or upload a clip as "
                                     "multipart name + audio + ref_text)", "instruct")
            seed = _field(body, "seed", int, 0, check=lambda v: v >= 0)
            language = _field(body, "language", str, None)
            sample = _field(body, "text", str, None)
            num_step = _field(body, "num_step", int, 32, check=lambda v: 1 <= v <= 1000)
            if server.voices.get(name) is not None:
                raise HTTPError(409, f"voice {name!r} already exists; DELETE it first", "name",
                                "voice_exists")

            def work():
                return server.designed_voice(instruct, seed, language, sample, cancelled, num_step)
        await server.admit()
        try:
            prompt = await until_done(request, asyncio.wrap_future(server.pool.submit(work)), cancelled)
        finally:
            server.release()
        server.voices.add(name, prompt)
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
        return JSONResponse({"status": "ok", "in_flight": server._in_flight,
                             "engine_passes": server.engine_passes()})

    @route("metrics", needs_auth=False)
    async def metrics(request: Request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        server.m_passes.set(server.engine_passes())
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


def serve(model_path: str, host: str = "127.0.0.1", port: int = 8000, voices_dir=None,
          api_key: str | None = None, max_queue: int = 16, log_level: str = "warning",
          max_concurrency: int | None = None) -> None:
    """Load the model once and serve until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise ConfigError("the server needs its extra: pip install 'omnicore[server]'") from None
    from . import OmniVoice

    model = OmniVoice.from_pretrained(model_path)
    server = Server(model, voices_dir, api_key, max_queue, model_name=Path(str(model_path)).name,
                    max_concurrency=max_concurrency)
    uvicorn.run(create_app(server), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=5)
