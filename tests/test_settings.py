"""The one configuration step: the environment read once, checked, and applied before the
first kernel (Numba's pool sized, the backend chosen); idempotent, and a second backend refused."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code, **env):
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    for k, v in list(full.items()):
        if v is None:
            del full[k]
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=300)


_POOLS = ("from omnicore.machinery import settings; settings.configure(); import threading, numba; "
          "out = [numba.get_num_threads()]; "
          "t = threading.Thread(target=lambda: out.append(numba.get_num_threads())); t.start(); t.join(); "
          "from omnicore.model import jit; "
          "print(numba.config.NUMBA_NUM_THREADS, *out, jit.blas_threads())")


@pytest.mark.subprocess
def test_omnicore_num_threads_sizes_the_pools():
    out = _run(_POOLS, OMNICORE_NUM_THREADS="1")
    assert out.returncode == 0, out.stderr[-2000:]
    # Numba's pool, this thread, any other thread; and numpy's OpenBLAS (None: not reachable)
    assert out.stdout.split()[:3] == ["1", "1", "1"]
    assert out.stdout.split()[3] in ("1", "None")
    bad = _run(_POOLS, OMNICORE_NUM_THREADS="two")
    assert bad.returncode != 0 and "OMNICORE_NUM_THREADS" in bad.stderr and "ConfigError" in bad.stderr


@pytest.mark.subprocess
def test_a_bad_backend_name_is_refused_by_the_configuration_step():
    bad = _run("from omnicore.machinery import settings; settings.configure()", OMNICORE_BACKEND="tpu")
    assert bad.returncode != 0 and "OMNICORE_BACKEND='tpu'" in bad.stderr and "ConfigError" in bad.stderr


_TWICE = r"""
from omnicore.machinery import settings
from omnicore.errors import ConfigError
from omnicore.model import backend, jit
first = settings.configure(parallel_kernels=True)
assert settings.configure() is first and first.backend == "numpy" and jit.PARALLEL_KERNELS
assert settings.configure(backend="numpy").backend == "numpy"
try:
    settings.configure(backend="strict")
except ConfigError as exc:
    print("refused:", exc)
assert backend.name() == "numpy"
"""


@pytest.mark.subprocess
def test_configure_is_idempotent_and_keeps_its_backend():
    out = _run(_TWICE, OMNICORE_BACKEND=None)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("refused: the array backend is numpy already")


@pytest.mark.subprocess
def test_the_strict_backend_comes_from_the_testing_package():
    out = _run("from omnicore.machinery import settings; from omnicore.model import backend; "
               "from omnicore.model.backend import xp; from omnicore_testing import strictxp; "
               "settings.configure(); print(backend.name(), isinstance(xp.zeros(2, xp.float32), strictxp.StrictArray))",
               OMNICORE_BACKEND="strict")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["strict", "True"]


def test_a_used_backend_cannot_be_replaced():
    from omnicore.errors import ConfigError
    from omnicore.model import backend

    backend.name()  # this process runs numpy, and has used it
    with pytest.raises(ConfigError, match="numpy already"):
        backend.use("cupy")
    backend.use("numpy")  # the backend in use: nothing to do
