"""The stream's audio: each chunk trimmed to its sound as it is decoded, and joined on the fly.

`SilenceTrimmer` and `StreamJoiner` give, piece by piece, the samples the offline composition
(`postprocess.postprocess_output` over all chunks) gives at once (tests/test_streaming.py holds
them to it). Dimension legend: L samples (24 000 per second).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..model.config import SAMPLE_RATE
from .postprocess import PAUSE_FADE_S, PEAK_TARGET, match_output_volume, pause_ramp

# ---------------------------------------------------------------------------------------------
# Audio: per-chunk silence trim and the incremental join
# ---------------------------------------------------------------------------------------------

SILENCE_DB = -50.0           # the reference's remove_silence threshold
_QUIET_RMS = 10.0 ** (SILENCE_DB / 20.0)
BLOCK_MS = 10
CROSS_FADE_S = 0.3           # cross_fade_chunks' default: fade-out, gap, fade-in of 0.1 s each


class SilenceTrimmer:
    """Trim one chunk's silences as its samples arrive (rules: docs/streaming.md).

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
