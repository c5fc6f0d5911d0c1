"""Confidence-based iterative unmasking with classifier-free guidance (OmniVoice's decoder loop).

The product's form of `spec.unmask` (model/spec.py), over packed rows and with the fast
profile's knobs: tests/test_spec.py holds its codes equal to the spec's.

All C x T target cells of an item start as MASK. Each of `num_step` steps runs the backbone on
the conditional row (prompt + current targets) and, for guidance, on the unconditional row
(current targets alone), scores every still-masked cell, and fills the k most confident ones
with their predicted token. k follows a shifted time grid that fills few cells early and many
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

`unmask_step` is that step for one pass, and `generate_codes` the whole loop: the algorithm,
written to be read. The product runs its fast equivalent, `packed_unmasking.iterate` (every
pass of an iteration scored, picked and filled in one call each); tests/test_packed_unmasking.py
holds the two to the same codes and fill steps, bit for bit.

The fast profile (GenerationConfig.profile "fast", and "live" on top of it) changes which rows
a step runs, never the step itself: between its refresh steps (every `prefix_refresh`) a pass's
conditional row runs its targets alone, attending to the prompt's keys and values kept from the
last full run, and its unconditional row runs every `uncond_every` steps, its logits reused
in between. That kept state is the profile's own (model/fast_profile.py, `PassState.kept`).

Randomness comes from numpy Generators, one per item, so an item's result depends only on its
own inputs and seed, never on the other items of the batch. The reference draws from torch's
RNG, so only deterministic settings (both temperatures 0) reproduce its tokens exactly.

Dimension legend:
    B  items in the batch     C  codebooks (8)     T  target frames of one item
    V  audio vocabulary (1025, MASK = V - 1)       k  cells filled in one step
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

import numpy as np

from ..errors import InputError
from . import scoring_kernels
from .backbone import BackboneParams, forward_rows, make_packing, make_workspace
from .backend import to_device, to_numpy, xp
from .config import GenerationConfig, OmniVoiceConfig, validate_sampling, validate_seed
from .cost import check_pass_memory, kept_bytes
from .fast_profile import Kept
from .tokenizer import PreparedItem

CLASS_TOP_RATIO = 0.1  # class sampling keeps the best ceil(10 % of V) tokens of a cell


# ---------------------------------------------------------------------------------------------
# How many cells each step fills
# ---------------------------------------------------------------------------------------------


def time_steps(num_step: int, t_shift: float) -> np.ndarray:
    """The reference's shifted time grid t_0..t_num_step (float32, bit for bit).

    t = i / num_step is warped to s*t / (1 + (s-1)*t). The reference builds the grid with
    torch.linspace in float32, which computes `i * step` with a single rounding (a fused
    multiply-add) from the start for the first half and back from the end for the second
    half; float64 products rounded once to float32 reproduce that exactly. Bit-exactness
    matters because the number of cells per step is a ceil() of these differences.
    The fast form of `spec.linspace01` and the shift in `spec.cells_per_step`.
    """
    n = num_step + 1
    step = np.float32(1.0) / np.float32(num_step)
    i = np.arange(n)
    from_start = (np.float64(step) * i).astype(np.float32)
    from_end = (1.0 - np.float64(step) * (n - 1 - i)).astype(np.float32)
    t = np.where(i < n // 2, from_start, from_end)  # [n] float32
    s = np.float32(t_shift)
    return (s * t / (np.float32(1.0) + np.float32(t_shift - 1.0) * t)).astype(np.float32)


def cells_per_step(num_cells: int, num_step: int, t_shift: float) -> list[int]:
    """How many cells each step fills; sums to num_cells, the last step takes the remainder.
    The fast form of `spec.cells_per_step`."""
    t = time_steps(num_step, t_shift).astype(np.float64)
    counts, left = [], num_cells
    for i in range(num_step):
        k = left if i == num_step - 1 else min(math.ceil(num_cells * (t[i + 1] - t[i])), left)
        counts.append(int(k))
        left -= int(k)
    return counts


# ---------------------------------------------------------------------------------------------
# Sampling pieces
# ---------------------------------------------------------------------------------------------


def gumbel_noise(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard Gumbel noise with the reference's 1e-10 guards (float32, on the host).
    The fast form of `spec.gumbel`."""
    u = rng.random(shape, dtype=np.float32)
    return -np.log(-np.log(u + np.float32(1e-10)) + np.float32(1e-10))


def class_top_k(vocab: int) -> int:
    """Candidates per cell for class sampling: the best ceil(10 % of V) tokens.
    The fast form of the candidates (`top`) of `spec.unmask`'s class sampling."""
    return math.ceil(CLASS_TOP_RATIO * vocab)


def sample_tokens(lp, class_temperature: float, noise):
    """Class sampling: per cell, a Gumbel-max draw (a softmax draw at `class_temperature`) among
    its best class_top_k(V) tokens. lp [C, T, V], noise [C, T, k] -> tokens [C, T] int64.
    The fast form of the class-temperature draw of `spec.unmask`."""
    k = class_top_k(lp.shape[-1])
    top = xp.argpartition(-lp, k - 1, axis=-1)[..., :k]  # [C, T, k] candidate ids
    noisy = xp.take_along_axis(lp, top, axis=-1) / xp.float32(class_temperature) + noise
    return xp.take_along_axis(top, noisy.argmax(axis=-1)[..., None], axis=-1)[..., 0].astype(xp.int64)


def choose_cells(confidence, filled, k: int, gen: GenerationConfig, noise=None):
    """Flat indices (C-major over [C, T]) of the k cells to fill this step: the best scores,
    confidence minus the layer penalty per codebook, and with position_temperature > 0 divided
    by it plus `noise` [C, T] (Gumbel); filled cells never again; ties go to the first cell.
    The fast form of the score and choice lines of `spec.unmask`."""
    C = confidence.shape[0]
    # Coarse codebooks carry the most information: make them win ties against fine ones.
    score = confidence - xp.float32(gen.layer_penalty_factor) * xp.arange(C, dtype=xp.float32)[:, None]
    if gen.position_temperature > 0:
        score = score / xp.float32(gen.position_temperature) + noise
    score = xp.where(filled, -xp.inf, score).ravel()  # [C, T] -> [C*T]
    # k never exceeds the number of masked cells, so the -inf cells are never chosen.
    return xp.argsort(-score, kind="stable")[:k]


# ---------------------------------------------------------------------------------------------
# One pass, one step
# ---------------------------------------------------------------------------------------------


_SERIALS = itertools.count()


class PassState:
    """One item's unmasking in flight: its rows (targets rewritten after every step), its own
    cells per step, step index and random generator, so that its result depends only on its
    own inputs and seed, never on which other passes share its forwards."""

    def __init__(self, item: PreparedItem, gen: GenerationConfig, seed: int | None,
                 cfg: OmniVoiceConfig):
        C, T = cfg.num_audio_codebook, item.num_target
        if item.input_ids.shape[0] != C:
            raise InputError(f"prepared inputs have {item.input_ids.shape[0]} codebook rows, "
                             f"the model {C}")
        self.gen, self.T, self.mask_id = gen, T, cfg.audio_mask_id
        self.use_uncond = gen.guidance_scale != 0  # without guidance the unconditional row is unused
        # Rows as (ids [C, L], audio_mask [L]): conditional, then (with guidance) unconditional.
        # Private copies (targets are rewritten every step), moved to the device once.
        self.rows = [(to_device(np.array(item.input_ids)), item.audio_mask)]
        if self.use_uncond:
            self.rows.append((to_device(np.array(item.uncond_ids)), item.uncond_audio_mask))
        self.num_out = [T] * len(self.rows)  # the targets end every row
        self.prompt = item.input_ids.shape[1] - T  # P: the positions before the targets
        # The fast profile's kept state (fast, or live: fast underneath); exact keeps nothing
        fast = gen.profile != "exact"
        self.kept = Kept(cfg, gen, self.prompt, T, self.use_uncond) if fast else None
        self.tokens = xp.full((C, T), self.mask_id, dtype=xp.int64)  # [C, T], MASK until filled
        self.filled_at = xp.full((C, T), -1, dtype=xp.int64)  # step of each fill, on the device
        self.cells_per_step = cells_per_step(C * T, gen.num_step, gen.t_shift)
        self.rng = np.random.default_rng(seed)
        self.step = 0
        self.serial = next(_SERIALS)  # tells passes apart (object ids can be reused)

    @property
    def done(self) -> bool:
        return self.step >= len(self.cells_per_step)

    @property
    def runs_uncond(self) -> bool:
        """Whether this step runs the unconditional row (else its kept logits stand in)."""
        return self.use_uncond and self.gen.uncond_at(self.step)

    def rows_now(self):
        """The rows this step runs, as (ids [C, L], audio_mask [L], offset, cache): exact runs
        every row whole; the fast profile asks its kept state (`Kept.rows_now`)."""
        if self.kept is not None:
            return self.kept.rows_now(self.rows, self.step, self.runs_uncond)
        return [(ids, mask, 0, None) for ids, mask in self.rows]

    def codes(self) -> np.ndarray:
        # a copy: the tokens may be a view into the buffers of the pack the pass last ran in
        return np.array(to_numpy(self.tokens))

    @property
    def fill_step(self) -> np.ndarray:
        """[C, T] int64 on the host: the step (0-based) at which each cell was filled."""
        return np.array(to_numpy(self.filled_at))


def unmask_step(s: PassState, cond, uncond=None) -> None:
    """One unmasking step of pass `s`, from the audio heads' logits of its T target positions:
    cond [C, T, V] on its conditional row, uncond [C, T, V] on its unconditional row (None
    without guidance). Fills this step's share of cells: s.tokens, s.filled_at and both rows'
    targets; then s.step moves on.
    The fast form of one step of `spec.unmask`."""
    gen, (C, T) = s.gen, s.tokens.shape
    # 1. Guided log-softmax over V, MASK ruled out; each cell's best token and its log-prob,
    #    the cell's confidence. (A scoring kernel: on numpy Numba, elsewhere its xp twin.)
    lp, tokens, confidence = scoring_kernels.guided_scores(
        cond, uncond if s.use_uncond else None, gen.guidance_scale, s.mask_id)
    # 2. How many cells this step fills.
    k = s.cells_per_step[s.step]
    if k > 0:  # (a step that fills nothing draws no noise)
        # 3. Class sampling: a draw among each cell's best tokens instead of the best one.
        if gen.class_temperature > 0:
            noise = to_device(gumbel_noise(s.rng, (C, T, class_top_k(lp.shape[-1]))))
            tokens = sample_tokens(lp, gen.class_temperature, noise)
        # 4. Pick the k best cells still masked.
        noise = to_device(gumbel_noise(s.rng, (C, T))) if gen.position_temperature > 0 else None
        cells = choose_cells(confidence, s.tokens != s.mask_id, k, gen, noise)
        # 5. Fill them: their tokens, the step, and the targets of both rows.
        s.tokens.reshape(-1)[cells] = tokens.reshape(-1)[cells]
        s.filled_at.reshape(-1)[cells] = s.step
        for ids, _ in s.rows:
            ids[:, -T:] = s.tokens
    s.step += 1


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def pass_seeds(seed, B: int) -> list:
    """One seed per item: an int seed gives every item the same seed (so an item's result does
    not depend on its place in the batch); a sequence gives one seed per item."""
    return validate_seed(seed, B)  # per item: None or an integer in range


def generate_codes(params: BackboneParams, cfg: OmniVoiceConfig, items: Sequence[PreparedItem],
                   gen: GenerationConfig, seed: int | Sequence[int] | None = None,
                   on_step: Callable[[int, int], None] | None = None,
                   return_fill_steps: bool = False):
    """Run the whole unmasking loop on prepared items in the calling thread: every step, one
    forward of all their rows packed together (the conditional rows, then the unconditional
    ones), then `unmask_step` on each item. Returns one [C, T_i] int64 code array each.

    seed: None (fresh entropy), one int (every item uses it: an item generates the same codes
    alone or in any batch) or one int per item. Only used when a temperature is > 0.
    on_step(step, num_steps) is called after each step, step counting from 1.
    return_fill_steps: also return, per item, a [C, T_i] array of the step (0-based) at which
    each cell was filled.
    The fast form of `spec.unmask`, for several items.
    """
    if not items:
        return ([], []) if return_fill_steps else []
    validate_sampling(gen)  # past these bounds the float32 scoring overflows
    # Refuse a pass whose buffers would not fit, before any of them is allocated: the rows of
    # the first step (every row whole) and what the passes keep between steps.
    guided = gen.guidance_scale != 0
    lengths = [it.input_ids.shape[1] for it in items] + [it.num_target for it in items if guided]
    num_out = [it.num_target for it in items] * (2 if guided else 1)
    kept = sum(kept_bytes(cfg, gen, it.input_ids.shape[1] - it.num_target, it.num_target, guided)
               for it in items)
    check_pass_memory(cfg, lengths, num_out, gen.class_temperature > 0, kept)
    states = [PassState(it, gen, s, cfg) for it, s in zip(items, pass_seeds(seed, len(items)))]
    # Packing and workspace of each layout of rows (exact: just one); the first step's, every
    # row whole, is the largest, and the others' buffers are views of its.
    forwards, largest = {}, None
    for step in range(gen.num_step):
        # This step's rows: every conditional row, then the unconditional ones that run.
        per_pass = [s.rows_now() for s in states]
        rows = [r[0] for r in per_pass] + [r[1] for r in per_pass if len(r) > 1]
        key = tuple((ids.shape[1], offset) for ids, _, offset, _ in rows)
        if key not in forwards:
            pack = make_packing([ids.shape[1] for ids, *_ in rows], cfg,
                                [offset for *_, offset, _ in rows], [c for *_, c in rows])
            work = make_workspace(cfg, pack, largest)
            largest = largest or work
            forwards[key] = (pack, work, to_device(np.concatenate([to_numpy(m) for _, m, *_ in rows])))
        pack, work, audio_mask = forwards[key]
        ids = xp.concatenate([ids for ids, *_ in rows], axis=1)  # [C, N]: this step's targets
        logits = forward_rows(params, cfg, ids, audio_mask, pack, [s.T for s in states] +
                              [s.T for s in states if s.runs_uncond], work=work)  # [C, T, V] per row
        fresh = iter(logits[len(states):])
        for s, cond in zip(states, logits):
            uncond = next(fresh) if s.runs_uncond else None
            if s.kept is not None and s.use_uncond:  # kept for, or standing in on, a skipped step
                uncond = s.kept.uncond_logits(uncond)
            unmask_step(s, cond, uncond)
        if on_step is not None:
            on_step(step + 1, gen.num_step)
    codes = [s.codes() for s in states]
    return (codes, [s.fill_step for s in states]) if return_fill_steps else codes
