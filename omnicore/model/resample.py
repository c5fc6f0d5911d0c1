"""Band-limited resampling with the same numbers as `torchaudio.functional.resample` (defaults).

The product's form of `spec.resample` (model/spec.py), the same windowed-sinc kernel.

The codec's semantic branch hears 16 kHz (24 kHz -> 16 kHz before HuBERT) and every voice
reference is brought to 24 kHz first, so this is part of the model: its float32 windowed-sinc
kernel must round as torchaudio's does for the encoder's codes to match.

Dimension legend:
    L  samples of one signal (time)
    B  independent signals resampled together (leading axes flattened)
    P  polyphase output phases per block (new rate after gcd reduction)
    O  input hop per block (original rate after gcd reduction)
    K  taps of one polyphase filter (2*width + O); Kb taps kept in the banded variant
    N  output blocks (each yields P samples)
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import AudioError

# ---------------------------------------------------------------------------
# Resampling (same numbers as torchaudio.functional.resample with its defaults)
# ---------------------------------------------------------------------------

_LOWPASS_WIDTH = 6
_ROLLOFF = 0.99
_MAX_RATE = 1_000_000  # Hz; keeps filter tables bounded for absurd rates
_DENSE_MAX = 1 << 22  # filter-bank elements above which the banded variant is used
_CHUNK_ELEMS = 1 << 22  # elements per gathered/copied block (bounds temporary memory)


def _taps(p: np.ndarray, k: np.ndarray, orig: int, new: int, width: int, base: float) -> np.ndarray:
    """Windowed-sinc tap value for phase(s) `p` and tap index(es) `k` (broadcast), float32.

    torchaudio builds its kernel in the waveform's dtype, so for float32 audio every step is a
    float32 operation, and python-float constants are rounded to float32 before use (as torch
    does with scalar operands). Doing the same steps in the same order gives the same taps up to
    an ulp or two of sin/cos.
    """
    f32 = np.float32
    idx = (k - width).astype(f32) / f32(orig)
    t = (-p).astype(f32) / f32(new) + idx
    t = t * f32(base)
    t = np.clip(t, f32(-_LOWPASS_WIDTH), f32(_LOWPASS_WIDTH))
    window = np.cos(t * f32(math.pi) / f32(_LOWPASS_WIDTH) / f32(2)) ** 2
    t = t * f32(math.pi)
    safe = np.where(t == 0, f32(1.0), t)
    kernel = np.where(t == 0, f32(1.0), np.sin(safe) / safe)
    return (kernel * (window * f32(base / orig))).astype(f32)


def check_rate(name: str, sr) -> int:
    if isinstance(sr, (bool, np.bool_)) or not isinstance(sr, (int, float, np.integer, np.floating)):
        raise AudioError(f"{name} must be a number of Hz, got {type(sr).__name__}; pass e.g. 24000")
    try:
        rate = float(sr)
    except OverflowError:  # an int past the float range
        raise AudioError(f"{name} {sr} Hz is above {_MAX_RATE} Hz; pass the audio's true rate") from None
    if not math.isfinite(rate) or rate != int(sr) or int(sr) <= 0:
        raise AudioError(f"{name} must be a positive whole number of Hz, got {sr!r}; pass e.g. 24000")
    if int(sr) > _MAX_RATE:
        raise AudioError(f"{name} {int(sr)} Hz is above {_MAX_RATE} Hz; pass the audio's true rate")
    return int(sr)


def resample(x: np.ndarray, orig_sr: int, new_sr: int) -> np.ndarray:
    """Resample the last axis of `x` from `orig_sr` to `new_sr` Hz; returns a new float32 array.

    Same result as `torchaudio.functional.resample(x, orig_sr, new_sr)` with its defaults
    (Hann-windowed sinc, 6 zero crossings, rolloff 0.99) on a float32 tensor, to float32
    rounding: ceil(new_sr * L / orig_sr) output samples, any leading shape ([L], [C, L], ...).
    Equal rates return a float32 copy. Rates must be whole numbers in 1..1_000_000 Hz.
    The fast form of `spec.resample`.
    """
    orig_sr = check_rate("orig_sr", orig_sr)
    new_sr = check_rate("new_sr", new_sr)
    try:
        x = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        raise AudioError("resample needs a numeric array of samples") from None
    if x.ndim == 0:
        raise AudioError("resample needs an array of samples, got a scalar")
    if orig_sr == new_sr:
        return x.copy()
    g = math.gcd(orig_sr, new_sr)
    orig, new = orig_sr // g, new_sr // g
    base = min(orig, new) * _ROLLOFF  # python float, as in the reference
    width = math.ceil(_LOWPASS_WIDTH * orig / base)
    k_full = 2 * width + orig
    lead, length = x.shape[:-1], x.shape[-1]
    flat = x.reshape(math.prod(lead), length)  # [..., L] -> [B, L]
    target = math.ceil(new * length / orig)  # float division, as the reference does
    padded = np.zeros((flat.shape[0], length + k_full), dtype=np.float32)  # [B, L + K]
    padded[:, width:width + length] = flat
    if new * k_full <= _DENSE_MAX:
        out = _resample_dense(padded, length, orig, new, width, base, k_full)
    else:
        out = _resample_banded(padded, target, orig, new, width, base, k_full)
    return np.ascontiguousarray(out[:, :target].reshape(*lead, target))


def _resample_dense(padded, length, orig, new, width, base, k_full):
    """Polyphase GEMM: block n of O input hops times the [K, P] filter bank gives P outputs."""
    kernel = _taps(np.arange(new)[:, None], np.arange(k_full)[None, :], orig, new, width, base)  # [P, K]
    n_sig = padded.shape[0]
    n_blocks = length // orig + 1
    # Block n reads padded samples n*O .. n*O + K - 1: a stride-O view, copied to contiguous
    # rows in pieces so that the product goes through BLAS with bounded temporary memory.
    frames = np.lib.stride_tricks.as_strided(
        padded,
        shape=(n_sig, n_blocks, k_full),
        strides=(padded.strides[0], orig * padded.strides[1], padded.strides[1]),
        writeable=False,
    )  # [B, N, K]
    out = np.empty((n_sig, n_blocks, new), dtype=np.float32)  # [B, N, P]
    step = max(1, _CHUNK_ELEMS // k_full)
    for b in range(n_sig):
        for n0 in range(0, n_blocks, step):
            rows = np.ascontiguousarray(frames[b, n0:n0 + step])  # [n, K]
            out[b, n0:n0 + step] = rows @ kernel.T  # [n, K] @ [K, P] -> [n, P]
    return out.reshape(n_sig, n_blocks * new)  # sample n*P + p is phase p of block n


def _resample_banded(padded, target, orig, new, width, base, k_full):
    """Same sums for rate pairs whose dense filter bank would be huge (e.g. 3001 -> 24000 Hz).

    Taps with |t| >= lowpass width are clamped by the reference to a window value of
    cos(pi/2)^2 ~ 2e-15 times a sinc of ~3e-9 (about 1e-23): they are left out, and each phase
    keeps only its Kb taps around the sinc's support.
    """
    reach = _LOWPASS_WIDTH * orig / base
    kb = min(k_full, math.ceil(2 * reach) + 3)
    phases = np.arange(new)
    start = np.floor(width + orig * phases / new - reach).astype(np.int64) - 1
    start = np.clip(start, 0, k_full - kb)  # [P]
    taps = _taps(phases[:, None], start[:, None] + np.arange(kb)[None, :], orig, new, width, base)  # [P, Kb]
    out = np.empty((padded.shape[0], target), dtype=np.float32)  # [B, L']
    step = max(1, _CHUNK_ELEMS // (kb * padded.shape[0]))
    for j0 in range(0, target, step):
        j = np.arange(j0, min(target, j0 + step))  # output samples of this piece
        p = j % new
        first = (j // new) * orig + start[p]  # first padded sample read by each output
        gathered = padded[:, first[:, None] + np.arange(kb)[None, :]]  # [B, n, Kb]
        out[:, j] = np.einsum("bnk,nk->bn", gathered, taps[p])  # [B, n, Kb] . [n, Kb] -> [B, n]
    return out


