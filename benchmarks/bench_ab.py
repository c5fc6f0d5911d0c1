#!/usr/bin/env python3
"""Two checkouts of omnicore, timed side by side in one run: did a change cost speed?

    python3 benchmarks/bench_ab.py --before /tmp/old-checkout [--after .] [--model DIR]
                                   [--rounds 3] [--markdown FILE]

`bench_generate.py --quick`'s omnicore cases, through the public API only, so that any two
versions of the code can be measured (make the old one with `git worktree add /tmp/old REV`):

    generate 5 s / 10 s   generate() of a fixed duration, auto voice, 16 steps, greedy
    clone 5 s             the same with a voice prompt (made once per process, untimed)
    decode 10 s           Codec.decode of 250 frames of codes
    encode 5 s            Codec.encode of the 5 s test clip

Each round starts one fresh process per checkout, in the order before, after, after, before,
... (so that neither side always runs first). A process loads the model, makes one short untimed
call of each path (compiles, first touch of the weights), then times each case `--reps` times and
keeps its minimum. The table gives, per case, the median over rounds of those minimums and
after / before. The codes of both sides must be equal (the script checks: an A/B of a change
that should compute the same thing). "others" is the CPU the rest of the machine used during
the timed calls (100 % = one core busy): compare only runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_compile import git_rev, model_arg  # this folder is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
CASES = ("generate 5 s", "generate 10 s", "clone 5 s", "decode 10 s", "encode 5 s")
TEXT = {5: "The quick brown fox jumps over the lazy dog, then rests in the warm afternoon sun.",
        10: ("Every evening the keeper climbed the narrow stairs, counted the steps out loud, and "
             "lit the great lamp before the sun went down, while ships passed far out at sea.")}
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
GREEDY = dict(num_step=16, position_temperature=0.0, class_temperature=0.0)


def _busy_jiffies() -> tuple[int, int]:
    """(busy jiffies of the machine, of this process)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(vals) - vals[3] - vals[4], int(fields[11]) + int(fields[12])


def child(model_dir: str, reps: int) -> dict:
    """Inside the measured process: omnicore comes from PYTHONPATH (the checkout measured)."""
    import numpy as np
    import soundfile as sf

    import omnicore
    from omnicore import OmniVoice

    model = OmniVoice.from_pretrained(model_dir)
    wav, sr = sf.read(str(CLIP), dtype="float32")
    wav5 = wav[: 5 * sr] if len(wav) >= 5 * sr else np.pad(wav, (0, 5 * sr - len(wav)))
    ref_text = (CLIP.parent / "speech.txt").read_text("utf-8").strip()
    prompt = model.create_voice_clone_prompt(str(CLIP), ref_text=ref_text)
    codes10 = np.random.default_rng(0).integers(0, 1024, (8, 250))
    digest = hashlib.sha256()

    def gen(seconds, **kw):
        codes = model.generate_codes(TEXT[seconds], duration=float(seconds), **GREEDY, **kw)
        for c in codes:
            digest.update(np.ascontiguousarray(c, dtype=np.int64).tobytes())

    run = {
        "generate 5 s": lambda: gen(5),
        "generate 10 s": lambda: gen(10),
        "clone 5 s": lambda: gen(5, voice_clone_prompt=prompt),
        "decode 10 s": lambda: model.codec.decode(codes10),
        "encode 5 s": lambda: model.codec.encode(wav5, sr),
    }
    # untimed, each path once on a little input: compiles, the weights' first touch
    model.generate_codes(TEXT[5], duration=1.0, num_step=2)
    model.generate_codes(TEXT[5], duration=1.0, num_step=2, voice_clone_prompt=prompt)
    model.codec.decode(codes10[:, :25])
    model.codec.encode(wav5[:sr], sr)
    best, hz = {}, os.sysconf("SC_CLK_TCK")
    others = 0.0
    wall = 0.0
    for name in CASES:
        for _ in range(reps):
            j0 = _busy_jiffies()
            t0 = time.perf_counter()
            run[name]()
            took = time.perf_counter() - t0
            j1 = _busy_jiffies()
            others += max(0, (j1[0] - j0[0]) - (j1[1] - j0[1])) / hz
            wall += took
            best[name] = min(best.get(name, took), took)
    return {"times": best, "codes": digest.hexdigest(), "others": others / wall,
            "omnicore": str(Path(omnicore.__file__).parent)}


def measure(tree: Path, model: str, reps: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    for var in ("OPENBLAS_NUM_THREADS", "OMNICORE_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = str(threads)
    done = subprocess.run([sys.executable, __file__, "--child", model, str(reps)], cwd=tree,
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{tree} failed:\n{done.stderr[-3000:]}")
    res = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(res["omnicore"]).resolve() != (tree / "omnicore").resolve():
        raise SystemExit(f"{tree}: imported omnicore from {res['omnicore']}")
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the checkout before the change")
    ap.add_argument("--after", type=Path, default=ROOT, help="default: this checkout")
    ap.add_argument("--model", default=os.environ.get("OMNICORE_BENCH_MODEL",
                                                      str(ROOT / "checkpoints" / "full")))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2, help="timed calls per case and process")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    args.model = model_arg(args.model)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    order = []
    for r in range(args.rounds):
        order += ["before", "after"] if r % 2 == 0 else ["after", "before"]
    for side in order:
        res = measure(trees[side], args.model, args.reps, args.threads)
        runs[side].append(res)
        print(f"  {side}: " + ", ".join(f"{k} {v:.2f} s" for k, v in res["times"].items())
              + f" (others {100 * res['others']:.0f} %)", file=sys.stderr, flush=True)
    codes = {r["codes"] for side in runs.values() for r in side}

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    lines = [f"before {git_rev(trees['before'])}, after {git_rev(trees['after'])}; "
             f"{args.model}; {args.threads} threads; {args.rounds} rounds x {args.reps} reps; "
             f"load average {os.getloadavg()[0]:.1f}",
             "", "| case | before (s) | after (s) | after / before |", "|---|---:|---:|---:|"]
    for name in CASES:
        b = med([r["times"][name] for r in runs["before"]])
        a = med([r["times"][name] for r in runs["after"]])
        lines.append(f"| {name} | {b:.3f} | {a:.3f} | {a / b:.3f} |")
    oth = [r["others"] for side in runs.values() for r in side]
    lines += ["", f"codes equal on both sides: {'yes' if len(codes) == 1 else 'NO'}; "
              f"others {100 * min(oth):.0f}-{100 * max(oth):.0f} % of a core"]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    if len(codes) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
