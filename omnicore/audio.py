"""Audio front/back-end in numpy: resampling, loading, clean-up of references and outputs.

Everything here runs on the CPU in numpy (audio handling is a tiny share of the work), on mono
float32 waveforms in [-1, 1] unless a docstring says otherwise. The defaults and arithmetic
follow what the reference (omnivoice 0.2.1) does around generation, so that omnicore's outputs
have the same length and samples:

* `resample` reproduces `torchaudio.functional.resample` (its defaults) on float32 input.
* `load_audio` reads a file or an in-memory array, mixes to mono and resamples to 24 kHz.
* `remove_silence`, `trim_long_audio` reproduce the reference's pydub calls exactly: pydub
  works on 16-bit PCM, measures time in whole milliseconds and loudness as the integer RMS of
  `audioop.rms`, so those steps quantise their output to int16 steps (x/32768).
* `prepare_reference_audio` and `postprocess_output` compose the steps the way the reference's
  `create_voice_clone_prompt` and `_decode_and_post_process` do.
* `write_audio_atomic` writes through `AtomicOutput`, the one atomic writer every omnicore
  output goes through (unique temporary file in the target's folder, fsync, rename).

Dimension legend:
    L  samples of one channel (time)
    C  channels
    B  independent signals resampled together (leading axes flattened)
    P  polyphase output phases per block (new rate after gcd reduction)
    O  input hop per block (original rate after gcd reduction)
    K  taps of one polyphase filter (2*width + O); Kb taps kept in the banded variant
    N  output blocks (each yields P samples)
    W  windows scanned by the silence detector
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from typing import BinaryIO, Callable, Sequence, Union

import numpy as np

from omnicore.errors import AudioError, OmniCoreError

logger = logging.getLogger(__name__)

SAMPLE_RATE = 24000

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


def _check_rate(name: str, sr) -> int:
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
    """
    orig_sr = _check_rate("orig_sr", orig_sr)
    new_sr = _check_rate("new_sr", new_sr)
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


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

MAX_CHANNELS = 64
MAX_SECONDS = 3600.0

AudioSource = Union[str, os.PathLike, tuple]


def _int_to_float(a: np.ndarray) -> np.ndarray:
    """Scale integer PCM to [-1, 1) the way libsndfile does when soundfile reads it as float."""
    if a.dtype == np.uint8:
        return ((a.astype(np.float32) - np.float32(128)) / np.float32(128)).astype(np.float32)
    if np.issubdtype(a.dtype, np.signedinteger):
        # a power-of-two scale is exact, so casting first rounds exactly like libsndfile
        return a.astype(np.float32) / np.float32(2 ** (8 * a.dtype.itemsize - 1))
    raise AudioError(
        f"audio samples of type {a.dtype} are not supported; pass float32/float64 in [-1, 1] "
        "or int8/int16/int32/uint8 PCM"
    )


def _channels_first(a: np.ndarray) -> np.ndarray:
    """[L] -> [1, L]; a 2-D array is [C, L] or [L, C]: the shorter axis is the channel axis."""
    if a.ndim == 1:
        return a[None, :]
    if a.ndim != 2:
        raise AudioError(
            f"audio array must be 1-D [samples] or 2-D [channels, samples], got shape {a.shape}"
        )
    cl = a if a.shape[0] <= a.shape[1] else a.T  # [C, L]
    if cl.shape[0] > MAX_CHANNELS:
        raise AudioError(
            f"audio array {a.shape} would have {cl.shape[0]} channels (more than {MAX_CHANNELS}); "
            "pass [channels, samples] or [samples, channels] with a sensible channel count"
        )
    return cl


def _read_file(path) -> tuple[np.ndarray, int]:
    import soundfile as sf

    name = os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if not os.path.exists(name):
        raise AudioError(f"audio file not found: {name!r}; check the path")
    if os.path.isdir(name):
        raise AudioError(f"{name!r} is a folder, not an audio file; pass the path of a WAV/FLAC/OGG file")
    try:
        data, sr = sf.read(name, dtype="float32", always_2d=True)  # [L, C]
    except Exception as exc:  # libsndfile reports every unreadable format the same way
        raise AudioError(
            f"cannot read audio file {name!r} ({exc}); convert it to WAV, FLAC or OGG "
            "(e.g. `ffmpeg -i input.m4a output.wav`) and try again"
        ) from None
    return data.T, int(sr)  # [L, C] -> [C, L] (a view, as in the reference)


def load_audio(src: AudioSource, target_sr: int = SAMPLE_RATE, *, min_seconds: float = 0.0) -> np.ndarray:
    """Read audio and return it as mono float32 [L] at `target_sr` Hz.

    `src` is either a path of any file soundfile can read (WAV, FLAC, OGG, MP3 with
    libsndfile >= 1.1, ...) or a tuple `(samples, sample_rate)` where `samples` is array-like
    [L], [C, L] or [L, C] (for 2-D input the shorter axis is taken as channels, so any clip longer
    than its channel count is read correctly; at most 64 channels). Float samples are taken as
    they are; integer samples are scaled like soundfile does when reading int PCM (int16 /32768,
    int32 /2**31, int8 /128, uint8 (x-128)/128). Channels are averaged in float32, as the
    reference does, then `resample` brings the rate to `target_sr`.

    Raises AudioError (saying what to do) for an unreadable/missing file, an empty or non-finite
    signal, a bad rate, too many channels, more than an hour of audio, or audio shorter than
    `min_seconds`.
    """
    target_sr = _check_rate("target_sr", target_sr)
    if isinstance(src, tuple):
        if len(src) != 2:
            raise AudioError("in-memory audio must be a tuple (samples, sample_rate)")
        samples, sr = src
        sr = _check_rate("sample rate", sr)
        try:
            a = np.asarray(samples)
        except Exception:
            raise AudioError("audio samples must be a numeric array") from None
        if a.dtype == object or a.dtype.kind not in "biuf":
            raise AudioError(f"audio samples must be real numbers, got dtype {a.dtype}")
        if a.dtype.kind == "b":
            raise AudioError("audio samples must be numbers, not booleans")
        if a.dtype.kind in "iu":
            a = _int_to_float(a)
        data = _channels_first(a).astype(np.float32, copy=False)  # [C, L]
    elif isinstance(src, (str, bytes, os.PathLike)):
        data, sr = _read_file(src)  # [C, L]
        if sr <= 0:
            raise AudioError(f"audio file {src!r} declares a sample rate of {sr} Hz; re-export it")
        sr = _check_rate("sample rate", sr)
        if data.shape[0] > MAX_CHANNELS:
            raise AudioError(f"audio file {src!r} has {data.shape[0]} channels; export it as mono or stereo")
    else:
        raise AudioError(
            f"audio must be a file path or a (samples, sample_rate) tuple, got {type(src).__name__}"
        )
    if data.shape[-1] == 0 or data.shape[0] == 0:
        raise AudioError("the audio is empty (0 samples); pass a recording with sound in it")
    if data.shape[-1] / sr > MAX_SECONDS:
        raise AudioError(
            f"the audio is {data.shape[-1] / sr:.0f} s long (limit {MAX_SECONDS:.0f} s); "
            "cut it to the part you need (3-10 s is best for a voice reference)"
        )
    if data.shape[-1] / sr < min_seconds:
        raise AudioError(
            f"the audio is only {data.shape[-1] / sr:.3f} s long; use at least {min_seconds} s"
        )
    if not np.isfinite(data).all():
        raise AudioError("the audio contains NaN or infinite samples; fix or re-export the recording")
    if data.shape[0] > 1:
        data = np.mean(data, axis=0, keepdims=True)  # [C, L] -> [1, L]
    return resample(data[0], sr, target_sr)  # [L] -> [L']


# ---------------------------------------------------------------------------
# pydub's silence detection, on 16-bit PCM with millisecond positions
# ---------------------------------------------------------------------------
# pydub measures positions in whole ms and turns them into samples with int(ms * sr/1000);
# a segment's length in ms is round(1000 * samples / sr) (Python's round), so it can claim up
# to half a millisecond more than its samples, and a slice ending there is zero-padded to the
# claimed length. Loudness is audioop.rms: floor(sqrt(sum(x^2) / n)) over int16 samples. The
# helpers below reproduce those rules on numpy int16 arrays so the cut points are identical.


def _pcm16(wav: np.ndarray) -> np.ndarray:
    """float [-1, 1] -> int16 the way the reference hands audio to pydub (scale, clip, truncate)."""
    return (np.asarray(wav, dtype=np.float32) * 32768.0).clip(-32768, 32767).astype(np.int16)


def _from_pcm16(pcm: np.ndarray) -> np.ndarray:
    return pcm.astype(np.float32) / 32768.0


def _len_ms(n: int, sr: int) -> int:
    return round(1000 * (n / sr))


def _slice_bounds(n: int, sr: int, start_ms: np.ndarray, end_ms: np.ndarray):
    """Sample range, and length after pydub's zero padding, of slices seg[start:end] (ms >= 0)."""
    total = _len_ms(n, sr)
    a = np.minimum(start_ms, total)
    b = np.minimum(end_ms, total)
    s = (a * (sr / 1000.0)).astype(np.int64)  # int() truncation of non-negative floats
    e = (b * (sr / 1000.0)).astype(np.int64)
    have = np.clip(np.minimum(e, n) - s, 0, None)
    # pydub pads a short slice with zero frames, but only when the slice got some data at all
    size = np.where((have > 0) & (e - s > have), e - s, have)
    return s, e, have, size


def _slice_ms(pcm: np.ndarray, sr: int, start_ms=None, end_ms=None) -> np.ndarray:
    """pydub's `segment[start_ms:end_ms]` for non-negative positions."""
    n = len(pcm)
    start_ms = 0 if start_ms is None else start_ms
    end_ms = _len_ms(n, sr) if end_ms is None else end_ms
    s, _, have, size = (int(v) for v in _slice_bounds(n, sr, np.array(start_ms), np.array(end_ms)))
    out = np.zeros(size, dtype=np.int16)
    out[:have] = pcm[s:s + have]
    return out


def _window_rms(pcm: np.ndarray, sr: int, start_ms: np.ndarray, end_ms: np.ndarray) -> np.ndarray:
    """audioop.rms of many slices seg[start:end] at once via a prefix sum of squares.  [W] -> [W]"""
    sq = np.concatenate([[0], np.cumsum(pcm.astype(np.int64) ** 2)])  # [L+1], exact in int64
    s, _, have, size = _slice_bounds(len(pcm), sr, start_ms, end_ms)
    lo = np.minimum(s, len(pcm))
    total = sq[lo + have] - sq[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.floor(np.sqrt(total.astype(np.float64) / size))
    return np.where(size > 0, rms, 0).astype(np.int64)


def _quiet_rms_limit(threshold_db: float) -> int:
    """Largest integer RMS whose dBFS (pydub: 20*log(rms/32768, 10)) is below `threshold_db`."""
    lo, hi = 0, 32768  # rms 0 is -inf dBFS: always quiet
    if 20 * math.log(hi / 32768.0, 10) < threshold_db:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if 20 * math.log(mid / 32768.0, 10) < threshold_db:
            lo = mid
        else:
            hi = mid
    return lo


def detect_leading_silence(pcm: np.ndarray, sr: int = SAMPLE_RATE, silence_threshold: float = -50.0,
                           chunk_size: int = 10) -> int:
    """pydub's `detect_leading_silence` on int16 mono PCM: ms where the leading quiet part ends."""
    total = _len_ms(len(pcm), sr)
    starts = np.arange(0, total, chunk_size)  # [W] every chunk start the loop could test
    quiet = _window_rms(pcm, sr, starts, starts + chunk_size) <= _quiet_rms_limit(silence_threshold)
    loud = np.flatnonzero(~quiet)
    trim = int(starts[loud[0]]) if loud.size else len(starts) * chunk_size
    return min(trim, total)


def detect_silence(pcm: np.ndarray, sr: int = SAMPLE_RATE, min_silence_len: int = 1000,
                   silence_thresh: float = -16, seek_step: int = 1) -> list[list[int]]:
    """pydub's `detect_silence` on int16 mono PCM: [start_ms, end_ms] of each silent stretch."""
    seg_len = _len_ms(len(pcm), sr)
    if seg_len < min_silence_len:
        return []
    limit = 10 ** (float(silence_thresh) / 20) * 32768.0
    last = seg_len - min_silence_len
    starts = np.arange(0, last + 1, seek_step)
    if last % seek_step:
        starts = np.append(starts, last)  # pydub always tests the final window
    quiet = starts[_window_rms(pcm, sr, starts, starts + min_silence_len) <= limit]  # [W']
    if quiet.size == 0:
        return []
    # Quiet windows merge into one stretch unless a jump is both discontinuous and wider
    # than a window, as pydub's loop decides.
    gap = quiet[1:] - quiet[:-1]
    cut = (gap != seek_step) & (gap > min_silence_len)
    first = np.concatenate([quiet[:1], quiet[1:][cut]])
    last_start = np.concatenate([quiet[:-1][cut], quiet[-1:]])
    return [[int(a), int(b) + min_silence_len] for a, b in zip(first, last_start)]


def detect_nonsilent(pcm: np.ndarray, sr: int = SAMPLE_RATE, min_silence_len: int = 1000,
                     silence_thresh: float = -16, seek_step: int = 1) -> list[list[int]]:
    """pydub's `detect_nonsilent`: the [start_ms, end_ms] stretches between silences."""
    silent = detect_silence(pcm, sr, min_silence_len, silence_thresh, seek_step)
    seg_len = _len_ms(len(pcm), sr)
    if not silent:
        return [[0, seg_len]]
    if silent[0][0] == 0 and silent[0][1] == seg_len:
        return []
    ranges, prev_end = [], 0
    for start, end in silent:
        ranges.append([prev_end, start])
        prev_end = end
    if silent[-1][1] != seg_len:
        ranges.append([prev_end, seg_len])
    if ranges[0] == [0, 0]:
        ranges.pop(0)
    return ranges


def split_on_silence(pcm: np.ndarray, sr: int = SAMPLE_RATE, min_silence_len: int = 1000,
                     silence_thresh: float = -16, keep_silence: int | bool = 100,
                     seek_step: int = 1) -> list[np.ndarray]:
    """pydub's `split_on_silence` on int16 mono PCM: the sounding pieces, each with up to
    `keep_silence` ms of context (shared halfway when two pieces' context would overlap)."""
    seg_len = _len_ms(len(pcm), sr)
    if isinstance(keep_silence, (bool, np.bool_)):
        keep_silence = seg_len if keep_silence else 0
    ranges = [[a - keep_silence, b + keep_silence]
              for a, b in detect_nonsilent(pcm, sr, min_silence_len, silence_thresh, seek_step)]
    for left, right in zip(ranges, ranges[1:]):
        if right[0] < left[1]:
            left[1] = (left[1] + right[0]) // 2
            right[0] = left[1]
    return [_slice_ms(pcm, sr, max(a, 0), min(b, seg_len)) for a, b in ranges]


def _trim_edges_pcm(pcm: np.ndarray, sr: int, lead_sil: int, trail_sil: int, threshold: float) -> np.ndarray:
    start = max(0, detect_leading_silence(pcm, sr, threshold) - lead_sil)
    pcm = _slice_ms(pcm, sr, start)[::-1]
    start = max(0, detect_leading_silence(pcm, sr, threshold) - trail_sil)
    return np.ascontiguousarray(_slice_ms(pcm, sr, start)[::-1])


def remove_silence(wav: np.ndarray, sr: int = SAMPLE_RATE, mid_sil: int = 300, lead_sil: int = 100,
                   trail_sil: int = 300) -> np.ndarray:
    """Shorten inner silences and trim the edges, exactly as the reference's `remove_silence`.

    Inner stretches quieter than -50 dBFS lasting >= `mid_sil` ms (scanned in 10 ms steps) are
    cut down to `mid_sil` ms of context on each side (skipped when mid_sil <= 0); then leading
    and trailing quiet is trimmed to at most `lead_sil` / `trail_sil` ms (scanned in 10 ms
    chunks). Works on 16-bit PCM like pydub, so the result is float32 on a 1/32768 grid and can
    be a few samples longer than the sounding part (pydub's ms rounding pads with zeros).
    """
    pcm = _pcm16(wav)
    if mid_sil > 0:
        pieces = split_on_silence(pcm, sr, mid_sil, -50, keep_silence=mid_sil, seek_step=10)
        pcm = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16)
    return _from_pcm16(_trim_edges_pcm(pcm, sr, lead_sil, trail_sil, -50))


def trim_long_audio(wav: np.ndarray, sr: int = SAMPLE_RATE, max_duration: float = 15.0,
                    min_duration: float = 3.0, trim_threshold: float = 20.0) -> np.ndarray:
    """Cut audio longer than `trim_threshold` s at a pause, as the reference's `trim_long_audio`.

    Sounding stretches are found at -40 dBFS (100 ms windows, 10 ms steps); the cut goes at the
    latest stretch start within `max_duration`, or at `max_duration` when that start is before
    `min_duration`. Audio at most `trim_threshold` s long (or with no sounding stretch) is
    returned unchanged; trimmed audio comes back on pydub's int16 grid.
    """
    wav = np.asarray(wav, dtype=np.float32)
    if len(wav) / sr <= trim_threshold:
        return wav
    pcm = _pcm16(wav)
    sounding = detect_nonsilent(pcm, sr, min_silence_len=100, silence_thresh=-40, seek_step=10)
    if not sounding:
        return wav
    max_ms, min_ms = int(max_duration * 1000), int(min_duration * 1000)
    split = 0
    for start, end in sounding:
        if split < start <= max_ms:
            split = start
        if end > max_ms:
            break
    if split < min_ms:
        split = min(max_ms, _len_ms(len(pcm), sr))
    return _from_pcm16(_slice_ms(pcm, sr, 0, split))


# ---------------------------------------------------------------------------
# Volume, fades, joins
# ---------------------------------------------------------------------------

REF_RMS_TARGET = 0.1  # references quieter than this are boosted to it, outputs scaled back
PEAK_TARGET = 0.5  # outputs without a reference are peak-normalised to this


def reference_rms(wav: np.ndarray) -> float:
    """Root mean square of a waveform, accumulated in float32 like the reference."""
    wav = np.asarray(wav, dtype=np.float32)
    return float(np.sqrt(np.mean(wav.reshape(1, -1) ** 2)))


def normalize_reference_volume(wav: np.ndarray) -> tuple[np.ndarray, float]:
    """Boost a quiet reference (0 < RMS < 0.1) to RMS 0.1; returns (waveform, original RMS)."""
    wav = np.asarray(wav, dtype=np.float32)
    rms = reference_rms(wav)
    if 0 < rms < REF_RMS_TARGET:
        wav = wav * REF_RMS_TARGET / rms
    return wav, rms


def match_output_volume(wav: np.ndarray, ref_rms: float | None) -> np.ndarray:
    """Undo the reference boost on generated audio (scale by ref_rms/0.1 when ref_rms < 0.1);
    without a reference (ref_rms None) peak-normalise instead."""
    wav = np.asarray(wav, dtype=np.float32)
    if ref_rms is not None:
        return wav * ref_rms / REF_RMS_TARGET if ref_rms < REF_RMS_TARGET else wav
    return peak_normalize(wav)


def peak_normalize(wav: np.ndarray, peak_target: float = PEAK_TARGET) -> np.ndarray:
    """Scale so the largest |sample| is `peak_target` (left alone when the peak is <= 1e-6).

    The reference fails on an empty waveform here; an empty one is returned unchanged.
    """
    wav = np.asarray(wav, dtype=np.float32)
    if wav.size == 0:
        return wav
    peak = np.abs(wav).max()
    return wav / peak * peak_target if peak > 1e-6 else wav


def fade_and_pad(wav: np.ndarray, pad_duration: float = 0.1, fade_duration: float = 0.1,
                 sr: int = SAMPLE_RATE) -> np.ndarray:
    """Linear fade-in/out over `fade_duration` s (at most half the clip each) and
    `pad_duration` s of zeros on both sides, as the reference's `fade_and_pad_audio`."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.shape[-1] == 0:
        return wav
    fade_n, pad_n = int(fade_duration * sr), int(pad_duration * sr)
    out = wav.copy()
    if fade_n > 0:
        k = min(fade_n, out.shape[-1] // 2)
        if k > 0:
            out[..., :k] *= np.linspace(0, 1, k, dtype=np.float32)
            out[..., -k:] *= np.linspace(1, 0, k, dtype=np.float32)
    if pad_n > 0:
        zeros = np.zeros(out.shape[:-1] + (pad_n,), dtype=out.dtype)
        out = np.concatenate([zeros, out, zeros], axis=-1)  # [L] -> [L + 2*pad]
    return out


def cross_fade_chunks(chunks: Sequence[np.ndarray], sr: int = SAMPLE_RATE,
                      silence_duration: float = 0.3) -> np.ndarray:
    """Join separately generated chunks as the reference's `cross_fade_chunks`: each join
    fades the left side out and the right side in over a third of `silence_duration` and puts
    a third of it as zeros in between."""
    chunks = [np.asarray(c, dtype=np.float32) for c in chunks]
    if not chunks:
        raise AudioError("no audio chunks to join")
    if len(chunks) == 1:
        return chunks[0]
    fade_n = int(silence_duration * sr) // 3
    # One preallocated output (growing by concatenation copies O(chunks^2) samples); fading the
    # tail of what is written so far is exactly the reference's fade of its merged prefix.
    total = sum(c.shape[-1] for c in chunks) + fade_n * (len(chunks) - 1)
    merged = np.zeros(chunks[0].shape[:-1] + (total,), dtype=np.float32)  # [..., L1 + gap + L2 ...]
    pos = chunks[0].shape[-1]
    merged[..., :pos] = chunks[0]
    for chunk in chunks[1:]:
        n_out = min(fade_n, pos)
        if n_out > 0:
            merged[..., pos - n_out:pos] *= np.linspace(1, 0, n_out, dtype=np.float32)
        pos += fade_n  # the gap stays zeros
        n = chunk.shape[-1]
        merged[..., pos:pos + n] = chunk
        n_in = min(fade_n, n)
        if n_in > 0:
            merged[..., pos:pos + n_in] *= np.linspace(0, 1, n_in, dtype=np.float32)
        pos += n
    return merged


# Pause marks ([pause:1.5s]): the audio on each side of a pause is trimmed to its sound and
# ramps to the silence over 10 ms (a click guard that leaves the sound itself alone); the ramp
# never reaches zero, so the silence between the two sides is exactly the pause's zeros.
PAUSE_FADE_S = 0.01


def pause_ramp(n: int) -> np.ndarray:
    """Gains of a pause edge's ramp-in over n samples: 1/n, 2/n, ..., 1 (reversed: the
    ramp-out); float32 [n]."""
    return np.linspace(0, 1, n + 1, dtype=np.float32)[1:]


def join_chunks(chunks: Sequence[np.ndarray], pauses: Sequence[int | None] | None = None,
                sr: int = SAMPLE_RATE, silence_duration: float = 0.3
                ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Join chunk waveforms where some boundaries are pause marks; returns the joined float32
    audio and the (start, length) of every pause's zeros in it.

    `pauses` has one entry per boundary: before chunk 0, between each two chunks, after the
    last (len(chunks) + 1). None is no mark: at an inner boundary the reference's cross-fade
    (`cross_fade_chunks`), at the ends nothing. An integer n is a pause of n samples: the left
    side ramps out (`pause_ramp`, over PAUSE_FADE_S), then n zeros, then the right side ramps
    in (at the ends, only the side that exists). Without any mark this is `cross_fade_chunks`.
    """
    chunks = [np.asarray(c, dtype=np.float32) for c in chunks]
    if not chunks:
        raise AudioError("no audio chunks to join")
    pauses = list(pauses) if pauses is not None else [None] * (len(chunks) + 1)
    if len(pauses) != len(chunks) + 1:
        raise AudioError(f"{len(pauses)} pause entries for {len(chunks)} chunks; expected one "
                         "per boundary (chunks + 1)")
    if all(p is None for p in pauses):
        return cross_fade_chunks(chunks, sr, silence_duration), []
    xfade, pfade = int(silence_duration * sr) // 3, int(PAUSE_FADE_S * sr)
    gaps = [xfade if p is None else p for p in pauses[1:-1]]
    total = (sum(c.shape[-1] for c in chunks) + sum(gaps) + (pauses[0] or 0)
             + (pauses[-1] or 0))
    merged = np.zeros(total, dtype=np.float32)  # [lead + L1 + gap + L2 + ... + trail]
    spans: list[tuple[int, int]] = []
    pos = 0
    for i, chunk in enumerate(chunks):
        p = pauses[i]
        if i > 0 or p is not None:
            fade, ramp = (xfade, None) if p is None else (pfade, pause_ramp)
            n_out = min(fade, pos)
            if n_out > 0:  # the merged tail: the previous chunk's end (or the lead's zeros)
                merged[pos - n_out:pos] *= (np.linspace(1, 0, n_out, dtype=np.float32)
                                            if ramp is None else ramp(n_out)[::-1])
            gap = xfade if p is None else p
            if p is not None:
                spans.append((pos, p))
            pos += gap  # the gap stays zeros
        n = chunk.shape[-1]
        merged[pos:pos + n] = chunk
        if i > 0 or p is not None:
            n_in = min(fade, n)
            if n_in > 0:
                merged[pos:pos + n_in] *= (np.linspace(0, 1, n_in, dtype=np.float32)
                                           if ramp is None else ramp(n_in))
        pos += n
    if pauses[-1] is not None:
        n_out = min(pfade, pos)
        if n_out > 0:
            merged[pos - n_out:pos] *= pause_ramp(n_out)[::-1]
        spans.append((pos, pauses[-1]))
    return merged, spans


# ---------------------------------------------------------------------------
# The reference's two compositions
# ---------------------------------------------------------------------------

HOP_LENGTH = 960  # codec samples per frame at 24 kHz


def _mono(wav: np.ndarray, what: str) -> np.ndarray:
    try:
        wav = np.asarray(wav, dtype=np.float32)
    except (TypeError, ValueError):
        raise AudioError(f"{what} must be an array of float samples") from None
    if wav.ndim == 2 and wav.shape[0] == 1:
        wav = wav[0]  # [1, L] -> [L]
    if wav.ndim != 1:
        raise AudioError(f"{what} must be a mono waveform [samples] or [1, samples], got {wav.shape}")
    if not np.isfinite(wav).all():
        raise AudioError(f"{what} contains NaN or infinite samples (a decoding fault); nothing to save")
    return wav


def prepare_reference_audio(src: AudioSource, preprocess_prompt: bool = True, *, trim_long: bool = False,
                            sr: int = SAMPLE_RATE, hop_length: int = HOP_LENGTH) -> tuple[np.ndarray, float]:
    """What the reference's `create_voice_clone_prompt` does to the audio before encoding.

    Load (`load_audio`) -> boost quiet audio to RMS 0.1 -> with `preprocess_prompt`: cut
    references over 20 s at a pause (only when `trim_long`; the reference does that only when
    it transcribes the audio itself) and remove silence (inner > 200 ms, keep 100 ms lead and
    200 ms tail) -> drop the last L % hop_length samples. Returns (float32 [L'] at `sr` Hz with
    L' a multiple of hop_length, RMS of the loaded audio before the boost).
    """
    wav = load_audio(src, sr)
    wav, rms = normalize_reference_volume(wav)
    if preprocess_prompt:
        if trim_long:
            wav = trim_long_audio(wav, sr, trim_threshold=20.0)
        wav = remove_silence(wav, sr, mid_sil=200, lead_sil=100, trail_sil=200)
        if wav.shape[-1] == 0:
            raise AudioError(
                "the reference audio is silent (nothing above -50 dBFS); use a louder recording "
                "or turn off prompt preprocessing (preprocess_prompt=False)"
            )
    if wav.shape[-1] / sr > 20.0:
        logger.warning("reference audio is %.1f s long; 3-10 s clones better and runs faster",
                       wav.shape[-1] / sr)
    if hop_length:
        keep = wav.shape[-1] - wav.shape[-1] % hop_length
        if keep == 0:
            raise AudioError(
                f"the reference audio is too short ({wav.shape[-1] / sr * 1000:.0f} ms after "
                f"clean-up; at least {hop_length / sr * 1000:.0f} ms are needed); use 3-10 s of speech"
            )
        wav = wav[:keep]
    return wav, rms


def postprocess_output(audio: np.ndarray | Sequence[np.ndarray], ref_rms: float | None, *,
                       postprocess: bool = True, pad_duration: float = 0.1, fade_duration: float = 0.1,
                       sr: int = SAMPLE_RATE) -> np.ndarray:
    """What the reference does to decoded audio (`_decode_and_post_process`); float32 [L'].

    `audio` is one decoded waveform ([L] or [1, L]) or a list of chunk waveforms, which are
    first joined with `cross_fade_chunks`. Then: with `postprocess`, `remove_silence` (inner
    > 500 ms, keep 100 ms at both ends); `match_output_volume` (ref_rms from the voice prompt,
    None without a reference); `fade_and_pad`.
    """
    if isinstance(audio, (list, tuple)):
        wav = cross_fade_chunks([_mono(c, "each chunk") for c in audio], sr)
    else:
        wav = _mono(audio, "decoded audio")
    if postprocess:
        wav = remove_silence(wav, sr, mid_sil=500, lead_sil=100, trail_sil=100)
    wav = match_output_volume(wav, ref_rms)
    return fade_and_pad(wav, pad_duration, fade_duration, sr)


def postprocess_paused(segments: Sequence[Sequence[np.ndarray]], pauses: Sequence[int | None],
                       ref_rms: float | None, *, postprocess: bool = True,
                       pad_duration: float = 0.1, fade_duration: float = 0.1,
                       sr: int = SAMPLE_RATE) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """`postprocess_output` for a text with pause marks: `segments` holds each segment's chunk
    waveforms, `pauses` the pause lengths in samples before, between and after the segments
    (len(segments) + 1; None at an end: no pause there). Returns the audio and the (start,
    length) of every pause's zeros in it.

    Each segment is what `postprocess_output` makes of a text alone (its chunks cross-faded,
    with `postprocess` long inner silences cut and 100 ms of quiet kept at its edges), except
    at an edge next to a pause: there the quiet is trimmed away and the audio ramps to the
    pause over PAUSE_FADE_S (`join_chunks`), so the silence is the pause's zeros, to the
    sample. Then, for the whole: one loudness (`match_output_volume`; the peak is the whole
    result's) and the edges' fades and padding (`fade_and_pad`), around any leading or trailing
    pause too.
    """
    if len(pauses) != len(segments) + 1 or None in pauses[1:-1]:
        raise AudioError(f"{len(pauses)} pause entries for {len(segments)} segments; expected "
                         "one per boundary, a number of samples between segments")
    marks = list(pauses)
    wavs = []
    for i, seg in enumerate(segments):
        wav = cross_fade_chunks([_mono(c, "each chunk") for c in seg], sr)
        if postprocess:
            wav = remove_silence(wav, sr, mid_sil=500,
                                 lead_sil=0 if marks[i] is not None else 100,
                                 trail_sil=0 if marks[i + 1] is not None else 100)
        wavs.append(wav)
    merged, spans = join_chunks(wavs, marks, sr)
    wav = fade_and_pad(match_output_volume(merged, ref_rms), pad_duration, fade_duration, sr)
    pad = int(pad_duration * sr) if merged.shape[-1] else 0
    return wav, [(start + pad, n) for start, n in spans]


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

_INT_SUBTYPES = ("PCM_16", "PCM_24", "PCM_32", "PCM_S8", "PCM_U8")


def _read_umask() -> int:
    """The process umask, read once at import: the only portable way to ask for it,
    os.umask(0) then restoring it, leaves the umask at 0 for a moment, and a file another thread
    creates in that moment (the demo serves requests on threads) would be world-writable. Linux
    shows it in /proc/self/status, which changes nothing."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Mode of every file omnicore writes, what open() would give a new file. A umask changed
# after import is not seen; nothing in omnicore changes it.
_FILE_MODE = 0o666 & ~_read_umask()
_MAX_PREFIX = 64  # characters of the target's name kept in the temporary file's name


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def check_output_path(path: str | os.PathLike, error: type[OmniCoreError] = AudioError) -> str:
    """The real path a new file for `path` goes to (symbolic links followed, so a link keeps
    pointing at the new file), or `error` if it cannot be written there: its folder is missing,
    or `path` names a folder, a device, a FIFO or a socket (replacing those by a regular file is
    never what was meant, and reading from a FIFO blocks). An existing regular file is fine: it
    is replaced."""
    import stat

    raw = os.fspath(path)
    if not isinstance(raw, str):
        raw = os.fsdecode(raw)
    if not raw:
        raise error("no output file name given (an empty path)")
    if raw.endswith(("/", os.sep)):
        raise error(f"cannot write {raw!r}: it is a folder name, not a file name; add a file name")
    if "\0" in raw:
        raise error(f"cannot write {raw!r}: a file name cannot contain a NUL character")
    target = os.path.realpath(raw)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise error(f"cannot write {raw!r}: folder {folder!r} {what}; create the folder first "
                    "or write somewhere else")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise error(f"cannot write {raw!r} ({_reason(exc)}); write somewhere else") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"cannot write {raw!r}: it is a folder; give a file name inside it")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device")
        raise error(f"cannot write {raw!r}: it is {kind}, not a regular file; give a file name")
    return target


class AtomicOutput:
    """A file that appears at `path` complete or not at all, for writers that produce it in
    pieces. The bytes go to `fh`, a new temporary file with a unique name in the target's folder
    (so two writers of one path never share it, and the rename stays on one file system);
    `commit()` flushes, syncs, sets the mode a new file would get and renames it over the target;
    `abort()` (or an exception leaving a `with` block) removes it. Failures raise `error` (the
    caller's typed error) saying what could not be written and why.
    """

    def __init__(self, path: str | os.PathLike, error: type[OmniCoreError] = AudioError):
        self.error = error
        self.path = os.fspath(path)
        self.target = check_output_path(self.path, error)
        self._tmp = None
        self.fh = None
        name = os.path.basename(self.target)[:_MAX_PREFIX]
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp",
                                             dir=os.path.dirname(self.target))
            self.fh = os.fdopen(fd, "wb")
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise error(f"cannot write {self.path!r}: no file can be created in folder "
                            f"{os.path.dirname(self.target)!r} ({_reason(exc)}); write somewhere "
                            "else") from None
            raise

    def failed(self, exc: BaseException) -> OmniCoreError:
        """The typed error for a failed write (to raise)."""
        return self.error(f"could not write {self.path!r} ({_reason(exc)}); check the folder is "
                          "writable and the disk has space")

    def commit(self) -> None:
        if self._tmp is None:
            raise self.error(f"{self.path!r} was already committed or aborted")
        try:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self.fh.close()
            os.chmod(self._tmp, _FILE_MODE)
            os.replace(self._tmp, self.target)
            self._tmp = None
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise self.failed(exc) from None
            raise
        _sync_folder(os.path.dirname(self.target))

    def abort(self) -> None:
        """Remove the temporary file (idempotent; never raises)."""
        fh, self.fh = self.fh, None
        if fh is not None:
            try:
                fh.close()
            except Exception:  # a failed flush of a file being thrown away
                pass
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def __enter__(self) -> "AtomicOutput":
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def remove_stale_temporaries(folder: str | os.PathLike, names) -> int:
    """Remove the temporary files `AtomicOutput` left in `folder` for targets named `names` (a
    writer killed mid-write, e.g. a SIGKILLed worker, cannot remove its own). Only for a caller
    that knows no writer of those names is running. Returns how many were removed."""
    prefixes = {name[:_MAX_PREFIX] for name in names}
    removed = 0
    for entry in os.scandir(folder):
        name = entry.name
        if not (name.startswith(".") and name.endswith(".tmp")) or not entry.is_file(follow_symlinks=False):
            continue
        prefix = name[1:-4].rpartition(".")[0]  # .<prefix>.<random>.tmp (mkstemp's name)
        if prefix in prefixes:
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


def _sync_folder(folder: str) -> None:
    """Make the rename itself durable; best effort (some file systems refuse a folder fsync)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None],
                 error: type[OmniCoreError] = AudioError) -> None:
    """Write a file in one go through `AtomicOutput`: `write(fh)` gets the open binary temporary
    file. `path` ends up the complete new file or untouched; nothing else is left behind. Any
    failure (the folder, the disk, `write` itself) raises `error`; typed errors from `write`
    pass through as they are."""
    with AtomicOutput(path, error) as out:
        try:
            write(out.fh)
        except OmniCoreError:
            raise
        except Exception as exc:
            raise out.failed(exc) from None


def audio_format(path: str | os.PathLike) -> tuple[str, str]:
    """(format, subtype) soundfile writes for `path`'s extension: WAV, FLAC and the like as
    16-bit PCM, others (.ogg, ...) at libsndfile's default. AudioError for an extension no
    audio format has, so a typo fails before any work is done."""
    import soundfile as sf

    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lstrip(".").upper()
    if ext not in sf.available_formats() or ext == "RAW":
        known = ", ".join("." + f.lower() for f in ("WAV", "FLAC", "OGG"))
        raise AudioError(f"cannot tell the audio format of {path!r}; use an extension such as {known}")
    subtype = "PCM_16" if ext in ("WAV", "WAVEX", "FLAC", "AIFF", "RF64", "W64") else sf.default_subtype(ext)
    return ext, subtype


def write_audio_atomic(path: str | os.PathLike, wav: np.ndarray, sr: int = SAMPLE_RATE,
                       subtype: str | None = None) -> None:
    """Write `wav` ([L] mono or [C, L]) to `path` so that `path` is either the complete new
    file or untouched (see `write_atomic`).

    The format comes from the extension (.wav, .flac, .ogg, ... anything libsndfile writes);
    WAV and FLAC default to 16-bit PCM. Float samples are clipped to [-1, 1] for integer
    formats. Raises AudioError for an unknown extension, bad samples, a path that is a folder or
    device or in a missing folder, or a failed write.
    """
    import soundfile as sf

    sr = _check_rate("sample rate", sr)
    path = os.fspath(path)
    check_output_path(path, AudioError)  # "it is a folder" says more than "no format"
    ext, default_subtype = audio_format(path)
    subtype = subtype or default_subtype
    data = np.asarray(wav, dtype=np.float32)
    if data.ndim == 2:
        data = data.T  # [C, L] -> [L, C], soundfile's layout
    elif data.ndim != 1:
        raise AudioError(f"audio to write must be [samples] or [channels, samples], got {data.shape}")
    if data.size == 0:
        raise AudioError(f"refusing to write empty audio to {path!r}")
    if not np.isfinite(data).all():
        raise AudioError(f"audio for {path!r} contains NaN or infinite samples; nothing was written")
    if subtype in _INT_SUBTYPES:
        data = np.clip(data, -1.0, 1.0)
    write_atomic(path, lambda fh: sf.write(fh, data, sr, format=ext, subtype=subtype), AudioError)


def to_pcm16(x: np.ndarray) -> np.ndarray:
    """float32 -> little-endian int16 samples as soundfile writes a PCM_16 WAV (floor of
    x * 32768, clipped to the int16 range; measured): the one conversion of output audio to
    16 bits, so raw output, WAV files and the demo's player hold the same samples. NaN -> 0."""
    scaled = np.floor(np.nan_to_num(np.asarray(x, np.float32)) * np.float32(32768))
    return np.clip(scaled, -32768, 32767).astype("<i2")


# ---------------------------------------------------------------------------------------------
# Audio: per-chunk silence trim and the incremental join
# ---------------------------------------------------------------------------------------------

SILENCE_DB = -50.0           # the reference's remove_silence threshold
_QUIET_RMS = 10.0 ** (SILENCE_DB / 20.0)
BLOCK_MS = 10
CROSS_FADE_S = 0.3           # cross_fade_chunks' default: fade-out, gap, fade-in of 0.1 s each


class SilenceTrimmer:
    """Trim one chunk's silences as its samples arrive (see the module docstring).

    `push(x)` returns the samples that are decided; `end()` the rest. Blocks are counted from
    the chunk start and partial blocks wait, so how the chunk is cut into pushes never matters.
    Output samples are the input samples (no requantisation).
    """

    def __init__(self, sr: int = SAMPLE_RATE, lead_ms: int = 100, trail_ms: int = 100,
                 inner_ms: int = 500):
        self.block = sr * BLOCK_MS // 1000                       # B samples
        self.lead, self.trail, self.inner = lead_ms // BLOCK_MS, trail_ms // BLOCK_MS, inner_ms // BLOCK_MS
        self._head_keep = max(self.inner, self.trail)           # quiet blocks kept from a run's start
        self._tail_keep = max(self.inner, self.lead)            # ... and from its end
        self._partial = np.zeros(0, np.float32)
        self._quiet: list[np.ndarray] = []                       # the pending quiet run (capped)
        self._quiet_n = 0                                        # its true length in blocks
        self._sounding = False                                   # a loud block was seen

    def _on_block(self, blk: np.ndarray, quiet: bool, out: list[np.ndarray]) -> None:
        if quiet:
            self._quiet.append(blk)
            self._quiet_n += 1
            if len(self._quiet) > self._head_keep + self._tail_keep:
                del self._quiet[self._head_keep]  # middle of a long pause: never emitted
            return
        q, n = self._quiet, self._quiet_n
        if not self._sounding:
            out.extend(q[len(q) - min(self.lead, len(q)):])     # leading quiet -> last 100 ms
        elif n <= 2 * self.inner:
            out.extend(q)                                       # a short pause stays whole
        else:
            out.extend(q[:self.inner] + q[len(q) - self.inner:])  # a long pause -> 2 x 500 ms
        self._quiet, self._quiet_n, self._sounding = [], 0, True
        out.append(blk)

    def push(self, x: np.ndarray) -> np.ndarray:
        buf = np.concatenate([self._partial, np.asarray(x, np.float32)])
        out: list[np.ndarray] = []
        n_full = len(buf) // self.block * self.block
        blocks = buf[:n_full].reshape(-1, self.block)  # [L] -> [L/B, B]
        quiet = np.sqrt(np.mean(blocks * blocks, axis=1)) <= _QUIET_RMS  # [L/B]
        for blk, q in zip(blocks, quiet):
            self._on_block(blk, bool(q), out)
        self._partial = buf[n_full:]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def end(self) -> np.ndarray:
        return np.concatenate(self.end_parts())

    def end_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """`end()` in two parts: the decided samples, and the trailing quiet kept (at most
        trail_ms; what a following pause mark drops)."""
        out: list[np.ndarray] = []
        if len(self._partial):
            p = self._partial
            self._on_block(p, bool(np.sqrt(np.mean(p * p)) <= _QUIET_RMS), out)
            self._partial = np.zeros(0, np.float32)
        tail = self._quiet[:self.trail] if self._sounding else []  # trailing quiet -> 100 ms
        self._quiet, self._quiet_n = [], 0
        return (np.concatenate(out) if out else np.zeros(0, np.float32),
                np.concatenate(tail) if tail else np.zeros(0, np.float32))


def trim_chunk(wav: np.ndarray, sr: int = SAMPLE_RATE, lead_ms: int = 100,
               trail_ms: int = 100) -> np.ndarray:
    """`SilenceTrimmer` on a whole chunk at once (the non-streamed path)."""
    t = SilenceTrimmer(sr, lead_ms, trail_ms)
    return np.concatenate([t.push(wav), t.end()])


def peak_gain(first_window: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Loudness without a voice prompt: the first window's peak goes to 0.5 (the reference's
    `peak_normalize` expression, with the peak fixed in advance)."""
    peak = np.abs(np.asarray(first_window, np.float32)).max() if len(first_window) else np.float32(0)
    if peak > 1e-6:
        return lambda x: x / peak * PEAK_TARGET
    return lambda x: x


def rms_gain(ref_rms: float) -> Callable[[np.ndarray], np.ndarray]:
    """Loudness with a voice prompt: the reference's fixed scale (exactly `match_output_volume`)."""
    return lambda x: match_output_volume(x, ref_rms)


class StreamJoiner:
    """Join trimmed chunks into the utterance incrementally, releasing each sample once no later
    input can change it. The released samples, concatenated, equal

        fade_and_pad(gain(join_chunks(chunks, pauses)), pad, fade)

    bit for bit (without pause marks: `cross_fade_chunks`). Call `start_chunk()`, `push(x)` per
    piece, `end_chunk(tail)`, ..., then `finish()`, with `pause(n)` between chunks (or before the
    first, or after the last) where a pause mark is; `set_gain(fn)` before the first sample can
    be released. A chunk's `tail` (its trailing quiet, `SilenceTrimmer.end_parts`) waits until
    the next call says whether a pause follows (which drops it). `push`, `end_chunk`, `pause`
    and `finish` return the float32 samples they release (often none).
    """

    def __init__(self, sr: int = SAMPLE_RATE, pad_duration: float = 0.1,
                 fade_duration: float = 0.1):
        self.xfade = int(CROSS_FADE_S * sr) // 3
        self.pfade = int(PAUSE_FADE_S * sr)
        self.fade, self.pad = int(fade_duration * sr), int(pad_duration * sr)
        # the last samples a join, a pause's ramp or the final fade may touch
        self.hold = max(self.xfade, self.fade, self.pfade)
        self.gain: Callable[[np.ndarray], np.ndarray] | None = None
        self.chunk_starts: list[int] = []        # merged index where each chunk's samples begin
        self._held = np.zeros(0, np.float32)     # merged samples [held_start, merged_len), pre-gain
        self._held_start = 0
        self._merged = 0
        self._head: np.ndarray | None = None      # a chunk's first samples awaiting their fade-in
        self._head_pause = False                  # ... after a pause: a pause ramp, not a cross-fade
        self._tail: np.ndarray | None = None      # the last chunk's trailing quiet, undecided
        self._after_pause = False                 # the last thing joined is a pause
        self._started = False                     # the leading pad went out
        self.released_chunk = 0                   # last chunk with samples released so far

    def set_gain(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self.gain = fn

    def _append(self, x: np.ndarray) -> None:
        if len(x):
            self._held = np.concatenate([self._held, x])
            self._merged += len(x)

    def keep_tail(self) -> np.ndarray:
        """No pause follows the last chunk: its trailing quiet stays (call it as soon as that is
        known, so the chunk's end is released before the next chunk is made)."""
        if self._tail is None:
            return np.zeros(0, np.float32)
        self._join_tail()
        return self._release(final=False)

    def _join_tail(self) -> None:
        if self._tail is not None:
            self._append(self._tail)
            self._tail = None

    def start_chunk(self) -> None:
        self._join_tail()
        if self._after_pause:  # the pause's zeros are in: only the ramp-in is left
            self._head, self._head_pause = np.zeros(0, np.float32), True
        elif self.chunk_starts:  # a join: fade the merged tail out, then a gap of zeros
            n_out = min(self.xfade, self._merged)
            if n_out > 0:
                self._held[len(self._held) - n_out:] *= np.linspace(1, 0, n_out, dtype=np.float32)
            self._append(np.zeros(self.xfade, np.float32))
            self._head, self._head_pause = np.zeros(0, np.float32), False
        self._after_pause = False
        self.chunk_starts.append(self._merged)

    def pause(self, n: int) -> np.ndarray:
        """A pause mark of n samples: the last chunk's trailing quiet is dropped, its end ramps
        out (`pause_ramp`), then n zeros (consecutive pauses add up)."""
        self._resolve_head(final=True)
        self._tail = None
        if not self._after_pause:
            n_out = min(self.pfade, self._merged)
            if n_out > 0:
                self._held[len(self._held) - n_out:] *= pause_ramp(n_out)[::-1]
        self._append(np.zeros(n, np.float32))
        self._after_pause = True
        return self._release(final=False) if self.gain is not None else np.zeros(0, np.float32)

    def _resolve_head(self, final: bool) -> None:
        h = self._head
        fade = self.pfade if self._head_pause else self.xfade
        if h is None or (len(h) < fade and not final):
            return
        n_in = min(fade, len(h))
        h = h.copy()
        if n_in > 0:
            h[:n_in] *= pause_ramp(n_in) if self._head_pause else np.linspace(0, 1, n_in,
                                                                               dtype=np.float32)
        self._head = None
        self._append(h)

    def push(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if self._head is not None:
            self._head = np.concatenate([self._head, x])
            self._resolve_head(final=False)
        else:
            self._append(x)
        return self._release(final=False)

    def end_chunk(self, tail: np.ndarray | None = None) -> np.ndarray:
        """The chunk is complete; `tail` is its trailing quiet, joined unless a pause follows."""
        self._resolve_head(final=True)
        self._tail = None if tail is None or not len(tail) else np.asarray(tail, np.float32)
        return self._release(final=False)

    def finish(self) -> np.ndarray:
        self._join_tail()
        return self._release(final=True)

    def _release(self, final: bool) -> np.ndarray:
        total, a = self._merged, self._held_start
        if final:
            if total == 0:
                return np.zeros(0, np.float32)  # fade_and_pad leaves empty audio unpadded
            stop, k = total, min(self.fade, total // 2)  # fade_and_pad's rule, length now known
        else:
            if total < 2 * self.fade:  # the fade-in length min(fade, L // 2) is not known yet
                return np.zeros(0, np.float32)
            stop, k = total - self.hold, self.fade
            if stop <= a:
                return np.zeros(0, np.float32)
        if self.gain is None:
            raise RuntimeError("StreamJoiner: set_gain() before releasing audio")
        seg = np.array(self.gain(self._held[:stop - a]), np.float32, copy=True)
        if a < k:  # the utterance's fade-in
            n = min(k, stop) - a
            seg[:n] *= np.linspace(0, 1, k, dtype=np.float32)[a:a + n]
        if final and k > 0:  # the utterance's fade-out (hold >= fade: all still held)
            seg[len(seg) - k:] *= np.linspace(1, 0, k, dtype=np.float32)
        self._held = self._held[stop - a:]
        self._held_start = stop
        self.released_chunk = max((i for i, s in enumerate(self.chunk_starts) if s < stop or i == 0),
                                  default=0)
        parts = [seg]
        if not self._started:
            parts.insert(0, np.zeros(self.pad, np.float32))
            self._started = True
        if final:
            parts.append(np.zeros(self.pad, np.float32))
        return np.concatenate(parts)


def join_offline(chunks: list[np.ndarray], gain, *, postprocess: bool, pad_duration: float,
                 fade_duration: float, sr: int = SAMPLE_RATE,
                 pauses: Sequence[int | None] | None = None
                 ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The non-streamed join of decoded chunks, from the library's one-shot functions; returns
    the audio and the (start, length) of every pause's zeros in it. `pauses`: see
    `join_chunks` (None: no pause marks); a chunk's edge next to a pause keeps none of its
    quiet."""
    for c in chunks:
        if not np.isfinite(c).all():
            raise AudioError("decoded audio contains NaN or infinite samples (a decoding fault); nothing to save")
    marks = list(pauses) if pauses is not None else [None] * (len(chunks) + 1)
    pieces = [trim_chunk(c, sr, 0 if marks[i] is not None else 100,
                         0 if marks[i + 1] is not None else 100)
              if postprocess else np.asarray(c, np.float32) for i, c in enumerate(chunks)]
    wav, spans = join_chunks(pieces, marks, sr, silence_duration=CROSS_FADE_S)
    if wav.shape[-1] == 0:
        return wav, []
    pad = int(pad_duration * sr)
    return (fade_and_pad(np.asarray(gain(wav), np.float32), pad_duration, fade_duration, sr),
            [(start + pad, n) for start, n in spans])


# ---------------------------------------------------------------------------------------------
# Writers: audio to a file or a pipe as it comes
# ---------------------------------------------------------------------------------------------


class RawPcmWriter:
    """Raw 16-bit little-endian mono PCM to a binary stream (e.g. stdout for
    `| aplay -r 24000 -f S16_LE -c 1`), flushed after every piece."""

    def __init__(self, fh):
        self.fh = fh
        self.samples = 0

    def write(self, x: np.ndarray) -> None:
        self.fh.write(to_pcm16(x).tobytes())
        self.fh.flush()
        self.samples += len(x)

    def commit(self) -> None:
        self.fh.flush()

    def abort(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest) -> None:
        self.abort() if exc_type else self.commit()


class AudioFileWriter:
    """Write audio pieces to `path` as they come, atomically (through `AtomicOutput`): the
    samples go to a temporary file in the same folder (for WAV, a header whose sizes libsndfile
    fixes up on close); `commit()` flushes, syncs and renames it over `path`; `abort()` (or an
    exception leaving a `with` block) removes it, so `path` is never half written. The format
    follows the extension (.wav, .flac, .ogg, ...; .raw / .pcm or raw=True: headerless 16-bit
    PCM); WAV and FLAC are 16-bit, samples clipped. The path is checked here, before any audio
    is made."""

    def __init__(self, path, sr: int = SAMPLE_RATE, *, raw: bool = False):
        import os

        import soundfile as sf

        self.path = os.fspath(path)
        self.sr = sr
        self.samples = 0
        self._sf = self._out = None
        ext = os.path.splitext(self.path)[1].lstrip(".").upper()
        self._raw = raw or ext in ("RAW", "PCM")
        check_output_path(self.path, AudioError)  # "it is a folder" says more than "no format"
        if not self._raw:
            try:
                ext, subtype = audio_format(self.path)
            except AudioError:
                raise AudioError(f"cannot tell the audio format of {self.path!r}; use an extension "
                                 "such as .wav, .flac, .ogg (or .raw for headerless PCM)") from None
            self._int = subtype.startswith("PCM")
        self._out = AtomicOutput(self.path, AudioError)
        try:
            if not self._raw:
                self._sf = sf.SoundFile(self._out.fh, "w", samplerate=sr, channels=1, format=ext,
                                        subtype=subtype)
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise self._out.failed(exc) from None
            raise

    def write(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32)
        if not np.isfinite(x).all():
            self.abort()
            raise AudioError(f"audio for {self.path!r} contains NaN or infinite samples; nothing was written")
        if self._out is None:
            raise AudioError(f"{self.path!r} was already committed or aborted")
        try:
            if self._sf is None:
                self._out.fh.write(to_pcm16(x).tobytes())
            else:
                self._sf.write(np.clip(x, -1.0, 1.0) if self._int else x)
        except BaseException as exc:
            err = self._out.failed(exc)
            self.abort()
            if isinstance(exc, Exception):
                raise err from None
            raise
        self.samples += len(x)

    def commit(self) -> None:
        if self.samples == 0:
            self.abort()
            raise AudioError(f"refusing to write empty audio to {self.path!r}")
        if self._out is None:
            raise AudioError(f"{self.path!r} was already committed or aborted")
        out = self._out
        try:
            if self._sf is not None:
                self._sf.close()  # writes the final header sizes
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise out.failed(exc) from None
            raise
        self._out = None
        out.commit()  # removes the temporary file itself on failure

    def abort(self) -> None:
        """Remove the temporary file (idempotent; never raises)."""
        sfile, self._sf = self._sf, None
        try:
            if sfile is not None and not sfile.closed:
                sfile.close()
        except Exception:  # a header that cannot be finished: the file is thrown away anyway
            pass
        out, self._out = self._out, None
        if out is not None:
            out.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest) -> None:
        self.abort() if exc_type else self.commit()
