#!/usr/bin/env python3
"""The unmasking engine under concurrent load, on a full-size checkpoint (real shapes).

    python3 benchmarks/bench_engine.py [--model DIR] [--steps 8] [--threads 2] [--markdown FILE]

--model defaults to $OMNICORE_BENCH_MODEL, else checkpoints/full under the repository (build it
with `tools/reference/make_checkpoint.py --size full`). Greedy settings, fixed durations. Every
case runs in its own child process, so its peak RSS (ru_maxrss) is its own.

Cases (times are wall seconds of unmasking: generate_codes, no decode):
  fairness    a SHORT request submitted while a LONG one is generating (after its 2nd forward):
              the short one's latency vs on an idle engine, and the long one's slowdown
  throughput  4 concurrent MID requests: packed on the engine, one after another, and 4
              threads each running its own forward (unmasking.generate_codes: the code path
              before the engine)
  long text   a voice-prompt text of 4 chunks (5 s reference): packed (one request) vs chunk
              after chunk
"""

from __future__ import annotations

import argparse
import json
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
    steps = a.steps
    _codes(model, "Warm up.", 1.0, 1)
    t0 = time.perf_counter()
    _codes(model, SENTENCE, a.short_s, steps)
    short_idle = time.perf_counter() - t0
    t0 = time.perf_counter()
    _codes(model, SENTENCE * 3, a.long_s, steps)
    long_alone = time.perf_counter() - t0

    forwards, started = [0], threading.Event()

    def trace(ids):
        forwards[0] += 1
        if forwards[0] == 2:
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
    out["short"] = time.perf_counter() - t0
    th.join()
    model.engine.trace = None
    return {"short_idle": short_idle, "short_busy": out["short"], "long_alone": long_alone,
            "long_busy": out["long"]}


def case_throughput(model, a) -> dict:
    from omnicore import unmasking
    from omnicore.config import GenerationConfig
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

    packed = together(lambda i: _codes(model, texts[i], a.mid_s, steps))
    t0 = time.perf_counter()
    for t in texts:
        _codes(model, t, a.mid_s, steps)
    serial = time.perf_counter() - t0
    gen = GenerationConfig(num_step=steps, **GREEDY)
    items = [model.engine.prepare(PassSpec(t, int(a.mid_s * 25), None, None, None, None, None, gen))
             for t in texts]
    own = together(lambda i: unmasking.generate_codes(model.params, model.config, [items[i]], gen))
    return {"packed": packed, "serial": serial, "own_forwards": own}


def case_longtext(model, a) -> dict:
    import numpy as np

    from omnicore import VoiceClonePrompt
    from omnicore.config import GenerationConfig
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


CASES = {"fairness": case_fairness, "throughput": case_throughput, "longtext": case_longtext}


def child(a) -> None:
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
    p.add_argument("--long-s", type=float, default=15.0)
    p.add_argument("--mid-s", type=float, default=3.0)
    p.add_argument("--chunk-s", type=float, default=6.0)
    p.add_argument("--case", choices=sorted(CASES))
    p.add_argument("--only", nargs="*", default=sorted(CASES))
    p.add_argument("--markdown")
    a = p.parse_args()
    if a.case:
        return child(a)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads),
               NUMBA_NUM_THREADS=str(a.threads), PYTHONPATH=str(ROOT))
    res = {}
    for case in a.only:
        cmd = [sys.executable, __file__, "--case", case] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
            if k in ("model", "steps", "threads", "short_s", "long_s", "mid_s", "chunk_s")]
        print(f"running {case} ...", file=sys.stderr, flush=True)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            sys.exit(f"{case} failed:\n{out.stderr[-3000:]}")
        res[case] = json.loads(lines[-1][7:])
        print(case, res[case], file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    rows = ["| case | time | vs | ratio | peak RSS |", "|---|---|---|---|---|"]
    if "fairness" in res:
        f = res["fairness"]
        rows.append(f"| {a.short_s:g} s request while a {a.long_s:g} s one runs: latency | "
                    f"{f['short_busy']:.1f} s | idle engine {f['short_idle']:.1f} s | "
                    f"{f['short_busy'] / f['short_idle']:.2f}x | {f['rss_mb']:.0f} MB |")
        rows.append(f"| the {a.long_s:g} s request meanwhile | {f['long_busy']:.1f} s | alone "
                    f"{f['long_alone']:.1f} s | {f['long_busy'] / f['long_alone']:.2f}x | |")
    if "throughput" in res:
        t = res["throughput"]
        rows.append(f"| 4 concurrent {a.mid_s:g} s requests, packed on the engine | "
                    f"{t['packed']:.1f} s | one after another {t['serial']:.1f} s | "
                    f"{t['serial'] / t['packed']:.2f}x faster | {t['rss_mb']:.0f} MB |")
        rows.append(f"| the same, 4 threads each on its own forward (before the engine) | "
                    f"{t['own_forwards']:.1f} s | packed {t['packed']:.1f} s | "
                    f"{t['own_forwards'] / t['packed']:.2f}x slower | |")
    if "longtext" in res:
        lt = res["longtext"]
        rows.append(f"| voice-prompt text, {lt['chunks']} chunks of ~{a.chunk_s:g} s: packed | "
                    f"{lt['packed']:.1f} s | chunk after chunk {lt['one_by_one']:.1f} s | "
                    f"{lt['one_by_one'] / lt['packed']:.2f}x faster | {lt['rss_mb']:.0f} MB |")
    table = "\n".join(rows) + (f"\n\n{a.steps} steps, greedy, {a.threads} threads, "
                               f"load average {load:.1f} at the end.\n")
    print(table)
    if a.markdown:
        Path(a.markdown).write_text(table)


if __name__ == "__main__":
    main()
