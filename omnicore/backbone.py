"""OmniVoice's backbone: fused text/audio embeddings -> bidirectional Qwen3 -> audio heads.

Several rows of different lengths (the conditional and unconditional rows of every item in a
batch) run together *without padding*: their tokens are packed into one [N, D] matrix, so
every projection and MLP is one large GEMM over all rows, while attention runs row by row
(a block-diagonal attention pattern). Each row sees only itself and its positions start at 0,
which is exactly what the reference computes with its padded batch and boolean masks.

Why there is no KV cache: attention is bidirectional, so every position's keys and values
depend on every other position of its row, and each unmasking step changes the ids of the
masked targets. Nothing computed in one step stays valid in the next.

Dimension legend:
    C  audio codebooks (8)       V  audio vocabulary per codebook (1025, MASK = 1024 included)
    N  tokens of all packed rows L  length of one row
    D  hidden size               F  MLP width
    H  query heads               K  key/value heads (H = K * G, G query heads share a K/V head)
    E  head dim                  n  positions whose logits are wanted
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .backend import to_device, xp
from .config import OmniVoiceConfig
from .errors import WeightsError

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerParams:
    """One decoder layer; field names are the checkpoint's key leaves.

    Projection matrices are stored transposed to [in, out] so that the model computes x @ W.
    """

    input_layernorm: np.ndarray  # [D]
    q_proj: np.ndarray  # [D, H*E]
    k_proj: np.ndarray  # [D, K*E]
    v_proj: np.ndarray  # [D, K*E]
    o_proj: np.ndarray  # [H*E, D]
    q_norm: np.ndarray  # [E]
    k_norm: np.ndarray  # [E]
    post_attention_layernorm: np.ndarray  # [D]
    gate_proj: np.ndarray  # [D, F]
    up_proj: np.ndarray  # [D, F]
    down_proj: np.ndarray  # [F, D]


@dataclass(frozen=True)
class BackboneParams:
    embed_tokens: np.ndarray  # [text vocab, D]
    audio_embeddings: np.ndarray  # [C*V, D]: codebook c's table is rows c*V .. c*V+V-1
    layers: tuple[LayerParams, ...]
    norm: np.ndarray  # [D]
    audio_heads: np.ndarray  # [D, C*V] (transposed from the checkpoint's [C*V, D])


def load_params(reader, cfg: OmniVoiceConfig) -> BackboneParams:
    """Take every backbone tensor from `reader` (a weights.ParamReader), checked against `cfg`.

    This is the one place where the checkpoint layout changes: linear weights are transposed
    once to [in, out]. Embedding tables stay as stored (row gathers need no copy, so the
    151676-row text table is only paged in where a prompt touches it).
    """
    q = cfg.llm_config
    D, F, E = q.hidden_size, q.intermediate_size, q.head_dim
    H, K = q.num_attention_heads, q.num_key_value_heads
    CV = cfg.num_audio_codebook * cfg.audio_vocab_size

    def vec(key, n):
        return to_device(reader.take(key, (n,), np.float32))

    def linear(key, n_out, n_in):  # [out, in] on disk -> [in, out]
        w = reader.take(key, (n_out, n_in), np.float32)
        return to_device(np.ascontiguousarray(w.T))

    layers = []
    for i in range(q.num_hidden_layers):
        p = f"llm.layers.{i}."
        layers.append(LayerParams(
            input_layernorm=vec(p + "input_layernorm.weight", D),
            q_proj=linear(p + "self_attn.q_proj.weight", H * E, D),
            k_proj=linear(p + "self_attn.k_proj.weight", K * E, D),
            v_proj=linear(p + "self_attn.v_proj.weight", K * E, D),
            o_proj=linear(p + "self_attn.o_proj.weight", D, H * E),
            q_norm=vec(p + "self_attn.q_norm.weight", E),
            k_norm=vec(p + "self_attn.k_norm.weight", E),
            post_attention_layernorm=vec(p + "post_attention_layernorm.weight", D),
            gate_proj=linear(p + "mlp.gate_proj.weight", F, D),
            up_proj=linear(p + "mlp.up_proj.weight", F, D),
            down_proj=linear(p + "mlp.down_proj.weight", D, F),
        ))

    # The offsets are a buffer the reference saves with the weights; the model below relies on
    # codebook c living at rows c*V.., so a checkpoint that says otherwise is refused.
    offsets = reader.take("codebook_layer_offsets", (cfg.num_audio_codebook,))
    expected = np.arange(cfg.num_audio_codebook) * cfg.audio_vocab_size
    if not np.array_equal(np.asarray(offsets), expected):
        raise WeightsError(f"{reader.file}: codebook_layer_offsets is {np.asarray(offsets).tolist()}, "
                           f"expected {expected.tolist()} for audio_vocab_size {cfg.audio_vocab_size}")

    return BackboneParams(
        embed_tokens=to_device(reader.take("llm.embed_tokens.weight", (q.vocab_size, D), np.float32)),
        audio_embeddings=to_device(reader.take("audio_embeddings.weight", (CV, D), np.float32)),
        layers=tuple(layers),
        norm=vec("llm.norm.weight", D),
        audio_heads=linear("audio_heads.weight", CV, D),
    )


# ---------------------------------------------------------------------------------------------
# Packing rows of different lengths
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Packing:
    """Where each row lives in the packed token axis, and the rotary tables for it."""

    lengths: tuple[int, ...]  # L of every row
    starts: tuple[int, ...]  # offset of every row in [0, N)
    cos: np.ndarray  # [N, E]
    sin: np.ndarray  # [N, E]


def rope_inv_freq(cfg: OmniVoiceConfig) -> np.ndarray:
    """Rotary frequencies theta^(-2i/E), rounded the way the float32 reference rounds them."""
    q = cfg.llm_config
    exponent = np.arange(0, q.head_dim, 2, dtype=np.float32) / np.float32(q.head_dim)  # [E/2]
    # The power in float64 rounds to the nearest float32; torch's float32 pow lands on the
    # same value for nearly every entry (the rest differ by one ulp, far below tolerance).
    power = (np.float64(q.rope_theta) ** exponent.astype(np.float64)).astype(np.float32)
    return np.float32(1.0) / power


def make_packing(lengths: Sequence[int], cfg: OmniVoiceConfig) -> Packing:
    """Pack rows of the given lengths; positions restart at 0 in every row."""
    lengths = tuple(int(n) for n in lengths)
    starts = tuple(int(s) for s in np.cumsum((0,) + lengths[:-1]))
    positions = np.concatenate([np.arange(n, dtype=np.float32) for n in lengths])  # [N]
    angles = positions[:, None] * rope_inv_freq(cfg)[None, :]  # [N] x [E/2] -> [N, E/2]
    # Half-split RoPE: the two halves of a head share the same angles (not interleaved pairs).
    angles = np.concatenate([angles, angles], axis=1)  # [N, E/2] -> [N, E]
    return Packing(lengths, starts, to_device(np.cos(angles)), to_device(np.sin(angles)))


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def embed(params: BackboneParams, cfg: OmniVoiceConfig, ids, audio_mask):
    """Input vectors of packed rows: ids [C, N] int64, audio_mask [N] bool -> [N, D].

    Text positions look up codebook row 0's id in the text table. Audio positions add up one
    vector per codebook, id + c*V in the joint audio table, MASK (V-1) included: a masked
    frame is "MASK in every codebook", not zero.
    """
    C, V = cfg.num_audio_codebook, cfg.audio_vocab_size
    ids = xp.asarray(ids)
    audio_mask = xp.asarray(audio_mask)
    x = xp.empty((ids.shape[1], params.embed_tokens.shape[1]), dtype=xp.float32)  # [N, D]
    text_pos = xp.nonzero(~audio_mask)[0]
    audio_pos = xp.nonzero(audio_mask)[0]
    x[text_pos] = params.embed_tokens[ids[0, text_pos]]  # [n_text, D]
    shifted = ids[:, audio_pos] + (xp.arange(C) * V)[:, None]  # [C, n_audio]
    x[audio_pos] = params.audio_embeddings[shifted].sum(axis=0)  # [C, n_audio, D] -> [n_audio, D]
    return x


def rms_norm(x, weight, eps: float):
    """RMSNorm over the last axis, in float32 whatever the storage type (as the reference)."""
    x = x.astype(xp.float32, copy=False)
    scale = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + xp.float32(eps))
    return (x * scale.astype(xp.float32)) * weight


def rotate(x, cos, sin):
    """Half-split rotary embedding: x [.., E] rotated by (cos, sin) [.., E]."""
    half = x.shape[-1] // 2
    rotated = xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def softmax_lastdim(s):
    s = s - s.max(axis=-1, keepdims=True)
    e = xp.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def silu(x):
    # x * sigmoid(x) written with tanh: same value, and no exp overflow for very negative x
    return x * (xp.float32(0.5) + xp.float32(0.5) * xp.tanh(xp.float32(0.5) * x))


def attention(lp: LayerParams, cfg: OmniVoiceConfig, x, pack: Packing):
    """Bidirectional grouped-query self-attention within each packed row: [N, D] -> [N, D]."""
    q_cfg = cfg.llm_config
    N, E = x.shape[0], q_cfg.head_dim
    H, K = q_cfg.num_attention_heads, q_cfg.num_key_value_heads
    G = H // K
    q = (x @ lp.q_proj).reshape(N, H, E)  # [N, D] -> [N, H, E]
    k = (x @ lp.k_proj).reshape(N, K, E)  # [N, D] -> [N, K, E]
    v = (x @ lp.v_proj).reshape(N, K, E)  # [N, D] -> [N, K, E]
    # Qwen3 normalises every query/key head before the rotation (keeps logits bounded).
    cos, sin = pack.cos[:, None, :], pack.sin[:, None, :]  # [N, 1, E]
    q = rotate(rms_norm(q, lp.q_norm, q_cfg.rms_norm_eps), cos, sin)
    k = rotate(rms_norm(k, lp.k_norm, q_cfg.rms_norm_eps), cos, sin)
    scale = xp.float32(E ** -0.5)

    out = xp.empty((N, H, E), dtype=xp.float32)
    for start, L in zip(pack.starts, pack.lengths):
        rows = slice(start, start + L)
        # Query head h = kv * G + g reads key/value head kv (the reference's repeat_kv order).
        qs = q[rows].reshape(L, K, G, E).transpose(1, 2, 0, 3)  # [L, H, E] -> [K, G, L, E]
        ks = k[rows].transpose(1, 2, 0)[:, None]  # [L, K, E] -> [K, 1, E, L]
        vs = v[rows].transpose(1, 0, 2)[:, None]  # [L, K, E] -> [K, 1, L, E]
        # No causal mask: every frame attends to the whole row, future included.
        probs = softmax_lastdim((qs @ ks) * scale)  # [K, G, L, L]
        o = probs @ vs  # [K, G, L, L] @ [K, 1, L, E] -> [K, G, L, E]
        out[rows] = o.transpose(2, 0, 1, 3).reshape(L, H, E)  # -> [L, H, E]
    return out.reshape(N, H * E) @ lp.o_proj  # [N, H*E] -> [N, D]


def decoder_layer(lp: LayerParams, cfg: OmniVoiceConfig, x, pack: Packing):
    """Pre-norm transformer layer: x + attn(norm(x)), then + SwiGLU MLP(norm(.)). [N, D]."""
    eps = cfg.llm_config.rms_norm_eps
    x = x + attention(lp, cfg, rms_norm(x, lp.input_layernorm, eps), pack)
    h = rms_norm(x, lp.post_attention_layernorm, eps)
    gated = silu(h @ lp.gate_proj) * (h @ lp.up_proj)  # [N, D] -> [N, F]
    return x + gated @ lp.down_proj  # [N, F] -> [N, D]


def hidden_states(params: BackboneParams, cfg: OmniVoiceConfig, x, pack: Packing):
    """All decoder layers over packed embeddings: [N, D] -> [N, D] (before the final norm)."""
    for lp in params.layers:
        x = decoder_layer(lp, cfg, x, pack)
    return x


def audio_logits(params: BackboneParams, cfg: OmniVoiceConfig, h):
    """Final norm and audio heads on selected positions: h [n, D] -> logits [C, n, V]."""
    C, V = cfg.num_audio_codebook, cfg.audio_vocab_size
    h = rms_norm(h, params.norm, cfg.llm_config.rms_norm_eps)
    logits = (h @ params.audio_heads).reshape(h.shape[0], C, V)  # [n, D] -> [n, C*V] -> [n, C, V]
    return logits.transpose(1, 0, 2)  # [n, C, V] -> [C, n, V]


def forward_rows(params: BackboneParams, cfg: OmniVoiceConfig, ids, audio_mask, pack: Packing,
                 num_out: Sequence[int]) -> list:
    """Logits of the last `num_out[r]` positions of every packed row r.

    ids [C, N], audio_mask [N] hold the rows back to back as described by `pack`. Returns one
    [C, num_out[r], V] float32 array per row. The final norm and the audio heads run on those
    positions only: a 1024 x 8200 head on every prompt token would be pure waste.
    """
    h = hidden_states(params, cfg, embed(params, cfg, ids, audio_mask), pack)  # [N, D]
    wanted = xp.asarray(np.concatenate(
        [np.arange(s + L - n, s + L) for s, L, n in zip(pack.starts, pack.lengths, num_out)]))
    logits = audio_logits(params, cfg, h[wanted])  # [C, sum(num_out), V]
    bounds = np.cumsum(num_out)[:-1].tolist()
    return xp.split(logits, bounds, axis=1)
