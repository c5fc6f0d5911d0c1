#!/usr/bin/env python3
"""`omnicore batch --ray` against the local batch on one machine: items per hour, audio hours
per node-hour, peak memory per actor.

    python3 benchmarks/bench_ray.py [--model DIR] [--items 12] [--seconds 4] [--steps 32]
                                    [--markdown FILE] [--json FILE]

--model defaults to $OMNICORE_BENCH_MODEL, else checkpoints/full under the repository (build it
with `tools/reference/make_checkpoint.py --size full`). Needs the `ray` extra.

Configurations, each in its own child process (so that peak RSS is its own) on the same jobs
(--items auto-voice jobs of fixed --seconds each, greedy, --steps), outputs to a fresh folder:
  local       `omnicore batch` (one process, the machine's BLAS threads; the model's engine packs
              BATCH_IN_FLIGHT jobs)
  ray 1x2     --ray --workers 1 --threads-per-worker 2
  ray 2x1     --ray --workers 2 --threads-per-worker 1 (two models, one core each)
(The last two assume a 2-core machine; --layouts changes them, e.g. "1x4,2x2,4x1".)

Wall time runs from the command's start to its end, model loading included (a Ray run's actors
load in parallel), but not Ray's own start (a cluster is started once, not per batch).
items/h = items x 3600 / wall; audio h per node-h = audio seconds / wall seconds.
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
DEFAULT_MODEL = os.environ.get("OMNICORE_BENCH_MODEL", str(ROOT / "checkpoints" / "full"))
TEXT = ("Chapter {i}. The quick brown fox jumps over the lazy dog, then rests in the warm "
        "afternoon sun.")


def _write_jobs(folder: Path, items: int, seconds: float) -> Path:
    path = folder / "jobs.jsonl"
    path.write_text("".join(json.dumps({"id": f"item{i:03d}", "text": TEXT.format(i=i),
                                        "duration": seconds}) + "\n" for i in range(items)),
                    encoding="utf-8")
    return path


def child(a) -> None:
    """One configuration; prints its result as one JSON line."""
    sys.path.insert(0, str(ROOT))
    from omnicore.apps import cli, cluster

    jobs, out = a.jobs, a.out
    flags = ["--model", a.model, "--steps", str(a.steps), "--greedy", "--seed", "1", "-q"]
    result = {"config": a.child}
    if a.child == "local":
        t0 = time.perf_counter()
        rc = cli.main(["batch", jobs, "--out-dir", out, *flags])
        result["wall_s"] = time.perf_counter() - t0
        result["peak_rss"] = [cluster._peak_rss_bytes()]
    else:
        import ray

        workers, threads = (int(x) for x in a.child.split("x"))
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        args = cli.build_parser().parse_args(["batch", jobs, "--out-dir", out, "--ray", "--workers",
                                              str(workers), "--threads-per-worker", str(threads), *flags])
        t0 = time.perf_counter()
        summary = cli.batch.run_ray_batch(args)
        result["wall_s"] = time.perf_counter() - t0
        rc = 1 if summary["failed"] else 0
        result["peak_rss"] = [w["peak_rss"] for w in summary["workers"]]
        result["load_s"] = [round(w["load_s"], 1) for w in summary["workers"]]
        result["driver_rss"] = cluster._peak_rss_bytes()
        ray.shutdown()
    import soundfile as sf

    result["rc"] = rc
    wavs = list(Path(out).glob("*.wav"))
    result["items"] = len(wavs)
    result["audio_s"] = sum(sf.info(str(p)).duration for p in wavs)
    print(json.dumps(result), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--items", type=int, default=12)
    p.add_argument("--seconds", type=float, default=4.0, help="audio seconds per item")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--layouts", default="1x2,2x1", help="Ray WORKERSxTHREADS, comma-separated")
    p.add_argument("--markdown")
    p.add_argument("--json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--jobs", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"no checkpoint at {a.model}: pass --model DIR (tools/reference/make_checkpoint.py "
                 "--size full builds one)")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_ray.") as tmp:
        jobs = _write_jobs(Path(tmp), a.items, a.seconds)
        for config in ["local", *a.layouts.split(",")]:
            out = Path(tmp) / config
            cmd = [sys.executable, __file__, "--child", config, "--jobs", str(jobs), "--out",
                   str(out), "--model", a.model, "--steps", str(a.steps)]
            print(f"{config} ...", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
            if proc.returncode != 0 or not lines:
                sys.exit(f"{config} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            r = json.loads(lines[-1])
            r["items_per_h"] = r["items"] * 3600 / r["wall_s"]
            r["audio_h_per_node_h"] = r["audio_s"] / r["wall_s"]
            results.append(r)
            print(f"  {r}", file=sys.stderr, flush=True)
    rows = ["| configuration | items | audio s | wall s | items/h | audio h per node-h | peak RSS per process (GiB) |",
            "|---|---|---|---|---|---|---|"]
    for r in results:
        name = "local batch" if r["config"] == "local" else \
            "ray {} worker(s) x {} thread(s)".format(*r["config"].split("x"))
        rss = ", ".join(f"{x / 2**30:.2f}" for x in r["peak_rss"])
        rows.append(f"| {name} | {r['items']} | {r['audio_s']:.1f} | {r['wall_s']:.1f} | "
                    f"{r['items_per_h']:.0f} | {r['audio_h_per_node_h']:.3f} | {rss} |")
    table = "\n".join(rows)
    print(f"{a.items} items of {a.seconds:g} s, {a.steps} steps, greedy, model {a.model}, "
          f"{os.cpu_count()} CPUs\n\n{table}")
    if a.markdown:
        Path(a.markdown).write_text(table + "\n", encoding="utf-8")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
