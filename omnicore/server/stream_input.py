"""The WebSocket for voice agents, /v1/audio/speech/stream-input: text in as an LLM writes it,
audio out as it is made.

    client -> server   {"voice": "alloy", "response_format": "pcm", ...}   first: the speech
                                          fields of POST /v1/audio/speech, without `input`
                       {"text": "Hel"}, {"text": "lo there. "}, ...   fragments, as written
                       {"flush": true}    speak what is buffered now (the utterance ends)
                       {"cancel": true}   barge-in: stop speaking within a step, drop the rest
                       {"close": true}    end of input: speak what is left, then close
    server -> client   binary frames      audio, as it is made
                       {"type": "audio.done", "utterance": i, "cancelled": ..., timings}
                       {"type": "error", "utterance": i or null, "error": {OpenAI's shape}}

An utterance is the text between two flushes (or a flush and the close): one `model.stream`
over its fragments, which speaks text in fragments exactly as the whole string, so its frames
are the bytes one streamed POST of the same text sends. Utterances are spoken in order; each is
admitted like a request (`server.slot`), from its first words until its audio is out, so an
idle socket holds no slot. Text with nothing to say yet (spaces, punctuation) waits for words.

Clocks: a socket with nothing being spoken and no message for `server.idle_timeout` seconds is
closed (counted as an idle timeout); one whose client stops reading is cut by the connection's
send clock (runtime.py). On shutdown an utterance in progress ends with an error event.

Dimensions: N samples of mono float32 audio at SAMPLE_RATE.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..errors import CancelledError, OmniCoreError
from ..model.config import SAMPLE_RATE
from ..text import limits
from .formats import encoded
from .protocol import (HTTPError, as_http, check_fields, check_input_length, concerning,
                       error_body, forget, has_words, parse_json, shutting_down, speech_options,
                       synth_kwargs)
from .state import ServerState, Slot

ROUTE = "speech_stream_input"  # its name in the request counter
MESSAGE_KEYS = ("text", "flush", "cancel", "close")
MAX_UTTERANCES = 8  # started, not cancelled and not yet spoken, per socket: a flood of flushes
# is refused. Cancelled ones cost nothing but their audio.done event: these many may wait for it
# (a client that cancels faster than it reads its events).
MAX_CANCELLED = 256
_END = object()  # the end of an utterance's input


class Utterance:
    """One utterance's text on its way to the model's stream, and how it ended."""

    def __init__(self, index: int, gone: asyncio.Future):
        self.index = index
        self.t0 = time.perf_counter()  # its first fragment's arrival: the timings count from it
        self.gone = gone  # resolved when it is cancelled or the client leaves: its slot's `gone`
        self.chars = 0
        self.input_done = False
        self.cancelled = False
        self.done = False  # its audio.done or error has been sent
        self.audio_s = 0.0
        self.stream = None
        self._texts: queue.Queue = queue.Queue()  # fragments, then _END

    def feed(self, text: str) -> None:
        self.chars += len(text)
        self._texts.put(text)

    def end_input(self) -> None:
        if not self.input_done:
            self.input_done = True
            self._texts.put(_END)

    def fragments(self):
        """The fragments as they come (read by the stream's reader thread)."""
        while (item := self._texts.get()) is not _END:
            yield item

    def cancel(self, pool) -> None:
        """Stop it: no more input, its slot's wait or work ends, its stream closes (the pass on
        the engine leaves before its next step)."""
        self.cancelled = True
        self.end_input()
        if not self.gone.done():
            self.gone.set_result(None)
        if self.stream is not None:
            pool.submit(self.stream.close)


class Session:
    """One socket: a listener for the client's messages and a speaker for the utterances."""

    def __init__(self, server: ServerState, ws: WebSocket):
        self.server, self.ws = server, ws
        self.opts: dict = {}
        self.prompt = None  # the voice, resolved once
        self.pending = ""  # text with nothing to say yet
        self.current: Utterance | None = None  # the one taking text now
        self.queue: asyncio.Queue = asyncio.Queue()  # utterances to speak, then None
        self.utterances: list[Utterance] = []  # started and not done
        self.count = 0  # utterances started
        self.closing = False
        self.gone = False
        self.last_activity = time.monotonic()

    # -- sending -----------------------------------------------------------------------------

    async def send_event(self, event: dict) -> None:
        if not self.gone:
            await self.ws.send_text(json.dumps(event))

    async def send_error(self, exc: BaseException, utterance: int | None = None) -> None:
        e = as_http(exc)
        await self.send_event({"type": "error", "utterance": utterance,
                               "error": error_body(e.status, e.message, e.param, e.code)["error"]})

    # -- the client's messages ----------------------------------------------------------------

    async def receive(self, timeout: float | None):
        """The next message as JSON, or None when the client left. TimeoutError after
        `timeout` seconds."""
        msg = await asyncio.wait_for(self.ws.receive(), timeout)
        if msg["type"] == "websocket.disconnect":
            self.gone = True
            return None
        self.last_activity = time.monotonic()
        if msg.get("text") is None:
            raise HTTPError(400, "send JSON text messages (audio only goes to the client)",
                            None, "invalid_message")
        return parse_json(msg["text"], "the message")

    async def start(self) -> bool:
        """The first message: the speech fields. False (after an error event) when unusable."""
        try:
            body = await self.receive(self.server.idle_timeout)
            if body is None:
                return False
            if not isinstance(body, dict):
                raise HTTPError(400, "the first message must be a JSON object of speech fields "
                                     "(voice, response_format, language, ...)", None,
                                "invalid_message")
            self.opts = speech_options(body, default_format="pcm", models=self.server.model_ids)
            if self.opts["duration"] is not None:
                raise HTTPError(400, "duration needs the whole text in advance; over this socket "
                                     "use speed", "duration", "invalid_value")
            if body.get("input") is not None:
                raise HTTPError(400, "send the text as {\"text\": ...} messages after this one",
                                "input", "invalid_input")
            if self.opts["voice"] is not None:  # refused now, as a POST would be
                await self.server.in_thread(self.server.check_voice, self.opts["voice"])
            return True
        except asyncio.TimeoutError:
            self.server.m_timeouts.labels("idle").inc()
            await self.send_error(HTTPError(408, "no speech fields within "
                                                 f"{self.server.idle_timeout:g} s", None,
                                            "idle_timeout"))
        except HTTPError as exc:
            await self.send_error(exc)
        return False

    async def listen(self) -> None:
        """Take messages until the client leaves, goes idle, or its close has been spoken."""
        while True:
            # Speaking what was sent is not idleness, even with no message meanwhile.
            busy = any(u.input_done and not u.cancelled for u in self.utterances)
            left = self.server.idle_timeout - (time.monotonic() - self.last_activity)
            try:
                body = await self.receive(max(left, 0.05) if not busy else 1.0)
            except asyncio.TimeoutError:
                if not busy and time.monotonic() - self.last_activity >= self.server.idle_timeout:
                    self.server.m_timeouts.labels("idle").inc()
                    self.cancel_all()
                    await self.send_error(HTTPError(408, "nothing received for "
                                                         f"{self.server.idle_timeout:g} s",
                                                    None, "idle_timeout"))
                    return
                continue
            except HTTPError as exc:
                await self.send_error(exc)
                continue
            if body is None:
                self.cancel_all()
                return
            try:
                self.handle(body)
            except HTTPError as exc:
                await self.send_error(exc, self.current.index if self.current else None)

    def handle(self, body) -> None:
        if not isinstance(body, dict) or not body:
            raise HTTPError(400, "a message is a JSON object with text, flush, cancel or close",
                            None, "invalid_message")
        check_fields(body, MESSAGE_KEYS, "a message")
        for key in MESSAGE_KEYS[1:]:
            if not isinstance(body.get(key, False), bool):
                raise HTTPError(400, f"{key} must be true or false", key, "invalid_type")
        text = body.get("text")
        if text is not None and not isinstance(text, str):
            raise HTTPError(400, "text must be a string", "text", "invalid_type")
        if body.get("cancel"):  # first: "cancel and say this instead" is one message
            self.cancel_all()
        if text:
            if self.closing:
                raise HTTPError(400, "text after close", "text", "invalid_message")
            self.add_text(text)
        if body.get("flush") or body.get("close"):
            self.flush()
        if body.get("close") and not self.closing:
            self.closing = True
            self.queue.put_nowait(None)

    def add_text(self, text: str) -> None:
        u = self.current
        if u is not None:
            if u.chars + len(text) > limits.MAX_TEXT_CHARS:
                u.cancel(self.server.pool)  # one request over the limit is refused whole
                self.current = None
                check_input_length(u.chars + len(text))
            u.feed(text)
            return
        self.pending += text
        check_input_length(len(self.pending))
        if has_words(self.pending):  # an utterance starts with its first words
            cancelled = sum(u.cancelled for u in self.utterances)
            if len(self.utterances) - cancelled >= MAX_UTTERANCES or cancelled >= MAX_CANCELLED:
                self.pending = ""
                raise HTTPError(429, f"{len(self.utterances) - cancelled} utterances are waiting "
                                     f"to be spoken and {cancelled} cancelled ones for their "
                                     f"audio.done (at most {MAX_UTTERANCES} and "
                                     f"{MAX_CANCELLED}); wait for their audio.done", "text",
                                "too_many_utterances")
            u = Utterance(self.count, asyncio.get_running_loop().create_future())
            self.count += 1
            self.utterances.append(u)
            u.feed(self.pending)
            self.pending, self.current = "", u
            self.queue.put_nowait(u)

    def flush(self) -> None:
        if self.current is not None:
            self.current.end_input()
        self.current, self.pending = None, ""  # text with nothing to say is dropped

    def cancel_all(self) -> None:
        self.pending, self.current = "", None
        for u in self.utterances:
            u.cancel(self.server.pool)

    # -- the speaker --------------------------------------------------------------------------

    async def speak_all(self) -> None:
        while (u := await self.queue.get()) is not None:
            try:
                await self.speak(u)
            finally:
                u.done = True
                u.end_input()  # a reader thread waiting for text ends
                self.utterances.remove(u)

    async def speak(self, u: Utterance) -> None:
        server = self.server
        first_audio, queued = None, 0.0
        try:
            if not u.cancelled:
                t_admit = time.perf_counter()
                async with server.slot(u.gone) as slot:
                    queued = time.perf_counter() - t_admit
                    slot.on_stop(lambda: u.cancel(server.pool))
                    if self.prompt is None and self.opts["voice"] is not None:
                        self.prompt = await slot.run(server.voice, self.opts["voice"],
                                                     slot.on_step)
                    kw = synth_kwargs(self.opts, self.prompt)
                    u.stream = await server.in_thread(
                        lambda: server.model.stream(u.fragments(), **kw))
                    if u.cancelled:
                        server.pool.submit(u.stream.close)
                    async for data in encoded(self.opts["format"], self.pieces(u, slot),
                                              server.in_thread):
                        if u.cancelled or self.gone:
                            break
                        await self.ws.send_bytes(data)
                        self.last_activity = time.monotonic()
                        if first_audio is None:
                            first_audio = time.perf_counter() - u.t0
                            server.m_ttfb.observe(first_audio)
                    if slot.stopping:
                        raise shutting_down()
            total = time.perf_counter() - u.t0
            if not u.cancelled:
                server.m_rtf.observe(total / max(u.audio_s, 1e-9))
            await self.send_event({
                "type": "audio.done", "utterance": u.index, "cancelled": u.cancelled,
                "audio_seconds": u.audio_s,
                "timings": {"queue": queued, "first_audio": first_audio, "total": total}})
        except CancelledError:  # cancelled while waiting for its slot or its voice
            await self.send_event({"type": "audio.done", "utterance": u.index, "cancelled": True,
                                   "audio_seconds": 0.0,
                                   "timings": {"queue": queued, "first_audio": None,
                                               "total": time.perf_counter() - u.t0}})
        except (WebSocketDisconnect, OSError):
            self.gone = True
        except Exception as exc:  # noqa: BLE001 - an utterance's failure is an error event
            if not self.gone:  # the model's refusals concern the utterance's text
                await self.send_error(concerning(exc, {OmniCoreError: "text"}), u.index)
            forget(exc)
        finally:
            if u.stream is not None:
                server.pool.submit(u.stream.close)  # a no-op once it ended

    async def pieces(self, u: Utterance, slot: Slot):
        """float32 pieces [N] of the utterance's stream, read in a worker thread; audio made
        before a cancel reached the stream is dropped."""
        while True:
            x = await self.server.in_thread(next, u.stream, None)
            if slot.stopping:
                raise shutting_down()
            if x is None or u.cancelled:
                return
            u.audio_s += len(x) / SAMPLE_RATE
            yield x

    # -- the session ---------------------------------------------------------------------------

    async def run(self) -> None:
        if not await self.start():
            if not self.gone:
                await self.ws.close(1008)
            return
        speaker = asyncio.create_task(self.speak_all())
        listener = asyncio.create_task(self.listen())
        try:
            await asyncio.wait({speaker, listener}, return_when=asyncio.FIRST_COMPLETED)
            if listener.done():  # the client left or went idle: nothing more will be said
                self.cancel_all()
                self.queue.put_nowait(None)
                await speaker
            else:  # the close has been spoken
                listener.cancel()
                await asyncio.gather(listener, return_exceptions=True)
        finally:
            self.cancel_all()
            for task in (speaker, listener):
                if not task.done():
                    task.cancel()
            await asyncio.gather(speaker, listener, return_exceptions=True)
        if not self.gone:
            await self.ws.close(1000)


async def stream_input(websocket: WebSocket) -> None:
    """/v1/audio/speech/stream-input: the API key as on every route (a refused handshake is an
    HTTP 401 in OpenAI's error shape), 503 while the server drains, then a Session."""
    server: ServerState = websocket.app.state.server
    refusal = None
    if not server.authorized(websocket.headers.get("authorization")):
        refusal = HTTPError(401, "missing or wrong API key (Authorization: Bearer KEY)", None,
                            "invalid_api_key", {"WWW-Authenticate": "Bearer"})
    elif server.draining:
        refusal = shutting_down()
    if refusal is not None:
        server.m_requests.labels(ROUTE, str(refusal.status)).inc()
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(JSONResponse(
                error_body(refusal.status, refusal.message, refusal.param, refusal.code),
                refusal.status, refusal.headers))
        else:
            await websocket.close(1008)
        return
    await websocket.accept()
    server.m_requests.labels(ROUTE, "101").inc()
    try:
        await Session(server, websocket).run()
    except (WebSocketDisconnect, OSError):
        pass
