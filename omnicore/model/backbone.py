"""OmniVoice's backbone: fused text/audio embeddings -> bidirectional Qwen3 -> audio heads.

The product's fast form of `spec.embed`, `spec.layer` and `spec.logits` (model/spec.py, the
plain statement): tests/test_spec.py holds its logits within 1e-5 of the largest.

Several rows of different lengths (the conditional and unconditional rows of every item in a
batch) run together *without padding*: their tokens are packed into one [N, D] matrix, so
every projection and MLP is one large GEMM over all rows, while attention runs row by row
(a block-diagonal attention pattern). Each row sees only itself and its positions start at 0,
which is exactly what the reference computes with its padded batch and boolean masks.

Why there is no KV cache: attention is bidirectional, so every position's keys and values
depend on every other position of its row, and each unmasking step changes the ids of the
masked targets. Nothing computed in one step stays valid in the next. The approximate "fast"
profile keeps one all the same (model/fast_profile.py): a row can write the keys and values of
its prompt positions to a `PromptCache` when it runs in full, and a later run of its targets
alone reads them instead of recomputing the prompt (`Packing.caches`), a few steps old.

Read in this order: the parameters, the packing, the two GEMM helpers, then the model
(`embed`, `attention`, `decoder_layer`, `audio_logits`, `forward_rows`). `decoder_layer` is a
Qwen3 layer as written to be read; `hidden_states` runs its fused form, `_layer_fused`, last
in the file with the workspace it writes into (tests/test_backbone.py holds the two equal, bit
for bit). Where the time goes, and how it is kept near the GEMM roofline:
  * projections and the MLP are GEMMs on all N packed tokens against the checkpoint's own
    [out, in] matrices (x @ W.T: BLAS reads the transposed operand in place, so the weights
    are read from the file once, as stored, with no transposed copy);
  * attention is two batched GEMM calls per row (one GEMM per kv head each): the G query
    heads that share a kv head are stacked into one [L*G, E] matrix, and K/V are read in place
    (never repeated per head);
  * everything between GEMMs (norms fused with the residual adds, q/k norm + rotary, softmax,
    SwiGLU) is a Numba kernel from `kernels` that writes into a `Workspace` of buffers made
    once per packing and reused by every layer of every unmasking step.

Dimension legend:
    C  audio codebooks (8)       V  audio vocabulary per codebook (1025, MASK = 1024 included)
    N  tokens of all packed rows L  length of one row
    D  hidden size               F  MLP width
    H  query heads               K  key/value heads (H = K * G, G query heads share a K/V head)
    E  head dim                  n  positions whose logits are wanted
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from . import backend, jit, kernels
from .backend import to_device, to_numpy, xp
from ..errors import WeightsError
from .config import OmniVoiceConfig
from .fast_profile import PromptCache
from .int8_kernels import Int8Weight, int8_linear, quantize_activations, quantize_weight

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerParams:
    """One decoder layer; field names are the checkpoint's key leaves.

    Projection matrices keep the checkpoint's [out, in] layout and the model computes x @ W.T.
    A transposed copy made at load time would briefly hold every matrix twice, and BLAS
    multiplies by W.T in place as fast as by a transposed copy (benchmarks/README.md).
    """

    input_layernorm: np.ndarray  # [D]
    # (under the int8 profile each projection is an int8_kernels.Int8Weight of that matrix)
    q_proj: np.ndarray  # [H*E, D]
    k_proj: np.ndarray  # [K*E, D]
    v_proj: np.ndarray  # [K*E, D]
    o_proj: np.ndarray  # [D, H*E]
    q_norm: np.ndarray  # [E]
    k_norm: np.ndarray  # [E]
    post_attention_layernorm: np.ndarray  # [D]
    gate_proj: np.ndarray  # [F, D]
    up_proj: np.ndarray  # [F, D]
    down_proj: np.ndarray  # [D, F]


@dataclass(frozen=True)
class BackboneParams:
    embed_tokens: object  # [text vocab, D]: an array, or a table read by rows on use
    audio_embeddings: np.ndarray  # [C*V, D]: codebook c's table is rows c*V .. c*V+V-1
    layers: tuple[LayerParams, ...]
    norm: np.ndarray  # [D]
    audio_heads: np.ndarray  # [C*V, D] as stored; logits are h @ audio_heads.T
    # what every GEMM's inputs are rounded to (backend.PRECISIONS; the weights already are)
    precision: str = "fp32"


# ---------------------------------------------------------------------------------------------
# Packing rows of different lengths
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Packing:
    """Where each row lives in the packed token axis, the rotary tables for it, and which rows
    keep or read a prompt cache.

    Row r covers positions offsets[r] .. offsets[r] + lengths[r] - 1 of its sequence (0 .. L-1
    for a whole row). With caches[r] given, a row at offset 0 writes its first
    caches[r].length positions' keys and values to it, and a row at offset P = caches[r].length
    (its targets alone) attends to those P cached positions before its own (`reads`).
    """

    lengths: tuple[int, ...]  # L of every row
    starts: tuple[int, ...]  # offset of every row in [0, N)
    cos: np.ndarray  # [N, E]
    sin: np.ndarray  # [N, E]
    offsets: tuple[int, ...] = ()  # first position of every row (() : all 0)
    caches: tuple = ()  # PromptCache or None per row (() : none)
    # device index arrays made by `tail_index`, by num_out (one copy to the device per packing)
    _tails: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def cache(self, r: int) -> PromptCache | None:
        return self.caches[r] if self.caches else None

    def reads(self, r: int) -> bool:
        """Whether row r attends to its prompt cache (it is the targets alone)."""
        return bool(self.offsets) and self.offsets[r] > 0  # (make_packing: then it has one)

    def keys(self, r: int) -> int:
        """Keys row r attends to: its own positions, and a read cache's before them."""
        return self.lengths[r] + (self.cache(r).length if self.reads(r) else 0)

    def padded_rows(self):
        """The rows as one padded batch, for attention in a single batched call on the device:
        gather [R, Lmax] (packed position of row r's l-th token; past the row's end its last
        token, so padded queries stay finite), key_gather [R, Lk] (where row r's l-th key is
        in the packed keys followed by the read caches' keys, in row order), key_bias [R, 1, Lk]
        (0, or -inf past the row's keys) and scatter [N] (where each packed token sits in the
        flattened [R * Lmax] batch)."""
        if "padded" not in self._tails:
            R, Lmax = len(self.lengths), max(self.lengths)
            Lk = max(self.keys(r) for r in range(R))
            l, lk = np.arange(Lmax), np.arange(Lk)
            gather = np.array([s + np.minimum(l, n - 1) for s, n in zip(self.starts, self.lengths)])
            key_rows, cached = [], self.num_tokens
            for r, (s, n) in enumerate(zip(self.starts, self.lengths)):
                own = s + np.arange(n)
                if self.reads(r):  # the cache's P keys (after the packed ones) come first
                    P = self.cache(r).length
                    own = np.concatenate([cached + np.arange(P), own])
                    cached += P
                key_rows.append(own[np.minimum(lk, len(own) - 1)])
            keys = np.array([self.keys(r) for r in range(R)])
            bias = np.where(lk[None, :] < keys[:, None], 0.0, -np.inf).astype(np.float32)
            scatter = np.concatenate([r * Lmax + np.arange(n) for r, n in enumerate(self.lengths)])
            self._tails["padded"] = (to_device(gather), to_device(np.array(key_rows)),
                                     to_device(bias.reshape(R, 1, Lk)), to_device(scatter))
        return self._tails["padded"]

    def tail_index(self, num_out: Sequence[int]):
        """Packed positions of the last num_out[r] tokens of every row r, on the device [sum(num_out)]."""
        key = tuple(int(n) for n in num_out)
        if key not in self._tails:
            self._tails[key] = to_device(np.concatenate(
                [np.arange(s + L - n, s + L) for s, L, n in zip(self.starts, self.lengths, key)]))
        return self._tails[key]


def rope_inv_freq(cfg: OmniVoiceConfig) -> np.ndarray:
    """Rotary frequencies theta^(-2i/E), rounded the way the float32 reference rounds them.
    The fast form of the frequencies in `spec.rope`."""
    q = cfg.llm_config
    exponent = np.arange(0, q.head_dim, 2, dtype=np.float32) / np.float32(q.head_dim)  # [E/2]
    # The power in float64 rounds to the nearest float32; torch's float32 pow lands on the
    # same value for nearly every entry (the rest differ by one ulp, far below tolerance).
    power = (np.float64(q.rope_theta) ** exponent.astype(np.float64)).astype(np.float32)
    return np.float32(1.0) / power


def make_packing(lengths: Sequence[int], cfg: OmniVoiceConfig, offsets: Sequence[int] = (),
                 caches: Sequence = ()) -> Packing:
    """Pack rows of the given lengths; positions restart at 0 in every row, or at offsets[r]
    (a row's targets after its cached prompt). `caches`: a PromptCache or None per row."""
    lengths = tuple(int(n) for n in lengths)
    offsets = tuple(int(o) for o in offsets) or (0,) * len(lengths)
    caches = tuple(caches) if any(c is not None for c in caches) else ()
    for r, o in enumerate(offsets):  # a row starts at 0, or right after its cached prompt
        if o and (not caches or caches[r] is None or caches[r].length != o):
            raise ValueError(f"row {r} starts at position {o} without a prompt cache of {o}")
    starts = tuple(int(s) for s in np.cumsum((0,) + lengths[:-1]))
    positions = np.concatenate([np.arange(o, o + n, dtype=np.float32)
                                for o, n in zip(offsets, lengths)])  # [N]
    angles = positions[:, None] * rope_inv_freq(cfg)[None, :]  # [N] x [E/2] -> [N, E/2]
    # Half-split RoPE: the two halves of a head share the same angles (not interleaved pairs).
    angles = np.concatenate([angles, angles], axis=1)  # [N, E/2] -> [N, E]
    return Packing(lengths, starts, to_device(np.cos(angles)), to_device(np.sin(angles)),
                   offsets if any(offsets) else (), caches)


# ---------------------------------------------------------------------------------------------
# The GEMMs: the one place their inputs meet the precision profile
# ---------------------------------------------------------------------------------------------


def linear(x, w, out=None, precision: str = "fp32"):
    """x [..., in] @ w.T for a projection w kept in the checkpoint's [out, in] layout, into
    `out` when given. x is first rounded, in place, to what `precision` feeds a GEMM
    (backend.PRECISIONS; w was rounded once, at load; "fp32" leaves both as they are). On a
    device, bf16 and fp16 multiply half-precision arrays instead (w stored so; x converted),
    accumulating in float32: the same products. A weight quantised at load (the int8 profile's
    projections, an Int8Weight) multiplies x [M, in] as int8_kernels.int8_linear defines; a
    float32 weight under "int8" (the audio heads) is a float32 GEMM.
    The fast form of the projections of `spec.layer` (`h @ W.T`)."""
    if isinstance(w, Int8Weight):
        return int8_linear(x, w, out)  # [M, in] -> [M, out]: x quantised per row, exact int sums
    if precision in backend.ROUNDED:
        if w.dtype != xp.float32:  # a half-precision weight (backend.half_gemm)
            return backend.matmul_half(backend.to_half(x, precision), w.T, precision, out)
        backend.round_gemm_input(x, precision)
    return backend.matmul(x, w.T, out=out)


def linears(x, ws, outs, precision: str = "fp32"):
    """`linear` of one input x [M, in] by each projection of ws into the matching buffer of
    outs (q/k/v; gate/up): under int8 x is quantised once for all of them (the same codes and
    scales each `linear` would make).
    The fast form of the projections of `spec.layer` that read the same input."""
    if isinstance(ws[0], Int8Weight):
        x = quantize_activations(x)  # [M, in] -> its int8 codes and scales, packed
    for w, out in zip(ws, outs):
        linear(x, w, out, precision)  # [M, in] -> [M, out]


def bmm(a, b, out=None, precision: str = "fp32"):
    """a @ b for attention's batched products of activations ([..., M, K] @ [..., K, N]), both
    rounded in place to `precision` first, into `out` when given (as half-precision arrays on
    a device, like `linear`; int8 leaves them float32). The fast form of the two einsums of
    `spec.layer`'s attention."""
    if precision in backend.ROUNDED:
        if backend.half_gemm(precision):
            return backend.matmul_half(backend.to_half(a, precision), backend.to_half(b, precision),
                                       precision, out)
        backend.round_gemm_input(a, precision)
        backend.round_gemm_input(b, precision)
    return backend.matmul(a, b, out=out)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def embed(params: BackboneParams, cfg: OmniVoiceConfig, ids, audio_mask, out=None):
    """Input vectors of packed rows: ids [C, N] int64, audio_mask [N] bool -> [N, D].

    Text positions look up codebook row 0's id in the text table. Audio positions add up one
    vector per codebook, id + c*V in the joint audio table, MASK (V-1) included: a masked
    frame is "MASK in every codebook", not zero.
    The fast form of `spec.embed`, over packed rows.
    """
    C, V = cfg.num_audio_codebook, cfg.audio_vocab_size
    ids = to_device(ids)
    audio_mask = to_device(audio_mask)
    x = out if out is not None else xp.empty((ids.shape[1], params.embed_tokens.shape[1]), dtype=xp.float32)
    text_pos = xp.nonzero(~audio_mask)[0]
    audio_pos = xp.nonzero(audio_mask)[0]
    # The text table lives on the host (read by rows from disk): look up with host ids.
    x[text_pos] = to_device(params.embed_tokens[to_numpy(ids[0, text_pos])])  # [n_text, D]
    shifted = ids[:, audio_pos] + (xp.arange(C) * V)[:, None]  # [C, n_audio]
    x[audio_pos] = params.audio_embeddings[shifted].sum(axis=0)  # [C, n_audio, D] -> [n_audio, D]
    return x


def attention(lp: LayerParams, cfg: OmniVoiceConfig, h, pack: Packing, work: Workspace,
              precision: str = "fp32", layer: int = 0):
    """Bidirectional grouped-query self-attention within each packed row: h [N, D] ->
    work.attn [N, H*E] (before o_proj). `work` holds the queries, keys, values and scores;
    `layer` is this layer's index in the rows' prompt caches (`Packing.caches`).
    The fast form of the attention lines of `spec.layer`."""
    q_cfg = cfg.llm_config
    E, K = q_cfg.head_dim, q_cfg.num_key_value_heads
    G = q_cfg.num_attention_heads // K
    linears(h, (lp.q_proj, lp.k_proj, lp.v_proj), (work.q, work.k, work.v),
            precision)  # [N, D] -> q [N, H*E], k and v [N, K*E]
    # Qwen3 normalises every query/key head before the rotation (keeps the logits bounded).
    kernels.qk_norm_rope(work.q, work.k, lp.q_norm, lp.k_norm, pack.cos, pack.sin,
                         q_cfg.rms_norm_eps, work.qg)  # q -> qg [K, N, G*E]; k in place
    for r, c in enumerate(pack.caches):  # a whole row keeps its prompt's keys and values
        if c is not None and not pack.reads(r):
            start = pack.starts[r]
            c.k[layer] = work.k[start:start + c.length]  # [P, K*E]
            c.v[layer] = work.v[start:start + c.length]
    return _attend(pack, work, K, G, E, E ** -0.5, precision, layer)


def decoder_layer(lp: LayerParams, cfg: OmniVoiceConfig, x, pack: Packing, work: Workspace,
                  precision: str = "fp32", layer: int = 0):
    """One pre-norm Qwen3 decoder layer: x [N, D] -> a new [N, D]. (`work`: attention's
    scratch; `layer`: its index, for the prompt caches.) `hidden_states` runs its fused form,
    `_layer_fused`, which gives the same bits.
    The fast form of `spec.layer`, over packed rows."""
    eps = cfg.llm_config.rms_norm_eps
    h = kernels.rms_norm(x, lp.input_layernorm, eps)  # [N, D]
    attn = attention(lp, cfg, h, pack, work, precision, layer)  # [N, D] -> [N, H*E]
    x = x + linear(attn, lp.o_proj, None, precision)  # [N, H*E] -> [N, D]
    h = kernels.rms_norm(x, lp.post_attention_layernorm, eps)
    gate = linear(h, lp.gate_proj, None, precision)  # [N, D] -> [N, F]
    up = linear(h, lp.up_proj, None, precision)  # [N, D] -> [N, F]
    mlp = kernels.swiglu(gate, up)  # silu(gate) * up, in gate's buffer
    return x + linear(mlp, lp.down_proj, None, precision)  # [N, F] -> [N, D]


def hidden_states(params: BackboneParams, cfg: OmniVoiceConfig, x, pack: Packing,
                  work: Workspace | None = None):
    """All decoder layers over packed embeddings: [N, D] -> [N, D] (before the final norm), by
    the fused form of `decoder_layer`. The result is work.x (overwritten by the next call with
    the same workspace).
    The fast form of the layer loop of `spec.logits`."""
    work = work or make_workspace(cfg, pack)
    if x is not work.x:
        work.x[...] = x
    layers = params.layers
    kernels.rms_norm(work.x, layers[0].input_layernorm, cfg.llm_config.rms_norm_eps, out=work.h)
    for i, lp in enumerate(layers):
        nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else None
        _layer_fused(lp, cfg, pack, work, next_norm=nxt, precision=params.precision, layer=i)
    return work.x


def audio_logits(params: BackboneParams, cfg: OmniVoiceConfig, h):
    """Final norm and audio heads on selected positions: h [n, D] -> logits [C, n, V].
    The fast form of the final norm and heads of `spec.logits`."""
    C, V = cfg.num_audio_codebook, cfg.audio_vocab_size
    h = kernels.rms_norm(h, params.norm, cfg.llm_config.rms_norm_eps)
    logits = linear(h, params.audio_heads, precision=params.precision)  # [n, D] -> [n, C*V]
    logits = logits.reshape(h.shape[0], C, V)  # [n, C*V] -> [n, C, V]
    return logits.transpose(1, 0, 2)  # [n, C, V] -> [C, n, V]


def forward_rows(params: BackboneParams, cfg: OmniVoiceConfig, ids, audio_mask, pack: Packing,
                 num_out: Sequence[int], work: Workspace | None = None, whole: bool = False):
    """Logits of the last `num_out[r]` positions of every packed row r.

    ids [C, N], audio_mask [N] hold the rows back to back as described by `pack`. Returns one
    [C, num_out[r], V] float32 array per row. The final norm and the audio heads run on those
    positions only: a 1024 x 8200 head on every prompt token would be pure waste. `work`
    (from make_workspace for this packing) is reused when given; the logits then live in it
    and are overwritten by its next call (the layers and heads run as one `backend.replay`).
    With `whole`, one [C, sum(num_out), V] array instead (the rows back to back), for scoring
    every row in one call.
    The fast form of `spec.logits`, for every packed row at once.
    """
    work = work or make_workspace(cfg, pack)
    embed(params, cfg, ids, audio_mask, out=work.x)  # [N, D]; reads text rows from the host
    tails = pack.tail_index(num_out)

    def layers_and_heads():  # fixed buffers in, no host round trip: replayable as one graph
        h = hidden_states(params, cfg, work.x, pack, work)  # [N, D]
        return audio_logits(params, cfg, h[tails])  # [C, sum(num_out), V]

    caches = tuple((id(c.k), pack.reads(r)) if c is not None else None
                   for r, c in enumerate(pack.caches))  # recorded work writes / reads these
    # int8: the GEMMs are Numba kernels; BLAS keeps to this thread so that one pool runs them
    with jit.one_pool(params.precision == backend.INT8):
        logits = backend.replay(work.replays, (id(params), tuple(num_out), caches), layers_and_heads)
    if whole:
        return logits
    bounds = np.cumsum(num_out)[:-1].tolist()
    return xp.split(logits, bounds, axis=1)


# ---------------------------------------------------------------------------------------------
# The fast form of a layer: residual adds fused with the next norm, in a workspace
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workspace:
    """Scratch buffers of one packing, reused by every layer of every unmasking step.

    A step's activations never outlive it, so one set of arrays serves all layers of all
    steps: no allocator traffic and no freshly mapped pages to fault in on the hot path.
    """

    x: np.ndarray  # [N, D] residual stream
    h: np.ndarray  # [N, D] normalised input of a sub-block
    d: np.ndarray  # [N, D] sub-block output before the residual add
    q: np.ndarray  # [N, H*E] query projection
    k: np.ndarray  # [N, K*E] keys (normalised and rotated in place)
    v: np.ndarray  # [N, K*E] values
    qg: np.ndarray  # [K, N, G*E] queries grouped by kv head: per row one [L*G, E] matrix
    attn: np.ndarray  # [N, H*E] attention output, heads in the checkpoint's order
    scores: np.ndarray  # [K * G * max L*Lk] flat: one row's [K, L*G, Lk] scores (Lk keys)
    heads_out: np.ndarray  # [K * max L * G * E] flat: one row's [K, L*G, E] outputs
    inv_sums: np.ndarray  # [K * max L * G]: 1 / softmax row sums of one row
    gate: np.ndarray  # [N, F]
    up: np.ndarray  # [N, F]
    # recorded device work over these buffers (backend.replay: CUDA graphs on CuPy)
    replays: dict = field(default_factory=dict, compare=False, repr=False)


def make_workspace(cfg: OmniVoiceConfig, pack: Packing, within: Workspace | None = None) -> Workspace:
    """The buffers of `pack`: new, or views of the start of `within`'s (a workspace at least as
    large in every buffer), so that the fast profile's smaller layouts of one set of rows share
    the memory of their largest."""
    q = cfg.llm_config
    N, D, F, E = pack.num_tokens, q.hidden_size, q.intermediate_size, q.head_dim
    H, K = q.num_attention_heads, q.num_key_value_heads
    G, Lmax = H // K, max(pack.lengths)
    square = max(L * pack.keys(r) for r, L in enumerate(pack.lengths))  # queries x keys of a row

    def buf(name, *shape):
        if within is None:
            return xp.empty(shape, dtype=xp.float32)
        flat = getattr(within, name).reshape(-1)
        if flat.size < np.prod(shape):
            raise ValueError(f"workspace buffer {name} too small for this packing")
        return flat[:int(np.prod(shape))].reshape(shape)

    return Workspace(x=buf("x", N, D), h=buf("h", N, D), d=buf("d", N, D), q=buf("q", N, H * E),
                     k=buf("k", N, K * E), v=buf("v", N, K * E), qg=buf("qg", K, N, G * E),
                     attn=buf("attn", N, H * E), scores=buf("scores", K * G * square),
                     heads_out=buf("heads_out", K * Lmax * G * E),
                     inv_sums=buf("inv_sums", K * Lmax * G),
                     gate=buf("gate", N, F), up=buf("up", N, F))


def _layer_fused(lp: LayerParams, cfg: OmniVoiceConfig, pack: Packing, work: Workspace,
                 next_norm=None, precision: str = "fp32", layer: int = 0):
    """`decoder_layer` on work.x, in place, in the workspace's buffers.

    On entry work.h holds rms_norm(x) with this layer's input norm. Each residual add is fused
    with the norm that follows it: the post-attention norm, then `next_norm` (the next layer's
    input norm) if given, so work.h is ready for the next layer. The same operations in the
    same order as decoder_layer's: equal bit for bit.
    """
    eps = cfg.llm_config.rms_norm_eps
    attn = attention(lp, cfg, work.h, pack, work, precision, layer)  # [N, D] -> [N, H*E]
    linear(attn, lp.o_proj, work.d, precision)  # [N, H*E] -> [N, D]
    kernels.add_rms_norm(work.x, work.d, lp.post_attention_layernorm, eps, work.h)
    linears(work.h, (lp.gate_proj, lp.up_proj), (work.gate, work.up),
            precision)  # [N, D] -> [N, F] each
    mlp = kernels.swiglu(work.gate, work.up)  # silu(gate) * up, in place
    linear(mlp, lp.down_proj, work.d, precision)  # [N, F] -> [N, D]
    if next_norm is None:
        xp.add(work.x, work.d, out=work.x)
    else:
        kernels.add_rms_norm(work.x, work.d, next_norm, eps, work.h)


def _attend_rows(pack: Packing, work: Workspace, K: int, G: int, E: int, scale: float,
                 precision: str = "fp32", layer: int = 0):
    """Attention of the rotated queries work.qg over keys work.k and values work.v, row by row
    -> work.attn [N, H*E]; a row that reads its prompt cache attends to the cache's keys and
    values of `layer` first. (On a device: `_attend_padded`, the rows as one padded batch.)"""
    for r, (start, L) in enumerate(zip(pack.starts, pack.lengths)):
        rows, lg = slice(start, start + L), L * G
        keys, values = work.k[rows], work.v[rows]  # [L, K*E]
        if pack.offsets and pack.reads(r):  # the prompt's kept keys and values, then the row's own
            c = pack.cache(r)
            keys = xp.concatenate((c.k[layer], keys))  # [P + L, K*E]
            values = xp.concatenate((c.v[layer], values))
        Lk = keys.shape[0]
        # Query head h = kv * G + g reads key/value head kv (the reference's repeat_kv order):
        # per kv head, its G heads' queries of every position form one [L*G, E] matrix, and K/V
        # are read in place. One batched call runs the K GEMMs of each kind.
        q3 = work.qg[:, rows].reshape(K, lg, E)  # [K, L, G*E] -> [K, L*G, E] (view)
        k3 = keys.reshape(Lk, K, E).transpose(1, 2, 0)  # [Lk, K*E] -> [K, E, Lk] (view)
        v3 = values.reshape(Lk, K, E).transpose(1, 0, 2)  # [Lk, K*E] -> [K, Lk, E] (view)
        s = work.scores[:K * lg * Lk].reshape(K, lg, Lk)
        bmm(q3, k3, s, precision)  # [K, L*G, E] @ [K, E, Lk] -> [K, L*G, Lk]
        # No causal mask: every frame attends to the whole row, future included. The
        # weights stay unnormalised; the [L*G, E] output rows are scaled instead.
        inv = work.inv_sums[:K * lg]
        kernels.softmax_rows(s.reshape(K * lg, Lk), scale, inv)
        o = work.heads_out[:K * lg * E].reshape(K, lg, E)
        bmm(s, v3, o, precision)  # [K, L*G, Lk] @ [K, Lk, E] -> [K, L*G, E]
        kernels.scale_heads_into(o, inv, work.attn[rows])  # -> [L, H*E], heads in order
    return work.attn


def _attend_padded(pack: Packing, work: Workspace, K: int, G: int, E: int, scale: float,
                   precision: str = "fp32", layer: int = 0):
    """`_attend_rows`' loop over rows as one padded batch (the device path: a loop over rows would
    launch a dozen small kernels per row and layer). Keys past a row's end get -inf scores,
    so every real query sees exactly its own row (and its read prompt cache), as in the loop;
    the results differ from the loop's only by the rounding of GEMMs of another shape."""
    gather, key_gather, key_bias, scatter = pack.padded_rows()
    R, Lmax = gather.shape
    Lk = key_gather.shape[1]
    read = [pack.cache(r) for r in range(R) if pack.reads(r)]
    keys = xp.concatenate([work.k] + [c.k[layer] for c in read]) if read else work.k  # [N + ..., K*E]
    values = xp.concatenate([work.v] + [c.v[layer] for c in read]) if read else work.v
    q = work.qg[:, gather].reshape(K, R, Lmax * G, E)  # [K, N, G*E] -> [K, R, Lmax*G, E]
    kv = (keys[key_gather].reshape(R, Lk, K, E), values[key_gather].reshape(R, Lk, K, E))
    k4 = kv[0].transpose(2, 0, 3, 1)  # [R, Lk, K, E] -> [K, R, E, Lk]
    v4 = kv[1].transpose(2, 0, 1, 3)  # [R, Lk, K, E] -> [K, R, Lk, E]
    s = bmm(q, k4, precision=precision)  # -> [K, R, Lmax*G, Lk]
    s += key_bias  # [R, 1, Lk] broadcast: padded keys get no weight
    inv = xp.empty(K * R * Lmax * G, dtype=xp.float32)
    # matmul may lay s out in its inputs' order (with G = 1, q is a gather's strided result), and
    # then reshape copies: keep the 2-D array the softmax ran on in place, not the original s
    rows = s.reshape(-1, Lk)
    kernels.softmax_rows(rows, scale, inv)  # unnormalised, inv = 1 / row sums
    s = rows.reshape(s.shape)
    o = bmm(s, v4, precision=precision) * inv.reshape(K, R, Lmax * G, 1)  # -> [K, R, Lmax*G, E]
    o = o.reshape(K, R, Lmax, G, E).transpose(1, 2, 0, 3, 4).reshape(R * Lmax, K * G * E)  # -> [R*Lmax, H*E]
    work.attn[...] = o[scatter]  # back to the packed order, heads h = kv*G + g
    return work.attn


# The attention of `attention`: the loop over rows on numpy, one padded batch on a device.
_attend = jit.Kernel(_attend_rows, twin=_attend_padded)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_params(reader, cfg: OmniVoiceConfig, precision: str = "fp32") -> BackboneParams:
    """Take every backbone tensor from `reader` (a weights.ParamReader), checked against `cfg`.

    Nothing is transposed: every tensor keeps the checkpoint's layout, read once into process
    memory (never memory-mapped: a mapped file truncated under a running model is a SIGBUS).
    The 151676-row text table is the exception: a prompt uses a few hundred of its rows, so it
    stays on disk (reader.take_rows) and `embed` reads just those rows.
    `precision` (backend.PRECISIONS): the GEMMs' matrices are rounded to it here, once. Under
    "int8" the seven projections of every layer are quantised here instead (Int8Weight), one
    tensor at a time, and each float32 matrix is dropped as soon as it is quantised, so the
    process never holds the float32 layers (peak memory: benchmarks/README.md). The audio heads
    stay float32 under int8 (docs/correctness.md says why).
    """
    backend.check_precision(precision)
    q = cfg.llm_config
    D, F, E = q.hidden_size, q.intermediate_size, q.head_dim
    H, K = q.num_attention_heads, q.num_key_value_heads
    CV = cfg.num_audio_codebook * cfg.audio_vocab_size

    def vec(key, n):
        return to_device(reader.take(key, (n,), np.float32))

    def matrix(key, n_out, n_in):  # kept [out, in]; used as x @ W.T, rounded once, here
        w = to_device(reader.take(key, (n_out, n_in), np.float32))
        if precision == backend.INT8:  # [out, in] float32 -> int8 codes and scales; w dropped
            return quantize_weight(w)
        if backend.half_gemm(precision):  # a device's half-precision GEMMs: stored as such
            return backend.to_half(w, precision)
        return w if precision == "fp32" else backend.round_gemm_input(w.copy(), precision)

    layers = []
    for i in range(q.num_hidden_layers):
        p = f"llm.layers.{i}."
        layers.append(LayerParams(
            input_layernorm=vec(p + "input_layernorm.weight", D),
            q_proj=matrix(p + "self_attn.q_proj.weight", H * E, D),
            k_proj=matrix(p + "self_attn.k_proj.weight", K * E, D),
            v_proj=matrix(p + "self_attn.v_proj.weight", K * E, D),
            o_proj=matrix(p + "self_attn.o_proj.weight", D, H * E),
            q_norm=vec(p + "self_attn.q_norm.weight", E),
            k_norm=vec(p + "self_attn.k_norm.weight", E),
            post_attention_layernorm=vec(p + "post_attention_layernorm.weight", D),
            gate_proj=matrix(p + "mlp.gate_proj.weight", F, D),
            up_proj=matrix(p + "mlp.up_proj.weight", F, D),
            down_proj=matrix(p + "mlp.down_proj.weight", D, F),
        ))

    # The offsets are a buffer the reference saves with the weights; the model below relies on
    # codebook c living at rows c*V.., so a checkpoint that says otherwise is refused.
    offsets = reader.take("codebook_layer_offsets", (cfg.num_audio_codebook,))
    expected = np.arange(cfg.num_audio_codebook) * cfg.audio_vocab_size
    if not np.array_equal(np.asarray(offsets), expected):
        raise WeightsError(f"{reader.file}: codebook_layer_offsets is {np.asarray(offsets).tolist()}, "
                           f"expected {expected.tolist()} for audio_vocab_size {cfg.audio_vocab_size}")

    return BackboneParams(
        embed_tokens=reader.take_rows("llm.embed_tokens.weight", (q.vocab_size, D)),
        audio_embeddings=to_device(reader.take("audio_embeddings.weight", (CV, D), np.float32)),
        layers=tuple(layers),
        norm=vec("llm.norm.weight", D),
        audio_heads=to_device(reader.take("audio_heads.weight", (CV, D), np.float32))
        if precision == backend.INT8 else matrix("audio_heads.weight", CV, D),
        precision=precision,
    )
