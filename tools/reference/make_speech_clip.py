#!/usr/bin/env python3
"""Synthesise the speech-like reference clips in tests/fixtures/audio/ with espeak-ng.

    apt-get install -y espeak-ng          # Debian package
    $OMNICORE_REF_VENV/bin/python tools/reference/make_speech_clip.py [--force]

Writes (16-bit PCM WAV):
  speech_24k.wav          mono, 24 kHz: the voice-clone reference clip (codec rate)
  speech_16k_stereo.wav   stereo, 16 kHz: the same speech, for resampling / down-mix tests;
                          the right channel is quieter and 3 ms late so mono = mean differs from
                          either channel
  speech.txt              the transcript (the clone ref_text)

The clips are committed and kept: espeak-ng output differs between its versions, so the files are
only re-synthesised when missing or with --force (regenerate.sh does not force).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "audio"
TEXT = "The quick brown fox jumps over the lazy dog."
VOICE = "en-us"
WORDS_PER_MINUTE = 175
LEAD_SILENCE_S = 0.25
TRAIL_SILENCE_S = 0.35


def espeak(text: str) -> tuple[np.ndarray, int]:
    import soundfile as sf

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "espeak.wav"
        subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "-w", str(wav), text],
                       check=True)
        data, sr = sf.read(str(wav), dtype="float32", always_2d=True)
    return data[:, 0], sr


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    import torch
    import torchaudio

    y = torchaudio.functional.resample(torch.from_numpy(x)[None], sr_in, sr_out)
    return y[0].numpy()


def pad(x: np.ndarray, sr: int) -> np.ndarray:
    return np.concatenate([np.zeros(int(LEAD_SILENCE_S * sr), np.float32), x,
                           np.zeros(int(TRAIL_SILENCE_S * sr), np.float32)])


def main() -> None:
    import soundfile as sf

    ap = argparse.ArgumentParser()
    ap.add_argument("--force", action="store_true", help="re-synthesise even if the clips exist")
    args = ap.parse_args()
    targets = [OUT / "speech_24k.wav", OUT / "speech_16k_stereo.wav", OUT / "speech.txt"]
    if all(p.is_file() for p in targets) and not args.force:
        print("speech clips present; keeping them (use --force to re-synthesise)")
        return
    OUT.mkdir(parents=True, exist_ok=True)
    x, sr = espeak(TEXT)
    x = x / max(1e-6, float(np.abs(x).max())) * 0.6  # fixed peak, independent of espeak's level

    mono24 = pad(resample(x, sr, 24000), 24000)
    sf.write(str(targets[0]), mono24, 24000, subtype="PCM_16")

    left = pad(resample(x, sr, 16000), 16000)
    delay = int(0.003 * 16000)
    right = 0.5 * np.concatenate([np.zeros(delay, np.float32), left[:-delay]])
    sf.write(str(targets[1]), np.stack([left, right], axis=1), 16000, subtype="PCM_16")
    targets[2].write_text(TEXT + "\n")
    for p in targets:
        print(f"wrote {p.relative_to(ROOT)} ({p.stat().st_size} bytes)")
    print(f"24 kHz clip: {len(mono24) / 24000:.2f} s")


if __name__ == "__main__":
    main()
