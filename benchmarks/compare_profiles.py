#!/usr/bin/env python3
"""How far the approximate `fast` profile's speech is from `exact`'s, on your own weights.

    python3 benchmarks/compare_profiles.py --model k2-fsa/OmniVoice
        [--texts FILE] [--voice CLIP=TRANSCRIPT ...] [--instruct TEXT ...] [--seeds N]
        [--exact-steps N] [--fast-steps N] [--prefix-refresh N] [--uncond-every N]
        [--save DIR] [--json FILE]

omnicore cannot measure what `fast` does to speech: no real weights can be had where it is
built and tested (docs/performance.md). This script lets anyone who has them check. For every
text and voice (auto, each --instruct design, each --voice clone) and every seed it generates
the same utterance with profile="exact" and with profile="fast" (the same seed, the same length:
post-processing off, so both are exactly frames x 960 samples) and reports:

    codes equal     the share of the [8, T] cells where fast chose exact's code
    mel distance    mean |log-mel(fast) - log-mel(exact)| (80 bands, 1024-point frames, hop 256)
    seed distance   the same between exact with seed s and exact with seed s + 1000: how far two
                    equally good takes of the same text lie apart. A fast distance well inside it
                    means the profile changes the take, not its quality
    time            wall seconds of each profile, and fast / exact

Codes agreement and mel distance say how much the output moved, not whether it got worse:
for that, listen, or run an ASR / speaker-similarity judge on the files `--save DIR` writes
(exact_*.wav, fast_*.wav).

Dimension legend: C codebooks (8), T frames, L samples, F STFT frames, M mel bands.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXTS = (
    "The quick brown fox jumps over the lazy dog, then rests in the warm afternoon sun.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Der Zug nach Berlin fährt heute eine halbe Stunde später ab.",
    "我们明天早上八点在图书馆门口见面吧。",
)
SEED_OFFSET = 1000  # the second exact take of the seed-to-seed yardstick


# ---------------------------------------------------------------------------------------------
# A log-mel spectrogram in numpy
# ---------------------------------------------------------------------------------------------


def mel_filterbank(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Triangular filters evenly spaced on the HTK mel scale: [M, n_fft // 2 + 1]."""
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10.0 ** (np.asarray(m) / 2595.0) - 1.0)

    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2))  # [M + 2] Hz
    bins = np.fft.rfftfreq(n_fft, 1.0 / sr)  # [n_fft // 2 + 1] Hz
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]  # [M, 1] each
    rise = (bins[None] - lo) / (mid - lo)
    fall = (hi - bins[None]) / (hi - mid)
    return np.maximum(0.0, np.minimum(rise, fall))  # [M, n_fft // 2 + 1]


def log_mel(wav: np.ndarray, sr: int, n_fft: int = 1024, hop: int = 256, n_mels: int = 80) -> np.ndarray:
    """[L] float waveform -> [F, M] natural-log mel energies (floored at 1e-5)."""
    wav = np.asarray(wav, np.float64)
    if len(wav) < n_fft:
        wav = np.pad(wav, (0, n_fft - len(wav)))
    frames = 1 + (len(wav) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]  # [F, n_fft]
    spec = np.abs(np.fft.rfft(wav[idx] * np.hanning(n_fft)[None, :], axis=1)) ** 2  # [F, n_fft/2+1]
    return np.log(np.maximum(spec @ mel_filterbank(sr, n_fft, n_mels).T, 1e-5))  # [F, M]


def mel_distance(a: np.ndarray, b: np.ndarray, sr: int) -> float:
    """Mean absolute log-mel difference of two waveforms (cut to the shorter one)."""
    n = min(len(a), len(b))
    return float(np.abs(log_mel(a[:n], sr) - log_mel(b[:n], sr)).mean())


# ---------------------------------------------------------------------------------------------
# Cases and the comparison
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory or hub id")
    ap.add_argument("--texts", type=Path, help="one text per line (default: four built-in ones)")
    ap.add_argument("--voice", action="append", default=[], metavar="CLIP=TRANSCRIPT",
                    help="a reference clip to clone, with what it says (repeatable)")
    ap.add_argument("--instruct", action="append", default=[],
                    help="a designed voice, e.g. 'female, low pitch' (repeatable)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per case (default %(default)s)")
    ap.add_argument("--exact-steps", type=int, help="num_step of exact (default: its own, 32)")
    ap.add_argument("--fast-steps", type=int, help="num_step of the fast profile (default: its own)")
    ap.add_argument("--prefix-refresh", type=int, help="the fast profile's prefix_refresh")
    ap.add_argument("--uncond-every", type=int, help="the fast profile's uncond_every")
    ap.add_argument("--max-texts", type=int, help="use only the first N texts")
    ap.add_argument("--save", type=Path, help="write every take as WAV here, to listen or judge")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    return ap.parse_args(argv)


def voices(model, args):
    """(name, generate keywords) of every voice to compare."""
    out = [("auto", {})]
    out += [(f"design {i}", {"instruct": text}) for i, text in enumerate(args.instruct)]
    for i, spec in enumerate(args.voice):
        clip, sep, transcript = spec.partition("=")
        if not sep or not transcript.strip():
            raise SystemExit(f"--voice wants CLIP=TRANSCRIPT, got {spec!r}")
        out.append((f"clone {i}", {"voice_clone_prompt": model.create_voice_clone_prompt(clip, transcript)}))
    return out


def take(model, text, voice_kw, seed, **profile_kw):
    """One generation with post-processing off: (codes [C, T], audio [960 T], seconds)."""
    t0 = time.perf_counter()
    s = model.synthesize(text, seed=seed, postprocess_output=False, **voice_kw, **profile_kw)[0]
    return s.codes, s.audio, time.perf_counter() - t0


def compare(model, texts, voice_list, seeds: int, fast_kw: dict, exact_kw: dict,
            save: Path | None = None) -> list[dict]:
    sr, rows = model.sampling_rate, []
    for ti, text in enumerate(texts):
        for vname, vkw in voice_list:
            for seed in range(seeds):
                ce, we, te = take(model, text, vkw, seed, profile="exact", **exact_kw)
                cf, wf, tf = take(model, text, vkw, seed, profile="fast", **fast_kw)
                c2, w2, _ = take(model, text, vkw, seed + SEED_OFFSET, profile="exact", **exact_kw)
                rows.append({
                    "text": ti, "voice": vname, "seed": seed, "frames": int(ce.shape[1]),
                    "codes_equal": float((cf == ce).mean()) if cf.shape == ce.shape else None,
                    "mel_distance": mel_distance(wf, we, sr),
                    "seed_distance": mel_distance(w2, we, sr),
                    "seed_codes_equal": float((c2 == ce).mean()) if c2.shape == ce.shape else None,
                    "exact_s": te, "fast_s": tf,
                })
                if save is not None:
                    import soundfile as sf

                    save.mkdir(parents=True, exist_ok=True)
                    stem = f"t{ti}_{vname.replace(' ', '')}_s{seed}"
                    sf.write(save / f"exact_{stem}.wav", we, sr)
                    sf.write(save / f"fast_{stem}.wav", wf, sr)
                print(_row(rows[-1]), flush=True)
    return rows


def _row(r: dict) -> str:
    eq = "-" if r["codes_equal"] is None else f"{100 * r['codes_equal']:.1f} %"
    return (f"| {r['text']} | {r['voice']} | {r['seed']} | {r['frames']} | {eq} | "
            f"{r['mel_distance']:.3f} | {r['seed_distance']:.3f} | {r['exact_s']:.1f} s | "
            f"{r['fast_s']:.1f} s | {r['fast_s'] / r['exact_s']:.2f} |")


HEADER = ("| text | voice | seed | frames | codes equal | mel distance fast-exact | mel distance "
          "seed-to-seed | exact | fast | fast / exact |\n|---|---|---|---|---|---|---|---|---|---|")


def summary(rows: list[dict]) -> dict:
    def mean(key):
        vals = [r[key] for r in rows if r[key] is not None]
        return float(np.mean(vals)) if vals else None

    return {"cases": len(rows), "codes_equal": mean("codes_equal"),
            "mel_distance": mean("mel_distance"), "seed_distance": mean("seed_distance"),
            "time_ratio": float(sum(r["fast_s"] for r in rows) / sum(r["exact_s"] for r in rows))}


def main(argv=None) -> dict:
    args = parse_args(argv)
    from omnicore import OmniVoice

    model = OmniVoice.from_pretrained(args.model)
    texts = (args.texts.read_text(encoding="utf-8").splitlines() if args.texts else list(TEXTS))
    texts = [t.strip() for t in texts if t.strip()][:args.max_texts]
    fast_kw = {k: v for k, v in (("num_step", args.fast_steps), ("prefix_refresh", args.prefix_refresh),
                                 ("uncond_every", args.uncond_every)) if v is not None}
    print(HEADER, flush=True)
    exact_kw = {} if args.exact_steps is None else {"num_step": args.exact_steps}
    rows = compare(model, texts, voices(model, args), args.seeds, fast_kw, exact_kw, args.save)
    result = {"summary": summary(rows), "rows": rows, "fast": fast_kw, "exact": exact_kw}
    s = result["summary"]
    equal = "-" if s["codes_equal"] is None else f"{100 * s['codes_equal']:.1f} %"
    print(f"\nmean over {s['cases']} takes: codes equal {equal}, "
          f"mel distance fast-exact {s['mel_distance']:.3f} against seed-to-seed "
          f"{s['seed_distance']:.3f}; fast took {s['time_ratio']:.2f}x exact's time")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
