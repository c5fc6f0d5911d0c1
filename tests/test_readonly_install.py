"""omnicore installed where nobody may write, run by an unprivileged user.

Numba keeps compiled kernels beside the package (its `__pycache__`) when that can be written,
else in the user's cache folder (`~/.cache/numba`), else nowhere: then every process compiles
them in memory. Installed with pip into a folder then made read-only, omnicore must run in all
three cases: the first run compiles (and says so), the second loads the kernels, and with no
folder writable at all it still runs, with one warning.

Root ignores file modes, so as root the commands run as an unprivileged user: `nobody` (uid
65534) when it can run this interpreter, else root without capabilities (for an interpreter
under a private home such as pyenv's, which `nobody` cannot enter): then, as for any user,
only the files' modes decide. Cost: two cold compiles of the tiny checkpoint's kernels (the
warm-up and the run without a cache), about half a minute on two cores.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import missing

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
NOTICE = "compiling kernels, once per machine: about "
NOBODY = 65534


def _drop_privileges() -> tuple[list[str], int | None]:
    """(command prefix, uid to give the user's folders) for running as an unprivileged user."""
    if os.geteuid() != 0:
        return [], None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        missing("setpriv (util-linux)", "apt-get install util-linux")
    nobody = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run([*nobody, sys.executable, "-c", "import numpy, numba"],
                           capture_output=True, timeout=120, cwd="/")
    if probe.returncode == 0:
        return nobody, NOBODY
    no_caps = [setpriv, "--inh-caps=-all", "--bounding-set=-all",
               "--securebits=+noroot,+noroot_locked,+no_setuid_fixup,+no_setuid_fixup_locked"]
    return no_caps, None


@pytest.fixture(scope="module")
def install():
    """omnicore pip-installed (no dependencies: those of the running interpreter serve) into a
    folder that is then made read-only; yields (folder, command prefix, owner for the user's
    folders). Outside pytest's temporary folder, which `nobody` cannot enter."""
    top = Path(tempfile.mkdtemp(prefix="omnicore-ro-"))
    try:
        src = top / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy(ROOT / name, src / name)
        shutil.copytree(ROOT / "omnicore", src / "omnicore",
                        ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--no-compile", "--target", str(top / "site"), str(src)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        shutil.rmtree(src)
        top.chmod(0o755)
        subprocess.run(["chmod", "-R", "a-w", str(top / "site")], check=True)
        prefix, owner = _drop_privileges()
        yield top, prefix, owner
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(top)], check=False)
        shutil.rmtree(top, ignore_errors=True)


def _folder(path: Path, owner, writable: bool = True) -> Path:
    path.mkdir()
    if owner is not None:
        os.chown(path, owner, owner)
    path.chmod(0o755 if writable else 0o555)
    return path


def _run(install, home: Path, cwd: Path, *argv):
    top, prefix, _ = install
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NUMBA_", "XDG_", "PYTHON", "OMNICORE_"))}
    env.update(HOME=str(home), PYTHONPATH=str(top / "site"), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([*prefix, sys.executable, str(top / "site" / "bin" / "omnicore"),
                           *argv], cwd=cwd, env=env, capture_output=True, timeout=900)


def _cache_files(folder: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_a_read_only_install_runs_warm_from_the_users_cache_and_without_any(install):
    top, _, owner = install
    home = _folder(top / "home", owner)
    out = _folder(top / "out", owner)
    first = _run(install, home, out, "warmup", "--model", str(TINY))
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    assert NOTICE in first.stderr.decode()
    cache = home / ".cache" / "numba"
    kept = _cache_files(cache)
    assert any(p.suffix == ".nbi" for p in kept)  # the kernels went to the user's cache folder
    assert not list((top / "site").rglob("*.nbi"))  # and nothing beside the read-only package

    assert "kernels compiled in " in first.stderr.decode() and str(cache) in first.stderr.decode()

    second = _run(install, home, out, "say", "Hello.", "--model", str(TINY), "--steps", "2",
                  "-o", str(out / "hello.wav"))
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    assert NOTICE not in second.stderr.decode() and (out / "hello.wav").stat().st_size > 44
    again = _run(install, home, out, "warmup", "--model", str(TINY))
    assert "warm already: every kernel is in the kernel cache" in again.stderr.decode()
    rates = [p for p in kept if p.name == "omnicore-rates.json"]  # warmup measures it again
    assert {p: t for p, t in _cache_files(cache).items() if p not in rates} == {
        p: t for p, t in kept.items() if p not in rates}  # warm: nothing compiled or written

    # No folder at all: a home and a working folder that cannot be written, audio to stdout.
    bare = _folder(top / "bare", owner, writable=False)
    third = _run(install, bare, bare, "say", "Hello.", "--model", str(TINY), "--steps", "2",
                 "--raw")
    err = third.stderr.decode()
    assert third.returncode == 0, err[-3000:]
    assert len(third.stdout) > 0 and len(third.stdout) % 2 == 0  # 16-bit PCM
    assert NOTICE in err and "Traceback" not in err
    warned = [ln for ln in err.splitlines() if ln.startswith("omnicore: warning: ")]
    assert len(warned) == 1 and "kernel cache" in warned[0] and "NUMBA_CACHE_DIR" in warned[0]
