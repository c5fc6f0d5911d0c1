#!/usr/bin/env python3
"""Record the reference's audio handling (resampler, pydub silence removal, trimming, volume,
fades, chunk joins, prompt preparation, output post-processing) into tests/fixtures/reference.

    $OMNICORE_REF_VENV/bin/python tools/reference/dump_audio.py [--out tests/fixtures/reference]

Writes five npz files (float arrays float32, integer PCM int16, positions int64, parameters as
float64/int64 scalars, strings as unicode arrays; no pickles):

    audio_resample.npz  torchaudio.functional.resample on random and chirp signals, [L] and [C, L]
    audio_silence.npz   omnivoice.utils.audio.remove_silence / pydub detect_* on crafted signals
    audio_trim.npz      trim_long_audio on long references
    audio_prompt.npz    the waveform create_voice_clone_prompt hands to the codec encoder, + ref_rms
    audio_post.npz      _decode_and_post_process outputs, cross_fade_chunks, fade_and_pad_audio

The model methods are called on a stand-in object whose codec records its input (encode) or
returns prepared waveforms (decode), so only the reference's own audio code runs.
All signals are synthesised from fixed seeds and stored with their outputs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SPEECH = ROOT / "tests" / "fixtures" / "audio"  # espeak-ng clips committed by make_speech_clip.py
SR = 24000

RESAMPLE_PAIRS = [
    (24000, 16000), (8000, 24000), (11025, 24000), (16000, 24000), (22050, 24000),
    (44100, 24000), (48000, 24000),
    # coprime pairs with huge dense filter banks (omnicore's banded variant)
    (3001, 24000), (9973, 7919),
]


# ---------------------------------------------------------------------------
# signal synthesis
# ---------------------------------------------------------------------------


def _q(x: np.ndarray) -> np.ndarray:
    """Round to the int16 grid so stored inputs compress and are exactly representable."""
    return (np.round(np.clip(x, -1, 1 - 2**-15) * 32768) / 32768).astype(np.float32)


def _level(db: float) -> float:
    return 10 ** (db / 20)


_CYCLE = 2400  # 100 ms: every synthetic tone and noise bed repeats with this period


def _tile(cycle: np.ndarray, n: int) -> np.ndarray:
    # periodic signals keep the committed npz files small (zlib finds the repeats)
    return np.tile(cycle, n // len(cycle) + 1)[:n]


def _voiced(n: int, rng, amp: float) -> np.ndarray:
    """A buzzy harmonic tone with a 10 Hz loudness wobble: speech-like levels, exactly periodic."""
    period = int(rng.choice([120, 150, 160, 200, 240]))  # all divide _CYCLE
    k = np.arange(_CYCLE)
    harm = sum(rng.uniform(0.2, 1.0) / h * np.sin(2 * np.pi * h * k / period + rng.uniform(0, 6))
               for h in range(1, 7))
    env = 0.6 + 0.4 * np.sin(2 * np.pi * k / _CYCLE + rng.uniform(0, 6))
    cycle = harm * env
    return _tile(cycle / np.sqrt(np.mean(cycle**2)) * amp, n)


def _noise(n: int, rng, db: float) -> np.ndarray:
    cycle = rng.standard_normal(1201)  # odd length, so it does not line up with 10 ms windows
    return _tile(cycle / np.sqrt(np.mean(cycle**2)) * _level(db), n)


def _build(parts, seed: int) -> np.ndarray:
    """parts: (kind, samples, level) with kind 'voice' (rms amplitude), 'noise' (dBFS) or 'zero'."""
    rng = np.random.default_rng(seed)
    out = []
    for kind, n, lvl in parts:
        if kind == "voice":
            out.append(_voiced(n, rng, lvl))
        elif kind == "noise":
            out.append(_noise(n, rng, lvl))
        else:
            out.append(np.zeros(n))
    return _q(np.concatenate(out))


def _ms(ms: float, extra: int = 0) -> int:
    return int(ms * SR / 1000) + extra


def silence_signals() -> dict[str, np.ndarray]:
    sig = {}
    sig["gaps"] = _build([
        ("zero", _ms(430, 5), 0), ("voice", _ms(300), 0.2), ("zero", _ms(150), 0),
        ("voice", _ms(200, 3), 0.1), ("zero", _ms(199, 7), 0), ("voice", _ms(180), 0.15),
        ("noise", _ms(250), -55), ("voice", _ms(240), 0.2), ("noise", _ms(520, 11), -50.3),
        ("voice", _ms(120), 0.05), ("zero", _ms(700), 0), ("voice", _ms(100), 0.3),
        ("noise", _ms(600), -45), ("voice", _ms(260), 0.2), ("noise", _ms(380, 13), -60),
    ], seed=1)
    sig["levels"] = _build([
        ("noise", _ms(90), -49.7), ("voice", _ms(250, 1), 0.1), ("noise", _ms(510), -50.0),
        ("voice", _ms(90), 0.1), ("noise", _ms(320, 17), -49.9), ("voice", _ms(300), 0.02),
        ("noise", _ms(205), -51), ("voice", _ms(150), 0.1), ("noise", _ms(260, 12), -49.5),
    ], seed=2)
    rng = np.random.default_rng(3)
    n = _ms(900, 12)  # 900.5 ms: pydub rounds the length and pads slices
    env = np.repeat(rng.uniform(0, 1, n // 480 + 1) ** 3, 480)[:n]
    env[_ms(300):_ms(650)] = 0.0015
    sig["random"] = _q(rng.standard_normal(n) * env * 0.2)
    sig["odd_len"] = _build([("zero", _ms(333, 12), 0), ("voice", _ms(501, 13), 0.2),
                             ("zero", _ms(611, 20), 0)], seed=4)
    sig["all_zero"] = np.zeros(_ms(800), np.float32)
    sig["quiet_const"] = _build([("noise", _ms(400), -49)], seed=5)
    sig["tiny"] = _build([("voice", 37, 0.3)], seed=6)
    sig["short"] = _build([("voice", 500, 0.3), ("zero", 300, 0)], seed=7)
    return sig


def long_signal(seed: int, seconds: float, pause_every=(1.1, 2.6), pause=(0.3, 0.6), lead=0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts, total = [], 0.0
    if lead:
        parts.append(("zero", _ms(lead * 1000), 0))
        total += lead
    while total < seconds:
        d = rng.uniform(*pause_every)
        parts.append(("voice", _ms(d * 1000), float(rng.uniform(0.05, 0.25))))
        p = rng.uniform(*pause)
        parts.append(("zero", _ms(p * 1000), 0))
        total += d + p
    return _build(parts, seed=seed + 100)


# ---------------------------------------------------------------------------
# dumps
# ---------------------------------------------------------------------------


def _save(path: Path, arrays: dict) -> Path:
    np.savez_compressed(path, **arrays)
    return path


def dump_resample(out_dir: Path) -> Path:
    import torch
    import torchaudio

    rng = np.random.default_rng(10)
    arrays = {}
    for i, (o, n) in enumerate(RESAMPLE_PAIRS):
        length = int(o * 0.045) + 7 + i  # ~45 ms, odd lengths
        t = np.arange(length + 311) / o
        chirp = np.stack([np.sin(2 * np.pi * (100 + 0.5 * (o / 2) / t[-1] * t) * t),
                          0.5 * np.cos(2 * np.pi * (50 + 0.45 * (o / 2) / t[-1] * t) * t)])
        signals = {
            "noise": (rng.standard_normal(length) * 0.3).astype(np.float32),
            "chirp": chirp.astype(np.float32),
            "tiny": rng.uniform(-1, 1, 1 + i % 4).astype(np.float32),
        }
        if (o, n) == (24000, 16000):
            signals["long"] = (rng.standard_normal((1, 12007)) * 0.3).astype(np.float32)
        for name, x in signals.items():
            y = torchaudio.functional.resample(torch.from_numpy(x), o, n).numpy()
            key = f"{o}_{n}_{name}"
            arrays[key + "_in"] = x
            arrays[key + "_out"] = y.astype(np.float32)
    arrays["pairs"] = np.array(RESAMPLE_PAIRS, dtype=np.int64)
    return _save(out_dir / "audio_resample.npz", arrays)


def dump_silence(out_dir: Path) -> Path:
    from omnivoice.utils.audio import numpy_to_audiosegment, remove_silence
    from pydub.silence import detect_leading_silence, detect_nonsilent, detect_silence

    settings = {"prompt": (200, 100, 200), "output": (500, 100, 100), "default": (300, 100, 300),
                "edges_only": (0, 100, 300)}
    arrays = {}
    names = []
    for name, x in silence_signals().items():
        names.append(name)
        arrays[f"{name}_in"] = x
        for tag, (mid, lead, trail) in settings.items():
            y = remove_silence(x[None, :], SR, mid_sil=mid, lead_sil=lead, trail_sil=trail)
            arrays[f"{name}_{tag}_out"] = y[0].astype(np.float32)
        seg = numpy_to_audiosegment(x[None, :], SR)
        arrays[f"{name}_len_ms"] = np.int64(len(seg))
        arrays[f"{name}_lead_ms"] = np.int64(detect_leading_silence(seg, silence_threshold=-50))
        arrays[f"{name}_trail_ms"] = np.int64(detect_leading_silence(seg.reverse(), silence_threshold=-50))
        for msl, thr, step in [(200, -50, 10), (500, -50, 10), (100, -40, 10), (50, -50, 1), (300, -50, 7)]:
            key = f"{name}_{msl}_{-thr}_{step}"
            sil = detect_silence(seg, min_silence_len=msl, silence_thresh=thr, seek_step=step)
            non = detect_nonsilent(seg, min_silence_len=msl, silence_thresh=thr, seek_step=step)
            arrays[key + "_silent"] = np.array(sil, dtype=np.int64).reshape(-1, 2)
            arrays[key + "_nonsilent"] = np.array(non, dtype=np.int64).reshape(-1, 2)
    arrays["names"] = np.array(names)
    arrays["settings"] = np.array(list(settings))
    arrays["settings_values"] = np.array(list(settings.values()), dtype=np.int64)
    return _save(out_dir / "audio_silence.npz", arrays)


def dump_trim(out_dir: Path) -> Path:
    from omnivoice.utils.audio import trim_long_audio

    cases = {
        "pauses": long_signal(20, 22.0),
        "no_pause": _build([("voice", _ms(21000), 0.1)], seed=21),
        "late_start": long_signal(22, 22.0, lead=16.0),
    }
    arrays = {}
    for name, x in cases.items():
        arrays[f"{name}_in"] = x
        arrays[f"{name}_out"] = trim_long_audio(x[None, :], SR, trim_threshold=20.0)[0].astype(np.float32)
    arrays["names"] = np.array(list(cases))
    return _save(out_dir / "audio_trim.npz", arrays)


class _RecordingCodec:
    """Stands in for the Higgs codec: remembers what it is asked to encode, decodes by lookup."""

    def __init__(self, decoded=None):
        import torch

        self.config = SimpleNamespace(hop_length=960, frame_rate=25)
        self.device = torch.device("cpu")
        self.encoded = None
        self.decoded = decoded or []

    def encode(self, wav):
        import torch

        self.encoded = wav.detach().cpu().numpy()
        return SimpleNamespace(audio_codes=torch.zeros((1, 8, 1), dtype=torch.long))

    def decode(self, codes):
        import torch

        wav = self.decoded[int(codes[0, 0, 0])]
        return SimpleNamespace(audio_values=torch.from_numpy(wav[None, None, :].copy()))


def _stand_in(codec):
    from omnivoice.models.omnivoice import OmniVoice

    me = SimpleNamespace(
        audio_tokenizer=codec, sampling_rate=SR, _asr_pipe=object(),
        transcribe=lambda audio: "transcribed by the stand-in", load_asr_model=lambda *a, **k: None,
    )
    me._post_process_audio = lambda *a, **k: OmniVoice._post_process_audio(me, *a, **k)
    return me


def dump_prompt(out_dir: Path) -> Path:
    import soundfile as sf
    import torch
    from omnivoice.models.omnivoice import OmniVoice

    quiet = _build([("zero", _ms(350), 0), ("voice", _ms(900), 0.02), ("zero", _ms(420), 0),
                    ("voice", _ms(1100), 0.015), ("noise", _ms(300), -70)], seed=31)
    stereo16k = np.stack([
        _build([("zero", 1700, 0), ("voice", 16000, 0.05), ("zero", 4000, 0)], seed=32),
        _build([("zero", 1700, 0), ("voice", 16000, 0.03), ("zero", 4000, 0)], seed=33),
    ]).astype(np.float32)
    loud_pcm = (np.stack([_build([("zero", 4410, 0), ("voice", 44100, 0.2), ("zero", 20000, 0)], seed=34),
                          _build([("zero", 4410, 0), ("voice", 44100, 0.25), ("zero", 20000, 0)], seed=35)],
                         axis=1) * 32768).astype(np.int16)  # [L, 2] as soundfile returns it
    long_ref = long_signal(36, 22.0)

    cases = []  # (name, ref_audio builder, ref_text, preprocess, stored inputs)
    arrays = {}
    with tempfile.TemporaryDirectory() as tmp:
        wav_path = str(Path(tmp) / "loud.wav")
        sf.write(wav_path, loud_pcm, 44100, subtype="PCM_16")
        cases = [
            ("quiet_tuple", (torch.from_numpy(quiet), SR), "Hello there", True),
            ("stereo16k_raw", (torch.from_numpy(stereo16k), 16000), "Hello", False),
            ("stereo16k_pre", (torch.from_numpy(stereo16k), 16000), "Hello", True),
            ("loud_file", wav_path, "Hello", True),
            ("long_untranscribed", (torch.from_numpy(long_ref), SR), None, True),
        ]
        for clip in ("speech_24k", "speech_16k_stereo"):  # real speech, read from the file
            if (SPEECH / f"{clip}.wav").exists():
                cases.append((f"file_{clip}", str(SPEECH / f"{clip}.wav"), "The quick brown fox.", True))
        for name, src, text, pre in cases:
            codec = _RecordingCodec()
            prompt = OmniVoice.create_voice_clone_prompt(_stand_in(codec), src, ref_text=text, preprocess_prompt=pre)
            arrays[f"{name}_out"] = codec.encoded[0, 0].astype(np.float32)
            arrays[f"{name}_ref_rms"] = np.float64(prompt.ref_rms)
            arrays[f"{name}_preprocess"] = np.int64(pre)
            arrays[f"{name}_trim_long"] = np.int64(text is None)
    arrays["quiet_in"] = quiet
    arrays["stereo16k_in"] = stereo16k
    arrays["loud_pcm"] = loud_pcm
    arrays["long_in"] = long_ref
    arrays["names"] = np.array([c[0] for c in cases])
    return _save(out_dir / "audio_prompt.npz", arrays)


def dump_post(out_dir: Path) -> Path:
    import torch
    from omnivoice.models.omnivoice import OmniVoice, OmniVoiceGenerationConfig
    from omnivoice.utils.audio import cross_fade_chunks, fade_and_pad_audio

    speech = _build([("noise", _ms(120), -65), ("voice", _ms(700), 0.2), ("zero", _ms(650), 0),
                     ("voice", _ms(500), 0.15), ("noise", _ms(300), -58), ("voice", _ms(400, 9), 0.25),
                     ("zero", _ms(260), 0)], seed=40)
    chunk_a = _build([("voice", _ms(800), 0.2), ("zero", _ms(120), 0)], seed=41)
    chunk_b = _build([("zero", _ms(90), 0), ("voice", _ms(1100, 5), 0.1), ("zero", _ms(610), 0),
                      ("voice", _ms(300), 0.1)], seed=42)
    chunk_c = _build([("voice", 1000, 0.2)], seed=43)  # shorter than the cross-fade
    waves = [speech, chunk_a, chunk_b, chunk_c]
    if (SPEECH / "speech_24k.wav").exists():  # wave4: real speech standing in for decoded audio
        import soundfile as sf

        waves.append(sf.read(str(SPEECH / "speech_24k.wav"), dtype="float32")[0])
    cases = {
        "single_noref": (0, None, True, 0.1, 0.1),
        "single_quietref": (0, 0.05, True, 0.1, 0.1),
        "single_loudref_raw": (0, 0.3, False, 0.05, 0.02),
        "single_noref_raw": (0, None, False, 0.1, 0.1),
        "chunks_noref": ([1, 2, 3], None, True, 0.1, 0.1),
        "chunks_quietref_raw": ([1, 2], 0.02, False, 0.0, 0.0),
        "chunks_ref_odd": ([3, 1], 0.07, True, 0.0125, 0.3),
    }
    if len(waves) > 4:
        cases["speech_noref"] = (4, None, True, 0.1, 0.1)
        cases["speech_quietref"] = (4, 0.03, True, 0.1, 0.1)
    arrays = {f"wave{i}": w for i, w in enumerate(waves[:4])}  # wave4 is read from its file
    for name, (which, rms, post, pad, fade) in cases.items():
        codec = _RecordingCodec(decoded=waves)
        cfg = OmniVoiceGenerationConfig(postprocess_output=post, pad_duration=pad, fade_duration=fade)
        if isinstance(which, list):
            tokens = [torch.full((8, 1), i, dtype=torch.long) for i in which]
        else:
            tokens = torch.full((8, 1), which, dtype=torch.long)
        out = OmniVoice._decode_and_post_process(_stand_in(codec), tokens, rms, cfg)
        arrays[f"{name}_out"] = out.astype(np.float32)
        arrays[f"{name}_waves"] = np.array(which if isinstance(which, list) else [which], dtype=np.int64)
        arrays[f"{name}_ref_rms"] = np.float64(np.nan if rms is None else rms)
        arrays[f"{name}_postprocess"] = np.int64(post)
        arrays[f"{name}_pad_fade"] = np.array([pad, fade], dtype=np.float64)
    arrays["names"] = np.array(list(cases))
    # the pieces on their own
    joined = cross_fade_chunks([chunk_a[None], chunk_b[None], chunk_c[None]], SR)
    arrays["xfade_abc"] = joined[0].astype(np.float32)
    arrays["xfade_ca"] = cross_fade_chunks([chunk_c[None], chunk_a[None]], SR, silence_duration=0.5)[0]
    fades = [(0.1, 0.1, 0), (0.0125, 0.3, 3), (0.0, 0.05, 1), (0.2, 0.0, 2)]
    for i, (pad, fade, w) in enumerate(fades):
        arrays[f"fade{i}_out"] = fade_and_pad_audio(waves[w][None], pad_duration=pad, fade_duration=fade,
                                                    sample_rate=SR)[0]
    arrays["fade_params"] = np.array(fades, dtype=np.float64)
    return _save(out_dir / "audio_post.npz", arrays)


def dump(ckpt_dir: Path, out_dir: Path) -> list[Path]:
    """Write the audio fixtures (ckpt_dir is unused: no weights are involved)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [dump_resample(out_dir), dump_silence(out_dir), dump_trim(out_dir),
            dump_prompt(out_dir), dump_post(out_dir)]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", type=Path, default=ROOT / "weights" / "tiny-random")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "reference")
    args = ap.parse_args()
    for p in dump(args.ckpt, args.out):
        print(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}  {p.stat().st_size / 1e3:.0f} kB",
              file=sys.stderr)
