"""What one forward pass costs, and the limits a pass is held to.

`forward_bytes` is the working memory of one forward pass plus its scoring, from the model's
dimensions: what `backbone.make_packing`, `make_workspace` and `forward_rows` allocate and the
scoring keeps. `forward_flops` counts its GEMMs' floating-point operations (the engine's cost
model for scheduling, and the benchmarks' roofline). `check_pass_memory` refuses, with an
InputError, a pass that would exceed MAX_PASS_POSITIONS or MAX_PASS_BYTES before anything is
allocated: the unmasking loop and the engine's admission both call it.

Dimension legend (as in backbone.py):
    C  audio codebooks      V  audio vocabulary per codebook     D  hidden size     F  MLP width
    H  query heads          K  key/value heads (H = K * G)       E  head dim
    N  tokens of all packed rows    L  length of one row         n  positions scored by the heads
"""

from __future__ import annotations

import math

from ..errors import InputError
from .config import FRAME_RATE


def forward_bytes(cfg, lengths, num_out, class_sampling: bool = False, prefix=()) -> int:
    """Estimated peak working memory (bytes) of one forward pass plus scoring, for packed rows
    of ``lengths`` positions whose last ``num_out`` positions are scored, from the model's
    dimensions (``cfg`` an ``OmniVoiceConfig``; float32 throughout).

    Counts what ``backbone.make_packing``/``make_workspace``/``forward_rows`` and the scoring
    allocate: per packed token the residual, norm and sub-block buffers [3 D], query, grouped
    query and attention output [3 H*E], keys and values [2 K*E], the MLP's gate and up [2 F],
    rotary tables and their temporaries [4 E] and the embedding gather [(C+1) D] plus its ids;
    per the longest row its [K, L*G, L] scores with [K, L*G, E] outputs; per scored position
    the heads' logits [C*V] (freed before the next step's forward) and two [D] rows; for the
    scoring one pass's [C, T, V] log-probabilities, or four times that with class sampling
    (negated copy and int64 indices of the top-k selection): class-sampled passes are scored
    one at a time, and greedy scoring of all passes at once keeps no such array (counted as
    one all the same: the margin). An upper bound, and a close one, so that the budget means
    what it says (tests/test_limits.py). ``prefix[r]``: the cached prompt positions row r
    attends to before its own (the fast profile's targets alone; 0 or absent: none); such a
    row's scores grow to [K, L*G, P + L], and its keys and values are copied next to the cache.
    What a pass keeps between steps is ``kept_bytes``.
    """
    q = cfg.llm_config
    C, V = cfg.num_audio_codebook, cfg.audio_vocab_size
    D, F, E = q.hidden_size, q.intermediate_size, q.head_dim
    H, K = q.num_attention_heads, q.num_key_value_heads
    G = H // K
    N, L, n = sum(lengths), max(lengths), sum(num_out)
    prefix = prefix or [0] * len(lengths)
    keys = [Lr + p for Lr, p in zip(lengths, prefix)]
    per_token = 3 * D + 3 * H * E + 2 * K * E + 2 * F + 4 * E + (C + 1) * D + 2 * C
    attention = K * G * (max(Lr * k for Lr, k in zip(lengths, keys)) + L * (E + 1))
    # a row reading a cache: its keys and values joined to the cache's, [P + L, K*E] each
    attention += 2 * K * E * max((k for k, p in zip(keys, prefix) if p), default=0)
    logits = n * (C * V + 2 * D)
    scoring = max(num_out) * C * V * (4 if class_sampling else 1)
    return 4 * (N * per_token + attention + logits + scoring)


def forward_flops(cfg, lengths, num_out, prefix=()) -> int:
    """Floating-point operations of the GEMMs of one forward pass over packed rows of
    ``lengths`` positions whose last ``num_out`` positions are scored by the heads: per token
    every layer's projections and MLP, per row its attention scores and weighted values
    (its length times its keys: its own, plus ``prefix[r]`` cached prompt positions), per
    scored position the audio heads. The engine's cost model."""
    q = cfg.llm_config
    D, F, E = q.hidden_size, q.intermediate_size, q.head_dim
    H, K, layers = q.num_attention_heads, q.num_key_value_heads, q.num_hidden_layers
    per_token = 2 * D * (H * E + 2 * K * E) + 2 * H * E * D + 3 * 2 * D * F
    per_square = 2 * 2 * H * E  # q k^T and p v, every head
    heads = 2 * D * cfg.num_audio_codebook * cfg.audio_vocab_size
    squares = sum(L * (L + p) for L, p in zip(lengths, prefix or [0] * len(lengths)))
    return layers * (per_token * sum(lengths) + per_square * squares) + heads * sum(num_out)


def step_rows(gen, step: int, prompt: int, frames: int, guided: bool):
    """The rows one pass runs at `step`: (lengths, num_out, prefix) as forward_flops and
    forward_bytes take them. Its conditional row whole (prompt + frames positions) or, between
    the fast profile's refreshes, its frames alone after `prompt` cached positions; with
    guidance its unconditional row (frames) when it runs at that step."""
    full = gen.full_row_at(step)
    lengths = [prompt + frames if full else frames]
    prefix = [0 if full else prompt]
    if guided and gen.uncond_at(step):
        lengths.append(frames)
        prefix.append(0)
    return lengths, [frames] * len(lengths), prefix


def pass_flops(cfg, gen, prompt: int, frames: int, guided: bool) -> int:
    """forward_flops of every step of one pass (`gen.num_step` of them; the fast profile's
    steps differ), summed."""
    total = 0
    for step in range(gen.num_step):
        lengths, num_out, prefix = step_rows(gen, step, prompt, frames, guided)
        total += forward_flops(cfg, lengths, num_out, prefix)
    return total


def frames_within(cfg, gen, prompt: int, guided: bool, flops: float, most: int,
                  text_per_frame: float = 0.0) -> int:
    """The most target frames T (0 to `most`) whose pass costs at most `flops` (pass_flops):
    with `prompt` positions before the text of those frames, and `text_per_frame` text tokens
    per frame (the text grows with the speech it says). Cost grows with T: bisection."""
    def fits(T):
        return pass_flops(cfg, gen, prompt + math.ceil(text_per_frame * T), T, guided) <= flops

    lo, hi = 0, most  # fits(lo) or lo == 0; the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def kept_bytes(cfg, gen, prompt: int, frames: int, guided: bool) -> int:
    """What one pass keeps from step to step beyond its rows and codes: with the fast profile
    its prompt's keys and values (fast_profile.PromptCache: layers x 2 x [prompt, K*E]) and, with
    guidance and uncond_every > 1, its last unconditional logits [C, frames, V] (live: the same).
    0 for exact."""
    if gen.profile == "exact":
        return 0
    q = cfg.llm_config
    cache = q.num_hidden_layers * 2 * prompt * q.num_key_value_heads * q.head_dim
    uncond = cfg.num_audio_codebook * frames * cfg.audio_vocab_size if guided and gen.uncond_every > 1 else 0
    return 4 * (cache + uncond)


# Working memory of one forward pass (all rows packed together), estimated from the model's
# dimensions by ``forward_bytes``. A fixed budget rather than the machine's free memory, so that
# whether an input is accepted does not depend on what else runs. (Typical figures:
# benchmarks/README.md.)
MAX_PASS_BYTES = 4 * 2**30

# Positions of one pass's row: instruct/language/text tokens, reference frames, target frames.
# The longest legitimate row (a 180 s pass with a 60 s reference and both transcripts) is under
# 8,192; a long text squeezed into a short duration is what goes beyond (its tokens all sit in
# one row, and attention is quadratic in the row).
MAX_PASS_POSITIONS = 8192


def check_pass_memory(cfg, lengths, num_out, class_sampling: bool = False, kept: int = 0) -> int:
    """``forward_bytes`` of one pass (plus ``kept``: what it keeps between steps, kept_bytes)
    if its rows have at most ``MAX_PASS_POSITIONS`` positions and it fits ``MAX_PASS_BYTES``,
    else ``InputError``."""
    if max(lengths) > MAX_PASS_POSITIONS:
        raise InputError(
            f"one generation pass would hold {max(lengths):,} positions (text tokens, voice "
            f"reference and {max(num_out) / FRAME_RATE:.1f} s of target); the limit is "
            f"{MAX_PASS_POSITIONS:,}. The text is too long for its duration: ask for a longer "
            "duration or a slower speed, split the text into several calls, or use a shorter "
            "voice reference and transcript."
        )
    need = forward_bytes(cfg, lengths, num_out, class_sampling) + kept
    if need > MAX_PASS_BYTES:
        raise InputError(
            f"one generation pass ({max(lengths):,} positions: prompt, voice reference and "
            f"{max(num_out) / FRAME_RATE:.0f} s of target) would need about {need / 2**30:.1f} "
            f"GiB of working memory; the limit is {MAX_PASS_BYTES / 2**30:g} GiB. Shorten the "
            "sentence (add punctuation so long text is cut into ~15 s pieces), use a shorter "
            "voice reference and transcript, or ask for a shorter duration."
        )
    return need
