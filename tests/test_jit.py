"""The kernels' shared machinery: Numba started on demand (nothing compiled or imported before),
serial and parallel twins with their own cache entries, one implementation chosen per kernel,
and the float32 exp every kernel module builds on."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from omnicore.model import conv_kernels as CK
from omnicore.model import jit
from omnicore.model import kernels as K

ROOT = Path(__file__).resolve().parents[1]
F32_TINY = np.finfo(np.float32).tiny


def test_exp_polynomial_within_one_ulp_and_flushes_subnormals():
    x = np.concatenate([-np.geomspace(1e-8, 110, 20000), [0.0, -87.3, -87.34, -103.0, -np.inf]]).astype(np.float32)
    got = np.array([jit.exp_nonpos(v) for v in x], np.float32)
    want = np.exp(x.astype(np.float64))
    normal = want >= F32_TINY
    assert np.all(np.abs(got[normal] - want[normal]) <= 1.5 * np.spacing(want[normal].astype(np.float32)))
    # where the exact result is subnormal the kernel gives 0 (never a subnormal)
    assert np.all((got[~normal] == 0) | (got[~normal] >= F32_TINY))
    assert got[x == -np.inf][0] == 0 and got[x == 0][0] == 1


def test_parallel_twins_have_their_own_cache_entries():
    # Numba caches by function name: the parallel twin must be a separately named function
    for ser, par in ((K._softmax_nb, K._softmax_nb_par), (CK._snake_nb, CK._snake_nb_par)):
        assert par.py_func.__qualname__ == ser.py_func.__qualname__ + "_par"
        assert par.targetoptions.get("parallel") and not ser.targetoptions.get("parallel")


def test_a_kernel_runs_the_numba_body_on_numpy_and_its_twin_elsewhere(monkeypatch):
    calls = []
    kern = jit.Kernel(lambda x: calls.append("host") or x, lambda x: calls.append("twin") or x)
    kern(1)
    kern(2)
    assert calls == ["host", "host"]  # chosen at the first call, from the backend (numpy here)
    other = jit.Kernel(lambda x: calls.append("host"), lambda x: calls.append("twin"))
    monkeypatch.setattr(jit.backend, "name", lambda: "strict")
    other(0)
    assert calls[-1] == "twin"
    assert K.rms_norm.__doc__.startswith("RMSNorm") and K.rms_norm.twin is K.rms_norm_np


_CHILD = r"""
import sys
import omnicore.model.backbone, omnicore.model.unmasking, omnicore.model.higgs_codec, omnicore.model.hubert
from omnicore.model import backend, jit
assert "numba" not in sys.modules, "a model import imported Numba"
assert not jit.started() and not backend._fixed
import numpy as np
from omnicore.model import kernels
x = np.ones((2, 8), np.float32)
kernels.rms_norm(x, np.ones(8, np.float32), 1e-6)  # the first kernel starts Numba
assert jit.started() and "numba" in sys.modules and backend.name() == "numpy"
print("ok")
"""


@pytest.mark.subprocess
def test_importing_the_model_reads_no_setting_and_compiles_nothing():
    """Importing the model imports no Numba and reads no environment variable: a bad
    OMNICORE_NUM_THREADS or OMNICORE_BACKEND is not an import error (the configuration step
    reports it). Without that step, the first kernel starts Numba with its defaults."""
    env = dict(os.environ, OMNICORE_NUM_THREADS="two", OMNICORE_BACKEND="nonsense",
               PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_one_pool_keeps_blas_on_one_thread_and_gives_its_threads_back():
    import threading

    if not jit.pool_available():
        pytest.skip("numpy's OpenBLAS cannot be reached here: one_pool changes nothing")
    before = jit.blas_threads()
    serial, par = object(), object()
    assert jit.serial_or_parallel(serial, par, 1, pooled=True) is serial  # outside: serial
    entered, leave = threading.Event(), threading.Event()

    def other():  # a second thread inside the pool while the first leaves
        with jit.one_pool() as on:
            assert on
            entered.set()
            leave.wait(10)

    with jit.one_pool() as on:
        assert on and jit.blas_threads() == 1
        with jit.one_pool():  # nested
            assert jit.blas_threads() == 1
        assert jit.blas_threads() == 1
        # inside: a pooled kernel runs its parallel twin at any size; others are unchanged
        assert jit.serial_or_parallel(serial, par, 1, pooled=True).__wrapped__ is par
        assert jit.serial_or_parallel(serial, par, 1) is serial
        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(10)
    assert jit.blas_threads() == 1  # the other thread is still inside
    leave.set()
    t.join(10)
    assert jit.blas_threads() == before
    with jit.one_pool(False) as on:  # off: nothing changes
        assert not on and jit.blas_threads() == before


def test_an_embedders_own_numba_code_compiles_beside_omnicores_watch():
    # Omnicore listens to every Numba compile in the process (watch_compiles); an app's own
    # function of no module (made by exec, or with globals lacking __name__) must compile as
    # it would without omnicore, watched or not, and go unreported.
    import types

    import numba

    jit.start()
    seen = []
    stop = jit.watch_compiles(lambda event, name: seen.append(name))
    try:
        def double(x):
            return 2 * x
        orphan = types.FunctionType(double.__code__, {})  # no __name__: __module__ is None
        assert orphan.__module__ is None
        assert numba.njit(orphan)(21) == 42
    finally:
        stop()
    assert seen == []
