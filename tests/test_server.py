"""`omnicore serve` as a user runs it: a subprocess on a loopback port with the tiny checkpoint,
driven by the official `openai` client (and httpx for the voice routes, gradio_client for the
demo at /ui). Every body is decoded and compared with the same greedy request made in this
process through the public API."""

import asyncio
import base64
import importlib.util
import io
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import free_port, require_module, stop_process, wait_until_serving  # noqa: E402  (a skip locally, a failure under CI)

openai = require_module("openai")
httpx = require_module("httpx")
sf = require_module("soundfile")
for _name in ("starlette", "uvicorn", "prometheus_client", "sse_starlette"):  # the server extra
    require_module(_name)
# --ui needs the demo extra; without it only the page's tests skip (under CI they fail).
UI = ("--ui",) if importlib.util.find_spec("gradio") is not None else ()

from omnicore import OmniVoice, VoiceClonePrompt  # noqa: E402
from openai import NOT_GIVEN  # noqa: E402
from omnicore.errors import OmniCoreError  # noqa: E402
from omnicore.audio.writers import to_pcm16  # noqa: E402
from omnicore.apps.server import encode_audio  # noqa: E402
from omnicore.apps.server.protocol import MAX_IGNORED_HEADER_BYTES  # noqa: E402
from omnicore.text import limits  # noqa: E402

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
# Greedy and short: codes do not depend on what shares the engine's forwards.
GREEDY = {"num_step": 4, "position_temperature": 0.0}
KEY = "test-key-123"
CLIENTS = 20  # concurrent clients; the module's server admits exactly that many
STORY = ("The first sentence is short. The second sentence comes after it and is longer. "
         "A third sentence closes the little story.")  # streamed as several chunks


def _start(voices_dir, *extra):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OMNICORE_API_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "omnicore", "serve", "--model", str(TINY), "--port", str(port),
         "--voices-dir", str(voices_dir), "-q", "--profile", "exact", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(proc, url + "/health", 90, "the server",
                       lambda: proc.stdout.read().decode() if proc.poll() is not None else "")
    return proc, url


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def server(voices_dir):
    proc, url = _start(voices_dir, "--max-queue", str(CLIENTS), *UI)
    yield url
    stop_process(proc, 10)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


@pytest.fixture(scope="module")
def clip_voice(server, voices_dir, tmp_path_factory):
    """A cloned voice 'clip', made through the multipart route from a noisy 2 s clip."""
    rng = np.random.default_rng(0)
    t = np.arange(48000) / 24000
    wav = (0.2 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * rng.standard_normal(t.size))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, wav, 24000, format="WAV", subtype="PCM_16")
    r = httpx.post(server + "/v1/voices", data={"name": "clip", "ref_text": "A short test clip."},
                   files={"audio": ("clip.wav", buf.getvalue(), "audio/wav")}, timeout=120)
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "clip"
    assert "X-Omnicore-Warning" not in r.headers  # a transcript that fits its clip
    # A transcript far too long for 2 s of audio: the voice is made, and the response says why
    # it will speak badly.
    long_text = "This transcript is far too long to be what a two second clip says. " * 3
    w = httpx.post(server + "/v1/voices", data={"name": "clip_wrong", "ref_text": long_text},
                   files={"audio": ("clip.wav", buf.getvalue(), "audio/wav")}, timeout=120)
    assert w.status_code == 201, w.text
    assert "ref_text does not fit its clip" in w.headers["X-Omnicore-Warning"]
    assert httpx.delete(server + "/v1/voices/clip_wrong").status_code == 200
    return VoiceClonePrompt.load(voices_dir / "clip.npz")


def _int16(x) -> np.ndarray:
    return np.asarray(x, np.int32)


def _close(a, b) -> None:
    """Same audio within one int16 step."""
    a, b = _int16(a), _int16(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.abs(a - b).max(initial=0) <= 1


def _decoded(data: bytes) -> tuple[np.ndarray, int]:
    """A response format's bytes -> (float32 samples [N], rate): libsndfile, or FFmpeg (PyAV)
    for aac, which libsndfile does not read."""
    import av

    if data[:2] != b"\xff\xf1":  # not an ADTS frame
        return sf.read(io.BytesIO(data), dtype="float32")
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
        return np.concatenate(frames).astype(np.float32), container.streams.audio[0].rate


def _streamed(model, text, prompt) -> np.ndarray:
    """What the server streams for `text` (wav, pcm and opus, unless asked otherwise): the
    pieces of `model.stream` as int16 [N]."""
    return np.concatenate([to_pcm16(x) for x in model.stream(text, voice_clone_prompt=prompt, **GREEDY)])


def test_formats_match_generate(client, clip_voice, model):
    """wav and pcm are streamed (OpenAI's default): the pieces of `model.stream`; flac is a
    whole file: `generate`'s audio; the lossy ones (mp3, aac and opus, streamed) decode to
    about the streamed audio's length."""
    text = "Hello from the server."
    want = to_pcm16(model.generate(text, voice_clone_prompt=clip_voice, **GREEDY)[0])
    streamed = _streamed(model, text, clip_voice)
    bodies = {}
    for fmt in ("wav", "flac", "mp3", "opus", "aac", "pcm"):
        resp = client.audio.speech.create(model="omnivoice", voice="clip", input=text,
                                          response_format=fmt, extra_body=GREEDY)
        bodies[fmt] = resp.content
    assert bodies["wav"][:4] == b"RIFF" and bodies["flac"][:4] == b"fLaC"
    assert bodies["opus"][:4] == b"OggS"
    _close(np.frombuffer(bodies["pcm"], "<i2"), streamed)
    for fmt, audio in (("wav", streamed), ("flac", want)):
        got, sr = sf.read(io.BytesIO(bodies[fmt]), dtype="int16")
        assert sr == 24000
        _close(got, audio)
    assert bodies["aac"][:2] == b"\xff\xf1"  # an ADTS frame (MPEG-4, no CRC), as OpenAI's aac
    for fmt in ("mp3", "opus", "aac"):  # lossy: decodes, about the same length
        got, sr = _decoded(bodies[fmt])
        assert sr == 24000 and abs(len(got) - len(streamed)) / sr < 0.15, fmt


def test_the_profile_field_chooses_the_profile_and_the_response_says_which(client, server,
                                                                              clip_voice, model):
    """`profile: "fast"` makes the fast profile's audio (the model's own, in process), and every
    speech response names its profile in X-Omnicore-Profile, "fast (approximate)" for fast; GET /
    lists the profiles so labelled, and the server's default. The fast profile's knobs are
    checked within it; an unknown profile is a 400 naming the field."""
    text = "Hello from the server."
    for body, label in (({}, "exact"), ({"profile": "fast"}, "fast (approximate)"),
                        ({"profile": "live"}, "live (approximate)"),
                        ({"profile": "fast", "prefix_refresh": 2, "uncond_every": 2},
                         "fast (approximate)")):
        resp = client.audio.speech.with_raw_response.create(
            model="omnivoice", voice="clip", input=text, response_format="flac",
            extra_body={**GREEDY, **body})
        assert resp.headers["X-Omnicore-Profile"] == label
        got, _ = sf.read(io.BytesIO(resp.content), dtype="int16")
        want = model.generate(text, voice_clone_prompt=clip_voice, **GREEDY, **body)[0]
        _close(got, to_pcm16(want))
    with client.audio.speech.with_streaming_response.create(
            model="omnivoice", voice="clip", input=text, response_format="pcm",
            extra_body={**GREEDY, "profile": "fast"}) as resp:
        assert resp.headers["X-Omnicore-Profile"] == "fast (approximate)"
    root = httpx.get(server + "/", timeout=30).json()
    assert root["profiles"] == {"exact": "exact", "fast": "fast (approximate)",
                                "live": "live (approximate)"}
    assert root["default_profile"] == "exact"
    for bad in ({"profile": "turbo"}, {"profile": "fast", "prefix_refresh": 0}):
        r = httpx.post(server + "/v1/audio/speech", json={"input": "Hi.", "voice": "clip", **bad},
                       timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] in bad, r.text


def test_bad_requests_are_json_4xx(client, server, clip_voice):
    cases = [
        (dict(voice="clip", input="Hi.", response_format="ogg"), 400, "response_format"),
        (dict(voice="clip", input=""), 400, "input"),
        (dict(voice="clip", input="Hi.", speed=9.0), 400, "speed"),
        (dict(voice="nobody", input="Hi."), 404, "nobody"),
        (dict(voice="clip", input="Hi.", extra_body={"num_step": "many"}), 400, "num_step"),
        (dict(voice="clip", input="x" * 20_001), 400, "limit"),
        # omnicore's own `instruct` is strict (OpenAI's `instructions` is prose): the message
        # lists the items
        (dict(voice="clip", input="Hi.", extra_body={"instruct": "Speak cheerfully."}), 400,
         "pitch"),
        (dict(voice="clip", input="Hi.", instructions="warm", extra_body={"instruct": "male"}),
         400, "not both"),
    ]
    for kw, status, word in cases:
        with pytest.raises(openai.APIStatusError) as exc:
            client.audio.speech.create(model="omnivoice", **kw)
        assert exc.value.status_code == status, kw
        err = exc.value.response.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and word in json.dumps(err)
    r = httpx.post(server + "/v1/audio/speech", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/audio/speech", content=b"x" * (2 * 2**20), timeout=30)
    assert r.status_code == 413 and "error" in r.json()
    r = httpx.post(server + "/v1/audio/speech", json={"input": "Hi.", "voice": "clip",
                                                      "seed": "zero"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    assert "Traceback" not in r.text


def test_instructions_are_bounded_and_so_is_the_header_naming_what_they_left(client, clip_voice):
    """OpenAI's `instructions`: over the limit, a 400 before any reading of it; within it, however
    much of the prose goes unused, the header that names it stays small, so the OpenAI SDK
    (httpx) takes the response and its audio."""
    prose = ("ß" * 150 + " male. ") * 25  # 25 unused fragments, 6 header bytes a character
    assert len(prose) <= limits.MAX_INSTRUCT_CHARS
    resp = client.audio.speech.with_raw_response.create(
        model="omnivoice", voice="clip", input="Hi.", instructions=prose, response_format="wav",
        extra_body=GREEDY)
    header = resp.headers["x-omnicore-instructions-ignored"]
    assert len(header) <= MAX_IGNORED_HEADER_BYTES
    ignored = json.loads(header)
    assert ignored[0] == "ß" * 150 and ignored[-1].endswith(" more"), ignored
    assert int(ignored[-1].split()[1]) == 25 - (len(ignored) - 1)
    assert sf.read(io.BytesIO(resp.content))[0].size
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.speech.create(model="omnivoice", voice="clip", input="Hi.",
                                   instructions="Speak warmly. " * 62_000)  # 868 KB
    err = exc.value.response.json()["error"]
    assert (err["param"], err["code"]) == ("instructions", "instructions_too_long"), err
    assert "4,096" in err["message"]


def _raw_stream(client, text, fmt, **kw):
    """A raw audio stream of the clip voice: its body. `kw`: more of the request (default:
    stream_format="audio")."""
    kw = {"model": "omnivoice", "stream_format": "audio", **kw}
    with client.audio.speech.with_streaming_response.create(
            voice="clip", input=text, response_format=fmt, extra_body=GREEDY, **kw) as resp:
        return b"".join(resp.iter_bytes())


LONG_STORY = " ".join(f"Sentence {i} of a longer story, told one piece at a time." for i in range(24))


def _parked_stream(url: str, body: dict):
    """POST a streamed `body` on a socket that takes the response's head and its first audio,
    then stops reading until the server has nothing left to do but wait for it (its request in
    flight, the engine idle); then reads the rest. Returns (the body, /health while parked,
    /health at the end). A stream made whole before it is sent would have run every pass by
    the time it is parked; a stream sent as it is made can run no more than its lookahead
    before its client reads again."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # no megabytes of slack
        sock.settimeout(120)
        sock.connect((host, int(port)))
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < 100:
            raw += sock.recv(4096)
        deadline = time.monotonic() + 120
        while True:
            parked = httpx.get(url + "/health").json()
            if parked["in_flight"] == 1 and parked["engine_passes"] == 0:
                break
            assert time.monotonic() < deadline, parked
            time.sleep(0.05)
        while chunk := sock.recv(1 << 16):
            raw += chunk
            if raw.endswith(b"\r\n0\r\n\r\n"):
                break
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    out = b""
    while True:  # the chunked transfer coding: size in hex, CRLF, data, CRLF
        size, _, rest = chunked.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, chunked = out + rest[:n], rest[n + 2:]
    return out, parked, httpx.get(url + "/health").json()


def test_streaming_first_bytes_early_and_same_audio(client, server, clip_voice, model):
    # The first audio leaves before the last pass has run: a client that stops reading after
    # it finds the server waiting for it with passes still to run, which run once it reads
    # again; and what it gets is the stream's audio, made in this process.
    body, parked, done = _parked_stream(server, {
        "model": "tts-1", "voice": "clip", "input": LONG_STORY, "response_format": "wav",
        "stream_format": "audio", **GREEDY})
    assert done["engine"]["iterations"] > parked["engine"]["iterations"], (parked, done)
    assert body[:4] == b"RIFF" and body[4:8] == b"\xff\xff\xff\xff" and body[40:44] == b"\xff\xff\xff\xff"
    _close(np.frombuffer(body[44:], "<i2"), _streamed(model, LONG_STORY, clip_voice))

    text = STORY
    pieces = list(model.stream(text, voice_clone_prompt=clip_voice, **GREEDY))
    want = np.concatenate([to_pcm16(x) for x in pieces])
    with client.audio.speech.with_streaming_response.create(
            model="omnivoice", voice="clip", input=text, response_format="pcm",
            stream_format="sse", extra_body=GREEDY) as resp:
        raw = b"".join(resp.iter_bytes()).decode()
    events = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:")]
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["audio_seconds"] == pytest.approx(len(want) / 24000)
    assert 0 < events[-1]["timings"]["ttfb"] < events[-1]["timings"]["total"]
    deltas = [e for e in events[:-1] if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(events) - 1 >= 2
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    _close(np.frombuffer(pcm, "<i2"), want)

    # Opus leaves piece by piece too (test_openai_defaults_stream...: no Content-Length), and
    # decodes as the whole stream's audio encoded at once.
    body = _raw_stream(client, text, "opus")
    assert body[:4] == b"OggS"
    got, sr = sf.read(io.BytesIO(body), dtype="float32")
    whole, _ = sf.read(io.BytesIO(encode_audio(np.concatenate(pieces), "opus")), dtype="float32")
    assert sr == 24000 and got.shape == whole.shape
    assert np.abs(got - whole).max() < 0.02

    # SSE deltas carry the response_format's bytes, piece by piece: wav after its header, and
    # the default mp3 (what an unmodified client gets: LiveKit's OpenAI plugin) frame by frame.
    for fmt, n_deltas in (("wav", len(deltas) + 1), (None, len(deltas) + 1)):
        extra = {} if fmt is None else {"response_format": fmt}
        with client.audio.speech.with_streaming_response.create(
                model="omnivoice", voice="clip", input=text, stream_format="sse",
                extra_body=GREEDY, **extra) as resp:
            raw = b"".join(resp.iter_bytes()).decode()
        events = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:")]
        data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        assert len(events) - 1 == n_deltas and events[-1]["type"] == "speech.audio.done", fmt
        if fmt == "wav":
            assert data[:4] == b"RIFF" and data[40:44] == b"\xff\xff\xff\xff"
            _close(np.frombuffer(data[44:], "<i2"), want)
        else:
            got, sr = _decoded(data)
            assert sr == 24000 and abs(len(got) - len(want)) / sr < 0.15



def test_openai_defaults_stream_and_model_is_checked(client, clip_voice, model):
    """As OpenAI's API: an unmodified client's with_streaming_response gets wav, pcm, opus, mp3
    and aac as they are made (no stream_format given; chunked, no Content-Length), flac as one
    file; `model` is one of /v1/models (OpenAI's names are aliases), else a 404 in OpenAI's
    error shape."""
    text = STORY
    want = _streamed(model, text, clip_voice)
    for fmt in ("wav", "pcm"):
        body = _raw_stream(client, text, fmt, model="tts-1", stream_format=NOT_GIVEN)
        _close(np.frombuffer(body[44:] if fmt == "wav" else body, "<i2"), want)
    for fmt, streamed in (("opus", True), ("mp3", True), ("aac", True), ("flac", False)):
        with client.audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts", voice="clip", input="Hi.", response_format=fmt,
                extra_body=GREEDY) as resp:
            assert ("content-length" not in resp.headers) == streamed, (fmt, resp.headers)
            assert resp.read()

    assert {"tiny-random", "omnivoice", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= {
        m.id for m in client.models.list()}
    with pytest.raises(openai.NotFoundError) as exc:
        client.audio.speech.create(model="gpt-5-tts", voice="clip", input="Hi.")
    err = exc.value.response.json()["error"]
    assert (err["param"], err["code"], err["type"]) == ("model", "model_not_found",
                                                        "invalid_request_error")
    assert "tts-1" in err["message"]


def test_voices_designed_presets_delete_and_names(client, server, voices_dir, model):
    spec = {"instruct": "female, low pitch, british accent", "seed": 5, "num_step": 4,
            "text": "This is how I sound."}
    a = httpx.post(server + "/v1/voices", json={"name": "des_a", **spec}, timeout=120)
    b = httpx.post(server + "/v1/voices", json={"name": "des_b", **spec}, timeout=120)
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    pa = VoiceClonePrompt.load(voices_dir / "des_a.npz")
    pb = VoiceClonePrompt.load(voices_dir / "des_b.npz")
    np.testing.assert_array_equal(pa.ref_audio_tokens, pb.ref_audio_tokens)  # seeded: same voice
    assert httpx.post(server + "/v1/voices", json={"name": "des_a", **spec}).status_code == 409
    # A preset's name stays its documented voice: not taken by a created one (even before use).
    r = httpx.post(server + "/v1/voices", json={"name": "nova", **spec})
    assert r.status_code == 409 and r.json()["error"]["code"] == "voice_reserved"

    # A preset is designed on first use (alloy, the default, was made before the server was
    # ready), stored, then reused as is: both texts speak with it.
    assert (voices_dir / "alloy.npz").exists() and not (voices_dir / "ash.npz").exists()
    for text in ("One sentence for ash.", "Another, different sentence."):
        got = client.audio.speech.create(model="tts-1", voice="ash", input=text,
                                         response_format="pcm", extra_body=GREEDY).content
        preset = VoiceClonePrompt.load(voices_dir / "ash.npz")
        if text.startswith("One"):
            first_codes = preset.ref_audio_tokens
        np.testing.assert_array_equal(preset.ref_audio_tokens, first_codes)
        _close(np.frombuffer(got, "<i2"), _streamed(model, text, preset))
    # {"id": name} works as the voice too
    got = client.audio.speech.create(model="tts-1", voice={"id": "des_a"}, input="Hi there.",
                                     response_format="pcm", extra_body=GREEDY).content
    _close(np.frombuffer(got, "<i2"), _streamed(model, "Hi there.", pa))

    listed = {v["id"] for v in httpx.get(server + "/v1/voices").json()["data"]}
    assert {"des_a", "des_b", "alloy", "nova"} <= listed
    assert httpx.get(server + "/v1/voices/des_b").json()["ref_text"]
    assert httpx.delete(server + "/v1/voices/des_b").status_code == 200
    assert not (voices_dir / "des_b.npz").exists()
    assert httpx.get(server + "/v1/voices/des_b").status_code == 404
    assert httpx.delete(server + "/v1/voices/des_b").status_code == 404
    for bad in ("../evil", "a/b", ".hidden", "x" * 65, "", "..", "name with space"):
        r = httpx.post(server + "/v1/voices", json={"name": bad, **spec})
        assert r.status_code == 400 and r.json()["error"]["param"] == "name", bad
    for bad in ("..%2F..%2Fetc%2Fpasswd", "%2E%2E", "a%2Fb"):
        assert httpx.get(server + "/v1/voices/" + bad).status_code in (400, 404)
        assert httpx.delete(server + "/v1/voices/" + bad).status_code in (400, 404)
    kept = {p.name for p in voices_dir.glob("*.npz")} - {"clip.npz"}  # clip: an earlier test's
    assert kept == {"alloy.npz", "ash.npz", "des_a.npz"}
    assert not list(voices_dir.glob("*.tmp")) and not list(voices_dir.glob("des_b.*"))


def _samples(url) -> dict:
    """/metrics as {(sample name, sorted labels): value} (with the key: behind it on a keyed
    server, and ignored by one without)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


def test_twenty_concurrent_clients_all_answered_as_alone(client, server, clip_voice, model):
    """CLIENTS clients at once: every one answered with what its request gives alone, and the
    engine packed them (fewer iterations than the requests' steps, every pass's tokens counted
    once in the tokens-per-iteration histogram: none lost, none run twice)."""
    texts = [f"Client {i} says {'hello ' * (1 + i % 4)}." for i in range(CLIENTS)]
    alone_tokens = []  # per iteration of the requests run alone, here
    model.engine.trace = lambda ids: alone_tokens.append(model.engine.load().last_tokens)
    try:
        want = [to_pcm16(model.generate(t, voice_clone_prompt=clip_voice, **GREEDY)[0]) for t in texts]
    finally:
        model.engine.trace = None
    assert len(alone_tokens) == CLIENTS * GREEDY["num_step"]
    before = _samples(server)
    got, errors = [None] * CLIENTS, []
    start = threading.Barrier(CLIENTS, timeout=60)

    def call(i):
        start.wait()
        try:
            got[i] = client.audio.speech.create(model="omnivoice", voice="clip", input=texts[i],  # whole
                                                response_format="flac", extra_body=GREEDY).content
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
    threads = [threading.Thread(target=call, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for g, w in zip(got, want):
        assert g is not None
        _close(sf.read(io.BytesIO(g), dtype="int16")[0], w)
    after = _samples(server)
    hist = "omnicore_engine_tokens_per_iteration"
    iterations = after[(hist + "_count", ())] - before[(hist + "_count", ())]
    assert after[(hist + "_sum", ())] - before[(hist + "_sum", ())] == sum(alone_tokens)
    assert iterations <= len(alone_tokens) / 2, iterations  # packed, not one after another
    ok = ("omnicore_requests_total", (("route", "speech"), ("status", "200")))
    assert after[ok] - before.get(ok, 0) == CLIENTS


def test_ui_runs_on_the_servers_model_and_engine(server):
    """--ui: the demo at /ui answers, and its job runs on the server's own engine (the API's
    /health counts its iterations), with what the API gives for the same settings."""
    require_module("gradio")  # the module's server ran with --ui only if it is there
    gradio_client = require_module("gradio_client")
    assert httpx.get(server + "/ui/", timeout=30).status_code == 200
    settings = dict(num_step=4, seed=3, position_temperature=0.0)
    before = httpx.get(server + "/health").json()["engine"]["iterations"]
    ui = gradio_client.Client(server + "/ui/", verbose=False)
    wav_path, *_ = ui.predict(text="Hello from the page.", api_name="/auto", **settings)
    assert httpx.get(server + "/health").json()["engine"]["iterations"] == before + 4
    page, sr = sf.read(wav_path, dtype="int16")
    api = httpx.post(server + "/v1/audio/speech", timeout=60, json={  # a whole file, as the page's
        "input": "Hello from the page.", "response_format": "flac", **settings})
    assert api.status_code == 200 and sr == 24000
    _close(page, sf.read(io.BytesIO(api.content), dtype="int16")[0])


def test_models_health_metrics(server, client, clip_voice):
    assert "tts-1" in {m.id for m in client.models.list()}
    assert httpx.post(server + "/v1/audio/speech", json={"input": ""}).status_code == 400
    with client.audio.speech.with_streaming_response.create(  # a stream: timed too
            model="omnivoice", voice="clip", input="Hi.", response_format="pcm",
            stream_format="audio", extra_body=GREEDY) as resp:
        assert resp.read()
    health = httpx.get(server + "/health").json()
    assert health["status"] == "ok" and health["in_flight"] == health["queued"] == 0
    assert health["engine"]["iterations"] > 0 and health["engine"]["last_tokens"] > 0
    assert health["engine_passes"] == health["engine"]["active_passes"] == 0
    got = _samples(server)
    assert got[("omnicore_requests_total", (("route", "speech"), ("status", "200")))] > 0
    assert got[("omnicore_requests_total", (("route", "speech"), ("status", "400")))] > 0
    assert got[("omnicore_engine_passes", (("state", "active"),))] == 0
    assert got[("omnicore_queue_depth", ())] == 0
    assert got[("omnicore_engine_tokens_per_iteration_count", ())] == health["engine"]["iterations"]
    # Every speech request, streamed or not, counts once in TTFB and once in RTF.
    assert got[("omnicore_rtf_count", ())] == got[("omnicore_ttfb_seconds_count", ())] > 0
    # The prompt cache: the voice spoken with was parsed from its file, and not on every lookup.
    loads = got[("omnicore_voice_prompts", (("event", "loads"),))]
    assert 1 <= loads <= got[("omnicore_voice_prompts", (("event", "lookups"),))]


def _raw_post(url: str, body: dict, headers: dict) -> socket.socket:
    """A speech POST on a socket the test closes when it likes: a client that goes away."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {len(data)}\r\n{head}\r\n".encode() + data)
    return sock


def _health_until(url: str, ok, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = httpx.get(url + "/health", timeout=10).json()
        if ok(h) or time.monotonic() > deadline:
            return h
        time.sleep(0.01)


def _leaves_within_steps(url: str, sock_or_close) -> None:
    """Close a client's connection while its passes are in the engine: they are gone within
    a step or two (the step in progress, and the one the engine may have begun before the
    cancel reached it; one more for the time the close takes to reach the server)."""
    h = _health_until(url, lambda h: h["engine"]["active_passes"] > 0)
    assert h["engine"]["active_passes"] > 0, h
    sock_or_close()
    after = _health_until(url, lambda h: h["engine_passes"] == 0)
    assert after["engine_passes"] == 0, after
    assert after["engine"]["iterations"] - h["engine"]["iterations"] <= 3, (h, after)


def test_restart_auth_queue_and_disconnect(voices_dir, clip_voice):
    # A second server on the same folder: voices persist; a key is required (the page at /ui
    # asks for it too); one request synthesises at a time, one more may wait.
    proc, url = _start(voices_dir, "--api-key", KEY, "--max-queue", "2", "--max-concurrency", "1",
                       *UI)
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        r = httpx.get(url + "/v1/voices", timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
        for wrong in ("Bearer wrong", f"Bearer {KEY}x", KEY, f"Basic {KEY}", f"Bearer {KEY[:-1]}"):
            assert httpx.get(url + "/v1/voices", headers={"Authorization": wrong}).status_code == 401
        assert httpx.get(url + "/v1/voices", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
        names = {v["id"] for v in httpx.get(url + "/v1/voices", headers=auth).json()["data"]}
        stored = {p.stem for p in voices_dir.glob("*.npz")}
        assert "clip" in stored and stored <= names
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).audio.speech.create(
                model="tts-1", voice="clip", input="Hi.")
        if UI:  # the page asks for the key as its password
            assert httpx.get(url + "/ui/gradio_api/login_check").status_code == 401
            assert httpx.post(url + "/ui/login", data={"username": "me", "password": "no"}).status_code == 400
            page = httpx.Client(base_url=url)
            assert page.post("/ui/login", data={"username": "me", "password": KEY}).json()["success"]
            assert page.get("/ui/gradio_api/login_check").status_code == 200

        # A stream holds the one slot; a second request waits for it, a third is refused.
        long_text = " ".join(f"Sentence {i} of a long story." for i in range(12))
        body = {"input": long_text, "voice": "clip", "response_format": "pcm",
                "stream_format": "audio", "num_step": 64}
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, headers=auth, timeout=60) as r:
            assert r.status_code == 200
            parts = r.iter_bytes()  # kept: dropping the iterator would close the response
            assert next(parts)  # first audio is out; the rest is still being made
            waiting = _raw_post(url, {"input": "Hi.", "voice": "clip", **GREEDY}, auth)
            assert _health_until(url, lambda h: h["queued"] == 1)["queued"] == 1
            # the gauge, sampled at its own moment: a stream between two chunks has its next
            # pass waiting in the engine for an instant, which counts it as queued too
            deadline = time.monotonic() + 30
            while (depth := _samples(url)[("omnicore_queue_depth", ())]) != 1 and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
            assert depth == 1
            over = httpx.post(url + "/v1/audio/speech", headers=auth, timeout=30,
                              json={"input": "Hi.", "voice": "clip"})
            assert over.status_code == 429 and over.headers["retry-after"] == "1"
            assert over.json()["error"]["type"] == "rate_limit_error"
            # The waiting client leaves: it never runs (499), the stream goes on.
            waiting.close()
            h = _health_until(url, lambda h: h["queued"] == 0 and h["in_flight"] == 1)
            assert h["queued"] == 0 and h["in_flight"] == 1, h
            # Leaving the block closes the connection: the stream's passes are cancelled.
            _leaves_within_steps(url, r.close)
        h = _health_until(url, lambda h: h["in_flight"] == 0)
        assert h["in_flight"] == 0, h
        got = _samples(url)
        assert got[("omnicore_streams_cancelled_total", ())] == 1
        # A whole-file request whose client goes away mid-way is cancelled too (499).
        sock = _raw_post(url, {"input": long_text, "voice": "clip", "num_step": 64,
                               "response_format": "flac"}, auth)
        _leaves_within_steps(url, sock.close)
        h = _health_until(url, lambda h: h["in_flight"] == 0)
        assert h["in_flight"] == 0, h
        got = _samples(url)
        assert got[("omnicore_requests_total", (("route", "speech"), ("status", "499")))] == 2
        assert got[("omnicore_requests_total", (("route", "speech"), ("status", "429")))] == 1
        r = httpx.post(url + "/v1/audio/speech", headers=auth, timeout=60,  # a whole file
                       json={"input": "Hi.", "voice": "clip", "response_format": "flac", **GREEDY})
        assert r.status_code == 200 and r.content[:4] == b"fLaC"
        timings = dict(kv.split("=") for kv in r.headers["x-omnicore-timings"].split(", "))
        assert {"queue", "prepare", "unmask", "decode", "total"} <= set(timings)
        assert float(timings["total"]) >= float(timings["unmask"]) > 0
        assert float(r.headers["x-omnicore-audio-seconds"]) > 0
    finally:
        stop_process(proc, 10)


def test_speech_body_takes_every_generation_field():
    """The speech body's generation fields are GenerationConfig's, typed by its declaration (a
    float field takes an integer; JSON true is not a number, 1 is not a bool); absent ones
    are left to its defaults."""
    from dataclasses import fields

    from omnicore.model.config import GenerationConfig
    from omnicore.apps.server.protocol import HTTPError, parse_speech

    defaults = {f.name: f.default for f in fields(GenerationConfig)}
    assert parse_speech({"input": "Hi.", **defaults})["gen"] == defaults
    assert parse_speech({"input": "Hi."})["gen"] == {}
    assert parse_speech({"input": "Hi.", "guidance_scale": 2})["gen"] == {"guidance_scale": 2}
    for name, value in defaults.items():
        for bad in ("1", 1 if isinstance(value, bool) else True):
            with pytest.raises(HTTPError) as exc:
                parse_speech({"input": "Hi.", name: bad})
            assert exc.value.status == 400 and exc.value.param == name, (name, bad)


def test_serve_flags_checked_before_the_model_loads(capsys):
    from omnicore.apps.cli import main

    assert main(["serve", "--model", str(TINY), "--max-queue", "0"]) == 2
    assert main(["serve", "--model", str(TINY), "--max-concurrency", "0"]) == 2
    assert "--max-concurrency must be at least 1" in capsys.readouterr().err


def test_voice_library_loads_reference_pt_prompts(tmp_path):
    """A prompt saved by the reference (`.pt`) dropped into the voices folder is a voice; an
    omnicore .npz of the same name wins; DELETE removes either file."""
    from omnicore.apps.server import VoiceLibrary

    fixtures = Path(__file__).parent / "fixtures" / "reference"
    shutil.copy(fixtures / "voice_full.pt", tmp_path / "refvoice.pt")
    shutil.copy(fixtures / "voice_full.pt", tmp_path / "both.pt")
    other = VoiceClonePrompt(np.zeros((8, 5), np.int64), "Omnicore's own.", 0.05)
    other.save(tmp_path / "both.npz")
    lib = VoiceLibrary(tmp_path)
    assert lib.names() == ["both", "refvoice"]
    want = VoiceClonePrompt.load(fixtures / "voice_full.pt")
    np.testing.assert_array_equal(lib.get("refvoice").ref_audio_tokens, want.ref_audio_tokens)
    assert lib.get("both").ref_text == "Omnicore's own."
    assert lib.delete("refvoice") and not (tmp_path / "refvoice.pt").exists()


def _slot_free(server) -> bool:
    """Nothing admitted, nothing queued, the gauge at 0 and the run slot free."""
    ld = server.load()
    return (ld["in_flight"], ld["queued"], server.registry.get_sample_value(
        "omnicore_requests_in_flight"), server.run_slots.locked()) == (0, 0, 0.0, False)


def test_slot_is_given_back_on_every_exit_path():
    """`async with server.slot(gone)`: the place and the run slot come back when the block ends,
    raises or is cancelled, when its client leaves (or its task is cancelled) while it waits for
    the run slot, and, once handed over, when the holder releases it (once); a full server
    refuses with 429."""
    from omnicore.engine import EngineLoad
    from omnicore.errors import CancelledError
    from omnicore.apps.server.protocol import HTTPError
    from omnicore.apps.server.state import ServerState

    class IdleEngine:
        trace = None

        def load(self):
            return EngineLoad(0, 0, 0, 0, 0, 0)

    async def hold(server, gone, inside: asyncio.Event):
        async with server.slot(gone):
            inside.set()
            await asyncio.sleep(3600)

    async def until_queued(server):
        for _ in range(1000):
            if server.load()["queued"]:
                return
            await asyncio.sleep(0)
        raise AssertionError("the request never queued for the run slot")

    async def main():
        server = ServerState(SimpleNamespace(engine=IdleEngine()), max_queue=2, max_concurrency=1)
        stays = asyncio.get_running_loop().create_future()  # a client that never leaves
        async with server.slot(stays):
            assert server.load()["in_flight"] == 1 and server.run_slots.locked()
        assert _slot_free(server)

        with pytest.raises(RuntimeError):
            async with server.slot(stays):
                raise RuntimeError("an error mid-synthesis")
        assert _slot_free(server)

        inside = asyncio.Event()
        task = asyncio.create_task(hold(server, stays, inside))
        await inside.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert _slot_free(server)

        async with server.slot(stays):  # holds the one run slot
            leaves = asyncio.get_running_loop().create_future()
            inside = asyncio.Event()
            waiter = asyncio.create_task(hold(server, leaves, inside))
            await until_queued(server)
            with pytest.raises(HTTPError) as full:
                async with server.slot(stays):
                    pass
            assert full.value.status == 429
            leaves.set_result(None)  # the waiting client leaves: it never runs
            with pytest.raises(CancelledError):
                await waiter
            assert not inside.is_set() and server.load()["in_flight"] == 1
            waiter = asyncio.create_task(hold(server, stays, inside))
            await until_queued(server)
            waiter.cancel()  # e.g. the server shutting down
            await asyncio.gather(waiter, return_exceptions=True)
            assert not inside.is_set() and server.load()["in_flight"] == 1
        assert _slot_free(server)

        async with server.slot(stays) as slot:
            slot.hand_over()  # a stream's body now holds it
        assert server.load()["in_flight"] == 1 and server.run_slots.locked()
        slot.release()
        slot.release()
        assert _slot_free(server)
        server.pool.shutdown()

    asyncio.run(main())


class _FailingModel:
    """The tiny model, except that a text starting with "Fail" raises part-way: at its second
    step, or, streamed, at the first step of its second chunk (after its first audio)."""

    def __init__(self, model):
        self._model, self.engine = model, model.engine

    def __getattr__(self, name):
        return getattr(self._model, name)

    @staticmethod
    def _failing(text, on_step, steps_before):
        calls = itertools.count(1)

        def step(i, n):
            if on_step is not None:
                on_step(i, n)
            if text.startswith("Fail") and next(calls) > steps_before:
                raise OmniCoreError("a failure mid-synthesis")
        return step

    def synthesize(self, text, on_step=None, **kw):
        return self._model.synthesize(text, on_step=self._failing(text, on_step, 1), **kw)

    def stream(self, text, on_step=None, **kw):
        steps = kw.get("num_step", GREEDY["num_step"])
        return self._model.stream(text, on_step=self._failing(text, on_step, steps), **kw)


@pytest.fixture(scope="module")
def failing_server():
    """An in-process server (one run slot) on a model whose "Fail..." texts fail mid-way."""
    import uvicorn

    from omnicore.apps.server.app import create_app
    from omnicore.apps.server.state import ServerState

    state = ServerState(_FailingModel(OmniVoice.from_pretrained(TINY)), max_queue=2,
                        max_concurrency=1)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port,
                                        log_level="critical"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.started
    yield f"http://127.0.0.1:{port}", state
    srv.should_exit = True
    thread.join(10)
    state.pool.shutdown(cancel_futures=True)


def test_failures_and_disconnects_give_the_slot_back(failing_server):
    """Every way a request can end early gives its place and its run slot back: /health and the
    in-flight gauge return to 0, and the next request runs (a kept run slot would block it)."""
    url, state = failing_server
    story = ("The first sentence is short. The second sentence comes after it and is longer. "
             "A third sentence closes the little story.")

    def speech(**body):
        return httpx.post(url + "/v1/audio/speech", timeout=60, json={**GREEDY, **body})

    def given_back():
        h = _health_until(url, lambda h: h["in_flight"] == 0 and h["engine_passes"] == 0)
        assert h["in_flight"] == h["queued"] == h["engine_passes"] == 0, h
        assert _slot_free(state)
        assert speech(input="Hi.", response_format="pcm").status_code == 200

    r = speech(input="Fail, whole file.", response_format="flac")  # an error mid-synthesis
    assert r.status_code == 500 and r.json()["error"]["message"] == "a failure mid-synthesis"
    given_back()
    r = speech(input="Hi.", voice="nobody")  # an error after admission, before synthesis
    assert r.status_code == 404
    given_back()
    r = httpx.post(url + "/v1/voices", timeout=60, json={
        "name": "broken", "instruct": "male", "num_step": 4, "text": "Fail, designing a voice."})
    assert r.status_code == 500 and "broken" not in httpx.get(url + "/v1/voices").text
    given_back()

    cancelled = state.registry.get_sample_value("omnicore_streams_cancelled_total")
    with pytest.raises(httpx.HTTPError):  # the 200 has left: the stream is cut short
        with httpx.stream("POST", url + "/v1/audio/speech", timeout=60, json={
                **GREEDY, "input": "Fail. " + story, "response_format": "pcm",
                "stream_format": "audio"}) as r:
            assert r.status_code == 200
            for _ in r.iter_bytes():
                pass
    given_back()
    with httpx.stream("POST", url + "/v1/audio/speech", timeout=60, json={
            **GREEDY, "input": "Fail. " + story, "response_format": "pcm",
            "stream_format": "sse"}) as r:
        raw = b"".join(r.iter_bytes()).decode()
    assert "event: error" in raw and "a failure mid-synthesis" in raw
    given_back()
    long_text = " ".join(f"Sentence {i} of a long story." for i in range(12))
    with httpx.stream("POST", url + "/v1/audio/speech", timeout=60, json={
            "input": long_text, "response_format": "pcm", "stream_format": "audio",
            "num_step": 64}) as r:
        parts = r.iter_bytes()  # kept: dropping the iterator would close the response
        assert next(parts)  # first audio is out; the client leaves mid-stream
        _leaves_within_steps(url, r.close)
    given_back()
    assert state.registry.get_sample_value("omnicore_streams_cancelled_total") == cancelled + 3


@pytest.mark.subprocess
@pytest.mark.slow
def test_an_int8_server_says_its_precision_where_the_profile_is_said(tmp_path):
    """`serve --precision int8`: the start-up lines name the precision, labelled approximate;
    every speech response's X-Omnicore-Profile adds it to the profile's label; GET / gives it
    with the labels of all precisions. At fp32 (the other tests' servers) the header is the
    profile's label alone."""
    from conftest import start_server

    log_path = tmp_path / "server.log"
    proc, url = start_server(tmp_path / "voices", "--precision", "int8", "--profile", "live",
                             log_path=log_path)
    try:
        r = httpx.post(url + "/v1/audio/speech", json={"input": "Small and quick.", "voice": "alloy",
                                                       "response_format": "pcm", **GREEDY},
                       timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["X-Omnicore-Profile"] == "live (approximate); precision int8 (approximate)"
        root = httpx.get(url + "/", timeout=30).json()
        assert root["precision"] == "int8" and root["default_profile"] == "live"
        assert root["precisions"]["int8"] == "int8 (approximate)"
        assert root["precisions"]["fp32"] == "fp32"
    finally:
        stop_process(proc, 10)
    log = log_path.read_text()
    assert "Precision: int8 (approximate)" in log, log


def test_the_precision_start_up_line_says_what_the_cpu_offers():
    """fp32 names --precision int8 only where the int8 kernels have dot-product units to run on;
    int8 is labelled approximate, and says so when it would run the plain loops."""
    from omnicore.apps.server import precision_line
    from omnicore.model import int8_kernels

    try:
        int8_kernels.force_path("plain")
        assert precision_line("fp32") == "fp32"
        assert precision_line("int8").startswith("int8 (approximate)")
        assert "plain loops" in precision_line("int8")
        int8_kernels.force_path(None)
        if int8_kernels.path() != "plain":
            assert "--precision int8" in precision_line("fp32")
            assert "plain loops" not in precision_line("int8")
        assert precision_line("bf16").startswith("bf16 (approximate)")
    finally:
        int8_kernels.force_path(None)
