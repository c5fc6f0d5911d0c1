"""Confidence-based iterative unmasking with classifier-free guidance (OmniVoice's decoder loop).

All C x T target cells of an item start as MASK. Each of `num_step` steps runs the backbone on
the conditional row (prompt + current targets) and, for guidance, on the unconditional row
(current targets alone), scores every still-masked cell, and fills the k most confident ones
with their predicted token. k follows a shifted schedule that fills few cells early and many
late; the last step fills whatever remains, so no MASK survives.

Scoring one cell (logits over the V audio ids):
    lp   = log_softmax(c + g * (c - u))  with c, u the log-softmaxes of the conditional and
           unconditional logits (g = 0: lp = log_softmax(cond logits))
    lp[MASK] = -inf                      (MASK is never a prediction)
    token = argmax lp                    (class_temperature 0) or a Gumbel-max draw among the
                                         top 10 % of lp at that temperature
    score = max lp - layer_penalty * c   (coarse codebooks first), plus Gumbel noise on
                                         score / position_temperature when that is > 0
    filled cells score -inf              (a filled cell is never revisited)

Randomness comes from numpy Generators, one per item, so an item's result depends only on its
own inputs and seed, never on the other items of the batch. The reference draws from torch's
RNG, so only deterministic settings (both temperatures 0) reproduce its tokens exactly.

Dimension legend:
    B  items in the batch     C  codebooks (8)     T  target frames of one item
    V  audio vocabulary (1025, MASK = V - 1)       k  cells filled in one step
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from .backbone import BackboneParams, forward_rows, make_packing, make_workspace
from . import kernels, text as text_mod
from .backend import to_device, to_numpy, xp
from .config import GenerationConfig, OmniVoiceConfig
from .errors import InputError
from .tokenizer import PreparedItem

CLASS_TOP_RATIO = 0.1  # class sampling keeps the best ceil(10 % of V) tokens of a cell


# ---------------------------------------------------------------------------------------------
# Schedule
# ---------------------------------------------------------------------------------------------


def time_steps(num_step: int, t_shift: float) -> np.ndarray:
    """The reference's shifted time grid t_0..t_num_step (float32, bit for bit).

    t = i / num_step is warped to s*t / (1 + (s-1)*t). The reference builds the grid with
    torch.linspace in float32, which computes `i * step` with a single rounding (a fused
    multiply-add) from the start for the first half and back from the end for the second
    half; float64 products rounded once to float32 reproduce that exactly. Bit-exactness
    matters because the number of cells per step is a ceil() of these differences.
    """
    n = num_step + 1
    step = np.float32(1.0) / np.float32(num_step)
    i = np.arange(n)
    from_start = (np.float64(step) * i).astype(np.float32)
    from_end = (1.0 - np.float64(step) * (n - 1 - i)).astype(np.float32)
    t = np.where(i < n // 2, from_start, from_end)  # [n] float32
    s = np.float32(t_shift)
    return (s * t / (np.float32(1.0) + np.float32(t_shift - 1.0) * t)).astype(np.float32)


def unmask_schedule(num_cells: int, num_step: int, t_shift: float) -> list[int]:
    """How many cells each step fills; sums to num_cells, the last step takes the remainder."""
    t = time_steps(num_step, t_shift).astype(np.float64)
    counts, left = [], num_cells
    for i in range(num_step):
        k = left if i == num_step - 1 else min(math.ceil(num_cells * (t[i + 1] - t[i])), left)
        counts.append(int(k))
        left -= int(k)
    return counts


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - xp.log(xp.exp(x).sum(axis=-1, keepdims=True))


def gumbel_noise(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard Gumbel noise with the reference's 1e-10 guards (float32)."""
    u = rng.random(shape, dtype=np.float32)
    return -np.log(-np.log(u + np.float32(1e-10)) + np.float32(1e-10))


def step_noise(draws) -> list:
    """Gumbel noise for several (rng, shape) draws, drawn on the host in that order (so every
    generator yields exactly the numbers it yields drawing one array at a time) and moved to
    the device in one copy: one transfer per step whatever the number of items."""
    if not draws:
        return []
    host = np.concatenate([gumbel_noise(rng, shape).reshape(-1) for rng, shape in draws])
    dev = to_device(host)  # one host -> device copy
    out, at = [], 0
    for _, shape in draws:
        n = math.prod(shape)
        out.append(dev[at:at + n].reshape(shape))
        at += n
    return out


def noise_draws(gen: GenerationConfig, cfg: OmniVoiceConfig, rng: np.random.Generator, T: int) -> list:
    """The (rng, shape) Gumbel draws one item makes in a step that fills cells, in the order it
    uses them: class noise [C, T, k] (class_temperature > 0), then position noise [C, T]
    (position_temperature > 0). Collect every item's and pass them to `step_noise` at once."""
    C = cfg.num_audio_codebook
    draws = []
    if gen.class_temperature > 0:
        draws.append((rng, (C, T, class_top_k(cfg.audio_vocab_size))))
    if gen.position_temperature > 0:
        draws.append((rng, (C, T)))
    return draws


def guided_log_probs(cond_logits, uncond_logits, guidance_scale: float, mask_id: int):
    """Per-cell log-probabilities after guidance, MASK excluded: [C, T, V] -> [C, T, V]."""
    return kernels.guided_scores(cond_logits, uncond_logits, guidance_scale, mask_id)[0]


def class_top_k(vocab: int) -> int:
    """Candidates per cell for class sampling: the best ceil(10 % of V) tokens."""
    return math.ceil(CLASS_TOP_RATIO * vocab)


def predict_tokens(lp, class_temperature: float, rng: np.random.Generator | None, noise=None):
    """Token per cell and its confidence (max log-prob): [C, T, V] -> [C, T] int64, [C, T] f32.

    With class_temperature > 0, `noise` [C, T, k] is the Gumbel noise to use (from
    `step_noise`); without it the noise is drawn from `rng` here."""
    confidence = lp.max(axis=-1)
    if class_temperature > 0:
        k = class_top_k(lp.shape[-1])
        top = xp.argpartition(-lp, k - 1, axis=-1)[..., :k]  # [C, T, k] candidate ids
        noisy = xp.take_along_axis(lp, top, axis=-1) / xp.float32(class_temperature)
        if noise is None:
            noise = step_noise([(rng, noisy.shape)])[0]
        noisy = noisy + noise  # Gumbel-max = a softmax draw
        tokens = xp.take_along_axis(top, noisy.argmax(axis=-1)[..., None], axis=-1)[..., 0]
    else:
        tokens = lp.argmax(axis=-1)
    return tokens.astype(xp.int64), confidence


def choose_cells(confidence, filled, k: int, gen: GenerationConfig,
                 rng: np.random.Generator | None, noise=None):
    """Flat indices (C-major over [C, T]) of the k cells to fill this step.

    With position_temperature > 0, `noise` [C, T] is the Gumbel noise to use (from
    `step_noise`); without it the noise is drawn from `rng` here."""
    C = confidence.shape[0]
    # Coarse codebooks carry the most information: make them win ties against fine ones.
    score = confidence - xp.float32(gen.layer_penalty_factor) * xp.arange(C, dtype=xp.float32)[:, None]
    if gen.position_temperature > 0:
        if noise is None:
            noise = step_noise([(rng, score.shape)])[0]
        score = score / xp.float32(gen.position_temperature) + noise
    score = xp.where(filled, -xp.inf, score).ravel()  # [C, T] -> [C*T]
    # k never exceeds the number of masked cells, so the -inf cells are never chosen.
    return xp.argsort(-score, kind="stable")[:k]


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def _item_rngs(seed, B: int) -> list:
    """One Generator per item: an int seed gives every item the same seed (so an item's
    result does not depend on its place in the batch); a sequence gives one seed per item."""
    seeds = text_mod.validate_seed(seed, B)  # per item: None or an integer in range
    return [np.random.default_rng(s) for s in seeds]


def generate_codes(params: BackboneParams, cfg: OmniVoiceConfig, items: Sequence[PreparedItem],
                   gen: GenerationConfig, seed: int | Sequence[int] | None = None,
                   on_step: Callable[[int, int], None] | None = None,
                   return_fill_steps: bool = False):
    """Run the whole unmasking loop on prepared items; returns one [C, T_i] int64 code array each.

    seed: None (fresh entropy), one int (every item uses it: an item generates the same codes
    alone or in any batch) or one int per item. Only used when a temperature is > 0.
    on_step(step, num_steps) is called after each step, step counting from 1.
    return_fill_steps: also return, per item, a [C, T_i] array of the step (0-based) at which
    each cell was filled.
    """
    if not items:
        return ([], []) if return_fill_steps else []
    C, mask_id = cfg.num_audio_codebook, cfg.audio_mask_id
    B, steps = len(items), gen.num_step
    text_mod.validate_sampling(gen)  # past these bounds the float32 scoring overflows
    rngs = _item_rngs(seed, B)
    use_uncond = gen.guidance_scale != 0  # without guidance the unconditional rows are unused

    # Packed rows: the B conditional rows, then (with guidance) the B unconditional rows.
    rows = [(it.input_ids, it.audio_mask) for it in items]
    if use_uncond:
        rows += [(it.uncond_ids, it.uncond_audio_mask) for it in items]
    for ids, _ in rows:
        if ids.shape[0] != C:
            raise InputError(f"prepared inputs have {ids.shape[0]} codebook rows, the model {C}")
    lengths = [ids.shape[1] for ids, _ in rows]
    num_out = [it.num_target for it in items] * (2 if use_uncond else 1)  # targets end every row
    # Refuse a pass whose buffers would not fit, before any of them is allocated.
    text_mod.check_pass_memory(cfg, lengths, num_out, gen.class_temperature > 0)
    pack = make_packing(lengths, cfg)
    work = make_workspace(cfg, pack)  # activation buffers shared by all steps
    ids = to_device(np.concatenate([r[0] for r in rows], axis=1))  # [C, N]
    audio_mask = to_device(np.concatenate([r[1] for r in rows]))  # [N]
    # Packed columns of item b's targets: in its conditional row r = b and, with guidance,
    # in its unconditional row r = B + b. Both are rewritten after every step.
    row_targets = [slice(s + L - T, s + L) for s, L, T in zip(pack.starts, pack.lengths, num_out)]
    target_slices = [row_targets[b::B] for b in range(B)]

    tokens = [xp.full((C, it.num_target), mask_id, dtype=xp.int64) for it in items]
    # kept on the device with the tokens: no copy back per step
    fill_step = [xp.full((C, it.num_target), -1, dtype=xp.int64) for it in items]
    schedules = [unmask_schedule(C * it.num_target, steps, gen.t_shift) for it in items]

    for step in range(steps):
        logits = forward_rows(params, cfg, ids, audio_mask, pack, num_out, work=work)
        # The step's Gumbel noise for every item, from each item's own generator in the
        # order it always drew, in one transfer.
        noise = iter(step_noise([d for b, it in enumerate(items) if schedules[b][step] > 0
                                 for d in noise_draws(gen, cfg, rngs[b], it.num_target)]))
        for b in range(B):
            k = schedules[b][step]
            if k <= 0:
                continue
            # one fused pass: guided log-probs, greedy token and confidence of every cell
            lp, pred, confidence = kernels.guided_scores(
                logits[b], logits[B + b] if use_uncond else None, gen.guidance_scale, mask_id)
            if gen.class_temperature > 0:
                pred, _ = predict_tokens(lp, gen.class_temperature, rngs[b], next(noise))
            filled = tokens[b] != mask_id
            pos_noise = next(noise) if gen.position_temperature > 0 else None
            chosen = choose_cells(confidence, filled, k, gen, rngs[b], pos_noise)
            flat = tokens[b].reshape(-1)  # a view: writes land in tokens[b]
            flat[chosen] = pred.reshape(-1)[chosen]
            fill_step[b].reshape(-1)[chosen] = step
            for sl in target_slices[b]:
                ids[:, sl] = tokens[b]
        if on_step is not None:
            on_step(step + 1, steps)

    codes = [to_numpy(t) for t in tokens]
    return (codes, [to_numpy(f) for f in fill_step]) if return_fill_steps else codes
