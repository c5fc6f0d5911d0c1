"""`omnicore wyoming` as Home Assistant reaches it: a subprocess on the tiny checkpoint, driven
by the `wyoming` package's own client. describe lists the voices; a one-shot text and the same
text streamed in fragments give exactly `model.stream`'s audio, sent as it is made; bad events
get error events on a connection that stays usable; a client that leaves frees its passes; a
silent client is closed; SIGTERM drains."""

import asyncio
import json
import signal

import numpy as np
import pytest

from conftest import HOUSE, doc_examples, require_module, start_wyoming, stop_process  # noqa: E402

require_module("wyoming", "wyoming")
from wyoming.audio import AudioChunk, AudioStart  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.event import Event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop,  # noqa: E402
                         SynthesizeStopped, SynthesizeVoice)

from omnicore.audio.writers import to_pcm16  # noqa: E402

SETTINGS = ("--steps", "4", "--seed", "7")  # seeded sampling: one client, so nothing shares a pass
KWARGS = {"num_step": 4, "seed": 7}
VOICE = HOUSE  # a library voice (conftest.house_voices)
STORY = ("The first sentence is short. The second sentence comes after it and is longer. "
         "A third sentence closes the little story.")
IDLE_S = 4


@pytest.fixture(scope="module")
def port(house_voices, tmp_path_factory):
    log = tmp_path_factory.mktemp("wyoming") / "server.log"
    proc, port = start_wyoming(house_voices, "--voice", VOICE, "--idle-timeout", IDLE_S,
                               *SETTINGS, log_path=log)
    yield port
    stop_process(proc, 30)


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


def streamed(tiny_model, text, **kw) -> bytes:
    return np.concatenate([to_pcm16(x) for x in tiny_model.stream(text, **kw)]).tobytes()


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
    assert len(program.voices[0].languages) > 600


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


def test_bad_events_get_errors_and_the_connection_stays_usable(port):
    async def talk():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def send(line: bytes, data: bytes = b""):
            writer.write(line + b"\n" + data)
            await writer.drain()

        async def reply():
            line = json.loads(await reader.readline())
            data = json.loads(await reader.readexactly(line["data_length"]))
            return line["type"], data
        answers = []
        for line in [b"{not json", b'"a string"', b'{"type": "synthesize", "data": {"text": 5}}',
                     b'{"type": "synthesize", "data": {"text": "Hi.", "voice": {"name": "nobody"}}}',
                     b'{"type": "synthesize", "data": {"text": "..."}}',
                     b'{"type": "synthesize-chunk", "data": {"text": "Hi."}}',
                     b'{"type": "synthesize-stop"}',
                     json.dumps({"type": "synthesize", "data": {"text": "x" * 20_001}}).encode()]:
            await send(line)
            answers.append(await reply())
        await send(b'{"type": "not-ours", "data": {}}')  # dropped, as Wyoming asks
        await send(b'{"type": "synthesize", "data": {"text": "Still here."}}')
        kinds = []
        while not kinds or kinds[-1] != "audio-stop":
            line = json.loads(await reader.readline())
            kinds.append(line["type"])
            await reader.readexactly(line.get("data_length", 0) + line.get("payload_length", 0))
        # A length that cannot be trusted: an error, then the connection closes.
        await send(json.dumps({"type": "synthesize", "data_length": 2**40}).encode())
        last = await reply()
        closed = await reader.read() == b""
        writer.close()
        return answers, kinds, last, closed

    answers, kinds, last, closed = run(talk())
    assert all(kind == "error" for kind, _ in answers), answers
    codes = [data.get("code") for _, data in answers]
    assert codes[:3] == ["invalid_message"] * 3
    assert codes[3] == "voice_not_found" and "nobody" in answers[3][1]["text"]
    assert codes[4] == "invalid_input" and "nothing to say" in answers[4][1]["text"]
    assert "outside a stream" in answers[5][1]["text"] and "outside a stream" in answers[6][1]["text"]
    assert codes[7] == "input_too_long"
    assert kinds[0] == "audio-start" and kinds[-1] == "audio-stop" and "audio-chunk" in kinds
    assert last[0] == "error" and "data_length" in last[1]["text"] and closed


def test_a_silent_client_is_closed_after_the_idle_timeout(port):
    async def talk():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            event = await asyncio.wait_for(c.read_event(), IDLE_S + 30)
            return Error.from_event(event), await c.read_event()
    error, after = run(talk())
    assert error.code == "idle_timeout" and after is None


LONG = " ".join(f"Sentence {i} of a story that goes on and on." for i in range(400))


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
            """A client whose receive buffer is small and never read."""
            import socket

            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(json.dumps({"type": "synthesize", "data": {"text": LONG}}).encode() + b"\n")
            await writer.drain()
            return writer

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

        async def stalled_then_admitted():
            writer = await stop_reading()
            try:
                return await admitted("Hello once more.")
            finally:
                writer.close()
        assert run(stalled_then_admitted())

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


@pytest.mark.parametrize("where, code", WYOMING_EXAMPLES, ids=[w for w, _ in WYOMING_EXAMPLES])
def test_the_docs_wyoming_example_runs(where, code, port, capsys):
    exec(compile(code.replace("10200", str(port)), where, "exec"), {"__name__": "__example__"})
    assert "audio" in capsys.readouterr().out
