"""Compiling the kernels ahead of the first request: `omnicore.warmup`, `omnicore warmup`, and a
server that is not ready (/health: "warming up") until it is done."""

import threading
from pathlib import Path

import pytest

from conftest import require_module
from omnicore import OmniVoice
from omnicore.cli import main
from omnicore.warmup import PATHS, warm_up

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


def test_warm_up_runs_each_path_it_is_asked_for(model):
    seen = []
    done = warm_up(model, on_path=lambda path, s: seen.append(path))
    assert seen == list(done.seconds) == list(PATHS)
    assert warm_up(model, ["decode"]).seconds.keys() == {"decode"}
    with pytest.raises(ValueError, match="unknown warm-up path"):
        warm_up(model, ["decode", "train"])


def test_the_warmup_command(capsys):
    assert main(["warmup", "--model", str(TINY), "--paths", "decode", "generate"]) == 0
    err = capsys.readouterr().err
    assert "  decode: " in err and "  generate: " in err and "warm: decode, generate of " in err
    with pytest.raises(SystemExit) as usage:
        main(["warmup", "--model", str(TINY), "--paths", "train"])
    assert usage.value.code == 2 and "invalid choice: 'train'" in capsys.readouterr().err


def test_a_server_says_warming_up_until_its_kernels_are_compiled(model, monkeypatch):
    """/health and speech requests answer 503 "warming up" while the warm-up runs, and the
    server is ready once it is over (the warm-up is held open here to look at it)."""
    require_module("httpx")
    from starlette.testclient import TestClient

    import omnicore.warmup
    from omnicore.server.app import create_app
    from omnicore.server.state import ServerState

    release, entered = threading.Event(), threading.Event()
    real = omnicore.warmup.warm_up

    def held(m, *args, **kw):
        entered.set()
        release.wait(60)
        return real(m, ["decode"])
    monkeypatch.setattr(omnicore.warmup, "warm_up", held)
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
