#!/usr/bin/env python3
"""omnicore against the PyTorch reference and ONNX Runtime, side by side in one process, on the
full-size checkpoint.

    REF_VENV/bin/python benchmarks/bench_generate.py [--model DIR] [--onnx DIR] [--quick]
                                                     [--threads N] [--markdown FILE] [--json FILE]

Runs under the reference venv (REF_VENV: torch + omnivoice + onnxruntime) with omnicore imported
from this checkout. --model defaults to $OMNICORE_BENCH_MODEL, else checkpoints/full in the
repository. --onnx (default $OMNICORE_BENCH_ONNX, else the model folder's name + "-onnx") holds
that checkpoint's sub-models exported by tools/reference/export_onnx.py --external-data; without
them the ONNX Runtime column is left out (the table says so). Every side gets the same thread
count (torch.set_num_threads, OpenBLAS, MKL, Numba and ONNX Runtime's pools), the same texts,
fixed durations and greedy settings (position and class temperature 0), so they do exactly the
same work and must produce the same codes; the script checks that.

The ONNX Runtime column (onnx_side.py) is the reference's modules exported to ONNX in float32,
run by onnxruntime on the CPU and driven by omnicore's own unmasking loop and pipeline: only the
backbone forward (embeddings, decoder, heads) and the codec decode change hands. It has no
encoder (its encode line is empty).

Every timed line is warm: each side first makes one untimed call of generate, decode and encode
(loading, Numba compilation, first touch of the weights, omnicore's encoder half); those first
calls are reported as their own "first use" lines.

Lines of the table (the sides alternate; ratios = omnicore / the other side):
  backbone step    median over the forward passes of a real 5 s generate (cond + uncond rows),
                   with the GFLOP each side actually computes (the reference pads the
                   unconditional row to the conditional length and runs its heads on every
                   position), GFLOP/s, and % of the numpy sgemm roofline: the time numpy's
                   BLAS takes for exactly the GEMMs of that forward pass, measured here.
  scoring          per step: everything between two forward passes (guidance log-softmaxes,
                   token choice, cell selection, id updates).
  decode           codec decode of 10 s of codes; encode: a 5 s speech clip. With the GFLOP of
                   the codec's GEMMs (convolutions as im2col / polyphase GEMMs, HuBERT, RVQ),
                   GFLOP/s, % of the physical peak and % of the numpy sgemm roofline for those
                   GEMM shapes (roofline.codec_*_gemms).
  physical peak    cores x FMA units x fp32 SIMD lanes x 2 x clock of this machine, found at run
                   time (roofline.physical_peak; the line says how); GEMM-bound lines show their
                   GFLOP/s as % of it.
  generate         full generate() (prepare, unmask, decode, post-process) for 5 s and 10 s
                   targets at 32 and 16 steps; RTF = wall time / audio seconds.
  peak RSS         each side alone in a child process (`--only omnicore|reference|onnxruntime`)
                   generating 10 s of auto voice: ru_maxrss of that process.
Interference: for each measurement the script records the CPU time the *rest of the machine*
used during it (from /proc/stat, minus this process), shown as "others %" (100 % = one core
busy with other work the whole time). Measurements with others > 10 % are flagged.

--quick: fewer repeats, 16 steps only, no 10 s @ 32 case (about 8 minutes on 2 cores).
The full run takes about 12-15 minutes on the 2-core benchmark box.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path(os.environ.get("OMNICORE_BENCH_MODEL", ROOT / "checkpoints" / "full"))
SIDES = ("omnicore", "reference", "onnxruntime")
GREEDY = {"position_temperature": 0.0, "class_temperature": 0.0}
TEXTS = {  # fixed durations are used, so the texts only set the prompt length
    5: "The quick brown fox jumps over the lazy dog, then rests in the warm afternoon sun.",
    10: ("Every evening the keeper climbed the narrow stairs, counted the steps out loud, and "
         "lit the great lamp before the sun went down, while ships passed far out at sea."),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--onnx", type=Path, default=os.environ.get("OMNICORE_BENCH_ONNX"),
                    help="the checkpoint's ONNX sub-models (default: the model folder + '-onnx')")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profiles", action="store_true",
                    help="only the profiles table: fast against exact (and ONNX Runtime)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--markdown", type=Path, help="also write the result table here")
    ap.add_argument("--json", type=Path, help="also write raw numbers here")
    ap.add_argument("--only", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=32, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.onnx is None:
        args.onnx = args.model.with_name(args.model.name + "-onnx")
    return args


ARGS = parse_args()
# Thread pools are sized when their libraries load: set them before numpy/torch/numba import.
for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx_side  # noqa: E402
from roofline import (codec_decode_gemms, codec_encode_gemms, gemm_flops, physical_peak,  # noqa: E402
                      sgemm_roofline_seconds, sgemm_seconds)


# ---------------------------------------------------------------------------------------------
# Measurement helpers
# ---------------------------------------------------------------------------------------------


def _cpu_jiffies():
    """(busy jiffies of the whole machine, busy jiffies of this process incl. its threads)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    busy = sum(vals) - vals[3] - vals[4]  # minus idle and iowait
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    own = int(fields[11]) + int(fields[12])  # utime + stime (all threads)
    return busy, own


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Timer:
    """Wall time of a block plus the CPU the rest of the machine burnt meanwhile."""

    def __enter__(self):
        self.j0 = _cpu_jiffies()
        self.c0 = _children_cpu()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        busy, own = _cpu_jiffies()
        hz = os.sysconf("SC_CLK_TCK")
        children = _children_cpu() - self.c0  # a measured child process is not "others"
        others = max(0.0, ((busy - self.j0[0]) - (own - self.j0[1])) / hz - children)
        self.others = others / max(self.wall, 1e-9)  # cores' worth of foreign work
        return False


def median(xs):
    return float(np.median(np.asarray(xs, dtype=np.float64)))


# ---------------------------------------------------------------------------------------------
# The two sides, instrumented
# ---------------------------------------------------------------------------------------------


class OmnicoreSide:
    name = "omnicore"

    def __init__(self, model_dir):
        from omnicore.model import packed_unmasking

        onnx_side.install(packed_unmasking)  # before any hook below wraps forward_rows
        with Timer() as t:
            self.model = self.load(model_dir)
        self.load_s = t.wall
        self.um = packed_unmasking
        self.sr = self.model.sampling_rate

    def load(self, model_dir):
        from omnicore import OmniVoice

        return OmniVoice.from_pretrained(str(model_dir))

    def generate(self, text, seconds, steps, **extra):
        """-> (wall s, others, codes [8, T], forward times, scoring times, rows, heads positions,
        and per forward whether it ran a conditional row's targets alone: "reuse")."""
        um = self.um
        fwd, marks, info = [], [], {"reuse": []}
        orig_fwd, orig_it = um.forward_rows, um.iterate

        def forward_rows(params, cfg, ids, audio_mask, pack, num_out, **kw):
            t0 = time.perf_counter()
            out = orig_fwd(params, cfg, ids, audio_mask, pack, num_out, **kw)
            fwd.append((t0, time.perf_counter()))
            info["rows"], info["heads"] = list(pack.lengths), int(sum(num_out))
            info["reuse"].append(any(pack.offsets))
            return out

        # The engine thread runs every step as packed_unmasking.iterate (forward + scoring + fill):
        # the end of the last one ends the unmasking loop.
        def iterate(params, cfg, states, *a, **k):
            res = orig_it(params, cfg, states, *a, **k)
            marks.append(time.perf_counter())
            info["codes"] = states[0].codes()
            return res

        um.forward_rows, um.iterate = forward_rows, iterate
        try:
            with Timer() as t:
                self.model.generate(text, language="en", duration=seconds, num_step=steps,
                                    **GREEDY, **extra)
        finally:
            um.forward_rows, um.iterate = orig_fwd, orig_it
        return _step_stats(t, fwd, marks[-1], info)

    def decode(self, codes):
        return self.model.codec.decode(codes)

    def encode(self, wav):
        return self.model.codec.encode(wav, self.sr)


class OnnxRuntimeSide(OmnicoreSide):
    """omnicore's loop and pipeline with ONNX Runtime doing the model's arithmetic (onnx_side)."""

    name = "onnxruntime"

    def load(self, model_dir):
        return onnx_side.onnx_model(model_dir, ARGS.onnx, ARGS.threads)

    def encode(self, wav):
        return None  # no encoder export: the line stays empty


class ReferenceSide:
    name = "reference"

    def __init__(self, model_dir):
        import logging
        import warnings

        warnings.filterwarnings("ignore")
        import torch

        logging.disable(logging.WARNING)
        from omnivoice.models.omnivoice import OmniVoice

        torch.set_num_threads(ARGS.threads)
        self.torch = torch
        with Timer() as t:
            self.model = OmniVoice.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.load_s = t.wall
        self.sr = self.model.sampling_rate

    def generate(self, text, seconds, steps):
        m, fwd, marks, info = self.model, [], [], {}
        start = {}

        def pre(module, args, kwargs):
            start["t"] = time.perf_counter()
            ids = kwargs["input_ids"]
            info["rows"] = [ids.shape[2]] * ids.shape[0]  # padded: every row at the longest length
            info["heads"] = ids.shape[0] * ids.shape[2]  # heads run on every position

        def post(module, args, kwargs, out):
            fwd.append((start["t"], time.perf_counter()))

        orig_it = m._generate_iterative

        def it(task, cfg):
            res = orig_it(task, cfg)
            marks.append(time.perf_counter())
            info["codes"] = res[0].cpu().numpy().astype(np.int64)
            return res

        h1 = m.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = m.register_forward_hook(post, with_kwargs=True)
        m._generate_iterative = it
        try:
            with Timer() as t:
                m.generate(text, language="en", duration=seconds, num_step=steps, **GREEDY)
        finally:
            h1.remove()
            h2.remove()
            m._generate_iterative = orig_it
        return _step_stats(t, fwd, marks[-1], info)

    def decode(self, codes):
        with self.torch.inference_mode():
            c = self.torch.from_numpy(np.asarray(codes, np.int64))[None]
            return self.model.audio_tokenizer.decode(c).audio_values[0].numpy()

    def encode(self, wav):
        with self.torch.inference_mode():
            x = self.torch.from_numpy(np.asarray(wav, np.float32))[None, None]
            return self.model.audio_tokenizer.encode(x).audio_codes[0].numpy()


def _step_stats(t, fwd, end, info):
    starts = [a for a, _ in fwd] + [end]
    forward = [b - a for a, b in fwd]
    scoring = [starts[i + 1] - fwd[i][1] for i in range(len(fwd))]
    return {"wall": t.wall, "others": t.others, "codes": info["codes"], "forward": forward,
            "scoring": scoring, "rows": info["rows"], "heads": info["heads"],
            "reuse": info.get("reuse", [])}


# ---------------------------------------------------------------------------------------------
# Child mode: peak RSS of one side alone
# ---------------------------------------------------------------------------------------------


def child_main():
    side = {"omnicore": OmnicoreSide, "reference": ReferenceSide,
            "onnxruntime": OnnxRuntimeSide}[ARGS.only](ARGS.model)
    res = side.generate(TEXTS[10], ARGS.seconds, ARGS.steps)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rss_mb": rss_mb, "wall": res["wall"], "load_s": side.load_s,
                      "codes_sum": int(res["codes"].sum())}))


def peak_rss(which, steps):
    cmd = [sys.executable, __file__, "--only", which, "--model", str(ARGS.model),
           "--onnx", str(ARGS.onnx), "--threads", str(ARGS.threads), "--steps", str(steps),
           "--seconds", "10"]
    with Timer() as t:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    res["others"] = t.others
    return res


# ---------------------------------------------------------------------------------------------
# Main run
# ---------------------------------------------------------------------------------------------


def machine_description(threads):
    model = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    flags = open("/proc/cpuinfo").read()
    isa = "AVX-512" if " avx512f" in flags else ("AVX2" if " avx2" in flags else "SSE")
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # pragma: no cover - older numpy
        blas = "?"
    import torch

    torch_blas = "MKL" if torch.backends.mkl.is_available() else "?"
    try:
        import onnxruntime

        ort = f", onnxruntime {onnxruntime.__version__} (CPU)"
    except ImportError:
        ort = ""
    mem = int(open("/proc/meminfo").readline().split()[1]) / 2**20
    return (f"{model}, {os.cpu_count()} cores ({isa}), {mem:.0f} GiB RAM; {threads} threads per side; "
            f"Python {platform.python_version()}, numpy {np.__version__} ({blas}), "
            f"torch {torch.__version__} ({torch_blas}){ort}")


def ensure_checkpoint(path: Path):
    if (path / "model.safetensors").is_file():
        return
    print(f"building the full-size random checkpoint in {path} ...", flush=True)
    subprocess.run([sys.executable, str(ROOT / "tools/reference/make_checkpoint.py"), "--size", "full",
                    "--out", str(path)], check=True)


def timed_pairs(sides, fn, repeats):
    """fn(side) on every side, `repeats` times, rotating which side goes first: {name: [Timer]},
    {name: last result}."""
    times, last = {s.name: [] for s in sides}, {}
    for i in range(repeats):
        for side in sides[i % len(sides):] + sides[:i % len(sides)]:
            with Timer() as t:
                last[side.name] = fn(side)
            times[side.name].append(t)
    return times, last


# ---------------------------------------------------------------------------------------------
# --profiles: the fast profile against exact, and ONNX Runtime beside them
# ---------------------------------------------------------------------------------------------

PROFILE_CASES = (("exact, 32 steps", dict(num_step=32)), ("exact, 16 steps", dict(num_step=16)),
                 ("fast, 16 steps", dict(profile="fast")))
ORT_CASE = dict(num_step=16)  # ONNX Runtime's case: exact, at the fast profile's steps
GOALS = {"auto": 0.33, "clone": 0.25}  # fast's generate() as a share of exact-32's
STREAM_TEXT = ("Hello! This is OmniVoice running on numpy. It speaks more than six hundred "
               "languages.")  # the Space's first typical input


def first_audio(model, **kw):
    """(seconds to stream()'s first piece, seconds to its end, audio seconds)."""
    t0 = time.perf_counter()
    first, n = None, 0
    for piece in model.stream(STREAM_TEXT, language="en", seed=0, **GREEDY, **kw):
        first = first if first is not None else time.perf_counter() - t0
        n += len(piece)
    return first, time.perf_counter() - t0, n / model.sampling_rate


def profiles_main():
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    import soundfile as sf

    with open("/proc/loadavg") as f:
        load0 = f.read().strip()
    sides = [OmnicoreSide(ARGS.model)]
    if not onnx_side.missing_parts(ARGS.onnx):
        sides.append(OnnxRuntimeSide(ARGS.model))
    omni = sides[0]
    clip, sr = sf.read(ROOT / "tests/fixtures/audio/speech_24k.wav", dtype="float32")
    words = (ROOT / "tests/fixtures/audio/speech.txt").read_text().strip()
    clip = np.tile(clip, int(np.ceil(5 * sr / len(clip))))[:5 * sr]  # 5 s: the clip and a half
    prompt = omni.model.create_voice_clone_prompt((clip, sr), f"{words} {words}")
    voices = {"auto": {}, "clone": {"voice_clone_prompt": prompt}}
    for side in sides:  # first use: compile, first touch, the fast profile's paths
        side.generate(TEXTS[5], 1.0, 2)
        side.generate(TEXTS[5], 1.0, 3, profile="fast", prefix_refresh=2, uncond_every=2)
    res = {}
    for mode, voice in voices.items():
        for label, kw in PROFILE_CASES:
            for side in sides:
                if side.name == "onnxruntime" and kw != ORT_CASE:
                    continue  # exact at 16 steps (the export keeps no prompt cache)
                log(f"{mode}: {side.name} {label} ...")
                r = side.generate(TEXTS[5], 5.0, kw.get("num_step", 16), **voice,
                                  **{k: v for k, v in kw.items() if k != "num_step"})
                res[(mode, side.name, label)] = r
                log(f"  {r['wall']:.1f} s")
    log("stream() first audio ...")
    streams = {}
    for label, kw in (("exact, 32 steps", {}), ("Space's Fast preset (8 steps)", dict(num_step=8)),
                      ("fast, 16 steps", dict(profile="fast")),
                      ("Space's Fast preset with the fast profile (8 steps)",
                       dict(profile="fast", num_step=8))):
        streams[label] = first_audio(omni.model, **kw)
    with open("/proc/loadavg") as f:
        load1 = f.read().strip()
    report = profiles_report(res, streams, [s.name for s in sides], load0, load1)
    print(report)
    if ARGS.markdown:
        ARGS.markdown.write_text(report + "\n")


def profiles_report(res, streams, names, load0, load1):
    cols = [("omnicore", label) for label, _ in PROFILE_CASES] + \
        [("onnxruntime", label) for label, kw in PROFILE_CASES if kw == ORT_CASE and "onnxruntime" in names]
    head = "| line | " + " | ".join(f"{n} {label}" for n, label in cols) + " | fast / exact-32 | goal |"
    rows = [head, "|---" * (len(cols) + 3) + "|"]

    def line(name, vals, fmt, ratio=None, goal=""):
        cells = [fmt.format(v) if v is not None else "" for v in vals]
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {ratio or ''} | {goal} |")

    for mode in ("auto", "clone"):
        got = [res.get((mode, n, label)) for n, label in cols]
        walls = [r["wall"] if r else None for r in got]
        ratio = walls[2] / walls[0]
        goal = GOALS[mode]
        line(f"generate() {mode}, 5 s", walls, "{:.1f} s", f"{ratio:.2f}",
             f"<= {goal:.2f}: {'met' if ratio <= goal else 'missed'}")
        line("  RTF", [w / 5 if w else None for w in walls], "{:.2f}", f"{ratio:.2f}")
        line("  backbone step, median", [median(r["forward"]) * 1e3 if r else None for r in got],
             "{:.0f} ms")
        fast = res[(mode, "omnicore", "fast, 16 steps")]
        reuse = [t for t, u in zip(fast["forward"], fast["reuse"]) if u]
        refresh = [t for t, u in zip(fast["forward"], fast["reuse"]) if not u]
        exact_step = median(res[(mode, "omnicore", "exact, 32 steps")]["forward"])
        line("  fast: refresh step (conditional row whole)", [None, None, median(refresh) * 1e3]
             + [None] * (len(cols) - 3), "{:.0f} ms", f"{median(refresh) / exact_step:.2f} of an exact step")
        line("  fast: reuse step (targets alone)", [None, None, median(reuse) * 1e3]
             + [None] * (len(cols) - 3), "{:.0f} ms", f"{median(reuse) / exact_step:.2f} of an exact step")
        line("  unmasking steps: forwards (refresh + reuse)", [len(r["forward"]) if r else None for r in got],
             "{}")
    rows += ["", "| stream() of the Space's first typical input (auto voice) | first audio | "
             "all of it | audio |", "|---|---|---|---|"]
    for label, (first, total, audio) in streams.items():
        rows.append(f"| {label} | {first:.1f} s | {total:.1f} s | {audio:.1f} s |")
    rows += ["", f"Machine: {machine_description(ARGS.threads)}; load average before {load0}, "
             f"after {load1}. Greedy settings, fixed 5 s duration, the same text; clone: a voice "
             "prompt made once from a 5 s clip (the encode is not timed). fast = "
             "GenerationConfig.for_profile('fast'): 16 steps, the prompt's keys and values "
             "reused between refreshes every 8 steps, the unconditional pass every 3rd step. "
             "ONNX Runtime runs exact at 16 steps (its export keeps no prompt cache)."]
    return "\n".join(rows)


def main():
    if ARGS.only:
        return child_main()
    if ARGS.profiles:
        return profiles_main()
    ensure_checkpoint(ARGS.model)
    quick = ARGS.quick
    repeats = 2 if quick else 5
    cases = [(5, 16), (10, 16)] if quick else [(5, 32), (5, 16), (10, 32), (10, 16)]
    step_case = (5, 16) if quick else (5, 32)
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    missing = onnx_side.missing_parts(ARGS.onnx)
    with_onnx = not missing
    if missing:
        log(f"no ONNX Runtime column: {ARGS.onnx} lacks {', '.join(missing)} (export them with "
            "tools/reference/export_onnx.py --external-data)")
    names = [n for n in SIDES if with_onnx or n != "onnxruntime"]

    desc = machine_description(ARGS.threads)
    log(desc)
    with open("/proc/loadavg") as f:
        log("load before:", f.read().strip())

    # Peak RSS first, each side alone (nothing else of this script is resident yet).
    rss_steps = 16 if quick else 32
    log("peak RSS children ...")
    rss = {w: peak_rss(w, rss_steps) for w in names}

    omni = OmnicoreSide(ARGS.model)
    ref = ReferenceSide(ARGS.model)
    sides = [omni, ref] + ([OnnxRuntimeSide(ARGS.model)] if with_onnx else [])
    log("loaded: " + ", ".join(f"{s.name} {s.load_s:.1f} s" for s in sides))

    # Codec inputs (the same for every call, warm-up included)
    rng = np.random.default_rng(0)
    codes10 = rng.integers(0, 1024, (8, 250))
    import soundfile as sf

    clip, sr = sf.read(ROOT / "tests/fixtures/audio/speech_24k.wav", dtype="float32")
    assert sr == 24000
    clip = np.tile(clip, int(np.ceil(5 * sr / len(clip))))[:5 * sr]

    # First use, one untimed-for-the-table call per side and path: Numba compilation (or its
    # cache), first touch of the weights, omnicore's encoder half. Reported on their own lines.
    first = {}
    for side in sides:
        for what, call in (("generate", lambda: side.generate(TEXTS[5], 1.0, 2)),
                           ("decode", lambda: side.decode(codes10)),
                           ("encode", lambda: side.encode(clip))):
            with Timer() as t:
                call()
            first[(side.name, what)] = t.wall
    log("first use: " + ", ".join(f"{k[0]} {k[1]} {v:.2f} s" for k, v in first.items()))

    gens = {}
    for i, (sec, steps) in enumerate(cases):
        log(f"generate {sec} s @ {steps} steps ...")
        order = sides[i % len(sides):] + sides[:i % len(sides)]  # rotate which side runs first
        res = {side.name: side.generate(TEXTS[sec], sec, steps) for side in order}
        gens[(sec, steps)] = res
        log("  " + ", ".join(f"{n} {r['wall']:.1f} s" for n, r in res.items()) + ", codes equal "
            f"to the reference's: {[np.array_equal(r['codes'], res['reference']['codes']) for r in res.values()]}")

    # How reproducible are the reference's own codes? Rerun one case with a single torch
    # thread: on this random full-size checkpoint float32 rounding differences flip near-tied
    # cell choices, so even the reference does not reproduce itself bit for bit.
    log("reference at 1 thread (self-consistency) ...")
    ref.torch.set_num_threads(1)
    try:
        self_codes = ref.generate(TEXTS[5], 5, 16)["codes"]
    finally:
        ref.torch.set_num_threads(ARGS.threads)
    self_agree = float((self_codes == gens[(5, 16)]["reference"]["codes"]).mean())

    # Codec lines (warm: every side decoded and encoded once above)
    log("decode ...")
    dec, waves = timed_pairs(sides, lambda s: s.decode(codes10), repeats)
    dec_err = {n: float(np.abs(w - waves["reference"]).max() / np.abs(waves["reference"]).max())
               for n, w in waves.items() if n != "reference"}
    log("encode ...")
    encoders = [s for s in sides if s.name != "onnxruntime"]
    enc, codes = timed_pairs(encoders, lambda s: s.encode(clip), repeats)
    enc_agree = float((codes["omnicore"] == codes["reference"]).mean())

    # Roofline on the shapes of the step case (the ONNX column computes omnicore's shapes)
    from omnicore.machinery import checkpoint

    cfg = checkpoint.read_config(ARGS.model / "config.json")
    step = gens[step_case]
    from omnicore.model.higgs_codec import pad_to_hop
    from omnicore.model.cost import forward_flops

    flops = {n: forward_flops(cfg, r["rows"], [r["heads"]]) for n, r in step.items()}
    log("sgemm roofline ...")
    roof = {n: sgemm_roofline_seconds(omni.model.params, cfg, r["rows"], r["heads"])
            for n, r in step.items()}
    ccfg = omni.model.codec.cfg
    codec_gemms = {"decode": codec_decode_gemms(ccfg, codes10.shape[1]),
                   "encode": codec_encode_gemms(ccfg, len(pad_to_hop(clip, ccfg.hop_length)))}
    codec_roof = {k: (gemm_flops(v), sgemm_seconds(v)) for k, v in codec_gemms.items()}
    peak = physical_peak(ARGS.threads)

    report = build_report(desc, ARGS, names, gens, step_case, flops, roof, dec, dec_err, enc,
                          enc_agree, rss, {s.name: s.load_s for s in sides}, self_agree, first,
                          codec_roof, peak, missing)
    print(report)
    if ARGS.markdown:
        ARGS.markdown.write_text(report + "\n")
    if ARGS.json:
        raw = {f"{s}s@{n}": {side: {k: v for k, v in r.items() if k != "codes"}
                             for side, r in gens[(s, n)].items()}
               for s, n in gens}
        raw["rss"] = rss
        ARGS.json.write_text(json.dumps(raw, indent=1))
    with open("/proc/loadavg") as f:
        log("load after:", f.read().strip())


def build_report(desc, args, names, gens, step_case, flops, roof, dec, dec_err, enc, enc_agree,
                 rss, load_s, self_agree, first, codec_roof, peak, missing):
    rows = []
    flag = lambda *ts: " (!)" if max(t for t in ts) > 0.10 else ""  # noqa: E731
    others = [n for n in names if n != "omnicore"]

    def line(name, vals, unit, fmt="{:.1f}", ratio=True, oth=()):
        """vals: side -> value (a side without one gets an empty cell)."""
        cells = [f"{fmt.format(vals[n])} {unit}" if vals.get(n) is not None else "" for n in names]
        ratios = [f"{vals['omnicore'] / vals[n]:.2f}" if ratio and vals.get(n) and
                  vals.get("omnicore") is not None else "" for n in others]
        note = flag(*oth) if oth else ""
        rows.append(f"| {name}{note} | " + " | ".join(cells + ratios) + " |")

    def each(fn):
        return {n: fn(n) for n in names}

    step = gens[step_case]
    fwd = each(lambda n: median(step[n]["forward"]))
    sec, steps = step_case
    oth = [step[n]["others"] for n in names]
    line(f"backbone step, {sec} s target (median of {steps})", each(lambda n: fwd[n] * 1e3), "ms",
         oth=oth)
    line("  GFLOP computed per step", each(lambda n: flops[n] / 1e9), "")
    line("  GFLOP/s", each(lambda n: flops[n] / fwd[n] / 1e9), "")
    peak_gf, peak_how = peak
    if peak_gf:
        line("  % of the physical fp32 peak", each(lambda n: 100 * flops[n] / fwd[n] / 1e9 / peak_gf),
             "%", fmt="{:.0f}", ratio=False)
    line("  % of numpy sgemm roofline on its GEMMs", each(lambda n: 100 * roof[n] / fwd[n]), "%",
         fmt="{:.0f}", ratio=False)
    line("  numpy sgemm roofline for those GEMMs", each(lambda n: flops[n] / roof[n] / 1e9),
         "GFLOP/s", fmt="{:.0f}", ratio=False)
    line("scoring per step", each(lambda n: median(step[n]["scoring"]) * 1e3), "ms", fmt="{:.2f}",
         oth=oth)
    for what, runs in (("decode 10 s", dec), ("encode 5 s clip", enc)):
        t = {n: median([x.wall for x in r]) for n, r in runs.items()}
        line(what, t, "s", fmt="{:.2f}", oth=[x.others for r in runs.values() for x in r])
        gflop, rf = codec_roof[what.split()[0]]
        line("  GFLOP/s (codec GEMMs, the same for all)", {n: gflop / v / 1e9 for n, v in t.items()}, "")
        if peak_gf:
            line("  % of the physical fp32 peak", {n: 100 * gflop / v / 1e9 / peak_gf for n, v in t.items()},
                 "%", fmt="{:.0f}", ratio=False)
        line(f"  % of numpy sgemm roofline ({gflop / 1e9:.0f} GFLOP at {gflop / rf / 1e9:.0f} GFLOP/s)",
             {n: 100 * rf / v for n, v in t.items()}, "%", fmt="{:.0f}", ratio=False)
    for (s, n), res in gens.items():
        ref_codes = res["reference"]["codes"]
        def agree(codes):
            if np.array_equal(codes, ref_codes):
                return "identical"
            return f"{100 * float((codes == ref_codes).mean()):.1f} %"

        same = "; ".join(f"{side} {agree(r['codes'])}" for side, r in res.items() if side != "reference")
        line(f"generate() {s} s @ {n} steps (codes equal to the reference's: {same})",
             each(lambda k: res[k]["wall"]), "s", oth=[r["others"] for r in res.values()])
        line(f"  RTF {s} s @ {n}", each(lambda k: res[k]["wall"] / s), "", fmt="{:.2f}")
    line(f"peak RSS, auto voice 10 s @ {32 if not args.quick else 16} steps (own process)",
         each(lambda n: rss[n]["rss_mb"]), "MB", fmt="{:.0f}", oth=[r["others"] for r in rss.values()])
    blank = " |" * (len(names) + len(others) - 1)
    rows.append(f"| physical fp32 peak: {peak_how} | " + (f"{peak_gf:.0f} GFLOP/s" if peak_gf else "")
                + blank)
    line("first use: model load (both halves of the codec for the reference)", load_s, "s")
    for what, label in (("generate", "generate() 1 s @ 2 steps (compile, first touch)"),
                        ("decode", "decode 10 s"),
                        ("encode", "encode 5 s (omnicore loads its encoder half here)")):
        line(f"first use: {label}", {n: first[(n, what)] for n in names
                                     if not (n == "onnxruntime" and what == "encode")}, "s",
             fmt="{:.2f}")
    head = ["| line | " + " | ".join(names) + " | " + " | ".join(f"omnicore / {n}" for n in others) + " |",
            "|---" * (1 + len(names) + len(others)) + "|"]
    notes = [
        "",
        f"Machine: {desc}.",
        "Every timed line is warm (one untimed call per side and path first); the first calls are "
        "the 'first use' lines.",
        "Decode: max |side - reference| / max |reference| = "
        + ", ".join(f"{n} {e:.1e}" for n, e in dec_err.items())
        + f". Encode: {100 * enc_agree:.2f} % of omnicore's codes equal the reference's.",
        f"Generated codes: the reference itself, rerun with 1 torch thread instead of {args.threads} "
        f"(5 s @ 16 steps), reproduces {100 * self_agree:.1f} % of its own codes. On this random "
        "full-size checkpoint greedy unmasking is chaotic: any float32 rounding difference (here "
        "OpenBLAS against MKL and ONNX Runtime's own kernels; for the reference, its thread count, "
        "when MKL's sums depend on it) flips near-tied cell choices and the runs diverge, so the "
        "% equal above measures that, not a difference in what is computed (the tiny checkpoint's "
        "tests are token-exact).",
        "(!) = other processes used more than 10 % of a core during that measurement "
        f"(max seen: step {100 * max(oth):.0f} %).",
    ]
    if "onnxruntime" in names:
        notes.append("onnxruntime: the reference's modules exported in float32 "
                     "(tools/reference/export_onnx.py), run by ONNX Runtime on the CPU and driven "
                     "by omnicore's own loop (benchmarks/onnx_side.py); each row unpadded, heads on "
                     "the target frames: omnicore's FLOPs. It has no encoder export.")
    else:
        notes.append(f"No ONNX Runtime column: {args.onnx} lacks {', '.join(missing)}.")
    return "\n".join(head + rows + notes)


if __name__ == "__main__":
    main()
