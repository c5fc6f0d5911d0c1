"""Uploaded audio (a clip to clone, a consent recording), bounded by what its container's
header declares before any decoding.

A compressed file can declare or hold far more audio than its size suggests (a 7 KB WAV at
1 Hz is an hour that resampling to 24 kHz blows up; a small FLAC of silence decodes to a
gigabyte), so an upload's rate, channels and length are read from the header first and
refused with a 400 before a sample is decoded; the decode itself then reads at most the
frames the limits allow, whatever the header said.

Dimensions: N samples per channel, C channels.
"""

from __future__ import annotations

import io

import numpy as np

from ...audio import loading
from ...errors import AudioError
from ...text import limits

MIN_RATE = 8_000      # Hz: telephone audio; below it a clip cannot carry a voice
MAX_RATE = 192_000    # Hz: a studio recording's rate
MAX_CHANNELS = 2      # mono or stereo: channels are averaged anyway
MAX_SECONDS = limits.MAX_REF_S  # what create_voice_clone_prompt encodes at most


def decode_clip(data: bytes) -> tuple[np.ndarray, int]:
    """An uploaded audio file's bytes -> (float32 samples [C, N], rate), or an AudioError (a
    400) when the file is unreadable or declares a rate, channel count or length outside the
    limits above. At most MAX_SECONDS of audio is ever decoded."""
    import soundfile as sf

    try:
        f = sf.SoundFile(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - any unreadable upload is the client's
        reason = getattr(exc, "error_string", None) or "not an audio file libsndfile reads"
        raise AudioError(f"could not read the uploaded audio ({reason}); send WAV, FLAC or OGG "
                         "(MP3 where libsndfile supports it)") from None
    with f:
        rate, channels, frames = f.samplerate, f.channels, f.frames
        if not MIN_RATE <= rate <= MAX_RATE:
            raise AudioError(f"the uploaded audio declares a sample rate of {rate} Hz; send "
                             f"{MIN_RATE}-{MAX_RATE} Hz (re-export it, e.g. at 24000 Hz)")
        if not 1 <= channels <= MAX_CHANNELS:
            raise AudioError(f"the uploaded audio declares {channels} channels; send mono or "
                             "stereo")
        max_frames = int(MAX_SECONDS * rate)
        if frames > max_frames:
            raise AudioError(f"the uploaded audio is {frames / rate:.1f} s long; a voice clip "
                             f"is at most {MAX_SECONDS:g} s (3-10 s of speech works best): "
                             "cut it")
        try:
            # One frame past the limit shows a header that understated the length.
            wav = f.read(max_frames + 1, dtype="float32", always_2d=True)  # [N, C]
        except Exception as exc:  # noqa: BLE001 - a corrupt body is the client's too
            reason = getattr(exc, "error_string", None) or type(exc).__name__
            raise AudioError(f"could not decode the uploaded audio ({reason})") from None
    if len(wav) > max_frames:
        raise AudioError(f"the uploaded audio holds more than {MAX_SECONDS:g} s of sound "
                         "(more than its header declares); a voice clip is 3-10 s: cut it")
    if len(wav) == 0:
        raise AudioError("the uploaded audio is empty (0 samples); send a recording of speech")
    return wav.T, int(rate)  # [N, C] -> [C, N]


def check_recording(data: bytes) -> str:
    """An uploaded recording kept as uploaded (a consent) -> its container's file extension,
    once it has passed what a clip passes: `decode_clip`'s limits, a full decode, finite
    samples (loading.load_audio's checks) and some sound."""
    import soundfile as sf

    wav, rate = decode_clip(data)  # [C, N]
    loading.load_audio((wav, rate), rate)  # NaN, infinities, an empty signal
    if not np.any(wav):
        raise AudioError("the uploaded audio is digital silence; upload the spoken recording")
    fmt = sf.info(io.BytesIO(data)).format
    ext = {"WAVEX": "wav", "OGG": "ogg"}.get(fmt, fmt.lower())
    return ext if ext.isalnum() else "audio"
