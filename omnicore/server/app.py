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

import asyncio
import base64
import functools
import json
import re
import secrets
import time
from pathlib import Path

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute

from ..errors import AudioError, ConfigError, InputError, OmniCoreError
from ..model.config import SAMPLE_RATE, GenerationConfig, validate_seed
from ..text import frontend
from .formats import FORMATS, encode_audio, encoded
from .library import VoiceLibrary
from .protocol import (CUT, MAX_UPLOAD_BYTES, PROFILE_LABELS, HTTPError, as_http, blame,
                       body_field, check_fields, checked, concerning, error_body, forget,
                       ignored_header, parse_speech, profile_header, read_json, read_object,
                       shutting_down, synth_kwargs, timings_header)
from .state import ServerState, Slot, client_gone
from .stream_input import stream_input
from .uploads import check_recording, decode_clip
from .voices import (PRESET_SAMPLE_TEXT, PRESET_VOICES, check_label, check_language_tag,
                     describe_voice, designed_voice, list_voices, new_voice_id, new_voice_name,
                     openai_voice, voice_not_found)


def error_response(e: HTTPError) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, e.param, e.code), e.status, e.headers)


def route(name: str, needs_auth=True, probe: bool = False, query: tuple = ()):
    """A handler with what every route shares: the API key (when `needs_auth`, or when
    `needs_auth(server)` says so), a 503 while the server drains unless it is a `probe` (/,
    /health, /metrics answer to the end), no query parameter but those in `query`, every
    failure as an OpenAI-shaped JSON error (never a traceback, and nothing it held kept alive),
    the request counted by route and status."""
    def wrap(fn):
        @functools.wraps(fn)
        async def handler(request: Request):
            server: ServerState = request.app.state.server
            try:
                auth = needs_auth(server) if callable(needs_auth) else needs_auth
                if auth:
                    check_key(server, request.headers.get("authorization"))
                if server.draining and not probe:
                    raise shutting_down()
                check_fields(request.query_params, query, "the query")
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
    """POST /v1/audio/speech: admitted, then a stream (OpenAI's default for the formats sent
    piece by piece, or asked for) or a whole file (flac unless a stream is asked for)."""
    server: ServerState = request.app.state.server
    req = parse_speech(await read_json(request), server.model_ids)
    if req["voice"] is not None:
        await server.in_thread(server.check_voice, req["voice"])
    t0 = time.perf_counter()  # queueing counts in the latency a client sees
    async with client_gone(request) as gone, server.slot(gone) as slot:
        queued = time.perf_counter() - t0
        prompt = None
        if req["voice"] is not None:
            prompt = await slot.run(server.voice, req["voice"], slot.on_step)
        kw = synth_kwargs(req, prompt)
        with blame(speech_blame(req)):
            if req["stream_format"] is None:
                return await speak_whole(server, slot, req, kw, t0, queued)
            # Streams: the model starts here (argument errors are a 400 before any byte leaves).
            stream = await server.in_thread(lambda: server.model.stream(req["input"], **kw))
        cut = request.scope.get("extensions", {}).get(CUT)
        response = stream_response(server, slot, req, stream, t0, queued, cut)
        slot.hand_over()  # from here the stream's body gives the slot back when it ends
        return response


def speech_blame(req: dict) -> dict:
    """The field a speech request's synthesis errors concern: the text (its length for one
    pass), or the duration asked for it."""
    return {OmniCoreError: "duration" if req["duration"] is not None else "input"}


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
               "X-Omnicore-Audio-Seconds": f"{secs:.3f}", **profile_header(req, server.model),
               **ignored_header(req["instructions_ignored"])}
    return Response(data, 200, headers, media_type=FORMATS[req["format"]][2])


def stream_response(server: ServerState, slot: Slot, req: dict, stream, t0: float, queued: float,
                    cut=None):
    """The stream's body in the response format: wav, pcm and opus leave piece by piece (wav
    with a header of unknown sizes first); mp3 and flac are encoded once, at the end (see
    OpusStream). SSE carries the same bytes, base64, per event. The body releases `slot`.
    A raw stream the server stops can only be cut: `cut()` drops its connection (without it,
    the body fails, and the server closes the connection)."""
    raw_cut = cut if req["stream_format"] != "sse" else None
    fmt = req["format"]
    state = {"ttfb": None, "audio_s": 0.0, "ended": False, "finished": False}

    async def finish():
        """Once, whether the body ran to its end, stopped early or never started (a client
        gone before the first byte: then only the response's background task runs): count
        a stream cut short, stop its passes, and free its slot once they have left the engine
        (a stream's close returns then), so a freed slot never sits beside a cut client's
        passes."""
        if state["finished"]:
            return
        state["finished"] = True
        if not state["ended"]:
            server.m_cancelled.inc()
        loop = asyncio.get_running_loop()
        closed = server.pool.submit(stream.close)  # not awaited: a cancelled task cannot await
        closed.add_done_callback(lambda _: loop.call_soon_threadsafe(slot.release))

    async def pieces():
        """float32 pieces [N] from the SpeechStream, read in a worker thread; a stream the
        server stops (shutdown) ends with its 503 (SSE) or cut (raw), never as if the audio
        were complete."""
        while True:
            x = await server.in_thread(next, stream, None)
            if slot.stopping:
                if raw_cut is not None:
                    return  # already cut: nothing written now reaches the client
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
            e = as_http(concerning(exc, speech_blame(req)))
            yield {"event": "error", "data": json.dumps(error_body(e.status, e.message, e.param,
                                                                   e.code))}
        finally:
            await finish()

    def stop():
        server.pool.submit(stream.close)  # wakes the body's next()
        if raw_cut is not None:
            raw_cut()
    slot.on_stop(stop)
    headers = {"X-Omnicore-Timings": timings_header(
        {"queue": queued, "start": time.perf_counter() - t0}), **profile_header(req, server.model),
        **ignored_header(req["instructions_ignored"])}
    if req["stream_format"] == "sse":
        return EventSourceResponse(sse_body(), headers=headers, ping=600,
                                   background=BackgroundTask(finish))
    media = "audio/pcm" if fmt == "pcm" else FORMATS[fmt][2]
    return StreamingResponse(audio_body(), media_type=media, headers=headers,
                             background=BackgroundTask(finish))


# -- voices -------------------------------------------------------------------------------------
# One library (library.py) behind two APIs: omnicore's /v1/voices, where a voice's name is its
# id, and OpenAI's /v1/audio/voices, which gives each voice a new id and keeps its name as a
# label; a voice made through either is spoken with through either id. The folder is read in
# worker threads: a slow or hostile file never holds the event loop.

# The fields of a designed voice on /v1/voices (JSON), and of a cloned one (multipart).
VOICE_FIELDS = ("name", "instruct", "text", "seed", "language", "num_step")
CLONE_FIELDS = ("name", "ref_text", "consent")
# What OpenAI's voice creation sends (its form or JSON), and the extras taken here.
AUDIO_VOICE_FIELDS = ("name", "type", "consent", "prompt", "script_hint", "model",
                      "ref_text", "seed", "language", "num_step")
CONSENT_FIELDS = ("name", "language")


@route("voices")
async def voices_list(request: Request):
    """GET /v1/voices: the library's voices, then the presets not made yet, all one shape."""
    server: ServerState = request.app.state.server
    return JSONResponse({"object": "list", "data": await server.in_thread(list_voices,
                                                                          server.voices)})


@route("voices")
async def voices_create(request: Request):
    """POST /v1/voices: a clone of an uploaded clip (multipart name + audio + ref_text, and
    consent: a consent's id) or a designed voice (JSON name + instruct), made in an admitted
    slot like a speech request."""
    server: ServerState = request.app.state.server
    consent = None
    if is_form(request):
        body, data = await read_form(request, "audio", CLONE_FIELDS)
        name = await server.in_thread(new_voice_name, server.voices, body.get("name"))
        if data is None:
            raise HTTPError(400, "multipart field 'audio' (a file) is required", "audio",
                            "missing_file")
        work = clip_voice_work(server, data, body.get("ref_text"), "audio")
        consent = await check_consent(server, body.get("consent"))
        record = {"type": "audio_sample"}
    else:
        body = await read_object(request)
        check_fields(body, VOICE_FIELDS)
        name = await server.in_thread(new_voice_name, server.voices, body.get("name"))
        instruct, work = designed_voice_work(server, body, "instruct", "text")
        record = {"type": "prompt", "prompt": instruct}
    prompt, record = await make_voice(request, server, name, work, record, consent)
    return JSONResponse(describe_voice(name, prompt, record), 201, pace_warning(prompt))


def pace_warning(prompt) -> dict:
    """A header that says when a cloned voice's transcript cannot be what its clip says (the
    voice is kept: the caller decides)."""
    problem = prompt.pace_problem()
    return {"X-Omnicore-Warning": problem} if problem else {}


async def make_voice(request: Request, server: ServerState, name: str, work, record: dict,
                     consent: str | None):
    """Run a voice's work in an admitted slot, like a speech request, then store it: (its
    prompt, its record). 409 if another request, here or in another server on the folder,
    took the name meanwhile."""
    async with client_gone(request) as gone, server.slot(gone) as slot:
        prompt = await slot.run(work, slot.on_step)
    return prompt, await server.in_thread(server.voices.add, name, prompt, record, consent)


def is_form(request: Request) -> bool:
    kind = request.headers.get("content-type", "")
    return kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded"))


async def read_form(request: Request, file_field: str, fields) -> tuple[dict, bytes | None]:
    """A form body -> ({field: text or None} for `fields`, the bytes of the file `file_field`
    or None); 413 past MAX_UPLOAD_BYTES (or of unknown length); a field of another name is
    refused (check_fields)."""
    size = request.headers.get("content-length")
    if size is None or not size.isdigit() or int(size) > MAX_UPLOAD_BYTES:
        raise HTTPError(413, f"upload over {MAX_UPLOAD_BYTES:,} bytes (or of unknown "
                             "length)", file_field, "upload_too_large")
    async with request.form(max_files=1, max_fields=16) as form:
        check_fields(form, (*fields, file_field), "the form")
        body = {}
        for key in fields:
            value = form.get(key)
            if value is not None and not isinstance(value, str):
                raise HTTPError(400, f"form field {key!r} must be text, not a file", key,
                                "invalid_type")
            body[key] = value
        upload = form.get(file_field)
        if isinstance(upload, str):
            raise HTTPError(400, f"form field {file_field!r} must be a file", file_field,
                            "invalid_type")
        data = None if upload is None else await upload.read()
    return body, data


def clip_voice_work(server: ServerState, data: bytes, ref_text, file_field: str):
    """An uploaded clip (the form's `file_field`) and its transcript -> work(on_step) -> the
    clip's voice prompt. The transcript is required: nothing here recognises speech."""
    if not isinstance(ref_text, str) or not ref_text.strip():
        raise HTTPError(400, "a cloned voice needs its clip's transcript as the form field "
                             "'ref_text' (there is no speech recognition here; with the openai "
                             "client: extra_body={'ref_text': ...})", "ref_text",
                        "ref_text_required")

    def work(on_step):
        with blame({AudioError: file_field, InputError: "ref_text"}):
            wav, sr = decode_clip(data)  # [C, N]: checked by its header before decoding
            return server.model.create_voice_clone_prompt((wav, sr), ref_text=ref_text)
    return work


async def check_consent(server: ServerState, consent) -> str | None:
    """The consent id a cloned voice names, which must exist; None when none is named, which
    a server run with --require-consent refuses."""
    if consent is None or consent == "":
        if server.require_consent:
            raise HTTPError(400, "this server needs the speaker's consent for a cloned voice: "
                                 "upload their consent recording to POST "
                                 "/v1/audio/voice_consents and pass its id as 'consent'",
                            "consent", "consent_required")
        return None
    if await server.in_thread(server.voices.consent, consent) is None:
        raise HTTPError(400, f"unknown consent {consent!r}; GET /v1/audio/voice_consents lists "
                             "them", "consent", "consent_not_found")
    return consent


def designed_voice_work(server: ServerState, body: dict, instruct_key: str, text_key: str):
    """A designed voice's fields -> (its instruct, work(on_step) -> its prompt). The instruct
    is checked now, before admission, naming the closest known item for an unknown one."""
    instruct = body_field(body, instruct_key, str, None)
    sample = body_field(body, text_key, str, None)
    if sample is not None and not sample.strip():
        raise HTTPError(400, f"{text_key} must not be blank", text_key, "invalid_value")
    canonical = checked(instruct_key, frontend.resolve_instruct, instruct,
                        sample or PRESET_SAMPLE_TEXT, code="invalid_instruct")
    if not canonical:
        raise HTTPError(400, f"a designed voice needs '{instruct_key}', a description such as "
                             f"{PRESET_VOICES['alloy'][0]!r}", instruct_key, "invalid_instruct")
    seed = body_field(body, "seed", int, 0)
    checked("seed", validate_seed, seed)
    language = body_field(body, "language", str, None)
    num_step = body_field(body, "num_step", int, GenerationConfig.num_step)
    checked("num_step", GenerationConfig, num_step)

    def work(on_step):
        with blame({OmniCoreError: text_key}):
            return designed_voice(server.model, instruct, seed, language, sample, on_step,
                                  num_step)
    return instruct, work


@route("voice")
async def voice_get(request: Request):
    server: ServerState = request.app.state.server
    name = VoiceLibrary.check_name(request.path_params["name"])

    def find():
        prompt = server.voices.get(name)
        return None if prompt is None else describe_voice(name, prompt, server.voices.record(name))
    found = await server.in_thread(find)
    if found is None:
        raise voice_not_found(name, "name")
    return JSONResponse(found)


@route("voice")
async def voice_delete(request: Request):
    server: ServerState = request.app.state.server
    name = VoiceLibrary.check_name(request.path_params["name"])
    if not await server.in_thread(server.voices.delete, name):
        raise voice_not_found(name, "name")
    return JSONResponse({"id": name, "object": "voice", "deleted": True})


# -- OpenAI's voice resources -------------------------------------------------------------------

@route("audio_voices")
async def audio_voices_create(request: Request):
    """POST /v1/audio/voices, as form or JSON: `type` "audio_sample" (the default; `name`,
    the `audio_sample` file, `consent`: a consent's id, and `ref_text`, the clip's transcript,
    as an extra field) or "prompt" (`name` and `prompt`, a voice description checked as an
    instruct; `script_hint`: the sample it speaks). The voice gets a new id, its `name` is its
    label."""
    server: ServerState = request.app.state.server
    data = None
    if is_form(request):
        body, data = await read_form(request, "audio_sample", AUDIO_VOICE_FIELDS)
        for key in ("seed", "num_step"):  # numbers arrive as text in a form
            if isinstance(body[key], str) and body[key].strip().isdigit():
                body[key] = int(body[key])
    else:
        body = await read_object(request)
        check_fields(body, AUDIO_VOICE_FIELDS)
    label = check_label(body.get("name"), "name")
    kind = body_field(body, "type", str, "audio_sample")
    consent = None
    if kind == "prompt":
        instruct, work = designed_voice_work(server, body, "prompt", "script_hint")
        record = {"name": label, "type": "prompt", "prompt": instruct}
    elif kind == "audio_sample":
        if data is None:
            raise HTTPError(400, "an audio_sample voice needs the file 'audio_sample' (multipart)",
                            "audio_sample", "missing_file")
        work = clip_voice_work(server, data, body.get("ref_text"), "audio_sample")
        consent = await check_consent(server, body.get("consent"))
        record = {"name": label, "type": "audio_sample"}
    else:
        raise HTTPError(400, f"type must be 'audio_sample' or 'prompt', got {kind!r}", "type",
                        "invalid_value")
    name = new_voice_id()
    prompt, record = await make_voice(request, server, name, work, record, consent)
    return JSONResponse(openai_voice(name, record), headers=pace_warning(prompt))


@route("audio_voices")
async def audio_voice_delete(request: Request):
    server: ServerState = request.app.state.server
    name = VoiceLibrary.check_name(request.path_params["voice_id"], "voice_id")
    if not await server.in_thread(server.voices.delete, name):
        raise voice_not_found(name, "voice_id")
    return JSONResponse({"id": name, "object": "audio.voice.deleted", "deleted": True})


@route("voice_consents")
async def consents_create(request: Request):
    """POST /v1/audio/voice_consents (multipart `name`, `language`, `recording`): the
    recording is kept as uploaded, once it decodes within a clip's limits (uploads.py)."""
    server: ServerState = request.app.state.server
    if not is_form(request):
        raise HTTPError(400, "send the consent as multipart form data: name, language and the "
                             "file recording", "recording", "invalid_request")
    body, data = await read_form(request, "recording", CONSENT_FIELDS)
    label = check_label(body.get("name"), "name")
    language = check_language_tag(body.get("language"))
    if data is None:
        raise HTTPError(400, "the file 'recording' is required", "recording", "missing_file")
    with blame({OmniCoreError: "recording"}):
        ext = await server.in_thread(check_recording, data)
    return JSONResponse(await server.in_thread(server.voices.add_consent, label, language,
                                               data, ext))


@route("voice_consents", query=("limit", "after"))
async def consents_list(request: Request):
    """GET /v1/audio/voice_consents: oldest first, `limit` (1-100, default 20) after the id
    `after` (OpenAI's cursor page)."""
    server: ServerState = request.app.state.server
    query = request.query_params
    limit = query.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise HTTPError(400, f"limit must lie in [1, 100], got {limit!r}", "limit",
                        "invalid_value")
    limit = int(limit)
    items = await server.in_thread(server.voices.consents)
    after = query.get("after")
    if after is not None:
        ids = [c["id"] for c in items]
        if after not in ids:
            raise HTTPError(400, f"unknown cursor {after!r}", "after", "invalid_value")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page,
                         "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None,
                         "has_more": len(items) > limit})


def consent_not_found(cid) -> HTTPError:
    return HTTPError(404, f"unknown consent {cid!r}", "consent_id", "consent_not_found")


@route("voice_consents")
async def consent_get(request: Request):
    server: ServerState = request.app.state.server
    cid = request.path_params["consent_id"]
    rec = await server.in_thread(server.voices.consent, cid)
    if rec is None:
        raise consent_not_found(cid)
    return JSONResponse(rec)


@route("voice_consents")
async def consent_update(request: Request):
    """POST /v1/audio/voice_consents/{id} with JSON {"name": ...}: a new label."""
    server: ServerState = request.app.state.server
    cid = request.path_params["consent_id"]
    body = await read_object(request)
    check_fields(body, ("name",))
    label = check_label(body.get("name"), "name")
    rec = await server.in_thread(server.voices.rename_consent, cid, label)
    if rec is None:
        raise consent_not_found(cid)
    return JSONResponse(rec)


@route("voice_consents")
async def consent_delete(request: Request):
    """DELETE /v1/audio/voice_consents/{id}; the voices it authorised keep their copy."""
    server: ServerState = request.app.state.server
    cid = request.path_params["consent_id"]
    if not await server.in_thread(server.voices.delete_consent, cid):
        raise consent_not_found(cid)
    return JSONResponse({"id": cid, "object": "audio.voice_consent", "deleted": True})


# -- models, health, metrics ------------------------------------------------------------------

@route("models")
async def models(request: Request):
    """GET /v1/models: the checkpoint's name, the model's family and OpenAI's speech model
    names (all one model)."""
    server: ServerState = request.app.state.server
    return JSONResponse({"object": "list", "data": [
        {"id": n, "object": "model", "created": 0, "owned_by": "omnicore"}
        for n in server.model_ids]})


@route("health", needs_auth=False, probe=True)
async def health(request: Request):
    """Open for probes: 200 and the load; 503 ("warming up") until the kernels are compiled at
    start-up, and ("draining") once shutdown began, so a load balancer sends requests elsewhere."""
    server: ServerState = request.app.state.server
    if server.draining or server.warming:
        status = "draining" if server.draining else "warming up"
        return JSONResponse({"status": status, **server.load()}, 503, {"Retry-After": "5"})
    return JSONResponse({"status": "ok", **server.load()})


@route("index", needs_auth=False, probe=True)
async def index(request: Request):
    """GET /: what this is and where its routes are (no secrets: open like /health)."""
    from .. import __version__

    server: ServerState = request.app.state.server
    links = {"speech": "/v1/audio/speech", "speech_stream_input": "/v1/audio/speech/stream-input",
             "voices": "/v1/voices", "audio_voices": "/v1/audio/voices",
             "voice_consents": "/v1/audio/voice_consents", "models": "/v1/models", "health": "/health",
             "metrics": "/metrics"}
    if server.ui_path:
        links["ui"] = server.ui_path
    return JSONResponse({"object": "api", "name": "omnicore", "version": __version__,
                         "description": "OpenAI-compatible text-to-speech (OmniVoice)",
                         "model": server.model_name, "links": links,
                         "profiles": PROFILE_LABELS,
                         "default_profile": getattr(server.model, "profile", "exact")})


@route("metrics", needs_auth=lambda server: not server.metrics_public, probe=True)
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
    status = getattr(exc, "status_code", 404)
    if status == 404:
        e = HTTPError(404, f"{request.method} {request.url.path}: not found", None, "not_found")
    else:
        e = HTTPError(405, f"{request.method} is not allowed on {request.url.path}", None,
                      "method_not_allowed")
    return error_response(e)


# A client's own X-Request-Id is kept when it is a plain token (it ties its logs to ours).
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestId:
    """ASGI middleware: every response, and every WebSocket's handshake, carries
    `x-request-id`, as OpenAI's API's do (clients log it, and LiveKit warns on each utterance
    when it is missing): the client's own when it sent a plain one, else a new `req_<hex>`."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", ())).get(b"x-request-id", b"").decode("latin-1")
        rid = given if REQUEST_ID.fullmatch(given) else "req_" + secrets.token_hex(16)
        header = (b"x-request-id", rid.encode("ascii"))

        async def send_with_id(message):
            if message["type"] in ("http.response.start", "websocket.accept",
                                   "websocket.http.response.start"):
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)
        await self.app(scope, receive, send_with_id)


def create_app(server: ServerState) -> Starlette:
    """The routing table over one ServerState."""
    routes = [
        Route("/", index, methods=["GET"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        WebSocketRoute("/v1/audio/speech/stream-input", stream_input),
        Route("/v1/voices", voices_list, methods=["GET"]),
        Route("/v1/voices", voices_create, methods=["POST"]),
        Route("/v1/voices/{name}", voice_get, methods=["GET"]),
        Route("/v1/voices/{name}", voice_delete, methods=["DELETE"]),
        Route("/v1/audio/voices", audio_voices_create, methods=["POST"]),
        Route("/v1/audio/voices/{voice_id}", audio_voice_delete, methods=["DELETE"]),
        Route("/v1/audio/voice_consents", consents_create, methods=["POST"]),
        Route("/v1/audio/voice_consents", consents_list, methods=["GET"]),
        Route("/v1/audio/voice_consents/{consent_id}", consent_get, methods=["GET"]),
        Route("/v1/audio/voice_consents/{consent_id}", consent_update, methods=["POST"]),
        Route("/v1/audio/voice_consents/{consent_id}", consent_delete, methods=["DELETE"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found},
                    middleware=[Middleware(RequestId)])
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
