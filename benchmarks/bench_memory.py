"""How much memory a machine needs: peak RSS of one process per use, at full size.

    python3 benchmarks/bench_memory.py --model checkpoints/full
    python3 benchmarks/bench_memory.py --model weights/tiny-random --cases load say   # a smoke run
    python3 benchmarks/bench_memory.py --cases load say --precision fp32 int8    # per precision

Each case runs in its own fresh process (so one case's peak cannot hide another's) and reports
`ru_maxrss`, the process's peak resident memory: weights, the BLAS and Numba runtimes and the
largest moment of the work together. Durations are fixed, so the text sets only the prompt.

    load     `OmniVoice.from_pretrained` alone: the backbone and the codec's decoder
    say      load + 10 s of auto voice (the `omnicore say` path, decode included)
    long     load + 60 s of auto voice: four 15 s chunks packed into each forward
    clone    load + a voice from the 9 s test clip (the codec's encoder half is read too)
             + 10 s in that voice
    stream   load + `stream()` of four sentences
    say-cold `say` with an empty kernel cache: the first run on a machine, compiling its kernels

The kernels are compiled first (`omnicore.machinery.warmup`, in a process of its own), so that every case
but say-cold measures the model, not the compiler. The step count does not change the peak
(every step has the same shapes), so `--steps` is kept small. Figures: docs/platforms.md and
benchmarks/README.md, "Memory".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("load", "say", "long", "clone", "stream", "say-cold")
TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs across the field to the "
        "river, where it stops to drink.")
LONG = " ".join([TEXT] * 6)
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"


def _child(model_dir: str, case: str, steps: int, precision: str) -> dict:
    from omnicore import OmniVoice

    t0 = time.perf_counter()
    model = OmniVoice.from_pretrained(model_dir, precision=precision)
    kw = dict(language="en", num_step=steps, seed=0)
    if case in ("say", "say-cold"):
        model.generate(TEXT, duration=10, **kw)
    elif case == "long":
        model.generate(LONG, duration=60, **kw)
    elif case == "clone":
        ref_text = (CLIP.parent / "speech.txt").read_text("utf-8").strip()
        voice = model.create_voice_clone_prompt(str(CLIP), ref_text=ref_text)
        model.generate(TEXT, voice_clone_prompt=voice, duration=10, **kw)
    elif case == "stream":
        for _ in model.stream(" ".join([TEXT] * 4), **kw):
            pass
    elif case == "warm-up":
        from omnicore.machinery.warmup import warm_up

        warm_up(model)
    return {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "seconds": time.perf_counter() - t0}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "full"))
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--steps", type=int, default=4, help="unmasking steps (default: %(default)s)")
    ap.add_argument("--precision", nargs="+", default=["fp32"],
                    help="precision profiles, each case in each (default: fp32)")
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print("| case | precision | peak RSS | time |\n|---|---|---:|---:|", flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def child(case: str, precision: str, extra_env=None) -> dict:
        done = subprocess.run([sys.executable, __file__, "--child", args.model, case,
                               str(args.steps), precision], capture_output=True, text=True,
                              env={**env, **(extra_env or {})}, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    for precision in args.precision:
        child("warm-up", precision)
    for case in args.cases:
        for precision in args.precision:
            if case == "say-cold":
                with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
                    res = child(case, precision, {"NUMBA_CACHE_DIR": cache})
            else:
                res = child(case, precision)
            print(f"| {case} | {precision} | {res['rss_mb']:,.0f} MB | {res['seconds']:.0f} s |",
                  flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
