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
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..errors import RefTextMismatchWarning
from ..model import jit

PATHS = ("generate", "stream", "clone", "decode")
_TEXT = "Hello there."
_STEPS = 2  # the kernels are the same for any step count; two is one step and the last one
# What one kernel takes to compile, on average over every path's kernels (2-core AMD EPYC,
# benchmarks/README.md, "First runs"): the notice's estimate is this times the kernels not yet
# in the cache. A slower machine takes longer; the estimate says "about".
SECONDS_PER_KERNEL = 0.8
NOTICE = "compiling kernels, once per machine: about {seconds} s"


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
    if not force and not jit.uncached():
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
