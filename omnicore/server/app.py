"""The routes of `omnicore serve`: one module-level handler per route, over the one ServerState
(`request.app.state.server`), and `create_app`, the routing table. What every route shares
(the API key, OpenAI-shaped errors, the request counter) is the `route` decorator.

A speech request's path: read and check the body (protocol.parse_speech) -> admission
(`async with server.slot(gone)`) -> its voice (voices.resolve_voice) -> a whole file
(`speak_whole`) or a stream response (`stream_response`, whose body gives the slot back when
the stream ends).

Dimensions: N samples of mono float32 audio at SAMPLE_RATE.
"""

from __future__ import annotations

import base64
import functools
import json
import time
from pathlib import Path

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute

from ..errors import ConfigError, OmniCoreError
from ..model.config import SAMPLE_RATE, GenerationConfig
from .formats import FORMATS, encode_audio, encoded
from .protocol import (MAX_UPLOAD_BYTES, HTTPError, as_http, body_field, error_body, forget,
                       parse_speech, read_json, shutting_down, synth_kwargs, timings_header)
from .state import ServerState, Slot, client_gone
from .stream_input import stream_input
from .uploads import decode_clip
from .voices import PRESET_VOICES, VoiceLibrary, describe_voice, designed_voice, new_voice_name, resolve_voice


def error_response(e: HTTPError) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, e.param, e.code), e.status, e.headers)


def route(name: str, needs_auth=True):
    """A handler with what every route shares: the API key (when `needs_auth`, or when
    `needs_auth(server)` says so), every failure as an OpenAI-shaped JSON error (never a
    traceback, and nothing it held kept alive), the request counted by route and status."""
    def wrap(fn):
        @functools.wraps(fn)
        async def handler(request: Request):
            server: ServerState = request.app.state.server
            try:
                auth = needs_auth(server) if callable(needs_auth) else needs_auth
                if auth:
                    check_key(server, request.headers.get("authorization"))
                resp = await fn(request)
            except Exception as exc:  # noqa: BLE001 - every failure becomes JSON
                resp = error_response(as_http(exc))
                forget(exc)
            server.m_requests.labels(name, str(resp.status_code)).inc()
            return resp
        return handler
    return wrap


def check_key(server: ServerState, header: str | None) -> None:
    if not server.authorized(header):
        raise HTTPError(401, "missing or wrong API key (Authorization: Bearer KEY)", None,
                        "invalid_api_key", {"WWW-Authenticate": "Bearer"})


# -- speech -------------------------------------------------------------------------------------

@route("speech")
async def speech(request: Request):
    """POST /v1/audio/speech: admitted, then a whole file or a stream."""
    server: ServerState = request.app.state.server
    req = parse_speech(await read_json(request))
    t0 = time.perf_counter()  # queueing counts in the latency a client sees
    async with client_gone(request) as gone, server.slot(gone) as slot:
        queued = time.perf_counter() - t0
        prompt = None
        if req["voice"] is not None:
            prompt = await slot.run(resolve_voice, server.model, server.voices, req["voice"],
                                    slot.on_step)
        kw = synth_kwargs(req, prompt)
        if req["stream_format"] is None:
            return await speak_whole(server, slot, req, kw, t0, queued)
        # Streams: the model starts here (argument errors are a 400 before any byte leaves).
        stream = await server.in_thread(lambda: server.model.stream(req["input"], **kw))
        response = stream_response(server, slot, req, stream, t0, queued)
        slot.hand_over()  # from here the stream's body gives the slot back when it ends
        return response


async def speak_whole(server: ServerState, slot: Slot, req: dict, kw: dict, t0: float,
                      queued: float) -> Response:
    """The whole audio in the response format, with its timings in headers."""
    def work():
        r = server.model.synthesize(req["input"], on_step=slot.on_step, **kw)[0]
        return r, encode_audio(r.audio, req["format"])
    result, data = await slot.run(work)
    total = time.perf_counter() - t0
    secs = len(result.audio) / SAMPLE_RATE
    server.m_ttfb.observe(total)
    server.m_rtf.observe(total / max(secs, 1e-9))
    headers = {"X-Omnicore-Timings": timings_header(dict(queue=queued, **result.timings,
                                                         total=total)),
               "X-Omnicore-Audio-Seconds": f"{secs:.3f}"}
    return Response(data, 200, headers, media_type=FORMATS[req["format"]][2])


def stream_response(server: ServerState, slot: Slot, req: dict, stream, t0: float, queued: float):
    """The stream's body in the response format: wav, pcm and opus leave piece by piece (wav
    with a header of unknown sizes first); mp3 and flac are encoded once, at the end (see
    OpusStream). SSE carries the same bytes, base64, per event. The body releases `slot`."""
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
        slot.release()

    async def pieces():
        """float32 pieces [N] from the SpeechStream, read in a worker thread; a stream the
        server stops (shutdown) ends with its 503, not as if the audio were complete."""
        while True:
            x = await server.in_thread(next, stream, None)
            if slot.stopping:
                raise shutting_down()
            if x is None:
                state["ended"] = True
                server.m_rtf.observe((time.perf_counter() - t0) / max(state["audio_s"], 1e-9))
                return
            if state["ttfb"] is None:
                state["ttfb"] = time.perf_counter() - t0
                server.m_ttfb.observe(state["ttfb"])
            state["audio_s"] += len(x) / SAMPLE_RATE
            yield x

    async def audio_body():
        try:
            async for data in encoded(fmt, pieces(), server.in_thread):
                yield data
        finally:
            await finish()

    async def sse_body():
        try:
            async for data in encoded(fmt, pieces(), server.in_thread):
                yield {"data": json.dumps({"type": "speech.audio.delta",
                                           "audio": base64.b64encode(data).decode("ascii")})}
            total = time.perf_counter() - t0
            yield {"data": json.dumps({
                "type": "speech.audio.done",
                "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
                "audio_seconds": state["audio_s"],
                "timings": {"queue": queued, "ttfb": state["ttfb"], "total": total}})}
        except (OmniCoreError, HTTPError) as exc:
            e = as_http(exc)
            yield {"event": "error", "data": json.dumps(error_body(e.status, e.message, e.param,
                                                                   e.code))}
        finally:
            await finish()

    slot.on_stop(lambda: server.pool.submit(stream.close))  # wakes the body's next()
    headers = {"X-Omnicore-Timings": timings_header(
        {"queue": queued, "start": time.perf_counter() - t0})}
    if req["stream_format"] == "sse":
        return EventSourceResponse(sse_body(), headers=headers, ping=600,
                                   background=BackgroundTask(finish))
    media = "audio/pcm" if fmt == "pcm" else FORMATS[fmt][2]
    return StreamingResponse(audio_body(), media_type=media, headers=headers,
                             background=BackgroundTask(finish))


# -- voices -------------------------------------------------------------------------------------

@route("voices")
async def voices_list(request: Request):
    """GET /v1/voices: the library's voices, then the presets not made yet."""
    voices = request.app.state.server.voices
    data = [describe_voice(n, voices.get(n)) for n in voices.names()]
    presets = [{"id": n, "object": "voice", "name": n, "preset": ins, "seed": seed,
                "created": False} for n, (ins, seed) in PRESET_VOICES.items()
               if voices.get(n) is None]
    return JSONResponse({"object": "list", "data": data + presets})


@route("voices")
async def voices_create(request: Request):
    """POST /v1/voices: a clone of an uploaded clip (multipart name + audio + ref_text) or a
    designed voice (JSON name + instruct), made in an admitted slot like a speech request."""
    server: ServerState = request.app.state.server
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        name, work = await clip_voice_request(request, server)
    else:
        name, work = designed_voice_request(await read_json(request), server)
    async with client_gone(request) as gone, server.slot(gone) as slot:
        prompt = await slot.run(work, slot.on_step)
    server.voices.add(name, prompt)  # 409 if another request took the name meanwhile
    return JSONResponse(describe_voice(name, prompt), 201)


async def clip_voice_request(request: Request, server: ServerState):
    """A multipart upload -> (name, work(on_step) -> the clip's voice prompt)."""
    size = request.headers.get("content-length")
    if size is None or not size.isdigit() or int(size) > MAX_UPLOAD_BYTES:
        raise HTTPError(413, f"upload over {MAX_UPLOAD_BYTES:,} bytes (or of unknown "
                             "length)", "audio", "upload_too_large")
    async with request.form(max_files=1, max_fields=8) as form:
        name = new_voice_name(server.voices, form.get("name"))
        ref_text = form.get("ref_text")
        upload = form.get("audio")
        if upload is None or isinstance(upload, str):
            raise HTTPError(400, "multipart field 'audio' (a file) is required", "audio")
        if not isinstance(ref_text, str) or not ref_text.strip():
            raise HTTPError(400, "multipart field 'ref_text' (the clip's transcript) is "
                                 "required", "ref_text")
        data = await upload.read()

    def work(on_step):
        wav, sr = decode_clip(data)  # [C, N]: checked by its header before decoding
        return server.model.create_voice_clone_prompt((wav, sr), ref_text=ref_text)
    return name, work


def designed_voice_request(body, server: ServerState):
    """A JSON body -> (name, work(on_step) -> the designed voice's prompt)."""
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    name = new_voice_name(server.voices, body.get("name"))
    instruct = body_field(body, "instruct", str, None)
    if not instruct:
        raise HTTPError(400, "a designed voice needs 'instruct' (or upload a clip as "
                             "multipart name + audio + ref_text)", "instruct")
    seed = body_field(body, "seed", int, 0, check=lambda v: v >= 0)
    language = body_field(body, "language", str, None)
    sample = body_field(body, "text", str, None)
    num_step = body_field(body, "num_step", int, GenerationConfig.num_step,
                          check=lambda v: 1 <= v <= 1000)

    def work(on_step):
        return designed_voice(server.model, instruct, seed, language, sample, on_step, num_step)
    return name, work


@route("voice")
async def voice_get(request: Request):
    name = VoiceLibrary.check_name(request.path_params["name"])
    prompt = request.app.state.server.voices.get(name)
    if prompt is None:
        raise HTTPError(404, f"unknown voice {name!r}", "voice", "voice_not_found")
    return JSONResponse(describe_voice(name, prompt))


@route("voice")
async def voice_delete(request: Request):
    name = VoiceLibrary.check_name(request.path_params["name"])
    if not request.app.state.server.voices.delete(name):
        raise HTTPError(404, f"unknown voice {name!r}", "voice", "voice_not_found")
    return JSONResponse({"id": name, "object": "voice", "deleted": True})


# -- models, health, metrics ------------------------------------------------------------------

@route("models")
async def models(request: Request):
    """GET /v1/models: the checkpoint's name and OpenAI's speech model names (all one model)."""
    server: ServerState = request.app.state.server
    return JSONResponse({"object": "list", "data": [
        {"id": n, "object": "model", "created": 0, "owned_by": "omnicore"}
        for n in dict.fromkeys([server.model_name, "tts-1", "tts-1-hd", "gpt-4o-mini-tts"])]})


@route("health", needs_auth=False)
async def health(request: Request):
    """Open for probes: 200 and the load; 503 ("draining") once shutdown began, so a load
    balancer sends the next requests elsewhere."""
    server: ServerState = request.app.state.server
    if server.draining:
        return JSONResponse({"status": "draining", **server.load()}, 503, {"Retry-After": "5"})
    return JSONResponse({"status": "ok", **server.load()})


@route("index", needs_auth=False)
async def index(request: Request):
    """GET /: what this is and where its routes are (no secrets: open like /health)."""
    from .. import __version__

    server: ServerState = request.app.state.server
    links = {"speech": "/v1/audio/speech", "speech_stream_input": "/v1/audio/speech/stream-input",
             "voices": "/v1/voices", "models": "/v1/models", "health": "/health",
             "metrics": "/metrics"}
    if server.ui_path:
        links["ui"] = server.ui_path
    return JSONResponse({"object": "api", "name": "omnicore", "version": __version__,
                         "description": "OpenAI-compatible text-to-speech (OmniVoice)",
                         "model": server.model_name, "links": links})


@route("metrics", needs_auth=lambda server: not server.metrics_public)
async def metrics(request: Request):
    """Prometheus text; the gauges of the queue and the engine's passes are sampled now."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    server: ServerState = request.app.state.server
    ld = server.load()
    server.m_queue.set(ld["queued"])
    server.m_passes.labels("active").set(ld["engine"]["active_passes"])
    server.m_passes.labels("waiting").set(ld["engine"]["waiting_passes"])
    return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)


async def not_found(request: Request, exc):
    code = getattr(exc, "status_code", 404)
    return JSONResponse(error_body(code, f"{request.method} {request.url.path}: not found"
                                   if code == 404 else "method not allowed"), code)


def create_app(server: ServerState) -> Starlette:
    """The routing table over one ServerState."""
    routes = [
        Route("/", index, methods=["GET"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        WebSocketRoute("/v1/audio/speech/stream-input", stream_input),
        Route("/v1/voices", voices_list, methods=["GET"]),
        Route("/v1/voices", voices_create, methods=["POST"]),
        Route("/v1/voices/{name:path}", voice_get, methods=["GET"]),
        Route("/v1/voices/{name:path}", voice_delete, methods=["DELETE"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.state.server = server
    return app


# -- the demo at /ui ------------------------------------------------------------------------------

def demo_module():
    """The Gradio demo (demo/app.py of the source checkout, beside the package), imported for
    `--ui`; a ConfigError, before any model loads, when it or gradio is missing."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "demo" / "app.py"
    if not path.is_file():
        raise ConfigError(f"--ui serves the demo of a source checkout ({path} is missing): "
                          "install from the repository with pip install -e '.[server,demo]'")
    if importlib.util.find_spec("gradio") is None:
        raise ConfigError("--ui needs the demo extra: pip install -e '.[server,demo]'")
    spec = importlib.util.spec_from_file_location("omnicore_demo_app", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mount_ui(app, server: ServerState, demo, model_name: str) -> None:
    """The demo's Blocks on the server's own model (one model, one engine: its jobs are packed
    with the API's requests) at /ui. With an API key the page asks for it as the password."""
    import gradio as gr

    def auth(user: str, password: str) -> bool:
        return server.authorized(f"Bearer {password}")
    blocks = demo.build_demo(server.model, model_name, max_queue=server.max_queue)
    server.ui_path = "/ui"
    gr.mount_gradio_app(app, blocks, path="/ui",
                        auth=auth if server.api_key is not None else None,
                        auth_message="Any user name; the password is the server's API key.",
                        footer_links=["api", "gradio"], **demo.launch_options())
