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

require_server_extra()
httpx = require_module("httpx")
sf = require_module("soundfile")
websockets = require_module("websockets", "server")

KEY = "ops-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"num_step": 4, "position_temperature": 0.0}
SEND_S, IDLE_S = 2, 2
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
                             str(SEND_S), "--idle-timeout", str(IDLE_S), log_path=log)
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
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/voices", headers=AUTH, timeout=60,
                   data={"name": name, "ref_text": "A short test clip."},
                   files=files or {"audio": ("clip", data, "application/octet-stream")})
    return r, time.perf_counter() - t0


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
    """A 1 Hz WAV and a FLAC bomb are 400s in under a second, three tries leave the server's
    memory where it was, and the messages name what to fix (never an object's address)."""
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
            r, took = upload(url, "bomb", data)
            assert what in assert_client_error(r)["message"]
            assert took < 1.0, (what, took)
    assert rss_mb(proc.pid) - before < 100
    err = assert_client_error(upload(url, "junk", b"RIFF" + os.urandom(200))[0])
    assert "could not read the uploaded audio" in err["message"]
    two = {"audio": ("a.wav", tiny.getvalue(), "audio/wav"),
           "other": ("b.wav", tiny.getvalue(), "audio/wav")}
    assert "files" in assert_client_error(upload(url, "two", b"", files=two)[0])["message"]
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
    from omnicore.server.protocol import HTTPError
    from omnicore.server.voices import VoiceLibrary

    with pytest.raises(HTTPError):
        VoiceLibrary.check_name("abc\n")
    for nothing in ("\u200b", " \u200b\u200b ", "...", "\u00a0!?"):
        r = httpx.post(url + "/v1/audio/speech", headers=AUTH, json={"input": nothing, **GREEDY})
        assert assert_client_error(r)["param"] == "input"
    assert_client_error(httpx.get(url + "/v1/nothing", headers=AUTH), 404)


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


def test_a_client_that_stops_reading_loses_its_slot(ops):
    """A stream whose client reads nothing holds the one slot (the next request is a 429)
    until --send-timeout after the buffers filled: then it is cut, counted, and the slot
    serves the next request."""
    _, url, _, _ = ops
    sent = timeouts(url, "send")
    body = json.dumps({"input": LONG, "response_format": "pcm", "stream_format": "audio",
                       **GREEDY}).encode()
    stalled = raw_request(url, speech_head(body), body, rcvbuf=4096)
    try:
        deadline = time.monotonic() + 20
        while httpx.get(url + "/health").json()["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = httpx.post(url + "/v1/audio/speech", headers=AUTH, json={"input": "Hi.", **GREEDY})
        assert r.status_code == 429
        deadline = time.monotonic() + 240
        while timeouts(url, "send") == sent and time.monotonic() < deadline:
            time.sleep(0.2)
        assert timeouts(url, "send") == sent + 1
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").json()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        r = httpx.post(url + "/v1/audio/speech", headers=AUTH, timeout=60,
                       json={"input": "Hi.", "response_format": "wav", **GREEDY})
        assert r.status_code == 200
    finally:
        stalled.close()


def test_idle_connections_time_out(ops):
    """No request head, half a head, or a body that stalls: closed after --idle-timeout (the
    stalled body with a 408 in the error shape), each counted."""
    _, url, _, _ = ops
    idle = timeouts(url, "idle")
    silent = raw_request(url, "")
    half = raw_request(url, "POST /v1/audio/speech HTTP/1.1\r\nHost: t")
    body = json.dumps({"input": "Hi."}).encode()
    stalls = raw_request(url, speech_head(body, len(body) + 50), body)
    t0 = time.monotonic()
    assert silent.recv(100) == b"" and half.recv(100) == b""
    reply = b""
    while chunk := stalls.recv(4096):
        reply += chunk
    waited = time.monotonic() - t0
    assert IDLE_S - 0.5 <= waited <= IDLE_S + 10
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(payload)["error"]["code"] == "request_timeout"
    for s in (silent, half, stalls):
        s.close()
    assert timeouts(url, "idle") == idle + 3


def test_sigterm_drains_then_stops_and_exits(tmp_path):
    """On SIGTERM: new work is a 503 with Retry-After and /health says draining; a request in
    flight that finishes within --grace gets its audio; what is still running after it is
    stopped with the error shape (a JSON 503, an SSE error event); then the process exits,
    its worker threads done."""
    grace = 20
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
        ("short", {"input": "Hello there.", "response_format": "wav", "num_step": 32,
                   "position_temperature": 0.0}))]
    threads.insert(2, threading.Thread(target=agent, daemon=True))
    try:
        for t, running in zip(threads, (1, 2, 3)):  # the endless ones run, then the short one
            t.start()
            deadline = time.monotonic() + 60
            while (httpx.get(url + "/health").json()["engine"]["active_requests"] < running
                   and time.monotonic() < deadline):
                time.sleep(0.02)
        threads[3].start()
        deadline = time.monotonic() + 60
        while (httpx.get(url + "/health").json()["in_flight"] < 4 and "short" not in results
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
    events, closed = results["agent"]
    assert [e["error"]["code"] for e in events] == ["server_shutting_down"]
    assert isinstance(closed, websockets.ConnectionClosed) and closed.rcvd.code == 1012
    text = log.read_text()
    assert "Draining" in text and "Stopping 3 requests" in text
    assert "Finished server process" in text and "still running" not in text
