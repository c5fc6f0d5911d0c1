"""`omnicore wyoming`: the Wyoming protocol, what Home Assistant's voice pipelines speak to local
TTS, on the model's one engine (the `wyoming` extra: the protocol library Home Assistant uses).

    client -> server   describe                  -> info: the program, its model and the
                                                    weights' licence, languages, voices
                       synthesize{text, voice}   -> audio-start, audio-chunk..., audio-stop
                       synthesize-start{voice}, synthesize-chunk{text}..., synthesize-stop
                                                 -> audio-start, audio-chunk..., audio-stop,
                                                    synthesize-stopped
                       ping                      -> pong
    server -> client   error{text, code}         a bad event, a refusal; then the connection
                                                 closes, or, inside a stream, the stream ends
                                                 at its synthesize-stop (synthesize-stopped)
                                                 with no audio-stop: an empty audio pair is a
                                                 text with nothing to say, never a failure

An unknown voice is no error: --voice speaks instead (else the auto voice), with a log line.

Audio is 16-bit mono pcm at SAMPLE_RATE, sent as it is made: each text is one `model.stream`,
so a streamed text (synthesize-chunk as an LLM writes it) is spoken sentence by sentence as
each one is complete, and gives exactly the audio of the same text sent whole (the stream's
chunking decides on the text read so far: docs/streaming.md). A `synthesize` inside a stream is
the whole text again, sent for servers that cannot stream: it is ignored.

Everything else is `omnicore serve`'s: the voices (presets and the voice library, the same set),
admission (`ServerState.slot`: a text holds a place from its first words until its audio is out;
--max-queue, --max-concurrency), the text limit, the typed errors, and the clocks: a client that
stops reading for --send-timeout is cut, a connection with nothing received and nothing being
spoken for --idle-timeout is closed (the clock restarts as each text's audio ends), SIGTERM
drains for --grace. A client that leaves mid-audio has its passes cancelled at once.

Dimensions: N samples of mono float32 audio at SAMPLE_RATE.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from urllib.parse import urlsplit

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop,
                         SynthesizeStopped)

from ...audio.writers import to_pcm16
from ...machinery.checkpoint import HUB_REPO
from ...errors import CancelledError, ConfigError, InputError, OmniCoreError
from ...model.config import SAMPLE_RATE
from ...text import frontend
from . import speaking
from .protocol import (MAX_BODY_BYTES, PROFILE_LABELS, precision_note, HTTPError, as_http, check_input_length,
                       forget, has_words, shutting_down)
from .runtime import KernelSendClock, limit_send_buffer
from .speaking import MAX_UTTERANCES, Utterance
from .state import ServerState
from .voices import PRESET_VOICES

log = logging.getLogger("omnicore.wyoming")
DEFAULT_PORT = 10200  # Wyoming's TTS port
MAX_LINE_BYTES = 64 * 1024   # an event's header line (its data and payload follow it)
CHUNK_SAMPLES = 2048         # audio-chunk size: ~85 ms, small enough for a satellite's buffer
WEIGHTS = Attribution(name="k2-fsa (OmniVoice: CC-BY-NC 4.0); Boson AI (Higgs audio codec)",
                      url=f"https://huggingface.co/{HUB_REPO}")
# omnicore itself runs the model: its program names it, and points at the model it runs.
PROGRAM = Attribution(name="omnicore, running OmniVoice by k2-fsa", url=WEIGHTS.url)
LANGUAGES = sorted(frontend.supported_language_ids())
# Home Assistant lists each voice under every language it advertises: the ISO 639-1 codes (two
# letters, 125 of the 646) keep its picker usable, as wyoming-piper's do; --all-languages: all.
SHORT_LANGUAGES = [lang for lang in LANGUAGES if len(lang) == 2]


class BadEvent(Exception):
    """An event that cannot be read: `fatal` when the stream's framing is lost (a length
    that cannot be trusted), so the connection must close after the error event."""

    def __init__(self, message: str, fatal: bool = False):
        super().__init__(message)
        self.fatal = fatal


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event, or None at the end of the stream. Unlike the wyoming package's reader,
    every length is bounded before anything is allocated (BadEvent otherwise)."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BadEvent("the stream ended inside an event", fatal=True) from None
        return None
    except asyncio.LimitOverrunError:
        raise BadEvent(f"an event's header line is over {MAX_LINE_BYTES:,} bytes",
                       fatal=True) from None
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        raise BadEvent("an event's header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise BadEvent("an event's header must be a JSON object with a string 'type'")
    lengths = [header.get(k) or 0 for k in ("data_length", "payload_length")]
    if any(not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_BODY_BYTES
           for n in lengths):
        raise BadEvent(f"data_length and payload_length must be 0 to {MAX_BODY_BYTES:,} bytes",
                       fatal=True)
    data = header.get("data") or {}
    try:
        if lengths[0]:
            data = {**data, **json.loads(await reader.readexactly(lengths[0]))}
        payload = await reader.readexactly(lengths[1]) if lengths[1] else None
    except asyncio.IncompleteReadError:
        raise BadEvent("the stream ended inside an event", fatal=True) from None
    except (ValueError, RecursionError, TypeError):
        raise BadEvent("an event's data is not a JSON object") from None
    if not isinstance(data, dict):
        raise BadEvent("an event's data is not a JSON object")
    return Event(type=header["type"], data=data, payload=payload)


def wyoming_language(tag: str | None) -> str | None:
    """A Wyoming voice's language (a BCP 47 tag such as `en-US`, or a model id) -> the model's
    language id: the tag itself, else its primary subtag, else resolve_language's reading."""
    if tag is not None and not isinstance(tag, str):  # before `in`: a list is unhashable
        raise BadEvent("voice.language must be a string")
    if tag is None or tag in frontend.ID_TO_NAME:
        return tag
    primary = tag.split("-")[0].split("_")[0].lower()
    return primary if primary in frontend.ID_TO_NAME else frontend.resolve_language(tag)


class WyomingServer:
    """The listening socket, one `Connection` per client, and the shutdown."""

    def __init__(self, server: ServerState, synth: dict, voice: str | None,
                 send_timeout: float, grace: float, all_languages: bool = False):
        self.server, self.synth, self.voice = server, synth, voice
        self.send_timeout, self.grace = send_timeout, grace
        self.languages = LANGUAGES if all_languages else SHORT_LANGUAGES
        self.connections: set[Connection] = set()

    def info(self) -> Event:
        """What `describe` answers: the library's own voices, then every preset. Home Assistant
        shows a voice's description as its name, so a preset's stays the same once it is made
        (the library keeps it under its name)."""
        from ... import __version__

        def voice(name: str, description: str) -> TtsVoice:
            return TtsVoice(name=name, attribution=WEIGHTS, installed=True,
                            description=description, version=None, languages=self.languages)
        voices = self.server.voices
        made = [voice(n, voices.record(n).get("name", n)) for n in voices.names()
                if n not in PRESET_VOICES]
        presets = [voice(n, f"preset: {ins}") for n, (ins, _) in PRESET_VOICES.items()]
        profile = self.synth.get("profile") or getattr(self.server.model, "profile", "exact")
        program = TtsProgram(
            name="omnicore", attribution=PROGRAM, installed=True, version=__version__,
            description=f"OmniVoice text-to-speech ({self.server.model_name}) on numpy, 600+ "
                        "languages, voice cloning and design; the weights are CC-BY-NC 4.0"
                        + ("" if profile == "exact" else f"; profile {PROFILE_LABELS[profile]}")
                        + precision_note(self.server.model),
            voices=made + presets, supports_synthesize_streaming=True)
        return Info(tts=[program]).event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        limit_send_buffer(writer.transport)  # the send clock starts when the client stops
        conn = Connection(self, reader, writer)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    async def run(self, uri: str, on_started=None) -> None:
        """Serve `uri` (tcp://HOST:PORT or unix://PATH) until SIGTERM or SIGINT, then drain: new
        texts are refused, those in flight may finish within the grace (a second signal ends
        it), what is left is stopped, and the worker threads are waited for."""
        parts = urlsplit(uri)
        if parts.scheme == "tcp":
            listener = await asyncio.start_server(self.handle, parts.hostname or "127.0.0.1",
                                                  parts.port or DEFAULT_PORT, limit=MAX_LINE_BYTES)
        elif parts.scheme == "unix":
            listener = await asyncio.start_unix_server(self.handle, parts.path,
                                                       limit=MAX_LINE_BYTES)
        else:
            raise ConfigError(f"--uri must be tcp://HOST:PORT or unix://PATH, got {uri!r}")
        loop = asyncio.get_running_loop()
        signals = asyncio.Queue()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, signals.put_nowait, sig)
        if on_started is not None:
            on_started()
        await signals.get()
        self.server.drain()
        log.info("Draining: new texts are refused; %d in flight may finish within %g s",
                 self.server.load()["in_flight"], self.grace)
        try:
            await asyncio.wait_for(self._idle(signals), self.grace)
        except asyncio.TimeoutError:
            pass
        if self.server.load()["in_flight"]:
            log.warning("Stopping %d texts still in flight", self.server.stop_all())
        listener.close()
        for conn in list(self.connections):
            conn.close()
        await loop.run_in_executor(None, self.server.close, 30.0)

    async def _idle(self, signals: asyncio.Queue) -> None:
        """Until nothing is in flight, or a second signal."""
        while self.server.load()["in_flight"] and signals.empty():
            await asyncio.sleep(0.05)


class Connection:
    """One client: a reader that handles its events in order, and a speaker that says its texts
    in order (each text a `speaking.Utterance`: fragments in, one model.stream)."""

    def __init__(self, door: WyomingServer, reader, writer):
        self.door, self.server = door, door.server
        self.reader, self.writer = reader, writer
        self.texts: asyncio.Queue = asyncio.Queue()  # (utterance, (voice, language), streamed)
        self.utterances: list[Utterance] = []  # started and not spoken
        self.stream: dict | None = None  # the open text stream: its voice, its text so far
        self.count = 0
        self.gone = False
        self.quiet_since = 0.0  # the idle clock's start: the last event received or text spoken
        # A client that takes no bytes for the send timeout is cut. On Linux the clock runs from
        # its last acknowledged byte (as `omnicore serve`'s); elsewhere from when a write
        # blocks, which comes later, once the kernel's buffer has filled.
        self.clock = KernelSendClock(writer.get_extra_info("socket"), door.send_timeout,
                                     asyncio.get_running_loop().time())

    async def send(self, event: Event) -> None:
        """Write an event (the send clock cuts a client that stops reading)."""
        if self.gone:
            return
        try:
            await asyncio.wait_for(async_write_event(event, self.writer),
                                   None if self.clock.works else self.door.send_timeout)
        except asyncio.TimeoutError:
            self.cut()
        except (ConnectionError, OSError):
            self.close()

    async def watch_send(self) -> None:
        """The kernel's send clock (KernelSendClock), for the connection's life."""
        loop = asyncio.get_running_loop()
        while not self.gone:
            step = self.clock.look(loop.time(), self.writer.transport.get_write_buffer_size())
            if step is None:
                return
            if self.clock.expired:
                return self.cut()
            await asyncio.sleep(step)

    def cut(self) -> None:
        self.server.m_timeouts.labels("send").inc()
        log.info("Cut a client that took no audio for %g s (--send-timeout)",
                 self.door.send_timeout)
        self.close()

    async def send_error(self, exc: BaseException) -> None:
        e = as_http(exc) if not isinstance(exc, BadEvent) else HTTPError(400, str(exc), None,
                                                                          "invalid_message")
        await self.send(Error(text=e.message, code=e.code).event())

    async def fail(self, exc: BaseException) -> None:
        """An error event, then the end of the exchange as Home Assistant reads it: it ignores
        `error` and reads until audio-stop, synthesize-stopped or the connection's end. Inside
        a text stream, the stream is refused (its text so far unsaid, its further chunks
        ignored) and still ends with synthesize-stopped at its synthesize-stop; otherwise the
        connection closes after the error, as wyoming-piper's does: Home Assistant takes that
        as a failed text, where an empty audio-start/audio-stop pair would read as a success
        with no audio."""
        await self.send_error(exc)
        if self.stream is None:
            self.close()
        else:
            self.stream["failed"] = True
            if self.stream["utterance"] is not None:
                self.stream["utterance"].cancel(self.server)

    def close(self) -> None:
        """The client is gone (or cut): its texts are cancelled, their passes leave the engine."""
        self.gone = True
        for u in self.utterances:
            u.cancel(self.server)
        self.writer.transport.abort()

    # -- the client's events --------------------------------------------------------------------

    async def run(self) -> None:
        speaker = asyncio.create_task(self.speak_all())
        clock = asyncio.create_task(self.watch_send()) if self.clock.works else None
        try:
            await self.listen()
        finally:
            if clock is not None:
                clock.cancel()
            # The client left, was cut or went idle: nobody hears what is still to come, so it
            # stops now (a client's end of input is its end: Wyoming clients never half-close).
            self.close()
            self.texts.put_nowait(None)
            await asyncio.gather(speaker, return_exceptions=True)

    async def next_event(self) -> Event | None:
        """The next event; TimeoutError once nothing was received and nothing spoken for the
        idle timeout. One read runs throughout (a timeout never cuts an event in half), and
        the clock is looked at again whenever it could have run out: a text's end re-arms it."""
        loop = asyncio.get_running_loop()
        idle = self.server.idle_timeout
        self.quiet_since = loop.time()
        read = asyncio.ensure_future(read_event(self.reader))
        try:
            while True:
                # While speaking, look again after a whole timeout (speaking is not idleness).
                left = idle if self.utterances else self.quiet_since + idle - loop.time()
                done, _ = await asyncio.wait({read}, timeout=max(left, 0.0))
                if done:
                    return read.result()
                if not self.utterances and loop.time() >= self.quiet_since + idle:
                    raise asyncio.TimeoutError
        finally:
            if not read.done():
                read.cancel()

    async def listen(self) -> None:
        """Handle events until the client leaves, goes idle, or breaks the stream's framing."""
        while not self.gone:
            try:
                event = await self.next_event()
            except asyncio.TimeoutError:
                self.server.m_timeouts.labels("idle").inc()
                await self.send_error(HTTPError(408, "nothing received for "
                                                     f"{self.server.idle_timeout:g} s", None,
                                                "idle_timeout"))
                return
            except BadEvent as exc:
                await self.fail(exc)
                if exc.fatal:
                    return
                continue
            except (ConnectionError, OSError):
                return
            if event is None:
                return
            try:
                await self.handle(event)
            except Exception as exc:  # noqa: BLE001 - no event may drop the connection unanswered
                if not isinstance(exc, (HTTPError, BadEvent, OmniCoreError)):
                    log.exception("An event failed (%s)", event.type)
                await self.fail(exc)
                forget(exc)

    async def handle(self, event: Event) -> None:
        # The library is read in a worker thread: a slow or hostile file never holds the loop.
        if Describe.is_type(event.type):
            await self.send(await self.server.in_thread(self.door.info))
        elif Ping.is_type(event.type):
            await self.send(Pong(text=event.data.get("text")).event())
        elif Synthesize.is_type(event.type):
            if self.stream is None:  # inside a stream it repeats the stream's text: ignored
                voice = await self.server.in_thread(self.voice_of, event)
                self.add_text(voice, _text(event.data), streamed=False).end_input()
        elif SynthesizeStart.is_type(event.type):
            if self.stream is not None:
                raise BadEvent("synthesize-start inside a stream: send synthesize-stop first")
            # Open before its voice is read: a refused start still ends at its synthesize-stop.
            self.stream = {"voice": None, "pending": "", "utterance": None, "failed": False}
            self.stream["voice"] = await self.server.in_thread(self.voice_of, event)
        elif SynthesizeChunk.is_type(event.type):
            if self.stream is None:
                raise BadEvent("synthesize-chunk outside a stream: send synthesize-start first")
            if not self.stream["failed"]:
                self.add_stream_text(_text(event.data))
        elif SynthesizeStop.is_type(event.type):
            if self.stream is None:
                raise BadEvent("synthesize-stop outside a stream")
            stream, self.stream = self.stream, None
            if stream["utterance"] is not None:
                stream["utterance"].end_input()
            else:
                # Nothing to say: an empty audio pair (a success with no audio), but a refused
                # stream gets none, so that its end never reads as a success.
                self.texts.put_nowait((None, "failed" if stream["failed"] else None, True))
        # Other events (another program's, or newer ones) are dropped, as Wyoming asks.

    def voice_of(self, event: Event) -> tuple[str | None, str | None]:
        """(voice name, language id) of a synthesize or synthesize-start, checked now."""
        voice = event.data.get("voice") or {}
        if not isinstance(voice, dict):
            raise BadEvent("voice must be an object {name, language, speaker}")
        name = voice.get("name", self.door.voice)
        if name is not None and not isinstance(name, str):
            raise BadEvent("voice.name must be a string")
        language = wyoming_language(voice.get("language")) or self.door.synth.get("language")
        if name is not None and not self.has_voice(name):
            # As wyoming-piper does: the voice Home Assistant remembers may be gone (deleted,
            # or another server's), and an answer in the default voice beats none.
            default = self.door.voice
            fallback = default if default not in (None, name) and self.has_voice(default) else None
            log.warning("Unknown voice %r: speaking with %s instead", name,
                        repr(fallback) if fallback else "the model's auto voice")
            name = fallback
        return name, language

    def has_voice(self, name: str) -> bool:
        """Whether `name` is a voice here; a voice another codec made is refused, not
        replaced: its owner is told how to make it again."""
        try:
            self.server.check_voice(name)
        except HTTPError as exc:
            if exc.code == "voice_made_by_another_model":
                raise
            return False
        except OmniCoreError:
            return False
        return True

    def add_stream_text(self, fragment: str) -> None:
        stream = self.stream
        if stream["utterance"] is not None:
            check_input_length(stream["utterance"].chars + len(fragment))
        stream["utterance"], stream["pending"] = speaking.add_fragment(
            stream["utterance"], stream["pending"], fragment, self.server)
        if stream["utterance"] is None and has_words(stream["pending"]):  # admitted from its words
            stream["utterance"] = self.add_text(stream["voice"], stream["pending"], streamed=True)

    def add_text(self, voice, text: str, streamed: bool) -> Utterance:
        if streamed:
            check_input_length(len(text))
        else:
            speaking.check_text(text, "text")
        if self.server.draining:
            raise shutting_down()
        if len(self.utterances) >= MAX_UTTERANCES:
            raise HTTPError(429, f"{MAX_UTTERANCES} texts are waiting to be spoken on this "
                                 "connection; wait for their audio-stop", "text",
                            "too_many_utterances")
        u = speaking.new_utterance(self.count, text)
        self.count += 1
        self.utterances.append(u)
        self.texts.put_nowait((u, voice, streamed))
        return u

    # -- the speaker ----------------------------------------------------------------------------

    async def speak_all(self) -> None:
        while (item := await self.texts.get()) is not None:
            u, voice, streamed = item
            try:
                if u is not None:
                    await self.speak(u, *voice)
                elif voice != "failed":
                    await self.send(AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event())
                    await self.send(AudioStop().event())
            except CancelledError:
                pass
            except Exception as exc:  # noqa: BLE001 - a text's failure is an error event
                await self.send_error(exc)
                forget(exc)
                if not streamed:  # the end Home Assistant reads (fail): the connection's
                    self.close()
            finally:
                if u is not None:
                    u.close(self.server)
                    self.utterances.remove(u)
                    self.quiet_since = asyncio.get_running_loop().time()  # the idle clock restarts
            if streamed:
                await self.send(SynthesizeStopped().event())

    async def speak(self, u: Utterance, voice: str | None, language: str | None) -> None:
        """One text: admitted, its voice resolved, its stream's pieces sent as audio-chunks
        between an audio-start and an audio-stop."""
        server = self.server
        async with server.slot(u.gone) as slot:
            slot.on_stop(lambda: u.cancel(server))
            kw = speaking.with_voice({**self.door.synth, "language": language},
                                     await speaking.voice_prompt(server, slot, voice))
            u.stream = await speaking.open_stream(server, u, kw)
            if u.cancelled:  # refused while it waited (its error is out): no audio pair
                raise CancelledError("the text was refused")
            await self.send(AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event())
            async for x in speaking.pieces(server, u.stream, slot, lambda: u.cancelled):
                if self.gone:
                    break
                pcm = to_pcm16(x).tobytes()  # [N] -> 2N bytes
                for i in range(0, len(pcm), 2 * CHUNK_SAMPLES):
                    await self.send(AudioChunk(rate=SAMPLE_RATE, width=2, channels=1,
                                               audio=pcm[i:i + 2 * CHUNK_SAMPLES]).event())
            if u.cancelled:  # a cut-short text has no audio-stop: it never reads as whole
                raise CancelledError("the text was refused")
            await self.send(AudioStop().event())


def _text(data: dict) -> str:
    text = data.get("text")
    if not isinstance(text, str):
        raise BadEvent("text must be a string")
    return text


def serve(model_path: str, uri: str, voice: str | None, synth: dict, precision: str = "fp32",
          send_timeout: float = 30.0, grace: float = 30.0, quiet: bool = False,
          all_languages: bool = False, **state_args) -> None:
    """Load the model once, compile its kernels (ServerState.warm_up), and serve Wyoming on `uri`
    until a signal, then drain. `voice`: the
    voice of a text whose event names none (None: the model's auto voice); `synth`: the
    generation settings of every text (language, seed, speed, GenerationConfig fields);
    `all_languages`: each voice advertises all 646 language ids, not the ISO 639-1 ones;
    `state_args`: ServerState's (voices_dir, max_queue, max_concurrency, idle_timeout)."""
    from . import log_model, log_to_stderr, server_state

    log_to_stderr(log, quiet)
    server = server_state(model_path, precision, default_voice=voice, **state_args)
    if voice is not None:
        try:
            server.check_voice(voice)
        except HTTPError as exc:
            raise InputError(f"--voice: {exc}") from None

    log_model(log, server, model_path)
    server.warm_up(log)  # before it listens: a client never waits for a compile or its voice

    door = WyomingServer(server, synth, voice, send_timeout, grace, all_languages)

    def started():
        log.info("Wyoming: ready, listening on %s (default voice: %s; %d languages per "
                 "voice%s)", uri, voice or "auto", len(door.languages),
                 "" if all_languages else ", --all-languages for all")
    asyncio.run(door.run(uri, started))
