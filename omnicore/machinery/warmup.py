"""The first run on a machine: compiling the kernels ahead (`warm_up`), and saying so while it
happens (`CompileWatch`).

Numba compiles each kernel the first time it is called on a machine and keeps the machine
code in its on-disk cache (docs/configuration.md, "Kernel cache"), so a fresh machine, a new
container or a Space restart pays that compile once, in whatever call comes first.

`warm_up(model)` makes that call now, on a little input per path, when some kernel is not in
the cache yet (else it returns at once):

    generate   one short text, greedy and sampled (class temperature > 0 scores differently)
    stream     two short sentences through `stream()` (windowed decode)
    clone      a voice from a short synthetic clip (the codec's encoder half is loaded)
    decode     a few frames of codes

`omnicore warmup` runs it and exits, for container builds; the servers and the demo run it
before they report ready.

`CompileWatch`, open around a command or a server's life, says "compiling kernels, once per
machine: about N s" when the first kernel starts compiling, and keeps the seconds spent
compiling, which progress leaves out of its ETA.

The machine's rate: `measure_rate(model)` times a short unmasking whose GEMM FLOPs are known
(`OmniVoice.unmask_flops`) and keeps the FLOP/s it reached in `omnicore-rates.json` beside the
kernel cache (the cache is this machine's, keyed to its CPU), one entry per backend, precision,
thread count and model size; a later measurement replaces it only when faster (`best_rate`: a
busy machine measures low). `rate(model)` reads it back, or ASSUMED_RATE where nobody measured.
`estimate_seconds(model, text, ...)` is FLOPs over that rate: the doors' "making voice alloy:
about N s" and a stream's first-audio budget (streaming.py) rest on it.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import RefTextMismatchWarning
from ..model import int8_kernels, jit

PATHS = ("generate", "stream", "clone", "decode")
_TEXT = "Hello there."
_STEPS = 2  # the kernels are the same for any step count; two is one step and the last one
# What one kernel takes to compile, on average over every path's kernels (2-core AMD EPYC,
# benchmarks/README.md, "First runs"): the notice's estimate is this times the kernels not yet
# in the cache. A slower machine takes longer; the estimate says "about".
SECONDS_PER_KERNEL = 0.8
NOTICE = "compiling kernels, once per machine: about {seconds} s"
# The GEMM rate (FLOP/s) of a machine nobody measured: about two thirds of what 2 Zen 4 cores
# reach at full size (146 GFLOP/s, docs/performance.md), so that an unmeasured machine errs
# toward less work before the first audio rather than more.
ASSUMED_RATE = 100e9
# What measure_rate times: an assistant's short reply, in a few steps (a chunk 0's size: small
# rows run BLAS at a lower rate than long ones, and the estimate is for such rows).
RATE_TEXT = "The living room lights are now off."
RATE_STEPS = 4
RATES_FILE = "omnicore-rates.json"
_rates: dict = {}  # (folder, key) -> FLOP/s, as read from or written to RATES_FILE


def compile_estimate() -> float:
    """Seconds the kernels not yet in the cache would take to compile (0: none would)."""
    return len(jit.uncached()) * SECONDS_PER_KERNEL


class CompileWatch:
    """While open (`with CompileWatch(say) as watch:`), omnicore's kernel compiles: `say(line)`
    gets the notice when the first one starts, `seconds()` is the time spent compiling so far
    (the compile under way included), `kernels` how many compiled. Thread-safe."""

    def __init__(self, say=None):
        self.say = say
        self.kernels = 0
        self._done = 0.0
        self._since: float | None = None  # when the compile under way began
        self._lock = threading.Lock()
        self._stop = None

    def __enter__(self) -> "CompileWatch":
        self._stop = jit.watch_compiles(self._on_compile)
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _on_compile(self, event: str, name: str) -> None:
        with self._lock:
            first = event == "start" and self.kernels == 0 and self._since is None
            if event == "start":
                self._since = time.perf_counter()
            elif self._since is not None:
                self._done += time.perf_counter() - self._since
                self._since = None
                self.kernels += 1
        if first and self.say is not None:  # the kernel starting now is still uncached: counted
            self.say(NOTICE.format(seconds=max(1, round(compile_estimate()))))

    def seconds(self) -> float:
        with self._lock:
            under_way = time.perf_counter() - self._since if self._since is not None else 0.0
            return self._done + under_way


@dataclass
class Warmup:
    """What `warm_up` did: the seconds each path took, in the order run (none: every kernel was
    in the cache already), and the kernels compiled meanwhile."""

    seconds: dict[str, float] = field(default_factory=dict)
    compiled: int = 0
    compile_s: float = 0.0

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


def _clip(sample_rate: int) -> np.ndarray:
    """1.5 s of a voiced-sounding test signal: harmonics of a gliding pitch under an envelope
    (not silence, which the clone path refuses, and the same every time)."""
    t = np.arange(int(1.5 * sample_rate)) / sample_rate
    pitch = 2 * np.pi * np.cumsum(120 + 40 * t) / sample_rate
    wav = sum(np.sin(k * pitch) / k for k in range(1, 6)) * np.sin(np.pi * t / 1.5) ** 2
    return (0.2 * wav).astype(np.float32)


def _run(model, path: str) -> None:
    kw = dict(num_step=_STEPS, seed=0)
    if path == "generate":
        model.synthesize(_TEXT, **kw)
        model.synthesize(_TEXT, class_temperature=0.5, **kw)
    elif path == "stream":
        with model.stream(_TEXT + " " + _TEXT, **kw) as pieces:
            for _ in pieces:
                pass
    elif path == "clone":
        with warnings.catch_warnings():  # the transcript is not the clip's: its pace is no matter
            warnings.simplefilter("ignore", RefTextMismatchWarning)
            model.create_voice_clone_prompt((_clip(model.sampling_rate), model.sampling_rate),
                                            ref_text=_TEXT)
    else:  # decode
        model.codec.decode(np.zeros((model.config.num_audio_codebook, 4), np.int64))


def warm_up(model, paths=None, on_path=None, say=None, force: bool = False) -> Warmup:
    """Compile now every kernel `model` will call: run each of `paths` (None: all of PATHS) on a
    little input, unless every kernel is in the cache already (`force`: run them anyway).
    `on_path(name, seconds)` is called after each path, `say(line)` with the compile notice."""
    paths = PATHS if paths is None else tuple(paths)
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"unknown warm-up path(s) {unknown}; the paths are {', '.join(PATHS)}")
    done = Warmup()
    int8 = getattr(model, "precision", "fp32") == "int8"
    idle = int8_kernels.idle_kernels(int8)
    if not force and not jit.uncached(idle, pooled=int8 and jit.pool_available()):
        return done
    with CompileWatch(say) as watch:
        for path in paths:
            t0 = time.perf_counter()
            _run(model, path)
            done.seconds[path] = time.perf_counter() - t0
            if on_path is not None:
                on_path(path, done.seconds[path])
    done.compiled, done.compile_s = watch.kernels, watch.seconds()
    return done


# -- the machine's rate --------------------------------------------------------------------------


def rate_key(model) -> str:
    """What a measured rate holds for: the backend, precision, threads and model size."""
    from . import settings

    s = settings.current() or settings.Settings()
    q = model.config.llm_config
    return (f"{s.backend}/{model.precision}/{s.threads or os.cpu_count()} threads/"
            f"{q.num_hidden_layers}x{q.hidden_size}")


def _rates_path(folder) -> Path | None:
    if folder is None:
        folder = jit.cache_folder()
    return Path(folder) / RATES_FILE if isinstance(folder, (str, os.PathLike)) else None


def _read_rates(path: Path | None) -> dict:
    try:
        rates = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):  # none yet, or unreadable: measured again
        return {}
    return rates if isinstance(rates, dict) else {}


def measured_rate(model, folder=None) -> float | None:
    """The FLOP/s `measure_rate` kept for this machine and `model` (None: never measured).
    `folder`: where the rates are kept (default: the kernel cache's folder)."""
    path, key = _rates_path(folder), rate_key(model)
    if (str(path), key) not in _rates:
        value = _read_rates(path).get(key)
        if not (isinstance(value, (int, float)) and value > 0):
            return None
        _rates[str(path), key] = float(value)
    return _rates[str(path), key]


def rate(model, folder=None) -> float:
    """The FLOP/s to estimate with: OMNICORE_RATE (settings), else measured (measured_rate),
    else ASSUMED_RATE."""
    from . import settings

    chosen = settings.current()
    if chosen is not None and chosen.rate is not None:
        return chosen.rate
    return measured_rate(model, folder) or ASSUMED_RATE


def best_rate(kept, measured: float) -> float:
    """The rate to keep, given the one kept so far (None, or not a positive number: none) and a
    new measurement: the higher. Other work on the cores only ever slows a measurement down, so
    the fastest one seen is the machine's own; keeping the latest would let one measured while
    the machine was busy size every later chunk 0 too small, until someone measured again."""
    if isinstance(kept, (int, float)) and not isinstance(kept, bool) and kept > 0:
        return max(float(kept), measured)
    return measured


def measure_rate(model, folder=None, keep=None) -> float:
    """Time RATE_TEXT unmasked in RATE_STEPS steps (after a first run, so that no compile is
    timed), keep in RATES_FILE the better of its FLOP/s and the rate kept there already
    (best_rate), and return the rate kept. `keep(path, data)` writes the file
    (the callers pass the one atomic writer: the machinery imports nothing of the core); without
    it, or where it fails (a read-only cache), the rate holds for this process only."""
    from ..errors import OmniCoreError

    kw = dict(num_step=RATE_STEPS, seed=0)
    model.synthesize(RATE_TEXT, _decode=False, **kw)  # any compile or first touch happens here
    seconds = model.synthesize(RATE_TEXT, _decode=False, **kw)[0].timings["unmask"]
    measured = model.unmask_flops(RATE_TEXT, **kw) / max(seconds, 1e-9)
    path, key = _rates_path(folder), rate_key(model)
    rates = _read_rates(path)
    value = best_rate(rates.get(key), measured)
    _rates[str(path), key] = value
    if path is not None and keep is not None:
        rates = {**rates, key: value}
        try:
            keep(path, json.dumps(rates, indent=1).encode())
        except OmniCoreError:
            pass
    return value


def estimate_seconds(model, text, folder=None, **kwargs) -> float:
    """Seconds `model.synthesize(text, **kwargs)` would spend unmasking on this machine:
    its FLOPs (OmniVoice.unmask_flops) over `rate`. An estimate: the decode and the
    scoring are left out, and a busy machine is slower."""
    return model.unmask_flops(text, **kwargs) / rate(model, folder)
