"""The process's runtime settings, read once: the array backend, threads, parallel kernels and
CUDA graphs.

`configure()` is the one step that reads them: from its arguments, else from the environment

    OMNICORE_BACKEND=numpy|cupy|strict   the array library (strict: the tests', omnicore_testing/)
    OMNICORE_NUM_THREADS=n               threads for Numba's pool and BLAS (default: all cores)
    OMNICORE_PARALLEL_KERNELS=1          the Numba kernels' parallel twins on
    OMNICORE_CUDA_GRAPHS=0               on CuPy, launch kernel by kernel (no CUDA graphs)
    OMNICORE_RATE=1.5e11                 the machine's GEMM rate in FLOP/s, instead of the one
                                         `omnicore warmup` measured (machinery/warmup.py)

and hands them to the model (`backend.use`, `jit.start`) before its first kernel.
`OmniVoice.from_pretrained`, `Codec`, the CLI and the servers call it; importing omnicore reads
no setting. It is idempotent: a later call without arguments returns the settings in force, and
one that asks for another backend is a ConfigError (the arrays already made live on the first).
Code that calls the model's functions directly without it runs on numpy with Numba's defaults.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, replace

from ..errors import ConfigError
from ..model import backend, jit

BACKENDS = ("numpy", "cupy", "strict")


@dataclass(frozen=True)
class Settings:
    backend: str = "numpy"
    threads: int | None = None  # None: every core
    parallel_kernels: bool = False
    cuda_graphs: bool = True
    rate: float | None = None  # FLOP/s to estimate with (None: measured, else assumed)


_current: Settings | None = None
_lock = threading.Lock()


def _from_environment() -> Settings:
    env = os.environ
    name = env.get("OMNICORE_BACKEND", "").strip().lower() or "numpy"
    threads = env.get("OMNICORE_NUM_THREADS", "").strip()
    if threads and not (threads.isdigit() and int(threads) > 0):
        raise ConfigError(f"OMNICORE_NUM_THREADS={threads!r}: expected a positive integer (threads)")
    rate = env.get("OMNICORE_RATE", "").strip()
    if rate:
        try:
            rate_value = float(rate)
        except ValueError:
            rate_value = 0.0
        if not (rate_value > 0 and rate_value != float("inf")):
            raise ConfigError(f"OMNICORE_RATE={rate!r}: expected a positive number of FLOP/s, "
                              "e.g. 1.5e11")
    if name not in BACKENDS:
        raise ConfigError(f"OMNICORE_BACKEND={name!r} is not one of 'numpy', 'cupy', 'strict' "
                          "(strict: a test backend that checks the device code paths on the CPU).")
    return Settings(backend=name, threads=int(threads) if threads else None,
                    parallel_kernels=env.get("OMNICORE_PARALLEL_KERNELS", "").strip() == "1",
                    cuda_graphs=env.get("OMNICORE_CUDA_GRAPHS", "1").strip() != "0",
                    rate=float(rate) if rate else None)


def configure(backend: str | None = None, threads: int | None = None,
              parallel_kernels: bool | None = None, cuda_graphs: bool | None = None,
              rate: float | None = None) -> Settings:
    """Read the settings (arguments win over the environment), check them and apply them once.

    Called again, it returns the settings in force; an argument that contradicts them is a
    ConfigError for the backend (the model's arrays live on it), and for the others takes effect
    where it can (threads: BLAS's pool and the calling thread's Numba count)."""
    global _current
    asked = {k: v for k, v in dict(backend=backend, threads=threads, parallel_kernels=parallel_kernels,
                                   cuda_graphs=cuda_graphs, rate=rate).items() if v is not None}
    if "rate" in asked and not (isinstance(rate, (int, float)) and not isinstance(rate, bool)
                                and 0 < rate < float("inf")):
        raise ConfigError(f"rate={rate!r}: expected a positive number of FLOP/s")
    if "backend" in asked and asked["backend"] not in BACKENDS:
        raise ConfigError(f"backend {asked['backend']!r} is not one of {', '.join(map(repr, BACKENDS))}")
    if "threads" in asked and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads={threads!r}: expected a positive integer")
    with _lock:
        if _current is not None:
            if asked.get("backend", _current.backend) != _current.backend:
                raise ConfigError(f"the array backend is {_current.backend} already (it is chosen "
                                  f"once, before the first model call); {asked['backend']!r} cannot "
                                  "replace it")
            if asked:
                _current = replace(_current, **asked)
                jit.start(_current.threads, _current.parallel_kernels)
            return _current
        wanted = replace(_from_environment(), **asked)
        _apply(wanted)
        _current = wanted
        return wanted


def _apply(s: Settings) -> None:
    if s.threads is not None and "numba" not in sys.modules:
        # Numba sizes its pool once, when it is imported (by jit.start, next): process-wide.
        os.environ["NUMBA_NUM_THREADS"] = str(s.threads)
    if s.backend == "strict":
        try:  # test machinery: in a source checkout, beside the package, never installed
            from omnicore_testing import strictxp
        except ModuleNotFoundError:
            raise ConfigError("OMNICORE_BACKEND=strict is the test suite's backend: it lives in a "
                              "source checkout (omnicore_testing/); run from its root") from None
        backend.use(strictxp.device())
    else:
        backend.use(s.backend, graphs=s.cuda_graphs)
    jit.start(s.threads, s.parallel_kernels)


def current() -> Settings | None:
    """The settings in force, or None before `configure`."""
    return _current
