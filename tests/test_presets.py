"""demo/presets.py: the plan an estimate reads, the arithmetic over it and the rate it follows.

How close the estimate comes to the clock is a property of the machine and its load, so it is
measured by benchmarks/bench_space.py (estimate beside the measured times), not asserted here.
What is tested is everything the estimate is made of: that `planned_work` plans exactly the passes,
steps and decode windows the pipeline then runs, that `estimate` adds them up as documented, that
the `Tracker` converges on what runs take, and that the preset chosen follows the rate.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from omnicore import OmniVoice
from omnicore.model import cost

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "demo"))

import presets  # noqa: E402

TEXT = ("The kettle clicked off just as the rain started drumming on the window. Please leave "
        "the parcel with the neighbour, at number twelve. Our train was late.")


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(str(ROOT / "weights" / "tiny-random"))


def _rate(**kw) -> presets.Rate:
    base = dict(forward_s=0.1, flops_per_s=1e11, decode_s=0.05, decode_frame_s=0.01,
                encode_s_per_s=0.2, measured_s=1.0)
    return presets.Rate(**{**base, **kw})


def test_one_piece_plan_is_what_synthesize_runs(model):
    work = presets.planned_work(model, TEXT, streamed=False, num_step=4)
    results = model.synthesize(TEXT, num_step=4, seed=3, position_temperature=0.0)
    assert not work.streamed and work.first_decode is None and work.chunks == 0
    assert [steps for steps, _ in work.forwards] == [4] * len(work.forwards)
    # One decode call per pass, of exactly the frames it generated.
    assert sum(work.decodes) == sum(r.codes.shape[1] for r in results)
    assert all(flops > 0 for _, flops in work.forwards)


def test_streamed_plan_is_what_the_stream_runs(model):
    work = presets.planned_work(model, TEXT, streamed=True, num_step=4)
    with model.stream(TEXT, num_step=4, seed=3, position_temperature=0.0) as stream:
        pieces = list(stream)
        stats = stream.chunk_stats
    assert pieces and work.streamed and work.first_decode == 0
    assert work.chunks == len(stats) == len(work.forwards)
    assert [steps for steps, _ in work.forwards] == [4] * len(stats)
    # Each chunk's frames cut into the stream's decode windows, each widened by the decoder's
    # receptive field on the sides it has neighbours.
    overlap = max(presets.decoder_receptive_field(model.codec.cfg))
    windows = [presets._windows(s["frames"], presets.STREAM_DECODE_FRAMES, overlap)
               for s in stats]
    assert list(work.decodes) == [w for ws in windows for w in ws]
    # Later chunks carry chunk 0 as their voice reference: each costs more than it alone would.
    alone = presets.planned_work(model, stats[-1]["text"], streamed=False, num_step=4)
    assert work.forwards[-1][1] > alone.forwards[0][1]


def test_a_clip_is_counted_by_its_length_not_encoded(model):
    sr = model.sampling_rate
    clip = (np.zeros(3 * sr, np.float32), sr)
    work = presets.planned_work(model, "Hello there.", streamed=False, ref_audio=clip,
                                ref_text="A reference clip.", num_step=2)
    assert work.clip_s == pytest.approx(3.0)
    plain = presets.planned_work(model, "Hello there.", streamed=False, num_step=2)
    assert work.forwards[0][1] > plain.forwards[0][1]  # the reference's frames join the rows


def test_estimate_adds_up_the_plan():
    rate = _rate()
    work = presets.Work(forwards=((8, 2 * 10**11), (8, 10**11)), decodes=(30, 90),
                        first_decode=None, clip_s=2.0, streamed=False)
    encode = 0.2 * 2.0
    forwards = 8 * (0.1 + 2.0) + 8 * (0.1 + 1.0)
    decodes = (0.05 + 0.3) + (0.05 + 0.9)
    assert presets.estimate(rate, work) == pytest.approx((encode + forwards + decodes,) * 2)
    streamed = presets.Work(work.forwards, work.decodes, 0, 2.0, True)
    first, total = presets.estimate(rate, streamed)
    assert first == pytest.approx(encode + 8 * 2.1 + 0.35)
    assert total == pytest.approx(encode + forwards + decodes)


def test_tracker_moves_halfway_and_converges():
    work = presets.Work(((8, 10**11),), (50,), None, 0.0, False)
    tracker = presets.Tracker(_rate())
    est = presets.estimate(tracker.rate, work)[0]
    unmask_s, decode_s = 8 * 1.1 * 4.0, 0.55 * 4.0  # the machine got 4x slower
    tracker.observe(work, unmask_s, decode_s)
    assert presets.estimate(tracker.rate, work)[0] == pytest.approx(2.0 * est)  # sqrt(4)
    for _ in range(20):
        tracker.observe(work, unmask_s, decode_s)
    assert presets.estimate(tracker.rate, work)[0] == pytest.approx(unmask_s + decode_s, rel=1e-4)
    before = tracker.rate
    tracker.observe(work, 0.0, decode_s)  # a run with nothing timed leaves the rate alone
    assert tracker.rate == before


def test_two_point_fit_stays_non_negative():
    assert presets._line([(1.0, 2.0), (3.0, 4.0)]) == pytest.approx((1.0, 1.0))
    # Noise that tilts the line downwards: the longer point alone sets the slope.
    assert presets._line([(1.0, 5.0), (3.0, 4.0)]) == pytest.approx((0.0, 4.0 / 3.0))
    assert presets._line([(2.0, 1.0), (2.0, 1.0)]) == pytest.approx((0.0, 0.5))


def test_the_preset_follows_the_rate(model):
    assert presets.default_preset(model, _rate(forward_s=0.0, flops_per_s=1e18, decode_s=0.0,
                                               decode_frame_s=0.0)) == "Best"
    assert presets.default_preset(model, _rate(forward_s=100.0)) == "Fast"  # none fits: fewest
    # A rate at which only Fast's first audio leaves the headroom.
    works = {name: [presets.planned_work(model, t, streamed=True, num_step=n)
                    for t in presets.TYPICAL_TEXTS] for name, n in presets.PRESETS.items()}
    flops = max(w.forwards[0][1] for ws in works.values() for w in ws)
    per_forward = presets.GOAL_S / presets.HEADROOM / (presets.PRESETS["Fast"] + 1)
    rate = _rate(forward_s=0.0, flops_per_s=flops / per_forward, decode_s=0.0, decode_frame_s=0.0)
    assert presets.default_preset(model, rate) == "Fast"
    fast = max(presets.estimate(rate, w)[0] for w in works["Fast"])
    balanced = max(presets.estimate(rate, w)[0] for w in works["Balanced"])
    assert fast * presets.HEADROOM <= presets.GOAL_S < balanced * presets.HEADROOM


def test_describe_says_what_the_estimate_is():
    rate = _rate()
    one = presets.Work(((8, 10**11),), (50,), None, 0.0, False)
    assert presets.describe(rate, one, 8).startswith("**About ")
    streamed = presets.Work(((8, 10**11), (8, 10**11)), (25, 40), 0, 0.0, True)
    text = presets.describe(rate, streamed, 8)
    assert "First audio in about" in text and "2 pieces" in text
    assert presets.describe(None, None, 8) == ""
    assert presets.describe(rate, one, 8, error="bad text").startswith("No estimate yet")
    assert presets.preset_of(8) == "Fast" and presets.preset_of(7) is None
    assert math.isclose(presets.PRESETS["Best"], 32)


def test_forward_flops_grow_with_the_rows(model):
    cfg = model.config
    assert cost.forward_flops(cfg, [100, 60], [60, 60]) > cost.forward_flops(cfg, [50, 30],
                                                                                      [30, 30])


def test_the_approximate_preset_is_the_fast_profile_and_costs_what_it_runs(model):
    """The Approximate preset sets the fast profile's own steps and profile, and back; its plan
    counts each forward at the rows the fast profile runs (cost.pass_flops): fewer FLOPs than
    exact at the same steps. The page's default is never the approximate one."""
    from omnicore.model.config import FAST_PROFILE, GenerationConfig

    steps, profile = presets.preset_settings(presets.APPROXIMATE)
    assert (steps, profile) == (FAST_PROFILE["num_step"], "fast")
    assert presets.preset_of(steps, "fast") == presets.APPROXIMATE
    assert presets.preset_of(steps, "exact") == "Balanced" and presets.preset_of(8, "fast") is None
    assert presets.preset_settings("Best") == (32, "exact")
    exact = presets.planned_work(model, TEXT, streamed=False, num_step=steps)
    fast = presets.planned_work(model, TEXT, streamed=False, num_step=steps, profile="fast")
    assert [s for s, _ in fast.forwards] == [s for s, _ in exact.forwards] == [steps]
    (_, e), = exact.forwards
    (_, f), = fast.forwards
    specs = model._passes(TEXT, language=None, ref_audio=None, ref_text=None,
                          voice_clone_prompt=None, instruct=None, duration=None, speed=None,
                          seed=None, on_step=None, generation_config=None,
                          normalize_text=False, gen_kwargs={"profile": "fast"})[2]
    item = model.engine.prepare(specs[0])
    P, T = item.input_ids.shape[1] - item.num_target, item.num_target
    assert f == cost.pass_flops(model.config, GenerationConfig.for_profile("fast"), P, T, True) // steps
    assert f < e
    assert presets.default_preset(model, _rate(forward_s=0.0, flops_per_s=1e18, decode_s=0.0,
                                               decode_frame_s=0.0)) in presets.PRESETS


def test_describe_says_when_the_machine_is_busy_and_how_long_it_may_take():
    """On a machine whose cores other work keeps busy, the line says so and how long the wait
    may be instead (a run gets a 1 / (1 + load) share of the cores); on a quiet one it is
    the plain estimate."""
    rate = _rate()
    one = presets.Work(((8, 10**11),), (50,), None, 0.0, False)
    streamed = presets.Work(((8, 10**11), (8, 10**11)), (25, 40), 0, 0.0, True)
    first, total = presets.estimate(rate, streamed)
    for load in (None, 0.3, presets.BUSY_LOAD):
        assert "busy" not in presets.describe(rate, one, 8, load=load)
    text = presets.describe(rate, one, 8, load=3.0)
    assert text.startswith("**About ") and "busy now (3.0 runnable processes per core)" in text
    assert f"up to {presets._seconds(presets.estimate(rate, one)[1] * 4)}" in text
    text = presets.describe(rate, streamed, 8, load=2.0)
    assert f"the first audio in up to {presets._seconds(first * 3)}" in text
    assert f"all of it in up to {presets._seconds(total * 3)}" in text
    assert presets.machine_load() is None or presets.machine_load() >= 0
