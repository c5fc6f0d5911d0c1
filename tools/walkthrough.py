#!/usr/bin/env python3
"""Trace one sentence through every stage of omnicore and write docs/walkthrough.md.

    python3 tools/walkthrough.py           rewrite docs/walkthrough.md from this run
    python3 tools/walkthrough.py --check   exit 1, listing the differences, if the page is stale

The page is PAGE below, prose written once, with this run's shapes and values filled in. Every
value comes from omnicore's own functions on the tiny random checkpoint; nothing of the model
is computed again here. Two inner tensors are observed in passing: layer 0's attention weights,
read from the backbone's workspace after `backbone.attention` (numpy backend only), and the
decoder's intermediate arrays, recorded by `spy` while `higgs_codec.decode` runs.

Floats are printed with 4 significant digits, and `differences` compares pages with a relative
tolerance on them: BLAS kernels round differently from one CPU to the next (AVX-512 against
AVX2), while integers (token ids, shapes, codes) and the prose must match exactly.

Dimension legend: C codebooks, V audio vocabulary, T target frames, S conditional row length,
N packed tokens, D hidden size, H / K query / key-value heads, G = H / K, E head dim,
L waveform samples, R reference frames.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's omnicore, the one the page describes

from omnicore import OmniVoice  # noqa: E402
from omnicore.machinery import checkpoint  # noqa: E402
from omnicore.audio import postprocess  # noqa: E402
from omnicore.audio.writers import write_atomic  # noqa: E402
from omnicore.model import backbone, backend, higgs_codec, kernels, scoring_kernels, unmasking  # noqa: E402
from omnicore.model import tokenizer as tok_mod  # noqa: E402
from omnicore.model.config import GenerationConfig  # noqa: E402
from omnicore.text import frontend, planner  # noqa: E402

CHECKPOINT = ROOT / "weights" / "tiny-random"
PAGE_PATH = ROOT / "docs" / "walkthrough.md"
TEXT = "The quick brown fox jumps over the lazy dog."
LANGUAGE = "English"
SEED = 0
# Few steps, so that the whole trace runs in seconds; greedy (both temperatures 0), so no
# random draw is made and the page is the same on every run.
GEN = GenerationConfig(num_step=8, position_temperature=0.0, class_temperature=0.0)
# One unit in the 4th significant digit is up to 1e-3 of a value, and the value itself may
# round to the neighbouring unit on another CPU.
FLOAT_REL_TOL = 2e-3
FLOAT_ABS_TOL = 1e-6

PAGE = """\
# One sentence through OmniVoice, stage by stage

This page follows one sentence from text to waveform through omnicore, with the real shapes and
values at every stage. It runs on [`weights/tiny-random`](../weights/tiny-random/README.md):
random weights in the real checkpoint's layout with small widths, so every shape has the real
model's structure while the numbers are noise (and so is the audio). Each stage links to the
function that does it. Every number here is printed by
[`tools/walkthrough.py`](../tools/walkthrough.py), which calls those functions, and
[`tests/test_walkthrough.py`](../tests/test_walkthrough.py) fails when this page no longer
matches what they compute. Regenerate it with `python3 tools/walkthrough.py`.

The sentence:

> {text}

in {lang}, with no voice prompt (the model picks a voice), and these
[`GenerationConfig`](../omnicore/model/config.py) settings: `num_step={num_step}` (the default is
32; fewer steps keep this page quick), `guidance_scale={guidance}`, `t_shift={t_shift}`,
`layer_penalty_factor={layer_penalty}`, and both temperatures 0, which makes every choice
greedy: no random draw is made, so the seed ({seed}) changes nothing.

| symbol | meaning | tiny-random | real model |
|---|---|---|---|
| C | audio codebooks | {C} | 8 |
| V | audio vocabulary per codebook, MASK = {mask} included | {V} | 1025 |
| D | hidden size | {D} | 1024 |
| H, K | query heads, key/value heads (G = H / K = {G} queries share a key) | {H}, {K} | 16, 8 |
| E | head dim | {E} | 128 |
| F | MLP width | {F} | 3072 |
| | decoder layers | {layers} | 28 |
| | text vocabulary | {text_vocab} | 151676 |

## 1. Text to a target length

[`frontend.resolve_language`](../omnicore/text/frontend.py) turns "{lang}" into the id the
prompt carries, `{lang_id}`. Then [`planner.plan_synthesis`](../omnicore/text/planner.py)
decides how many frames of audio to generate, before anything runs: the model fills a canvas of
fixed length T, it never decides when to stop.
[`frontend.estimate_target_frames`](../omnicore/text/frontend.py) sums the characters' speaking
weights ([`frontend.text_weight`](../omnicore/text/frontend.py): {weight} for this sentence)
and converts them at the pace of a yardstick sentence: **T = {T} frames**, {seconds} s at
{frame_rate} frames per second. That is below the {chunk_threshold} s past which a long text is
cut into chunks, so the sentence is one pass.

## 2. Tokens

[`tokenizer.prepare_item`](../omnicore/model/tokenizer.py) writes the prompt as text:
[`tokenizer.style_ids`](../omnicore/model/tokenizer.py) gives the language and instruct
fields (no instruct is the literal word `None`), and
[`tokenizer.tokenize_with_nonverbal_tags`](../omnicore/model/tokenizer.py) the sentence between
`<|text_start|>` and `<|text_end|>`. {num_text} tokens, id then piece (`Ġ` is the BPE's mark
for a leading space; the tiny tokenizer's small vocabulary cuts words into short pieces):

```
{token_table}
```

## 3. The rows of one pass

The backbone reads integer rows [C, positions]. The **conditional** row
([`tokenizer.PreparedItem`](../omnicore/model/tokenizer.py)) is the {num_text} text tokens,
copied onto all {C} codebook rows, followed by the T = {T} target frames, every cell MASK
({mask}): shape **{cond_shape}**. `audio_mask` marks positions {first_audio} to {last_pos} as
audio. With a voice prompt, its codes would sit between the two (section 12).

```
{row_picture}
```

Classifier-free guidance needs a second, **unconditional** row: the target frames alone, no
text ([`PreparedItem.uncond_ids`](../omnicore/model/tokenizer.py)), shape **{uncond_shape}**.
[`unmasking.generate_codes`](../omnicore/model/unmasking.py) packs both rows back to back into one
sequence of N = {N} tokens ([`backbone.make_packing`](../omnicore/model/backbone.py): rows
start at {starts}), so that every projection is one matrix product over both rows, while
attention stays within each row.

## 4. Embeddings

[`backbone.embed`](../omnicore/model/backbone.py) turns the packed ids into vectors
x **{x_shape}**. A text position takes its row of the text table; position 0,
`<|lang_start|>`, starts {x_text}. An audio position adds up one vector per codebook from the
joint audio table (row id + c·V); position {first_audio}, MASK in all {C} codebooks, starts
{x_mask}. All {T} target frames of both rows are MASK, so they start as the very same vector
(all equal: {masks_equal}); only their positions, through the rotary embedding below, tell them
apart at step 1.

## 5. Attention in layer 0

Each of the {layers} layers is a pre-norm Qwen3 block
([`backbone.hidden_states`](../omnicore/model/backbone.py)): RMSNorm, attention, residual add,
RMSNorm, SwiGLU MLP, residual add. In [`backbone.attention`](../omnicore/model/backbone.py) the
packed normalised x is projected to queries q **{q_shape}** (N × H·E) and keys and values
k, v **{k_shape}** (N × K·E): grouped-query attention keeps K = {K} key/value heads for
H = {H} query heads. [`kernels.qk_norm_rope`](../omnicore/model/kernels.py) normalises every
head and rotates it by its position, and regroups the queries by the key they read:
qg **{qg_shape}** (K × N × G·E).

The rotation (RoPE) turns each pair of dimensions by position × frequency;
[`backbone.rope_inv_freq`](../omnicore/model/backbone.py) gives {num_freq} frequencies from
{freq_first} down to {freq_last}, and the packing's cos and sin tables are {cos_shape}
(N × E). Positions restart at 0 in every row: packed token {uncond_start}, the first of the
unconditional row, is position 0 (its cos row is all 1: {restart}). Query head 0 of position
{probe} (a target frame) starts
{q_raw} as projected, and
{q_rot} once normalised and rotated.

Attention is **bidirectional**: no causal mask, every position sees its whole row, future
frames included (which is why there is no KV cache: every step changes the targets). One row of
weights, query head 0 at position {first_audio} (the first target frame) over the {S} keys of
the conditional row, which sum to {weight_sum}:

| keys | weight | uniform attention |
|---|---|---|
| the {num_text} text positions, together | {text_mass} | {uniform_text} |
| the first three | {w_first} | {uniform_one} each |
| the frame itself | {w_self} | {uniform_one} |
| its neighbour | {w_next} | {uniform_one} |
| the last frame | {w_last} | {uniform_one} |

(These weights come from running the conditional row alone, which computes the same thing: a
row never sees another.) The heads' outputs, {attn_shape}, go through `o_proj` back to D.

## 6. Step 1: logits and guided scores

[`backbone.forward_rows`](../omnicore/model/backbone.py) runs the embeddings through all layers
and applies the final norm and the audio heads
([`backbone.audio_logits`](../omnicore/model/backbone.py)) to the last T positions of each row
only: logits **{logits_shape}** (C × T × V) for the conditional row and the same for the
unconditional one. For codebook 0, frame 0, the first four logits are
{cond_head} (conditional) and
{uncond_head} (unconditional).

[`unmasking.unmask_step`](../omnicore/model/unmasking.py), one step of one pass, first calls
[`scoring_kernels.guided_scores`](../omnicore/model/scoring_kernels.py), which takes
log-softmaxes c and u of the two and
scores every cell by log_softmax(c + {guidance}·(c − u)), with MASK ruled out
(its score is {lp_mask}): lp **{lp_shape}**. Cell (0, 0): lp starts
{lp_head}; its best token is {tok00} with log-probability {conf00} (the conditional logits
alone would give {plain_tok00} at {plain_conf00}).

[`unmasking.choose_cells`](../omnicore/model/unmasking.py) ranks the cells by confidence minus
{layer_penalty} × codebook index, so coarse codebooks come first, and the step fills the best
{k1} (step 1's share of the cells, next section). Step 1 fills (codebook, frame) → token:

```
{chosen}
```

## 7. Cells per step

Over {num_step} steps, every one of the C × T = {cells} cells gets filled.
[`unmasking.time_steps`](../omnicore/model/unmasking.py) warps the grid i / {num_step} by
t_shift = {t_shift}:

t = {t_grid}

[`unmasking.cells_per_step`](../omnicore/model/unmasking.py) gives step i
ceil({cells} × (t[i+1] − t[i])) cells and the last step the rest: **{cells_per_step}**. Few cells
early, while the canvas is nearly all MASK; most at the end.

## 8. The loop

[`unmasking.generate_codes`](../omnicore/model/unmasking.py) runs sections 4 to 6 once per step,
{num_step} steps in all: each step embeds the cells filled so far, runs the whole forward again,
and fills its share of the still-masked cells; a filled cell is never revisited. (The server and
`generate` run the same step in [`engine.Engine`](../omnicore/engine.py), packing the rows of
concurrent requests together, in its fast form
[`packed_unmasking.iterate`](../omnicore/model/packed_unmasking.py): every pass scored, picked
and filled in one kernel call each, tested equal to `unmask_step` bit for bit.)
Cells filled per step and codebook:

{fill_table}

The step at which each cell was filled (rows: codebooks 0 to {last_codebook}; columns: frames
0 to {last_frame}):

```
{fill_map}
```

[`OmniVoice.synthesize`](../omnicore/pipeline.py), the public API, gives exactly these codes with
the same settings (the script checks it).

## 9. The codes

The result is an int64 array **{codes_shape}**, values {codes_min} to {codes_max} (MASK never
survives). The first frames:

{codes_table}

## 10. The decoder

[`higgs_codec.decode`](../omnicore/model/higgs_codec.py) turns codes back into sound.
[`higgs_codec.dequantize`](../omnicore/model/higgs_codec.py) looks up each codebook's entry and projects it,
summing the {C} codebooks into a latent **{latent_shape}** (batch × T × latent width); `fc2`
maps it to {fc2_width} channels and a first convolution to {conv1_width}. Then one DAC block per
upsampling ratio: Snake activation, a transposed convolution that makes `stride` samples of
each input step, and three dilated residual units:

{decoder_table}

A last Snake and convolution leave one channel: {decoder_out_shape}. The strides multiply to
{hop}: one frame of codes becomes {hop} samples.

## 11. The waveform

{num_samples} samples = {T} frames × {hop} at {sample_rate} Hz: {duration} s. Minimum {wav_min},
maximum {wav_max}, RMS {wav_rms}. [`OmniVoice.synthesize`](../omnicore/pipeline.py)
then applies the reference's clean-up,
[`postprocess.postprocess_output`](../omnicore/audio/postprocess.py): long silences removed,
peak normalised to {peak} (no voice prompt whose loudness to match), {pad} s fades and padding
at both ends: {final_samples} samples, the waveform the public API returns (checked too).

## 12. Voice cloning: the encoder

With a voice prompt, a reference clip and its transcript condition every pass. Taking the
waveform above as the clip ([`higgs_codec.encode_features`](../omnicore/model/higgs_codec.py)): the
{num_samples} samples, resampled to 16 kHz, go through HuBERT (averaged hidden states, every
second frame: {hubert_shape}) and a semantic convolution stack ({semantic_shape}); the DAC
encoder takes the 24 kHz samples down by the same strides ({acoustic_shape}); the two,
concatenated and projected, give {fused_shape}, and
[`higgs_codec.quantize`](../omnicore/model/higgs_codec.py) picks the nearest codeword of each codebook in
turn (residual vector quantisation): codes {ref_codes_shape}, R = {R} reference frames.
[`tokenizer.prepare_item`](../omnicore/model/tokenizer.py) then builds the conditional row
`<|denoise|>`, language, instruct, transcript + " " + text ({clone_text} tokens), the R reference
frames and T = {clone_T} target frames (estimated at the clip's own pace): shape
{clone_shape}. The unconditional row is still the T target frames alone.

## 13. What this page did not show

Sections 2 to 12 follow the model's reading order
([omnicore/model/__init__.py](../omnicore/model/__init__.py)): the tokenizer, the backbone,
the unmasking loop, the codec with HuBERT and the resampler. Two parts of the folder come
after it. How it is made fast: the Numba kernels between the GEMMs, each beside the plain twin
it is tested against ([kernels.py](../omnicore/model/kernels.py),
[scoring_kernels.py](../omnicore/model/scoring_kernels.py),
[conv_kernels.py](../omnicore/model/conv_kernels.py)), the packed step the engine runs
([`packed_unmasking.iterate`](../omnicore/model/packed_unmasking.py)), the backbone's fused
layer (`backbone._layer_fused`), the numpy/CuPy switch
([backend.py](../omnicore/model/backend.py)) and what a forward costs
([cost.py](../omnicore/model/cost.py)). How a checkpoint is read: `config.json` into frozen
dataclasses ([config.py](../omnicore/model/config.py)) and every tensor taken by its key
([`weights.ParamReader`](../omnicore/model/weights.py)), from files that
[omnicore/machinery/checkpoint.py](../omnicore/machinery/checkpoint.py) finds and reads safely.
"""


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------


def f4(x) -> str:
    """A float with 4 significant digits, always written as a float (a point or an exponent),
    so that `differences` knows to compare it with a tolerance."""
    x = float(x)
    if not math.isfinite(x):
        return str(x)  # "inf", "-inf", "nan"
    s = f"{x:#.4g}"
    return s + "0" if s.endswith(".") else s


def floats(a) -> str:
    return "[" + ", ".join(f4(x) for x in np.ravel(a)) + "]"


def shape(a) -> str:
    return "[" + ", ".join(str(n) for n in np.shape(a)) + "]"


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def spy(module, name: str):
    """Within the block, record (args, kwargs, result) of every call of `module.name` made
    through the module's global, which is how the module's own functions call it."""
    real = getattr(module, name)
    calls = []

    def recorded(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    setattr(module, name, recorded)
    try:
        yield calls
    finally:
        setattr(module, name, real)


# ---------------------------------------------------------------------------------------------
# The stages: each fills its fields of PAGE into `v`
# ---------------------------------------------------------------------------------------------


def stage_dims(m: OmniVoice, v: dict) -> None:
    cfg, q = m.config, m.config.llm_config
    v.update(text=TEXT, lang=LANGUAGE, seed=SEED, num_step=GEN.num_step, guidance=GEN.guidance_scale,
             t_shift=GEN.t_shift, layer_penalty=GEN.layer_penalty_factor,
             C=cfg.num_audio_codebook, V=cfg.audio_vocab_size, mask=cfg.audio_mask_id,
             D=q.hidden_size, H=q.num_attention_heads, K=q.num_key_value_heads,
             G=q.num_attention_heads // q.num_key_value_heads, E=q.head_dim,
             F=q.intermediate_size, layers=q.num_hidden_layers, text_vocab=q.vocab_size)


def stage_text(m: OmniVoice, v: dict) -> tok_mod.PreparedItem:
    """Sections 1 to 3: text -> target length -> tokens -> the conditional row."""
    lang = frontend.resolve_language(LANGUAGE)
    plan = planner.plan_synthesis(TEXT, frame_rate=m.frame_rate)
    (chunk,) = plan.chunks  # one pass, as the page says: far below the chunking threshold
    T = chunk.frames
    item = tok_mod.prepare_item(m.tokenizer, m.config, TEXT, T, lang=lang)
    ids = item.input_ids  # [C, S]
    n_text = item.num_prompt
    v.update(lang_id=lang, weight=f4(frontend.text_weight(TEXT)), T=T, seconds=f4(T / m.frame_rate),
             frame_rate=m.frame_rate, chunk_threshold=f"{GEN.audio_chunk_threshold:g}",
             num_text=n_text, cond_shape=shape(ids), first_audio=n_text, last_pos=ids.shape[1] - 1,
             uncond_shape=shape(item.uncond_ids), S=ids.shape[1])

    pieces = [f"{int(i):>5} {m.tokenizer.backend.id_to_token(int(i)):<18}" for i in ids[0, :n_text]]
    v["token_table"] = "\n".join("".join(pieces[i:i + 5]).rstrip() for i in range(0, n_text, 5))

    # a few columns: the first two and the last text token | the first two and the last target
    cols = [0, 1, n_text - 1, n_text, n_text + 1, ids.shape[1] - 1]
    C = ids.shape[0]
    cells = [["position"] + cols] + [[f"codebook {c}"] + ids[c, cols].tolist() for c in (0, 1)]
    cells += [["..."] + [""] * 6, [f"codebook {C - 1}"] + ids[C - 1, cols].tolist()]
    cells += [["audio_mask"] + item.audio_mask[cols].tolist()]
    width = max(len(str(x)) for row in cells for x in row[1:])
    lines = []
    for name, *vals in cells:
        p0, p1, p2, p3, p4, p5 = (f"{str(x):>{width}}" for x in vals)
        gap = "..." if vals[0] != "" else "   "
        lines.append(f"{name:<11}{p0} {p1} {gap} {p2} | {p3} {p4} {gap} {p5}".rstrip())
    v["row_picture"] = "\n".join(lines)
    return item


def layer0_attention(m: OmniVoice, ids, audio_mask, lengths):
    """Embed packed rows and run layer 0's attention on them, as `backbone.hidden_states` does
    first; returns the packing and the workspace that holds every intermediate array."""
    params, cfg = m.params, m.config
    pack = backbone.make_packing(lengths, cfg)
    work = backbone.make_workspace(cfg, pack)
    backbone.embed(params, cfg, ids, audio_mask, out=work.x)  # [N, D]
    lp = params.layers[0]
    kernels.rms_norm(work.x, lp.input_layernorm, cfg.llm_config.rms_norm_eps, out=work.h)
    backbone.attention(lp, cfg, work.h, pack, work)  # -> work.q, k, v, qg, attn; scores of the last row
    return pack, work


def stage_backbone(m: OmniVoice, item: tok_mod.PreparedItem, v: dict):
    """Sections 3 to 5: the packed rows, their embeddings, layer 0's attention."""
    cfg = m.config
    S, T, n_text = item.input_ids.shape[1], item.num_target, item.num_prompt
    K = cfg.llm_config.num_key_value_heads
    G = cfg.llm_config.num_attention_heads // K
    # the packed rows of one pass, as unmasking.generate_codes builds them
    ids = np.concatenate([item.input_ids, item.uncond_ids], axis=1)  # [C, S] + [C, T] -> [C, N]
    audio_mask = np.concatenate([item.audio_mask, item.uncond_audio_mask])  # [N]
    pack, work = layer0_attention(m, ids, audio_mask, [S, T])
    x = work.x  # [N, D]
    probe = n_text + 1  # a target frame at position > 0, where the rotation is not the identity
    v.update(N=pack.num_tokens, starts=" and ".join(str(s) for s in pack.starts),
             x_shape=shape(x), x_text=floats(x[0, :4]), x_mask=floats(x[n_text, :4]),
             masks_equal=bool((x[n_text:] == x[n_text]).all()),
             q_shape=shape(work.q), k_shape=shape(work.k), qg_shape=shape(work.qg),
             attn_shape=shape(work.attn), cos_shape=shape(pack.cos), uncond_start=S,
             restart=bool((pack.cos[S] == 1).all()), probe=probe,
             q_raw=floats(work.q[probe, :4]), q_rot=floats(work.qg[0, probe, :4]))
    inv_freq = backbone.rope_inv_freq(cfg)
    v.update(num_freq=inv_freq.size, freq_first=f4(inv_freq[0]), freq_last=f4(inv_freq[-1]))

    # One row's weights: the conditional row alone leaves its own scores in the workspace,
    # unnormalised, with 1 / row sums beside them (see backbone.attention).
    _, alone = layer0_attention(m, item.input_ids, item.audio_mask, [S])
    lg = S * G
    scores = alone.scores[:K * lg * S].reshape(K, lg, S)  # [K, L*G, L]
    row = n_text * G  # query head 0 = kv head 0, group 0, at the first target frame
    w = scores[0, row] * alone.inv_sums[row]  # [S]
    v.update(weight_sum=f4(w.sum()), text_mass=f4(w[:n_text].sum()), uniform_text=f4(n_text / S),
             w_first=floats(w[:3]), w_self=f4(w[n_text]), w_next=f4(w[n_text + 1]),
             w_last=f4(w[-1]), uniform_one=f4(1 / S))
    return ids, audio_mask, pack


def stage_step_one(m: OmniVoice, item, ids, audio_mask, pack, v: dict) -> dict:
    """Section 6: the first step's logits, guided scores and chosen cells."""
    cfg = m.config
    C, T, mask = cfg.num_audio_codebook, item.num_target, cfg.audio_mask_id
    cond, uncond = (np.array(x) for x in
                    backbone.forward_rows(m.params, cfg, ids, audio_mask, pack, [T, T]))  # [C, T, V] each
    lp, tokens, confidence = scoring_kernels.guided_scores(cond, uncond, GEN.guidance_scale, mask)
    plain = scoring_kernels.log_softmax_np(cond)  # without guidance
    counts = unmasking.cells_per_step(C * T, GEN.num_step, GEN.t_shift)
    chosen = unmasking.choose_cells(confidence, np.zeros((C, T), bool), counts[0], GEN)
    picks = {divmod(int(i), T): int(tokens.reshape(-1)[i]) for i in chosen}  # (c, t) -> token
    plain_best = plain[0, 0, :mask]  # MASK excluded, as the scoring does
    v.update(logits_shape=shape(cond), cond_head=floats(cond[0, 0, :4]),
             uncond_head=floats(uncond[0, 0, :4]), lp_shape=shape(lp), lp_head=floats(lp[0, 0, :4]),
             lp_mask=f4(lp[0, 0, mask]), tok00=int(tokens[0, 0]), conf00=f4(confidence[0, 0]),
             plain_tok00=int(plain_best.argmax()), plain_conf00=f4(plain_best.max()), k1=counts[0],
             chosen="\n".join(f"({c}, {t:>2}) -> {tok}" for (c, t), tok in sorted(picks.items())))
    return picks


def stage_loop(m: OmniVoice, item, picks: dict, v: dict) -> np.ndarray:
    """Sections 7 to 9: cells per step, the whole loop, its codes."""
    C, T = m.config.num_audio_codebook, item.num_target
    t = unmasking.time_steps(GEN.num_step, GEN.t_shift)
    counts_per_step = unmasking.cells_per_step(C * T, GEN.num_step, GEN.t_shift)
    (codes,), (fills,) = unmasking.generate_codes(m.params, m.config, [item], GEN, seed=SEED,
                                                  return_fill_steps=True)  # [C, T] each
    first = {divmod(int(i), T) for i in np.flatnonzero(fills == 0)}
    if first != set(picks) or any(codes[c, t_] != tok for (c, t_), tok in picks.items()):
        raise AssertionError("the loop's first step filled other cells than section 6 shows")
    counts = [[int((fills[c] == s).sum()) for c in range(C)] for s in range(GEN.num_step)]
    rows = [[s + 1] + n + [sum(n)] for s, n in enumerate(counts)]
    v.update(t_grid=floats(t), cells=C * T, cells_per_step=", ".join(map(str, counts_per_step)),
             fill_table=table(["step"] + [f"cb {c}" for c in range(C)] + ["all"], rows),
             fill_map="\n".join("".join(str(s + 1) for s in fills[c]) for c in range(C)),
             last_codebook=C - 1, last_frame=T - 1, codes_shape=shape(codes),
             codes_min=int(codes.min()), codes_max=int(codes.max()))
    n = 8
    v["codes_table"] = table(["frame"] + [str(i) for i in range(n)],
                             [[f"codebook {c}"] + codes[c, :n].tolist() for c in range(C)])
    return codes


def stage_decoder(m: OmniVoice, codes: np.ndarray, v: dict) -> np.ndarray:
    """Sections 10 and 11: codes -> waveform, with the shapes on the way."""
    ccfg, dec = m.codec.cfg, m.codec.params.decoder
    with spy(higgs_codec, "dequantize") as latents, spy(higgs_codec, "conv_transpose1d") as ups:
        wav = higgs_codec.decode(m.codec.params, codes, ccfg)  # [C, T] -> [L]
    if len(latents) != 1 or not ups:
        raise AssertionError("higgs_codec.decode no longer calls dequantize / conv_transpose1d")
    rows = []
    for i, (args, kw, out) in enumerate(ups):
        rows.append([i + 1, kw["stride"], shape(args[0]), shape(out),
                     f4(np.sqrt(np.mean(np.square(out))))])
    v.update(latent_shape=shape(latents[0][2]), fc2_width=dec.fc2_w.shape[1],
             conv1_width=ups[0][0][0].shape[-1], hop=ccfg.hop_length,
             decoder_table=table(["block", "stride", "in", "out (transposed conv)", "RMS out"], rows),
             decoder_out_shape=f"[1, {wav.size}, 1]", num_samples=wav.size, sample_rate=ccfg.sample_rate,
             duration=f4(wav.size / ccfg.sample_rate), wav_min=f4(wav.min()), wav_max=f4(wav.max()),
             wav_rms=f4(np.sqrt(np.mean(np.square(wav)))))

    final = postprocess.postprocess_output(
        wav, None, postprocess=GEN.postprocess_output, pad_duration=GEN.pad_duration,
        fade_duration=GEN.fade_duration, sr=ccfg.sample_rate)
    v.update(peak=f"{postprocess.PEAK_TARGET:g}", pad=f"{GEN.pad_duration:g}", final_samples=final.size)

    # The public API, with the same settings, must agree with the stages traced here.
    out = m.synthesize(TEXT, language=LANGUAGE, seed=SEED, generation_config=GEN)[0]
    if not np.array_equal(out.codes, codes):
        raise AssertionError("OmniVoice.synthesize gives other codes than the stages traced here")
    if out.audio.shape != final.shape or not np.allclose(out.audio, final, atol=1e-6):
        raise AssertionError("OmniVoice.synthesize gives another waveform than the stages traced here")
    return wav


def stage_clone(m: OmniVoice, wav: np.ndarray, v: dict) -> None:
    """Section 12: the waveform as a voice prompt, through the codec's encoder."""
    ccfg = m.codec.cfg
    params = checkpoint.load_codec_encoder(m.codec.params, ccfg, m.codec.dir)
    feats = higgs_codec.encode_features(params, wav, ccfg)
    ref_codes = higgs_codec.quantize(params, feats["fused"], ccfg)  # [T, D] -> [C, R]
    R = ref_codes.shape[1]
    T = frontend.estimate_target_frames(TEXT, TEXT, R)
    clone = tok_mod.prepare_item(m.tokenizer, m.config, TEXT, T, ref_text=TEXT, ref_codes=ref_codes,
                                 lang=frontend.resolve_language(LANGUAGE))
    v.update(hubert_shape=shape(feats["semantic_hubert"]), semantic_shape=shape(feats["semantic"]),
             acoustic_shape=shape(feats["acoustic"]), fused_shape=shape(feats["fused"]),
             ref_codes_shape=shape(ref_codes), R=R, clone_text=clone.num_prompt - R, clone_T=T,
             clone_shape=shape(clone.input_ids))


def render() -> str:
    """Run every stage on the tiny checkpoint and return the page."""
    m = OmniVoice.from_pretrained(str(CHECKPOINT))
    if backend.name() != "numpy":
        raise SystemExit("the walkthrough reads the numpy backend's workspace: unset OMNICORE_BACKEND")
    v: dict = {}
    stage_dims(m, v)
    item = stage_text(m, v)
    ids, audio_mask, pack = stage_backbone(m, item, v)
    picks = stage_step_one(m, item, ids, audio_mask, pack, v)
    codes = stage_loop(m, item, picks, v)
    wav = stage_decoder(m, codes, v)
    stage_clone(m, wav, v)
    return PAGE.format(**v)


# ---------------------------------------------------------------------------------------------
# Comparing pages
# ---------------------------------------------------------------------------------------------

# A number standing on its own (not the 3 of "Qwen3"), perhaps ending a sentence: sign, digits,
# fraction, exponent.
NUMBER = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(?!\w|\.\d)")


def _same_number(a: str, b: str) -> bool:
    if re.fullmatch(r"-?\d+", a) and re.fullmatch(r"-?\d+", b):
        return a == b  # integers: ids, shapes, counts, codes
    if re.fullmatch(r"-?\d+", a) or re.fullmatch(r"-?\d+", b):
        return False
    return math.isclose(float(a), float(b), rel_tol=FLOAT_REL_TOL, abs_tol=FLOAT_ABS_TOL)


def differences(committed: str, fresh: str) -> list[str]:
    """Where two pages differ: the text and integers exactly, floats within FLOAT_REL_TOL.
    One line per differing line, empty when they agree."""
    old, new = committed.splitlines(), fresh.splitlines()
    if len(old) != len(new):
        return [f"the page has {len(old)} lines, a fresh run gives {len(new)}"]
    out = []
    for i, (a, b) in enumerate(zip(old, new), 1):
        pa, pb = NUMBER.split(a), NUMBER.split(b)  # text, number, text, ..., text
        same = len(pa) == len(pb) and all(
            x == y if k % 2 == 0 else _same_number(x, y) for k, (x, y) in enumerate(zip(pa, pb)))
        if not same:
            out.append(f"line {i}:\n  page:  {a}\n  fresh: {b}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed page instead of writing it; exit 1 if stale")
    args = ap.parse_args(argv)
    page = render()
    if args.check:
        diff = differences(PAGE_PATH.read_text(encoding="utf-8"), page)
        print("\n".join(diff) or f"{PAGE_PATH.relative_to(ROOT)} is up to date")
        return 1 if diff else 0
    PAGE_PATH.parent.mkdir(exist_ok=True)
    write_atomic(PAGE_PATH, lambda fh: fh.write(page.encode("utf-8")))
    print(f"wrote {PAGE_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
