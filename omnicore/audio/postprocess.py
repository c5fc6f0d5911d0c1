"""The reference's clean-up around generation, sample for sample.

* `remove_silence`, `trim_long_audio` reproduce the reference's pydub calls: pydub works on
  16-bit PCM, measures time in whole milliseconds and loudness as the integer RMS of
  `audioop.rms`, so those steps quantise their output to int16 steps (x/32768).
* `prepare_reference_audio` and `postprocess_output` compose the steps the way the reference's
  `create_voice_clone_prompt` and `_decode_and_post_process` do; `postprocess_paused` joins the
  segments around pause marks with exact silence.

All on mono float32 waveforms in [-1, 1]. Dimension legend:
    L  samples (24 000 per second)
    W  windows scanned by the silence detector
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import numpy as np

from ..errors import AudioError
from ..model.config import HOP_LENGTH, SAMPLE_RATE
from .loading import AudioSource, load_audio

logger = logging.getLogger(__name__)

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


