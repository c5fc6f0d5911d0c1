"""The unmasking engine: a pass's codes do not depend on which passes share its forwards (token
exact on the tiny checkpoint across batch compositions, arrival orders and threads), callers in
several threads are packed into shared forwards, requests can be cancelled, and failures reach
the affected callers while the engine keeps serving."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from omnicore import OmniVoice, VoiceClonePrompt
from omnicore.text import limits, planner
from omnicore.model import cost, packed_unmasking, unmasking
from omnicore.model.config import GenerationConfig
from omnicore import engine as E
from omnicore.engine import Engine, PassSpec
from omnicore.errors import CancelledError, InputError

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"
INT16_STEP = 2.0 ** -15
GREEDY = GenerationConfig(num_step=5, position_temperature=0.0, class_temperature=0.0)
# Token-exact comparisons use deterministic decisions: the tiny checkpoint's weights keep greedy
# choices away from float ties, but a Gumbel draw (temperature > 0) can land within the rounding
# by which BLAS kernels' results move with a GEMM's row count, i.e. with the pack. (The seeds the
# passes below carry change nothing: every pass is greedy.)
GREEDY_7 = replace(GREEDY, num_step=7)
WAIT_S = 120


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


@pytest.fixture(scope="module")
def prompt():
    codes = np.random.default_rng(3).integers(0, 1024, (8, 30))
    return VoiceClonePrompt(codes, "A made up reference voice.", 0.05)


@pytest.fixture(scope="module")
def specs(model, prompt):
    """Passes that differ in every way a pack can mix: voice, length, steps, guidance."""
    p = prompt
    return [
        PassSpec("The first pass speaks in the automatic voice.", 40, "en", None, None, None, None,
                 GREEDY),
        PassSpec("A designed voice says this one.", 30, "en", "female, low pitch", None, None, 11,
                 GREEDY_7),
        PassSpec("A cloned voice reads a third line.", 35, None, None, p.ref_text,
                 p.ref_audio_tokens, 5, replace(GREEDY_7, num_step=4)),
        PassSpec("No guidance here.", 20, "en", None, None, None, 7,
                 replace(GREEDY_7, guidance_scale=0.0, num_step=6)),
    ]


@pytest.fixture(scope="module")
def alone(model, specs):
    """Each pass on its own, in the calling thread (no engine): the yardstick."""
    out = []
    for s in specs:
        item = Engine.prepare(model.engine, s)
        codes, steps = unmasking.generate_codes(model.params, model.config, [item], s.gen,
                                                seed=s.seed, return_fill_steps=True)
        out.append((codes[0], steps[0]))
    return out


def _fresh(model) -> Engine:
    return Engine(model.params, model.config, model.tokenizer)


def _assert_same(got, want):
    for (c, s), (wc, ws) in zip(got, want):
        np.testing.assert_array_equal(c, wc)
        np.testing.assert_array_equal(s, ws)


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]])
def test_one_request_packed_equals_each_alone(model, specs, alone, order):
    eng = _fresh(model)
    packs = []
    eng.trace = lambda ids: packs.append(len(ids))
    got = eng.run([specs[i] for i in order])
    _assert_same(got, [alone[i] for i in order])
    assert max(packs) == 4  # all four really shared forwards


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_staggered_arrivals_equal_each_alone(model, specs, alone, lag):
    """Requests join while others are mid-way (continuous batching): pass k arrives `lag`
    iterations after pass k-1, so every pass meets others at different steps."""
    eng = _fresh(model)
    tickets, seen = [], []
    lock = threading.Lock()

    def trace(ids):
        seen.append(sorted(set(ids)))
        with lock:
            if len(tickets) < len(specs) and len(seen) % max(lag, 1) == 0:
                tickets.append(eng.submit([specs[len(tickets)]]))  # from the engine thread itself

    eng.trace = trace
    with lock:
        tickets.append(eng.submit([specs[0]]))
    for t in list(tickets):
        t.result(timeout=WAIT_S)
    while len(tickets) < len(specs):  # the trace may submit the last ones after the first ended
        with lock:
            if len(tickets) < len(specs):
                tickets.append(eng.submit([specs[len(tickets)]]))
    got = [t.result(timeout=WAIT_S)[0] for t in tickets]
    _assert_same(got, alone)
    assert any(len(ids) >= 2 for ids in seen)


def test_requests_from_threads_equal_each_alone(model, specs, alone):
    eng = _fresh(model)
    barrier = threading.Barrier(len(specs), timeout=WAIT_S)
    results = [None] * len(specs)

    def call(i):
        barrier.wait()
        results[i] = eng.run([specs[i]])[0]

    for _ in range(2):
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(specs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        _assert_same(results, alone)


def test_two_generate_threads_share_forwards(model):
    """Callers in two threads are packed into one forward (that each still gets what it gets
    alone is test_concurrency's)."""
    texts = ("The first thread speaks this sentence.", "A second and rather different one!")
    kw = dict(num_step=6, seed=9, position_temperature=0.0)
    together = []
    model.engine.trace = lambda ids: together.append(len(set(ids)))
    try:
        got = []
        barrier = threading.Barrier(2, timeout=WAIT_S)

        def call(i):
            barrier.wait()
            got[i] = model.synthesize(texts[i], **kw)[0]

        for _ in range(5):  # two threads start within microseconds; retry if one finished first
            together.clear()
            got[:] = [None, None]
            threads = [threading.Thread(target=call, args=(i,)) for i in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT_S)
            assert all(g is not None for g in got)
            if max(together) == 2:
                break
        assert max(together) == 2, "the two calls never shared a forward"
    finally:
        model.engine.trace = None


def test_long_text_with_a_voice_prompt_runs_its_chunks_packed(model, prompt):
    text = " ".join(f"Sentence number {i} of a long text, read in a cloned voice." for i in range(12))
    kw = dict(voice_clone_prompt=prompt, num_step=3, seed=2, audio_chunk_threshold=5.0,
              audio_chunk_duration=4.0)
    packs = []
    model.engine.trace = lambda ids: packs.append(len(ids))
    try:
        out = model.synthesize(text, **kw)[0]
    finally:
        model.engine.trace = None
    n = len(out.text_chunks)
    assert n >= 3 and packs == [n] * 3  # every chunk in every forward
    # each chunk equals its pass alone
    plan = planner.plan_synthesis(text, prompt.ref_text, prompt.ref_audio_tokens.shape[1],
                            chunk_duration=4.0, chunk_threshold=5.0)
    gen = GenerationConfig(num_step=3)
    start = 0
    for k, chunk in enumerate(plan.chunks):  # chunk k draws from child k of the seed
        spec = PassSpec(chunk.text, chunk.frames, None, None, prompt.ref_text,
                        prompt.ref_audio_tokens, E.pass_seed(2, k), gen)
        (c, _), = _fresh(model).run([spec])
        np.testing.assert_array_equal(out.codes[:, start:start + chunk.frames], c)
        start += chunk.frames


def test_auto_long_text_waits_for_chunk_zero(model):
    text = " ".join(f"Line {i} of an auto voice text." for i in range(10))
    packs = []
    model.engine.trace = lambda ids: packs.append(len(ids))
    try:
        out = model.synthesize(text, num_step=2, seed=1, audio_chunk_threshold=4.0,
                               audio_chunk_duration=3.0)[0]
    finally:
        model.engine.trace = None
    n = len(out.text_chunks)
    assert n >= 3 and packs == [1, 1, n - 1, n - 1]  # chunk 0, then the rest together


def test_cancel_stops_one_request_and_not_the_others(model, specs, alone):
    eng = _fresh(model)
    long = replace(specs[0], frames=200, gen=replace(GREEDY, num_step=64))
    state = {"n": 0}
    victim = None

    def trace(ids):
        state["n"] += 1
        if state["n"] == 2:
            victim.cancel()

    eng.trace = trace
    with eng._cond:  # both join the same first iteration
        victim = eng.submit([long])
        other = eng.submit([specs[1]])
    with pytest.raises(CancelledError):
        victim.result(timeout=WAIT_S)
    _assert_same(other.result(timeout=WAIT_S), [alone[1]])
    assert state["n"] < 64  # the cancelled pass left early
    # cancelling before admission, and a callback that raises, both end the request
    t = eng.submit([long])
    t.cancel()
    with pytest.raises(CancelledError):
        t.result(timeout=WAIT_S)

    def stop(step, total):
        raise KeyboardInterrupt

    t = eng.submit([long], on_step=stop)
    with pytest.raises(KeyboardInterrupt):
        t.result(timeout=WAIT_S)
    assert t.cancelled()
    _assert_same(eng.run([specs[2]]), [alone[2]])


def test_failures_reach_the_callers_and_the_engine_keeps_running(model, specs, alone, monkeypatch):
    eng = _fresh(model)
    real = packed_unmasking.iterate
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemoryError("simulated")
        return real(*a, **k)

    monkeypatch.setattr(packed_unmasking, "iterate", flaky)
    t = eng.submit([specs[0]])
    with pytest.raises(MemoryError, match="simulated"):
        t.result(timeout=WAIT_S)
    _assert_same(eng.run([specs[1]]), [alone[1]])  # the same thread serves the next request
    assert eng._thread.is_alive()


def test_submit_checks_inputs_in_the_callers_thread(model, specs):
    eng = _fresh(model)
    with pytest.raises(InputError, match="working memory|positions"):
        eng.submit([replace(specs[0], frames=limits.MAX_PASS_FRAMES, text="x " * 4000)])
    with pytest.raises(InputError):
        eng.submit([])
    with pytest.raises(InputError):
        Engine(model.params, model.config, model.tokenizer, max_tokens=0)
    assert eng._thread is None  # nothing was queued


def test_token_budget_queues_passes_first_come_first_served(model, specs, alone):
    item_tokens = [sum(Engine.prepare(model.engine, s).input_ids.shape[1] for _ in (0,)) for s in specs]
    eng = Engine(model.params, model.config, model.tokenizer, max_tokens=2 * max(item_tokens) + 1)
    packs = []
    eng.trace = lambda ids: packs.append(sorted(ids))
    with eng._cond:
        tickets = [eng.submit([s]) for s in specs]
    _assert_same([t.result(timeout=WAIT_S)[0] for t in tickets], alone)
    assert max(len(p) for p in packs) < len(specs)
    assert packs[0] == [tickets[0].id, tickets[1].id] or packs[0] == [tickets[0].id]


LONG = PassSpec("A long request that keeps the engine busy for many steps. " * 2, 200, "en", None,
                None, None, None, replace(GREEDY, num_step=16))
SHORT = PassSpec("Short.", 15, "en", None, None, None, None, replace(GREEDY, num_step=8))


def _cost(model, spec) -> int:
    """The engine's per-iteration cost of a one-pass request (text.forward_flops of its rows)."""
    item = Engine.prepare(model.engine, spec)
    rows = [item.input_ids.shape[1]] + ([spec.frames] if spec.gen.guidance_scale else [])
    return cost.forward_flops(model.config, rows, [spec.frames] * len(rows))


def test_a_short_request_overtakes_a_long_one(model):
    """A short request arriving while a long one runs has its every iteration alone (its whole
    run costs less than the long one's hold); the long one resumes after it; both get exactly
    what they get alone."""
    assert SHORT.gen.num_step * _cost(model, SHORT) < E.HOLD * _cost(model, LONG)
    eng = _fresh(model)
    runs, tickets = [], {}

    def trace(ids):
        runs.append(sorted(set(ids)))
        if len(runs) == 3 and "short" not in tickets:
            tickets["short"] = eng.submit([SHORT])

    eng.trace = trace
    tickets["long"] = eng.submit([LONG])
    long_codes = tickets["long"].result(timeout=WAIT_S)[0][0]
    short_codes = tickets["short"].result(timeout=WAIT_S)[0][0]
    lid, sid = tickets["long"].id, tickets["short"].id
    assert runs == [[lid]] * 3 + [[sid]] * 8 + [[lid]] * 13, runs
    for spec, got in ((LONG, long_codes), (SHORT, short_codes)):
        item = Engine.prepare(model.engine, spec)
        want = unmasking.generate_codes(model.params, model.config, [item], spec.gen)[0]
        np.testing.assert_array_equal(got, want)


def test_a_long_request_is_held_back_at_most_its_bound(model):
    """Short requests one after another, without end while a long one runs: the long one still
    runs every step, and sits out at most while the others run HOLD times its per-iteration
    cost (plus the iteration that crosses it), then gets exactly what it gets alone."""
    long_spec = replace(LONG, gen=replace(GREEDY, num_step=5))
    eng = _fresh(model)
    runs, tickets = [], {"short": []}

    def trace(ids):
        runs.append(sorted(set(ids)))
        if not tickets["long"].done() and all(t.done() for t in tickets["short"]):
            tickets["short"].append(eng.submit([SHORT]))

    eng.trace = trace  # the first short one arrives after the long one's first iteration
    with eng._cond:  # (which waits for the lock: tickets["long"] is set before the trace runs)
        tickets["long"] = eng.submit([long_spec])
    long_codes = tickets["long"].result(timeout=WAIT_S)[0][0]
    for t in tickets["short"]:
        t.result(timeout=WAIT_S)
    lid = tickets["long"].id
    c_long, c_short = _cost(model, long_spec), _cost(model, SHORT)
    assert sum(lid in r for r in runs) == 5
    gaps, gap = [], 0
    for r in runs:
        if lid in r:
            gaps += [gap] if gap else []
            gap = 0
        else:
            assert len(r) == 1  # one short request at a time
            gap += c_short
    assert len(gaps) == 4, runs  # it sat out between each of its steps ...
    assert all(E.HOLD * c_long <= g < E.HOLD * c_long + c_short for g in gaps), runs  # ... its hold
    item = Engine.prepare(model.engine, long_spec)
    want = unmasking.generate_codes(model.params, model.config, [item], long_spec.gen)[0]
    np.testing.assert_array_equal(long_codes, want)


FULL_SIZE = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, num_hidden_layers=28)


@pytest.mark.parametrize("long_s, steps, long_joins", [(30, 8, 0), (30, 32, 1), (15, 8, 0),
                                                       (15, 32, 2)])
def test_schedule_at_full_size_costs(model, long_s, steps, long_joins):
    """The policy on the released model's dimensions: a 2 s request arriving during a 15 s or
    30 s one runs alone except for the long one's held iterations, which it shares; the long
    one keeps its place behind it. Rows are text + target (cond) and target (uncond)."""
    cfg = replace(model.config, llm_config=replace(model.config.llm_config, **FULL_SIZE))

    def flops(seconds, text_tokens):
        T_ = seconds * 25
        return cost.forward_flops(cfg, [text_tokens + T_, T_], [T_, T_])

    costs = [flops(long_s, 135), flops(2, 50)]
    left, held, packs = [steps - 2, steps], [0, 0], []  # the long one ran 2 steps alone
    while left[1]:
        live = [i for i in (0, 1) if left[i]]
        runs, h = E.schedule([costs[i] for i in live], [costs[i] * left[i] for i in live],
                             [held[i] for i in live])
        for i, run, hi in zip(live, runs, h):
            left[i] -= run
            held[i] = hi
        packs.append(tuple(i for i, run in zip(live, runs) if run))
    assert packs.count((0, 1)) == long_joins and packs.count((1,)) == steps - long_joins
    # equal requests share every forward (throughput); a cheaper one always joins the head
    assert E.schedule([5, 5, 5, 5], [40, 40, 40, 40], [0] * 4)[0] == [True] * 4
    assert E.schedule(costs, [costs[0], 20 * costs[1]], [0, 0])[0] == [True, True]


def test_load_counts_requests_passes_and_each_iterations_packed_tokens(model, specs, alone):
    """`load()` is a consistent snapshot: seen from the engine thread after every iteration
    (the trace) and polled from another thread, it counts the active and the queued requests
    and passes, and the tokens of exactly the rows that iteration packed."""
    items = [Engine.prepare(model.engine, s) for s in specs]
    tokens = {}  # request index -> packed tokens of its pass (conditional + unconditional row)
    for i, (s, it) in enumerate(zip(specs, items)):
        tokens[i] = it.input_ids.shape[1] + (it.uncond_ids.shape[1] if s.gen.guidance_scale else 0)
    eng = Engine(model.params, model.config, model.tokenizer,
                 max_tokens=2 * max(tokens.values()) + 1)  # two at a time: the others queue
    assert eng.load() == E.EngineLoad(0, 0, 0, 0, 0, 0)
    seen = []
    eng.trace = lambda ids: seen.append((sorted(set(ids)), eng.load()))
    polled, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            polled.append(eng.load())

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with eng._cond:
            tickets = [eng.submit([s]) for s in specs]
        _assert_same([t.result(timeout=WAIT_S)[0] for t in tickets], alone)
    finally:
        stop.set()
        poller.join(WAIT_S)
    # The trace of an iteration runs after its results are handed out: wait for the last one.
    deadline = time.monotonic() + WAIT_S
    while len(seen) < eng.load().iterations and time.monotonic() < deadline:
        time.sleep(0.01)
    index = {t.id: i for i, t in enumerate(tickets)}
    first_ids, first = seen[0]
    assert first.active_requests == first.active_passes == len(first_ids) < len(specs)
    assert first.waiting_requests == first.waiting_passes == len(specs) - len(first_ids)
    for n, (ids, ld) in enumerate(seen, 1):
        assert ld.iterations == n
        assert ld.last_tokens == sum(tokens[index[i]] for i in ids), (ids, ld)
    assert polled and all(ld.active_passes + ld.waiting_passes <= len(specs)
                          and ld.last_tokens <= eng.max_tokens for ld in polled)
    assert eng.load() == E.EngineLoad(0, 0, 0, 0, len(seen), seen[-1][1].last_tokens)


def test_progress_is_handed_over_without_the_engine_waiting(model, specs):
    """The engine never waits for the caller: every iteration of a request runs while nobody is
    in result(), and the caller, coming late (or with a slow callback), still sees every step
    once, in order."""
    eng = _fresh(model)
    spec = replace(specs[0], gen=replace(GREEDY, num_step=12))
    want = eng.run([spec])
    iterations = threading.Semaphore(0)
    eng.trace = lambda ids: iterations.release()
    seen = []
    t = eng.submit([spec], on_step=lambda step, total: seen.append((step, total)))
    for _ in range(12):  # every iteration runs while nobody is in result()
        assert iterations.acquire(timeout=WAIT_S)
    _assert_same(t.result(timeout=WAIT_S), want)
    assert seen == [(s, 12) for s in range(1, 13)]
    # a caller waiting from the start, with a slow callback
    seen.clear()
    t = eng.submit([spec], on_step=lambda step, total: (seen.append(step), threading.Event().wait(0.02)))
    _assert_same(t.result(timeout=WAIT_S), want)
    assert seen == list(range(1, 13)), seen
