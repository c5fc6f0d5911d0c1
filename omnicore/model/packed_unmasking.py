"""The packed unmasking step: the fast equivalent of `unmasking.unmask_step`, for every pass of
an iteration at once. This is what the engine runs, and what tests/test_spec.py holds to
`spec.unmask` (codes equal, each pass packed with others).

`iterate` packs the rows of all passes (each at its own step, with its own cells per step and
random generator) into one backbone forward, then scores every target cell of every pass in one
kernel call (`scoring_kernels.packed_scores`) and picks and fills each pass's share of cells in
another (`scoring_kernels.pick_fill`). The passes' state lives in packed arrays that their own
arrays are views of (`_Packed`), and the packing, workspace and packed state are kept while the
set of passes does not change (`PackCache`), so a step allocates nearly nothing and copies one
array of noise to the device at most. Only class sampling goes pass by pass (its [C, T, V]
log-probabilities, one pass at a time).

With the fast profile a step may run a pass's conditional row as its targets alone and skip
its unconditional row (`PassState.rows_now`, asking model/fast_profile.py): such a step's layout
of rows gets its own packing and plan (`_Packed.layout`), its workspace a view of the whole
rows' one, its ids gathered from the packed ids, and a skipped row's kept logits are scored
after the forward's.

Every pass gets exactly what `unmask_step` would give it on its own rows: the same arithmetic
per cell (one scoring routine behind both kernels), the same noise drawn from its generator in
the same order, the same stable ordering of scores. tests/test_packed_unmasking.py checks codes
and fill steps bit for bit, greedy and sampled, alone and packed with other passes.

Dimension legend:
    B  passes of an iteration      C  codebooks      T  target frames of a pass
    V  audio vocabulary per codebook                 n  target rows of the forward's logits
    cells  target cells of all passes (pass b's C x T_b, C-major, from cell_off[b])
"""

from __future__ import annotations

import types
from typing import Sequence

import numpy as np

from . import scoring_kernels
from .backbone import BackboneParams, forward_rows, make_packing, make_workspace
from .backend import to_device, to_numpy, xp
from .config import OmniVoiceConfig
from .unmasking import PassState, class_top_k, gumbel_noise, sample_tokens


class ScorePlan:
    """Where every pass's target cells and rows are, for scoring_kernels' `packed_scores` and
    `pick_fill`.

    Per pass b (host arrays [B], for the Numba kernels): T_b; cond_row (first of its T_b conditional
    target rows in the forward's [n, C, V] logits) and uncond_row (-1 without guidance);
    cond_col / uncond_col (first target column of its rows in the packed ids [C, N]);
    guidance, layer penalty and position temperature (float32); cell_off [B + 1]. Per cell
    (device arrays [cells], for the twins): its pass, codebook, both logits rows, both ids
    columns and its pass's settings.
    """

    def __init__(self, T, cond_row, uncond_row, cond_col, uncond_col, guidance, penalty,
                 temperature, num_codebooks: int, to_device=to_device):
        host = {"T": np.asarray(T, np.int64), "cond_row": np.asarray(cond_row, np.int64),
                "uncond_row": np.asarray(uncond_row, np.int64),
                "cond_col": np.asarray(cond_col, np.int64),
                "uncond_col": np.asarray(uncond_col, np.int64),
                "guidance": np.asarray(guidance, np.float32), "penalty": np.asarray(penalty, np.float32),
                "temperature": np.asarray(temperature, np.float32)}
        C = num_codebooks
        T = host["T"]
        host["cell_off"] = np.concatenate([[0], np.cumsum(C * T)]).astype(np.int64)  # [B + 1]
        self.host, self.C = host, C
        self.num_cells = int(host["cell_off"][-1])
        self.max_cells = int(C * T.max()) if T.size else 0
        seg = np.repeat(np.arange(T.size), C * T)  # [cells] pass of every cell
        local = np.arange(self.num_cells) - host["cell_off"][seg]  # index within its pass
        cb, t = local // T[seg], local % T[seg]
        guided = host["uncond_row"][seg] >= 0
        cells = {"seg": seg, "cb": cb, "cb_f32": cb.astype(np.float32),
                 "row_cond": host["cond_row"][seg] + t,
                 "row_uncond": np.where(guided, host["uncond_row"][seg] + t, host["cond_row"][seg] + t),
                 "guided": guided & (host["guidance"][seg] != 0),
                 "guidance": host["guidance"][seg],
                 "col_cond": host["cond_col"][seg] + t,
                 # without an unconditional row its target is written to the conditional one again
                 "col_uncond": np.where(host["uncond_col"][seg] >= 0,
                                        host["uncond_col"][seg] + t, host["cond_col"][seg] + t),
                 "penalty": host["penalty"][seg],
                 "sampled": host["temperature"][seg] > 0,
                 "temperature": np.where(host["temperature"][seg] > 0, host["temperature"][seg],
                                         np.float32(1)).astype(np.float32),
                 "off": host["cell_off"][seg]}
        self.dev = types.SimpleNamespace(**{k: to_device(v) for k, v in cells.items()})


class _Packed:
    """The unmasking state of a set of passes as packed arrays, which the passes' own arrays
    are views of (so a pass leaving the set keeps its state): ids [C, N] of every row back to
    back, tokens and fill steps [cells] (pass b's C x T_b cells C-major from plan's cell_off),
    and each pass's cells per step and step on the device (the step advances there, no copy)."""

    def __init__(self, cfg: OmniVoiceConfig, states: Sequence[PassState]):
        C = cfg.num_audio_codebook
        guided = [s for s in states if s.use_uncond]
        rows = [(s, 0) for s in states] + [(s, 1) for s in guided]
        self.ids = xp.concatenate([s.rows[i][0] for s, i in rows], axis=1)  # [C, N]
        self.mask = np.concatenate([to_numpy(s.rows[i][1]) for s, i in rows])  # [N] on the host
        starts, at = {}, 0
        for s, i in rows:  # the passes' rows become views of the packed ids
            ids, mask = s.rows[i]
            L = ids.shape[1]
            s.rows[i] = (self.ids[:, at:at + L], mask)
            starts[s.serial, i] = at
            at += L
        self.tokens = xp.concatenate([s.tokens.reshape(-1) for s in states])  # [cells]
        self.fill = xp.concatenate([s.filled_at.reshape(-1) for s in states])  # [cells]
        off = 0
        for s in states:
            n = C * s.T
            s.tokens = self.tokens[off:off + n].reshape(C, s.T)
            s.filled_at = self.fill[off:off + n].reshape(C, s.T)
            off += n
        Ts = [s.T for s in states]
        cond_row = np.cumsum([0] + Ts[:-1])
        uncond_row, u = [], sum(Ts)
        for s in states:
            uncond_row.append(u if s.use_uncond else -1)
            u += s.T if s.use_uncond else 0
        self.plan = ScorePlan(
            Ts, cond_row, uncond_row,
            [starts[s.serial, 0] + s.rows[0][0].shape[1] - s.T for s in states],
            [starts[s.serial, 1] if s.use_uncond else -1 for s in states],
            [s.gen.guidance_scale for s in states], [s.gen.layer_penalty_factor for s in states],
            [s.gen.position_temperature for s in states], C)
        S = max(len(s.cells_per_step) for s in states)
        counts = np.zeros((len(states), S + 1), np.int64)  # [B, S + 1]: 0 past a pass's end
        for b, s in enumerate(states):
            counts[b, :len(s.cells_per_step)] = s.cells_per_step
        self.cells_per_step = to_device(counts)
        self.step = to_device(np.array([s.step for s in states], np.int64))  # [B]
        self.no_noise = xp.zeros(self.plan.num_cells, dtype=xp.float32)
        self.starts, self.cond_row, self.layouts = starts, cond_row, {}

    def layout(self, cfg: OmniVoiceConfig, states: Sequence[PassState], now, whole_work):
        """The forward of a step whose rows are not all whole (the fast profile): (packing,
        workspace: views of `whole_work`, audio mask [N'], ids columns [N'] of the packed ids,
        plan: unconditional logits of passes that skip their row after the forward's), one per
        layout of rows, kept while the set of passes lasts."""
        key = tuple((rows[0][2], len(rows)) for rows in now)  # (cond row's offset, rows) per pass
        if key not in self.layouts:
            rows = [(s, r[0], 0) for s, r in zip(states, now)] + \
                [(s, r[1], 1) for s, r in zip(states, now) if len(r) > 1]
            cols = np.concatenate([self.starts[s.serial, i] + offset + np.arange(ids.shape[1])
                                   for s, (ids, _, offset, _), i in rows])  # [N']
            pack = make_packing([ids.shape[1] for _, (ids, *_), _ in rows], cfg,
                                [offset for _, (*_, offset, _), _ in rows],
                                [c for _, (*_, c), _ in rows])
            n_cond = sum(s.T for s in states)
            at_fresh, at_kept = n_cond, n_cond + sum(s.T for s, r in zip(states, now) if len(r) > 1)
            uncond_row = []
            for s, r in zip(states, now):
                if not s.use_uncond:
                    uncond_row.append(-1)
                elif len(r) > 1:  # its row ran: its logits follow the conditional ones
                    uncond_row.append(at_fresh)
                    at_fresh += s.T
                else:  # skipped: its kept logits, appended after the forward's
                    uncond_row.append(at_kept)
                    at_kept += s.T
            h = self.plan.host
            plan = ScorePlan(h["T"], self.cond_row, uncond_row, h["cond_col"], h["uncond_col"],
                             h["guidance"], h["penalty"], h["temperature"], cfg.num_audio_codebook)
            self.layouts[key] = (pack, make_workspace(cfg, pack, whole_work),
                                 to_device(self.mask[cols]), to_device(cols), plan)
        return self.layouts[key]


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

    def get(self, cfg: OmniVoiceConfig, rows, serials: tuple[int, ...], caches=()):
        """Packing, workspace and audio mask of the passes' whole rows (`caches`: the prompt
        cache of each row, or None, for the fast profile's whole rows, which write them)."""
        lengths = tuple(ids.shape[1] for ids, _ in rows)
        key = (lengths, tuple(id(c) if c is not None else None for c in caches))
        if key != self.key:
            self.key = None  # a failed rebuild must not leave a stale entry
            self.pack = self.work = None  # the old buffers go before the new ones come
            self.pack = make_packing(lengths, cfg, caches=caches)
            self.work = make_workspace(cfg, self.pack)
            self.key = key
        if serials != self.mask_key:  # equal lengths do not mean equal text/audio positions
            self.audio_mask = to_device(np.concatenate([to_numpy(m) for _, m in rows]))  # [N]
            self.mask_key = serials
        return self.pack, self.work, self.audio_mask

    def packed_state(self, cfg: OmniVoiceConfig, states: Sequence[PassState]) -> _Packed:
        serials = tuple(s.serial for s in states)
        if self.packed_key != serials:
            self.packed = None  # let the old buffers go before the new ones are allocated
            self.packed = _Packed(cfg, states)
            self.packed_key = serials
        return self.packed


def draw_noise(cfg: OmniVoiceConfig, states: Sequence[PassState], ks: Sequence[int], packed):
    """This step's Gumbel noise, each pass drawing from its own generator in the order it always
    has (class noise [C, T, k], then position noise [C, T]), in one host -> device copy:
    position noise per cell [cells] (0 for passes without it) and each class-sampled pass's
    class noise (None for the others).
    The fast form of the `spec.gumbel` draws of one step of `spec.unmask`."""
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
    """One unmasking step of every pass in `states` (each at its own step index): what
    `unmasking.unmask_step` does to each, with the rows of all passes packed into one forward
    and every pass scored, picked and filled by its own cells per step in one call each (only
    class sampling goes pass by pass, its [C, T, V] log-probabilities one pass at a time).
    The fast form of one step of `spec.unmask`, for every pass at once."""
    cache = cache or PackCache()
    packed = cache.packed_state(cfg, states)
    # Packed rows: every conditional row, then the unconditional ones (passes with guidance).
    guided = [s for s in states if s.use_uncond]
    rows = [s.rows[0] for s in states] + [s.rows[1] for s in guided]
    fast = any(s.kept is not None for s in states)  # whole rows then write prompt caches
    caches = ([s.kept.cache if s.kept else None for s in states] + [None] * len(guided)
              if fast else [])
    pack, work, audio_mask = cache.get(cfg, rows, tuple(s.serial for s in states), caches)
    ids, plan = packed.ids, packed.plan
    # The fast profile: this step's rows, when they are not all whole (PassState.rows_now:
    # a conditional row's targets alone, after its prompt, or an unconditional row skipped)
    now = [s.rows_now() for s in states]
    if any(r[0][2] > 0 for r in now) or sum(map(len, now)) < len(rows):
        pack, work, audio_mask, cols, plan = packed.layout(cfg, states, now, work)
        ids = packed.ids[:, cols]  # [C, N']
    num_out = [s.T for s in states] + [s.T for s, r in zip(states, now) if len(r) > 1]
    logits = forward_rows(params, cfg, ids, audio_mask, pack, num_out, work=work,
                          whole=True)  # [C, n, V]
    skipped = []
    for b, (s, r) in enumerate(zip(states, now)):
        if s.kept is None or s.kept.uncond is None:
            continue
        if len(r) > 1:  # its unconditional row ran: keep its logits for the steps that skip it
            u = int(plan.host["uncond_row"][b])
            s.kept.uncond_logits(logits[:, u:u + s.T])
        else:
            skipped.append(s.kept.uncond)
    if skipped:  # the plan scores them after the forward's rows, in pass order
        logits = xp.concatenate([logits] + skipped, axis=1)  # [C, n + kept, V]
    ks = [s.cells_per_step[s.step] for s in states]
    noise, class_noise = draw_noise(cfg, states, ks, packed)
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
        tokens = sample_tokens(lp, s.gen.class_temperature, cn)
        pred[off:off + tokens.size] = tokens.reshape(-1)
        del lp
    step = xp.minimum(packed.step, packed.cells_per_step.shape[1] - 1)
    k = xp.take_along_axis(packed.cells_per_step, step[:, None], axis=1)[:, 0]  # [B]
    scoring_kernels.pick_fill(pred, conf, noise, k, packed.step, plan, cfg.audio_mask_id,
                              packed.tokens, packed.fill, packed.ids)
    packed.step += 1
    for s in states:
        s.step += 1

