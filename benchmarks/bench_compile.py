"""What the first run on a machine pays: Numba's kernel compile, per path, cold and warm.

    python3 benchmarks/bench_compile.py                                   # tiny checkpoint
    python3 benchmarks/bench_compile.py --model weights/tiny-random --model checkpoints/full
    python3 benchmarks/bench_compile.py --paths generate all --markdown compile.md
    python3 benchmarks/bench_compile.py --tree /tmp/old-checkout --tree .   # before and after

Each path runs in a fresh process twice: first with NUMBA_CACHE_DIR pointed at a new empty
folder (cold: every kernel the path calls is compiled and written there), then again with the
same folder (warm: every kernel loads from it). A process loads the model, then runs one path:

    generate  `generate()` of one sentence (the `omnicore say` path: unmasking, then decode)
    stream    `stream()` of two sentences (chunked, decoded in windows)
    clone     `create_voice_clone_prompt()` of the 9 s test clip (HuBERT + the DAC encoder)
    decode    `Codec.decode()` of 2 s of codes alone
    all       generate, stream, clone and decode in one process (what a server meets)
    warmup    omnicore's own warm-up (`omnicore warmup`), when the code has it

Compile seconds are Numba's own "numba:compile" events (outermost ones: a kernel compiling the
helpers it calls counts once), so they exclude the work itself; "kernels" is how many
dispatchers compiled. Load average is printed with the table: the figures are only comparable
on a quiet machine. `--tree` (repeatable) measures other checkouts of omnicore the same way,
each imported from its folder (`git worktree add /tmp/old REV`). Figures: benchmarks/README.md,
"First runs: kernel compile".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("generate", "stream", "clone", "decode", "all", "warmup")
TEXT = "Hello! This is OmniVoice running on numpy."
TWO = "Hello! This is OmniVoice running on numpy. It speaks more than six hundred languages."
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"


def _child(model_dir: str, path: str, steps: int) -> dict:
    """Runs inside the measured process: load, run `path`, report times and compiles."""
    t_import = time.perf_counter()
    import numpy as np
    from numba.core import event

    class Compiles(event.Listener):
        def __init__(self):
            self.depth, self.seconds, self.kernels, self.names = 0, 0.0, 0, {}

        def on_start(self, ev):
            if self.depth == 0:
                self.t0 = time.perf_counter()
            self.depth += 1

        def on_end(self, ev):
            self.depth -= 1
            if self.depth == 0:
                took = time.perf_counter() - self.t0
                self.seconds += took
                self.kernels += 1
                name = ev.data["dispatcher"].py_func.__qualname__
                seconds, times = self.names.get(name, (0.0, 0))
                self.names[name] = (seconds + took, times + 1)  # times > 1: specialisations

    compiles = Compiles()
    event.register("numba:compile", compiles)
    from omnicore import OmniVoice

    t0 = time.perf_counter()
    model = OmniVoice.from_pretrained(model_dir)
    load_s = time.perf_counter() - t0
    kw = dict(num_step=steps, seed=0)
    ref_text = (ROOT / "tests" / "fixtures" / "audio" / "speech.txt").read_text("utf-8").strip()
    runs = {
        "generate": lambda: model.generate(TEXT, **kw),
        "stream": lambda: list(model.stream(TWO, **kw)),
        "clone": lambda: model.create_voice_clone_prompt(str(CLIP), ref_text=ref_text),
        "decode": lambda: model.codec.decode(
            np.random.default_rng(0).integers(0, 1024, (8, 50))),
    }
    runs["all"] = lambda: [runs[p]() for p in ("generate", "stream", "clone", "decode")]
    runs["warmup"] = lambda: _warmup(model)
    compile_load = compiles.seconds  # kernels compiled while loading (the weight checks)
    t0 = time.perf_counter()
    runs[path]()
    return {"load_s": load_s, "run_s": time.perf_counter() - t0,
            "total_s": time.perf_counter() - t_import, "compile_s": compiles.seconds,
            "compile_load_s": compile_load, "kernels": compiles.kernels,
            "names": compiles.names}


def _warmup(model):
    try:  # not in every version of the code, nor in the same place
        import omnicore.machinery.warmup as warmup
    except ModuleNotFoundError:
        import omnicore.warmup as warmup

    warmup.warm_up(model)


def measure(model: str, path: str, steps: int, cache: str, tree: Path = ROOT) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, __file__, "--child", model, path, str(steps)],
                          capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode != 0:
        raise SystemExit(f"{path} on {model} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_arg(model: str) -> str:
    """A model folder given here as an absolute path (the measured processes run in their own
    checkout); a hub id as it is."""
    return str(Path(model).resolve()) if Path(model).exists() else model


def git_rev(tree: Path) -> str:
    """The checkout's short commit (its folder name outside git)."""
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() or tree.name


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append",
                    help="checkpoint folder (repeat for several; default: weights/tiny-random)")
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS[:5]))
    ap.add_argument("--steps", type=int, default=32, help="unmasking steps (default: %(default)s)")
    ap.add_argument("--names", action="store_true",
                    help="also list the kernels each path compiles, with their seconds (and xN "
                         "when one compiled for N signatures)")
    ap.add_argument("--tree", action="append", type=Path,
                    help="a checkout of omnicore to measure (repeat for several; default: this one)")
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    models = [model_arg(m) for m in args.model or [str(ROOT / "weights" / "tiny-random")]]
    trees = [t.resolve() for t in args.tree or [ROOT]]
    lines = ["| code | model | path | cold: compile s (kernels) | cold: load + run s "
             "| warm: compile s | warm: load + run s |", "|---|---|---|---:|---:|---:|---:|"]
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}", flush=True)
    for model, path, tree in ((m, p, t) for m in models for p in args.paths for t in trees):
        if path == "warmup" and not any((tree / "omnicore" / f).exists()
                                        for f in ("warmup.py", "machinery/warmup.py")):
            continue  # that version has no warm-up of its own
        with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
            cold = measure(model, path, args.steps, cache, tree)
            warm = measure(model, path, args.steps, cache, tree)
        row = (f"| {git_rev(tree)} | {Path(model).name} | {path} | "
               f"{cold['compile_s']:.1f} ({cold['kernels']}) | "
               f"{cold['load_s'] + cold['run_s']:.1f} | {warm['compile_s']:.1f} "
               f"({warm['kernels']}) | {warm['load_s'] + warm['run_s']:.1f} |")
        lines.append(row)
        print(row, flush=True)
        if args.names:
            names = sorted(cold["names"].items(), key=lambda kv: -kv[1][0])
            print("   ", ", ".join(f"{n} {s:.1f}" + (f" (x{k})" if k > 1 else "")
                                   for n, (s, k) in names), flush=True)
    load = os.getloadavg()
    lines.append(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(lines[-1].strip())
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n", "utf-8")


if __name__ == "__main__":
    main()
