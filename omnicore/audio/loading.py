"""Reading audio: a file or an in-memory array -> mono float32 at the rate asked for.

Dimension legend:
    L  samples of one channel (time)
    C  channels
"""

from __future__ import annotations

import os
from typing import Union

import numpy as np

from ..errors import AudioError
from ..model.config import SAMPLE_RATE
from ..model.resample import check_rate, resample

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
    target_sr = check_rate("target_sr", target_sr)
    if isinstance(src, tuple):
        if len(src) != 2:
            raise AudioError("in-memory audio must be a tuple (samples, sample_rate)")
        samples, sr = src
        sr = check_rate("sample rate", sr)
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
        sr = check_rate("sample rate", sr)
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


