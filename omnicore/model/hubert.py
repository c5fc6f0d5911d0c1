"""HuBERT (base layout) in numpy: the semantic branch of the Higgs Audio V2 codec encoder.

The product's form of `spec.hubert_states` (model/spec.py); tests/test_spec.py holds the
encoder's latent within 1e-5 of the spec's, and its codes equal.

16 kHz waveform -> conv feature encoder -> feature projection -> positional conv -> post-LN
transformer; returns every hidden state (the embedding output and one per layer), because the
codec averages all of them.

Dimension legend:
    L   waveform samples (16 kHz)          F   feature frames (50 Hz: 320 samples per frame)
    Cf  conv feature channels (512)        D   hidden size (768)
    H   attention heads, Dh = D / H        I   feed-forward width (3072)
    K   conv taps                          G   positional-conv groups, Cg = D / G
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import f32, to_device, xp
from .config import HubertConfig
from ..errors import WeightsError
from .conv_kernels import (conv1d, conv_out_len, conv_weight, gelu, group_norm, grouped_conv1d,
                           grouped_conv_weight)
from .kernels import all_finite, softmax_rows


@dataclass(frozen=True)
class HubertLayerParams:
    qkv_w: object  # [D, 3D]: q, k, v projections side by side, one GEMM
    qkv_b: object  # [3D]
    out_w: object  # [D, D]
    out_b: object
    ln1_w: object  # after attention (`layer_norm`)
    ln1_b: object
    ff1_w: object  # [D, I]
    ff1_b: object
    ff2_w: object  # [I, D]
    ff2_b: object
    ln2_w: object  # after the feed-forward (`final_layer_norm`)
    ln2_b: object


@dataclass(frozen=True)
class HubertParams:
    conv_w: tuple  # per feature-encoder layer [K, Cin, Cout]
    conv_b: tuple  # per layer [Cout] or None (conv_bias false in HuBERT-base)
    gn_w: object  # GroupNorm of the first conv layer [Cf]
    gn_b: object
    proj_ln_w: object  # feature projection LayerNorm [Cf] (None when feat_proj_layer_norm is false)
    proj_ln_b: object
    proj_w: object  # [Cf, D]
    proj_b: object
    pos_w: object  # positional conv with the weight norm folded in, [K, G, Cg, Cg]
    pos_b: object
    ln_w: object  # encoder LayerNorm after adding the positional embedding
    ln_b: object
    layers: tuple  # HubertLayerParams per transformer layer


def fold_weight_norm(g: np.ndarray, v: np.ndarray, dim: int) -> np.ndarray:
    """torch weight_norm: w = g * v / ||v||, the norm taken over every axis except `dim`.
    The weight norm of the positional conv in `spec.hubert_states`."""
    axes = tuple(a for a in range(v.ndim) if a != dim)
    norm = np.sqrt(np.sum(v.astype(np.float64) ** 2, axis=axes, keepdims=True))
    return (v * (g / norm)).astype(np.float32)


def load_params(reader, cfg: HubertConfig, prefix: str = "semantic_model.") -> HubertParams:
    """Take the HuBERT tensors under `prefix` from `reader` (a ParamReader) in our layouts."""
    d, inter = cfg.hidden_size, cfg.intermediate_size
    dev = lambda a: to_device(f32(a))  # noqa: E731
    conv_w, conv_b = [], []
    cin = 1
    for i, (cout, k) in enumerate(zip(cfg.conv_dim, cfg.conv_kernel)):
        p = f"{prefix}feature_extractor.conv_layers.{i}.conv."
        conv_w.append(to_device(conv_weight(reader.take(p + "weight", (cout, cin, k)))))
        conv_b.append(dev(reader.take(p + "bias", (cout,))) if cfg.conv_bias else None)
        cin = cout
    c0 = cfg.conv_dim[0]
    p = f"{prefix}feature_extractor.conv_layers.0.layer_norm."
    gn_w, gn_b = dev(reader.take(p + "weight", (c0,))), dev(reader.take(p + "bias", (c0,)))

    cf = cfg.conv_dim[-1]
    p = f"{prefix}feature_projection."
    if cfg.feat_proj_layer_norm:
        proj_ln_w = dev(reader.take(p + "layer_norm.weight", (cf,)))
        proj_ln_b = dev(reader.take(p + "layer_norm.bias", (cf,)))
    else:
        proj_ln_w = proj_ln_b = None
    proj_w = dev(reader.take(p + "projection.weight", (d, cf)).T)  # [D, Cf] -> [Cf, D]
    proj_b = dev(reader.take(p + "projection.bias", (d,)))

    k, groups = cfg.num_conv_pos_embeddings, cfg.num_conv_pos_embedding_groups
    p = f"{prefix}encoder.pos_conv_embed.conv."
    # Weight norm with dim=2: one gain per tap, the norm over (out, in) channels of that tap.
    g = reader.take(p + "parametrizations.weight.original0", (1, 1, k))
    v = reader.take(p + "parametrizations.weight.original1", (d, d // groups, k))
    if not np.all(np.any(v != 0, axis=(0, 1))):  # an all-zero tap has norm 0: 0/0 in all its weights
        raise WeightsError(f"{reader.file}: {p}parametrizations.weight.original1 has a tap whose "
                           "weights are all zero, so weight norm divides by zero: the checkpoint is corrupt")
    folded = fold_weight_norm(g, v, dim=2)
    if not all_finite(folded):  # finite g and v can still overflow float32 once scaled
        raise WeightsError(f"{reader.file}: {p}parametrizations.weight.* fold to non-finite weights "
                           "(g / ||v|| overflows float32): the checkpoint is corrupt")
    pos_w = to_device(grouped_conv_weight(folded, groups))
    pos_b = dev(reader.take(p + "bias", (d,)))
    ln_w = dev(reader.take(f"{prefix}encoder.layer_norm.weight", (d,)))
    ln_b = dev(reader.take(f"{prefix}encoder.layer_norm.bias", (d,)))

    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"{prefix}encoder.layers.{i}."
        a = p + "attention."
        qkv_w = np.concatenate([reader.take(f"{a}{n}_proj.weight", (d, d)).T for n in "qkv"], axis=1)  # -> [D, 3D]
        qkv_b = np.concatenate([reader.take(f"{a}{n}_proj.bias", (d,)) for n in "qkv"])
        layers.append(HubertLayerParams(
            qkv_w=dev(qkv_w), qkv_b=dev(qkv_b),
            out_w=dev(reader.take(a + "out_proj.weight", (d, d)).T), out_b=dev(reader.take(a + "out_proj.bias", (d,))),
            ln1_w=dev(reader.take(p + "layer_norm.weight", (d,))), ln1_b=dev(reader.take(p + "layer_norm.bias", (d,))),
            ff1_w=dev(reader.take(p + "feed_forward.intermediate_dense.weight", (inter, d)).T),
            ff1_b=dev(reader.take(p + "feed_forward.intermediate_dense.bias", (inter,))),
            ff2_w=dev(reader.take(p + "feed_forward.output_dense.weight", (d, inter)).T),
            ff2_b=dev(reader.take(p + "feed_forward.output_dense.bias", (d,))),
            ln2_w=dev(reader.take(p + "final_layer_norm.weight", (d,))),
            ln2_b=dev(reader.take(p + "final_layer_norm.bias", (d,))),
        ))
    return HubertParams(conv_w=tuple(conv_w), conv_b=tuple(conv_b), gn_w=gn_w, gn_b=gn_b,
                        proj_ln_w=proj_ln_w, proj_ln_b=proj_ln_b, proj_w=proj_w, proj_b=proj_b,
                        pos_w=pos_w, pos_b=pos_b, ln_w=ln_w, ln_b=ln_b, layers=tuple(layers))


def num_frames(num_samples: int, cfg: HubertConfig) -> int:
    """Feature frames the conv encoder makes from `num_samples` (<= 0: input too short)."""
    n = num_samples
    for k, s in zip(cfg.conv_kernel, cfg.conv_stride):
        n = conv_out_len(n, k, s) if n > 0 else 0
    return n


def layer_norm(x, w, b, eps: float):
    """LayerNorm over the last axis, float32 throughout like torch's CPU kernel.
    The fast form of `spec.layer_norm`."""
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / xp.sqrt(var + xp.float32(eps)) * w + b


_QUERY_BLOCK = 1024  # 20 s of audio per block


def _attention(lp: HubertLayerParams, x, num_heads: int):
    """Bidirectional multi-head self-attention, no mask (a single unpadded clip)."""
    f, d = x.shape
    dh = d // num_heads
    qkv = x @ lp.qkv_w + lp.qkv_b  # [F, D] -> [F, 3D]
    qkv = qkv.reshape(f, 3, num_heads, dh).transpose(1, 2, 0, 3)  # -> [3, H, F, Dh]
    q, k, v = qkv[0], qkv[1], qkv[2]
    kt = k.transpose(0, 2, 1)  # [H, Dh, F]
    out = xp.empty((f, num_heads, dh), dtype=xp.float32)
    # Queries in blocks bound the [H, block, F] score matrix for long clips (each query row's
    # softmax is independent, so blocking changes nothing numerically).
    for s in range(0, f, _QUERY_BLOCK):
        scores = q[:, s:s + _QUERY_BLOCK] @ kt  # [H, Fq, Dh] @ [H, Dh, F] -> [H, Fq, F]
        # scaled softmax in place; the kernel flushes would-be subnormal weights to 0, which
        # otherwise slow the next GEMM down several times
        softmax_rows(scores.reshape(-1, f), dh ** -0.5)
        out[s:s + _QUERY_BLOCK] = (scores @ v).transpose(1, 0, 2)  # [H, Fq, Dh] -> [Fq, H, Dh]
    return out.reshape(f, d) @ lp.out_w + lp.out_b  # [F, D] -> [F, D]


def hidden_states(params: HubertParams, wav16, cfg: HubertConfig) -> list:
    """All hidden states of HuBERT for one 16 kHz clip wav16 [L]: a list of num_hidden_layers + 1
    arrays [F, D] (the positional-embedded, normalised input, then each layer's output).
    The fast form of `spec.hubert_states`."""
    eps = cfg.layer_norm_eps
    x = to_device(wav16, dtype=np.float32).reshape(1, -1, 1)  # [L] -> [1, L, 1]
    for i, (w, b, s) in enumerate(zip(params.conv_w, params.conv_b, cfg.conv_stride)):
        x = conv1d(x, w, b, stride=s)  # [1, L_i, Cin] -> [1, L_i+1, Cout]
        if i == 0:
            # one group per channel: each channel is normalised over the whole clip
            x = group_norm(x, x.shape[-1], params.gn_w, params.gn_b, 1e-5)
        x = gelu(x)
    x = x[0]  # [1, F, Cf] -> [F, Cf]
    if params.proj_ln_w is not None:
        x = layer_norm(x, params.proj_ln_w, params.proj_ln_b, eps)
    x = x @ params.proj_w + params.proj_b  # [F, Cf] -> [F, D]

    k = cfg.num_conv_pos_embeddings
    pos = grouped_conv1d(x[None], params.pos_w, params.pos_b, padding=k // 2)[0]  # [F, D] -> [F + 1 - K%2, D]
    pos = gelu(pos[:x.shape[0]])  # an even kernel gives one extra frame at the end: dropped
    x = layer_norm(x + pos, params.ln_w, params.ln_b, eps)
    states = [x]
    for lp in params.layers:
        # post-LN block: x = LN(x + attn(x)); x = LN(x + ffn(x))
        x = layer_norm(x + _attention(lp, x, cfg.num_attention_heads), lp.ln1_w, lp.ln1_b, eps)
        h = gelu(x @ lp.ff1_w + lp.ff1_b)  # [F, D] -> [F, I]
        x = layer_norm(x + (h @ lp.ff2_w + lp.ff2_b), lp.ln2_w, lp.ln2_b, eps)  # [F, I] -> [F, D]
        states.append(x)
    return states
