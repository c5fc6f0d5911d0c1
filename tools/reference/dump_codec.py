"""Dump reference tensors of the Higgs Audio V2 codec (transformers + torchaudio) for omnicore's tests.

Run with the reference venv:
    $OMNICORE_REF_VENV/bin/python tools/reference/dump_codec.py [CKPT_DIR] [OUT_DIR]
(defaults: weights/tiny-random and tests/fixtures/reference). CKPT_DIR is an OmniVoice checkpoint
(its `audio_tokenizer/` is used) or an audio tokenizer directory itself.

Files written (float32 / int64, np.savez_compressed, no pickle):
    codec_decode.npz    random codes of 1, 7 and 50 frames, a batch of 2, and 3 of 8 codebooks,
                        with the reference waveforms
    codec_resample.npz  the 24 kHz clip and torchaudio's 16 kHz resampling of it
    codec_encode.npz    one speech-like clip through the encoder: HuBERT states, averaged semantic
                        features, semantic/acoustic/fused latents, per-quantizer residuals, codes;
                        also codes of 0.1 s of silence
    codec_lengths.npz   codes for lengths with L mod 960 in {0, 119, 300, 631, 700}, through the
                        feature extractor (right zero-pad to the hop) and raw (the model's own
                        480-sample acoustic padding), plus the raw acoustic latents
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
SPEECH_WAV = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
LENGTH_CLASSES = (0, 119, 300, 631, 700)
SEED = 1234


def _codec_dir(ckpt_dir: Path) -> Path:
    sub = Path(ckpt_dir) / "audio_tokenizer"
    return sub if sub.is_dir() else Path(ckpt_dir)


def _load(codec_dir: Path):
    from transformers import HiggsAudioV2TokenizerModel

    model = HiggsAudioV2TokenizerModel.from_pretrained(codec_dir, dtype=torch.float32).eval()
    return model


def _feature_extractor(codec_dir: Path, cfg):
    from transformers import AutoFeatureExtractor, DacFeatureExtractor

    if (codec_dir / "preprocessor_config.json").is_file():
        return AutoFeatureExtractor.from_pretrained(codec_dir)
    return DacFeatureExtractor(feature_size=1, sampling_rate=cfg.sample_rate, hop_length=cfg.hop_length,
                               padding_value=0.0)


def speech_clip(sample_rate: int = 24000, seconds: float = 2.0) -> np.ndarray:
    """The shared speech fixture if present, else a deterministic vowel-like synthetic signal
    (a gliding glottal pulse train through three formant resonances, with onsets and a pause)."""
    if SPEECH_WAV.is_file():
        import soundfile as sf

        wav, sr = sf.read(SPEECH_WAV, dtype="float32", always_2d=True)
        wav = wav.mean(axis=1)
        if sr != sample_rate:
            import torchaudio.functional as AF

            wav = AF.resample(torch.from_numpy(wav), sr, sample_rate).numpy()
        return np.ascontiguousarray(wav[: int(seconds * sample_rate)], dtype=np.float32)
    rng = np.random.default_rng(SEED)
    n = int(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    f0 = 110 + 40 * np.sin(2 * np.pi * 0.7 * t) + 30 * t  # gliding pitch
    phase = np.cumsum(f0 / sample_rate)
    pulses = (np.diff(np.floor(phase), prepend=0) > 0).astype(np.float64)
    src = pulses + 0.02 * rng.standard_normal(n)
    out = np.zeros(n)
    for fc, bw in ((700, 110), (1220, 120), (2600, 160)):  # formants of an open vowel
        r = np.exp(-np.pi * bw / sample_rate)
        a1, a2 = 2 * r * np.cos(2 * np.pi * fc / sample_rate), -r * r
        y = np.zeros(n)
        for i in range(2, n):
            y[i] = src[i] + a1 * y[i - 1] + a2 * y[i - 2]
        out += y
    env = np.clip(np.sin(np.pi * t / 0.45) ** 2, 0, 1) * (t % 0.9 < 0.7)  # syllables and pauses
    out *= env
    return (0.3 * out / np.abs(out).max()).astype(np.float32)


@torch.no_grad()
def _decode(model, codes: np.ndarray) -> np.ndarray:
    batch = codes if codes.ndim == 3 else codes[None]
    wav = model.decode(torch.from_numpy(batch)).audio_values  # [B, 1, L]
    wav = wav[:, 0].numpy().astype(np.float32)
    return wav if codes.ndim == 3 else wav[0]


@torch.no_grad()
def _encoder_tensors(model, wav: np.ndarray) -> dict:
    """The steps of HiggsAudioV2TokenizerModel.encode, keeping every intermediate tensor."""
    x = torch.from_numpy(wav)[None, None]  # [1, 1, L]
    cfg = model.config
    # semantic branch, as in _extract_semantic_features
    import torchaudio.functional as AF

    x16 = AF.resample(x, cfg.sample_rate, cfg.semantic_sample_rate)[:, 0]
    x16 = torch.nn.functional.pad(x16, (160, 160))
    states = model.semantic_model(x16, output_hidden_states=True).hidden_states
    stacked = torch.stack(list(states), dim=1)
    hub = stacked.mean(dim=1)[:, :: cfg.semantic_downsample_factor]
    ref_hub = model._extract_semantic_features(x)
    assert torch.equal(hub, ref_hub), "semantic feature re-implementation drifted from the model"
    sem = model.encoder_semantic(hub.transpose(1, 2))
    padded = model._get_conv1d_output_lengths(x.shape[2], model.acoustic_encoder) != sem.shape[2]
    ac = model.acoustic_encoder(torch.nn.functional.pad(x, (model.pad, model.pad)) if padded else x)
    fused = model.fc(torch.cat([ac, sem], dim=1).transpose(1, 2)).transpose(1, 2)  # [1, D, T]
    residual, residuals, codes = fused, [], []
    for quantizer in model.quantizer.quantizers[: cfg.num_quantizers]:
        residuals.append(residual[0].T.clone())
        idx = quantizer.encode(residual)
        codes.append(idx[0])
        residual = residual - quantizer.decode(idx)
    codes = torch.stack(codes)
    ref_codes = model.encode(x).audio_codes[0]
    assert torch.equal(codes, ref_codes), "RVQ re-implementation drifted from the model"
    return {
        "hubert_states": stacked[0].numpy(),  # [layers + 1, F, Ds]
        "semantic_hubert": hub[0].numpy(),  # [T, Ds]
        "semantic": sem[0].T.numpy(),  # [T, Ds]
        "acoustic": ac[0].T.numpy(),  # [T, Ca]
        "acoustic_padded": np.array(padded),
        "fused": fused[0].T.numpy(),  # [T, D]
        "residuals": torch.stack(residuals).numpy(),  # [Q, T, D]
        "codes": codes.numpy().astype(np.int64),  # [Q, T]
    }


def _f32(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        v = np.asarray(v)
        out[k] = v.astype(np.float32) if v.dtype.kind == "f" else (v.astype(np.int64) if v.dtype.kind in "iu" else v)
    return out


def dump(ckpt_dir: Path, out_dir: Path) -> list[Path]:
    torch.manual_seed(SEED)
    codec_dir = _codec_dir(Path(ckpt_dir))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = _load(codec_dir)
    cfg = model.config
    nq, n = cfg.num_quantizers, cfg.codebook_size
    rng = np.random.default_rng(SEED)
    written = []

    dec = {}
    for t in (1, 7, 50):
        codes = rng.integers(0, n, size=(nq, t), dtype=np.int64)
        dec[f"codes_{t}"], dec[f"wav_{t}"] = codes, _decode(model, codes)
    dec["codes_batch"] = rng.integers(0, n, size=(2, nq, 7), dtype=np.int64)
    dec["wav_batch"] = _decode(model, dec["codes_batch"])
    dec["codes_q3"] = rng.integers(0, n, size=(3, 20), dtype=np.int64)
    dec["wav_q3"] = _decode(model, dec["codes_q3"])
    path = out_dir / "codec_decode.npz"
    np.savez_compressed(path, **_f32(dec))
    written.append(path)

    import torchaudio.functional as AF

    clip = speech_clip(cfg.sample_rate)
    res = {"x24": clip, "x16": AF.resample(torch.from_numpy(clip), cfg.sample_rate, cfg.semantic_sample_rate).numpy()}
    odd = clip[: 24000 // 3 + 7]  # a length that is not a multiple of 3
    res["x24_odd"] = odd
    res["x16_odd"] = AF.resample(torch.from_numpy(odd), cfg.sample_rate, cfg.semantic_sample_rate).numpy()
    path = out_dir / "codec_resample.npz"
    np.savez_compressed(path, **_f32(res))
    written.append(path)

    fe = _feature_extractor(codec_dir, cfg)
    padded = fe(clip, sampling_rate=cfg.sample_rate, return_tensors="np")["input_values"][0, 0]
    enc = {"input": clip, "input_padded": padded, **_encoder_tensors(model, padded)}
    silence = np.zeros(int(0.1 * cfg.sample_rate), np.float32)
    sil_padded = fe(silence, sampling_rate=cfg.sample_rate, return_tensors="np")["input_values"][0, 0]
    enc["silence_codes"] = _encoder_tensors(model, sil_padded)["codes"]
    path = out_dir / "codec_encode.npz"
    np.savez_compressed(path, **_f32(enc))
    written.append(path)

    lens = {}
    for r in LENGTH_CLASSES:
        wav = clip[: 3 * cfg.hop_length + r]
        lens[f"wav_{r}"] = wav
        padded = fe(wav, sampling_rate=cfg.sample_rate, return_tensors="np")["input_values"][0, 0]
        lens[f"padded_len_{r}"] = np.array(padded.shape[0])
        lens[f"codes_padded_{r}"] = _encoder_tensors(model, padded)["codes"]
        raw = _encoder_tensors(model, wav)
        lens[f"codes_raw_{r}"] = raw["codes"]
        lens[f"acoustic_raw_{r}"] = raw["acoustic"]
        lens[f"acoustic_padded_raw_{r}"] = raw["acoustic_padded"]
    path = out_dir / "codec_lengths.npz"
    np.savez_compressed(path, **_f32(lens))
    written.append(path)
    return written


if __name__ == "__main__":
    torch.set_num_threads(1)  # as dump_reference.py does: same bytes either way
    ckpt = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "weights" / "tiny-random"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests" / "fixtures" / "reference"
    for p in dump(ckpt, out):
        print(f"{p}  {p.stat().st_size / 1024:.0f} KiB")
