#!/usr/bin/env python3
"""Voice prompt files written by the reference's own `VoiceClonePrompt.save` (torch .pt zips).

    $OMNICORE_REF_VENV/bin/python tools/reference/dump_voice.py [CKPT_DIR] [OUT_DIR]

omnicore reads these without torch (omnicore/machinery/torchfile.py); tests/test_torchfile.py checks that
it gets exactly what the reference stored. Files in tests/fixtures/reference/:

  voice_full.pt     create_voice_clone_prompt(speech_24k.wav, ref_text=speech.txt) on the tiny
                    checkpoint (the reference's silence removal on): codes [8, R]
  voice_short_zh.pt the first 0.6 s of that clip, preprocess_prompt=False, a non-ASCII ref_text
  voice_slice.pt    frames 5..16 of voice_full's codes saved as a view: torch stores the whole
                    [8, R] storage with storage_offset 5 and strides (R, 1)
  voice_expected.npz for each NAME above: NAME_codes int64 [8, R], NAME_ref_text (0-d unicode),
                    NAME_ref_rms float64 (0-d), NAME_offset / NAME_stride (how torch laid it out)

Reproducible byte for byte (checked): nothing here is random (the codec encoder only), torch's
zip writer puts no timestamps in the archive, and its serialization id is a hash of the record
names and their CRCs. The archive's top folder is the file name's stem (voice_full/data.pkl ...).
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
AUDIO = ROOT / "tests" / "fixtures" / "audio"
SEED = None
SHORT_TEXT = "你好，世界。Grüße — ça va? ¿Qué tal? 🎙"


def dump(ckpt_dir: Path, out_dir: Path) -> list[Path]:
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _dump(ckpt_dir, out_dir)
    finally:
        logging.disable(previous)


def _dump(ckpt_dir: Path, out_dir: Path) -> list[Path]:
    import soundfile as sf
    import torch
    from omnivoice.models.omnivoice import OmniVoice, VoiceClonePrompt

    out_dir.mkdir(parents=True, exist_ok=True)
    model = OmniVoice.from_pretrained(str(ckpt_dir), dtype=torch.float32).eval()
    text = (AUDIO / "speech.txt").read_text(encoding="utf-8").strip()
    wav, sr = sf.read(AUDIO / "speech_24k.wav", dtype="float32")

    full = model.create_voice_clone_prompt(ref_audio=str(AUDIO / "speech_24k.wav"), ref_text=text)
    short = model.create_voice_clone_prompt(
        ref_audio=(torch.from_numpy(wav[: int(0.6 * sr)].copy()), sr), ref_text=SHORT_TEXT,
        preprocess_prompt=False)
    view = full.ref_audio_tokens[:, 5:17]  # a view: the file keeps the whole storage
    assert view.storage_offset() == 5 and not view.is_contiguous()
    prompts = {"full": full, "short_zh": short,
               "slice": VoiceClonePrompt(ref_audio_tokens=view, ref_text=full.ref_text,
                                         ref_rms=full.ref_rms)}

    written, expected = [], {}
    for name, p in prompts.items():
        path = out_dir / f"voice_{name}.pt"
        p.save(str(path))
        back = VoiceClonePrompt.load(str(path))  # the reference's own reader agrees
        assert torch.equal(back.ref_audio_tokens, p.ref_audio_tokens) and back.ref_text == p.ref_text
        tokens = p.ref_audio_tokens.detach().cpu()
        expected[f"{name}_codes"] = tokens.numpy().astype(np.int64)
        expected[f"{name}_ref_text"] = np.array(p.ref_text)
        expected[f"{name}_ref_rms"] = np.array(p.ref_rms, np.float64)
        expected[f"{name}_offset"] = np.array(tokens.storage_offset(), np.int64)
        expected[f"{name}_stride"] = np.array(tokens.stride(), np.int64)
        print(f"  voice_{name}.pt: codes {tuple(tokens.shape)} offset {tokens.storage_offset()} "
              f"stride {tokens.stride()} rms {p.ref_rms:.4f} text {p.ref_text!r} "
              f"({path.stat().st_size} bytes)")
        written.append(path)
    path = out_dir / "voice_expected.npz"
    np.savez(path, **expected)
    written.append(path)
    return written


if __name__ == "__main__":
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ckpt = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "weights" / "tiny-random"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests" / "fixtures" / "reference"
    for p in dump(ckpt, out):
        print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p, p.stat().st_size)
