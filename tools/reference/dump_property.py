#!/usr/bin/env python3
"""Greedy and encoder codes of the reference in float32 and float64 on many random checkpoints,
for the property tests that can see near-ties (tests/test_accuracy_property.py).

    $OMNICORE_REF_VENV/bin/python tools/reference/dump_property.py [--cases N] [--out DIR]

Each case draws (numpy PCG64, seed SEED) a small architecture (backbone width, heads, layers,
MLP width; codec HuBERT and DAC widths, among them DAC decoder widths whose halving the
reference floors: 48 -> 24, 12, 6, 3, 1), a checkpoint seed, a mode (auto, design, Chinese
design, clone of the speech fixture), a text, a duration or none, and a step count. For each,
make_checkpoint.py builds the checkpoint and the reference runs it twice, in float32 and in
float64 (oracle_f64.py: model and codec `.double()`, scoring in float64 too):

  codes32 / codes64    greedy codes [C, T] (clone: each precision encodes the clip itself)
  prompt32 / prompt64  clone only: the voice prompt's codes [C, R]
  enc32 / enc64        encoder codes [C, T] of the float64 greedy codes decoded (each precision
                       decodes and encodes: what a voice kept from a design goes through)

Written to tests/fixtures/reference/property_cases.npz (compressed, no pickle):
  cases_json   list of cases: arch (index), seed, mode, text, language, instruct, duration,
               num_step, T, and the sha256 of the two safetensors files built (the test checks
               its own build against them)
  archs_json   list of architectures: config.json and audio_tokenizer/config.json as written,
               and the plans (make_checkpoint.draw_tensors) of both weight files
  c<i>_<name>  the int16 code arrays above, case i
The tokenizer is the same for every case (make_checkpoint's tiny BPE): weights/tiny-random's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import make_checkpoint  # noqa: E402
import oracle_f64  # noqa: E402

SEED = 2024
NUM_CASES = 360
OUT_NAME = "property_cases.npz"
TEXTS = {
    "en": ["Nice to meet you, this is a quick test.", "Good evening, everyone.",
           "See you tomorrow at noon.", "The cat slept on the warm windowsill [laughter] all day.",
           "Turn left at the old mill, then keep going.", "Is it raining again?"],
    "zh": ["今天天气很好，我们去散步吧。", "你好，世界。", "我们明天见。"],
}
INSTRUCTS = ["female, low pitch, british accent", "male, high pitch", "female, whisper", "male, elderly"]
STEPS = [1, 2, 4, 8, 8, 16, 16, 32]


def draw_arch(rng) -> dict:
    """A SIZES-like spec (make_checkpoint.py) of a small random architecture."""
    kv = int(rng.choice([1, 2]))
    llm = dict(hidden_size=int(rng.choice([32, 48, 64, 96])), num_hidden_layers=int(rng.integers(1, 5)),
               num_key_value_heads=kv, num_attention_heads=kv * int(rng.choice([1, 2, 3])),
               head_dim=int(rng.choice([8, 16, 32])), intermediate_size=int(rng.choice([64, 128, 160])))
    hub = int(rng.choice([16, 32]))
    codec = dict(codebook_dim=int(rng.choice([16, 32])), codebook_size=1024,
                 acoustic=dict(encoder_hidden_size=int(rng.choice([2, 4])),
                               decoder_hidden_size=int(rng.choice([64, 48, 40])),
                               hidden_size=int(rng.choice([16, 32]))),
                 semantic=dict(hidden_size=hub, num_hidden_layers=int(rng.integers(1, 3)),
                               num_attention_heads=int(rng.choice([2, 4])),
                               intermediate_size=2 * hub, conv_dim=[int(rng.choice([16, 32]))] * 7))
    return {"bpe_vocab": make_checkpoint.SIZES["tiny"]["bpe_vocab"], "llm": llm, "codec": codec}


def draw_case(rng, arch: int) -> dict:
    mode = str(rng.choice(["auto", "design", "design_zh", "clone"]))
    lang = "zh" if mode == "design_zh" else "en"
    case = {"arch": arch, "seed": int(rng.integers(1, 1 << 20)), "mode": mode,
            "text": str(rng.choice(TEXTS[lang])), "num_step": int(rng.choice(STEPS)),
            "language": None if mode == "design" else lang,
            "instruct": str(rng.choice(INSTRUCTS)) if mode.startswith("design") else None,
            "duration": None if rng.random() < 0.5 else round(float(rng.uniform(0.8, 2.4)), 2)}
    if mode == "clone":
        case["ref"] = "speech_24k.wav"
    return case


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rms(x) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if np.size(x) else 0.0


def generation_margin(x64: dict, x32: dict, tokens_in, gen, mask_id: int) -> float:
    """The float64 run's narrowest decision, in units of the reference's own float32 error of
    that kind of decision at that step (both runs on the float64 run's inputs): which cells a
    step fills (the gap between the last cell taken and the first left, in score = confidence -
    penalty * codebook) and which token each filled cell gets (best minus second log-prob).
    Below ~3 a float32 rounding decides it as easily as the data: a near-tie."""
    steps, C, T = tokens_in.shape
    penalty = np.arange(C)[:, None] * gen.layer_penalty_factor
    sched = oracle_f64.schedule(C * T, gen)
    worst = np.inf
    for s in range(steps):
        masked = tokens_in[s] == mask_id
        k = min(sched[s], int(masked.sum()))
        s64 = np.where(masked, x64["conf"][s] - penalty, -np.inf).ravel()
        s32 = np.where(masked, x32["conf"][s] - np.float32(gen.layer_penalty_factor)
                       * np.arange(C, dtype=np.float32)[:, None], -np.inf).ravel()
        order = np.argsort(-s64, kind="stable")
        if k < masked.sum():
            gap = s64[order[k - 1]] - s64[order[k]]
            worst = min(worst, gap / max(_rms((s32 - s64)[masked.ravel()]), 1e-30))
        lp64 = x64["lp"][s].reshape(C * T, -1)[order[:k]]
        lp32 = x32["lp"][s].reshape(C * T, -1)[order[:k]]
        top2 = np.argsort(-lp64, axis=1)[:, :2]
        a64, a32 = np.take_along_axis(lp64, top2, 1), np.take_along_axis(lp32, top2, 1)
        worst = min(worst, float(np.min(a64[:, 0] - a64[:, 1])) / max(_rms(a32 - a64), 1e-30))
    return float(worst)


def encoder_margins(c64, c32, codes64) -> np.ndarray:
    """Per frame [T]: the float64 encoder's narrowest codeword choice over the quantizers (the
    second-nearest distance minus the nearest), in units of the float32 encoder's error of such
    gaps (RMS over the frames, per quantizer), each precision decoding `codes64` for itself."""
    import torch

    from dump_codec import _encoder_tensors

    gaps, errs = [], []
    with torch.no_grad():
        runs = []
        for codec in (c64, c32):
            wave = codec.decode(torch.from_numpy(codes64)[None]).audio_values[0, 0].numpy()
            runs.append((codec, _encoder_tensors(codec, wave)))
        for q, quantizer in enumerate(c64.quantizer.quantizers[:codes64.shape[0]]):
            dist = []
            for codec, t in runs:
                qz = codec.quantizer.quantizers[q]
                r = torch.from_numpy(t["residuals"][q])  # [T, D]
                z = qz.project_in(r.to(qz.project_in.weight.dtype))
                e = qz.codebook.embed
                dist.append(((z * z).sum(1, keepdim=True) - 2 * z @ e.T + (e * e).sum(1)[None]).double().numpy())
            top2 = np.argsort(dist[0], axis=1)[:, :2]
            g64, g32 = (np.diff(np.take_along_axis(d, top2, 1), axis=1)[:, 0] for d in dist)
            same = (runs[0][1]["codes"][:q] == runs[1][1]["codes"][:q]).all(axis=0)  # same residual path
            gaps.append(g64)
            errs.append(_rms((g32 - g64)[same]))
    return np.min(np.stack(gaps) / np.maximum(np.array(errs), 1e-30)[:, None], axis=0)


def run_case(ckpt: Path, case: dict) -> tuple[dict, dict]:
    import torch

    m64, m32 = oracle_f64.load(ckpt, torch.float64), oracle_f64.load(ckpt, torch.float32)
    gen = oracle_f64.gen_config(case, case["num_step"])
    task64, task32 = oracle_f64.make_task(m64, case), oracle_f64.make_task(m32, case)
    codes64, tokens_in, x64 = oracle_f64.run_loop(m64, task64, gen)
    codes32 = oracle_f64.reference_codes(m32, task32, gen)
    out = {"codes32": codes32, "codes64": codes64}
    if case["mode"] == "clone":
        out["prompt32"] = task32.ref_audio_tokens[0].numpy()
        out["prompt64"] = task64.ref_audio_tokens[0].numpy()
    # the float32 reference on the float64 run's inputs: its error at each decision
    task32.ref_audio_tokens, task32.target_lens = task64.ref_audio_tokens, task64.target_lens
    _, _, x32 = oracle_f64.run_loop(m32, task32, gen, tokens_in=tokens_in)
    margins = {"margin": generation_margin(x64, x32, tokens_in, gen, m64.config.audio_mask_id)}
    with torch.no_grad():
        for tag, codec in (("enc64", m64.audio_tokenizer), ("enc32", m32.audio_tokenizer)):
            wave = codec.decode(torch.from_numpy(codes64)[None]).audio_values  # [1, 1, 960 T]
            out[tag] = codec.encode(wave).audio_codes[0].numpy()
    out = {k: v.astype(np.int16) for k, v in out.items()}
    out["enc_margin"] = encoder_margins(m64.audio_tokenizer, m32.audio_tokenizer, codes64).astype(np.float32)
    return out, margins


def dump(ckpt_dir: Path, out_dir: Path, num_cases: int = NUM_CASES) -> list[Path]:
    """(ckpt_dir is not used: every case builds its own checkpoint.)"""
    warnings.filterwarnings("ignore")
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    rng = np.random.default_rng(SEED)
    tiny_tok = sha256_of(ROOT / "weights" / "tiny-random" / "tokenizer.json")
    archs, cases, arrays = [], [], {}
    tmp = Path(tempfile.mkdtemp(prefix="omnicore-property-"))
    try:
        for i in range(num_cases):
            if i % 4 == 0:  # four cases (seeds, texts, modes) per architecture
                spec = draw_arch(rng)
                archs.append(None)
            case = draw_case(rng, len(archs) - 1)
            ckpt = tmp / f"case{i}"
            info = make_checkpoint.build("tiny", ckpt, seed=case["seed"], spec=spec)
            assert sha256_of(ckpt / "tokenizer.json") == tiny_tok, "the tiny BPE changed"
            if archs[-1] is None:
                archs[-1] = {k: info[k] for k in ("config", "plan", "codec_config", "codec_plan")}
            case["sha256"] = {"model": sha256_of(ckpt / "model.safetensors"),
                              "codec": sha256_of(ckpt / "audio_tokenizer" / "model.safetensors")}
            res, margins = run_case(ckpt, case)
            case.update(margins, T=int(res["codes64"].shape[1]))
            cases.append(case)
            arrays.update({f"c{i}_{k}": v for k, v in res.items()})
            agree = [bool(np.array_equal(res[a + "32"], res[a + "64"])) for a in ("codes", "enc")]
            print(f"  case {i}: {case['mode']} steps {case['num_step']} T {case['T']} "
                  f"f32 == f64: codes {agree[0]} (margin {case['margin']:.1f}), encoder {agree[1]} "
                  f"(margin {res['enc_margin'].min():.1f})", flush=True)
            shutil.rmtree(ckpt)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        logging.disable(previous)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path = Path(out_dir) / OUT_NAME
    np.savez_compressed(path, cases_json=np.array(json.dumps(cases, ensure_ascii=False)),
                        archs_json=np.array(json.dumps(archs)), **arrays)
    return [path]


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=NUM_CASES)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "reference")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for p in dump(None, args.out, args.cases):
        print(p, p.stat().st_size)


if __name__ == "__main__":
    main()
