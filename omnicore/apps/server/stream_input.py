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
                       {"type": "error", "utterance": i, "error": {OpenAI's shape}}
                                          i: the utterance whose text it drops (the one
                                          taking text, else the next) or whose audio it ends

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
import time

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from ...errors import CancelledError, OmniCoreError
from ...model.config import SAMPLE_RATE
from . import speaking
from .formats import encoded
from .protocol import (HTTPError, as_http, check_fields, concerning, error_body, forget,
                       has_words, parse_json, shutting_down, speech_options, synth_kwargs)
from .routes import check_key
from .speaking import MAX_UTTERANCES, Utterance
from .state import ServerState

ROUTE = "speech_stream_input"  # its name in the request counter
MESSAGE_KEYS = ("text", "flush", "cancel", "close")
# A cancelled utterance costs nothing: one not yet spoken is dropped at once, its audio.done
# owed as a count (Session.reported), never refused for (MAX_UTTERANCES counts the others).
class Session:
    """One socket: a listener for the client's messages and a speaker for the utterances."""

    def __init__(self, server: ServerState, ws: WebSocket):
        self.server, self.ws = server, ws
        self.opts: dict = {}
        self.prompt = None  # the voice, resolved once
        self.pending = ""  # text with nothing to say yet
        self.current: Utterance | None = None  # the one taking text now
        self.queue: asyncio.Queue = asyncio.Queue()  # utterances to speak, then None
        self.utterances: list[Utterance] = []  # started and not done (none dropped)
        self.count = 0  # utterance indices given
        self.reported = 0  # the next index whose audio.done is owed (sent in order)
        self.now: Utterance | None = None  # the one being spoken
        self.closing = False
        self.gone = False
        self.last_activity = time.monotonic()

    # -- sending -----------------------------------------------------------------------------

    async def send_event(self, event: dict) -> None:
        if not self.gone:
            await self.ws.send_text(json.dumps(event))

    def text_index(self) -> int:
        """The utterance text sent now belongs to: the one taking text, else the next."""
        return self.current.index if self.current is not None else self.count

    async def send_error(self, exc: BaseException, utterance: int) -> None:
        """An error event, naming the utterance whose text it drops or whose audio it ends."""
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
            self.opts = await asyncio.to_thread(  # off the loop, as a POST's (prose)
                speech_options, body, default_format="pcm", models=self.server.model_ids)
            if self.opts["duration"] is not None:
                raise HTTPError(400, "duration needs the whole text in advance; over this socket "
                                     "use speed", "duration", "invalid_value")
            if body.get("input") is not None:
                raise HTTPError(400, "send the text as {\"text\": ...} messages after this one",
                                "input", "invalid_input")
            await speaking.check_voice(self.server, self.opts["voice"])  # refused now, as a POST is
            return True
        except asyncio.TimeoutError:
            self.server.m_timeouts.labels("idle").inc()
            await self.send_error(HTTPError(408, "no speech fields within "
                                                 f"{self.server.idle_timeout:g} s", None,
                                            "idle_timeout"), 0)
        except HTTPError as exc:
            await self.send_error(exc, 0)  # the first utterance: none will be spoken
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
                    index = self.text_index()
                    self.cancel_all()
                    await self.send_error(HTTPError(408, "nothing received for "
                                                         f"{self.server.idle_timeout:g} s",
                                                    None, "idle_timeout"), index)
                    return
                continue
            except HTTPError as exc:
                await self.send_error(exc, self.text_index())
                continue
            if body is None:
                self.cancel_all()
                return
            try:
                self.handle(body)
            except HTTPError as exc:
                await self.send_error(exc, getattr(exc, "utterance", self.text_index()))

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
        try:
            self.current, self.pending = speaking.add_fragment(self.current, self.pending, text,
                                                               self.server)
        except HTTPError as exc:
            if self.current is not None and self.current.cancelled:  # refused whole
                exc.utterance, self.current = self.current.index, None
            raise
        if self.current is None and has_words(self.pending):  # it starts with its first words
            index, self.count = self.count, self.count + 1
            if sum(not u.cancelled for u in self.utterances) >= MAX_UTTERANCES:
                self.pending = ""  # dropped: its index gets this error, then its audio.done
                exc = HTTPError(429, f"{MAX_UTTERANCES} utterances are waiting to be spoken; "
                                     "wait for their audio.done", "text", "too_many_utterances")
                exc.utterance = index
                raise exc
            u = speaking.new_utterance(index, self.pending)
            self.utterances.append(u)
            self.pending, self.current = "", u
            self.queue.put_nowait(u)

    def flush(self) -> None:
        if self.current is not None:
            self.current.end_input()
        self.current, self.pending = None, ""  # text with nothing to say is dropped

    def cancel_all(self) -> None:
        """Barge-in: every utterance stops; those not yet being spoken are dropped at once
        (their audio.done is owed by index, in order: speak_all), so cancels never pile up."""
        self.pending, self.current = "", None
        for u in self.utterances:
            u.cancel(self.server)
        closing = False
        while not self.queue.empty():
            closing |= self.queue.get_nowait() is None
        self.utterances = [u for u in self.utterances if u is self.now]
        if closing:
            self.queue.put_nowait(None)

    # -- the speaker --------------------------------------------------------------------------

    async def speak_all(self) -> None:
        while (u := await self.queue.get()) is not None:
            self.now = u
            try:
                await self.report_dropped(u.index)
                await self.speak(u)
            finally:
                self.now = None
                u.close(self.server)
                if u in self.utterances:
                    self.utterances.remove(u)
                self.reported = u.index + 1
        await self.report_dropped(self.count)

    async def report_dropped(self, upto: int) -> None:
        """The audio.done of each utterance dropped before it was spoken, up to `upto`."""
        while self.reported < upto:
            await self.send_event({"type": "audio.done", "utterance": self.reported,
                                   "cancelled": True, "audio_seconds": 0.0,
                                   "timings": {"queue": 0.0, "first_audio": None, "total": 0.0}})
            self.reported += 1

    async def speak(self, u: Utterance) -> None:
        server = self.server
        first_audio, queued = None, 0.0
        try:
            if not u.cancelled:
                t_admit = time.perf_counter()
                async with server.slot(u.gone) as slot:
                    queued = time.perf_counter() - t_admit
                    slot.on_stop(lambda: u.cancel(server))
                    if self.prompt is None:
                        self.prompt = await speaking.voice_prompt(server, slot, self.opts["voice"])
                    kw = synth_kwargs(self.opts, self.prompt)
                    u.stream = await speaking.open_stream(server, u, kw)
                    if u.cancelled:
                        speaking.close_stream(server, u.stream)
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

    async def pieces(self, u: Utterance, slot):
        """float32 pieces [N] of the utterance's stream (speaking.pieces), its length counted."""
        async for x in speaking.pieces(self.server, u.stream, slot, lambda: u.cancelled):
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
    try:
        check_key(server, websocket.headers.get("authorization"))
        if server.draining:
            raise shutting_down()
    except HTTPError as exc:
        refusal = exc
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
