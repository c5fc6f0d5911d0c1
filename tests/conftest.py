"""Fixtures shared by several test modules: the tiny checkpoint's backbone config and params;
the rule for test inputs that may be missing (`missing`, `require_file`, `require_module`); and
servers started as child processes (`free_port`, `start_server`, `wait_until_serving`,
`stop_process`)."""

import importlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from omnicore.model import backbone as bb
from omnicore.model.config import OmniVoiceConfig
from omnicore.model.weights import ParamReader, SafetensorsFile

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"
# CI installs every test dependency and ships every fixture, so there a missing one is a failure
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def read_safetensors(path) -> dict:
    """Every tensor of a safetensors file, read into memory (float tensors as float32): what
    the loader's SafetensorsFile gives, key by key (WeightsError for anything malformed)."""
    with SafetensorsFile(path) as f:
        return {key: f.read(key) for key in f}


def missing(what: str, how: str):
    """Fail under CI, skip elsewhere; either way say what is missing and how to get it."""
    message = f"{what} is not available ({how})"
    if IN_CI:
        pytest.fail(message + "; CI must have it (see .ci/run)")
    pytest.skip(message, allow_module_level=True)  # also when a test module needs it at import


def require_file(path: Path, how: str) -> Path:
    """`path` if it is a file; otherwise `missing` (a skip, or a failure under CI)."""
    if not Path(path).is_file():
        missing(str(path), how)
    return path


def require_module(name: str, extra: str = "test"):
    """The imported module; otherwise `missing` (a skip, or a failure under CI). `extra`: the
    package extra that installs it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"the Python module {name!r}", f"{e}; pip install -e '.[{extra}]'")


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(proc, url: str, seconds: float, what: str, log=lambda: "") -> None:
    """Poll `url` until it answers 200; fail the test, with the tail of log(), if `proc` exits
    first or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{log()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{what} is not up after {seconds} s:\n{log()[-4000:]}")
        time.sleep(0.3)


def require_server_extra() -> None:
    """The `server` extra's modules (websockets included), or `missing`."""
    for name in ("starlette", "uvicorn", "prometheus_client", "sse_starlette", "websockets"):
        require_module(name, "server")


def start_server(voices_dir, *flags, log_path=None, seconds: float = 90):
    """`omnicore serve` on the tiny checkpoint as a child process on a free loopback port:
    (process, url). Its output goes to `log_path` (a file never fills up and blocks the
    server the way an unread pipe does), else nowhere."""
    port = free_port()
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OMNICORE_API_KEY", None)
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "omnicore.cli", "serve", "--model", str(TINY), "--port",
             str(port), "--voices-dir", str(voices_dir), *flags],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log_path:
            out.close()
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(proc, url + "/health", seconds, "the server",
                       lambda: Path(log_path).read_text() if log_path else "")
    return proc, url


def stop_process(proc, seconds: float = 20) -> None:
    """Terminate a child server, killing it if it does not exit within `seconds`."""
    proc.terminate()
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def cfg():
    return OmniVoiceConfig.from_file(TINY / "config.json")


@pytest.fixture(scope="module")
def params(cfg):
    reader = ParamReader.open(TINY / "model.safetensors")
    p = bb.load_params(reader, cfg)
    reader.finish()  # every tensor of the checkpoint is used
    return p
