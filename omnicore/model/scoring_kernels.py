"""The unmasking loop's scoring kernels: guided log-softmax, confidences, pick and fill.

The fast forms of the scoring lines of `spec.unmask` (model/spec.py).

An unmasking step turns the audio heads' logits of a pass into a best token and a confidence
per cell (classifier-free guidance, log-softmax with MASK ruled out), then picks the step's
share of cells by confidence minus the layer penalty and fills them. `guided_scores` scores one
pass (`unmasking.unmask_step` calls it; class sampling needs its log-probabilities);
`packed_scores` and `pick_fill` score, pick and fill every pass of an iteration in one call
each, over the ragged cell offsets of a `packed_unmasking.ScorePlan` (`packed_unmasking.iterate`,
the fast form of the step). As in `kernels`, every Numba kernel sits beside a plain
array twin written with `xp` (the shared machinery, float32 exp and running max are `jit`'s).

What `tests/test_scoring_kernels.py` holds, and why:
- a cell scored by `packed_scores` (whatever the other passes), by `guided_scores` on its own
  pass, serial or parallel: **bit for bit** the same. All of them run one function per cell,
  `_score_cell`, compiled without fast-math, so its float32 operations and their order are the
  ones written (sums in explicit lanes). With fast-math, LLVM fused multiply-adds and reordered
  the sums anew in each kernel that inlined the cell, and in a kernel linked to a copy of it
  that the kernel cache held: the same cell's confidence differed between the two kernels (by
  2.6e-7 in a failed run: guidance amplifies a rounding of the log-softmaxes), depending on
  which had been compiled first on the machine.
- the twins among themselves: bit for bit too (numpy sums each row the same way whatever rows
  surround it).
- a kernel against its twin: the same formula, but another exp (`jit.exp_nonpos`, within
  1.5 ulp) and another summation order (lanes against numpy's pairwise sum): within a stated
  float32 tolerance, equal in their picks on the drawn inputs.

Dimension legend:
    C  codebooks        T  target frames of a pass      V  audio vocabulary per codebook
    B  passes of an iteration    n  target rows of the forward's logits [n, C, V]
    cells  target cells of all passes (pass b's C x T_b, C-major, from cell_off[b])
"""

from __future__ import annotations

import math

import numpy as np

from . import jit
from .backend import xp
from .jit import F32 as _F32, FAST, exp_nonpos, prange, row_max


# --- guided scoring of the unmasking loop ----------------------------------------------------


# The cell's arithmetic: compiled without fast-math flags (no reassociation, no FMA contraction),
# so every kernel that runs it computes the same bits (module docstring). `_score_cell` says
# fastmath=False explicitly: a Numba function that does not say inherits the flags of the first
# kernel that compiles it. Its sums keep explicit lanes, an order that vectorises as written
# (scoring costs about a fifth more than with fast-math: 8 x 300 x 1025 guided cells 12.7 ->
# 15.5 ms on a busy 2-core machine, beside a full-size forward pass of about a second).


# Lanes of the sums: two vectors of 16 in flight (exp's polynomial is a chain of dependent steps)
_SUM_LANES = 32


@jit.njit(inline="always", error_model="numpy")
def _rest_and_ties(row, n, mx):
    """(sum of exp(row[j] - mx) over row[j] < mx, count of row[j] >= mx), in a fixed order:
    _SUM_LANES running sums over whole blocks, the lanes added in order, then the tail.

    The sum of exp(x - max) is 1 + rest (+ 1 per extra maximum): as one float32 it would lose
    rest's digits below 6e-8, where near-tied confidences (near 0) differ, so rest is kept apart
    for log1p."""
    acc = np.zeros(_SUM_LANES, dtype=np.float32)
    cnt = np.zeros(_SUM_LANES, dtype=np.int32)
    whole = n - n % _SUM_LANES
    for j in range(0, whole, _SUM_LANES):
        for lane in range(_SUM_LANES):
            d = row[j + lane] - mx
            e = exp_nonpos(d)  # for every entry, then a select: no branch, so it vectorises
            acc[lane] += e if d < _F32(0.0) else _F32(0.0)
            cnt[lane] += np.int32(1) if d >= _F32(0.0) else np.int32(0)
    rest = _F32(0.0)
    ties = np.int32(0)
    for lane in range(_SUM_LANES):
        rest += acc[lane]
        ties += cnt[lane]
    for j in range(whole, n):
        d = row[j] - mx
        rest += exp_nonpos(d) if d < _F32(0.0) else _F32(0.0)
        ties += np.int32(1) if d >= _F32(0.0) else np.int32(0)
    return rest, ties


@jit.njit(inline="always", error_model="numpy")
def _log_sum_exp(row, n):
    """(max, log of the sum of exp(row - max)), as `log_softmax_np` computes them."""
    mx = row_max(row, n)
    rest, ties = _rest_and_ties(row, n, mx)
    return mx, math.log1p(rest + _F32(ties - 1))  # maxima beyond the first add exactly 1 each


@jit.njit(inline="always", error_model="numpy")
def _log_normalise(out, n):
    """out <- log_softmax(out) in place; returns lse, and the best entries are exactly -lse."""
    mx, lse = _log_sum_exp(out, n)
    for j in range(n):  # (x - max) - lse, as written: the best entries are exactly -lse
        out[j] = (out[j] - mx) - lse
    return lse


@jit.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _score_cell(x, y, use_uncond, guidance, mask_id, out):
    """One cell: out [V] <- guided log-probs of logits x (and y, unconditional); returns the
    first index of the maximum and the maximum (MASK excluded). The same float32 operations
    in the same order as `guided_scores_np` per cell, bar exp (`jit.exp_nonpos`) and the
    summation order (_SUM_LANES lanes against numpy's pairwise sum)."""
    v_ = x.shape[0]
    if use_uncond:
        mx, log_tot = _log_sum_exp(x, v_)
        my, log_tot_u = _log_sum_exp(y, v_)
        for j in range(v_):  # z = cl + g (cl - ul) with cl, ul the two log-softmaxes
            cl = (x[j] - mx) - log_tot
            ul = (y[j] - my) - log_tot_u
            out[j] = cl + guidance * (cl - ul)
    else:
        for j in range(v_):
            out[j] = x[j]
    lse = _log_normalise(out, v_)
    # the maxima are exactly -lse: no pass to find the best, unless MASK was one of them
    masked_max = out[mask_id] == -lse
    out[mask_id] = -np.inf  # MASK is never a prediction
    best = row_max(out, v_) if masked_max else -lse
    arg = 0
    while out[arg] != best:  # first index of the maximum, as argmax
        arg += 1
    return arg, best


def _guided_scores_impl(cond, uncond, guidance, use_uncond, mask_id, lp, tokens, conf):
    # cond, uncond, lp [T, C, V] C-contiguous; tokens [C, T] int64, conf [C, T] float32
    t_, c_, v_ = cond.shape
    for cell in prange(t_ * c_):
        t, c = cell // c_, cell % c_
        arg, best = _score_cell(cond[t, c], uncond[t, c], use_uncond, guidance, mask_id, lp[t, c])
        tokens[c, t] = arg
        conf[c, t] = best


_guided_scores_nb, _guided_scores_nb_par = jit.twice(_guided_scores_impl, fastmath=FAST)


def log_softmax_np(x):
    """Log-softmax over the last axis (the one used everywhere: scoring and its tests). As the
    kernel: the sum of exp(x - max) as 1 + the other terms, through log1p.
    The fast form of `spec.log_softmax`."""
    x = x - x.max(axis=-1, keepdims=True)
    top = x >= 0
    rest = xp.where(top, xp.float32(0), xp.exp(x)).sum(axis=-1, keepdims=True)
    return x - xp.log1p(rest + (top.sum(axis=-1, keepdims=True) - 1).astype(x.dtype))


def guided_scores_np(cond, uncond, guidance: float, mask_id: int):
    """Twin of `guided_scores`."""
    if uncond is not None and guidance != 0:
        c, u = log_softmax_np(cond), log_softmax_np(uncond)
        lp = log_softmax_np(c + xp.float32(guidance) * (c - u))
    else:
        lp = log_softmax_np(cond)
    lp[..., mask_id] = -xp.inf
    return lp, lp.argmax(axis=-1).astype(xp.int64), lp.max(axis=-1)


@jit.kernel(twin=guided_scores_np)
def guided_scores(cond, uncond, guidance: float, mask_id: int):
    """Classifier-free-guided log-probabilities of every cell, its best token and confidence.

    cond, uncond [C, T, V] logits (uncond None, or guidance 0: no guidance) ->
    lp [C, T, V] = log_softmax(c + g (c - u)) of the log-softmaxes c, u, with lp[..., MASK] = -inf;
    tokens [C, T] int64 = argmax lp (first on ties); confidence [C, T] float32 = max lp.
    The fast form of the scoring lines of `spec.unmask`.
    """
    use_uncond = uncond is not None and guidance != 0
    # [C, T, V] views of the heads' [T, C, V] output are contiguous again once transposed back
    ct = np.ascontiguousarray(cond.transpose(1, 0, 2), dtype=_F32)  # [C, T, V] -> [T, C, V]
    ut = np.ascontiguousarray(uncond.transpose(1, 0, 2), dtype=_F32) if use_uncond else ct
    c_, t_, v_ = cond.shape
    lp = np.empty((t_, c_, v_), _F32)
    tokens = np.empty((c_, t_), np.int64)
    conf = np.empty((c_, t_), _F32)
    jit.serial_or_parallel(_guided_scores_nb, _guided_scores_nb_par, ct.size)(
        ct, ut, _F32(guidance), use_uncond, mask_id, lp, tokens, conf)
    return lp.transpose(1, 0, 2), tokens, conf


# --- packed scoring, pick and fill: every pass of an iteration in one call each ------------
#
# The kernels of `packed_unmasking.iterate`, the fast form of `unmasking.unmask_step`. The
# passes' target cells are laid out back to back, pass b's C x T_b cells C-major from
# cell_off[b] (its tokens array flattened). A `packed_unmasking.ScorePlan` (`plan` below) holds
# the ragged offsets once per set of passes: `plan.host` the per-pass arrays the Numba kernels
# read, `plan.dev` the per-cell index arrays the twins gather with.


def _packed_scores_impl(logits, cond_row, uncond_row, T, cell_off, guidance, mask_id, pred, conf):
    # logits [n, C, V] C-contiguous; per pass b its cells at cell_off[b] + c*T[b] + t
    c_, v_ = logits.shape[1], logits.shape[2]
    for j in prange(T.shape[0] * c_):
        b, c = j // c_, j % c_
        use_uncond = uncond_row[b] >= 0 and guidance[b] != 0
        out = np.empty(v_, dtype=np.float32)
        for t in range(T[b]):
            x = logits[cond_row[b] + t, c]
            y = logits[uncond_row[b] + t, c] if use_uncond else x
            arg, best = _score_cell(x, y, use_uncond, guidance[b], mask_id, out)
            cell = cell_off[b] + c * T[b] + t
            pred[cell] = arg
            conf[cell] = best


_packed_scores_nb, _packed_scores_nb_par = jit.twice(_packed_scores_impl, fastmath=FAST)


# Cells the twin scores per slice at least (~34 MB per [cells, V] temporary): on a device the
# passes of an iteration then take one slice or a few, not one each.
TWIN_SLICE_CELLS = 8192


def packed_scores_np(logits, plan, mask_id: int):
    """Twin of `packed_scores`: the per-cell rows gathered, in slices of the longest pass's
    cells or TWIN_SLICE_CELLS, whichever is more, so its temporaries stay bounded."""
    d = plan.dev
    pred = xp.empty(plan.num_cells, dtype=xp.int64)
    conf = xp.empty(plan.num_cells, dtype=xp.float32)
    step = max(plan.max_cells, TWIN_SLICE_CELLS)
    for a in range(0, plan.num_cells, step):
        sl = slice(a, min(a + step, plan.num_cells))
        cb = d.cb[sl]
        c = log_softmax_np(logits[d.row_cond[sl], cb])  # [cells, V]
        u = log_softmax_np(logits[d.row_uncond[sl], cb])
        g = d.guidance[sl][:, None]
        lp = xp.where(d.guided[sl][:, None], log_softmax_np(c + g * (c - u)), c)
        lp[:, mask_id] = -xp.inf
        pred[sl] = lp.argmax(axis=-1)
        conf[sl] = lp.max(axis=-1)
    return pred, conf


@jit.kernel(twin=packed_scores_np)
def packed_scores(logits, plan, mask_id: int):
    """Greedy token and confidence of every target cell of every pass, in one call.

    logits [n, C, V] (the forward's scored rows, back to back) -> pred [cells] int64, conf
    [cells] float32, per cell what `guided_scores` gives on its pass's own logits. No [C, T, V]
    log-probabilities are kept (one row of scratch per codebook row).
    The fast form of the scoring lines of `spec.unmask`, for every pass."""
    h = plan.host
    x = np.ascontiguousarray(logits, dtype=_F32)
    pred = np.empty(plan.num_cells, np.int64)
    conf = np.empty(plan.num_cells, _F32)
    jit.serial_or_parallel(_packed_scores_nb, _packed_scores_nb_par, x.size)(
        x, h["cond_row"], h["uncond_row"], h["T"], h["cell_off"], h["guidance"], mask_id, pred, conf)
    return pred, conf


def pick_fill(pred, conf, noise, k, step, plan, mask_id: int, tokens, fill, ids):
    """Fill the k[b] best still-masked cells of every pass b, in one call.

    score = conf - penalty * codebook, then (temperature > 0) / temperature + noise; masked
    cells only; top k[b] of pass b by a stable sort (ties: first cell, C-major). The chosen
    cells get their `pred` token in `tokens` [cells] and in both rows' targets of `ids`
    [C, N], and `step[b]` in `fill` [cells]; all three are written in place. k, step [B]
    int64; noise [cells] float32 (read only for passes with a temperature).

    Whole-array operations on every backend (no size read back from a device), and no Numba:
    a Numba loop was a little faster (0.7 against 1.0 ms for 12,000 cells, nothing beside a
    forward pass) but its stable sort took 3-4 s to compile on a machine's first run.
    The fast form of the choice and fill lines of `spec.unmask`, for every pass."""
    d = plan.dev
    score = conf - d.penalty * d.cb_f32
    score = xp.where(d.sampled, score / d.temperature + noise, score)
    score = xp.where(tokens != mask_id, -xp.inf, score)
    order = xp.argsort(-score, kind="stable")  # best first, ties: first cell
    order = order[xp.argsort(d.seg[order], kind="stable")]  # grouped by pass, still best first
    rank = xp.empty_like(order)
    rank[order] = xp.arange(plan.num_cells) - d.off[order]
    chosen = rank < k[d.seg]
    tokens[...] = xp.where(chosen, pred, tokens)
    fill[...] = xp.where(chosen, step[d.seg], fill)
    ids[d.cb, d.col_cond] = tokens
    ids[d.cb, d.col_uncond] = tokens
    return tokens
