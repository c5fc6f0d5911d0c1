"""Compiling the kernels before the first request: `warm_up(model)`.

Numba compiles each kernel the first time it is called on a machine and keeps the machine
code in its on-disk cache (docs/configuration.md, "Kernel cache"), so a fresh machine, a new
container or a Space restart pays that compile once, in whatever call comes first. `warm_up`
makes that call now, on a little input per path:

    generate   one short text, greedy and sampled (class temperature > 0 scores differently)
    stream     two short sentences through `stream()` (windowed decode)
    clone      a voice from a short synthetic clip (the codec's encoder half is loaded)
    decode     a few frames of codes

With a warm cache each path only loads its kernels and does a little work (at full size a few
seconds in all). `omnicore warmup` runs it and exits, for container builds; the servers and the
demo run it before they report ready.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .errors import RefTextMismatchWarning

PATHS = ("generate", "stream", "clone", "decode")
_TEXT = "Hello there."
_STEPS = 2  # the kernels are the same for any step count; two is one step and the last one


@dataclass
class Warmup:
    """What `warm_up` did: the seconds each path took, in the order run."""

    seconds: dict[str, float] = field(default_factory=dict)

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


def warm_up(model, paths=None, on_path=None) -> Warmup:
    """Run each of `paths` (None: all of PATHS) on a little input, so that every kernel the
    model will call is compiled, or loaded from the kernel cache, now. `on_path(name, seconds)`
    is called after each path."""
    paths = PATHS if paths is None else tuple(paths)
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"unknown warm-up path(s) {unknown}; the paths are {', '.join(PATHS)}")
    done = Warmup()
    for path in paths:
        t0 = time.perf_counter()
        _run(model, path)
        done.seconds[path] = time.perf_counter() - t0
        if on_path is not None:
            on_path(path, done.seconds[path])
    return done
