"""Pictures for the demo, drawn with numpy (pixels) and Pillow (only for the text labels).

Nothing here knows about the model: the functions take the arrays a `Synthesis` carries and return
`uint8 [H, W, 3]` RGB images that gradio shows as PNG.

Dimensions:
    K  codebooks (8 for OmniVoice)        T  code frames (25 per second of audio)
    L  audio samples                      F  STFT frequency bins, N  STFT frames
    H, W  image height and width in pixels
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from omnicore.model.config import FRAME_RATE


# Colour maps as a few anchor colours, interpolated linearly. "steps" runs dark violet -> teal ->
# yellow (perceptually ordered, readable by colour-blind viewers); "heat" is black -> purple ->
# orange -> pale yellow for spectrogram energy.
_ANCHORS = {
    "steps": ["#440154", "#414487", "#2a788e", "#22a884", "#7ad151", "#fde725"],
    "heat": ["#000004", "#3b0f70", "#8c2981", "#de4968", "#fe9f6d", "#fcfdbf"],
}

_INK = (38, 38, 46)  # text and axis colour
_MUTED = (110, 110, 122)  # secondary text
_PAPER = (255, 255, 255)
_GRID_BG = (232, 232, 238)  # colour of cells that were never filled (should not happen)


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def colormap(x: np.ndarray, name: str = "steps") -> np.ndarray:
    """Map values in [0, 1] to RGB: any shape [...] -> uint8 [..., 3]."""
    anchors = np.array([_hex(c) for c in _ANCHORS[name]], dtype=np.float32)  # [A, 3]
    pos = np.clip(np.asarray(x, dtype=np.float32), 0.0, 1.0) * (len(anchors) - 1)
    lo = np.minimum(pos.astype(np.int64), len(anchors) - 2)
    frac = (pos - lo)[..., None]  # [..., 1]
    rgb = anchors[lo] * (1.0 - frac) + anchors[lo + 1] * frac  # [..., 3]
    return np.round(rgb).astype(np.uint8)


def _font(size: int) -> ImageFont.ImageFont:
    try:  # Pillow >= 10.1 ships a scalable default font
        return ImageFont.load_default(size=size)
    except TypeError:  # older Pillow: the fixed bitmap font
        return ImageFont.load_default()


def _nice_step(span: float, target_ticks: int) -> float:
    """A 1/2/5 x 10^k tick spacing giving about `target_ticks` ticks over `span`."""
    raw = max(span / max(target_ticks, 1), 1e-9)
    mag = 10.0 ** np.floor(np.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if raw <= m * mag:
            return float(m * mag)
    return float(10.0 * mag)


def _fmt_seconds(t: float, step: float) -> str:
    return f"{t:.0f} s" if step >= 1 else f"{t:.1f} s"


def _resize_columns(img: np.ndarray, width: int) -> np.ndarray:
    """Nearest-neighbour resampling along axis 1: [H, W0, ...] -> [H, width, ...]."""
    src = (np.arange(width) * img.shape[1] // width).astype(np.int64)
    return img[:, src]


# ------------------------------------------------------------------------------------------------
# Unmasking view
# ------------------------------------------------------------------------------------------------


def render_unmasking(fill_steps: np.ndarray, num_steps: int, width: int = 1000) -> np.ndarray:
    """The K x T code grid coloured by the unmasking step that filled each cell.

    fill_steps: int [K, T], step index in [0, num_steps) per cell (chunks joined along T restart
    at 0, which shows as a second sweep). Returns uint8 [H, width, 3]: the grid with codebook and
    time axes, a step colour bar, and two small charts that explain the picture: cells filled per
    step (the schedule) and the mean step per codebook (the layer penalty).
    """
    fill = np.asarray(fill_steps)
    if fill.ndim != 2 or fill.shape[1] == 0:
        raise ValueError(f"fill_steps must be [K, T] with T > 0, got shape {fill.shape}")
    K, T = fill.shape
    n = max(int(num_steps), 1)
    font, small = _font(14), _font(12)

    left, right, top = 64, 92, 34  # room for row labels, colour bar, title
    grid_w = width - left - right
    row_h = 24 if K <= 8 else max(8, 192 // K)
    grid_h = K * row_h

    # --- the grid: one colour per cell, upscaled with nearest neighbour so cells stay crisp ---
    unit = fill.astype(np.float32) / max(n - 1, 1)  # [K, T] in [0, 1]
    cells = colormap(unit)  # [K, T, 3]
    cells[fill < 0] = _GRID_BG
    cell_w = grid_w / T
    cols = _resize_columns(cells, grid_w)  # [K, grid_w, 3]
    grid = np.repeat(cols, row_h, axis=0)  # [K*row_h, grid_w, 3]
    grid[row_h - 1 :: row_h] = _PAPER  # one-pixel gap between codebook rows
    if cell_w >= 5:  # gaps between frames too, when there is room for them
        edges = np.floor(np.arange(1, T) * cell_w).astype(np.int64)
        grid[:, edges] = _PAPER

    # --- charts below the grid ---
    chart_top = top + grid_h + 72
    chart_h = 96
    height = chart_top + chart_h + 40
    img = np.full((height, width, 3), _PAPER, dtype=np.uint8)
    img[top : top + grid_h, left : left + grid_w] = grid

    # colour bar: step 0 at the top, the last step at the bottom, like reading order
    bar_x = left + grid_w + 16
    bar = colormap(np.linspace(0.0, 1.0, grid_h, dtype=np.float32))  # [grid_h, 3]
    img[top : top + grid_h, bar_x : bar_x + 14] = bar[:, None, :]

    # schedule chart: how many cells each step filled
    counts = np.zeros(n, dtype=np.int64)
    valid = fill[(fill >= 0) & (fill < n)]
    np.add.at(counts, valid, 1)
    half_w = (grid_w - 40) // 2
    _bar_chart(img, left, chart_top, half_w, chart_h, counts.astype(np.float32),
               colormap(np.linspace(0.0, 1.0, n, dtype=np.float32)))

    # layer-penalty chart: mean fill step per codebook (later codebooks fill later)
    means = np.array([fill[k][fill[k] >= 0].mean() if (fill[k] >= 0).any() else 0.0
                      for k in range(K)], dtype=np.float32)  # [K]
    lp_x = left + half_w + 40
    lp_vmax = 1.2 * max(n - 1, 1)  # head room for the value labels
    _bar_chart(img, lp_x, chart_top, half_w, chart_h, means,
               colormap(means / max(n - 1, 1)), vmax=lp_vmax)

    # --- text ---
    pil = Image.fromarray(img)
    d = ImageDraw.Draw(pil)
    d.text((left, 8), f"Unmasking order: {K} codebooks x {T} frames, colour = step that filled "
           f"the cell ({n} steps)", fill=_INK, font=font)
    for k in range(K):
        d.text((left - 8, top + k * row_h + row_h // 2 - 1), f"cb {k}", fill=_INK, font=small,
               anchor="rm")
    dur = T / FRAME_RATE
    tick = _nice_step(dur, 8)
    t = 0.0
    while t <= dur + 1e-6:
        x = left + int(round(t * FRAME_RATE * cell_w))
        d.line([(x, top + grid_h), (x, top + grid_h + 4)], fill=_MUTED)
        d.text((x, top + grid_h + 6), _fmt_seconds(t, tick), fill=_MUTED, font=small, anchor="ma")
        t += tick
    d.text((left + grid_w, top + grid_h + 22), "time (25 frames per second)", fill=_MUTED,
           font=small, anchor="ra")
    for s in sorted({0, (n - 1) // 2, n - 1}):
        y = top + int(round(s / max(n - 1, 1) * (grid_h - 1)))
        d.text((bar_x + 20, y), f"step {s + 1}", fill=_INK, font=small, anchor="lm")
    d.text((left, chart_top - 18), f"cells filled per step (the schedule): {counts[0]} at step 1, "
           f"{counts[-1]} at step {n}", fill=_INK, font=small)
    d.text((left, chart_top + chart_h + 6), "step 1", fill=_MUTED, font=small)
    d.text((left + half_w, chart_top + chart_h + 6), f"step {n}", fill=_MUTED, font=small,
           anchor="ra")
    d.text((lp_x, chart_top - 18), "mean fill step per codebook (the layer penalty)", fill=_INK,
           font=small)
    slot = half_w / K
    for k in range(K):
        cx = lp_x + int((k + 0.5) * slot)
        d.text((cx, chart_top + chart_h + 6), f"cb {k}", fill=_MUTED, font=small, anchor="ma")
        bh = int(round(chart_h * min(float(means[k]) / lp_vmax, 1.0)))
        d.text((cx, chart_top + chart_h - bh - 2), f"{means[k] + 1:.1f}", fill=_INK, font=small,
               anchor="md")
    return np.asarray(pil)


def _bar_chart(img: np.ndarray, x0: int, y0: int, w: int, h: int, values: np.ndarray,
               colours: np.ndarray, vmax: float | None = None) -> None:
    """Draw vertical bars in place: values [B] >= 0, colours uint8 [B, 3]."""
    B = len(values)
    top = float(vmax if vmax is not None else max(float(values.max()), 1e-9))
    img[y0 + h, x0 : x0 + w] = _MUTED  # baseline
    slot = w / B
    gap = 1 if slot >= 3 else 0
    for b in range(B):  # at most a few dozen bars
        bh = int(round(h * min(float(values[b]) / top, 1.0)))
        xa, xb = x0 + int(b * slot), x0 + int((b + 1) * slot) - gap
        if bh > 0 and xb > xa:
            img[y0 + h - bh : y0 + h, xa:xb] = colours[b]


# ------------------------------------------------------------------------------------------------
# Waveform and spectrogram
# ------------------------------------------------------------------------------------------------


def spectrogram_db(audio: np.ndarray, n_fft: int = 1024, hop: int = 256) -> np.ndarray:
    """Log-magnitude STFT: float [L] -> float32 [F, N] in dB relative to the loudest bin."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)
    if len(x) < n_fft:
        x = np.pad(x, (0, n_fft - len(x)))
    n_frames = 1 + (len(x) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(n_frames)[:, None]  # [N, n_fft]
    window = np.hanning(n_fft).astype(np.float32)
    mag = np.abs(np.fft.rfft(x[idx] * window, axis=1)).astype(np.float32)  # [N, F]
    db = 20.0 * np.log10(np.maximum(mag, 1e-7))
    return (db - db.max()).T  # [F, N]


def render_waveform(audio: np.ndarray, sample_rate: int, width: int = 1000) -> np.ndarray:
    """Waveform envelope above a spectrogram (mel-spaced rows). Returns uint8 [H, width, 3]."""
    x = np.nan_to_num(np.asarray(audio, dtype=np.float32).reshape(-1))
    left, right, top = 64, 16, 28
    plot_w = width - left - right
    wave_h, spec_h, gap = 90, 170, 30
    height = top + wave_h + gap + spec_h + 34
    img = np.full((height, width, 3), _PAPER, dtype=np.uint8)
    dur = len(x) / float(sample_rate)

    # --- waveform: min/max of the samples under each pixel column ---
    if len(x) > 0:
        edges = np.linspace(0, len(x), plot_w + 1).astype(np.int64)  # [plot_w + 1]
        edges[1:] = np.maximum(edges[1:], edges[:-1] + 1)
        edges = np.minimum(edges, len(x))
        lo = np.minimum.reduceat(x, edges[:-1].clip(max=len(x) - 1))  # [plot_w]
        hi = np.maximum.reduceat(x, edges[:-1].clip(max=len(x) - 1))  # [plot_w]
        peak = max(float(np.abs(x).max()), 1e-6)
        mid = top + wave_h // 2
        y_hi = (mid - np.round(hi / peak * (wave_h // 2 - 2))).astype(np.int64)
        y_lo = (mid - np.round(lo / peak * (wave_h // 2 - 2))).astype(np.int64)
        rows = np.arange(top, top + wave_h)[:, None]  # [wave_h, 1]
        inside = (rows >= y_hi[None, :]) & (rows <= y_lo[None, :])  # [wave_h, plot_w]
        panel = img[top : top + wave_h, left : left + plot_w]
        panel[inside] = (65, 68, 135)
        img[mid, left : left + plot_w][~inside[mid - top]] = _GRID_BG

    # --- spectrogram: rows spaced on the mel scale, 80 dB of range ---
    spec = spectrogram_db(x)  # [F, N]
    F = spec.shape[0]
    nyq = sample_rate / 2.0
    mel_top = 2595.0 * np.log10(1.0 + nyq / 700.0)
    mels = np.linspace(mel_top, 0.0, spec_h, dtype=np.float32)  # top row = highest frequency
    hz = 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    rows_idx = np.clip(np.round(hz / nyq * (F - 1)).astype(np.int64), 0, F - 1)  # [spec_h]
    spec = spec[rows_idx]  # [spec_h, N]
    cols = np.linspace(0, spec.shape[1], plot_w, endpoint=False).astype(np.int64)
    spec = spec[:, cols]  # [spec_h, plot_w]
    s_top = top + wave_h + gap
    img[s_top : s_top + spec_h, left : left + plot_w] = colormap((spec + 80.0) / 80.0, "heat")

    # --- text ---
    pil = Image.fromarray(img)
    d = ImageDraw.Draw(pil)
    font, small = _font(14), _font(12)
    d.text((left, 6), f"Waveform ({dur:.2f} s at {sample_rate} Hz)", fill=_INK, font=font)
    d.text((left, s_top - 20), "Spectrogram (mel-spaced, 80 dB range)", fill=_INK, font=font)
    for khz in (0, 1, 2, 4, 8):
        if khz * 1000 > nyq:
            continue
        mel = 2595.0 * np.log10(1.0 + khz * 1000.0 / 700.0)
        y = s_top + int(round((1.0 - mel / mel_top) * (spec_h - 1)))
        d.text((left - 6, y), f"{khz} kHz", fill=_MUTED, font=small, anchor="rm")
    tick = _nice_step(max(dur, 1e-3), 8)
    t = 0.0
    while dur > 0 and t <= dur + 1e-6:
        px = left + int(round(t / dur * (plot_w - 1)))
        d.line([(px, s_top + spec_h), (px, s_top + spec_h + 4)], fill=_MUTED)
        d.text((px, s_top + spec_h + 6), _fmt_seconds(t, tick), fill=_MUTED, font=small,
               anchor="ma")
        t += tick
    return np.asarray(pil)
