"""Audio front/back-end in numpy: resampling, loading, and the reference's clean-up steps.

Dimension legend:
    L  samples of one channel (time)
    C  channels
    P  polyphase output phases per block (new rate after gcd reduction)
    O  input hop per block (original rate after gcd reduction)
    K  taps of one polyphase filter (2*width + O)
    N  output blocks (each yields P samples)
"""

from __future__ import annotations

import math

import numpy as np

from omnicore.errors import AudioError

SAMPLE_RATE = 24000

# ---------------------------------------------------------------------------
# Resampling (matches torchaudio.functional.resample with its defaults)
# ---------------------------------------------------------------------------

_LOWPASS_WIDTH = 6
_ROLLOFF = 0.99


def _sinc_kernel(orig: int, new: int) -> tuple[np.ndarray, int]:
    """Polyphase windowed-sinc filter bank for gcd-reduced rates, built in float32.

    Every step is done in float32 in the same order as torchaudio does when the waveform is
    float32 (it builds the kernel in the waveform's dtype), so the taps agree to the last ulp or
    two of sin/cos; python-float constants are rounded to float32 first, as torch does for
    scalar operands of a float32 tensor.
    """
    f32 = np.float32
    base = min(orig, new) * _ROLLOFF  # python float, like the reference
    width = math.ceil(_LOWPASS_WIDTH * orig / base)
    idx = np.arange(-width, width + orig, dtype=f32) / f32(orig)  # [K]
    t = np.arange(0, -new, -1, dtype=f32)[:, None] / f32(new) + idx[None, :]  # [P, K]
    t = t * f32(base)
    t = np.clip(t, f32(-_LOWPASS_WIDTH), f32(_LOWPASS_WIDTH))
    window = np.cos(t * f32(math.pi) / f32(_LOWPASS_WIDTH) / f32(2)) ** 2
    t = t * f32(math.pi)
    with np.errstate(invalid="ignore", divide="ignore"):
        kernel = np.where(t == 0, f32(1.0), np.sin(t) / t)  # [P, K]
    kernel = kernel * (window * f32(base / orig))
    return kernel.astype(f32), width


def resample(x: np.ndarray, orig_sr: int, new_sr: int) -> np.ndarray:
    """Resample the last axis of `x` from `orig_sr` to `new_sr` Hz; returns float32.

    Same result as `torchaudio.functional.resample(x, orig_sr, new_sr)` with its defaults
    (Hann-windowed sinc, 6 zero crossings, rolloff 0.99) on a float32 tensor: the output has
    ceil(new_sr * L / orig_sr) samples. Works on any leading shape ([L], [C, L], ...).
    Equal rates return a float32 copy.
    """
    x = np.asarray(x, dtype=np.float32)
    if int(orig_sr) != orig_sr or int(new_sr) != new_sr or orig_sr <= 0 or new_sr <= 0:
        raise AudioError(
            f"sample rates must be positive integers, got {orig_sr!r} -> {new_sr!r}; "
            "pass the audio's true rate in Hz as an int"
        )
    orig_sr, new_sr = int(orig_sr), int(new_sr)
    if orig_sr == new_sr:
        return x.copy()
    g = math.gcd(orig_sr, new_sr)
    orig, new = orig_sr // g, new_sr // g
    kernel, width = _sinc_kernel(orig, new)  # [P, K]
    lead = x.shape[:-1]
    length = x.shape[-1]
    flat = x.reshape(-1, length)  # [..., L] -> [B, L]
    # Zero padding (width left, width + O right) and a stride-O view turn the strided
    # convolution into one GEMM: block n reads padded samples n*O .. n*O + K - 1.
    padded = np.zeros((flat.shape[0], length + 2 * width + orig), dtype=np.float32)
    padded[:, width:width + length] = flat
    n_blocks = length // orig + 1
    k = kernel.shape[1]
    frames = np.lib.stride_tricks.as_strided(
        padded,
        shape=(flat.shape[0], n_blocks, k),
        strides=(padded.strides[0], orig * padded.strides[1], padded.strides[1]),
        writeable=False,
    )  # [B, N, K]
    out = frames @ kernel.T  # [B, N, K] @ [K, P] -> [B, N, P]
    # Sample n*P + p of the output is phase p of block n; the reference computes the
    # target length with float division, so do the same.
    target = math.ceil(new * length / orig)
    out = out.reshape(flat.shape[0], n_blocks * new)[:, :target]  # [B, N*P] -> [B, L']
    return np.ascontiguousarray(out.reshape(*lead, target))
