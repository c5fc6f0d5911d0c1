#!/usr/bin/env python3
"""Check that a random checkpoint makes tests meaningful (numbers go into README.md).

    $OMNICORE_REF_VENV/bin/python tools/reference/verify_checkpoint.py weights/tiny-random

1. The reference loads it (OmniVoice.from_pretrained + AutoTokenizer) in float32.
2. Greedy generate (position_temperature=0, class_temperature=0) for a ~2 s target gives codes
   that vary along time (distinct values per codebook row), and identical codes in float64.
3. The codec decode of random codes is non-trivial (rms in a sane range, depends on the codes)
   and encoding that waveform back gives varied codes.
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from pathlib import Path

import numpy as np

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def load(ckpt: Path, dtype):
    import torch
    from omnivoice.models.omnivoice import OmniVoice

    model = OmniVoice.from_pretrained(str(ckpt), dtype=torch.float32)
    if dtype is not torch.float32:
        model = model.to(dtype)
        model.audio_tokenizer = model.audio_tokenizer.to(dtype)
    return model.eval()


def greedy_codes(model, text: str, duration: float, **kw) -> np.ndarray:
    """Run the reference generate() and return the 8xT codes it decoded."""
    captured = []
    orig = model._generate_iterative

    def spy(task, cfg):
        res = orig(task, cfg)
        captured.extend(r.detach().cpu().numpy().copy() for r in res)
        return res

    model._generate_iterative = spy
    try:
        model.generate(text=text, duration=duration, position_temperature=0.0,
                       class_temperature=0.0, postprocess_output=False, **kw)
    finally:
        model._generate_iterative = orig
    return captured[0]


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--num-step", type=int, default=32)
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--no-f64", action="store_true", help="skip the float64 rerun (full size)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    report: dict = {}

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.ckpt))
    probe = "<|lang_start|>en<|lang_end|>Hello, world! 你好"
    report["tokenizer"] = {"len": len(tok), "probe_ids": tok(probe).input_ids}

    m32 = load(args.ckpt, torch.float32)
    text = "Nice to meet you, this is a quick test."
    c32 = greedy_codes(m32, text, 2.0, num_step=args.num_step, language="en")
    distinct = [int(len(np.unique(row))) for row in c32]
    report["greedy_f32"] = {"shape": list(c32.shape), "distinct_per_row": distinct}
    if not args.no_f64:
        m64 = load(args.ckpt, torch.float64)
        c64 = greedy_codes(m64, text, 2.0, num_step=args.num_step, language="en")
        report["greedy_f64_equal"] = bool(np.array_equal(c32, c64))
        report["greedy_f64_mismatch_cells"] = int((c32 != c64).sum())
        del m64

    # Codec: decode random codes, decode other codes, encode back.
    codec = m32.audio_tokenizer
    g = torch.Generator().manual_seed(0)
    codes_a = torch.randint(0, 1024, (1, 8, 50), generator=g)
    codes_b = torch.randint(0, 1024, (1, 8, 50), generator=g)
    with torch.no_grad():
        wa = codec.decode(codes_a).audio_values
        wb = codec.decode(codes_b).audio_values
        back = codec.encode(wa).audio_codes
    report["codec"] = {
        "decode_shape": list(wa.shape),
        "rms_a": float(wa.pow(2).mean().sqrt()),
        "rms_b": float(wb.pow(2).mean().sqrt()),
        "peak_a": float(wa.abs().max()),
        "rms_diff_ab": float((wa - wb).pow(2).mean().sqrt()),
        "encode_shape": list(back.shape),
        "encode_distinct_per_row": [int(len(torch.unique(r))) for r in back[0]],
        "encode_recovers_input_frac": float((back == codes_a).float().mean()),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
