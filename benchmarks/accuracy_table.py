#!/usr/bin/env python3
"""Per-stage error against a float64 run of the reference: omnicore (numpy and strict
backends) next to the reference's own float32, on the same inputs.

    python3 benchmarks/accuracy_table.py ORACLE_DIR [--ckpt DIR] [--json FILE] [--cases a,b]

ORACLE_DIR holds what tools/reference/oracle_f64.py wrote for the checkpoint --ckpt
(default weights/tiny-random). No torch here: the reference's float32 and float64 tensors are
read from those files, and omnicore is run on the inputs stored with them (the float64 run's
targets before every unmasking step, the same padded clip, the same codes). The strict backend
runs in a child process (OMNICORE_BACKEND is read at import).

Error of a stage: ||x - x64|| / ||x64|| over every element of that stage, pooled over the
cases (and steps) of the run (MASK columns of the log-probs left out). "token flips" counts the
cells whose greedy token differs from the float64 one, over all steps, "selection flips" the
steps that would fill other cells than float64 does (same inputs for everyone, so each flip is
that implementation's own rounding deciding a near-tie). Where an implementation
picks other encoder codes than float64, the residuals of the later quantizers are compared on
the frames that agree so far only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Pool:
    """Pooled relative error: sum of squared differences over sum of squared references."""

    def __init__(self):
        self.num, self.den = {}, {}
        self.counts = {}

    def add(self, stage: str, got, want, keep=None):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if keep is not None:
            got, want = got[keep], want[keep]
        self.num[stage] = self.num.get(stage, 0.0) + float(((got - want) ** 2).sum())
        self.den[stage] = self.den.get(stage, 0.0) + float((want ** 2).sum())

    def count(self, stage: str, n: int, of: int):
        a, b = self.counts.get(stage, (0, 0))
        self.counts[stage] = (a + int(n), b + int(of))

    def result(self) -> dict:
        out = {k: (self.num[k] / self.den[k]) ** 0.5 if self.den[k] else 0.0 for k in self.num}
        out.update({k: list(v) for k, v in self.counts.items()})
        return out


def _finite_lp(lp, mask_id):
    return np.delete(lp, mask_id, axis=-1)  # the MASK column is -inf everywhere


def _selection(conf, tokens_in, step: int, num_step: int, mask_id: int):
    """The cells (flat, sorted) that a step fills given these confidences, or None when it
    fills every masked cell (no decision to get wrong). The greedy rule of
    unmasking.choose_cells, on the host and in the confidences' own precision (float64 for the
    oracle: choose_cells runs on the device, which holds no float64)."""
    from omnicore.model.unmasking import cells_per_step

    C, T = conf.shape
    k = cells_per_step(C * T, num_step, 0.1)[step]
    filled = tokens_in[step] != mask_id
    if k >= (~filled).sum():
        return None
    penalty = conf.dtype.type(5.0) * np.arange(C, dtype=conf.dtype)[:, None]  # layer_penalty_factor
    score = np.where(filled, -np.inf, conf - penalty).ravel()
    return np.sort(np.argsort(-score, kind="stable")[:k])


def _count_selection(pool, conf, conf64, tokens_in, step, mask_id):
    """Steps whose filled cells differ from the ones float64 fills (same inputs for everyone)."""
    num_step = tokens_in.shape[0]
    want = _selection(conf64, tokens_in, step, num_step, mask_id)
    if want is not None:
        got = _selection(conf, tokens_in, step, num_step, mask_id)
        pool.count("selection flips", not np.array_equal(got, want), 1)


def omnicore_errors(oracle: Path, ckpt: Path, cases) -> dict:
    """Errors of omnicore on the current backend against float64 (pooled over cases)."""
    from omnicore import OmniVoice
    from omnicore.machinery import checkpoint
    from omnicore.model import backbone as bb, higgs_codec, hubert, scoring_kernels
    from omnicore.model.backend import to_numpy
    from omnicore.model.resample import resample

    model = OmniVoice.from_pretrained(ckpt)
    cfg, params = model.config, model.params
    mask_id = cfg.audio_mask_id
    pool = Pool()
    for name in cases:
        z = np.load(oracle / f"gen_{name}.npz")
        case = json.loads(str(z["case_json"]))
        guidance = case.get("gen", {}).get("guidance_scale", 2.0)
        cond_ids, cond_mask, tokens_in = z["cond_ids"], z["cond_mask"], z["tokens_in"]
        S, T = cond_ids.shape[1], tokens_in.shape[2]
        pack = bb.make_packing([S, T], cfg)
        audio_mask = np.concatenate([cond_mask, cond_mask[-T:]])
        probes = z["probe_steps"].tolist()
        for step in range(tokens_in.shape[0]):
            ids = cond_ids.copy()
            ids[:, S - T:] = tokens_in[step]
            ids = np.concatenate([ids, ids[:, -T:]], axis=1)  # [C, S + T]: cond row, uncond row
            work = bb.make_workspace(cfg, pack)
            c, u = bb.forward_rows(params, cfg, ids, audio_mask, pack, [T, T], work=work)
            lp, pred, conf = scoring_kernels.guided_scores(c, u, guidance, mask_id)
            lp, pred, conf = to_numpy(lp), to_numpy(pred), to_numpy(conf)
            lp64 = z["x64_lp"][step]
            pool.add("log-probs", _finite_lp(lp, mask_id), _finite_lp(lp64, mask_id))
            pool.add("confidence", conf, z["x64_conf"][step])
            pool.count("token flips", (pred != lp64.argmax(-1)).sum(), pred.size)
            _count_selection(pool, conf, z["x64_conf"][step], tokens_in, step, mask_id)
            if step in probes:
                p = probes.index(step)
                pool.add("logits", np.stack([to_numpy(c), to_numpy(u)]),
                         np.stack([z["x64_logits_c"][p], z["x64_logits_u"][p]]))
                x = bb.embed(params, cfg, ids, audio_mask)  # [S + T, D]
                want = np.concatenate([z["x64_embeds_c"][p], z["x64_embeds_u"][p]])
                pool.add("embeddings", to_numpy(x), want)
                for i, lp in enumerate(params.layers):  # one layer at a time: x + layer(x)
                    x = bb.hidden_states(dataclasses.replace(params, layers=(lp,)), cfg, x, pack).copy()
                    want = np.concatenate([z["x64_hidden_c"][p, i], z["x64_hidden_u"][p, i]])
                    pool.add(f"layer {i + 1}", to_numpy(x), want)

    cpath = oracle / "codec.npz"
    if cpath.is_file():
        z = np.load(cpath)
        ccfg = model.codec.cfg
        cparams = checkpoint.load_codec_encoder(model.codec.params, ccfg, model.codec.dir)
        wav = z["input"]
        x16 = np.pad(resample(wav, ccfg.sample_rate, ccfg.semantic_sample_rate),
                     (higgs_codec.SEMANTIC_PAD, higgs_codec.SEMANTIC_PAD))
        states = [to_numpy(s) for s in hubert.hidden_states(cparams.encoder.hubert, x16,
                                                             ccfg.semantic_model_config)]
        pool.add("HuBERT states", np.stack(states), z["x64_hubert_states"])
        feats = higgs_codec.encode_features(cparams, wav, ccfg)
        for key, stage in (("semantic_hubert", "semantic features"), ("semantic", "semantic encoder"),
                           ("acoustic", "acoustic encoder"), ("fused", "fused features")):
            pool.add(stage, feats[key], z[f"x64_{key}"])
        codes, residuals = higgs_codec.quantize(cparams, feats["fused"], ccfg, return_residuals=True)
        want_codes = z["x64_codes"]
        agree = np.ones(codes.shape[1], bool)
        for q in range(codes.shape[0]):
            pool.add(f"RVQ residual {q}", residuals[q], z["x64_residuals"][q], keep=agree)
            agree &= codes[q] == want_codes[q]
        pool.count("encoder code flips", (codes != want_codes).sum(), codes.size)
        wave = higgs_codec.decode(cparams, z["dec_codes"], ccfg)
        pool.add("decoder output", wave, z["x64_wave"])
    return pool.result()


def reference_errors(oracle: Path, cases) -> dict:
    """The reference's float32 against its float64, from the oracle's files."""
    pool = Pool()
    for name in cases:
        z = np.load(oracle / f"gen_{name}.npz")
        mask_id = 1024
        lp32, lp64 = z["x32_lp"], z["x64_lp"]
        probes = z["probe_steps"].tolist()
        for step in range(lp64.shape[0]):
            pool.add("log-probs", _finite_lp(lp32[step], mask_id), _finite_lp(lp64[step], mask_id))
            pool.add("confidence", z["x32_conf"][step], z["x64_conf"][step])
            pred = lp32[step].argmax(-1)
            pool.count("token flips", (pred != lp64[step].argmax(-1)).sum(), pred.size)
            _count_selection(pool, z["x32_conf"][step], z["x64_conf"][step], z["tokens_in"], step, mask_id)
        for p in range(len(probes)):
            pool.add("logits", np.stack([z["x32_logits_c"][p], z["x32_logits_u"][p]]),
                     np.stack([z["x64_logits_c"][p], z["x64_logits_u"][p]]))
            pool.add("embeddings", np.concatenate([z["x32_embeds_c"][p], z["x32_embeds_u"][p]]),
                     np.concatenate([z["x64_embeds_c"][p], z["x64_embeds_u"][p]]))
            for i in range(z["x64_hidden_c"].shape[1]):
                pool.add(f"layer {i + 1}",
                         np.concatenate([z["x32_hidden_c"][p, i], z["x32_hidden_u"][p, i]]),
                         np.concatenate([z["x64_hidden_c"][p, i], z["x64_hidden_u"][p, i]]))
    cpath = oracle / "codec.npz"
    if cpath.is_file():
        z = np.load(cpath)
        pool.add("HuBERT states", z["x32_hubert_states"], z["x64_hubert_states"])
        for key, stage in (("semantic_hubert", "semantic features"), ("semantic", "semantic encoder"),
                           ("acoustic", "acoustic encoder"), ("fused", "fused features")):
            pool.add(stage, z[f"x32_{key}"], z[f"x64_{key}"])
        codes, want = z["x32_codes"], z["x64_codes"]
        agree = np.ones(codes.shape[1], bool)
        for q in range(codes.shape[0]):
            pool.add(f"RVQ residual {q}", z["x32_residuals"][q], z["x64_residuals"][q], keep=agree)
            agree &= codes[q] == want[q]
        pool.count("encoder code flips", (codes != want).sum(), codes.size)
        pool.add("decoder output", z["x32_wave"], z["x64_wave"])
    return pool.result()


def _fmt(v) -> str:
    if isinstance(v, list):
        return f"{v[0]} / {v[1]}"
    return f"{v:.2e}"


def table(columns: dict[str, dict]) -> str:
    names = list(columns)
    ref = columns["reference f32"]
    head = "| stage | " + " | ".join(names) + " | worst ratio |"
    lines = [head, "|" + "---|" * (len(names) + 2)]
    for stage in ref:
        cells = [_fmt(columns[n].get(stage, float("nan"))) for n in names]
        ratio = ""
        if not isinstance(ref[stage], list) and ref[stage] > 0:
            ratio = f"{max(columns[n][stage] for n in names if n != 'reference f32') / ref[stage]:.2f}"
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("oracle", type=Path)
    ap.add_argument("--ckpt", type=Path, default=ROOT / "weights" / "tiny-random")
    ap.add_argument("--cases", help="comma-separated case names (default: every gen_*.npz)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cases = (args.cases.split(",") if args.cases else
             sorted(p.stem[4:] for p in args.oracle.glob("gen_*.npz")))
    if args.child:  # one backend's numbers, as json on stdout
        print(json.dumps(omnicore_errors(args.oracle, args.ckpt, cases)))
        return
    columns = {}
    for backend in ("numpy", "strict"):
        env = dict(os.environ, OMNICORE_BACKEND=backend, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, __file__, str(args.oracle), "--ckpt", str(args.ckpt),
               "--cases", ",".join(cases), "--child"]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        columns[f"omnicore {backend}"] = json.loads(out.strip().splitlines()[-1])
    columns["reference f32"] = reference_errors(args.oracle, cases)
    print(f"{args.oracle} ({', '.join(cases)}): relative error against the reference in float64\n")
    print(table(columns))
    if args.json:
        args.json.write_text(json.dumps(columns, indent=1) + "\n")


if __name__ == "__main__":
    main()
