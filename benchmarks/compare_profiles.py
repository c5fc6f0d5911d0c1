#!/usr/bin/env python3
"""How far an approximate profile's speech (`fast`, or `live`, or a precision such as `int8`)
is from `exact`'s, on your own weights.

    python3 benchmarks/compare_profiles.py --model k2-fsa/OmniVoice [--profile fast|live]
        [--texts FILE] [--voice CLIP=TRANSCRIPT ...] [--instruct TEXT ...] [--seeds N]
        [--exact-steps N] [--fast-steps N] [--prefix-refresh N] [--uncond-every N]
        [--first-chunk-steps N] [--first-chunk-seconds S] [--first-chunk-max-seconds S]
        [--precision P] [--save DIR]
        [--json FILE]
    python3 benchmarks/compare_profiles.py --model k2-fsa/OmniVoice --profile exact --precision int8

omnicore cannot measure what `fast` or `live` does to speech: no real weights can be had where
it is built and tested (docs/performance.md). This script lets anyone who has them check. For
every text and voice (auto, each --instruct design, each --voice clone) and every seed it
generates the same utterance with profile="exact" and with the --profile (the same seed, the
same length: post-processing off, so both are exactly frames x 960 samples) and reports:

    codes equal     the share of the [8, T] cells where the profile chose exact's code
    mel distance    mean |log-mel(profile) - log-mel(exact)| (80 bands, 1024-point frames, hop 256)
    seed distance   the same between exact with seed s and exact with seed s + 1000: how far two
                    equally good takes of the same text lie apart. A profile's distance well
                    inside it means the profile changes the take, not its quality
    time            wall seconds of each profile, and profile / exact

`live` differs from `fast` only in a stream's chunk 0 (its own steps, an earlier cut), so with
--profile live both sides are streamed (`model.stream`, the chunks' codes joined) and the time
to each one's first audio is reported too. When live cuts chunk 0 elsewhere than exact's rule,
the chunks (and so the codes) do not line up: codes equal is then "-" and the mel distance is
taken over the shorter take, so it also counts the different cut.

Codes agreement and mel distance say how much the output moved, not whether it got worse:
for that, listen, or run an ASR / speaker-similarity judge on the files `--save DIR` writes
(exact_*.wav, fast_*.wav or live_*.wav).
--precision P loads the model a second time at that precision profile (`int8`, `bf16`, ...) for
the compared side only; exact stays fp32. With --profile exact that compares the precision alone.

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
    ap.add_argument("--profile", choices=("exact", "fast", "live"), default="fast",
                    help="the approximate profile compared with exact (default %(default)s)")
    ap.add_argument("--exact-steps", type=int, help="num_step of exact (default: its own, 32)")
    ap.add_argument("--fast-steps", type=int, help="num_step of the profile (default: its own)")
    ap.add_argument("--prefix-refresh", type=int, help="the profile's prefix_refresh")
    ap.add_argument("--uncond-every", type=int, help="the profile's uncond_every")
    ap.add_argument("--first-chunk-steps", type=int, help="live: chunk 0's steps")
    ap.add_argument("--first-chunk-seconds", type=float, help="live: where chunk 0 is cut")
    ap.add_argument("--first-chunk-max-seconds", type=float,
                    help="live: where chunk 0 with no clause end by then is cut (0: 3x the above)")
    ap.add_argument("--max-texts", type=int, help="use only the first N texts")
    ap.add_argument("--precision", default="fp32",
                    help="the compared side's precision profile (default fp32; exact stays fp32)")
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


def take(model, text, voice_kw, seed, streamed=False, **profile_kw):
    """One generation with post-processing off: (codes [C, T], audio [960 T], seconds, seconds
    to the first audio). `streamed`: through `model.stream`, its chunks' codes joined."""
    t0 = time.perf_counter()
    kw = dict(seed=seed, postprocess_output=False, **voice_kw, **profile_kw)
    if not streamed:
        s = model.synthesize(text, **kw)[0]
        took = time.perf_counter() - t0
        return s.codes, s.audio, took, took
    st = model.stream(text, **kw)
    audio = np.concatenate(list(st))
    codes = np.concatenate([c["codes"] for c in st.chunk_stats], axis=1)
    return codes, audio, time.perf_counter() - t0, st.first_audio_s


def compare(model, texts, voice_list, seeds: int, fast_kw: dict, exact_kw: dict,
            save: Path | None = None, profile: str = "fast", other=None) -> list[dict]:
    """`other`: the model of the compared side (another precision), else `model`."""
    sr, rows, streamed = model.sampling_rate, [], profile == "live"
    other = other or model
    for ti, text in enumerate(texts):
        for vname, vkw in voice_list:
            for seed in range(seeds):
                ce, we, te, fe = take(model, text, vkw, seed, streamed, profile="exact", **exact_kw)
                cf, wf, tf, ff = take(other, text, vkw, seed, streamed, profile=profile, **fast_kw)
                c2, w2, _, _ = take(model, text, vkw, seed + SEED_OFFSET, streamed, profile="exact",
                                    **exact_kw)
                rows.append({
                    "text": ti, "voice": vname, "seed": seed, "frames": int(ce.shape[1]),
                    "codes_equal": float((cf == ce).mean()) if cf.shape == ce.shape else None,
                    "mel_distance": mel_distance(wf, we, sr),
                    "seed_distance": mel_distance(w2, we, sr),
                    "seed_codes_equal": float((c2 == ce).mean()) if c2.shape == ce.shape else None,
                    "exact_s": te, "profile_s": tf, "exact_first_s": fe, "profile_first_s": ff,
                })
                if save is not None:
                    import soundfile as sf

                    save.mkdir(parents=True, exist_ok=True)
                    stem = f"t{ti}_{vname.replace(' ', '')}_s{seed}"
                    sf.write(save / f"exact_{stem}.wav", we, sr)
                    sf.write(save / f"{profile}_{stem}.wav", wf, sr)
                print(_row(rows[-1], streamed), flush=True)
    return rows


def _row(r: dict, streamed: bool = False) -> str:
    eq = "-" if r["codes_equal"] is None else f"{100 * r['codes_equal']:.1f} %"
    first = (f" {r['exact_first_s']:.1f} s | {r['profile_first_s']:.1f} s |" if streamed else "")
    return (f"| {r['text']} | {r['voice']} | {r['seed']} | {r['frames']} | {eq} | "
            f"{r['mel_distance']:.3f} | {r['seed_distance']:.3f} | {r['exact_s']:.1f} s | "
            f"{r['profile_s']:.1f} s | {r['profile_s'] / r['exact_s']:.2f} |{first}")


def header(profile: str = "fast") -> str:
    streamed = profile == "live"
    first = " first audio exact | first audio live |" if streamed else ""
    return (f"| text | voice | seed | frames | codes equal | mel distance {profile}-exact | mel "
            f"distance seed-to-seed | exact | {profile} | {profile} / exact |{first}\n"
            + "|---" * (12 if streamed else 10) + "|")


def summary(rows: list[dict]) -> dict:
    def mean(key):
        vals = [r[key] for r in rows if r[key] is not None]
        return float(np.mean(vals)) if vals else None

    return {"cases": len(rows), "codes_equal": mean("codes_equal"),
            "mel_distance": mean("mel_distance"), "seed_distance": mean("seed_distance"),
            "time_ratio": float(sum(r["profile_s"] for r in rows) / sum(r["exact_s"] for r in rows)),
            "first_audio_ratio": float(sum(r["profile_first_s"] for r in rows)
                                       / sum(r["exact_first_s"] for r in rows))}


def main(argv=None) -> dict:
    args = parse_args(argv)
    from omnicore import OmniVoice

    model = OmniVoice.from_pretrained(args.model)
    other = (None if args.precision == "fp32"
             else OmniVoice.from_pretrained(args.model, precision=args.precision))
    texts = (args.texts.read_text(encoding="utf-8").splitlines() if args.texts else list(TEXTS))
    texts = [t.strip() for t in texts if t.strip()][:args.max_texts]
    fast_kw = {k: v for k, v in (("num_step", args.fast_steps), ("prefix_refresh", args.prefix_refresh),
                                 ("uncond_every", args.uncond_every),
                                 ("first_chunk_steps", args.first_chunk_steps),
                                 ("first_chunk_seconds", args.first_chunk_seconds),
                                 ("first_chunk_max_seconds", args.first_chunk_max_seconds))
               if v is not None}
    print(header(args.profile), flush=True)
    exact_kw = {} if args.exact_steps is None else {"num_step": args.exact_steps}
    rows = compare(model, texts, voices(model, args), args.seeds, fast_kw, exact_kw, args.save,
                   args.profile, other)
    result = {"summary": summary(rows), "rows": rows, "profile": args.profile,
              "precision": args.precision,
              args.profile: fast_kw, "exact": exact_kw}
    s, p = result["summary"], args.profile
    equal = "-" if s["codes_equal"] is None else f"{100 * s['codes_equal']:.1f} %"
    first = (f"; its first audio came after {s['first_audio_ratio']:.2f}x exact's"
             if p == "live" else "")
    print(f"\nmean over {s['cases']} takes: codes equal {equal}, "
          f"mel distance {p}-exact {s['mel_distance']:.3f} against seed-to-seed "
          f"{s['seed_distance']:.3f}; {p} took {s['time_ratio']:.2f}x exact's time{first}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
