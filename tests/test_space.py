"""The Hugging Face Space build (tools/build_space.py), built into a temporary folder and run.

What is checked: the build writes exactly the Space (card, demo modules and example files, the
package's source, requirements) and nothing else (no tests, fixtures, weights or caches); its
card and requirements agree with pyproject.toml, and a GPU build (--gpu) adds pyproject's CuPy
extra and a GPU as the card's suggested hardware; it refuses a folder holding files it does not own and
updates a clone of the Space in place. Then the folder is installed into a fresh virtual
environment from its own requirements.txt and its app is started on the tiny checkpoint, from
the folder alone: the app must import the package copied beside it (not the repository's), answer
over HTTP and synthesise through gradio_client.

The venv sees the packages of the Python running the tests (conftest.make_venv: also when that
Python is itself a virtualenv) and pip runs with --no-index: the requirements are then resolved
against what this machine already has, so the test needs no network and takes seconds; what it
proves is that the folder's requirements.txt is installable and complete for its app, and that
the app runs from that folder.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, make_venv, missing, stop_process, wait_until_serving

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "build_space.py"
CKPT = ROOT / "weights" / "tiny-random"
START_S = 180  # gradio import, model load, and the warm-up that compiles the kernels afresh

_spec = importlib.util.spec_from_file_location("build_space", TOOL)
build_space = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_space)


def _build(out: Path, *options: str) -> subprocess.CompletedProcess:
    """The documented command, as a user runs it."""
    return subprocess.run([sys.executable, str(TOOL), *options, str(out)], capture_output=True,
                          text=True, timeout=60)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _requirement_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


@pytest.fixture(scope="module")
def space(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("build") / "space"
    done = _build(out)
    assert done.returncode == 0, done.stderr
    return out


def test_the_build_is_exactly_the_space(space):
    tomllib = pytest.importorskip("tomllib")
    tree = _tree(space)
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "omnicore").rglob("*.py")
               if "__pycache__" not in p.parts}
    demo = {p.name for p in (ROOT / "demo").glob("*.py")}
    examples = {f"examples/{p.name}" for p in (ROOT / "demo" / "examples").iterdir()}
    assert "app.py" in demo and "omnicore/__init__.py" in package
    assert "examples/fox.flac" in examples
    assert set(tree) == {"README.md", "requirements.txt"} | demo | examples | package
    for rel in package:
        assert tree[rel] == (ROOT / rel).read_bytes(), rel
    for name in demo | examples:
        assert tree[name] == (ROOT / "demo" / name).read_bytes(), name
    # the card, less the screenshots the repository keeps (they exist there; the Space has none)
    card = (ROOT / "demo" / "README.md").read_text(encoding="utf-8")
    shots = re.findall(r"\]\((screenshots/[^)]+)\)", card)
    assert shots and all((ROOT / "demo" / shot).is_file() for shot in shots)
    assert tree["README.md"].decode("utf-8") == build_space.without_screenshots(card)
    assert "screenshots/" not in tree["README.md"].decode("utf-8")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["demo"]
    assert _requirement_lines(tree["requirements.txt"].decode()) == wanted
    # demo/requirements.txt (for running the demo from a checkout) says the same
    assert sorted(_requirement_lines((ROOT / "demo" / "requirements.txt").read_text())) == sorted(wanted)


def test_the_card_matches_what_the_space_installs(space):
    from packaging.requirements import Requirement

    text = (space / "README.md").read_text(encoding="utf-8")
    meta = build_space.front_matter(text)
    gradio_pin = next(Requirement(r) for r in _requirement_lines((space / "requirements.txt").read_text())
                      if r.startswith("gradio"))
    assert meta["sdk"] == "gradio"
    assert gradio_pin.specifier.contains(str(meta["sdk_version"]))
    assert (space / meta["app_file"]).is_file()
    assert meta["license"] == "apache-2.0"
    assert "CC-BY-NC" in text and "preload_from_hub" in text
    assert "k2-fsa/OmniVoice" in meta["preload_from_hub"]


@pytest.mark.parametrize("cuda", ["cuda12", "cuda13"])
def test_a_gpu_build_adds_cupy_and_suggests_a_gpu(tmp_path, cuda):
    """--gpu: requirements.txt gains pyproject's gpu-cudaNN-pypi extra (CuPy with NVIDIA's CUDA
    libraries, which a Space image lacks); the card suggests GPU hardware; all else is the CPU
    build's."""
    tomllib = pytest.importorskip("tomllib")
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    assert _build(cpu).returncode == 0
    options = ("--gpu",) + (() if cuda == "cuda12" else ("--cuda", cuda))
    done = _build(gpu, *options)
    assert done.returncode == 0, done.stderr
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    cupy = extras[f"gpu-{cuda}-pypi"]
    assert cupy and all(r.startswith(f"cupy-{cuda}x[ctk]") for r in cupy)
    cpu_tree, gpu_tree = _tree(cpu), _tree(gpu)
    assert (_requirement_lines(gpu_tree["requirements.txt"].decode())
            == _requirement_lines(cpu_tree["requirements.txt"].decode()) + cupy)
    card = gpu_tree["README.md"].decode()
    assert build_space.front_matter(card)["suggested_hardware"] == build_space.GPU_HARDWARE
    assert card.split("\n---\n", 1)[1] == cpu_tree["README.md"].decode().split("\n---\n", 1)[1]
    rest = set(cpu_tree) - {"README.md", "requirements.txt"}
    assert rest == set(gpu_tree) - {"README.md", "requirements.txt"}
    assert all(cpu_tree[k] == gpu_tree[k] for k in rest)


@pytest.mark.parametrize("change, match", [
    (("sdk_version: 6.31.0", "sdk_version: 5.49.1"), r"sdk_version '5.49.1' is outside"),
    (("sdk: gradio", "sdk: docker"), r"sdk is 'docker'"),
    (("app_file: app.py", "app_file: main.py"), r"app_file 'main.py' is not a file"),
    (("license: apache-2.0", "license: mit"), r"license must be apache-2.0"),
    (("CC-BY-NC", "some"), r"CC-BY-NC 4.0"),
    (("---\ntitle", "title"), r"must open with the Space's YAML front-matter"),
])
def test_a_card_that_disagrees_is_refused(change, match):
    readme = (ROOT / "demo" / "README.md").read_text(encoding="utf-8")
    assert change[0] in readme, change
    with pytest.raises(build_space.BuildError, match=match):
        build_space.check_card(readme.replace(*change), build_space.requirements(), ROOT / "demo")


def test_foreign_files_are_refused_and_a_space_clone_is_updated(tmp_path):
    out = tmp_path / "clone"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / ".gitattributes").write_text("*.png filter=lfs\n")
    (out / "notes.txt").write_text("mine")
    before = _tree(out)
    done = _build(out)
    assert done.returncode == 2 and "notes.txt" in done.stderr and "does not write" in done.stderr
    assert _tree(out) == before
    (out / "notes.txt").unlink()
    (out / "omnicore").mkdir()
    (out / "omnicore" / "removed_module.py").write_text("stale = True\n")  # from an older build
    (out / "README.md").write_text("old card")
    done = _build(out)
    assert done.returncode == 0, done.stderr
    tree = _tree(out)
    assert "omnicore/removed_module.py" not in tree and tree["README.md"].startswith(b"---\n")
    assert tree[".git/HEAD"] == before[".git/HEAD"] and tree[".gitattributes"] == before[".gitattributes"]
    assert not [p for p in tmp_path.iterdir() if p.name != "clone"]  # no staging folder left
    (tmp_path / "file").write_text("x")
    done = _build(tmp_path / "file")
    assert done.returncode == 2 and "not a folder" in done.stderr


def test_the_space_runs_from_its_folder_alone(tmp_path):
    space = tmp_path / "space"  # a build of its own: running it writes caches into it
    done = _build(space)
    assert done.returncode == 0, done.stderr
    assert not (space / "omnicore" / "__pycache__").exists()
    try:
        from gradio_client import Client
    except ImportError:
        missing("gradio_client", "pip install -e '.[demo]'")
    assert (CKPT / "config.json").is_file(), f"tiny checkpoint missing at {CKPT}"
    venv = tmp_path / "venv"
    python = make_venv(venv)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "PYTHONSAFEPATH",
                        "GRADIO_SERVER_NAME", "OMNICORE_MODEL")}
    env.update(GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    pip = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "-q", "-r",
                          "requirements.txt"], cwd=space, env=env, capture_output=True, text=True,
                         timeout=120)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    where = subprocess.run([str(python), "-c", "import omnicore, sys; print(omnicore.__file__); "
                            "print(sys.prefix)"], cwd=space, env=env, capture_output=True,
                           text=True, timeout=60, check=True).stdout.split("\n")
    assert Path(where[0]).resolve() == (space / "omnicore" / "__init__.py").resolve()
    assert Path(where[1]).resolve() == venv.resolve()

    port = free_port()
    log_path = tmp_path / "space.log"
    with open(log_path, "wb") as log:  # as a Space starts it: `python app.py` in the folder
        proc = subprocess.Popen([str(python), "app.py", "--model", str(CKPT), "--host",
                                 "127.0.0.1", "--port", str(port)],
                                cwd=space, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url + "/gradio_api/info", START_S, "the Space", log_path.read_text)
        with urllib.request.urlopen(url + "/", timeout=10) as r:
            assert r.status == 200 and b"gradio" in r.read().lower()
        client = Client(url, verbose=False)
        ok = client.predict(instruct="female, low pitch", text="Hi.", api_name="/check_instruct")
        assert "female, low pitch" in ok
        wav, *_ = client.predict(text="Hello from the Space.", num_step=2, seed=1, api_name="/auto")
        assert Path(wav).read_bytes()[:4] == b"RIFF"
    finally:
        stop_process(proc)
    # The app ran the package beside it: Python's and Numba's caches of the run are in the
    # Space's copy (the build ships none).
    cache = {p.name for p in (space / "omnicore" / "__pycache__").iterdir()}
    assert any(n.startswith("pipeline.") and n.endswith(".pyc") for n in cache), sorted(cache)
    model_cache = {p.name for p in (space / "omnicore" / "model" / "__pycache__").iterdir()}
    assert any(n.startswith("kernels.") and n.endswith(".nbi") for n in model_cache), sorted(model_cache)
