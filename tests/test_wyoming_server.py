"""`omnicore wyoming` as Home Assistant reaches it: a subprocess on the tiny checkpoint, driven
by the `wyoming` package's own client. describe lists the voices; a one-shot text and the same
text streamed in fragments give exactly `model.stream`'s audio, sent as it is made; an unknown
voice speaks as the default one; every error ends the exchange where Home Assistant stops
reading (the connection's end, or a stream's synthesize-stopped); a client that leaves frees
its passes, one that stops reading is cut; a silent client is closed; SIGTERM drains."""

import asyncio
import json
import signal
import socket
import time

import numpy as np
import pytest

from conftest import HOUSE, TINY, doc_examples, require_module, start_wyoming, stop_process  # noqa: E402

require_module("wyoming", "wyoming")
from wyoming.audio import AudioChunk, AudioStart  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.event import Event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop,  # noqa: E402
                         SynthesizeStopped, SynthesizeVoice)

from omnicore.audio.writers import to_pcm16  # noqa: E402
from omnicore.apps.server.state import ServerState  # noqa: E402
from omnicore.apps.server.wyoming_server import MAX_LINE_BYTES, WyomingServer  # noqa: E402

SETTINGS = ("--steps", "4", "--seed", "7")  # seeded sampling: one client, so nothing shares a pass
# The door's default profile is live (no --profile): its audio is the model's live stream.
KWARGS = {"num_step": 4, "seed": 7, "profile": "live"}
VOICE = HOUSE  # a library voice (conftest.house_voices)
STORY = ("The first sentence is short. The second sentence comes after it and is longer. "
         "A third sentence closes the little story.")
IDLE_S = 4


@pytest.fixture(scope="module")
def served(house_voices, tmp_path_factory):
    """(port, the server's log: its stdout and stderr)."""
    log = tmp_path_factory.mktemp("wyoming") / "server.log"
    proc, port = start_wyoming(house_voices, "--voice", VOICE, "--idle-timeout", IDLE_S,
                               *SETTINGS, log_path=log)
    yield port, log
    stop_process(proc, 30)


@pytest.fixture(scope="module")
def port(served):
    return served[0]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


async def until(client, *types) -> tuple[list[Event], bytes]:
    """The events up to one of `types` (included), and the audio they carried."""
    events, audio = [], b""
    while True:
        event = await client.read_event()
        assert event is not None, ("connection closed", [e.type for e in events])
        events.append(event)
        if AudioChunk.is_type(event.type):
            audio += AudioChunk.from_event(event).audio
        if event.type in types:
            return events, audio


async def ha_reads(client, stream=False) -> list[Event | None]:
    """What Home Assistant's wyoming/tts.py reads of a reply: events until audio-stop (a
    stream's: synthesize-stopped) or the connection's end (None, last), past `error` events."""
    events, last = [], SynthesizeStopped().event().type if stream else "audio-stop"
    while True:
        event = await client.read_event()
        events.append(event)
        if event is None or event.type == last:
            return events


def streamed(tiny_model, text, **kw) -> bytes:
    return np.concatenate([to_pcm16(x) for x in tiny_model.stream(text, **kw)]).tobytes()


@pytest.mark.subprocess
def test_describe_lists_the_presets_and_the_library(port):
    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(Describe().event())
            return Info.from_event(await c.read_event())
    info = run(talk())
    (program,) = info.tts
    assert program.name == "omnicore" and program.installed
    assert program.supports_synthesize_streaming
    assert "CC-BY-NC" in program.description + program.voices[0].attribution.name
    names = [v.name for v in program.voices]
    assert names[0] == VOICE and {"alloy", "ash", "nova", "marin", "cedar"} <= set(names)
    assert all(v.installed and "en" in v.languages and "zh" in v.languages for v in program.voices)
    assert all(len(lang) == 2 for lang in program.voices[0].languages)  # ISO 639-1: HA's picker


@pytest.mark.subprocess
def test_a_voice_keeps_its_description_once_made(port, house_voices):
    """Home Assistant shows a voice's description as its name: a preset's first use (which
    designs it and keeps it in the library) changes neither it nor the voices' order."""
    async def describe(c):
        await c.write_event(Describe().event())
        voices = Info.from_event(await c.read_event()).tts[0].voices
        return [(v.name, v.description) for v in voices]

    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            before = await describe(c)
            await c.write_event(Synthesize(text="Hi.", voice=SynthesizeVoice(name="cedar")).event())
            await until(c, "audio-stop")
            return before, await describe(c)
    assert not (house_voices / "cedar.npz").exists()
    before, after = run(talk())
    assert (house_voices / "cedar.npz").exists()  # made now
    assert after == before
    assert ("cedar", "preset: male, elderly, low pitch, american accent") in after


def test_describe_languages_and_profile_label(tiny_model, house_voices):
    """In-process: --all-languages lists all 646 ids; a profile but exact is named approximate."""
    server = ServerState(tiny_model, voices_dir=house_voices)

    def program(synth=None, **kw):
        door = WyomingServer(server, synth or {}, None, 5.0, 5.0, **kw)
        return Info.from_event(door.info()).tts[0]
    try:
        assert len(program().voices[0].languages) == 125
        assert len(program(all_languages=True).voices[0].languages) == 646
        assert "approximate" not in program().description
        assert "live (approximate)" in program({"profile": "live"}).description
        assert "fast (approximate)" in program({"profile": "fast"}).description
        assert "precision" not in program({"profile": "live"}).description  # fp32 goes unsaid
    finally:
        server.pool.shutdown()


def test_describe_labels_the_int8_precision(house_voices):
    """A model loaded at --precision int8: the program's description says so, approximate."""
    from omnicore import OmniVoice

    server = ServerState(OmniVoice.from_pretrained(TINY, precision="int8", profile="live"),
                         voices_dir=house_voices)
    try:
        desc = Info.from_event(WyomingServer(server, {}, None, 5.0, 5.0).info()).tts[0].description
        assert desc.endswith("; profile live (approximate); precision int8 (approximate)"), desc
    finally:
        server.pool.shutdown()


@pytest.mark.subprocess
def test_one_shot_and_streamed_text_speak_as_the_model_streams(port, tiny_model, house_voices):
    """A synthesize is answered audio-start, audio-chunks, audio-stop: the pieces of
    `model.stream` of the text with the same voice and settings, as 16-bit pcm. The same text
    streamed in word by word (with Home Assistant's compatibility synthesize inside the stream,
    ignored) gives exactly the same bytes, then synthesize-stopped; and its first sentence is
    heard before the rest of the text is even sent: spoken as it is complete, sent as made."""
    from omnicore import VoiceClonePrompt

    prompt = VoiceClonePrompt.load(house_voices / f"{VOICE}.npz")
    want = streamed(tiny_model, STORY, voice_clone_prompt=prompt, **KWARGS)
    cut = STORY.index("A third")  # two sentences: over 2 s of speech, the stream's chunk 0
    first, rest = STORY[:cut].strip(), STORY[cut:]

    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(Synthesize(text=STORY, voice=SynthesizeVoice(name=VOICE)).event())
            events, audio = await until(c, "audio-stop")
            await c.write_event(SynthesizeStart(voice=SynthesizeVoice(name=VOICE)).event())
            for word in first.split(" "):
                await c.write_event(SynthesizeChunk(text=word + " ").event())
            early, early_audio = await until(c, "audio-chunk")  # nothing more has been sent
            for word in rest.split(" "):
                await c.write_event(SynthesizeChunk(text=word + " ").event())
            await c.write_event(Synthesize(text=STORY, voice=SynthesizeVoice(name=VOICE)).event())
            await c.write_event(SynthesizeStop().event())
            late, late_audio = await until(c, SynthesizeStopped().event().type)
            return events, audio, early + late, early_audio + late_audio
    events, audio, stream_events, stream_audio = run(talk())
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (24000, 2, 1)
    chunks = [e.type for e in events[1:-1]]
    assert chunks == ["audio-chunk"] * len(chunks) and len(chunks) >= 3
    assert audio == want
    kinds = [e.type for e in stream_events]
    assert kinds[0] == "audio-start" and kinds[-2:] == ["audio-stop", "synthesize-stopped"]
    assert kinds.count("audio-start") == 1  # the compatibility synthesize said nothing more
    assert stream_audio == want


@pytest.mark.subprocess
def test_voice_language_and_default_voice(port, tiny_model, house_voices):
    """No voice named: the server's --voice. A voice's BCP 47 language reaches the model as
    its language id (en-US -> en)."""
    from omnicore import VoiceClonePrompt

    prompt = VoiceClonePrompt.load(house_voices / f"{VOICE}.npz")

    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(Synthesize(text="Hello there.").event())
            _, plain = await until(c, "audio-stop")
            await c.write_event(Synthesize(text="Hello there.", voice=SynthesizeVoice(
                language="en-US")).event())
            _, english = await until(c, "audio-stop")
            return plain, english
    plain, english = run(talk())
    assert plain == streamed(tiny_model, "Hello there.", voice_clone_prompt=prompt, **KWARGS)
    assert english == streamed(tiny_model, "Hello there.", voice_clone_prompt=prompt, language="en",
                               **KWARGS)
    assert english != plain


@pytest.mark.subprocess
def test_an_unknown_voice_speaks_as_the_default_voice(served, tiny_model, house_voices):
    """A voice the server does not have (one Home Assistant remembers, since deleted) is no
    error: the server's --voice speaks it, one-shot and streamed alike, and the log says so."""
    from omnicore import VoiceClonePrompt

    port, log = served
    prompt = VoiceClonePrompt.load(house_voices / f"{VOICE}.npz")
    gone = SynthesizeVoice(name="gone")

    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(Synthesize(text="Hi.", voice=gone).event())
            one_shot = await until(c, "audio-stop")
            await c.write_event(SynthesizeStart(voice=gone).event())
            for word in ("Hi.", " Bye."):
                await c.write_event(SynthesizeChunk(text=word).event())
            await c.write_event(SynthesizeStop().event())
            return one_shot, await until(c, SynthesizeStopped().event().type)
    (events, audio), (stream_events, stream_audio) = run(talk())
    assert "error" not in [e.type for e in events + stream_events]
    assert audio == streamed(tiny_model, "Hi.", voice_clone_prompt=prompt, **KWARGS)
    assert stream_audio == streamed(tiny_model, "Hi. Bye.", voice_clone_prompt=prompt, **KWARGS)
    assert "Unknown voice 'gone'" in log.read_text()


@pytest.mark.subprocess
def test_an_error_ends_the_reply_where_home_assistant_stops_reading(port):
    """Home Assistant reads past `error` events until audio-stop, synthesize-stopped or the
    connection's end: any refused event gets its error, then the connection closes."""
    refused = [  # (event, the error's code)
        (Synthesize(text=""), "invalid_input"),
        (Synthesize(text="..."), "invalid_input"),
        (Synthesize(text="x" * 20_001), "input_too_long"),
        (Event("synthesize", {"text": 5}), "invalid_message"),
        (Event("synthesize", {"text": "Hi.", "voice": {"language": ["en"]}}), "invalid_message"),
        (Event("synthesize", {"text": "Hi.", "voice": {"language": {"en": 1}}}), "invalid_message"),
        (Event("synthesize", {"text": "Hi.", "voice": "alloy"}), "invalid_message"),
        (SynthesizeChunk(text="Hi."), "invalid_message"),  # outside a stream
        (SynthesizeStop(), "invalid_message"),
    ]

    async def reply(event):
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(event if isinstance(event, Event) else event.event())
            return await ha_reads(c)
    for event, code in refused:
        events = run(reply(event))
        assert [e and e.type for e in events] == ["error", None], (event, events)
        assert Error.from_event(events[0]).code == code, (event, events[0].data)
    assert "nothing to say" in Error.from_event(run(reply(Synthesize(text="...")))[0]).text


@pytest.mark.subprocess
def test_a_refused_stream_still_ends_with_synthesize_stopped(port):
    """An error inside a stream (a bad synthesize-start, a text over the limit, before or after
    its first words are being spoken) is one error event; the stream's further chunks are
    ignored and its synthesize-stop is answered synthesize-stopped, on a connection that
    stays usable."""
    streams = [
        [Event("synthesize-start", {"voice": {"language": ["en"]}}), SynthesizeChunk(text="Hi.")],
        [SynthesizeStart().event(), SynthesizeChunk(text="x" * 20_001).event(),
         SynthesizeChunk(text="Hi.").event()],
        [SynthesizeStart().event(), SynthesizeChunk(text="Hello there, friend. ").event(),
         SynthesizeChunk(text="x" * 20_000).event(), SynthesizeChunk(text="Hi.").event()],
    ]

    async def talk():
        replies = []
        async with AsyncTcpClient("127.0.0.1", port) as c:
            for stream in streams:
                for event in stream:
                    await c.write_event(event if isinstance(event, Event) else event.event())
                await c.write_event(SynthesizeStop().event())
                replies.append(await ha_reads(c, stream=True))
            await c.write_event(Synthesize(text="Still here.").event())
            return replies, await until(c, "audio-stop")
    replies, (after, audio) = run(talk())
    for events in replies:
        kinds = [e and e.type for e in events]
        assert kinds[-1] == "synthesize-stopped" and kinds.count("error") == 1, kinds
        # A failure never reads as a success: no audio-stop closes a refused stream (an empty
        # audio-start/audio-stop pair is what a text with nothing to say gets).
        assert "audio-stop" not in kinds, kinds
    assert [e.type for e in replies[0]] == ["error", "synthesize-stopped"]
    assert [e.type for e in replies[1]] == ["error", "synthesize-stopped"]
    assert after[0].type == "audio-start" and audio


@pytest.mark.subprocess
def test_an_empty_stream_is_an_empty_audio_pair(port):
    """A stream with nothing to say is a success with no audio: an empty pair, no error."""
    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(SynthesizeStart().event())
            await c.write_event(SynthesizeStop().event())
            return await ha_reads(c, stream=True)
    kinds = [e and e.type for e in run(talk())]
    assert kinds == ["audio-start", "audio-stop", "synthesize-stopped"], kinds


@pytest.mark.subprocess
def test_unreadable_events_get_an_error_then_the_connection_closes(port):
    async def reply(line: bytes):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(line + b"\n")
        await writer.drain()
        head = json.loads(await reader.readline())
        data = json.loads(await reader.readexactly(head["data_length"]))
        closed = await reader.read() == b""
        writer.close()
        return head["type"], data, closed
    answers = [run(reply(line)) for line in [
        b"{not json", b'"a string"',
        # A length that cannot be trusted.
        json.dumps({"type": "synthesize", "data_length": 2**40}).encode()]]
    assert all(kind == "error" and data["code"] == "invalid_message" and closed
               for kind, data, closed in answers), answers
    assert "data_length" in answers[-1][1]["text"]


@pytest.mark.subprocess
def test_an_unknown_event_is_dropped(port):
    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(Event("not-ours", {}))  # dropped, as Wyoming asks
            await c.write_event(Synthesize(text="Still here.").event())
            return await until(c, "audio-stop")
    events, audio = run(talk())
    assert events[0].type == "audio-start" and audio


@pytest.mark.subprocess
def test_a_silent_client_is_closed_after_the_idle_timeout(port):
    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            event = await asyncio.wait_for(c.read_event(), IDLE_S + 30)
            return Error.from_event(event), await c.read_event()
    error, after = run(talk())
    assert error.code == "idle_timeout" and after is None


@pytest.mark.subprocess
def test_a_client_that_has_spoken_is_still_idled_out(port):
    """The idle clock starts again once a text's audio is out: a client that spoke once and then
    went silent is closed after the idle timeout like one that never spoke."""
    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(Synthesize(text="Hi there.").event())
            await until(c, "audio-stop")
            event = await asyncio.wait_for(c.read_event(), IDLE_S + 30)
            return event and Error.from_event(event), await c.read_event()
    error, after = run(talk())
    assert error is not None and error.code == "idle_timeout" and after is None


@pytest.mark.subprocess
def test_start_up_lines_reach_stderr(served):
    """What an operator checks first, at INFO (the `omnicore` logger keeps only warnings)."""
    port, log = served
    text = log.read_text()
    assert "model tiny-random" in text and "Voices: 1 in" in text
    assert f"ready, listening on tcp://127.0.0.1:{port}" in text and "125 languages" in text
    assert "Profile: live (approximate) for requests that name none" in text


LONG = " ".join(f"Sentence {i} of a story that goes on and on." for i in range(400))


def test_a_client_that_stops_reading_is_cut_and_counted(tiny_model, house_voices):
    """In-process, so the count is read where the server keeps it: a client that asks for a
    long text and never reads (a small receive buffer) is cut by the send clock, counted as a
    send timeout, and its connection is gone from the server; the stream it cut short counts
    as cancelled, as the HTTP door's do."""
    server = ServerState(tiny_model, voices_dir=house_voices)
    door = WyomingServer(server, dict(KWARGS), None, 1.0, 1.0)

    async def stall():
        listener = await asyncio.start_server(door.handle, "127.0.0.1", 0, limit=MAX_LINE_BYTES)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(listener.sockets[0].getsockname())
        sock.sendall(json.dumps({"type": "synthesize", "data": {"text": LONG}}).encode() + b"\n")
        while not door.connections:
            await asyncio.sleep(0.05)
        while door.connections:  # until the server lets it go
            await asyncio.sleep(0.05)
        listener.close()
        return sock
    try:
        sock = run(stall())
        assert server.registry.get_sample_value("omnicore_timeouts_total", {"kind": "send"}) == 1
        cancelled = lambda: server.registry.get_sample_value("omnicore_streams_cancelled_total")  # noqa: E731
        deadline = time.monotonic() + 60  # the stream is closed in a worker thread
        while cancelled() != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cancelled() == 1
        sock.settimeout(60)  # what the kernels held still arrives, then the end (no timeout)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        sock.close()
    finally:
        server.stop_all()
        server.close(30)


@pytest.mark.subprocess
def test_a_client_that_leaves_or_stops_reading_frees_its_place_and_sigterm_drains(house_voices,
                                                                                 tmp_path):
    """With one place (--max-queue 1), a text far too long to finish in this test: a client that
    leaves mid-audio frees the place at once, and so does one that stops reading, once the send
    timeout has passed (each time the next client is admitted and spoken to); a text in flight
    at SIGTERM is spoken to its end while a new one is refused, then the server exits 0."""
    proc, port = start_wyoming(house_voices, "--max-queue", "1", "--grace", "600",
                               "--send-timeout", "2", *SETTINGS, log_path=tmp_path / "server.log")
    try:
        async def leave_mid_audio():
            async with AsyncTcpClient("127.0.0.1", port) as c:
                await c.write_event(Synthesize(text=LONG).event())
                await until(c, "audio-chunk")

        async def stop_reading():
            """A client whose receive buffer is small and who reads nothing after its first
            event. That event says it was admitted: the place may still be held for a moment
            by the client before, and a refused client is closed, never cut."""
            for _ in range(300):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port))
                reader, writer = await asyncio.open_connection(sock=sock)
                writer.write(json.dumps({"type": "synthesize", "data": {"text": LONG}}).encode()
                             + b"\n")
                await writer.drain()
                first = json.loads(await asyncio.wait_for(reader.readline(), 60))
                if first["type"] != "error":
                    return writer
                assert first["data"]["code"] == "queue_full"
                writer.close()
                await asyncio.sleep(0.1)
            raise AssertionError("the stalled client was never admitted")

        async def admitted(text):
            """The client is refused while the place is taken; returns its audio once spoken
            (within ~30 s: the long text takes minutes, and a stalled client's buffers, a few
            hundred kB, fill in seconds)."""
            for _ in range(300):
                async with AsyncTcpClient("127.0.0.1", port) as c:
                    await c.write_event(Synthesize(text=text).event())
                    events, audio = await until(c, "audio-stop", "error")
                    if not Error.is_type(events[-1].type):
                        return audio
                    assert Error.from_event(events[-1]).code == "queue_full"
                await asyncio.sleep(0.1)
            raise AssertionError("never admitted: the first client's place was not given back")

        run(leave_mid_audio())
        assert run(admitted("Hello again."))

        cut = "Cut a client that took no audio for 2 s"

        async def stalled_then_admitted():
            writer = await stop_reading()
            try:
                return await admitted("Hello once more.")
            finally:
                writer.close()
        assert run(stalled_then_admitted())
        assert cut in (tmp_path / "server.log").read_text()
        assert run(admitted("And once more."))  # the cut client's place is free again

        async def drained():
            async with AsyncTcpClient("127.0.0.1", port) as c:
                await c.write_event(Synthesize(text=STORY).event())
                await until(c, "audio-chunk")
                proc.send_signal(signal.SIGTERM)
                async with AsyncTcpClient("127.0.0.1", port) as late:
                    await late.write_event(Synthesize(text="Too late.").event())
                    refused = Error.from_event((await until(late, "error"))[0][-1])
                events, _ = await until(c, "audio-stop", "error")
                return refused, events[-1].type
        refused, end = run(drained())
        assert refused.code == "server_shutting_down" and end == "audio-stop"
        assert proc.wait(60) == 0
    finally:
        stop_process(proc, 10)


WYOMING_EXAMPLES = [ex for ex in doc_examples("docs/integrations.md") if "10200" in ex[1]]


@pytest.mark.subprocess
@pytest.mark.parametrize("where, code", WYOMING_EXAMPLES, ids=[w for w, _ in WYOMING_EXAMPLES])
def test_the_docs_wyoming_example_runs(where, code, port, capsys):
    exec(compile(code.replace("10200", str(port)), where, "exec"), {"__name__": "__example__"})
    assert "audio" in capsys.readouterr().out


def test_describe_reads_the_library_off_the_loop_and_skips_a_label_that_is_not_text(
        tiny_model, house_voices, tmp_path):
    """In process, through the `wyoming` client: a voice whose record holds a lone surrogate
    (no UTF-8 can carry it) costs its own description, never `describe` (Home Assistant could
    not load the integration), and the library is read in a worker thread, never on the
    event loop that every connection shares."""
    import shutil
    import threading

    shutil.copy(house_voices / f"{HOUSE}.npz", tmp_path / "odd.npz")
    (tmp_path / "odd.voice.json").write_text(
        '{"name": "\\ud800 x", "type": "audio_sample", "created_at": 1}')
    server = ServerState(tiny_model, voices_dir=tmp_path)
    door = WyomingServer(server, {}, None, 5.0, 5.0)
    readers = []
    names = server.voices.names

    def watched():
        readers.append(threading.get_ident())
        return names()
    server.voices.names = watched

    async def talk():
        listener = await asyncio.start_server(door.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        try:
            async with AsyncTcpClient("127.0.0.1", port) as c:
                await c.write_event(Describe().event())
                event = await c.read_event()
            return event, threading.get_ident()
        finally:
            listener.close()
    try:
        event, loop_thread = run(talk())
    finally:
        server.pool.shutdown()
    assert Info.is_type(event.type), event
    voices = {v.name: v.description for v in Info.from_event(event).tts[0].voices}
    assert voices["odd"] == "odd" and "alloy" in voices
    assert readers and loop_thread not in readers


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_fresh_folder_gets_its_default_voice_before_the_door_listens(tmp_path):
    """At its default voice (the preset alloy) on a fresh voices folder, the door says
    "making voice alloy: about N s, once" before it says it listens, and the voice is in the
    folder when it answers; started again on the folder, it makes nothing."""
    folder = tmp_path / "voices"
    for run_ in ("first", "again"):
        log = tmp_path / f"{run_}.log"
        proc, port = start_wyoming(folder, *SETTINGS, log_path=log, seconds=240)
        try:
            assert (folder / "alloy.npz").exists()
            text = log.read_text()
            listening = text.index("ready, listening on")
            if run_ == "first":
                assert 0 <= text.index("making voice alloy: about ") < listening, text
            else:
                assert "making voice" not in text and "(alloy made before)" in text, text
        finally:
            stop_process(proc, 30)
