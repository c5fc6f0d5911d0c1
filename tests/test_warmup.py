"""Compiling the kernels ahead of the first request: `omnicore.machinery.warmup`, `omnicore warmup`, and a
server that is not ready (/health: "warming up") until it is done."""

import threading
from pathlib import Path

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
    assert main(["warmup", "--model", str(TINY), "--paths", "decode", "generate"]) == 0
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
