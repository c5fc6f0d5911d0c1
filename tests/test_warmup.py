"""Compiling the kernels ahead of the first request: `omnicore.machinery.warmup`, `omnicore warmup`, and a
server that is not ready (/health: "warming up") until it is done."""

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import require_module
from omnicore import OmniVoice
from omnicore.apps.cli import main
from omnicore.machinery.warmup import NOTICE, PATHS, warm_up

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


def test_warm_up_runs_each_path_it_is_asked_for(model):
    seen = []
    done = warm_up(model, on_path=lambda path, s: seen.append(path), force=True)
    assert seen == list(done.seconds) == list(PATHS)
    assert warm_up(model, ["decode"], force=True).seconds.keys() == {"decode"}
    assert warm_up(model).seconds == {}  # every kernel is there now: nothing to run
    int8 = OmniVoice.from_pretrained(TINY, precision="int8")
    warm_up(int8, force=True)  # the int8 backbone runs its pooled twins: those are what it waits for
    assert warm_up(int8).seconds == {}
    with pytest.raises(ValueError, match="unknown warm-up path"):
        warm_up(model, ["decode", "train"])


WATCHED = """
import json, sys
import numpy as np
from omnicore.model import jit, kernels
from omnicore.machinery.warmup import CompileWatch

said = []
x, w = np.ones((4, 8), np.float32), np.ones(8, np.float32)
jit.start()
before = jit.uncached()
with CompileWatch(said.append) as watch:
    kernels.rms_norm(x, w, 1e-6)
    kernels.rms_norm(x, w, 1e-6)
after = jit.uncached()
print(json.dumps({"said": said, "kernels": watch.kernels, "seconds": watch.seconds(),
                  "before": before, "after": after, "folder": jit.cache_folder()}))
"""


@pytest.mark.subprocess
def test_a_compile_is_noticed_once_and_the_cache_knows_it(tmp_path):
    """With an empty kernel cache the first call of a kernel compiles it: the watch says the
    notice once and counts it, `uncached` no longer lists it, and a new process finds it in
    the cache (nothing to compile, nothing said)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))

    def run():
        done = subprocess.run([sys.executable, "-c", WATCHED], env=env, capture_output=True,
                              text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold = run()
    assert len(cold["said"]) == 1 and cold["said"][0].startswith(NOTICE.split("{")[0])
    assert cold["kernels"] == 1 and cold["seconds"] > 0
    assert "_rms_norm_impl" in cold["before"] and "_rms_norm_impl" not in cold["after"]
    assert cold["folder"].startswith(str(tmp_path / "cache"))
    warm = run()
    assert warm["said"] == [] and warm["kernels"] == 0 and warm["seconds"] == 0
    assert "_rms_norm_impl" not in warm["before"]


def test_the_warmup_command(model, capsys):
    warm_up(model)
    assert main(["warmup", "--model", str(TINY), "--paths", "decode", "generate", "--voices"]) == 0
    err = capsys.readouterr().err
    assert "warm already: every kernel is in the kernel cache in " in err  # the fixture warmed up
    with pytest.raises(SystemExit) as usage:
        main(["warmup", "--model", str(TINY), "--paths", "train"])
    assert usage.value.code == 2 and "invalid choice: 'train'" in capsys.readouterr().err


def test_a_server_says_warming_up_until_its_kernels_are_compiled(model, monkeypatch):
    """/health and speech requests answer 503 "warming up" while the warm-up runs, and the
    server is ready once it is over (the warm-up is held open here to look at it)."""
    require_module("httpx")
    from starlette.testclient import TestClient

    import omnicore.machinery.warmup
    from omnicore.apps.server.app import create_app
    from omnicore.apps.server.state import ServerState

    release, entered = threading.Event(), threading.Event()
    real = omnicore.machinery.warmup.warm_up

    def held(m, *args, **kw):
        entered.set()
        release.wait(60)
        return real(m, ["decode"])
    monkeypatch.setattr(omnicore.machinery.warmup, "warm_up", held)
    state = ServerState(model, max_queue=2)
    client = TestClient(create_app(state))
    thread = state.warm_up_in_background()
    assert entered.wait(60)
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "warming up"
    assert health.headers["retry-after"] == "5"
    speech = client.post("/v1/audio/speech", json={"input": "Hello.", "voice": "alloy"})
    assert speech.status_code == 503 and speech.json()["error"]["code"] == "server_warming_up"
    release.set()
    thread.join(60)
    assert client.get("/health").json()["status"] == "ok"
    state.pool.shutdown()


# -- the machine's rate ---------------------------------------------------------------------------


def test_unmask_flops_counts_the_passes_a_call_runs(model):
    """FLOPs of a call: linear in its steps (exact), the sum of its texts, more with a voice."""
    from omnicore.model import cost

    one = model.unmask_flops("Hello there.", num_step=2)
    assert model.unmask_flops("Hello there.", num_step=4) == 2 * one
    assert model.unmask_flops(["Hello there.", "Hello there."], num_step=2) == 2 * one
    prompt = model.synthesize("A voice to speak with.", num_step=2, seed=1)[0].as_voice()
    assert model.unmask_flops("Hello there.", num_step=2, voice_clone_prompt=prompt) > one
    frames = model.synthesize("Hello there.", num_step=2, seed=1)[0].codes.shape[1]
    assert one >= 2 * cost.forward_flops(model.config, [frames, frames], [frames, frames])


def test_a_measured_rate_is_kept_and_read_back(model, tmp_path):
    """measure_rate keeps its FLOP/s in the folder under the model's key; a fresh folder has
    none (the assumed rate stands in) and an unreadable file is measured again."""
    from omnicore.machinery import settings, warmup

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert warmup.measured_rate(model, fresh) is None
    from omnicore.audio.writers import write_bytes_atomic

    got = warmup.measure_rate(model, tmp_path, keep=write_bytes_atomic)
    kept = json.loads((tmp_path / warmup.RATES_FILE).read_text())
    assert kept == {warmup.rate_key(model): got} and got > 0
    assert warmup.measured_rate(model, tmp_path) == got
    chosen = settings.current().rate  # OMNICORE_RATE (conftest) wins over a measured rate
    assert warmup.rate(model, tmp_path) == warmup.rate(model, fresh) == chosen
    assert warmup.estimate_seconds(model, "Hello there.", tmp_path, num_step=2) == (
        model.unmask_flops("Hello there.", num_step=2) / chosen)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / warmup.RATES_FILE).write_text("{not json")
    assert warmup.measured_rate(model, broken) is None


def test_the_kept_rate_is_the_best_measured():
    """A measurement replaces the kept rate only when it is higher: one taken while other work
    held the cores (lower) leaves the quieter one kept; anything kept that is not a positive
    number counts as none."""
    from omnicore.machinery.warmup import best_rate

    assert best_rate(None, 80e9) == 80e9
    assert best_rate(150e9, 40e9) == 150e9  # measured on a busy machine: the kept one stays
    assert best_rate(40e9, 150e9) == 150e9  # a quieter measurement replaces a busy one
    for junk in (0, -5.0, "fast", True, [1e12]):
        assert best_rate(junk, 80e9) == 80e9


def test_measure_rate_keeps_the_best_of_the_measurements_in_its_file(model, tmp_path):
    """measure_rate writes best_rate of the file's rate and its own: a kept rate no machine
    reaches (1e30) survives a measurement, one every machine beats (1 FLOP/s) is replaced, and
    other keys in the file are left as they were."""
    from omnicore.audio.writers import write_bytes_atomic
    from omnicore.machinery import warmup

    path, key = tmp_path / warmup.RATES_FILE, warmup.rate_key(model)
    path.write_text(json.dumps({key: 1e30, "other": 5.0}))
    assert warmup.measure_rate(model, tmp_path, keep=write_bytes_atomic) == 1e30
    assert json.loads(path.read_text()) == {key: 1e30, "other": 5.0}
    assert warmup.measured_rate(model, tmp_path) == 1e30
    low = tmp_path / "low"
    low.mkdir()
    (low / warmup.RATES_FILE).write_text(json.dumps({key: 1.0}))
    got = warmup.measure_rate(model, low, keep=write_bytes_atomic)
    assert got > 1.0 and json.loads((low / warmup.RATES_FILE).read_text()) == {key: got}


# -- a door's default voice, made before it is ready ----------------------------------------------


class Lines:
    """A logger's `info` as a list of lines (format-string arguments applied)."""

    def __init__(self):
        self.lines = []

    def info(self, msg, *args):
        self.lines.append(msg % args if args else msg)

    exception = info


@pytest.mark.slow
def test_a_door_makes_its_voice_before_it_says_ready_and_once_per_folder(model, tmp_path):
    """warm_up says "making voice alloy: about N s, once" before its "Ready" line, and the
    voice is in the folder by then; a second start on the folder makes nothing (the stored
    voice is kept as it is)."""
    from omnicore.apps.server.state import ServerState
    from omnicore.apps.server.voices import MAKING

    first = ServerState(model, tmp_path, max_queue=2, default_voice="alloy")
    log = Lines()
    first.warm_up(log)
    making = [i for i, line in enumerate(log.lines) if line.startswith("making voice alloy: about ")]
    ready = [i for i, line in enumerate(log.lines) if line.startswith("Ready in ")]
    assert len(making) == 1 and len(ready) == 1 and making[0] < ready[0], log.lines
    assert log.lines[making[0]].endswith(" s, once") and "(made alloy)" in log.lines[ready[0]]
    stored = (tmp_path / "alloy.npz").stat()
    first.pool.shutdown()

    again = ServerState(model, tmp_path, max_queue=2, default_voice="alloy")
    log = Lines()
    again.warm_up(log)
    assert not [line for line in log.lines if line.startswith(MAKING.split("{")[0])], log.lines
    assert "(alloy made before)" in log.lines[-1]
    assert (tmp_path / "alloy.npz").stat().st_mtime_ns == stored.st_mtime_ns
    again.pool.shutdown()


@pytest.mark.slow
def test_startup_voices_are_the_default_and_the_aliases_presets(model, tmp_path):
    """What a door makes: its default voice and its aliases' targets, the presets among them;
    an alias of a preset needs no library voice at start and speaks as the preset."""
    from omnicore.apps.server.voices import check_aliases, resolve_voice, startup_voices

    assert startup_voices("alloy", {"tts-a": "ash", "me": "house", "b": "alloy"}) == ["alloy", "ash"]
    assert startup_voices(None) == [] and startup_voices("house") == []
    check_aliases(None, {"tts-a": "ash"})  # a preset target: no --voices-dir needed
    from omnicore.apps.server.state import ServerState

    state = ServerState(model, tmp_path, max_queue=2, voice_aliases={"tts-a": "ash"})
    state.warm_up(Lines())
    assert (tmp_path / "ash.npz").exists() and not (tmp_path / "alloy.npz").exists()
    state.check_voice("tts-a")
    got = resolve_voice(model, state.voices, "tts-a", aliases=state.voice_aliases)
    np.testing.assert_array_equal(got.ref_audio_tokens, state.voices.get("ash").ref_audio_tokens)
    state.pool.shutdown()


@pytest.mark.slow
def test_a_server_says_warming_up_until_its_default_voice_is_made(model, tmp_path, monkeypatch):
    """/health and speech answer 503 "warming up" with Retry-After while the default voice is
    being made (held open here to look at it), and the voice is there once it says ok."""
    require_module("httpx")
    from starlette.testclient import TestClient

    from omnicore.apps.server import voices
    from omnicore.apps.server.app import create_app
    from omnicore.apps.server.state import ServerState

    warm_up(model)
    release, entered = threading.Event(), threading.Event()
    real = voices.designed_voice

    def held(*args, **kw):
        entered.set()
        release.wait(60)
        return real(*args, **kw)
    monkeypatch.setattr(voices, "designed_voice", held)
    state = ServerState(model, tmp_path, max_queue=2, default_voice="alloy")
    client = TestClient(create_app(state))
    thread = state.warm_up_in_background()
    assert entered.wait(60)
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "warming up"
    assert health.headers["retry-after"] == "5"
    speech = client.post("/v1/audio/speech", json={"input": "Hello.", "voice": "alloy"})
    assert speech.status_code == 503 and "default voice" in speech.json()["error"]["message"]
    assert not (tmp_path / "alloy.npz").exists()
    release.set()
    thread.join(60)
    assert client.get("/health").json()["status"] == "ok" and (tmp_path / "alloy.npz").exists()
    state.pool.shutdown()


@pytest.mark.slow
def test_the_warmup_command_makes_the_default_voice_once(model, tmp_path, capsys):
    warm_up(model)
    args = ["warmup", "--model", str(TINY), "--paths", "decode", "--voices-dir", str(tmp_path)]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.index("making voice alloy: about ") < err.index("alloy made")
    assert "GFLOP/s" in err and (tmp_path / "alloy.npz").exists()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "making voice" not in err and "alloy there already" in err
    assert main([*args, "--voices"]) == 0 and "voices in" not in capsys.readouterr().err
