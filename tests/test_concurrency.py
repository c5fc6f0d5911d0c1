"""Several threads using ONE loaded model at the same time (the demo's queue with --concurrency > 1,
a web server, an app with a worker pool): each call must get exactly what it gets alone.

The calls share the model's one engine: its thread runs the passes of every call packed into
shared forwards, on one workspace and packing (the engine's PackCache). What stays a call's own
is each pass's state (its schedule, step, codes and random generator, from the call's seed) and
each stream's state; the model's parameters are read-only; the codec's encoder half is loaded
on first use under a lock. These tests force the calls to overlap (the threads meet at a barrier inside their first unmasking step,
so both are mid-generation together) and compare with the same calls made alone: codes exactly;
audio within one int16 step (the same GEMM shapes run, so it is normally bit-identical; the
allowance covers BLAS builds whose kernel choice depends on how many threads are free).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from omnicore import OmniVoice
from omnicore.model import higgs_codec

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"
INT16_STEP = 2.0 ** -15
GREEDY = dict(position_temperature=0.0, class_temperature=0.0, num_step=6)
SEEDED = dict(num_step=6, seed=1234)  # default temperatures: the seed decides the codes
TEXTS = ("The first thread speaks this sentence.", "A second and rather different one runs beside it!")
WAIT_S = 60


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


def _clip(seed: int, seconds: float = 1.0, sr: int = 24000) -> np.ndarray:
    """A voiced-like clip (harmonics under a syllable envelope), different per seed."""
    t = np.arange(int(seconds * sr)) / sr
    f0 = 120.0 + 15.0 * seed
    voiced = sum(np.sin(2 * np.pi * k * f0 * t) / k for k in range(1, 6))
    env = 0.5 + 0.5 * np.sin(2 * np.pi * (2.0 + seed) * t)
    noise = 0.01 * np.random.default_rng(seed).standard_normal(t.size)
    return (0.2 * voiced * env + noise).astype(np.float32)


def run_together(calls, meet_inside: bool = True):
    """Run each call (a function taking an `on_step` callback) in its own thread, all at once.

    With meet_inside, every thread waits at a barrier inside its first unmasking step, so all
    calls are mid-generation together; otherwise they only start together. Returns the results
    in order; the first exception of any thread is raised here.
    """
    barrier = threading.Barrier(len(calls), timeout=WAIT_S)
    results, errors = [None] * len(calls), [None] * len(calls)

    def worker(i, call):
        met = False

        def on_step(step, total):
            nonlocal met
            if meet_inside and not met:  # once per call, even over several text chunks
                met = True
                barrier.wait()

        try:
            if not meet_inside:
                barrier.wait()
            results[i] = call(on_step)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors[i] = exc
            barrier.abort()  # the other threads must not wait for this one

    threads = [threading.Thread(target=worker, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 4)
        assert not t.is_alive(), "a thread is still running: deadlock?"
    for e in errors:
        if e is not None and not isinstance(e, threading.BrokenBarrierError):
            raise e
    for e in errors:
        if e is not None:
            raise e
    return results


def assert_same_audio(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want).max(initial=0.0)
    assert err <= INT16_STEP, f"audio differs by {err:.3g} (> one int16 step)"


def assert_same_result(got, want, settings) -> None:
    """Two threads share the engine's packed forwards. Greedy decisions do not depend on the pack,
    so greedy codes are equal bit for bit. A sampled decision can flip where its Gumbel draw lies
    within float32 GEMM rounding of a tie (OpenBLAS's Haswell sgemm rounds a row by the GEMM's row
    count): measured 0 of 120 packs with position sampling, 3 of 120 with class sampling, so
    sampled runs must agree on all but a handful of cells, and exactly when no flip happened."""
    if settings.get("position_temperature") == 0.0 and settings.get("class_temperature", 0.0) == 0.0:
        np.testing.assert_array_equal(got.codes, want.codes)
    else:
        assert got.codes.shape == want.codes.shape
        assert np.mean(got.codes != want.codes) <= 0.005, "sampled codes differ beyond a rare flip"
        if not np.array_equal(got.codes, want.codes):
            return
    np.testing.assert_array_equal(got.fill_steps, want.fill_steps)
    assert_same_audio(got.audio, want.audio)


def _synth(model, text, settings):
    return lambda on_step: model.synthesize(text, on_step=on_step, **settings)[0]


@pytest.mark.parametrize("settings", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_two_threads_generate_what_each_gets_alone(model, settings):
    alone = [model.synthesize(t, **settings)[0] for t in TEXTS]
    assert not np.array_equal(alone[0].codes[:, :5], alone[1].codes[:, :5])  # distinguishable
    together = run_together([_synth(model, t, settings) for t in TEXTS])
    for got, want in zip(together, alone):
        assert_same_result(got, want, settings)


def test_same_text_and_seed_in_two_threads(model):
    """Two identical seeded calls at once: neither's random draws leak into the other's."""
    alone = model.synthesize(TEXTS[0], **SEEDED)[0]
    a, b = run_together([_synth(model, TEXTS[0], SEEDED)] * 2)
    for got in (a, b):
        assert_same_result(got, alone, SEEDED)


def test_two_streams_at_once(model):
    """stream() runs its own worker thread; two streams on one model from two threads."""
    text = ("A short first clause, then a full sentence follows it. ", "Another voice speaks here, "
            "in a second stream. And it has a second sentence too.")

    def streamed(t):
        return lambda on_step: np.concatenate(list(model.stream(t, on_step=on_step, **GREEDY)))

    alone = [streamed(t)(lambda s, n: None) for t in text]
    together = run_together([streamed(t) for t in text])
    for got, want in zip(together, alone):
        assert_same_audio(got, want)


def test_voice_clone_prompts_from_threads_on_a_fresh_model(monkeypatch):
    """The encoder half loads on first use: three threads hit that at once on a fresh model
    (two encode a clip, one generates, which only reads the decoder half). The encoder is loaded
    once, and every result equals the same call made alone afterwards."""
    fresh = OmniVoice.from_pretrained(TINY)
    assert fresh.codec.params.encoder is None
    loads = []
    real_load = higgs_codec.load_encoder_params

    def counting_load(*args, **kwargs):
        loads.append(threading.get_ident())
        return real_load(*args, **kwargs)

    monkeypatch.setattr(higgs_codec, "load_encoder_params", counting_load)
    clips = [_clip(1), _clip(2, seconds=1.4)]
    refs = ["The first reference clip.", "A second reference, a little longer."]

    def prompt(i):
        return lambda on_step: fresh.create_voice_clone_prompt((clips[i], 24000), ref_text=refs[i])

    p0, p1, synth = run_together([prompt(0), prompt(1), _synth(fresh, TEXTS[0], GREEDY)],
                                 meet_inside=False)
    assert len(loads) == 1, f"encoder half loaded {len(loads)} times"
    for got, i in ((p0, 0), (p1, 1)):
        want = fresh.create_voice_clone_prompt((clips[i], 24000), ref_text=refs[i])
        np.testing.assert_array_equal(got.ref_audio_tokens, want.ref_audio_tokens)
        assert got.ref_text == want.ref_text and got.ref_rms == want.ref_rms
    assert p0.ref_audio_tokens.shape != p1.ref_audio_tokens.shape
    alone = fresh.synthesize(TEXTS[0], **GREEDY)[0]
    np.testing.assert_array_equal(synth.codes, alone.codes)
    assert_same_audio(synth.audio, alone.audio)


def test_cloned_voices_generate_in_two_threads(model):
    """Two threads, each with its own voice prompt, at once."""
    prompts = [model.create_voice_clone_prompt((_clip(i), 24000), ref_text=f"Reference number {i}.")
               for i in (3, 4)]

    def call(i):
        return lambda on_step: model.synthesize(TEXTS[i], voice_clone_prompt=prompts[i],
                                                on_step=on_step, **GREEDY)[0]

    alone = [call(i)(None) for i in (0, 1)]
    together = run_together([call(0), call(1)])
    for got, want in zip(together, alone):
        np.testing.assert_array_equal(got.codes, want.codes)
        assert_same_audio(got.audio, want.audio)


# Two threads decoding at once with Numba's parallel kernels on (OMNICORE_PARALLEL_KERNELS=1).
# Run in a child process: the failure mode is an abort of the whole process.
_PARALLEL_CHILD = r"""
import sys, threading
import numpy as np
from omnicore import OmniVoice
model = OmniVoice.from_pretrained(sys.argv[1])
codes = np.random.default_rng(0).integers(0, 1024, (8, 100))  # 4 s: arrays past the parallel threshold
want = model.codec.decode(codes)
barrier, errors = threading.Barrier(2, timeout=60), []
def decode_four_times():
    try:
        barrier.wait()
        for _ in range(4):
            got = model.codec.decode(codes)
            assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max(), "decode differs"
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=decode_four_times) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors or "ok")
sys.exit(1 if errors else 0)
"""


@pytest.mark.parametrize("layer", [
    None,
    "workqueue",  # Numba's fallback layer aborts on concurrent parallel regions
], ids=["default-layer", "workqueue"])
@pytest.mark.subprocess
def test_parallel_kernels_in_two_threads(layer):
    env = dict(os.environ, OMNICORE_PARALLEL_KERNELS="1")
    env.pop("NUMBA_THREADING_LAYER", None)
    if layer:
        env["NUMBA_THREADING_LAYER"] = layer
    run = subprocess.run([sys.executable, "-c", _PARALLEL_CHILD, str(TINY)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}: {(run.stdout + run.stderr)[-1500:]}"
