"""The voice agents' WebSocket (/v1/audio/speech/stream-input) of a real `omnicore serve`
subprocess, driven by the `websockets` client: text in fragments gives the bytes one streamed
POST of the whole text gives (greedy), flush ends an utterance, cancel stops the engine's
passes within a step or two, and the socket is keyed, checked and timed like the routes."""

import asyncio
import json
import time

import pytest

from conftest import require_module, require_server_extra, start_server, stop_process  # noqa: E402

pytestmark = pytest.mark.subprocess

require_server_extra()
httpx = require_module("httpx")
websockets = require_module("websockets", "server")

KEY = "socket-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"num_step": 4, "position_temperature": 0.0}
IDLE_S = 3
TEXT = ("Hello there, this is the first sentence of the answer. And here, a little later, "
        "comes the second one; it is a bit longer than the first.")
LONG = " ".join(f"Sentence {i} of a long story." for i in range(12))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("socket")
    proc, url = start_server(tmp / "voices", "-q", "--api-key", KEY, "--idle-timeout",
                             str(IDLE_S), log_path=tmp / "server.log")
    yield url
    stop_process(proc, 30)


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/audio/speech/stream-input"


def post_stream(url: str, text: str, **fields) -> bytes:
    """What one streamed POST of `text` sends."""
    r = httpx.post(url + "/v1/audio/speech", headers=AUTH, timeout=120, json={
        "input": text, "response_format": "pcm", "stream_format": "audio", **GREEDY, **fields})
    assert r.status_code == 200, r.text
    return r.content


async def until_event(ws, timeout: float = 120.0):
    """(audio bytes received, the next JSON event)."""
    audio = b""
    deadline = time.monotonic() + timeout
    while True:
        m = await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic()))
        if isinstance(m, bytes):
            audio += m
        else:
            return audio, json.loads(m)


async def to_the_end(ws):
    """(the JSON events, the audio bytes) until the server closes the socket."""
    events, audio = [], b""
    async for m in ws:
        if isinstance(m, bytes):
            audio += m
        else:
            events.append(json.loads(m))
    return events, audio


def engine(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()


def cancelled_streams(url: str) -> float:
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("omnicore_streams_cancelled_total")))


def test_fragments_give_the_same_audio_as_one_post(server):
    """Two utterances, each fed in small fragments and ended by a flush (the second by the
    close): each one's frames are exactly the bytes of a streamed POST of its whole text."""
    second = "A short reply."

    async def talk():
        async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:
            await ws.send(json.dumps({"response_format": "pcm", **GREEDY}))
            t0 = time.perf_counter()
            for i in range(0, len(TEXT), 5):  # as an LLM writes it
                await ws.send(json.dumps({"text": TEXT[i:i + 5]}))
            await ws.send(json.dumps({"flush": True}))
            first, done0 = await until_event(ws)
            first_wall = time.perf_counter() - t0
            await ws.send(json.dumps({"text": " "}))  # nothing to say yet: waits for words
            for word in second.split(" "):
                await ws.send(json.dumps({"text": word + " "}))
            await ws.send(json.dumps({"close": True}))
            reply, done1 = await until_event(ws)
            with pytest.raises(websockets.ConnectionClosedOK):
                await ws.recv()
            return first, done0, first_wall, reply, done1

    first, done0, first_wall, reply, done1 = asyncio.run(talk())
    assert first == post_stream(server, TEXT)
    assert reply == post_stream(server, second + " ")
    for i, (audio, done) in enumerate(((first, done0), (reply, done1))):
        assert done["type"] == "audio.done" and done["utterance"] == i and not done["cancelled"]
        assert done["audio_seconds"] == pytest.approx(len(audio) / 2 / 24000)
        t = done["timings"]
        assert 0 <= t["queue"] <= t["first_audio"] <= t["total"]
    assert done0["timings"]["total"] <= first_wall


def test_cancel_is_a_barge_in_within_steps(server):
    """Cancel while an utterance is synthesising: its passes leave the engine within a step or
    two, it ends with audio.done cancelled, and the socket speaks the next text at once. The
    metrics count the one stream it cut short, as they count the HTTP door's."""
    before = cancelled_streams(server)

    async def talk():
        async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:
            await ws.send(json.dumps({"response_format": "pcm", "num_step": 64}))
            await ws.send(json.dumps({"text": LONG, "flush": True}))
            while True:  # wait until its passes run
                h = engine(server)
                if h["engine"]["active_passes"] > 0:
                    break
                await asyncio.sleep(0.01)
            await ws.send(json.dumps({"cancel": True}))
            _, done = await until_event(ws)
            after = engine(server)
            while after["engine_passes"]:
                after = engine(server)
            await ws.send(json.dumps({"text": "Now something else.", "close": True, **{}}))
            audio, again = await until_event(ws)
            return h, done, after, audio, again

    h, done, after, audio, again = asyncio.run(talk())
    assert done["type"] == "audio.done" and done["cancelled"] and done["utterance"] == 0
    assert after["engine"]["iterations"] - h["engine"]["iterations"] <= 3, (h, after)
    assert again["utterance"] == 1 and not again["cancelled"] and audio
    assert engine(server)["in_flight"] == 0
    assert cancelled_streams(server) == before + 1


def test_mp3_and_aac_leave_as_they_are_made(server):
    """An utterance's first sentence (over 2 s of speech, so a chunk of its own) is heard
    before the rest of its text is sent, in mp3 and aac as in pcm: their encoders send each
    piece's frames at once, not one file at the end; the whole decodes to the utterance."""
    import io

    import av

    first = "Hello there, this is the first sentence of the answer, long enough for a chunk. "
    rest = "And here comes the second one."

    async def talk(fmt):
        async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:
            await ws.send(json.dumps({"response_format": fmt, **GREEDY}))
            await ws.send(json.dumps({"text": first}))
            early = await asyncio.wait_for(ws.recv(), 120)  # before any more text is sent
            await ws.send(json.dumps({"text": rest, "close": True}))
            audio, done = await until_event(ws)
            return early, early + audio, done
    for fmt, sync in (("mp3", b"\xff"), ("aac", b"\xff\xf1")):
        early, audio, done = asyncio.run(talk(fmt))
        assert isinstance(early, bytes) and early.startswith(sync), (fmt, early[:8])
        assert done["type"] == "audio.done" and not done["cancelled"]
        with av.open(io.BytesIO(audio)) as container:
            samples = sum(f.samples for f in container.decode(audio=0))
        assert abs(samples / 24000 - done["audio_seconds"]) < 0.15, fmt


def test_socket_keyed_checked_and_timed(server):
    """The key as on every route (a refused handshake is a 401 in OpenAI's error shape); a bad
    first message is an error event and a close; a bad message later is an error event and
    the session goes on; a socket with nothing to say closes after --idle-timeout (counted)."""
    async def refused(headers):
        with pytest.raises(websockets.InvalidStatus) as exc:
            async with websockets.connect(ws_url(server), additional_headers=headers):
                pass
        return exc.value.response

    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = asyncio.run(refused(headers))
        assert resp.status_code == 401
        assert json.loads(resp.body)["error"]["code"] == "invalid_api_key"

    async def first_message(msg):
        async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:
            await ws.send(msg)
            event = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return event, ws.close_code

    for msg, code in ((json.dumps({"response_format": "ogg"}), "invalid_format"),
                      (json.dumps({"duration": 3}), "invalid_value"),
                      (json.dumps({"model": "gpt-5-tts"}), "model_not_found"),
                      # refused at once, as a POST is: not after an idle wait or at the first text
                      (json.dumps({"voice": "nosuch"}), "voice_not_found"),
                      (json.dumps({"voice": "alloy\n"}), "invalid_voice_name"),
                      # omnicore's instruct is strict (OpenAI's instructions is prose)
                      (json.dumps({"instruct": "purple voice"}), "invalid_instruct"),
                      (json.dumps({"num_step": 0}), "invalid_value"),
                      (json.dumps({"voice": "alloy", "speeed": 2}), "unknown_parameter"),
                      ("[" * 100_000, "invalid_json"),
                      (json.dumps([1]), "invalid_message")):
        event, close = asyncio.run(first_message(msg))
        assert event["type"] == "error" and event["error"]["code"] == code, event
        assert close == 1008

    def idle_count() -> float:
        text = httpx.get(server + "/metrics", headers=AUTH, timeout=10).text
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith('omnicore_timeouts_total{kind="idle"}')))

    async def session():
        async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:
            await ws.send(json.dumps({"response_format": "pcm", **GREEDY}))
            errors = []
            for msg in (json.dumps({"txt": "Hi."}), json.dumps({"text": 3}),
                        json.dumps({"flush": "yes"}), "{", b"\x00\x01"):
                await ws.send(msg)
                errors.append(json.loads(await ws.recv())["error"])
            await ws.send(json.dumps({"text": "Still here.", "flush": True}))
            audio, done = await until_event(ws)
            # then nothing: the next event is the idle clock's, and the server closes it
            silence, idle = await until_event(ws, IDLE_S + 60)
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return errors, audio, done, silence, idle

    before = idle_count()
    errors, audio, done, silence, idle = asyncio.run(session())
    assert [e["param"] for e in errors[:3]] == ["txt", "text", "flush"]
    assert all(e["type"] == "invalid_request_error" for e in errors)
    assert audio and done["type"] == "audio.done" and not done["cancelled"]
    assert idle["error"]["code"] == "idle_timeout" and silence == b""
    assert idle_count() == before + 1


def test_a_cancel_storm_never_refuses_barge_in(server):
    """500 messages alternating {"cancel": true} and {"cancel": true, "text": ...}: cancelled
    utterances do not count against the ones waiting to be spoken, so no text is refused or
    dropped; each utterance gets its audio.done, in order, and the last one is spoken."""
    rounds = 250

    async def talk():
        async with websockets.connect(ws_url(server), additional_headers=AUTH,
                                      max_queue=None) as ws:
            await ws.send(json.dumps({"response_format": "pcm", **GREEDY}))
            for i in range(rounds):
                await ws.send(json.dumps({"cancel": True}))
                await ws.send(json.dumps({"cancel": True, "text": f"Utterance number {i}."}))
            await ws.send(json.dumps({"close": True}))
            events, audio = await to_the_end(ws)
            return events, audio, ws.close_code

    events, audio, code = asyncio.run(talk())
    assert [e for e in events if e["type"] == "error"] == [], events[:3]
    assert [e["utterance"] for e in events] == list(range(rounds))
    assert all(e["cancelled"] for e in events[:-1]) and not events[-1]["cancelled"]
    assert audio and events[-1]["audio_seconds"] > 0 and code == 1000


def test_barge_in_is_never_refused_after_many_cancels_on_many_sockets(server):
    """Three sockets at once, each 1000 utterances cancelled before they are spoken, then a
    barge-in: none is refused (cancelled utterances are dropped, only their audio.done is
    owed), every utterance gets its audio.done in order, and each barge-in is spoken."""
    rounds = 1000

    async def talk(n):
        async with websockets.connect(ws_url(server), additional_headers=AUTH,
                                      max_queue=None) as ws:
            await ws.send(json.dumps({"response_format": "pcm", **GREEDY}))
            for i in range(rounds):
                await ws.send(json.dumps({"cancel": True, "text": f"Socket {n}, words {i}."}))
            await ws.send(json.dumps({"cancel": True, "text": "The barge-in.", "close": True}))
            return await to_the_end(ws)

    async def all_three():
        return await asyncio.gather(*(talk(n) for n in range(3)))

    for events, audio in asyncio.run(all_three()):
        assert [e for e in events if e["type"] == "error"] == [], events[-3:]
        assert [e["utterance"] for e in events] == list(range(rounds + 1))
        assert all(e["cancelled"] for e in events[:-1]) and not events[-1]["cancelled"]
        assert audio and events[-1]["audio_seconds"] > 0


def test_every_error_names_its_utterance(server):
    """A bad message names the utterance whose text it concerns: the one taking text, else
    the next one; a text over the limit names the utterance it cancels; a bad first message
    names the first."""
    async def next_error(ws):  # audio and audio.done events may come first
        while True:
            m = await asyncio.wait_for(ws.recv(), 120)
            if not isinstance(m, bytes) and json.loads(m)["type"] == "error":
                return json.loads(m)

    async def session():
        async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:
            await ws.send(json.dumps({"response_format": "pcm", **GREEDY}))
            await ws.send(json.dumps({"txt": "Hi."}))  # before any text: the first utterance
            first = json.loads(await ws.recv())
            await ws.send(json.dumps({"text": "One sentence.", "flush": True}))
            _, done = await until_event(ws)
            await ws.send(json.dumps({"text": "Two, "}))  # utterance 1 takes text
            await ws.send(json.dumps({"text": 3}))
            second = await next_error(ws)
            await ws.send(json.dumps({"text": "x" * 60_000}))  # over the limit: 1 is cancelled
            third = await next_error(ws)
            await ws.send("{")  # a message that is not JSON: the next utterance's
            fourth = await next_error(ws)
            return first, done, second, third, fourth

    first, done, second, third, fourth = asyncio.run(session())
    assert first["type"] == "error" and first["utterance"] == 0
    assert done["type"] == "audio.done" and done["utterance"] == 0
    assert second["type"] == "error" and second["utterance"] == 1
    assert second["error"]["param"] == "text"
    assert third["utterance"] == 1 and third["error"]["code"] == "input_too_long"
    assert fourth["type"] == "error" and fourth["utterance"] == 2, fourth

    async def bad_first():
        async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:
            await ws.send(json.dumps({"response_format": "ogg"}))
            return json.loads(await ws.recv())
    assert asyncio.run(bad_first())["utterance"] == 0
