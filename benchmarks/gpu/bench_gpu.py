#!/usr/bin/env python3
"""omnicore on CuPy against the reference on torch CUDA, side by side; driven by run.sh.

    python3 benchmarks/gpu/bench_gpu.py side omnicore  --model DIR --json OUT.json [sizes]
    python3 benchmarks/gpu/bench_gpu.py side reference --model DIR --json OUT.json --device cuda --dtype float32
    python3 benchmarks/gpu/bench_gpu.py report OUT_DIR        # table.md + timings.json from the sides

Each side runs in its own process (its own peak GPU memory, and a side that fails to load or
crashes leaves the others' numbers), one after the other in one run.sh invocation. The omnicore
side uses whatever OMNICORE_BACKEND says (cupy on the GPU; strict for the CPU dry run). Both
sides get the same texts, fixed durations and greedy settings, so they do the same work.

Lines (per side; ratio = omnicore / reference float32):
  backbone step     median forward pass (cond + uncond rows) during generate() of a `seconds`
                    target, device synchronised before and after each pass
  generate()        wall time of generate() for `seconds` at `steps` steps, and RTF = wall / seconds
  decode / encode   codec decode of `seconds` of random codes; encode of an `encode_seconds` clip
  8 packed          `batch` requests of `seconds` each in one call (packed into one forward per
                    step when memory allows; the number of passes is reported): audio seconds
                    per wall second, and that throughput against one request's
  peak GPU memory   omnicore: the CuPy pool's peak use; reference: torch.cuda.max_memory_allocated
                    (neither counts the CUDA context)
  accuracy          omnicore (--precision: every profile run.sh asks for, one side each): the
                    logits of one forward against a float64 forward of the same checkpoint on
                    the host (`forward_f64`): max relative error and argmax agreement
Every measurement is written to the side's JSON as soon as it is taken; a time budget (--budget-s)
cuts repeats short so that run.sh's 8 minutes hold.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
GREEDY = {"position_temperature": 0.0, "class_temperature": 0.0}
TEXT = ("Every evening the keeper climbed the narrow stairs, counted the steps out loud, and "
        "lit the great lamp before the sun went down, while ships passed far out at sea.")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("side")
    s.add_argument("which", choices=["omnicore", "reference"])
    s.add_argument("--model", type=Path, required=True)
    s.add_argument("--json", type=Path, required=True)
    s.add_argument("--device", default="cuda", help="reference: torch device")
    s.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="reference dtype")
    s.add_argument("--seconds", type=float, default=10.0)
    s.add_argument("--steps", type=int, default=32)
    s.add_argument("--encode-seconds", type=float, default=5.0)
    s.add_argument("--batch", type=int, default=8)
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--budget-s", type=float, default=150.0)
    s.add_argument("--generate-only", action="store_true", help="skip codec lines (float16 reference)")
    s.add_argument("--precision", default="fp32", help="omnicore: the precision profile")
    s.add_argument("--accuracy-seconds", type=float, default=4.0,
                   help="omnicore: target length of the logits-vs-float64 line")
    r = sub.add_parser("report")
    r.add_argument("out", type=Path)
    return ap.parse_args(argv)


class Side:
    """Measurements of one side, saved to JSON after each one."""

    def __init__(self, args):
        self.args = args
        self.t_start = time.perf_counter()
        self.res = {"side": args.which, "seconds": args.seconds, "steps": args.steps,
                    "batch": args.batch, "encode_seconds": args.encode_seconds,
                    "model": str(args.model), "errors": {}, "python": platform.python_version()}

    def save(self):
        self.args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.res, indent=1))
        tmp.replace(self.args.json)

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t_start)

    def measure(self, name, fn, repeats=None):
        """Run fn() up to `repeats` times (at least once) while the budget lasts; store the
        wall times (and whatever fn returns, last call) under `name`. A failure is recorded."""
        walls, extra = [], None
        try:
            for i in range(repeats or self.args.repeats):
                if i and self.left() < 2 * max(walls):
                    break
                self.sync()
                t0 = time.perf_counter()
                extra = fn()
                self.sync()
                walls.append(time.perf_counter() - t0)
            self.res[name] = {"walls": walls, "median": float(np.median(walls))}
            if isinstance(extra, dict):
                self.res[name].update(extra)
        except Exception:  # one failed line must not lose the others
            self.res["errors"][name] = traceback.format_exc(limit=4)[-2000:]
        self.save()

    def sync(self):
        pass


# ---------------------------------------------------------------------------------------------
# omnicore
# ---------------------------------------------------------------------------------------------


class OmnicoreSide(Side):
    def __init__(self, args):
        super().__init__(args)
        from omnicore.machinery import settings
        from omnicore.model import backend
        from omnicore_testing import transfers

        settings.configure()
        transfers.start()
        self.backend, self.transfers = backend, transfers
        self.res["backend"] = backend.name()
        self.peak = None
        if backend.name() == "cupy":
            import cupy

            pool = cupy.cuda.MemoryPool()
            peak = {"bytes": 0}

            def malloc(n):  # the pool's peak use, weights included
                mem = pool.malloc(n)
                peak["bytes"] = max(peak["bytes"], pool.used_bytes())
                return mem

            cupy.cuda.set_allocator(malloc)
            self.peak = peak
            self._sync = cupy.cuda.runtime.deviceSynchronize
            props = cupy.cuda.runtime.getDeviceProperties(0)
            self.res["device"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            self.res["versions"] = {"cupy": cupy.__version__, "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion()}
        else:
            self._sync = None
            self.res["device"] = f"CPU ({backend.name()} backend)"
        self.res["versions"] = dict(self.res.get("versions", {}), numpy=np.__version__)

    def sync(self):
        if self._sync is not None:
            self._sync()

    def run(self):
        from omnicore import OmniVoice
        from omnicore.model import packed_unmasking

        a = self.args
        t0 = time.perf_counter()
        self.model = m = OmniVoice.from_pretrained(str(a.model), precision=a.precision)
        self.res["precision"] = a.precision
        self.sync()
        self.res["load_s"] = time.perf_counter() - t0
        self.save()
        um = packed_unmasking
        fwd = []
        orig = um.forward_rows

        host, tokens = [], []

        def forward_rows(*args, **kw):  # every forward pass, synchronised
            self.sync()
            t = time.perf_counter()
            out = orig(*args, **kw)
            host.append(time.perf_counter() - t)  # host time to launch it: ~fwd when launch-bound
            self.sync()
            fwd.append(time.perf_counter() - t)
            tokens.append(int(args[2].shape[1]))  # ids [C, N]
            return out

        um.forward_rows = forward_rows
        try:
            t0 = time.perf_counter()  # warm-up: kernel compilation, first touches
            m.generate(TEXT, language="en", duration=1.0, num_step=2, **GREEDY)
            self.res["warmup_s"] = time.perf_counter() - t0
            self.save()

            def gen():
                fwd.clear(), host.clear(), tokens.clear()
                before = self.transfers.transfer_total()
                t = time.perf_counter()
                m.generate(TEXT, language="en", duration=a.seconds, num_step=a.steps, **GREEDY)
                self.sync()
                wall = time.perf_counter() - t
                return {"forward_median": float(np.median(fwd)), "forward_count": len(fwd),
                        "forward_host_median": float(np.median(host)), "forward_tokens": max(tokens),
                        "outside_forward_per_step": (wall - sum(fwd)) / max(len(fwd), 1),
                        "transfers": self.transfers.transfer_total() - before}

            self.measure("generate", gen)
            n_tok = (self.res.get("generate") or {}).get("forward_tokens")
            if n_tok:
                self.res["step_gflop"] = self._step_gflop(n_tok)
            self.measure("throughput", lambda: self._packed(a), repeats=1)
            self.measure("accuracy", self.accuracy, repeats=1)
        finally:
            um.forward_rows = orig
        if not a.generate_only:
            codes = np.random.default_rng(0).integers(0, 1024, (8, round(a.seconds * 25)))
            self.measure("decode", lambda: {"samples": int(m.codec.decode(codes).shape[-1])})
            clip = _clip(a.encode_seconds)
            self.measure("encode", lambda: {"frames": int(m.codec.encode(clip, 24000).shape[-1])})
        self.res["graphs"] = self.backend.graph_stats()
        if self.peak is not None:  # the graphs' own pools come on top of the main pool
            self.res["peak_gpu_mb"] = (self.peak["bytes"] + self.res["graphs"]["pool_bytes"]) / 2**20
        self.res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.save()

    def _step_gflop(self, n):
        """GFLOP of the projection and head GEMMs of one forward pass over n packed tokens
        (attention and element-wise work left out; the heads on about half the tokens, the
        target frames of the cond and uncond rows)."""
        p = self.model.params
        flops = sum(2 * n * w.shape[0] * w.shape[1] for lp in p.layers
                    for w in (lp.q_proj, lp.k_proj, lp.v_proj, lp.o_proj, lp.gate_proj, lp.up_proj, lp.down_proj))
        flops += 2 * (n // 2) * p.audio_heads.shape[0] * p.audio_heads.shape[1]
        return flops / 1e9

    def _packed(self, a):
        eng = self.model.engine
        before = eng.iterations
        self.model.generate_codes([TEXT] * a.batch, language="en", duration=a.seconds, num_step=a.steps,
                                  **GREEDY)
        return {"passes": (eng.iterations - before) // a.steps}  # forwards per step

    def accuracy(self):
        """The backbone's logits (conditional and unconditional rows, all-MASK targets: a
        first step) in this profile against a float64 forward of the same checkpoint on the
        host: max |diff| / max |float64|, and the share of cells whose argmax agrees."""
        from omnicore.engine import PassSpec
        from omnicore.model import backbone
        from omnicore.model.config import GenerationConfig

        m, a = self.model, self.args
        T = max(1, round(a.accuracy_seconds * 25))
        item = m.engine.prepare(PassSpec(TEXT, T, "en", None, None, None, None,
                                         GenerationConfig(**GREEDY)))
        rows = [(item.input_ids, item.audio_mask), (item.uncond_ids, item.uncond_audio_mask)]
        ids = np.concatenate([r[0] for r in rows], axis=1)
        mask = np.concatenate([r[1] for r in rows])
        pack = backbone.make_packing([r[0].shape[1] for r in rows], m.config)
        got = [self.backend.to_numpy(x) for x in backbone.forward_rows(
            m.params, m.config, self.backend.to_device(ids), self.backend.to_device(mask), pack, [T, T])]
        want = [forward_f64(a.model / "model.safetensors", m.config, r[0], r[1], T) for r in rows]
        err = max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want))
        agree = float(np.mean([np.mean(g.argmax(-1) == w.argmax(-1)) for g, w in zip(got, want)]))
        return {"logits_rel_err": err, "argmax_agree": agree, "cells": 2 * m.config.num_audio_codebook * T}


def forward_f64(path, cfg, ids, audio_mask, T, states=None):
    """Float64 oracle of one row on the host, straight from the checkpoint file: [C, T, V]
    logits of its last T positions (the model's definition, nothing shared with omnicore's
    float32 code but the file reader). `states`: a list that gets the embeddings and the
    residual stream after each layer ([L, D] float64 each), when given."""
    from omnicore.machinery.checkpoint import SafetensorsFile

    q = cfg.llm_config
    C, V, D, E = cfg.num_audio_codebook, cfg.audio_vocab_size, q.hidden_size, q.head_dim
    H, K, eps = q.num_attention_heads, q.num_key_value_heads, q.rms_norm_eps
    ids, audio_mask = np.asarray(ids), np.asarray(audio_mask, bool)
    L = ids.shape[1]
    with SafetensorsFile(path) as st:
        def w(key):
            return st.read(key).astype(np.float64)

        x = np.zeros((L, D))
        x[~audio_mask] = st.read_rows("llm.embed_tokens.weight", ids[0, ~audio_mask]).astype(np.float64)
        table = w("audio_embeddings.weight")
        x[audio_mask] = sum(table[ids[c, audio_mask] + c * V] for c in range(C))
        inv = 1.0 / q.rope_theta ** (np.arange(0, E, 2) / E)
        ang = np.arange(L)[:, None] * inv[None, :]
        cos, sin = (f(np.concatenate([ang, ang], 1))[:, None, :] for f in (np.cos, np.sin))  # [L, 1, E]
        if states is not None:
            states.append(x.copy())

        def rms(v, g):
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

        def rope(t):  # half-split rotation
            return t * cos + np.concatenate([-t[..., E // 2:], t[..., :E // 2]], -1) * sin

        for i in range(q.num_hidden_layers):
            p = f"llm.layers.{i}."
            h = rms(x, w(p + "input_layernorm.weight"))
            qh = rope(rms((h @ w(p + "self_attn.q_proj.weight").T).reshape(L, H, E), w(p + "self_attn.q_norm.weight")))
            kh = rope(rms((h @ w(p + "self_attn.k_proj.weight").T).reshape(L, K, E), w(p + "self_attn.k_norm.weight")))
            vh = (h @ w(p + "self_attn.v_proj.weight").T).reshape(L, K, E)
            kh, vh = np.repeat(kh, H // K, axis=1), np.repeat(vh, H // K, axis=1)  # head h reads kv h // G
            s = np.einsum("lhe,mhe->hlm", qh, kh) / np.sqrt(E)  # no causal mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hlm,mhe->lhe", s, vh).reshape(L, H * E)
            x = x + o @ w(p + "self_attn.o_proj.weight").T
            h = rms(x, w(p + "post_attention_layernorm.weight"))
            g, u = h @ w(p + "mlp.gate_proj.weight").T, h @ w(p + "mlp.up_proj.weight").T
            x = x + (g / (1 + np.exp(-g)) * u) @ w(p + "mlp.down_proj.weight").T
            if states is not None:
                states.append(x.copy())
        h = rms(x[-T:], w("llm.norm.weight"))
        return (h @ w("audio_heads.weight").T).reshape(T, C, V).transpose(1, 0, 2)  # [C, T, V]


# ---------------------------------------------------------------------------------------------
# reference
# ---------------------------------------------------------------------------------------------


class ReferenceSide(Side):
    def __init__(self, args):
        super().__init__(args)
        import logging
        import warnings

        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        import torch

        self.torch = torch
        self.device = torch.device(args.device)
        self.dtype = getattr(torch, args.dtype)
        self.res.update(dtype=args.dtype, device=(torch.cuda.get_device_name(0) if self.device.type == "cuda"
                                                  else f"CPU (torch, {torch.get_num_threads()} threads)"))
        self.res["versions"] = {"torch": torch.__version__}
        try:
            import torchaudio

            self.res["versions"]["torchaudio"] = getattr(torchaudio, "__version__", "?")
        except ImportError:
            pass

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def run(self):
        torch, a = self.torch, self.args
        from omnivoice.models.omnivoice import OmniVoice

        import omnivoice
        import transformers

        self.res["versions"].update(omnivoice=getattr(omnivoice, "__version__", "?"),
                                    transformers=transformers.__version__)
        t0 = time.perf_counter()
        try:
            m = OmniVoice.from_pretrained(str(a.model), dtype=self.dtype, device_map=str(self.device))
        except (TypeError, ValueError, ImportError):  # older loaders: load, then move
            m = OmniVoice.from_pretrained(str(a.model), dtype=self.dtype).to(self.device)
            m.audio_tokenizer.to(self.device)
        m = m.eval()
        self.sync()
        self.res["load_s"] = time.perf_counter() - t0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.save()
        fwd, start = [], {}

        def pre(module, args, kwargs):
            self.sync()
            start["t"] = time.perf_counter()

        def post(module, args, kwargs, out):
            self.sync()
            fwd.append(time.perf_counter() - start["t"])

        h1 = m.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = m.register_forward_hook(post, with_kwargs=True)
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                m.generate(TEXT, language="en", duration=1.0, num_step=2, **GREEDY)
                self.res["warmup_s"] = time.perf_counter() - t0
                self.save()

                def gen():
                    fwd.clear()
                    m.generate(TEXT, language="en", duration=a.seconds, num_step=a.steps, **GREEDY)
                    return {"forward_median": float(np.median(fwd)), "forward_count": len(fwd)}

                self.measure("generate", gen)
                def packed():  # the reference pads the batch into one forward per step
                    m.generate([TEXT] * a.batch, language=["en"] * a.batch,
                               duration=[a.seconds] * a.batch, num_step=a.steps, **GREEDY)
                    return {"passes": 1}

                self.measure("throughput", packed, repeats=1)
        finally:
            h1.remove()
            h2.remove()
        if not a.generate_only:
            tok = m.audio_tokenizer
            codes = torch.from_numpy(np.random.default_rng(0).integers(0, 1024, (1, 8, round(a.seconds * 25))))
            clip = torch.from_numpy(_clip(a.encode_seconds))[None, None]
            with torch.inference_mode():
                self.measure("decode", lambda: {"samples": int(tok.decode(codes.to(tok.device)).audio_values.shape[-1])})
                self.measure("encode", lambda: {"frames": int(tok.encode(clip.to(tok.device)).audio_codes.shape[-1])})
        if self.device.type == "cuda":
            self.res["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        self.res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.save()


def _clip(seconds: float) -> np.ndarray:
    import soundfile as sf

    clip, sr = sf.read(CLIP, dtype="float32")
    assert sr == 24000
    n = round(seconds * sr)
    return np.ascontiguousarray(np.tile(clip, math.ceil(n / len(clip)))[:n])


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def report(out: Path) -> str:
    """Merge the sides' JSONs of `out` into table.md and timings.json; returns the table."""
    sides = {}
    for name in ("omnicore", "reference_float32", "reference_float16"):
        p = out / f"{name}.json"
        if p.is_file():
            sides[name] = json.loads(p.read_text())
    notes = []
    for name in ("reference_float32", "reference_float16"):
        skip = out / f"{name}.skipped"
        if skip.is_file():
            notes.append(f"{name}: not run ({skip.read_text().strip()})")
    o = sides.get("omnicore", {})
    r32, r16 = sides.get("reference_float32", {}), sides.get("reference_float16", {})
    sec, steps, batch = o.get("seconds", "?"), o.get("steps", "?"), o.get("batch", "?")

    def val(side, key, field="median"):
        v = side.get(key)
        return v.get(field) if isinstance(v, dict) else v

    def fmt(v, unit, scale=1.0, digits=2):
        return "n/a" if v is None else f"{v * scale:.{digits}f} {unit}".strip()

    def throughput(side):
        one, many = val(side, "generate"), val(side, "throughput")
        if one is None or many is None:
            return None, None
        b = side.get("batch", 1)
        return b * side["seconds"] / many, (b * side["seconds"] / many) / (side["seconds"] / one)

    rows = []

    def line(label, key, unit, scale=1.0, digits=2, field="median", fn=None):
        vals = [fn(s) if fn else val(s, key, field) for s in (o, r32, r16)]
        ratio = f"{vals[0] / vals[1]:.2f}" if vals[0] is not None and vals[1] else ""
        rows.append(f"| {label} | " + " | ".join(fmt(v, unit, scale, digits) for v in vals) + f" | {ratio} |")

    line(f"backbone step, {sec} s target (median)", "generate", "ms", 1e3, 1, field="forward_median")
    line(f"generate() {sec} s @ {steps} steps", "generate", "s")
    line(f"  RTF {sec} s @ {steps}", "generate", "", 1.0, 3,
         fn=lambda s: val(s, "generate") / s["seconds"] if val(s, "generate") else None)
    line(f"decode {sec} s", "decode", "s", 1.0, 3)
    line(f"encode {o.get('encode_seconds', '?')} s clip", "encode", "s", 1.0, 3)
    line(f"{batch} requests in one call, audio s per s", "throughput", "",
         fn=lambda s: throughput(s)[0])
    line("  throughput vs 1 request (x)", "throughput", "", fn=lambda s: throughput(s)[1])
    line("  host time to launch one forward (median)", "generate", "ms", 1e3, 1, field="forward_host_median")
    line("  per step outside the forward (scoring, fill)", "generate", "ms", 1e3, 1,
         field="outside_forward_per_step")
    line("  GEMM rate in the step (projections + heads)", "step_gflop", "TFLOP/s", 1.0, 1,
         fn=lambda s: s["step_gflop"] / val(s, "generate", "forward_median") / 1e3
         if s.get("step_gflop") and val(s, "generate", "forward_median") else None)
    line("peak GPU memory", "peak_gpu_mb", "MB", 1.0, 0, fn=lambda s: s.get("peak_gpu_mb"))
    line("model load", "load_s", "s", 1.0, 1, fn=lambda s: s.get("load_s"))
    head = ["| line | omnicore | reference fp32 | reference fp16 | omnicore / reference fp32 |",
            "|---|---|---|---|---|"]
    info = [""]
    for name, s in sides.items():
        info.append(f"- {name}: {s.get('device', '?')}; backend {s.get('backend', '-')}; "
                    f"versions {s.get('versions', {})}; passes for the packed line: "
                    f"{(s.get('throughput') or {}).get('passes', 'n/a')}")
        if o is s and s.get("graphs"):
            info.append(f"  CUDA graphs (backend.replay): {s['graphs']}")
        if o is s and val(s, "generate", "transfers") is not None:
            info.append(f"  host<->device transfers during generate(): {val(s, 'generate', 'transfers')} "
                        f"for {val(s, 'generate', 'forward_count')} forward passes")
        for k, err in s.get("errors", {}).items():
            info.append(f"  FAILED {k}: {err.strip().splitlines()[-1]}")
    info += [f"- {n}" for n in notes]
    if o and o.get("backend") != "cupy":
        info.append(f"- DRY RUN: omnicore ran on the {o.get('backend')} backend on the CPU; its "
                    "timings test the script, they measure nothing")
    table = "\n".join(head + rows + info + profile_table(out, sides))
    (out / "table.md").write_text(table + "\n")
    (out / "timings.json").write_text(json.dumps(sides, indent=1))
    return table


def profile_table(out: Path, sides: dict) -> list[str]:
    """Omnicore's precision profiles side by side: step, RTF, packed throughput, and the
    logits' error against a float64 forward (the reference's float16 beside them)."""
    profiles = {"fp32": sides.get("omnicore", {})}
    for name in ("tf32", "bf16", "fp16"):
        p = out / f"omnicore_{name}.json"
        if p.is_file():
            profiles[name] = json.loads(p.read_text())
    if not any(s.get("accuracy") for s in profiles.values()):
        return []

    def get(s, key, field="median"):
        v = s.get(key)
        return v.get(field) if isinstance(v, dict) else None

    def f(v, fmt, unit=""):
        return "n/a" if v is None else format(v, fmt) + unit

    rows = ["", "| omnicore profile | backbone step | RTF | packed throughput vs 1 request | "
                "logits max rel. error vs float64 | argmax agreement vs float64 |",
            "|---|---|---|---|---|---|"]
    for name, s in list(profiles.items()) + [("reference fp16", sides.get("reference_float16", {}))]:
        gen, many = get(s, "generate"), get(s, "throughput")
        sec = s.get("seconds")
        rtf = gen / sec if gen and sec else None
        x = (s.get("batch", 1) * gen / many) if gen and many else None
        fwd = get(s, "generate", "forward_median")
        rows.append(f"| {name} | {f(fwd and fwd * 1e3, '.1f', ' ms')} | {f(rtf, '.3f')} | {f(x, '.2f', 'x')} | "
                    f"{f(get(s, 'accuracy', 'logits_rel_err'), '.2e')} | "
                    f"{f(get(s, 'accuracy', 'argmax_agree'), '.4f')} |")
    rows.append("(float64: a host forward of the same checkpoint and inputs, conditional and "
                "unconditional rows, all-MASK targets; the reference's own float16 error is not "
                "measured by this script yet)")
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.cmd == "report":
        print(report(args.out))
        return
    side = OmnicoreSide(args) if args.which == "omnicore" else ReferenceSide(args)
    side.save()
    try:
        side.run()
    except Exception:
        side.res["errors"]["run"] = traceback.format_exc(limit=6)[-3000:]
        side.save()
        raise


if __name__ == "__main__":
    main()
