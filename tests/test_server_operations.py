"""`omnicore serve` against hostile and careless clients, and as an operator runs it: a real
subprocess on a loopback port with the tiny checkpoint, driven by httpx, raw sockets and the
`websockets` client. Upload bombs are refused by their
header; clients that stop reading or send nothing are cut and counted; every client mistake
is a 4xx in OpenAI's error shape; SIGTERM drains, stops what is left and exits; the start-up
log says what an operator checks first."""

import io
import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

from conftest import require_module, require_server_extra, start_server, stop_process  # noqa: E402

pytestmark = pytest.mark.subprocess

require_server_extra()
httpx = require_module("httpx")
sf = require_module("soundfile")
websockets = require_module("websockets", "server")

KEY = "ops-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"num_step": 4, "position_temperature": 0.0}
SEND_S, IDLE_S = 2, 2
BODY_S = 6  # --body-timeout: above IDLE_S, so a trickle that never stalls meets it first
LONG = " ".join(f"Sentence {i} of a long story." for i in range(40))


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    """A keyed server with short clocks and one slot; its voices folder starts with a save's
    temporary file left an hour ago (a writer killed mid-save) and one just written (maybe
    another server's save in progress)."""
    tmp = tmp_path_factory.mktemp("ops")
    voices = tmp / "voices"
    voices.mkdir()
    old = voices / ".gone.npz.k1l2m3n4.tmp"
    old.write_bytes(b"half a zip")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    (voices / ".fresh.npz.a1b2c3d4.tmp").write_bytes(b"being written")
    log = tmp / "server.log"
    proc, url = start_server(voices, "--api-key", KEY, "--max-queue", "1", "--send-timeout",
                             str(SEND_S), "--idle-timeout", str(IDLE_S), "--body-timeout",
                             str(BODY_S), log_path=log)
    yield proc, url, voices, log
    stop_process(proc, 30)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def samples(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers=AUTH, timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def timeouts(url: str, kind: str) -> float:
    return samples(url)[("omnicore_timeouts_total", (("kind", kind),))]


def upload(url: str, name: str, data: bytes, files=None):
    return httpx.post(url + "/v1/voices", headers=AUTH, timeout=60,
                      data={"name": name, "ref_text": "A short test clip."},
                      files=files or {"audio": ("clip", data, "application/octet-stream")})


def assert_client_error(r, status: int = 400) -> dict:
    """A 4xx in OpenAI's one error shape, naming no object or heap address."""
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error"
    assert "0x" not in err["message"] and " object at " not in err["message"], err
    return err


@pytest.fixture(scope="module")
def flac_bomb(tmp_path_factory) -> bytes:
    """Half a megabyte of FLAC that decodes to 45 minutes of 48 kHz stereo: ~1 GB as float32."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.flac"
    block = np.zeros((48000 * 60, 2), np.int16)
    with sf.SoundFile(path, "w", 48000, 2, format="FLAC", subtype="PCM_16") as f:
        for _ in range(45):
            f.write(block)
    data = path.read_bytes()
    assert len(data) < 2 * 2**20 and sf.info(path).frames * 2 * 4 > 0.9e9
    return data


def test_uploads_are_bounded_by_their_header(ops, flac_bomb):
    """A 1 Hz WAV and a FLAC bomb are 400s refused by their header (three tries leave the
    server's memory where it was: nothing was decoded), and the messages name what to fix
    (never an object's address)."""
    proc, url, _, _ = ops
    tiny = io.BytesIO()
    sf.write(tiny, np.zeros(3500, np.int16), 1, format="WAV", subtype="PCM_16")  # 7 KB: 1 hour
    long_clip = io.BytesIO()
    sf.write(long_clip, np.zeros(8000 * 70, np.int16), 8000, format="WAV", subtype="PCM_16")
    upload(url, "warmup", b"not audio")  # the route's imports, outside the measurement
    before = rss_mb(proc.pid)
    for _ in range(3):
        for data, what in ((tiny.getvalue(), "1 Hz"), (flac_bomb, "s long"),
                           (long_clip.getvalue(), "70.0 s")):
            assert what in assert_client_error(upload(url, "bomb", data))["message"]
    assert rss_mb(proc.pid) - before < 100
    err = assert_client_error(upload(url, "junk", b"RIFF" + os.urandom(200)))
    assert "could not read the uploaded audio" in err["message"]
    two = {"audio": ("a.wav", tiny.getvalue(), "audio/wav"),
           "other": ("b.wav", tiny.getvalue(), "audio/wav")}
    assert "files" in assert_client_error(upload(url, "two", b"", files=two))["message"]
    assert "bomb" not in httpx.get(url + "/v1/voices", headers=AUTH).text


def test_client_mistakes_are_4xx_in_one_shape(ops):
    _, url, _, _ = ops
    deep = "[" * 100_000
    for path in ("/v1/audio/speech", "/v1/voices"):
        r = httpx.post(url + path, headers={**AUTH, "Content-Type": "application/json"},
                       content=deep, timeout=30)
        assert assert_client_error(r)["code"] == "invalid_json"
    r = httpx.post(url + "/v1/voices", headers=AUTH, json={"name": "abc\n", "instruct": "male"})
    assert assert_client_error(r)["code"] == "invalid_voice_name"  # names are matched whole
    from omnicore.apps.server.protocol import HTTPError
    from omnicore.apps.server.voices import VoiceLibrary

    with pytest.raises(HTTPError):
        VoiceLibrary.check_name("abc\n")
    for nothing in ("\u200b", " \u200b\u200b ", "...", "\u00a0!?"):
        r = httpx.post(url + "/v1/audio/speech", headers=AUTH, json={"input": nothing, **GREEDY})
        assert assert_client_error(r)["param"] == "input"
    assert assert_client_error(httpx.get(url + "/v1/nothing", headers=AUTH), 404)["code"] == "not_found"
    r = httpx.put(url + "/v1/voices", headers=AUTH)
    assert assert_client_error(r, 405)["code"] == "method_not_allowed"


def test_metrics_behind_the_key_health_and_index_open(ops):
    _, url, _, _ = ops
    r = httpx.get(url + "/metrics")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/metrics", headers=AUTH).status_code == 200
    assert httpx.get(url + "/health").json()["status"] == "ok"
    index = httpx.get(url + "/").json()
    assert index["name"] == "omnicore" and index["version"] and index["model"] == "tiny-random"
    assert index["links"]["speech"] == "/v1/audio/speech"
    assert index["links"]["speech_stream_input"] == "/v1/audio/speech/stream-input"
    for link in ("models", "health"):
        assert httpx.get(url + index["links"][link], headers=AUTH).status_code == 200


def test_startup_log_and_stale_temporaries(ops):
    """The log names the model, the voices folder, the auth state and the demo; the save
    left an hour ago is gone, the one being written is not."""
    _, url, voices, log = ops
    text = log.read_text()
    assert "model tiny-random" in text and f"in {voices}" in text
    assert "1 stale temporary files removed" in text
    assert "Auth: API key required" in text and "behind the API key" in text
    assert "Demo: off (--ui)" in text and "/v1/audio/speech/stream-input" in text
    assert not (voices / ".gone.npz.k1l2m3n4.tmp").exists()
    assert (voices / ".fresh.npz.a1b2c3d4.tmp").exists()


def raw_request(url: str, head: str, body: bytes = b"", rcvbuf: int | None = None):
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.connect((host, int(port)))
    sock.sendall(head.encode() + body)
    return sock


def speech_head(body: bytes, length: int | None = None) -> str:
    return ("POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {length or len(body)}\r\n\r\n")


def kernel_send_queue(server_port: int, client_port: int) -> int | None:
    """The bytes the kernel holds for the server's end of a loopback connection (Linux's
    /proc/net/tcp tx_queue; 0 once the connection is gone), or None where it cannot be read."""
    try:
        with open("/proc/net/tcp") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return None
    for row in rows:
        if (int(row[1].rsplit(":", 1)[1], 16), int(row[2].rsplit(":", 1)[1], 16)) == (
                server_port, client_port):
            return int(row[4].split(":")[0], 16)
    return 0


STALLED = 3  # clients that never read: the load, and the whole queue


def test_stalled_readers_are_cut_and_leave_the_engine(tmp_path):
    """Three clients ask for endless streams and never read, holding the whole queue: a normal
    request is refused (429) meanwhile. Each is cut by the send clock (the idle one is set far
    off), the kernel holding at most 128 KiB for any of them until then (the documented cap;
    Linux shows it in /proc/net/tcp), and a slot comes back only once the cut reader's passes
    have left the engine: no /health read shows more engine requests than requests in flight.
    The freed slots then serve the normal request. A WebSocket client that stops reading
    once its utterance is all sent (the audio waits in the kernel, the server has nothing
    more to write) is cut by the send clock too, where the kernel says what its client has
    taken (Linux). (How long after its client stopped reading each cut comes, under this
    load, is benchmarks/bench_server_clocks.py's.)"""
    send_s = 4
    proc, url = start_server(tmp_path / "voices", "--max-queue", str(STALLED), "--send-timeout",
                             str(send_s), "--idle-timeout", "600", log_path=tmp_path / "log")
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"input": LONG, "response_format": "pcm", "stream_format": "audio",
                       **GREEDY}).encode()
    readers = []
    try:
        readers = [raw_request(url, speech_head(body), body, rcvbuf=4096) for _ in range(STALLED)]
        ports = [r.getsockname()[1] for r in readers]
        deadline = time.monotonic() + 60
        while httpx.get(url + "/health").json()["in_flight"] < STALLED:
            assert time.monotonic() < deadline, "the stalled readers were not admitted"
            time.sleep(0.05)
        normal = {"input": "Hi.", "response_format": "wav", **GREEDY}
        r = httpx.post(url + "/v1/audio/speech", json=normal, timeout=60)
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        peak, held = 0, []
        deadline = time.monotonic() + 240
        while timeouts(url, "send") < STALLED or not held or held[-1]["in_flight"]:
            assert time.monotonic() < deadline, "the stalled readers were not all cut"
            held.append(httpx.get(url + "/health").json())
            peak = max([peak] + [q or 0 for q in (kernel_send_queue(port, p) for p in ports)])
            time.sleep(0.02)
        for h in held:
            engine = h["engine"]["active_requests"] + h["engine"]["waiting_requests"]
            assert engine <= h["in_flight"], h
        if kernel_send_queue(port, ports[0]) is not None:
            assert 0 < peak <= 128 * 1024, peak
        assert timeouts(url, "send") == STALLED and timeouts(url, "idle") == 0
        r = httpx.post(url + "/v1/audio/speech", json=normal, timeout=60)
        assert r.status_code == 200 and r.content[:4] == b"RIFF"
        if kernel_send_queue(port, ports[0]) is not None:
            # A client library would read the frames into its own memory: this one reads none.
            readers.append(raw_request(url, (
                "GET /v1/audio/speech/stream-input HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"), rcvbuf=4096))
            head = b""
            while b"\r\n\r\n" not in head:  # the 101, then nothing more is read
                head += readers[-1].recv(1)
            assert head.startswith(b"HTTP/1.1 101")
            for message in ({"response_format": "pcm", **GREEDY},
                            {"text": "Hi there.", "flush": True}):
                data = json.dumps(message).encode()  # one masked text frame (mask 0: as is)
                readers[-1].sendall(bytes([0x81, 0x80 | len(data)]) + b"\0\0\0\0" + data)
            deadline = time.monotonic() + 120
            while timeouts(url, "send") == STALLED:  # nothing more is read from it
                assert time.monotonic() < deadline, "the silent WebSocket was not cut"
                time.sleep(0.05)
            assert timeouts(url, "idle") == 0
    finally:
        for r in readers:
            r.close()
        stop_process(proc, 30)


def test_idle_connections_time_out(ops):
    """No request head, half a head, or a body that stalls: closed by the idle clock (the
    stalled body with a 408 in the error shape), each counted as an idle timeout (when, is
    benchmarks/bench_server_clocks.py's)."""
    _, url, _, _ = ops
    idle = timeouts(url, "idle")
    silent = raw_request(url, "")
    half = raw_request(url, "POST /v1/audio/speech HTTP/1.1\r\nHost: t")
    body = json.dumps({"input": "Hi."}).encode()
    stalls = raw_request(url, speech_head(body, len(body) + 50), body)
    assert silent.recv(100) == b"" and half.recv(100) == b""
    reply = b""
    while chunk := stalls.recv(4096):
        reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(payload)["error"]["code"] == "request_timeout"
    for s in (silent, half, stalls):
        s.close()
    assert timeouts(url, "idle") == idle + 3


def test_a_trickled_body_meets_its_deadline(ops):
    """A body sent a byte at a time, each well within the idle clock, never stalls: the body's
    overall deadline (--body-timeout) answers it with a 408 `body_timeout`, counted."""
    import select

    _, url, _, _ = ops
    key = ("omnicore_timeouts_total", (("kind", "body"),))
    before = samples(url).get(key, 0.0)
    body = json.dumps({"input": "Hi." + " " * 5000}).encode()
    sock = raw_request(url, speech_head(body))  # the head only: the body trickles
    sent = 0
    while sent < len(body):  # one byte per quarter of the idle clock, until the server answers
        sock.sendall(body[sent:sent + 1])
        sent += 1
        if select.select([sock], [], [], IDLE_S / 4)[0]:
            break
    reply = b""
    while chunk := sock.recv(4096):
        reply += chunk
    sock.close()
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert sent < len(body), "the whole body went through"
    assert head.startswith(b"HTTP/1.1 408"), head
    assert json.loads(payload)["error"]["code"] == "body_timeout"
    assert samples(url)[key] == before + 1


def test_sigterm_drains_then_stops_and_exits(tmp_path):
    """On SIGTERM: new work is a 503 with Retry-After (the voices and the WebSocket too, and
    the refusals are not logged as errors) and /health says draining; a request in flight that
    finishes within --grace gets its audio; what is still running after it is stopped with the
    error shape (a JSON 503, an SSE error event) or, a raw audio stream, cut without a
    traceback in the log; then the process exits, its worker threads done."""
    grace = 10  # the short request (8 steps, beside four endless ones) ends in about 2 s
    log = tmp_path / "server.log"
    proc, url = start_server(tmp_path / "voices", "--grace", str(grace), "--metrics-public",
                             log_path=log)
    results = {}

    def call(name, **body):
        try:
            with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=180) as r:
                results[name] = (r.status_code, b"".join(r.iter_bytes()), dict(r.headers))
        except httpx.HTTPError as exc:
            results[name] = exc

    def agent():
        """A WebSocket utterance that would never end."""
        from websockets.sync.client import connect

        events = []
        try:
            with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream-input") as ws:
                ws.send(json.dumps({"num_step": 1000, "position_temperature": 0.0}))
                ws.send(json.dumps({"text": LONG, "flush": True}))
                while True:
                    m = ws.recv(timeout=180)
                    if isinstance(m, str):
                        events.append(json.loads(m))
        except Exception as exc:  # noqa: BLE001 - the server closes it: the end expected
            results["agent"] = (events, exc)

    endless = {"input": LONG, "num_step": 1000, "position_temperature": 0.0}
    threads = [threading.Thread(target=call, args=(n,), kwargs=kw, daemon=True) for n, kw in (
        ("whole", {**endless, "response_format": "flac"}),  # a whole file, not a stream
        ("sse", {**endless, "response_format": "pcm", "stream_format": "sse"}),
        ("raw", {**endless, "response_format": "pcm", "stream_format": "audio"}),
        ("short", {"input": "Hello there.", "response_format": "wav", "num_step": 8,
                   "position_temperature": 0.0}))]
    threads.insert(2, threading.Thread(target=agent, daemon=True))
    try:
        for t, running in zip(threads, (1, 2, 3, 4)):  # the endless ones run, then the short one
            t.start()
            deadline = time.monotonic() + 60
            while (httpx.get(url + "/health").json()["engine"]["active_requests"] < running
                   and time.monotonic() < deadline):
                time.sleep(0.02)
        threads[4].start()
        deadline = time.monotonic() + 60
        while (httpx.get(url + "/health").json()["in_flight"] < 5 and "short" not in results
               and time.monotonic() < deadline):
            time.sleep(0.01)
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(url + "/health").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        refused = httpx.post(url + "/v1/audio/speech", json={"input": "Hi.", **GREEDY})
        err = refused.json()["error"]
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert err["code"] == "server_shutting_down" and err["type"] == "server_error"
        assert httpx.get(url + "/metrics").status_code == 200  # --metrics-public
        assert httpx.get(url + "/v1/voices").status_code == 503
        with pytest.raises(websockets.InvalidStatus) as refused_ws:
            from websockets.sync.client import connect
            connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream-input").close()
        assert refused_ws.value.response.status_code == 503
        proc.wait(grace + 60)
        exited = time.monotonic() - t_term
        for t in threads:
            t.join(30)
    finally:
        stop_process(proc, 10)
    assert exited < grace + 20 and proc.returncode == 0, (exited, proc.returncode)
    status, data, _ = results["short"]
    assert status == 200 and data[:4] == b"RIFF"
    status, data, headers = results["whole"]
    assert status == 503 and headers["retry-after"]
    assert json.loads(data)["error"]["code"] == "server_shutting_down"
    status, data, _ = results["sse"]
    assert status == 200 and b"event: error" in data and b"server_shutting_down" in data
    assert isinstance(results["raw"], httpx.RemoteProtocolError)  # cut: no end that passes for one
    events, closed = results["agent"]
    assert [e["error"]["code"] for e in events] == ["server_shutting_down"]
    assert isinstance(closed, websockets.ConnectionClosed) and closed.rcvd.code == 1012
    text = log.read_text()
    assert "Draining" in text and "Stopping 4 requests" in text
    assert "Finished server process" in text and "still running" not in text
    assert "Metrics: http://127.0.0.1:" in text and "open (no --api-key)" in text
    for error in ("Traceback", "Exception in ASGI", "without completing handshake"):
        assert error not in text, text


# A field out of its range, of the wrong type or unknown to the model: (extra fields of a speech
# request, status, param, code, words the message has: the range or what to do).
BAD_FIELDS = [
    ({"num_step": 0}, 400, "num_step", "invalid_value", "between 1 and 1000"),
    ({"guidance_scale": 1e6}, 400, "guidance_scale", "invalid_value", "between 0 and 100"),
    ({"position_temperature": -1}, 400, "position_temperature", "invalid_value", ">= 0"),
    ({"class_temperature": 1e9}, 400, "class_temperature", "invalid_value", "and 1000"),
    ({"t_shift": 0}, 400, "t_shift", "invalid_value", "> 0"),
    ({"seed": 2**64}, 400, "seed", "invalid_value", "2**64 - 1"),
    ({"seed": "zero"}, 400, "seed", "invalid_type", "wrong type"),
    ({"duration": 9000}, 400, "duration", "invalid_value", "7200 s"),
    ({"duration": 5000, "response_format": "flac"}, 400, "duration", "invalid_value", "180 s per pass"),
    ({"speed": 10}, 400, "speed", "invalid_value", "[0.25, 4]"),
    ({"instruct": "purple voice"}, 400, "instruct", "invalid_instruct", "purple"),
    ({"instruct": "male", "instructions": "warm"}, 400, "instruct", "invalid_value", "not both"),
    ({"response_format": "ogg"}, 400, "response_format", "invalid_format", "mp3"),
    ({"voice": "nobody"}, 404, "voice", "voice_not_found", "GET /v1/voices"),
    ({"voice": {"name": "x"}}, 400, "voice", "invalid_voice", "id"),
    ({"stream_format": "chunks"}, 400, "stream_format", "invalid_value", "'sse'"),
    ({"input": "x" * 20_001}, 400, "input", "input_too_long", "20,000"),
    ({"model": "gpt-5-tts"}, 404, "model", "model_not_found", "tts-1"),
    ({"speeed": 1.2}, 400, "speeed", "unknown_parameter", "speed"),
]


def test_every_error_names_its_code_and_param(ops):
    """Each bad field is refused before admission with an OpenAI-style code (never a Python
    class's name) naming that field, and a message that gives the range or what to do."""
    _, url, _, _ = ops
    for fields, status, param, code, words in BAD_FIELDS:
        r = httpx.post(url + "/v1/audio/speech", headers=AUTH, timeout=60,
                       json={"input": "Hi.", **GREEDY, **fields})
        err = assert_client_error(r, status)
        assert (err["param"], err["code"]) == (param, code), (fields, err)
        assert words in err["message"], (fields, err)


def test_unknown_fields_are_refused_on_every_route(ops):
    """As OpenAI's API does: a field a route does not take is a 400 naming it, in a JSON body,
    a form or the query (a typo must not pass for a setting that was applied)."""
    _, url, _, _ = ops
    wav = io.BytesIO()
    sf.write(wav, np.zeros(8000, np.int16), 8000, format="WAV", subtype="PCM_16")
    clip = {"audio": ("a.wav", wav.getvalue(), "audio/wav")}
    calls = [
        ("POST", "/v1/audio/speech", {"json": {"input": "Hi.", "voise": "alloy"}}, "voise"),
        ("POST", "/v1/voices", {"json": {"name": "v", "instruct": "male", "sed": 1}}, "sed"),
        ("POST", "/v1/voices", {"data": {"name": "v", "ref_text": "Hi.", "lang": "en"},
                                "files": clip}, "lang"),
        ("POST", "/v1/audio/voices", {"json": {"name": "v", "type": "prompt", "prompt": "male",
                                               "voice": "x"}}, "voice"),
        ("POST", "/v1/audio/voices", {"data": {"name": "v", "consnet": "c"},
                                      "files": {"audio_sample": clip["audio"]}}, "consnet"),
        ("POST", "/v1/audio/voice_consents", {"data": {"name": "v", "language": "en",
                                                       "lang": "en"},
                                              "files": {"recording": clip["audio"]}}, "lang"),
        ("POST", "/v1/audio/voice_consents/cons_" + "0" * 24, {"json": {"name": "v",
                                                                        "label": "w"}}, "label"),
        ("GET", "/v1/audio/voice_consents?limit=2&order=asc", {}, "order"),
        ("GET", "/v1/voices?limit=2", {}, "limit"),
    ]
    for method, path, kw, field in calls:
        r = httpx.request(method, url + path, headers=AUTH, timeout=60, **kw)
        err = assert_client_error(r)
        assert (err["param"], err["code"]) == (field, "unknown_parameter"), (path, err)


def test_every_model_name_is_documented():
    """Each name GET /v1/models lists besides the checkpoint's own is in docs/server.md."""
    import pathlib

    from omnicore.apps.server.protocol import MODEL_ALIASES

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "server.md").read_text()
    assert [name for name in MODEL_ALIASES if f"`{name}`" not in text] == []


def test_every_error_code_is_documented():
    """Each code a route can answer with is in docs/errors.md's table and docs/server.md."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    codes = set()
    for path in (root / "omnicore" / "apps" / "server").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "HTTPError"
                    and len(node.args) >= 4 and isinstance(node.args[3], ast.Constant)):
                codes.add(node.args[3].value)
    from omnicore.apps.server.protocol import ERROR_KINDS

    codes |= {code for _, _, code in ERROR_KINDS}
    assert len(codes) > 30, codes
    for doc in ("errors.md", "server.md"):
        text = (root / "docs" / doc).read_text()
        assert not [c for c in codes if f"`{c}`" not in text], (doc, sorted(codes))
