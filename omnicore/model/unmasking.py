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

import itertools
import math
from typing import Callable, Sequence

import numpy as np

from ..errors import InputError
from . import scoring_kernels
from .backbone import BackboneParams, forward_rows, make_packing, make_workspace
from .cost import check_pass_memory
from .backend import to_device, to_numpy, xp
from .config import GenerationConfig, OmniVoiceConfig, validate_sampling, validate_seed
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


log_softmax = scoring_kernels.log_softmax_np  # the twin the fused scoring kernel is tested against


def gumbel_noise(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard Gumbel noise with the reference's 1e-10 guards (float32)."""
    u = rng.random(shape, dtype=np.float32)
    return -np.log(-np.log(u + np.float32(1e-10)) + np.float32(1e-10))


def step_noise(draws) -> list:
    """Gumbel noise for several (rng, shape) draws, drawn on the host in that order (so every
    generator yields exactly the numbers it yields drawing one array at a time) and moved to
    the device in one copy: one transfer per step whatever the number of passes."""
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
# One pass and one iteration: the loop body shared by `generate_codes` and the engine
# ---------------------------------------------------------------------------------------------


_SERIALS = itertools.count()


class PassState:
    """One item's unmasking in flight: its rows (targets rewritten after every step), its own
    schedule, step index and random generator, so that its result depends only on its own
    inputs and seed, never on which other passes share its forwards."""

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
        self.tokens = xp.full((C, T), self.mask_id, dtype=xp.int64)
        self._fill_step = xp.full((C, T), -1, dtype=xp.int64)  # on the device: no copy back per step
        self.schedule = unmask_schedule(C * T, gen.num_step, gen.t_shift)
        self.rng = np.random.default_rng(seed)
        self.step = 0
        self.serial = next(_SERIALS)  # tells passes apart in PackCache (ids can be reused)

    @property
    def done(self) -> bool:
        return self.step >= len(self.schedule)

    def codes(self) -> np.ndarray:
        # a copy: the tokens are a view into the buffers of the pack the pass last ran in
        return np.array(to_numpy(self.tokens))

    @property
    def fill_step(self) -> np.ndarray:
        """[C, T] int64 on the host: the step (0-based) at which each cell was filled."""
        return np.array(to_numpy(self._fill_step))


class _Packed:
    """The unmasking state of a set of passes as packed arrays, which the passes' own arrays
    are views of (so a pass leaving the set keeps its state): ids [C, N] of every row back to
    back, tokens and fill steps [cells] (pass b's C x T_b cells C-major from plan's cell_off),
    and each pass's schedule and step on the device (the step advances there, no copy)."""

    def __init__(self, cfg: OmniVoiceConfig, states: Sequence["PassState"]):
        C = cfg.num_audio_codebook
        guided = [s for s in states if s.use_uncond]
        rows = [(s, 0) for s in states] + [(s, 1) for s in guided]
        self.ids = xp.concatenate([s.rows[i][0] for s, i in rows], axis=1)  # [C, N]
        starts, at = {}, 0
        for s, i in rows:  # the passes' rows become views of the packed ids
            ids, mask = s.rows[i]
            L = ids.shape[1]
            s.rows[i] = (self.ids[:, at:at + L], mask)
            starts[s.serial, i] = at
            at += L
        self.tokens = xp.concatenate([s.tokens.reshape(-1) for s in states])  # [cells]
        self.fill = xp.concatenate([s._fill_step.reshape(-1) for s in states])  # [cells]
        off = 0
        for s in states:
            n = C * s.T
            s.tokens = self.tokens[off:off + n].reshape(C, s.T)
            s._fill_step = self.fill[off:off + n].reshape(C, s.T)
            off += n
        Ts = [s.T for s in states]
        cond_row = np.cumsum([0] + Ts[:-1])
        uncond_row, u = [], sum(Ts)
        for s in states:
            uncond_row.append(u if s.use_uncond else -1)
            u += s.T if s.use_uncond else 0
        self.plan = scoring_kernels.ScorePlan(
            Ts, cond_row, uncond_row,
            [starts[s.serial, 0] + s.rows[0][0].shape[1] - s.T for s in states],
            [starts[s.serial, 1] if s.use_uncond else -1 for s in states],
            [s.gen.guidance_scale for s in states], [s.gen.layer_penalty_factor for s in states],
            [s.gen.position_temperature for s in states], C, to_device)
        S = max(len(s.schedule) for s in states)
        sched = np.zeros((len(states), S + 1), np.int64)  # [B, S + 1]: 0 past a pass's end
        for b, s in enumerate(states):
            sched[b, :len(s.schedule)] = s.schedule
        self.schedule = to_device(sched)
        self.step = to_device(np.array([s.step for s in states], np.int64))  # [B]
        self.no_noise = xp.zeros(self.plan.num_cells, dtype=xp.float32)


class PackCache:
    """The packing, workspace and packed state of the last set of passes: it changes only when
    one joins or leaves, so most iterations reuse them (no fresh pages to fault in)."""

    def __init__(self):
        self.key: tuple[int, ...] | None = None
        self.pack = self.work = None
        self.mask_key: tuple[int, ...] | None = None
        self.audio_mask = None
        self.packed: _Packed | None = None
        self.packed_key: tuple[int, ...] | None = None

    def get(self, cfg: OmniVoiceConfig, rows, serials: tuple[int, ...]):
        key = tuple(ids.shape[1] for ids, _ in rows)
        if key != self.key:
            self.key = None  # a failed rebuild must not leave a stale entry
            self.pack = make_packing(key, cfg)
            self.work = make_workspace(cfg, self.pack)
            self.key = key
        if serials != self.mask_key:  # equal lengths do not mean equal text/audio positions
            self.audio_mask = to_device(np.concatenate([to_numpy(m) for _, m in rows]))  # [N]
            self.mask_key = serials
        return self.pack, self.work, self.audio_mask

    def packed_state(self, cfg: OmniVoiceConfig, states: Sequence["PassState"]) -> _Packed:
        serials = tuple(s.serial for s in states)
        if self.packed_key != serials:
            self.packed = None  # let the old buffers go before the new ones are allocated
            self.packed = _Packed(cfg, states)
            self.packed_key = serials
        return self.packed


def _step_noise(cfg: OmniVoiceConfig, states: Sequence["PassState"], ks: Sequence[int], packed):
    """This step's Gumbel noise, each pass drawing from its own generator in the order it always
    has (class noise [C, T, k], then position noise [C, T]), in one host -> device copy:
    position noise per cell [cells] (0 for passes without it) and each class-sampled pass's
    class noise (None for the others)."""
    C, top = cfg.num_audio_codebook, class_top_k(cfg.audio_vocab_size)
    pos, cls, drawn = [], [], False
    for s, k in zip(states, ks):
        g = s.gen
        c = gumbel_noise(s.rng, (C, s.T, top)) if k > 0 and g.class_temperature > 0 else None
        p = gumbel_noise(s.rng, (C, s.T)) if k > 0 and g.position_temperature > 0 else None
        drawn |= c is not None or p is not None
        pos.append(p.reshape(-1) if p is not None else np.zeros(C * s.T, np.float32))
        cls.append(c)
    if not drawn:
        return packed.no_noise, cls
    dev = to_device(np.concatenate(pos + [c.reshape(-1) for c in cls if c is not None]))  # one copy
    at, out = packed.plan.num_cells, []
    for c in cls:
        if c is not None:
            out.append(dev[at:at + c.size].reshape(c.shape))
            at += c.size
        else:
            out.append(None)
    return dev[:packed.plan.num_cells], out


def iterate(params: BackboneParams, cfg: OmniVoiceConfig, states: Sequence[PassState],
            cache: PackCache | None = None) -> None:
    """One unmasking step of every pass in `states` (each at its own step index): the rows of
    all passes packed into one forward, then every pass scored, picked and filled by its own
    schedule in one call each (only class sampling goes pass by pass, its [C, T, V]
    log-probabilities one pass at a time)."""
    cache = cache or PackCache()
    packed = cache.packed_state(cfg, states)
    # Packed rows: every conditional row, then the unconditional ones (passes with guidance).
    guided = [s for s in states if s.use_uncond]
    rows = [s.rows[0] for s in states] + [s.rows[1] for s in guided]
    num_out = [s.T for s in states] + [s.T for s in guided]
    pack, work, audio_mask = cache.get(cfg, rows, tuple(s.serial for s in states))
    logits = forward_rows(params, cfg, packed.ids, audio_mask, pack, num_out, work=work,
                          whole=True)  # [C, n, V]
    ks = [s.schedule[s.step] for s in states]
    noise, class_noise = _step_noise(cfg, states, ks, packed)
    plan = packed.plan
    pred, conf = scoring_kernels.packed_scores(logits.transpose(1, 0, 2), plan,
                                               cfg.audio_mask_id)  # [n, C, V] -> [cells]
    for b, (s, k, cn) in enumerate(zip(states, ks, class_noise)):
        if cn is None:
            continue
        # class sampling: this pass's log-probabilities alone (the memory of one pass)
        r, u, off = (int(v) for v in (plan.host["cond_row"][b], plan.host["uncond_row"][b],
                                      plan.host["cell_off"][b]))
        lp, _, _ = scoring_kernels.guided_scores(
            logits[:, r:r + s.T], logits[:, u:u + s.T] if u >= 0 else None,
            s.gen.guidance_scale, cfg.audio_mask_id)
        tokens, _ = predict_tokens(lp, s.gen.class_temperature, s.rng, cn)
        pred[off:off + tokens.size] = tokens.reshape(-1)
        del lp
    step = xp.minimum(packed.step, packed.schedule.shape[1] - 1)
    k = xp.take_along_axis(packed.schedule, step[:, None], axis=1)[:, 0]  # [B]
    scoring_kernels.pick_fill(pred, conf, noise, k, packed.step, plan, cfg.audio_mask_id,
                              packed.tokens, packed.fill, packed.ids)
    packed.step += 1
    for s in states:
        s.step += 1


def pass_seeds(seed, B: int) -> list:
    """One seed per item: an int seed gives every item the same seed (so an item's result does
    not depend on its place in the batch); a sequence gives one seed per item."""
    return validate_seed(seed, B)  # per item: None or an integer in range


def generate_codes(params: BackboneParams, cfg: OmniVoiceConfig, items: Sequence[PreparedItem],
                   gen: GenerationConfig, seed: int | Sequence[int] | None = None,
                   on_step: Callable[[int, int], None] | None = None,
                   return_fill_steps: bool = False):
    """Run the whole unmasking loop on prepared items in the calling thread (all packed into
    one forward per step); returns one [C, T_i] int64 code array each.

    seed: None (fresh entropy), one int (every item uses it: an item generates the same codes
    alone or in any batch) or one int per item. Only used when a temperature is > 0.
    on_step(step, num_steps) is called after each step, step counting from 1.
    return_fill_steps: also return, per item, a [C, T_i] array of the step (0-based) at which
    each cell was filled.
    """
    if not items:
        return ([], []) if return_fill_steps else []
    validate_sampling(gen)  # past these bounds the float32 scoring overflows
    states = [PassState(it, gen, s, cfg) for it, s in zip(items, pass_seeds(seed, len(items)))]
    # Refuse a pass whose buffers would not fit, before any of them is allocated.
    check_pass_memory(cfg, [ids.shape[1] for s in states for ids, _ in s.rows],
                               [n for s in states for n in s.num_out], gen.class_temperature > 0)
    cache = PackCache()
    for step in range(gen.num_step):
        iterate(params, cfg, states, cache)
        if on_step is not None:
            on_step(step + 1, gen.num_step)
    codes = [s.codes() for s in states]
    return (codes, [s.fill_step for s in states]) if return_fill_steps else codes
