"""Quality presets (unmasking steps), and how long a visitor will wait, said before it runs.

    PRESETS                      "Fast" / "Balanced" / "Best": a step count each (`num_step`, the
                                 reference's own setting; Best = its default, 32)
    APPROXIMATE                  the preset of the approximate fast profile (its own 16 steps);
                                 `preset_settings(name)` -> (steps, profile), `preset_of` back
    measure(model)               the machine's rate, timed at start-up: seconds per forward pass
                                 as `overhead + FLOPs / flops_per_s`, decode seconds per frame,
                                 encode seconds per second of clip
    planned_work(model, text, streamed=..., ...)
                                 the passes a request will run, as the pipeline plans them
                                 (`OmniVoice.synthesize`'s plan, or the stream's chunks), each as
                                 its steps and `cost.forward_flops` of its rows, plus the
                                 frames it decodes
    estimate(rate, work)         (seconds to the first audio, seconds to all of it)
    Tracker(rate).observe(...)   the rate kept true as the load changes: each run moves it
                                 halfway to what the run took
    default_preset(model, rate)  the most steps whose first audio of a typical input meets the
                                 goal on this machine
    describe(rate, work, steps, load)
                                 the line a page shows: "about N s on this machine", and when
                                 other work keeps the cores busy (machine_load), how long it
                                 may take instead

The estimate only reads the plan; nothing here changes what is generated.

Dimension legend: C codebooks, T target frames of a pass, R reference frames, S positions of a
pass's conditional row (style and text tokens, reference frames, targets).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from omnicore import GenerationConfig, VoiceClonePrompt
from omnicore.model.config import FAST_PROFILE
from omnicore.errors import InputError
from omnicore.model import cost
from omnicore.model.higgs_codec import decoder_receptive_field
from omnicore.request import build_requests
from omnicore.streaming import LATER_WINDOWS
from omnicore.text import limits, planner

# Best is the reference's default (32); Balanced halves the steps, Fast halves them again.
_BEST = GenerationConfig().num_step
PRESETS = {"Fast": _BEST // 4, "Balanced": _BEST // 2, "Best": _BEST}
# The fast profile at its own settings: approximate, and said so wherever it is offered.
APPROXIMATE = "Fast profile (approximate)"
GOAL_S = 15.0  # a visitor should hear something within this long
# The estimate is trusted to +-30 %; a preset is chosen when its estimate leaves that much room.
HEADROOM = 1.3
# Typical inputs the default preset must serve: 1-3 sentences, auto voice.
TYPICAL_TEXTS = (
    "Hello! This is OmniVoice running on numpy. It speaks more than six hundred languages.",
    "Good evening. Here is tonight's forecast.",
)
STREAM_DECODE_FRAMES = 25  # the stream's first decode window (streaming.stream's default)
# Runnable processes per core above which the machine is busy: a run then shares the cores, and
# the estimate (from runs on a machine that was not) can be several times too short.
BUSY_LOAD = 1.0

_CAL_TEXT = ("The kettle clicked off just as the rain started drumming on the kitchen window, "
             "so we stayed in and read.")
_CAL_SECONDS = (1.5, 6.0)  # two pass lengths around a first chunk and a whole short text
_CAL_STEPS = 4


@dataclass(frozen=True)
class Rate:
    """What this machine does per second, measured by `measure`."""

    forward_s: float         # fixed seconds of one forward pass (launches, scoring, threads)
    flops_per_s: float       # backbone FLOPs per second beyond that
    decode_s: float          # fixed seconds of one decode call
    decode_frame_s: float    # seconds per decoded frame
    encode_s_per_s: float    # seconds to encode one second of reference clip
    measured_s: float        # how long the measurement took

    def forward(self, flops: int) -> float:
        return self.forward_s + flops / self.flops_per_s

    def scaled(self, unmask: float, decode: float) -> "Rate":
        """This rate with unmasking `unmask` times and decoding `decode` times as slow."""
        return replace(self, forward_s=self.forward_s * unmask,
                       flops_per_s=self.flops_per_s / unmask, decode_s=self.decode_s * decode,
                       decode_frame_s=self.decode_frame_s * decode)


@dataclass(frozen=True)
class PageDefaults:
    """The preset and streaming setting a page opens with, and the machine's measured rate
    (None: not measured, so no estimates)."""

    preset: str = "Best"
    streamed: bool = False
    rate: Rate | None = None


@dataclass(frozen=True)
class Work:
    """A request's planned work, in the order it runs."""

    forwards: tuple[tuple[int, int], ...]  # (steps, FLOPs of one forward) per group of passes
    decodes: tuple[int, ...]               # frames of each decode call (with window overlaps)
    first_decode: int | None               # index in `decodes` of the first audio (streamed)
    clip_s: float                          # seconds of reference clip to encode first
    streamed: bool

    @property
    def chunks(self) -> int:
        return len(self.forwards) if self.streamed else 0


# ------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------


def clip_seconds(audio) -> float:
    """Length of a reference clip: a file, or (samples, sample_rate)."""
    if isinstance(audio, tuple):
        return len(audio[0]) / float(audio[1])
    import soundfile as sf

    return sf.info(str(audio)).duration


def stand_in_prompt(model, ref_text: str | None, clip_s: float) -> VoiceClonePrompt:
    """A voice prompt of the length a clip of `clip_s` seconds encodes to (codes all zero):
    the plan's rows without encoding the clip."""
    frames = max(1, math.ceil(clip_s * model.frame_rate))
    return VoiceClonePrompt(np.zeros((model.config.num_audio_codebook, frames), np.int64),
                            ref_text or "", 0.1)


def _stream_specs(model, text, rule, language, instruct, voice_clone_prompt, duration, speed,
                  normalize_text, gen_kwargs) -> list:
    """The passes `OmniVoice.stream` runs for `text`: its chunks (planner.split_text), each
    sized by planner.plan_chunk at the stream's pace, later ones after chunk 0 in auto / design
    mode (as the stream plans them)."""
    r, = build_requests(model, None, language=language, instruct=instruct,
                        voice_clone_prompt=voice_clone_prompt, duration=duration, speed=speed,
                        normalize_text=normalize_text, gen_kwargs=gen_kwargs, encode=False)
    pace = 1.0 if r.speed is None else r.speed
    if r.duration is not None:
        pace, _ = planner.plan_pace(r.normalize(text), r.ref_text, r.ref_frames,
                                    duration=r.duration, frame_rate=model.frame_rate)
    chunks = [c if isinstance(c, planner.Pause) else r.normalize(c)
              for c in planner.split_text(text, rule)]
    spoken = [c for c in chunks if isinstance(c, str)]
    instruct = r.instruct_for(spoken[0] if spoken else None)
    first, paused, specs = None, False, []
    for item in chunks:
        if isinstance(item, planner.Pause):
            paused = paused or first is not None
            continue
        plan = planner.plan_chunk(item, first, r.ref_text, r.ref_frames, pace, own_pace=paused)
        first = first or plan
        specs.append(r.spec(plan, len(specs), instruct, first=0))
    return specs


def _rows(model, specs) -> list[list[int]]:
    """Positions of each pass's rows: the conditional row [S], and with guidance the
    unconditional one [T] (what the engine packs)."""
    C = model.config.num_audio_codebook
    out = []
    for spec in specs:
        ref = None if spec.after is None else np.zeros((C, specs[spec.after].frames), np.int64)
        item = model.engine.prepare(spec, ref)
        out.append([item.input_ids.shape[1]] + ([item.num_target] if spec.gen.guidance_scale else []))
    return out


def _windows(frames: int, first: int, overlap: int) -> list[int]:
    """Frames each window of `higgs_codec.decode_stream` decodes (its own plus the overlaps)."""
    out, start = [], 0
    while start < frames:
        stop = min(frames, start + (first if start == 0 else LATER_WINDOWS * first))
        out.append(min(frames, stop + overlap) - max(0, start - overlap))
        start = stop
    return out


def planned_work(model, text: str, *, streamed: bool, rule=None, ref_audio=None, ref_text=None,
                 voice_clone_prompt=None, language=None, instruct=None, duration=None,
                 speed=None, normalize_text: bool = False, seed=None, **gen_kwargs) -> Work:
    """The work of `synthesize(text, ...)` (or `stream(text, rule=rule, ...)`) with the same
    keyword arguments, from its plan. A reference clip is not encoded: a stand-in prompt of its
    length takes its place, and the encoding is counted by its seconds. Raises what the call
    would raise for bad input (InputError)."""
    clip_s = 0.0
    if voice_clone_prompt is None and ref_audio is not None:
        clip_s = clip_seconds(ref_audio)
        voice_clone_prompt = stand_in_prompt(model, ref_text, clip_s)
    args = dict(language=language, instruct=instruct, voice_clone_prompt=voice_clone_prompt,
                duration=duration, speed=speed, normalize_text=normalize_text)
    if streamed:
        specs = _stream_specs(model, limits.validate_text(text), rule, gen_kwargs=gen_kwargs,
                              **args)
        if not specs:
            raise InputError("text has only pause marks and nothing to speak")
        groups = [[i] for i in range(len(specs))]  # one chunk after another
    else:
        _, _, specs, _ = model._passes(text, ref_audio=None, ref_text=None, seed=None,
                                       on_step=None, generation_config=None,
                                       gen_kwargs=gen_kwargs, **args)
        # The engine runs independent passes side by side; chunks voiced by chunk 0 after it.
        waves = [[i for i, s in enumerate(specs) if s.after is None],
                 [i for i, s in enumerate(specs) if s.after is not None]]
        groups = [w for w in waves if w]
    rows = _rows(model, specs)
    cfg = model.config

    def step_flops(i):  # one of pass i's forwards, on average (the fast profile's steps differ)
        s, T = specs[i], specs[i].frames
        return cost.pass_flops(cfg, s.gen, rows[i][0] - T, T, len(rows[i]) > 1) // s.gen.num_step

    forwards = tuple((specs[g[0]].gen.num_step, sum(step_flops(i) for i in g)) for g in groups)
    if streamed:
        overlap = max(decoder_receptive_field(model.codec.cfg))
        decodes = tuple(w for s in specs for w in _windows(s.frames, STREAM_DECODE_FRAMES, overlap))
    else:
        decodes = tuple(s.frames for s in specs)
    return Work(forwards, decodes, 0 if streamed else None, clip_s, streamed)


def _parts(rate: Rate, work: Work) -> tuple[float, list[float], list[float]]:
    """Seconds of `work` at `rate`: encoding, each group of forward passes, each decode."""
    return (rate.encode_s_per_s * work.clip_s,
            [steps * rate.forward(flops) for steps, flops in work.forwards],
            [rate.decode_s + n * rate.decode_frame_s for n in work.decodes])


def estimate(rate: Rate, work: Work) -> tuple[float, float]:
    """(seconds to the first audio, seconds to all of it) for `work` at `rate`."""
    before, forwards, decodes = _parts(rate, work)
    total = before + sum(forwards) + sum(decodes)
    if work.first_decode is None:
        return total, total
    return before + forwards[0] + decodes[work.first_decode], total


class Tracker:
    """The rate measured at start-up, kept true as the machine's load changes: after each run
    the unmasking and decoding parts move halfway (geometrically) to what the run took.
    Thread-safe; `rate` is the current one."""

    def __init__(self, rate: Rate):
        self.rate = rate
        self._lock = threading.Lock()

    def observe(self, work: Work, unmask_s: float, decode_s: float) -> None:
        with self._lock:
            _, forwards, decodes = _parts(self.rate, work)
            if sum(forwards) > 0 and sum(decodes) > 0 and unmask_s > 0 and decode_s > 0:
                self.rate = self.rate.scaled(math.sqrt(unmask_s / sum(forwards)),
                                             math.sqrt(decode_s / sum(decodes)))


# ------------------------------------------------------------------------------------------------
# The rate
# ------------------------------------------------------------------------------------------------


def _line(points):
    """(intercept, slope) of the line through two (x, y) points, kept >= 0: noise on a busy
    machine can tilt a two-point fit, then the longer point alone sets the slope."""
    (x0, y0), (x1, y1) = points
    slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
    intercept = y0 - slope * x0
    if slope <= 0 or intercept < 0:
        return 0.0, y1 / x1
    return intercept, slope


def measure(model, clip=None, repeats: int = 2) -> Rate:
    """Time the model on this machine: a pass of two lengths (`_CAL_SECONDS`, few steps; the
    fastest of `repeats` runs), their decodes, and with `clip` = (audio, transcript) the
    encoding of a reference clip (a file). The first call compiles the kernels and is not timed."""
    t_start = time.perf_counter()
    model.synthesize("Hello.", num_step=2, seed=0)
    forward, decode = [], []
    for seconds in _CAL_SECONDS:
        (steps, flops), = planned_work(model, _CAL_TEXT, streamed=False, duration=seconds,
                                       num_step=_CAL_STEPS).forwards
        runs = [model.synthesize(_CAL_TEXT, duration=seconds, num_step=_CAL_STEPS, seed=0)[0]
                for _ in range(repeats)]
        forward.append((flops, min(r.timings["unmask"] for r in runs) / steps))
        decode.append((runs[0].codes.shape[1], min(r.timings["decode"] for r in runs)))
    forward_s, per_flop = _line(forward)
    decode_s, decode_frame_s = _line(decode)
    encode = 0.0
    if clip is not None:  # the first encode also loads the encoder half: time the second
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            model.create_voice_clone_prompt(*clip)
            times.append(time.perf_counter() - t0)
        encode = times[-1] / clip_seconds(clip[0])
    return Rate(forward_s, 1.0 / per_flop, decode_s, decode_frame_s, encode,
                time.perf_counter() - t_start)


def default_preset(model, rate: Rate, rule=None) -> str:
    """The preset with the most steps whose streamed first audio of every typical input is
    estimated at most GOAL_S / HEADROOM on this machine; Fast when none is."""
    by_steps = sorted(PRESETS, key=PRESETS.get, reverse=True)
    for name in by_steps:
        firsts = [estimate(rate, planned_work(model, t, streamed=True, rule=rule,
                                              num_step=PRESETS[name]))[0]
                  for t in TYPICAL_TEXTS]
        if max(firsts) * HEADROOM <= GOAL_S:
            return name
    return by_steps[-1]


def preset_settings(name: str) -> tuple[int, str]:
    """(steps, profile) of a preset."""
    if name == APPROXIMATE:
        return FAST_PROFILE["num_step"], "fast"
    return PRESETS[name], "exact"


def preset_of(num_step, profile: str = "exact") -> str | None:
    """The preset of a step count and profile, or None for settings no preset has."""
    if profile == "fast":
        return APPROXIMATE if num_step == FAST_PROFILE["num_step"] else None
    return next((name for name, n in PRESETS.items() if n == num_step), None)


def machine_load() -> float | None:
    """Runnable processes per core over the last minute (the load average), or None where the
    system does not say."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None


def describe(rate: Rate | None, work: Work | None, steps: int, error: str | None = None,
             load: float | None = None) -> str:
    """The line above a Generate button: "about N s on this machine", or why there is none.
    With `load` (machine_load) over BUSY_LOAD, it also says the machine is busy and how long
    the wait may be instead: a run sharing the cores with that much other work takes up to
    1 + load times as long (its threads get a 1 / (1 + load) share)."""
    if error:
        return f"No estimate yet: {error}"
    if rate is None or work is None:
        return ""
    first, total = estimate(rate, work)
    busy = load is not None and load > BUSY_LOAD
    slower = 1.0 + load if busy else 1.0
    if work.streamed:
        pieces = work.chunks
        line = (f"**First audio in about {_seconds(first)}** on this machine, all of it in "
                f"about {_seconds(total)} ({steps} steps, streamed in {pieces} "
                f"piece{'s' if pieces != 1 else ''}).")
        instead = f"the first audio in up to {_seconds(first * slower)}, all of it in up to " \
                  f"{_seconds(total * slower)}"
    else:
        line = (f"**About {_seconds(total)}** on this machine ({steps} steps, heard when it is "
                "done).")
        instead = f"up to {_seconds(total * slower)}"
    if busy:
        line += (f" The machine is busy now ({load:.1f} runnable processes per core), so it may "
                 f"take longer: {instead}.")
    return line


def _seconds(s: float) -> str:
    if s < 10:
        return f"{max(s, 0.1):.1f} s"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"
