"""benchmarks/gpu/run.sh works before it ever meets a GPU: its --dry-run runs every step on the
CPU (tiny checkpoint, omnicore on the strict backend; the reference part is left out here, torch
is not a test dependency), and the report merges the sides' timings into one table."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "gpu" / "run.sh"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "gpu" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(shutil.which("timeout") is None, reason="run.sh needs coreutils' timeout")
def test_dry_run_runs_every_step_and_writes_the_table(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, NO_REFERENCE="1", BENCH_TESTS="refuse_what_cupy", BENCH_SECONDS="2", BENCH_STEPS="2",
               BENCH_BATCH="2", BENCH_ENCODE_SECONDS="1")
    env.pop("OMNICORE_BACKEND", None)
    proc = subprocess.run(["bash", str(RUN), "--dry-run", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = dict(line.split() for line in (out / "steps.txt").read_text().splitlines())
    assert steps == {"wheels": "0", "checkpoint": "0", "tests": "0", "omnicore": "0", "report": "0",
                     "omnicore_tf32": "0", "omnicore_bf16": "0", "omnicore_fp16": "0"}
    assert "1 passed" in (out / "tests.log").read_text()  # the equivalence step really ran pytest
    side = json.loads((out / "omnicore.json").read_text())
    assert side["backend"] == "strict" and side["errors"] == {}
    for key in ("generate", "decode", "encode", "throughput"):
        assert side[key]["median"] > 0, key
    assert side["generate"]["forward_count"] == 2  # one forward per step
    assert side["decode"]["samples"] == 2 * 24000 and side["encode"]["frames"] == 25
    assert side["throughput"]["passes"] == 1  # both requests packed into one pass
    # fp32 is the float64 forward's to float32 rounding; the profiles are within their format's
    assert side["precision"] == "fp32" and side["accuracy"]["logits_rel_err"] < 1e-4
    for name in ("tf32", "bf16", "fp16"):
        prof = json.loads((out / f"omnicore_{name}.json").read_text())
        assert prof["precision"] == name and prof["errors"] == {}, prof["errors"]
        assert 1e-4 < prof["accuracy"]["logits_rel_err"] < 0.1 and prof["accuracy"]["argmax_agree"] > 0.9
    table = (out / "table.md").read_text()
    for label in ("backbone step", "generate() 2.0 s @ 2 steps", "RTF", "decode", "encode",
                  "2 requests in one call", "peak GPU memory", "DRY RUN", "reference_float32: not run",
                  "| omnicore profile |", "| bf16 |", "| reference fp16 |"):
        assert label in table, label
    assert json.loads((out / "timings.json").read_text())["omnicore"]["steps"] == 2


def test_report_puts_the_sides_side_by_side(tmp_path):
    bench = _bench()

    def side(name, gen, fwd, dec, enc, packed, peak, **extra):
        return dict(side=name, seconds=10.0, steps=32, batch=8, encode_seconds=5.0, errors={},
                    generate={"median": gen, "forward_median": fwd, "forward_count": 32},
                    decode={"median": dec}, encode={"median": enc},
                    throughput={"median": packed, "passes": 1}, peak_gpu_mb=peak, load_s=1.0, **extra)

    (tmp_path / "omnicore.json").write_text(json.dumps(side("omnicore", 0.4, 0.010, 0.05, 0.1, 1.0, 3000.0,
                                                            backend="cupy")))
    (tmp_path / "reference_float32.json").write_text(json.dumps(side("reference", 0.8, 0.020, 0.1, 0.1, 4.0, 4000.0)))
    (tmp_path / "reference_float16.skipped").write_text("no time left")
    table = bench.report(tmp_path)
    rows = {line.split(" | ")[0].strip("| ").strip(): line for line in table.splitlines() if line.startswith("|")}
    assert rows["backbone step, 10.0 s target (median)"].endswith("| 0.50 |")
    assert "| 0.040 |" in rows["RTF 10.0 s @ 32"]  # 0.4 s for 10 s of audio
    assert "| 80.00 |" in rows["8 requests in one call, audio s per s"]  # 80 s of audio in 1 s
    assert "| 3.20 |" in rows["throughput vs 1 request (x)"]  # 80 / 25
    assert "reference_float16: not run (no time left)" in table
    assert "DRY RUN" not in table
    assert (tmp_path / "table.md").read_text().strip() == table.strip()
