"""`resample` with torchaudio's defaults (Hann-windowed sinc, 6 zero crossings, rolloff 0.99),
in torch on the waveform's device: the same filter bank, built in the waveform's dtype, and the
same strided convolution."""

import math

import torch
import torch.nn.functional as F


def resample(waveform, orig_freq, new_freq, lowpass_filter_width=6, rolloff=0.99,
             resampling_method="sinc_interp_hann", beta=None):
    if resampling_method not in ("sinc_interp_hann", "sinc_interpolation"):
        raise NotImplementedError(f"the torchaudio stand-in only has the Hann window, not {resampling_method}")
    orig_freq, new_freq = int(orig_freq), int(new_freq)
    if orig_freq == new_freq:
        return waveform
    g = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // g, new_freq // g
    base = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base)
    dtype = waveform.dtype if waveform.is_floating_point() else torch.float32
    dev = waveform.device
    idx = torch.arange(-width, width + orig, dtype=dtype, device=dev)[None, None] / orig  # [1, 1, K]
    t = torch.arange(0, -new, -1, dtype=dtype, device=dev)[:, None, None] / new + idx  # [P, 1, K]
    t = (t * base).clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    kernels = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t) * (window * (base / orig))
    shape = waveform.shape
    flat = waveform.reshape(-1, shape[-1]).to(dtype)  # [B, L]
    length = flat.shape[-1]
    padded = F.pad(flat, (width, width + orig))
    out = F.conv1d(padded[:, None], kernels, stride=orig)  # [B, P, N]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)  # phase-interleaved: [B, N*P]
    target = math.ceil(new * length / orig)
    return out[..., :target].reshape(*shape[:-1], -1)
