"""Pipecat's TTS on `omnicore serve`, streaming: the LLM's tokens go to the server's WebSocket
for voice agents as they come (TextAggregationMode.TOKEN: the server cuts the sentences), the
end of the LLM's response flushes the utterance, and an interruption cancels the speech on the
server within a step.

    from omnicore.apps.voice_agents.pipecat_tts import OmnicoreTTSService
    tts = OmnicoreTTSService(base_url="http://127.0.0.1:8000", voice="alloy")
    pipeline = Pipeline([transport.input(), stt, user_agg, llm, tts, transport.output(), ...])

One socket for the service's life (opened at setup, a no-op keepalive while idle so the
server's idle clock does not close it). The server speaks utterances in order and its audio
frames carry no context, so an interruption while a turn is unfinished sends a cancel and
opens a new socket, and a socket's audio is taken only while it is the service's socket: no
audio of the cancelled turn can reach the next one.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from loguru import logger
from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.utils.tracing.service_decorators import traced_tts
from websockets.protocol import State

from . import speech_socket as sock

KEEPALIVE_S = 10.0  # well inside the server's idle timeout (30 s by default)
# How long a turn may wait for its audio before Pipecat writes it off (its default, 3 s, is
# shorter than the first audio of the full model on a few CPU cores); the server's audio.done
# ends a turn as soon as it is spoken, so this only bounds a server that went silent.
FIRST_AUDIO_TIMEOUT_S = 120.0


class OmnicoreTTSService(WebsocketTTSService):
    """omnicore as a Pipecat websocket TTS. `base_url`: the server (`http://host:port`, with
    or without `/v1`); `voice`: a preset, a library voice or an alias (also
    `settings=TTSSettings(voice=...)`); `instructions`: free prose whose voice-design items
    are used; `fields`: any other speech field the server takes (seed, num_step, ...)."""

    def __init__(self, *, base_url: str = "http://127.0.0.1:8000", voice: str | None = None,
                 language: str | None = None, instructions: str | None = None,
                 speed: float | None = None, api_key: str | None = None,
                 fields: dict | None = None,
                 text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
                 settings: TTSSettings | None = None, **kwargs):
        store = TTSSettings(model="omnivoice", voice=voice, language=None)
        if settings is not None:
            store.apply_update(settings)
        kwargs.setdefault("stop_frame_timeout_s", FIRST_AUDIO_TIMEOUT_S)
        super().__init__(sample_rate=sock.SAMPLE_RATE, push_start_frame=True,
                         push_stop_frames=False, pause_frame_processing=True,
                         text_aggregation_mode=text_aggregation_mode, settings=store, **kwargs)
        self._url = sock.socket_url(base_url)
        self._headers = sock.auth_headers(api_key)
        self._speech = dict(language=language, instructions=instructions, speed=speed,
                            **(fields or {}))
        self._receive_task = None
        self._unfinished = False  # text sent that the server has not finished speaking
        self._failed_turn = None  # the turn whose text could not be sent: it ends at its flush

    def can_generate_metrics(self) -> bool:
        return True

    async def setup(self, setup):
        await super().setup(setup)
        await self._connect()

    async def _handle_interruption(self, frame, direction):
        """Barge-in: the turn's contexts go (the framework), and an unfinished turn is cancelled
        on the server with its socket."""
        await super()._handle_interruption(frame, direction)
        if self._unfinished:
            await self._disconnect()
            await self._connect()

    async def _update_settings(self, delta: TTSSettings) -> dict:
        changed = await super()._update_settings(delta)
        if changed:  # the voice is the socket's first message: a new voice, a new socket
            await self._disconnect()
            await self._connect()
        return changed

    # -- the socket ----------------------------------------------------------------------------

    async def _connect(self):
        await super()._connect()
        await self._connect_websocket()
        if self._websocket and not self._receive_task:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))
        self._create_keepalive_task(KEEPALIVE_S)

    async def _disconnect(self):
        await super()._disconnect()
        await self._cancel_keepalive_task()
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self):
        if self._websocket and self._websocket.state is State.OPEN:
            return
        try:
            self._websocket = await self._websocket_connect(self._url,
                                                            additional_headers=self._headers)
            await self._websocket.send(sock.settings(self._settings.voice, **self._speech))
            await self._call_event_handler("on_connected")
        except Exception as exc:  # noqa: BLE001 - reported as the framework reports them
            self._websocket = None
            await self.push_error_frame(ErrorFrame(error=f"{self}: cannot reach omnicore at "
                                                         f"{self._url}: {exc}", exception=exc))
            await self._call_event_handler("on_connection_error", str(exc))

    async def _disconnect_websocket(self):
        ws, self._websocket, self._unfinished = self._websocket, None, False
        try:
            if ws:  # a cancel first: the server stops the passes at once
                await ws.send(sock.CANCEL)
                await ws.close()
        except Exception as exc:  # noqa: BLE001 - a socket already gone
            logger.debug(f"{self}: closing the socket: {exc}")
        finally:
            await self._call_event_handler("on_disconnected")

    async def _send_keepalive(self):
        await self._websocket.send(sock.KEEPALIVE)

    async def _receive_messages(self):
        ws = self._websocket
        async for message in ws:
            if ws is not self._websocket:  # a socket given up (a barge-in): its audio is stale
                return
            try:
                data = sock.read(message)
            except sock.SpeechSocketError as exc:
                await self.push_error_frame(ErrorFrame(error=f"{self}: {exc}"))
                continue
            context_id = self.get_active_audio_context_id()
            if isinstance(data, bytes):
                if data:
                    await self.append_to_audio_context(context_id, TTSAudioRawFrame(
                        data, self.sample_rate, 1, context_id=context_id))
            elif not data.cancelled:  # the turn's utterance is spoken
                self._unfinished = False
                await self.append_to_audio_context(context_id,
                                                   TTSStoppedFrame(context_id=context_id))
                await self.remove_audio_context(context_id)

    # -- text in -------------------------------------------------------------------------------

    async def flush_audio(self, context_id: str | None = None):
        """The LLM's response is complete: the utterance ends, and its last words are spoken.
        A turn whose text never reached the server (reported as it failed) ends here, with its
        TTSStoppedFrame, not when Pipecat's stop-frame clock gives up on it."""
        if context_id is not None and context_id == self._failed_turn:
            self._failed_turn = None
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
        elif self._websocket:
            await self._websocket.send(sock.FLUSH)

    @traced_tts
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        if context_id == self._failed_turn:  # its error is reported: once a turn, not per token
            yield None
            return
        if not self._websocket or self._websocket.state is State.CLOSED:
            await self._connect()  # a failure is reported there
        try:
            if self._websocket is None:
                self._failed_turn = context_id
                yield None
                return
            await self._websocket.send(sock.text(text))
            self._unfinished = True
        except Exception as exc:  # noqa: BLE001 - reported as the framework reports them
            self._failed_turn = context_id
            yield ErrorFrame(error=f"{self}: {exc}")
            return
        yield None  # the audio comes through _receive_messages
