"""POST /v1/audio/speech: OpenAI's speech body -> the speaking path (speaking.py) -> a whole
file with its timings in headers, or a stream response (raw audio or SSE) whose body gives
the slot back when the stream ends.

A speech request's path: read and check the body (protocol.parse_speech) -> admission
(`async with server.slot(gone)`) -> its voice (speaking.voice_prompt) -> a whole file
(`speak_whole`) or a stream response (`stream_response`).

Dimensions: N samples of mono float32 audio at SAMPLE_RATE.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ...errors import OmniCoreError
from ...model.config import SAMPLE_RATE
from . import speaking
from .formats import FORMATS, encoded
from .protocol import (CUT, HTTPError, as_http, blame, concerning, error_body, ignored_header,
                       parse_speech, profile_header, read_json, synth_kwargs,
                       timings_header)
from .routes import route
from .state import ServerState, Slot, client_gone


@route("speech")
async def speech(request: Request):
    """POST /v1/audio/speech: admitted, then a stream (OpenAI's default for the formats sent
    piece by piece, or asked for) or a whole file (flac unless a stream is asked for)."""
    server: ServerState = request.app.state.server
    # Off the event loop (reading a body's prose is regex work that would stall other clients),
    # and off the server's pool, whose threads may all be waiting on the engine.
    req = await asyncio.to_thread(parse_speech, await read_json(request), server.model_ids)
    await speaking.check_voice(server, req["voice"])
    t0 = time.perf_counter()  # queueing counts in the latency a client sees
    async with client_gone(request) as gone, server.slot(gone) as slot:
        queued = time.perf_counter() - t0
        kw = synth_kwargs(req, await speaking.voice_prompt(server, slot, req["voice"]))
        with blame(speech_blame(req)):
            if req["stream_format"] is None:
                return await speak_whole(server, slot, req, kw, t0, queued)
            # Streams: the model starts here (argument errors are a 400 before any byte leaves).
            stream = await speaking.open_stream(server, req["input"], kw)
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
    result, data = await slot.run(speaking.synthesize, server, req["input"], kw, req["format"],
                                  slot.on_step)
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
    state = {"ttfb": None, "audio_s": 0.0, "finished": False}

    async def finish():
        """Once, whether the body ran to its end, stopped early or never started (a client
        gone before the first byte: then only the response's background task runs): stop its
        passes (a stream cut short is counted), and free its slot once they have left the engine
        (a stream's close returns then), so a freed slot never sits beside a cut client's
        passes."""
        if state["finished"]:
            return
        state["finished"] = True
        loop = asyncio.get_running_loop()
        closed = speaking.close_stream(server, stream)  # not awaited: a cancelled task cannot await
        closed.add_done_callback(lambda _: loop.call_soon_threadsafe(slot.release))

    async def pieces():
        """float32 pieces [N] from the SpeechStream, read in a worker thread; a stream the
        server stops (shutdown) ends with its 503 (SSE) or cut (raw), never as if the audio
        were complete."""
        # a raw stream the server stops is already cut: nothing written now reaches the client
        async for x in speaking.pieces(server, stream, slot, cut=raw_cut is not None):
            if state["ttfb"] is None:
                state["ttfb"] = time.perf_counter() - t0
                server.m_ttfb.observe(state["ttfb"])
            state["audio_s"] += len(x) / SAMPLE_RATE
            yield x
        if not slot.stopping:
            server.m_rtf.observe((time.perf_counter() - t0) / max(state["audio_s"], 1e-9))

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
        speaking.close_stream(server, stream)  # wakes the body's next()
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

