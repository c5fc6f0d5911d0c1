"""Fixtures shared by several test modules: the tiny checkpoint's backbone config and params;
the rule for test inputs that may be missing (`missing`, `require_file`, `require_module`);
servers started as child processes (`free_port`, `start_server`, `start_wyoming`,
`spawn_omnicore`, `wait_until_serving`, `stop_process`, and the demo for the session:
`demo_server`), a private user data folder for the
session (`private_data_home`); the Python examples of a page of
docs/ (`doc_examples`); and a virtual environment that sees the running interpreter's
packages (`make_venv`). It also chooses hypothesis's profile (below)."""

import importlib
import os
import site
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from omnicore.model import backbone as bb
from omnicore.machinery import checkpoint
from omnicore.machinery.checkpoint import SafetensorsFile

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"
# The quick inner loop, `python3 -m pytest -q --quick`, leaves out the tests marked with
# these (pyproject.toml says what each means); the README's command runs everything.
QUICK_LEAVES_OUT = ("slow", "browser", "subprocess")
# CI installs every test dependency and ships every fixture, so there a missing one is a failure
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# A fixed machine rate for every test and child process: a live stream's chunk 0 budget would
# otherwise follow how fast this machine (busy or not) ran the tiny model. At this rate the
# budget never binds on it; the budget's own tests give theirs.
os.environ["OMNICORE_RATE"] = "1e13"


# Hypothesis: every run draws the same examples. The default profile, "fixed", derives them
# from each test's source (derandomize) and keeps no database, so a run neither depends on luck
# nor replays what another run happened to find. To explore with fresh random draws (and keep
# what fails in .hypothesis/), name the other profile:
#     python3 -m pytest --hypothesis-profile=explore tests/test_kernels.py
# (or HYPOTHESIS_PROFILE=explore), then pin each failure found with an @example.
settings.register_profile("fixed", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="the fast core only: leave out the tests marked "
                          + ", ".join(QUICK_LEAVES_OUT))


def _module_left_out(path: Path) -> bool:
    """Whether the test module's own `pytestmark` (a top-level assignment) names a marker the
    quick loop leaves out: then every test in it carries that marker."""
    import ast

    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):  # collected as usual: pytest reports the error
        return False
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            marks = [n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)]
            return any(m in QUICK_LEAVES_OUT for m in marks)
    return False


def pytest_ignore_collect(collection_path, config):
    # With --quick a module whose every test is left out is not even imported: importing some
    # (gradio, LiveKit, Ray) takes seconds, and the quick loop would pay them for nothing.
    if (config.getoption("--quick") and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and _module_left_out(collection_path)):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--quick"):
        return
    left_out = [item for item in items
                if any(item.get_closest_marker(m) for m in QUICK_LEAVES_OUT)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        gone = set(left_out)
        items[:] = [item for item in items if item not in gone]


def read_safetensors(path) -> dict:
    """Every tensor of a safetensors file, read into memory (float tensors as float32): what
    the loader's SafetensorsFile gives, key by key (WeightsError for anything malformed)."""
    with SafetensorsFile(path) as f:
        return {key: f.read(key) for key in f}


@pytest.fixture
def good(tmp_path):
    """A small well-formed safetensors file (float, int64 and a one-element tensor) and its
    tensors."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "ids": np.arange(8, dtype=np.int64),
        "scalarish": np.ones((1,), np.float32),
    }
    p = tmp_path / "good.safetensors"
    save_file(tensors, str(p), metadata={"format": "pt"})
    return p, tensors


def missing(what: str, how: str):
    """Fail under CI, skip elsewhere; either way say what is missing and how to get it."""
    message = f"{what} is not available ({how})"
    if IN_CI:
        pytest.fail(message + "; CI must have it (see .ci/run)")
    pytest.skip(message, allow_module_level=True)  # also when a test module needs it at import


@pytest.fixture(scope="session", autouse=True)
def private_data_home(tmp_path_factory):
    """The user's data folder, where a server without --voices-dir keeps its voices, is a
    temporary one for the whole session (inherited by every child process): no test writes
    into the real home, or reads a developer's voices."""
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("xdg_data_home")
        mp.setenv("XDG_DATA_HOME", str(folder))
        mp.delenv("OMNICORE_VOICES_DIR", raising=False)
        yield folder


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


def make_venv(path: Path) -> Path:
    """A new virtual environment at `path` (without pip of its own) that sees the packages of
    the interpreter running the tests; returns its python.

    `--system-site-packages` is not that: it exposes the *base* Python's site-packages, so
    when the tests run inside a virtualenv (as newcomers run them) the new environment would
    miss that virtualenv's packages. Instead a .pth file in the new environment adds the
    running interpreter's site folders with `site.addsitedir` (which also runs their .pth
    files, e.g. editable installs). They come after the environment's own folder, so what is
    installed into it wins, as with `--system-site-packages`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=60)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    folders = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    lines = [f"import site; site.addsitedir({d!r})" for d in folders if os.path.isdir(d)]
    Path(purelib, "_tests_outer_site.pth").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return python


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


def spawn_omnicore(*args, log_path=None, env=None) -> subprocess.Popen:
    """`omnicore ARGS` as a child process, this checkout's package first on its path, `env`
    added to its environment. Its output goes to `log_path` (a file never fills up and blocks
    the server the way an unread pipe does), else nowhere."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OMNICORE_API_KEY", None)
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen([sys.executable, "-m", "omnicore", *map(str, args)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log_path:
            out.close()


def start_server(voices_dir, *flags, log_path=None, seconds: float = 90):
    """`omnicore serve` on the tiny checkpoint as a child process on a free loopback port:
    (process, url). At the exact profile unless `flags` name one: the tests compare its audio
    with the model's exact generate and stream (the door's own default, live, is tested in
    test_wyoming_server.py and test_cli.py)."""
    port = free_port()
    if "--profile" not in flags:
        flags = ("--profile", "exact", *flags)
    proc = spawn_omnicore("serve", "--model", TINY, "--port", port, "--voices-dir", voices_dir,
                          *flags, log_path=log_path)
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(proc, url + "/health", seconds, "the server",
                       lambda: Path(log_path).read_text() if log_path else "")
    return proc, url


def start_wyoming(voices_dir, *flags, log_path=None, seconds: float = 90):
    """`omnicore wyoming` on the tiny checkpoint as a child process on a free loopback port:
    (process, port), once it answers `describe`."""
    import asyncio

    port = free_port()
    proc = spawn_omnicore("wyoming", "--model", TINY, "--uri", f"tcp://127.0.0.1:{port}",
                          "--voices-dir", voices_dir, *flags, log_path=log_path)

    async def describe():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b'{"type": "describe"}\n')
        line = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
        return line
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the Wyoming server exited with {proc.returncode}:\n"
                        f"{Path(log_path).read_text()[-4000:] if log_path else ''}")
        try:
            if b'"info"' in asyncio.run(describe()):
                return proc, port
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the Wyoming server is not up after {seconds} s")
        time.sleep(0.3)


def doc_examples(page: str) -> list[tuple[str, str]]:
    """(where, code) of every ```python block of a page ("README.md", "docs/server.md"),
    dedented (the README indents the one in its list)."""
    import re
    import textwrap

    text = (Path(__file__).resolve().parents[1] / page).read_text(encoding="utf-8")
    return [(f"{page}:{text.count(chr(10), 0, m.start()) + 1}", textwrap.dedent(m.group(2)))
            for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.S | re.M)]


def stop_process(proc, seconds: float = 20) -> None:
    """Terminate a child server, killing it if it does not exit within `seconds`."""
    proc.terminate()
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def examples_made(cache: Path) -> int:
    """Examples in gradio's cache folder: a line per example made, in each Examples' indices."""
    return sum(len(p.read_text().split()) for p in cache.glob("*/indices.csv"))


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory):
    """The Gradio demo (demo/app.py) on the tiny checkpoint, started as a user starts it, with
    two synthesis slots: one for the session (test_demo.py drives it; test_api_validation.py
    asks it to refuse what the API refuses). (url, examples made when it first answered,
    gradio's examples cache folder, its log); the log is shown if it ends badly."""
    from types import SimpleNamespace

    root = TINY.parents[1]
    assert (TINY / "config.json").is_file(), f"tiny checkpoint missing at {TINY}"
    port = free_port()
    folder = tmp_path_factory.mktemp("demo-server")
    log_path = folder / "server.log"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", OMNICORE_MODEL="k2-fsa/OmniVoice",  # --model must win
               GRADIO_EXAMPLES_CACHE=str(folder / "examples"),
               # its own upload folder: another gradio process on the machine that copied the
               # same example file (same content, same folder) deletes it when it exits
               GRADIO_TEMP_DIR=str(folder / "uploads"))
    env.pop("GRADIO_SERVER_NAME", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(root / "demo" / "app.py"), "--model", str(TINY), "--host",
             "127.0.0.1", "--port", str(port), "--concurrency", "2", "--max-queue", "8"],
            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        # model load + the start-up synthesis that compiles the kernels
        wait_until_serving(proc, url + "/gradio_api/info", 300, "the demo", log_path.read_text)
        yield SimpleNamespace(url=url, examples=examples_made(folder / "examples"),
                              cache=folder / "examples", log=log_path)
    finally:
        stop_process(proc)
    if proc.returncode not in (0, -15, 143):
        print(log_path.read_text()[-4000:])


HOUSE = "house"  # the library voice of `house_voices`


@pytest.fixture(scope="module")
def tiny_model():
    """The tiny checkpoint, loaded once per test module."""
    from omnicore import OmniVoice

    return OmniVoice.from_pretrained(TINY)


@pytest.fixture(scope="module")
def house_voices(tmp_path_factory, tiny_model):
    """A voices folder holding one library voice, HOUSE (designed, seeded): what the servers
    under test speak with."""
    folder = tmp_path_factory.mktemp("voices")
    tiny_model.synthesize("This is how the house sounds.", instruct="female, low pitch", seed=3,
                          num_step=4)[0].as_voice().save(folder / f"{HOUSE}.npz")
    return folder


@pytest.fixture(scope="module")
def cfg():
    return checkpoint.read_config(TINY / "config.json")


@pytest.fixture(scope="module")
def params(cfg):
    reader = checkpoint.open_params(TINY / "model.safetensors")
    p = bb.load_params(reader, cfg)
    reader.finish()  # every tensor of the checkpoint is used
    return p


def codebook_gaps(model, wav):
    """omnicore's encoder codes [Q, T] of `wav`, and for each pick the gap between the nearest
    and second-nearest codeword's distance, relative to the largest nearest distance of that
    codebook [Q, T]: how close each code is to a tie."""
    from omnicore.model import higgs_codec

    params, cfg = model.codec.params, model.codec.cfg
    fused = higgs_codec.encode_features(params, wav, cfg)["fused"]
    codes, residuals = higgs_codec.quantize(params, fused, cfg, return_residuals=True)
    enc, gaps = params.encoder, []
    for q, r in enumerate(residuals):
        z = r @ enc.in_w[q] + enc.in_b[q]  # [T, D] -> [T, d]
        dist = np.sort((z * z).sum(1, keepdims=True) - 2 * (z @ enc.embed_t[q]) + enc.embed_sq[q],
                       axis=1)  # [T, K] squared distances, nearest first
        gaps.append((dist[:, 1] - dist[:, 0]) / np.abs(dist[:, 0]).max())
    return codes, np.array(gaps)
