"""LiveKit Agents' TTS on `omnicore serve`, streaming: the LLM's tokens go to the server's
WebSocket for voice agents as they are written, so an agent needs no StreamAdapter (a request
per sentence), and a barge-in cancels the speech on the server within a step.

    from omnicore.apps.voice_agents.livekit_tts import TTS
    session = AgentSession(tts=TTS(base_url="http://127.0.0.1:8000", voice="alloy"), ...)

One socket per stream (`tts.stream()`, or `tts.synthesize(text)` through it), which the server
admits like any request; the stream's one segment is the text pushed until its end, each
`flush()` ending an utterance on the server. Closing the stream before its end (the agent
is interrupted) sends a cancel and closes the socket: the server stops the passes at once.
"""

from __future__ import annotations

import asyncio
import contextlib

import websockets
from livekit.agents import APIConnectionError, APIConnectOptions, APIError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS

from . import speech_socket as sock


class TTS(tts.TTS):
    """omnicore as a streaming LiveKit TTS. `base_url`: the server (`http://host:port`, with
    or without `/v1`); `voice`: a preset, a library voice or an alias; `instructions`: free
    prose whose voice-design items are used; `fields`: any other speech field the server
    takes (seed, num_step, ...)."""

    def __init__(self, *, base_url: str = "http://127.0.0.1:8000", voice: str | None = None,
                 language: str | None = None, instructions: str | None = None,
                 speed: float | None = None, api_key: str | None = None, **fields) -> None:
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True),
                         sample_rate=sock.SAMPLE_RATE, num_channels=1)
        self._url = sock.socket_url(base_url)
        self._headers = sock.auth_headers(api_key)
        self._settings = sock.settings(voice, language, instructions, speed, **fields)

    @property
    def model(self) -> str:
        return "omnivoice"

    @property
    def provider(self) -> str:
        return "omnicore"

    def synthesize(self, text: str, *,
                   conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> tts.ChunkedStream:
        return self._synthesize_with_stream(text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
               ) -> tts.SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)


class SynthesizeStream(tts.SynthesizeStream):
    """One socket: a sender forwards the pushed text (flushes as flushes, the input's end as
    close) while the stream reads audio until the server, having spoken everything, closes."""

    _tts: TTS

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid()
        output_emitter.initialize(request_id=request_id, sample_rate=sock.SAMPLE_RATE,
                                  num_channels=1, mime_type="audio/pcm", stream=True)
        try:
            ws = await asyncio.wait_for(websockets.connect(
                self._tts._url, additional_headers=self._tts._headers),
                self._conn_options.timeout)
        except (OSError, asyncio.TimeoutError, websockets.InvalidHandshake) as exc:
            raise APIConnectionError(f"cannot reach omnicore at {self._tts._url}: {exc}") from exc
        finished = False
        sender = None
        try:
            await ws.send(self._tts._settings)
            output_emitter.start_segment(segment_id=request_id)
            sender = asyncio.create_task(self._send(ws))
            async for message in ws:  # until the server closes, after the close is spoken
                data = sock.read(message)
                if isinstance(data, bytes) and data:
                    output_emitter.push(data)
            await sender
            finished = True
        except sock.SpeechSocketError as exc:
            raise APIError(f"omnicore: {exc}", body=exc.error, retryable=False) from None
        except websockets.ConnectionClosedError as exc:
            raise APIConnectionError(f"omnicore closed the socket: {exc}") from exc
        finally:
            if sender is not None:
                sender.cancel()
            if not finished:  # barge-in or failure: stop the server's passes now
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ws.send(sock.CANCEL), 1.0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), 1.0)

    async def _send(self, ws) -> None:
        async for item in self._input_ch:
            if isinstance(item, self._FlushSentinel):
                await ws.send(sock.FLUSH)
            else:
                self._mark_started()
                await ws.send(sock.text(item))
        await ws.send(sock.CLOSE)
