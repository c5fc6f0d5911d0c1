"""`omnicore serve --ray`: the same server as a Ray Serve application, through Serve's HTTP
proxy (the tiny checkpoint, 2 replicas of 1 CPU): the OpenAI SDK's requests and streams, the
same bytes as `omnicore serve`, LiveKit's and Pipecat's stock OpenAI classes, voice affinity
counted in /metrics, a replica killed mid-stream, a model that does not load, and Ray or Serve
missing. The parts that need no Ray (the relay's helpers) first.

One Ray for the module (started as `ray start --head` would, the servers join it by address, as
on a cluster) and one Serve deployment shared by the tests that only send it requests; a model
that does not load gets its own, on the same Ray, before the shared one is deployed."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import (HOUSE, TINY, free_port, missing, require_module, require_server_extra,
                      spawn_omnicore, start_server, stop_process, wait_until_serving)
from omnicore.apps.server import ray_serve
from omnicore.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
# Short and seeded: the Ray server and the single one must make the same bytes.
FAST = {"num_step": 4, "seed": 7}


# -- without Ray ----------------------------------------------------------------------------------

def test_autoscale_spec_and_the_target_per_replica():
    assert ray_serve.parse_autoscale("1:2") == (1, 2) and ray_serve.parse_autoscale(None) is None
    for bad in ("2:1", "0:2", "1", "a:b", "1:2:3", ""):
        with pytest.raises(InputError):
            ray_serve.parse_autoscale(bad)
    # docs/performance.md's sizing: cores per conversation at a profile; a GPU's measured batch
    assert ray_serve.target_ongoing("live", 2, 0) == 1
    assert ray_serve.target_ongoing("fast", 32, 0) == 3
    assert ray_serve.target_ongoing("exact", 46, 0) == 1
    assert ray_serve.target_ongoing("exact", 1, 1) == ray_serve.GPU_CONVERSATIONS


def test_the_voice_routed_on_is_the_speech_bodys():
    speech = {"method": "POST", "path": "/v1/audio/speech"}
    assert ray_serve.voice_of(speech, b'{"voice": "ann"}') == "ann"
    assert ray_serve.voice_of(speech, b'{"voice": {"id": "bob"}}') == "bob"
    for body in (b"not json", b"[1]", b'{"voice": 3}', b'{"voice": ""}', b"{}"):
        assert ray_serve.voice_of(speech, body) == ""  # the route answers these itself
    assert ray_serve.voice_of({"method": "POST", "path": "/v1/voices"}, b'{"voice": "a"}') == ""
    scope = {"type": "http", "method": "GET", "path": "/x", "root_path": "/p", "headers":
             [(b"a", b"b")], "state": {"not": "sent"}, "extensions": {}}
    wire = ray_serve.wire_scope(scope)
    assert wire["root_path"] == "" and wire["headers"] == [(b"a", b"b")]
    assert "state" not in wire and "extensions" not in wire


def test_replica_flags_need_ray_and_one_way_to_count(capsys, tmp_path):
    from omnicore.apps.cli import main

    base = ["serve", "--model", str(TINY), "--voices-dir", str(tmp_path)]
    assert main([*base, "--replicas", "2"]) == 2
    assert "--replicas sets the replicas on Ray Serve; it needs --ray" in capsys.readouterr().err
    assert main([*base, "--ray", "--replicas", "2", "--autoscale", "1:2"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main([*base, "--ray", "--autoscale", "2:1"]) == 2
    assert "1 <= MIN <= MAX" in capsys.readouterr().err


@pytest.mark.subprocess
@pytest.mark.parametrize("blocked", ["ray", "ray.serve"])
def test_without_ray_or_serve_one_line_names_the_extra(blocked, tmp_path):
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from omnicore.apps.cli import main\n"
            f"sys.exit(main(['serve', '--model', {str(TINY)!r}, '--ray', '--voices-dir', "
            f"{str(tmp_path)!r}]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'omnicore[ray]'" in lines[0], r.stderr


# -- on a local Ray -------------------------------------------------------------------------------

def require_serve() -> None:
    """Ray Serve installed (found, not imported: the servers under test import it)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        missing("ray.serve", "pip install 'omnicore[ray]'")


def _metric(text: str, name: str) -> dict:
    """{labels: value} of one Prometheus metric's samples."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            out[labels[len(name):]] = float(value)
    return out


def _replica_pids(url: str) -> dict:
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for labels in _metric(text, "omnicore_cluster_replica"):
        fields = dict(kv.split("=") for kv in labels.strip("{}").split(","))
        out[fields["replica"].strip('"')] = int(fields["pid"].strip('"'))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class RayHead:
    """A local Ray head in a child process (2 CPUs, Serve's proxy at `port`), started in the
    background: `address()` waits for it. Its output goes to `log`. It runs as the local Ray
    of `omnicore serve --ray` does (ray_serve.local_ray: Serve's controller at a 0.5 s loop,
    Ray's metrics not collected; drop_log_monitor)."""

    CODE = ("import signal, sys, ray\n"
            "from omnicore.apps.server import ray_serve\n"
            "local, _ = ray_serve.local_ray()\n"
            "ray.init(**{**local, 'num_cpus': 2}, logging_level='ERROR', log_to_driver=False)\n"
            "ray_serve.drop_log_monitor(ray)\n"
            "print('gcs', ray.get_runtime_context().gcs_address, flush=True)\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # atexit: ray.shutdown()\n"
            "signal.pause()\n")

    def __init__(self, log: Path):
        self.port = free_port()  # the first server on it starts Serve's proxy here; all use it
        self.log = log
        _, env = ray_serve.local_ray()  # as `omnicore serve --ray` starts its local Ray
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", self.CODE],
                stdout=out, stderr=subprocess.STDOUT, env={**env, **os.environ})
        self._address = None

    def address(self) -> str:
        deadline = time.monotonic() + 180  # Ray's start: half a minute on 2 busy cores
        while self._address is None:
            found = [line.split()[1] for line in self.log.read_text().splitlines()
                     if line.startswith("gcs ")]
            if found:
                self._address = found[0]
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"a local Ray did not start:\n{self.log.read_text()[-4000:]}")
            else:
                time.sleep(0.3)
        return self._address


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """One local Ray for the module; the tests that want it pass it before any slow fixture
    they use, so that it starts meanwhile."""
    require_serve()
    head = RayHead(tmp_path_factory.mktemp("ray_head") / "ray.log")
    yield head
    stop_process(head.proc, 60)


def serve_on(head: RayHead, *flags, log: Path) -> subprocess.Popen:
    """`omnicore serve --ray ADDRESS` on `head`. A Ray that ray.init started takes token
    authentication (~/.ray/auth_token); a process joining it by address says so (Ray's
    `auto` would, but could find another user's Ray on this machine)."""
    return spawn_omnicore("serve", "--port", head.port, "--ray", head.address(), *flags,
                          log_path=log, env={"RAY_AUTH_MODE": "token"})


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_model_that_does_not_load_is_reported_at_start_up(ray_head, house_voices, tmp_path):
    """First of the tests on Ray: its deployment fails and is deleted before the shared one."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    log = tmp_path / "serve.log"
    proc = serve_on(ray_head, "--model", broken, "--voices-dir", house_voices, log=log)
    try:
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert proc.returncode == 2, out[-4000:]
    assert "the Speaker replicas did not start" in out, out[-4000:]


@pytest.fixture(scope="module")
def ray_server(ray_head, tmp_path_factory, house_voices):
    """`omnicore serve --ray` (2 replicas of 1 CPU, exact) on the house voices, `cedar` an
    alias of HOUSE (for Pipecat's stock class, which allows OpenAI's names only); every replica
    it started is gone after it stops."""
    require_server_extra()
    require_module("openai")
    log = tmp_path_factory.mktemp("ray_serve") / "serve.log"
    proc = serve_on(ray_head, "--model", TINY, "--profile", "exact", "--voices-dir",
                    house_voices, "--voice-alias", f"cedar={HOUSE}", "--replicas", "2",
                    "--cpus-per-replica", "1", log=log)
    url = f"http://127.0.0.1:{ray_head.port}"
    seen: set[int] = set()
    try:
        wait_until_serving(proc, url + "/health", 300, "omnicore serve --ray", log.read_text)
        yield url, seen
        with contextlib.suppress(Exception):  # a server already gone lists none
            seen.update(_replica_pids(url).values())
    finally:
        stop_process(proc, 60)
    assert proc.returncode == 0, log.read_text()[-4000:]
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in seen if _alive(p)], "replica processes outlived the server"


@pytest.mark.slow
@pytest.mark.subprocess
def test_openai_sdk_through_the_proxy_same_bytes_as_the_single_server(ray_server, house_voices):
    import httpx
    import openai
    import soundfile as sf

    url, _ = ray_server
    proc, single = start_server(house_voices)
    try:
        got = {}
        for where in (url, single):
            client = openai.OpenAI(base_url=where + "/v1", api_key="none", max_retries=0,
                                   timeout=120)
            for fmt in ("wav", "flac"):
                got[where, fmt] = client.audio.speech.create(
                    model="tts-1", voice=HOUSE, input="Hello from the cluster.",
                    response_format=fmt, extra_body=FAST).content
            with client.audio.speech.with_streaming_response.create(
                    model="tts-1", voice=HOUSE, input="Hello from the cluster.",
                    response_format="pcm", extra_body=FAST) as r:
                got[where, "stream"] = b"".join(r.iter_bytes())
            events = []
            with httpx.stream("POST", where + "/v1/audio/speech", timeout=120, json={
                    "model": "tts-1", "voice": HOUSE, "input": "Hello from the cluster.",
                    "response_format": "pcm", "stream_format": "sse", **FAST}) as r:
                assert r.status_code == 200
                events = [json.loads(line[5:]) for line in r.iter_lines()
                          if line.startswith("data:")]
            assert events[-1]["type"] == "speech.audio.done"
            got[where, "sse"] = [e["audio"] for e in events[:-1]]
    finally:
        stop_process(proc)
    for key in ("wav", "flac", "stream", "sse"):
        assert got[url, key] == got[single, key], key
    wav, sr = sf.read(__import__("io").BytesIO(got[url, "wav"]), dtype="float32")
    assert sr == 24000 and wav.size > 0 and np.isfinite(wav).all()
    pcm = np.frombuffer(got[url, "stream"], np.int16)
    assert pcm.size == wav.size  # the stream is the whole utterance


def _clone(url: str, name: str, pitch: float) -> None:
    import io

    import httpx
    import soundfile as sf

    t = np.arange(24000 * 2) / 24000
    rng = np.random.default_rng(int(pitch))
    wav = 0.2 * np.sin(2 * np.pi * pitch * t) * (1 + 0.5 * rng.standard_normal(t.size))
    buf = io.BytesIO()
    sf.write(buf, wav.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    r = httpx.post(url + "/v1/voices", data={"name": name, "ref_text": "A short test clip."},
                   files={"audio": ("clip.wav", buf.getvalue(), "audio/wav")}, timeout=120)
    assert r.status_code in (200, 201), r.text


@pytest.mark.slow
@pytest.mark.subprocess
def test_voice_affinity_loads_each_prompt_at_most_once_per_replica(ray_server):
    import httpx

    url, _ = ray_server
    voices = ("ann", "bob")
    for name, pitch in zip(voices, (150.0, 220.0)):
        _clone(url, name, pitch)
    listed = {v["id"] for v in httpx.get(url + "/v1/voices", timeout=30).json()["data"]}
    assert set(voices) <= listed  # the one library, through the proxy
    served = []
    for i in range(20):
        voice = voices[i % 2]
        r = httpx.post(url + "/v1/audio/speech", timeout=120, json={
            "model": "tts-1", "voice": voice, "input": f"Number {i}.", "response_format": "pcm",
            "num_step": 2, "seed": i})
        assert r.status_code == 200, r.text
        served.append((voice, r.headers["x-omnicore-replica"]))
    text = httpx.get(url + "/metrics", timeout=30).text
    requests = _metric(text, "omnicore_cluster_voice_requests")
    loads = _metric(text, "omnicore_cluster_voice_prompt_loads")
    for voice in voices:
        mine = {k: v for k, v in loads.items() if f'voice="{voice}"' in k}
        assert mine and all(n <= 1 for n in mine.values()), loads
        assert sum(v for k, v in requests.items() if f'voice="{voice}"' in k) == 10, requests
    # A voice's requests go to its home replica from the first one on, with no wait for
    # Serve's controller to learn where it is (ray_router.py): with Serve's own routing and
    # the controller at 0.5 s, a voice's second request, 2 requests later, could land on
    # the other replica and load it there too.
    where = {}
    for voice, replica in served:
        assert where.setdefault(voice, replica) == replica, served
    assert _metric(text, "omnicore_cluster_voice_hit_rate")[""] >= 0.8


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_voices_next_request_goes_home_before_serves_controller_knows(ray_server):
    """A voice's second request, sent the moment its first one's response starts, long before
    Serve's controller (at 0.5 s) has told the router where the voice is: it goes to the
    same replica (ray_router.VoiceRouter). Serve's own routing sent it to either replica."""
    import httpx

    url, _ = ray_server
    voices = ("cyd", "dee", "eve", "fay")
    for name, pitch in zip(voices, (130.0, 170.0, 240.0, 300.0)):
        _clone(url, name, pitch)
    for i, voice in enumerate(voices):
        body = {"model": "tts-1", "voice": voice, "response_format": "pcm", "num_step": 2}
        with httpx.stream("POST", url + "/v1/audio/speech", timeout=120,
                          json={**body, "input": "A first request.", "seed": i}) as first:
            assert first.status_code == 200
            second = httpx.post(url + "/v1/audio/speech", timeout=120,
                                json={**body, "input": "A second one.", "seed": i})
            assert second.status_code == 200, second.text
            assert (second.headers["x-omnicore-replica"]
                    == first.headers["x-omnicore-replica"]), voice
            first.read()


def _thread_nices(pid: int) -> set[int]:
    """The niceness of each thread of process `pid` (/proc: a thread's priority is its own)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            out.add(int((task / "stat").read_text().rpartition(")")[2].split()[16]))
    return out


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads threads from /proc")
def test_a_replica_runs_at_the_single_servers_priority_and_threads(ray_server):
    """Ray starts its workers at nice 15: a replica's engine there gave its cores to any other
    work, and its BLAS threads, which meet at every GEMM, stalled whenever one was put aside.
    Every thread of each replica runs at the priority of a process started from here (as
    `omnicore serve` would), with its pools sized as --cpus-per-replica says (1 here)."""
    from omnicore.apps.cluster import actor_env

    url, seen = ray_server
    deadline = time.monotonic() + 60  # a replica says hello to the tally once it is up
    while len(pids := _replica_pids(url)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    seen.update(pids.values())
    assert len(pids) == 2, pids
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    pools = {k: v for k, v in actor_env(1).items() if k.endswith("_THREADS")}
    for replica, pid in pids.items():
        assert _thread_nices(pid) == {mine}, (replica, _thread_nices(pid))
        env = dict(kv.split("=", 1) for kv in
                   Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        assert {k: env.get(k) for k in pools} == pools, replica


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, todo = [], [pid]
    while todo:
        kids = [p for p, parent in parents.items() if parent == todo[0]]
        found += kids
        todo = todo[1:] + kids
    return found


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_local_ray_is_quiet_on_the_engines_cores(ray_head, ray_server):
    """A local Ray shares its cores with the replicas, so `omnicore serve --ray` starts it with
    Serve's controller checking its state less often (its default: 0.1 s) and Ray's metrics
    not collected (ray_serve.QUIET): the controller, a process the local Ray started, carries
    both. Its log monitor, which nothing here reads, is gone."""
    assert float(ray_serve.QUIET["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"]) > 0.1
    assert ray_serve.QUIET["RAY_enable_metrics_collection"] == "false"
    cmdlines = {}
    for pid in _descendants(ray_head.proc.pid):
        with contextlib.suppress(OSError):  # a worker may end meanwhile
            cmdlines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
    controllers = [pid for pid, cmd in cmdlines.items() if b"ServeController" in cmd]
    assert controllers, "no Serve controller under the local Ray"
    for pid in controllers:
        env = dict(kv.split("=", 1) for kv in
                   Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        assert {k: env.get(k) for k in ray_serve.QUIET} == ray_serve.QUIET
    assert any(b"raylet" in cmd for cmd in cmdlines.values())  # the head's own processes seen
    assert not [cmd for cmd in cmdlines.values() if b"log_monitor" in cmd]


# Serve's proxy's own request id (a client's X-Request-Id aside): a UUID
SERVE_REQUEST_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("check", ["livekit_openai_plugin", "livekit_cancel",
                                   "pipecat_openai_service"])
def test_the_stock_livekit_and_pipecat_classes_through_the_proxy(check, ray_server):
    """LiveKit's and Pipecat's stock OpenAI TTS classes, unchanged, through Serve's proxy: the
    checks test_voice_agents.py runs against `omnicore serve`, with the request id Serve's and
    "the server is idle" holding on both replicas."""
    import test_voice_agents as agents  # skips this test without the voice-agents extra

    url, _ = ray_server
    if check == "livekit_openai_plugin":
        agents.check_livekit_openai_plugin(url, request_id=SERVE_REQUEST_ID)
    else:
        getattr(agents, f"check_{check}")(url, replicas=2)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_websocket_through_the_proxy_speaks_and_barges_in(ray_server):
    """The voice agents' socket, run by a replica: an utterance's frames are the bytes of a
    streamed POST of its text (through the proxy too), and a cancel cuts the next one short."""
    import asyncio

    import httpx
    import websockets

    url, _ = ray_server
    text = "Hello from the socket."
    long = " ".join(["This sentence is here to make the stream long."] * 8)

    async def until_event(ws):
        audio = b""
        while True:
            m = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(m, bytes):
                audio += m
            else:
                return audio, json.loads(m)

    async def talk():
        async with websockets.connect(url.replace("http", "ws", 1)
                                      + "/v1/audio/speech/stream-input") as ws:
            assert ws.response.headers["x-omnicore-replica"]
            await ws.send(json.dumps({"voice": HOUSE, "response_format": "pcm", **FAST}))
            for i in range(0, len(text), 5):  # as an LLM writes it
                await ws.send(json.dumps({"text": text[i:i + 5]}))
            await ws.send(json.dumps({"flush": True}))
            first = await until_event(ws)
            await ws.send(json.dumps({"text": long, "flush": True}))
            m = await asyncio.wait_for(ws.recv(), 120)  # its first audio: now barge in
            await ws.send(json.dumps({"cancel": True}))
            _, cut = await until_event(ws)
            await ws.send(json.dumps({"close": True}))
            return first, m, cut

    (audio, done), m, cut = asyncio.run(talk())
    assert done["type"] == "audio.done" and not done["cancelled"], done
    r = httpx.post(url + "/v1/audio/speech", timeout=120, json={
        "model": "tts-1", "voice": HOUSE, "input": text, "response_format": "pcm", **FAST})
    assert r.status_code == 200 and audio == r.content
    assert isinstance(m, bytes), m  # audio came before the cancel
    assert cut["type"] == "audio.done" and cut["utterance"] == 1 and cut["cancelled"], cut


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_replica_killed_mid_stream_is_an_error_the_client_sees(ray_server):
    """Last in the module: one replica is SIGKILLed while it streams; the client's read fails
    (never a clean end), and the next requests are answered by a live replica."""
    import httpx

    url, seen = ray_server
    pids = _replica_pids(url)
    seen.update(pids.values())
    text = " ".join(["This sentence is here to make the stream long."] * 8)
    got = b""
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        with httpx.stream("POST", url + "/v1/audio/speech", timeout=120, json={
                "model": "tts-1", "voice": HOUSE, "input": text, "response_format": "pcm",
                "num_step": 8, "seed": 1}) as r:
            assert r.status_code == 200
            for piece in r.iter_bytes():
                if not got:
                    os.kill(pids[r.headers["x-omnicore-replica"]], signal.SIGKILL)
                got += piece
    assert got  # the kill came mid-stream
    deadline = time.monotonic() + 45
    while True:  # the dead replica leaves Serve's routing within its health-check period
        r = httpx.post(url + "/v1/audio/speech", timeout=120, json={
            "model": "tts-1", "voice": HOUSE, "input": "Still here.", "response_format": "pcm",
            **FAST})
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        assert r.status_code == 503 and r.json()["error"]["code"] == "replica_lost", r.text
        time.sleep(1)
    assert r.status_code == 200, r.text
    seen.update(_replica_pids(url).values())  # the replacement too
