#!/usr/bin/env python3
"""The unmasking engine under concurrent load, on a full-size checkpoint (real shapes).

    python3 benchmarks/bench_engine.py [--model DIR] [--steps 8] [--threads 2] [--long-s 30 15]
                                       [--only fairness throughput longtext] [--markdown FILE]

--model defaults to $OMNICORE_BENCH_MODEL, else checkpoints/full under the repository (build it
with `tools/reference/make_checkpoint.py --size full`). Greedy settings, fixed durations. Every
case runs in its own child process, so its peak RSS (ru_maxrss) is its own.

Cases (times are wall seconds of unmasking: generate_codes, no decode):
  fairness    for each --long-s: SHORT requests submitted while a LONG one is generating, one as
              its 3rd iteration starts (it waits for that whole iteration, in flight: the worst
              case), one half-way through a later iteration: each one's latency vs on an idle
              engine, and the long one's slowdown
  throughput  4 concurrent MID requests: packed on the engine, one after another, and 4
              threads each running its own forward (unmasking.generate_codes: the code path
              before the engine); per iteration of the packed and the serial runs: GFLOP
              (cost.forward_flops), median forward and iteration time, and the % of the numpy
              sgemm roofline (roofline.py: numpy's time for exactly those GEMMs)
  long text   a voice-prompt text of 4 chunks (5 s reference): packed (one request) vs chunk
              after chunk

On a small checkpoint (--small-model, default weights/tiny-random: tiny GEMMs, so the host's
per-iteration work is what a step costs, as on a GPU):
  host        1, 4 and 8 passes packed in one unmasking loop: per iteration, the time outside
              the forward (noise, scoring, picking and filling: one call each for all passes)
              and the forward's, medians over the steps; at --small-s and at 0.2 s (5 frames,
              where the per-cell arithmetic vanishes and per-pass overhead would show)
  concurrency 4 and 8 concurrent greedy requests on the engine against the same requests one
              after another (codes checked equal to each request alone); --busy N runs N
              `nice` busy loops beside it, to see the hand-offs under competition
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = os.environ.get("OMNICORE_BENCH_MODEL", str(ROOT / "checkpoints" / "full"))
GREEDY = {"position_temperature": 0.0, "class_temperature": 0.0}
SENTENCE = "The quick brown fox jumps over the lazy dog, then rests in the warm afternoon sun. "


def _load(args):
    sys.path.insert(0, str(ROOT))
    from omnicore import OmniVoice

    return OmniVoice.from_pretrained(args.model)


def _codes(model, text, seconds, steps, **kw):
    return model.generate_codes(text, duration=seconds, num_step=steps, **GREEDY, **kw)[0]


def case_fairness(model, a) -> dict:
    """The long request alone, then again with two short ones submitted during it: the first as
    its 3rd iteration starts (the worst case: it waits for that whole iteration), the second
    half-way through the iteration after the first one's end (the average wait)."""
    steps = a.steps
    _codes(model, "Warm up.", 1.0, 1)
    t0 = time.perf_counter()
    _codes(model, SENTENCE, a.short_s, steps)
    short_idle = time.perf_counter() - t0
    ends = []
    model.engine.trace = lambda ids: ends.append(time.perf_counter())
    t0 = time.perf_counter()
    _codes(model, SENTENCE * 3, a.long_s, steps)
    long_alone = time.perf_counter() - t0
    long_iteration = statistics.median(e - p for p, e in zip(ends, ends[1:]))

    ends.clear()
    started = threading.Event()

    def trace(ids):
        ends.append(time.perf_counter())
        if len(ends) == 2:
            started.set()

    model.engine.trace = trace
    out = {}

    def long_call():
        t = time.perf_counter()
        _codes(model, SENTENCE * 3, a.long_s, steps)
        out["long"] = time.perf_counter() - t

    th = threading.Thread(target=long_call)
    th.start()
    started.wait()
    t0 = time.perf_counter()
    _codes(model, SENTENCE, a.short_s, steps)
    out["worst"] = time.perf_counter() - t0
    time.sleep(max(0.0, ends[-1] + long_iteration / 2 - time.perf_counter()))
    t0 = time.perf_counter()
    _codes(model, SENTENCE, a.short_s, steps)
    out["mid"] = time.perf_counter() - t0
    th.join()
    model.engine.trace = None
    return {"short_idle": short_idle, "short_worst": out["worst"], "short_mid": out["mid"],
            "long_alone": long_alone, "long_busy": out["long"], "long_iteration": long_iteration}


class IterationLog:
    """Each engine iteration's forward time, rows and scored positions, and its end time."""

    def __init__(self, model):
        from omnicore.model import unmasking

        self.model, self.um, self.orig = model, unmasking, unmasking.forward_rows
        self.forwards, self.ends = [], []

    def __enter__(self):
        def forward_rows(params, cfg, ids, audio_mask, pack, num_out, **kw):
            t0 = time.perf_counter()
            out = self.orig(params, cfg, ids, audio_mask, pack, num_out, **kw)
            self.forwards.append((time.perf_counter() - t0, tuple(pack.lengths), int(sum(num_out))))
            return out

        self.um.forward_rows = forward_rows
        self.model.engine.trace = lambda ids: self.ends.append(time.perf_counter())
        return self

    def __exit__(self, *exc):
        self.um.forward_rows = self.orig
        self.model.engine.trace = None

    def summary(self) -> dict:
        """Over the iterations with the most common pack (the first one excluded: it follows
        the idle wait): GFLOP, median forward and iteration seconds, numpy's roofline seconds."""
        from roofline import sgemm_roofline_seconds

        from omnicore.model.cost import forward_flops

        its = [(f, e - p) for f, p, e in zip(self.forwards[1:], self.ends, self.ends[1:])]
        shape = statistics.mode((rows, heads) for (_, rows, heads), _ in its)
        same = [(f[0], it) for f, it in its if f[1:] == shape]
        cfg = self.model.config
        return {"rows": len(shape[0]), "tokens": sum(shape[0]), "iterations": len(same),
                "gflop": forward_flops(cfg, shape[0], [shape[1]]) / 1e9,
                "forward_s": statistics.median(f for f, _ in same),
                "iteration_s": statistics.median(it for _, it in same),
                "roofline_s": sgemm_roofline_seconds(self.model.params, cfg, shape[0], shape[1])}


def case_throughput(model, a) -> dict:
    from omnicore.model import unmasking
    from omnicore.model.config import GenerationConfig
    from omnicore.engine import PassSpec

    steps, n = a.steps, 4
    texts = [f"Request number {i}. " + SENTENCE for i in range(n)]
    _codes(model, "Warm up.", 1.0, 1)

    def together(fn):
        ths = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
        t0 = time.perf_counter()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        return time.perf_counter() - t0

    with IterationLog(model) as log_packed:
        packed = together(lambda i: _codes(model, texts[i], a.mid_s, steps))
    with IterationLog(model) as log_serial:
        t0 = time.perf_counter()
        for t in texts:
            _codes(model, t, a.mid_s, steps)
        serial = time.perf_counter() - t0
    gen = GenerationConfig(num_step=steps, **GREEDY)
    items = [model.engine.prepare(PassSpec(t, int(a.mid_s * 25), None, None, None, None, None, gen))
             for t in texts]
    own = together(lambda i: unmasking.generate_codes(model.params, model.config, [items[i]], gen))
    return {"packed": packed, "serial": serial, "own_forwards": own,
            "iter_packed": log_packed.summary(), "iter_serial": log_serial.summary()}


def case_longtext(model, a) -> dict:
    import numpy as np

    from omnicore import VoiceClonePrompt
    from omnicore.model.config import GenerationConfig
    from omnicore.engine import PassSpec

    prompt = VoiceClonePrompt(np.random.default_rng(0).integers(0, 1024, (8, 125)),
                              "A five second reference clip, read aloud.", 0.1)
    # The 4 passes a long text's plan makes (text.plan_synthesis), at a fixed length each.
    frames = int(a.chunk_s * 25)
    gen = GenerationConfig(num_step=a.steps, **GREEDY)
    specs = [PassSpec(f"Part {i} of the story. " + SENTENCE, frames, None, None, prompt.ref_text,
                      prompt.ref_audio_tokens, None, gen) for i in range(4)]
    model.engine.run([PassSpec("Warm up.", 25, None, None, None, None, None,
                               GenerationConfig(num_step=1))])
    t0 = time.perf_counter()
    model.engine.run(specs)
    packed = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in specs:
        model.engine.run([s])
    one_by_one = time.perf_counter() - t0
    return {"packed": packed, "one_by_one": one_by_one, "chunks": len(specs)}


def case_host(model, a) -> dict:
    """Per-iteration time outside the forward for 1, 4 and 8 packed passes (median)."""
    from omnicore.engine import PassSpec
    from omnicore.model import packed_unmasking as pu
    from omnicore.model.config import GenerationConfig
    from omnicore.model.unmasking import PassState

    gen = GenerationConfig(num_step=a.steps_small, **GREEDY)
    orig_fwd, orig_it = pu.forward_rows, pu.iterate
    fwd, its = [], []

    def forward_rows(*args, **kw):
        t0 = time.perf_counter()
        out = orig_fwd(*args, **kw)
        fwd.append(time.perf_counter() - t0)
        return out

    def iterate(*args, **kw):
        t0 = time.perf_counter()
        orig_it(*args, **kw)
        its.append(time.perf_counter() - t0)

    def run(items):  # the engine's loop without the engine: packed iterations, one cache
        states, cache = [PassState(it, gen, None, model.config) for it in items], pu.PackCache()
        for _ in range(gen.num_step):
            pu.iterate(model.params, model.config, states, cache)

    pu.forward_rows, pu.iterate = forward_rows, iterate
    out = {}
    try:
        # the requests' length, and 5 frames: per-cell work then vanishes, per-pass work shows
        for seconds in (a.small_s, 0.2):
            items = [model.engine.prepare(PassSpec(f"Request number {i}. " + SENTENCE,
                                                   round(seconds * 25), None, None, None, None,
                                                   None, gen)) for i in range(8)]
            for n in (1, 4, 8):
                run(items[:n])  # warm
                host, forward = [], []
                for _ in range(a.repeats):
                    fwd.clear(), its.clear()
                    run(items[:n])
                    host += [i - f for i, f in zip(its, fwd)]
                    forward += fwd
                out[f"{seconds:g}/{n}"] = {"host_ms": 1e3 * statistics.median(host),
                                           "forward_ms": 1e3 * statistics.median(forward)}
    finally:
        pu.forward_rows, pu.iterate = orig_fwd, orig_it
    return out


def case_concurrency(model, a) -> dict:
    """n concurrent greedy requests against the same n one after another (n = 4, 8), codes
    checked equal to each request alone; best of --repeats for each, and the median of the
    ratios of each concurrent run to the serial run before it."""
    import numpy as np

    texts = [f"Request number {i}. " + SENTENCE for i in range(8)]

    def call(i):
        return model.generate_codes(texts[i], duration=a.small_s, num_step=a.steps_small, **GREEDY)[0]

    call(0)  # warm
    out = {}
    for n in (4, 8):
        alone, serial, together = [call(i) for i in range(n)], [], []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            for i in range(n):
                call(i)
            serial.append(time.perf_counter() - t0)
            got = [None] * n
            ths = [threading.Thread(target=lambda i=i: got.__setitem__(i, call(i))) for i in range(n)]
            t0 = time.perf_counter()
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            together.append(time.perf_counter() - t0)
            if not all(np.array_equal(x, y) for x, y in zip(got, alone)):
                raise SystemExit("concurrent codes differ from each request alone")
        # paired: each concurrent run against the serial run just before it (the load drifts)
        out[str(n)] = {"serial": min(serial), "together": min(together),
                       "ratio": statistics.median(t / s for t, s in zip(together, serial))}
    return out


CASES = {"fairness": case_fairness, "throughput": case_throughput, "longtext": case_longtext,
         "host": case_host, "concurrency": case_concurrency}
SMALL_CASES = ("host", "concurrency")


def child(a) -> None:
    a.long_s = a.long_s[0]  # one fairness run per child
    if a.case in SMALL_CASES:
        a.model = a.small_model
    model = _load(a)
    res = CASES[a.case](model, a)
    res["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(res), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--short-s", type=float, default=2.0)
    p.add_argument("--long-s", type=float, nargs="+", default=[30.0, 15.0],
                   help="fairness: the long request's seconds, one run each")
    p.add_argument("--mid-s", type=float, default=3.0)
    p.add_argument("--chunk-s", type=float, default=6.0)
    p.add_argument("--small-model", default=str(ROOT / "weights" / "tiny-random"))
    p.add_argument("--small-s", type=float, default=3.0, help="host, concurrency: seconds per request")
    p.add_argument("--steps-small", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--busy", type=int, default=0,
                   help="run this many `nice` busy loops beside the cases (competing processes)")
    p.add_argument("--case", choices=sorted(CASES))
    p.add_argument("--only", nargs="*", default=sorted(CASES))
    p.add_argument("--markdown")
    a = p.parse_args()
    if a.case:
        return child(a)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads),
               NUMBA_NUM_THREADS=str(a.threads), PYTHONPATH=str(ROOT))
    runs = [(case, long_s) for case in a.only
            for long_s in (a.long_s if case == "fairness" else a.long_s[:1])]
    res = {}
    busy = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
            for _ in range(a.busy)]
    try:
        for case, long_s in runs:
            res[case, long_s] = _run_case(cmd_for(a, case, long_s), env, case)
    finally:
        for b in busy:
            b.kill()
    load = os.getloadavg()[0]
    print_table(a, res, load)


def cmd_for(a, case, long_s):
    return [sys.executable, __file__, "--case", case, f"--long-s={long_s}"] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
        if k in ("model", "steps", "threads", "short_s", "mid_s", "chunk_s", "small_model",
                 "small_s", "steps_small", "repeats")]


def _run_case(cmd, env, case):
    print(f"running {case} ...", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        sys.exit(f"{case} failed:\n{out.stderr[-3000:]}")
    r = json.loads(lines[-1][7:])
    print(case, r, file=sys.stderr, flush=True)
    return r


def print_table(a, res, load) -> None:
    rows = ["| case | time | vs | ratio | peak RSS |", "|---|---|---|---|---|"]
    for long_s in a.long_s if "fairness" in a.only else ():
        f = res["fairness", long_s]
        for key, when in (("short_worst", "as one of its iterations starts"),
                          ("short_mid", "half-way through one of its iterations")):
            rows.append(f"| {a.short_s:g} s request submitted during a {long_s:g} s one, {when}: "
                        f"latency | {f[key]:.1f} s | idle engine {f['short_idle']:.1f} s | "
                        f"{f[key] / f['short_idle']:.2f}x | {f['rss_mb']:.0f} MB |")
        rows.append(f"| the {long_s:g} s request meanwhile (both short ones; its iteration "
                    f"{f['long_iteration']:.1f} s) | {f['long_busy']:.1f} s | alone "
                    f"{f['long_alone']:.1f} s | {f['long_busy'] / f['long_alone']:.2f}x | |")
    if "throughput" in a.only:
        t = res["throughput", a.long_s[0]]
        rows.append(f"| 4 concurrent {a.mid_s:g} s requests, packed on the engine | "
                    f"{t['packed']:.1f} s | one after another {t['serial']:.1f} s | "
                    f"{t['serial'] / t['packed']:.2f}x faster | {t['rss_mb']:.0f} MB |")
        rows.append(f"| the same, 4 threads each on its own forward (before the engine) | "
                    f"{t['own_forwards']:.1f} s | packed {t['packed']:.1f} s | "
                    f"{t['own_forwards'] / t['packed']:.2f}x slower | |")
        for name, it in (("packed", t["iter_packed"]), ("one after another", t["iter_serial"])):
            rows.append(
                f"| one iteration, {name} ({it['rows']} rows, {it['tokens']} tokens, "
                f"{it['gflop']:.0f} GFLOP): {it['gflop'] / it['iteration_s']:.0f} GFLOP/s | "
                f"{it['iteration_s']:.2f} s (forward {it['forward_s']:.2f} s) | numpy sgemm "
                f"roofline {it['roofline_s']:.2f} s | {100 * it['roofline_s'] / it['iteration_s']:.0f} % "
                f"of roofline ({100 * it['roofline_s'] / it['forward_s']:.0f} % of the forward) | |")
    if "longtext" in a.only:
        lt = res["longtext", a.long_s[0]]
        rows.append(f"| voice-prompt text, {lt['chunks']} chunks of ~{a.chunk_s:g} s: packed | "
                    f"{lt['packed']:.1f} s | chunk after chunk {lt['one_by_one']:.1f} s | "
                    f"{lt['one_by_one'] / lt['packed']:.2f}x faster | {lt['rss_mb']:.0f} MB |")
    if "host" in a.only:
        h = res["host", a.long_s[0]]
        for seconds in (a.small_s, 0.2):
            for n in ("1", "4", "8"):
                r, one = h[f"{seconds:g}/{n}"], h[f"{seconds:g}/1"]
                rows.append(f"| small checkpoint, {n} packed passes of {seconds:g} s: one "
                            f"iteration outside the forward | {r['host_ms']:.2f} ms | forward "
                            f"{r['forward_ms']:.2f} ms | {r['host_ms'] / one['host_ms']:.2f}x "
                            f"of 1 pass | |")
    if "concurrency" in a.only:
        c = res["concurrency", a.long_s[0]]
        for n in ("4", "8"):
            rows.append(f"| small checkpoint, {n} concurrent greedy {a.small_s:g} s requests"
                        f"{f' beside {a.busy} busy loops' if a.busy else ''} | "
                        f"{c[n]['together']:.2f} s | one after another {c[n]['serial']:.2f} s | "
                        f"**{c[n]['ratio']:.2f}x** the serial time (median of paired runs) | |")
    table = "\n".join(rows) + (f"\n\n{a.steps} steps (small checkpoint: {a.steps_small}), greedy, "
                               f"{a.threads} threads, load average {load:.1f} at the end.\n")
    print(table)
    if a.markdown:
        Path(a.markdown).write_text(table)


if __name__ == "__main__":
    main()
