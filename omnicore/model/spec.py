"""OmniVoice in one file: text (and a voice's clip) -> 8 x T audio codes -> 24 kHz waveform.

The whole model as plain numpy, written to be read top to bottom, with nothing of omnicore's fast
machinery: no kernels, no packing, no engine, no backend switch. It reads the same checkpoint
as the product and runs end to end on it (slowly at full size). The product is held to it by
tests/test_spec.py, which states what each comparison holds. "The reference" below is the
official implementation (the `omnivoice` package, on PyTorch). Where a line below rounds the way
the reference's float32 code does, it does so to keep the greedy codes equal to the reference's.
Greedy: no random draws, each unmasking step fills its most confident cells with their most
probable ids; a cell is one codebook of one target frame (C x T of them, one id each).

    checkpoint   config.json, model.safetensors, tokenizer.json, audio_tokenizer/
    prompt       [denoise] <lang> <instruct> <text> ref codes  MASK x T  (one row, C ids each)
    embed        text positions: the text table; audio positions: the sum of C codebook tables
    backbone     28 bidirectional Qwen3 layers: RMSNorm, q/k norm, RoPE, GQA attention, SwiGLU
    heads        the last T positions -> C x V logits
    unmask       num_step steps: guided log-softmax, the most confident cells filled first
    decode       Higgs Audio V2: codebooks -> fc2 -> DAC decoder (Snake, transposed convs)
    encode       a voice's clip -> codes: HuBERT and a DAC encoder, fused, residual VQ

Not here (the product's, around the model): language names and instruct checking, the duration
estimate, cutting long text into chunks, a clip's silence trim and loudness before encoding,
and the output's post-processing.

Dimension legend:
    C  audio codebooks (8)    V  audio ids per codebook (1025: N codewords, then MASK = 1024)
    T  target frames
    L  positions of a row     R  reference frames (a cloned voice's codes)     D  hidden size
    F  MLP width              E  head dim      H  query heads      K  key/value heads (H / K
                              query heads share one)
    S  samples at a codec stage's rate (24 kHz at the waveform's end: 960 per frame)
    Q  the codec's codebooks (8: C)   N  codewords of a codebook (1024)   d  codeword width
    Dc codec latent (Ca + Ds)      Ca acoustic latent (256)   Ds HuBERT width (768)
    Fh HuBERT frames (50 a second)  P  a resampler's output phases
    ch a convolution's channels (in the codec's shape comments)
    downsample_factor  (codec config) 16 kHz samples a HuBERT frame (320: a code frame is 2)

Why there is no KV cache: attention is bidirectional, so every position's keys depend on every
other position of the row, and each step rewrites the masked targets. Nothing of one step is
valid in the next.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import numpy as np

f32 = np.float32


# ---------------------------------------------------------------------------------------------
# The checkpoint: tensors by their exact key, the configs as dicts
# ---------------------------------------------------------------------------------------------

def linear(W, p, x):
    """x @ W.T + b for the layer whose weight [out, in] and bias are stored under prefix p."""
    return x @ W[p + "weight"].T + W[p + "bias"]


def read_safetensors(path) -> dict:
    """Every tensor of a .safetensors file: an 8-byte header length, a JSON header, raw bytes."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), memoryview(raw)[8 + n:]
    out = {}
    for key, t in header.items():
        if key == "__metadata__":
            continue
        buf = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if t["dtype"] == "BF16":  # the top half of a float32
            x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(f32)
        else:
            x = np.frombuffer(buf, {"F32": f32, "F16": np.float16, "I64": np.int64}[t["dtype"]])
        out[key] = x.reshape(t["shape"]).astype(f32 if x.dtype.kind == "f" else x.dtype)
    return out


def load(model_dir):
    """(config, weights, tokenizer, codec config, codec weights) of a checkpoint folder."""
    from tokenizers import Tokenizer

    d = Path(model_dir)
    cfg = json.loads((d / "config.json").read_text("utf-8"))
    codec_cfg = json.loads((d / "audio_tokenizer" / "config.json").read_text("utf-8"))
    return (cfg, read_safetensors(d / "model.safetensors"),
            Tokenizer.from_str((d / "tokenizer.json").read_text("utf-8")),
            codec_cfg, read_safetensors(d / "audio_tokenizer" / "model.safetensors"))


# ---------------------------------------------------------------------------------------------
# The prompt: one row of C ids per position
# ---------------------------------------------------------------------------------------------

NONVERBAL = re.compile(r"\[(?:laughter|sigh|confirmation-en|question-en|question-ah|question-oh|"
                       r"question-ei|question-yi|surprise-ah|surprise-oh|surprise-wa|surprise-yo|"
                       r"dissatisfaction-hnn)\]")


def clean_text(text: str, ref_text: str | None) -> str:
    """The transcript the model reads: the reference's words, a space, the text; as in training:
    no line breaks, ASCII parentheses, single spaces, no space beside a CJK ideograph."""
    full = f"{ref_text.strip()} {text.strip()}" if ref_text else text.strip()
    full = re.sub(r"[\r\n]+", "", full).replace("\uff08", "(").replace("\uff09", ")")
    full = re.sub(r"[ \t]+", " ", full)
    return re.sub(r"(?<=[\u4e00-\u9fff])\s+|\s+(?=[\u4e00-\u9fff])", "", full)


def text_ids(tok, text: str) -> list:
    """Token ids with each non-verbal tag ("[laughter]") tokenized on its own, so that BPE never
    merges across its brackets."""
    pieces, start = [], 0
    for m in NONVERBAL.finditer(text):
        pieces += [text[start:m.start()], m.group()]
        start = m.end()
    pieces.append(text[start:])
    ids = [i for p in pieces if p for i in tok.encode(p, add_special_tokens=False).ids]
    return ids or tok.encode(text, add_special_tokens=True).ids  # ("": the tokenizer's own)


def prompt_row(cfg, tok, text, T, lang=None, instruct=None, ref_text=None, ref_codes=None,
               denoise=True):
    """The conditional row: ids [C, L] and audio_mask [L] (True from the audio part on)."""
    C, mask_id = cfg["num_audio_codebook"], cfg["audio_mask_id"]
    # <|denoise|>: asks for clean speech whatever the reference clip's noise (the reference adds
    # it whenever there is a clip)
    style = "<|denoise|>" if denoise and ref_codes is not None else ""
    style += f"<|lang_start|>{lang or 'None'}<|lang_end|>"  # a missing field is the word None
    style += f"<|instruct_start|>{instruct or 'None'}<|instruct_end|>"
    ids = tok.encode(style, add_special_tokens=True).ids
    ids += text_ids(tok, f"<|text_start|>{clean_text(text, ref_text)}<|text_end|>")
    parts = [np.tile(np.array(ids, np.int64), (C, 1))]  # [Lt] -> [C, Lt]: text on every codebook
    if ref_codes is not None:
        parts.append(np.asarray(ref_codes, np.int64))  # [C, R]
    parts.append(np.full((C, T), mask_id, np.int64))  # [C, T]: every target starts as MASK
    row = np.concatenate(parts, axis=1)  # [C, L]
    return row, np.arange(row.shape[1]) >= len(ids)


# ---------------------------------------------------------------------------------------------
# The backbone: embeddings -> bidirectional Qwen3 -> audio heads
# ---------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    # in float32 over the last axis, as the float32 reference computes it
    return (x * (f32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + f32(eps)))) * w


def rope(L, E, theta):
    """cos, sin [L, E] of positions 0..L-1. Half-split: a head's two halves share the angles."""
    inv = f32(1.0) / (np.float64(theta) ** (np.arange(0, E, 2, dtype=f32) / f32(E))
                      .astype(np.float64)).astype(f32)  # [E/2]; the power rounded to float32
    ang = np.arange(L, dtype=f32)[:, None] * inv[None, :]  # [L, E/2]
    ang = np.concatenate([ang, ang], axis=1)  # [L, E/2] -> [L, E]
    return np.cos(ang), np.sin(ang)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2  # x [L, heads, E]: (a, b) -> (a cos - b sin, b cos + a sin)
    turned = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # (a, b) -> (-b, a)
    return x * cos[:, None] + turned * sin[:, None]


def embed(cfg, W, ids, audio_mask):
    """ids [C, L] -> [L, D]: text positions read the text table with codebook 0's id; audio
    positions add one vector per codebook, id + c * V in the joint audio table (MASK included:
    a masked frame is "MASK in every codebook")."""
    C, V = cfg["num_audio_codebook"], cfg["audio_vocab_size"]
    x = W["llm.embed_tokens.weight"][ids[0]]  # [L, D]
    a = ids[:, audio_mask] + (np.arange(C) * V)[:, None]  # [C, La]: each codebook's own rows
    x[audio_mask] = W["audio_embeddings.weight"][a].sum(axis=0)  # [C, La, D] -> [La, D]
    return x


def layer(qwen, W, i, x, cos, sin):
    """One pre-norm Qwen3 decoder layer over one row, attention bidirectional: [L, D] -> [L, D]."""
    p, eps = f"llm.layers.{i}.", qwen["rms_norm_eps"]
    H, K, E = qwen["num_attention_heads"], qwen["num_key_value_heads"], qwen["head_dim"]
    L = x.shape[0]
    h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
    q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(L, H, E)  # [L, D] -> [L, H, E]
    k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(L, K, E)  # [L, D] -> [L, K, E]
    v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(L, K, E)
    # Qwen3 normalises each head's query and key before rotating them (bounded logits)
    q = rotate(rms_norm(q, W[p + "self_attn.q_norm.weight"], eps), cos, sin)
    k = rotate(rms_norm(k, W[p + "self_attn.k_norm.weight"], eps), cos, sin)
    k, v = np.repeat(k, H // K, axis=1), np.repeat(v, H // K, axis=1)  # [L, K, E] -> [L, H, E]
    s = np.einsum("lhe,mhe->hlm", q, k) * f32(E ** -0.5)  # [H, L, L]; no causal mask
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)  # softmax over the keys
    o = np.einsum("hlm,mhe->lhe", s, v).reshape(L, H * E)  # [H, L, L] x [L, H, E] -> [L, H*E]
    x = x + o @ W[p + "self_attn.o_proj.weight"].T  # [L, H*E] -> [L, D]
    h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
    gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T  # [L, F]
    return x + (gate / (f32(1.0) + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T  # SwiGLU


def logits(cfg, W, ids, audio_mask, T):
    """ids [C, L] (the targets last) -> the audio heads' logits of the T targets [C, T, V]."""
    qwen, C, V = cfg["llm_config"], cfg["num_audio_codebook"], cfg["audio_vocab_size"]
    theta = qwen.get("rope_parameters", {}).get("rope_theta", qwen.get("rope_theta"))
    cos, sin = rope(ids.shape[1], qwen["head_dim"], theta)
    x = embed(cfg, W, ids, audio_mask)  # [L, D]
    for i in range(qwen["num_hidden_layers"]):
        x = layer(qwen, W, i, x, cos, sin)
    h = rms_norm(x[-T:], W["llm.norm.weight"], qwen["rms_norm_eps"])  # the targets only
    return (h @ W["audio_heads.weight"].T).reshape(T, C, V).transpose(1, 0, 2)  # -> [C, T, V]


# ---------------------------------------------------------------------------------------------
# Iterative unmasking with classifier-free guidance
# ---------------------------------------------------------------------------------------------

def cells_per_step(cells: int, steps: int, shift: float) -> list:
    """How many cells each step fills: step s fills ceil(cells (t[s+1] - t[s])) of those left
    (the last step: all that are left), on the grid t = i / steps (i = 0 .. steps) shifted to
    t -> shift t / (1 + (shift - 1) t): with shift < 1, few cells first and many at the end."""
    t = linspace01(steps)  # i / steps
    t = (f32(shift) * t / (f32(1.0) + f32(shift - 1.0) * t)).astype(f32).astype(np.float64)
    counts, left = [], cells
    for s in range(steps):
        due = left if s == steps - 1 else min(math.ceil(cells * (t[s + 1] - t[s])), left)
        counts.append(int(due))
        left -= int(due)
    return counts


def linspace01(steps):
    """i / steps for i = 0 .. steps, rounded to float32 as torch.linspace rounds them: the first
    half as i step, the second as 1 - (steps - i) step (step = 1 / steps in float32). The counts
    are ceil()s of the grid's differences, so its last bits matter (and the shift's float32)."""
    n, step = steps + 1, f32(1.0) / f32(steps)
    i = np.arange(n)
    return np.where(i < n // 2, (np.float64(step) * i).astype(f32),
                    (1.0 - np.float64(step) * (n - 1 - i)).astype(f32))


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def gumbel(rng, shape):
    u = rng.random(shape, dtype=f32)  # the reference's 1e-10 guards
    return -np.log(-np.log(u + f32(1e-10)) + f32(1e-10))


def unmask(cfg, W, row, audio_mask, T, num_step=32, guidance_scale=2.0, t_shift=0.1,
           layer_penalty_factor=5.0, position_temperature=5.0, class_temperature=0.0, seed=None):
    """The codes [C, T] of one item: `num_step` passes over its conditional row and, for
    guidance, its unconditional row (the T targets alone); each step fills the cells it is due,
    the most confident first (coarse codebooks ahead), until no MASK is left."""
    C, V, MASK = cfg["num_audio_codebook"], cfg["audio_vocab_size"], cfg["audio_mask_id"]
    row, uncond = row.copy(), row[:, -T:].copy()  # [C, L], [C, T]
    tokens = np.full((C, T), MASK, np.int64)
    rng = np.random.default_rng(seed)
    for due in cells_per_step(C * T, num_step, t_shift):  # due: the cells this step fills
        if due == 0:  # (a step due no cell changes nothing and draws no noise)
            continue
        lp = log_softmax(logits(cfg, W, row, audio_mask, T))  # [C, T, V] log-probabilities
        if guidance_scale != 0:  # pushed away from what the targets alone predict
            # (the unconditional row is a row of its own: its positions start at 0)
            lp_u = log_softmax(logits(cfg, W, uncond, np.ones(T, bool), T))
            lp = log_softmax(lp + f32(guidance_scale) * (lp - lp_u))
        lp[..., MASK] = -np.inf  # MASK is never a prediction
        pred, conf = lp.argmax(axis=-1), lp.max(axis=-1)  # [C, T] each
        if class_temperature > 0:  # a Gumbel-max draw among each cell's best 10 % of ids
            top = np.argpartition(-lp, math.ceil(0.1 * V) - 1, axis=-1)[..., :math.ceil(0.1 * V)]
            noisy = (np.take_along_axis(lp, top, axis=-1) / f32(class_temperature)
                     + gumbel(rng, top.shape))
            pred = np.take_along_axis(top, noisy.argmax(axis=-1)[..., None], axis=-1)[..., 0]
        # the "layer" is the codebook: a penalty per codebook index fills coarse ones first
        score = conf - f32(layer_penalty_factor) * np.arange(C, dtype=f32)[:, None]
        if position_temperature > 0:
            score = score / f32(position_temperature) + gumbel(rng, (C, T))
        score = np.where(tokens != MASK, -np.inf, score).ravel()  # a filled cell stays filled
        cells = np.argsort(-score, kind="stable")[:due]  # ties: the first cell
        tokens.reshape(-1)[cells] = pred.reshape(-1)[cells]
        row[:, -T:] = uncond[:] = tokens
    return tokens


# ---------------------------------------------------------------------------------------------
# The Higgs Audio V2 decoder: codes -> waveform
# ---------------------------------------------------------------------------------------------

def conv1d(x, w, b, dilation=1, padding=0, stride=1):
    """x [Cin, S], w [Cout, Cin, taps] -> [Cout, S']: one matrix product per tap."""
    taps = w.shape[2]
    x = np.pad(x, ((0, 0), (padding, padding)))
    n = (x.shape[1] - dilation * (taps - 1) - 1) // stride + 1  # output steps
    y = sum(w[:, :, j] @ x[:, j * dilation:j * dilation + stride * (n - 1) + 1:stride]
            for j in range(taps))
    return y if b is None else y + b[:, None]


def conv_transpose1d(x, w, b, stride, padding, output_padding):
    """x [Cin, S], w [Cin, Cout, taps] -> [Cout, (S-1) stride - 2 padding + taps + output_padding]:
    each input step spreads `taps` outputs, `stride` apart from the next step's."""
    taps, S = w.shape[2], x.shape[1]
    full = np.zeros((w.shape[1], (S - 1) * stride + taps + output_padding), f32)
    for j in range(taps):
        full[:, j:j + stride * S:stride] += w[:, :, j].T @ x  # [Cout, Cin] @ [Cin, S]
    n = (S - 1) * stride - 2 * padding + taps + output_padding
    return full[:, padding:padding + n] + b[:, None]


def snake(x, alpha):
    """x + sin^2(alpha x) / alpha, per channel (alpha [1, C, 1] as stored)."""
    a = alpha.reshape(-1, 1)
    return x + (f32(1.0) / (a + f32(1e-9))) * np.sin(a * x) ** 2


def res_unit(W, p, x, dilation):
    """DAC's residual unit: x + conv1x1(snake(conv7_dilated(snake(x)))), length kept."""
    y = conv1d(snake(x, W[p + "snake1.alpha"]), W[p + "conv1.weight"], W[p + "conv1.bias"],
               dilation, 3 * dilation)
    return x + conv1d(snake(y, W[p + "snake2.alpha"]), W[p + "conv2.weight"], W[p + "conv2.bias"])


def decode(codec_cfg, W, codes):
    """codes [Q, T] -> float32 waveform [960 T] at 24 kHz."""
    z = 0
    for q in range(codes.shape[0]):  # each codebook's vector, projected out, summed
        p = f"quantizer.quantizers.{q}."
        e = W[p + "codebook.embed"][codes[q]]  # [T, d]: the codewords
        z = z + linear(W, p + "project_out.", e)  # [T, d] -> [T, Dc]
    # fc2 projects the whole latent to the acoustic decoder's width: the semantic half shaped
    # the codes (the encoder fused it in), but no semantic decoder runs here
    x = linear(W, "fc2.", z).T  # [T, Dc] -> [T, Ca] -> [Ca, T]
    x = conv1d(x, W["acoustic_decoder.conv1.weight"], W["acoustic_decoder.conv1.bias"], padding=3)
    for i, s in enumerate(codec_cfg["acoustic_model_config"]["upsampling_ratios"]):
        p = f"acoustic_decoder.block.{i}."
        x = snake(x, W[p + "snake1.alpha"])
        # kernel 2s, padding ceil(s/2), output padding s % 2: exactly s samples per input step
        x = conv_transpose1d(x, W[p + "conv_t1.weight"], W[p + "conv_t1.bias"], s,
                             math.ceil(s / 2), s % 2)  # [ch, S] -> [ch/2, S s]
        for j, dilation in enumerate((1, 3, 9)):
            x = res_unit(W, f"{p}res_unit{j + 1}.", x, dilation)
    x = snake(x, W["acoustic_decoder.snake1.alpha"])
    # no tanh at the end: this checkpoint's decoder drops DAC's
    return conv1d(x, W["acoustic_decoder.conv2.weight"], W["acoustic_decoder.conv2.bias"],
                  padding=3)[0]  # [1, S] -> [S]


# ---------------------------------------------------------------------------------------------
# The Higgs Audio V2 encoder: a voice's clip -> codes (HuBERT + DAC encoder + residual VQ)
# ---------------------------------------------------------------------------------------------

def resample(x, orig, new):
    """torchaudio's default resampler: a Hann-windowed sinc, 6 zero crossings, cutoff 0.99 of
    the lower Nyquist; its float32 taps rounded step for step as torchaudio builds them."""
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    base = min(orig, new) * 0.99
    width = math.ceil(6 * orig / base)
    tap = np.arange(2 * width + orig)[None, :]  # [1, taps]: the taps of one output phase
    t = (-np.arange(new)[:, None]).astype(f32) / f32(new) + (tap - width).astype(f32) / f32(orig)
    t = np.clip(t * f32(base), f32(-6), f32(6))  # [P, taps]
    window = np.cos(t * f32(math.pi) / f32(6) / f32(2)) ** 2
    t = t * f32(math.pi)
    safe = np.where(t == 0, f32(1), t)
    taps = np.where(t == 0, f32(1), np.sin(safe) / safe)  # sinc, 1 at 0
    taps = (taps * (window * f32(base / orig))).astype(f32)
    L = x.shape[0]
    padded = np.pad(x.astype(f32), (width, width + orig))
    # block n: `orig` input samples in, P outputs (one per phase) out
    blocks = np.stack([padded[n * orig:n * orig + tap.size]
                       for n in range(L // orig + 1)])  # [n, taps]
    return (blocks @ taps.T).reshape(-1)[:math.ceil(new * L / orig)]  # [n, P] -> [L']


def layer_norm(x, w, b, eps, axis=-1):
    xc = x - x.mean(axis=axis, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(axis=axis, keepdims=True) + f32(eps)) * w + b


def gelu(x):  # with the exact Gaussian CDF
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x.astype(np.float64) / math.sqrt(2.0)))).astype(f32)


def hubert_states(h_cfg, W, wav16):
    """HuBERT (the codec's semantic branch) on a 16 kHz clip: every hidden state, [Fh, Ds] each
    (the embedded input, then each post-LN layer's output)."""
    p, eps = "semantic_model.", h_cfg["layer_norm_eps"]
    x = wav16[None]  # [1, L]
    for i, s in enumerate(h_cfg["conv_stride"]):  # conv feature encoder: 320 samples a frame
        cv = f"{p}feature_extractor.conv_layers.{i}."
        x = conv1d(x, W[cv + "conv.weight"], W.get(cv + "conv.bias"), stride=s)  # -> [512, S/s]
        if i == 0:  # each channel normalised over the whole clip (one group per channel)
            gn_w, gn_b = W[cv + "layer_norm.weight"][:, None], W[cv + "layer_norm.bias"][:, None]
            x = layer_norm(x, gn_w, gn_b, 1e-5, axis=1)
        x = gelu(x)
    x = x.T  # [512, Fh] -> [Fh, 512]
    f = p + "feature_projection."
    if h_cfg.get("feat_proj_layer_norm", True):
        x = layer_norm(x, W[f + "layer_norm.weight"], W[f + "layer_norm.bias"], eps)
    x = linear(W, f + "projection.", x)  # [Fh, 512] -> [Fh, Ds]
    pc = p + "encoder.pos_conv_embed.conv."
    g, v = W[pc + "parametrizations.weight.original0"], W[pc + "parametrizations.weight.original1"]
    # weight norm: w = g v / |v|, one gain per tap, the norm over its (out, in) channels
    w = (v * (g / np.sqrt((v.astype(np.float64) ** 2).sum(axis=(0, 1), keepdims=True)))).astype(f32)
    G, taps = h_cfg["num_conv_pos_embedding_groups"], h_cfg["num_conv_pos_embeddings"]
    n = x.shape[1] // G  # a grouped conv: each group of n channels sees only itself
    pos = np.concatenate([conv1d(x.T[j * n:(j + 1) * n], w[j * n:(j + 1) * n], None,
                                 padding=taps // 2) for j in range(G)])
    pos = pos + W[pc + "bias"][:, None]  # [Ds, Fh (+1: taps is even)]
    x = x + gelu(pos[:, :x.shape[0]].T)  # the positional embedding: a convolution over frames
    x = layer_norm(x, W[p + "encoder.layer_norm.weight"], W[p + "encoder.layer_norm.bias"], eps)
    states, H = [x], h_cfg["num_attention_heads"]
    Fh, Ds = x.shape
    for i in range(h_cfg["num_hidden_layers"]):
        a = f"{p}encoder.layers.{i}."
        q, k, v = (linear(W, f"{a}attention.{t}_proj.", x).reshape(Fh, H, Ds // H)
                   for t in "qkv")  # [Fh, H, Ds/H] each
        s = np.einsum("fhe,ghe->hfg", q, k) * f32((Ds // H) ** -0.5)  # [H, Fh, Fh], no mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        o = np.einsum("hfg,ghe->fhe", s / s.sum(axis=-1, keepdims=True), v).reshape(Fh, Ds)
        o = linear(W, a + "attention.out_proj.", o)
        x = layer_norm(x + o, W[a + "layer_norm.weight"], W[a + "layer_norm.bias"], eps)  # post-LN
        h = gelu(linear(W, a + "feed_forward.intermediate_dense.", x))  # [Fh, Ds] -> [Fh, 4 Ds]
        h = linear(W, a + "feed_forward.output_dense.", h)
        x = layer_norm(x + h, W[a + "final_layer_norm.weight"], W[a + "final_layer_norm.bias"], eps)
        states.append(x)
    return states


def elu(x):
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


def latent(codec_cfg, W, wav):
    """A mono 24 kHz clip [L] -> the fused latent [T, Dc] the quantizer sees, T = ceil(L / 960)."""
    ac_cfg = codec_cfg["acoustic_model_config"]
    hop = math.prod(ac_cfg["downsampling_ratios"])  # 960 samples a frame
    rate, rate16 = codec_cfg["sample_rate"], codec_cfg["semantic_sample_rate"]
    wav = np.pad(wav.astype(f32), (0, -len(wav) % hop))  # whole frames
    # semantic: HuBERT at 16 kHz (160 samples of silence each side, as the codec was trained),
    # the mean of all its states (every layer's view, not the last one's alone), every second
    # frame (HuBERT's 50 Hz to the codes' 25 Hz), then a small conv encoder
    wav16 = np.pad(resample(wav, rate, rate16), 160)
    states = hubert_states(codec_cfg["semantic_model_config"], W, wav16)
    total = sum(states[1:], states[0])  # added in order, as the reference adds them
    step = int(hop / (rate / rate16) / codec_cfg["downsample_factor"])  # HuBERT frames a code frame
    x = (total / f32(len(states)))[::step].T  # [Ds, T]
    taps, unit_taps = codec_cfg["kernel_size"], codec_cfg["unit_kernel_size"]
    x = conv1d(x, W["encoder_semantic.conv.weight"], None, padding=taps // 2)
    for i, _ in enumerate(codec_cfg["strides"]):  # (every stride is 1 in this codec)
        p = f"encoder_semantic.conv_blocks.{i}."
        for j, d in enumerate(codec_cfg["block_dilations"]):
            y = conv1d(elu(x), W[f"{p}res_units.{j}.conv1.weight"], None, d,
                       (unit_taps - 1) // 2 * d)
            x = x + conv1d(elu(y), W[f"{p}res_units.{j}.conv2.weight"], None)
        x = conv1d(x, W[p + "conv.weight"], W[p + "conv.bias"], padding=1)
    sem = x  # [Ds, T]
    # acoustic: the DAC encoder, strided convs doubling the width (whole frames: T of them too)
    x = conv1d(wav[None], W["acoustic_encoder.conv1.weight"], W["acoustic_encoder.conv1.bias"],
               padding=3)
    for i, s in enumerate(ac_cfg["downsampling_ratios"]):
        p = f"acoustic_encoder.block.{i}."
        for j, dilation in enumerate((1, 3, 9)):
            x = res_unit(W, f"{p}res_unit{j + 1}.", x, dilation)
        x = conv1d(snake(x, W[p + "snake1.alpha"]), W[p + "conv1.weight"], W[p + "conv1.bias"],
                   padding=math.ceil(s / 2), stride=s)  # [ch, S] -> [2 ch, S/s]
    x = conv1d(snake(x, W["acoustic_encoder.snake1.alpha"]), W["acoustic_encoder.conv2.weight"],
               W["acoustic_encoder.conv2.bias"], padding=1)  # [Ca, T]
    return linear(W, "fc.", np.concatenate([x, sem]).T)  # [T, Ca + Ds] -> [T, Dc]


def encode(codec_cfg, W, wav):
    """A mono 24 kHz clip [L] -> codes [Q, T]: its latent, quantized codebook after codebook,
    each coding what the ones before left."""
    r, codes = latent(codec_cfg, W, wav), []
    for q in range(sum(key.endswith(".codebook.embed") for key in W)):  # residual VQ, in order
        p = f"quantizer.quantizers.{q}."
        z = linear(W, p + "project_in.", r)  # [T, Dc] -> [T, d]
        e = W[p + "codebook.embed"]  # [N, d]
        dist = (z * z).sum(axis=1, keepdims=True) - 2 * (z @ e.T) + (e * e).sum(axis=1)  # [T, N]
        code = dist.argmin(axis=1)  # the nearest codeword (the first of a tie)
        codes.append(code)
        r = r - linear(W, p + "project_out.", e[code])  # what is left for the next codebook
    return np.stack(codes)


# ---------------------------------------------------------------------------------------------
# Text to speech
# ---------------------------------------------------------------------------------------------

def speak(model_dir, text, frames, lang=None, instruct=None, ref_text=None, ref_wav=None,
          **sampling):
    """The codes [C, T] and waveform of `text` spoken in `frames` frames (25 a second): in the
    auto voice, a designed one (`instruct`), or a cloned one (`ref_wav`, a mono 24 kHz clip, and
    its transcript `ref_text`). `sampling`: `unmask`'s knobs (the reference's defaults)."""
    cfg, W, tok, codec_cfg, codec_W = load(model_dir)
    ref_codes = None
    if ref_wav is not None:  # the clip's last part frame dropped, as OmniVoice does (not padded)
        hop = math.prod(codec_cfg["acoustic_model_config"]["downsampling_ratios"])
        ref_codes = encode(codec_cfg, codec_W, ref_wav[:len(ref_wav) // hop * hop])  # [C, R]
    row, audio_mask = prompt_row(cfg, tok, text, frames, lang, instruct, ref_text, ref_codes)
    codes = unmask(cfg, W, row, audio_mask, frames, **sampling)
    return codes, decode(codec_cfg, codec_W, codes)
