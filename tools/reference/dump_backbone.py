"""Dump the reference backbone and unmasking loop, stage by stage, for omnicore's tests.

Runs the installed reference (omnivoice 0.2.1 on torch, float32) on a checkpoint in the hub
layout (weights/tiny-random by default) and writes tests/fixtures/reference/backbone_*.npz:

  backbone_tokenizer.npz  text cleaning and token ids of tricky strings (tags, CJK, specials)
  backbone_schedule.npz   the float32 time grid and per-step unmask counts for many settings
  backbone_batch.npz      a batch of three items (auto / voice design / clone with reference
                          codes and denoise) with different lengths, greedy unmasking:
                          prepared inputs, step-0 embeddings, hidden states after selected
                          layers, final hidden states, step-0 logits of one item, and at every
                          step the predicted tokens, confidences and the cells filled; final codes
  backbone_single.npz     single items with a non-verbal-tag text, a CJK text and guidance 0

Each array name is documented where it is written. Floats are float32, ids int64, strings
fixed-width unicode; no pickles. Deterministic: all seeds fixed, greedy decoding.

Run with the reference venv: $OMNICORE_REF_VENV/bin/python tools/reference/dump_backbone.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CKPT = ROOT / "weights" / "tiny-random"
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "reference"

# Deterministic decoding: both temperatures 0, other knobs at the reference defaults.
GREEDY = dict(num_step=32, guidance_scale=2.0, t_shift=0.1, layer_penalty_factor=5.0,
              position_temperature=0.0, class_temperature=0.0, denoise=True)

TOKENIZER_STRINGS = [
    "Hello world, this is a test.",
    "  Leading and trailing spaces  ",
    "I can't believe it [laughter] really [sigh] ok.",
    "[laughter]",
    "[question-en] what? [surprise-wa][dissatisfaction-hnn]",
    "a [not-a-tag] b [Laughter]",
    "你好 世界（测试） today  is\tgood\n",
    "第二行\r\n第三行 ok",
    "Numbers 12345 and émojis 🙂 é vs e\u0301",
    "<|text_start|>already wrapped<|text_end|>",
    "tabs\t\tand   spaces",
    "",
]
COMBINE_PAIRS = [
    ("Hello world.", None),
    ("Hello world.", ""),
    ("  target text ", "  Reference words. "),
    ("今天 天气 很好", "我们 去 公园"),
    ("mixed 中文 text", "line\none\r\ntwo"),
    ("（括号） and (ascii)", None),
    ("a\t\tb    c", "x \t y"),
]


def load_reference(ckpt_dir: Path, dtype=torch.float32):
    """The reference model (train=True skips the codec: only the backbone is needed) and its
    text tokenizer, exactly as OmniVoice.from_pretrained sets them up."""
    from transformers import AutoTokenizer

    from omnivoice.models.omnivoice import OmniVoice

    model = OmniVoice.from_pretrained(str(ckpt_dir), dtype=dtype, train=True)
    model = model.to(dtype).eval()
    model.text_tokenizer = AutoTokenizer.from_pretrained(str(ckpt_dir))
    return model


def _ragged(seqs):
    """Concatenate integer lists; return (flat int64, offsets int64 [n+1])."""
    flat = np.array([i for s in seqs for i in s], dtype=np.int64)
    offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    return flat, offsets


def dump_tokenizer(model) -> dict:
    from omnivoice.models.omnivoice import _combine_text, _tokenize_with_nonverbal_tags

    tok = model.text_tokenizer
    plain = [tok(s).input_ids for s in TOKENIZER_STRINGS]
    tagged = [_tokenize_with_nonverbal_tags(s, tok)[0].tolist() for s in TOKENIZER_STRINGS]
    combined = [_combine_text(text=t, ref_text=r) for t, r in COMBINE_PAIRS]
    out = {
        "strings": np.array(TOKENIZER_STRINGS),  # [n] unicode
        "combine_text": np.array([t for t, _ in COMBINE_PAIRS]),
        "combine_ref": np.array(["<None>" if r is None else r for _, r in COMBINE_PAIRS]),
        "combine_out": np.array(combined),
        "special_tokens": np.array(["<|denoise|>", "<|lang_start|>", "<|lang_end|>",
                                    "<|instruct_start|>", "<|instruct_end|>", "<|text_start|>",
                                    "<|text_end|>"]),
    }
    out["special_ids"] = np.array([tok.convert_tokens_to_ids(t) for t in out["special_tokens"]],
                                  dtype=np.int64)
    out["plain_ids"], out["plain_offsets"] = _ragged(plain)  # tokenizer(s).input_ids
    out["tagged_ids"], out["tagged_offsets"] = _ragged(tagged)  # _tokenize_with_nonverbal_tags
    return out


def dump_schedule() -> dict:
    """Time grids and per-step counts, computed as _generate_iterative does."""
    import math

    from omnivoice.models.omnivoice import _get_time_steps

    shifts = np.array([0.1, 0.05, 0.3, 0.5, 1.0, 2.0, 0.123], dtype=np.float64)
    max_step = 64
    grids = np.full((len(shifts), max_step + 1, max_step + 1), np.nan, dtype=np.float32)
    for a, s in enumerate(shifts):
        for n in range(1, max_step + 1):
            grids[a, n, : n + 1] = _get_time_steps(0.0, 1.0, n, float(s)).numpy()
    cases, counts = [], []
    for num_cells in (8, 8 * 7, 8 * 25, 8 * 163, 8 * 751):
        for n in (1, 2, 8, 16, 32, 33, 64):
            for s in (0.1, 0.3, 1.0):
                ts = _get_time_steps(0.0, 1.0, n, s).tolist()
                rem, sched = num_cells, []
                for step in range(n):
                    k = rem if step == n - 1 else min(math.ceil(num_cells * (ts[step + 1] - ts[step])), rem)
                    sched.append(int(k))
                    rem -= int(k)
                cases.append((num_cells, n, s))
                counts.append(sched + [-1] * (max_step - n))
    return {
        "shifts": shifts,  # [a]
        "grids": grids,  # [a, num_step, i]: t_i of _get_time_steps(num_step, shift a), NaN-padded
        "case_cells": np.array([c[0] for c in cases], dtype=np.int64),
        "case_steps": np.array([c[1] for c in cases], dtype=np.int64),
        "case_shift": np.array([c[2] for c in cases], dtype=np.float64),
        "case_counts": np.array(counts, dtype=np.int64),  # [case, max_step], -1 padded
    }


class Recorder:
    """Hooks that see every backbone call of one _generate_iterative run."""

    def __init__(self, model, layers_to_keep):
        self.model = model
        self.calls = []  # per forward: dict of input_ids / audio_mask / attention_mask
        self.first = {}  # step-0 internals
        self.predictions = []  # per _predict_tokens_with_scoring call: (tokens, scores)
        self.handles = [
            model.register_forward_pre_hook(self._on_model_in, with_kwargs=True),
            model.register_forward_hook(self._on_model_out, with_kwargs=True),
            model.llm.register_forward_pre_hook(self._on_llm_in, with_kwargs=True),
            model.llm.register_forward_hook(self._on_llm_out, with_kwargs=True),
        ]
        for i in layers_to_keep:
            self.handles.append(model.llm.layers[i].register_forward_hook(self._layer_hook(i)))
        original = model._predict_tokens_with_scoring

        def predict(c_logits, u_logits, gen_config):
            tokens, scores = original(c_logits, u_logits, gen_config)
            self.predictions.append((tokens[0].clone(), scores[0].clone()))
            return tokens, scores

        model._predict_tokens_with_scoring = predict

    def _on_model_in(self, module, args, kwargs):
        self.calls.append({k: kwargs[k].clone() for k in ("input_ids", "audio_mask", "attention_mask")})

    def _on_model_out(self, module, args, kwargs, output):
        if len(self.calls) == 1:
            self.first["logits"] = output.logits.detach().clone()

    def _on_llm_in(self, module, args, kwargs):
        if len(self.calls) == 1:
            self.first["embeds"] = kwargs["inputs_embeds"].detach().clone()

    def _on_llm_out(self, module, args, kwargs, output):
        if len(self.calls) == 1:
            self.first["final"] = output[0].detach().clone()

    def _layer_hook(self, i):
        def hook(module, args, output):
            if len(self.calls) == 1:
                out = output[0] if isinstance(output, tuple) else output
                self.first[f"layer{i}"] = out.detach().clone()
        return hook

    def close(self):
        for h in self.handles:
            h.remove()
        del self.model._predict_tokens_with_scoring


def run_iterative(model, specs, gen_kwargs, layers_to_keep=()):
    """Run _generate_iterative on items given as dicts; return the recorder and the codes."""
    from omnivoice.models.omnivoice import GenerationTask, OmniVoiceGenerationConfig

    task = GenerationTask(
        batch_size=len(specs),
        texts=[s["text"] for s in specs],
        target_lens=[s["T"] for s in specs],
        langs=[s.get("lang") for s in specs],
        instructs=[s.get("instruct") for s in specs],
        ref_texts=[s.get("ref_text") for s in specs],
        ref_audio_tokens=[None if s.get("ref_codes") is None else torch.from_numpy(s["ref_codes"])
                          for s in specs],
        ref_rms=[None] * len(specs),
    )
    gen = OmniVoiceGenerationConfig(**gen_kwargs)
    rec = Recorder(model, layers_to_keep)
    try:
        with torch.inference_mode():
            codes = model._generate_iterative(task, gen)
    finally:
        rec.close()
    return rec, [c.numpy().astype(np.int64) for c in codes]


def item_arrays(model, specs, rec, codes, gen_kwargs, prefix=""):
    """Per-item prepared inputs and the step-by-step record of the unmasking."""
    out = {}
    B = len(specs)
    mask_id = model.config.audio_mask_id
    for b, s in enumerate(specs):
        p = f"{prefix}item{b}_"
        inp = model._prepare_inference_inputs(
            s["text"], s["T"], s.get("ref_text"),
            None if s.get("ref_codes") is None else torch.from_numpy(s["ref_codes"]),
            s.get("lang"), s.get("instruct"), gen_kwargs["denoise"])
        ids = inp["input_ids"][0].numpy().astype(np.int64)
        S, T = ids.shape[1], s["T"]
        out[p + "input_ids"] = ids  # [C, S] conditional row
        out[p + "audio_mask"] = inp["audio_mask"][0].numpy()  # [S] bool
        out[p + "text"] = np.array(s["text"])
        out[p + "ref_text"] = np.array(s.get("ref_text") or "")
        out[p + "lang"] = np.array(s.get("lang") or "")
        out[p + "instruct"] = np.array(s.get("instruct") or "")
        out[p + "num_target"] = np.array(T, dtype=np.int64)
        out[p + "denoise"] = np.array(bool(gen_kwargs["denoise"]))
        if s.get("ref_codes") is not None:
            out[p + "ref_codes"] = s["ref_codes"].astype(np.int64)  # [C, R]
        # The targets as the model saw them at each step (cond row, before that step's update).
        seen = np.stack([c["input_ids"][b, :, S - T:S].numpy() for c in rec.calls])  # [steps, C, T]
        # check the batch really held this item's row as prepared
        assert np.array_equal(rec.calls[0]["input_ids"][b, :, :S].numpy(), ids)
        after = np.concatenate([seen[1:], codes[b][None]], axis=0)  # [steps, C, T]
        newly = (seen == mask_id) & (after != mask_id)
        fill_step = np.full(seen.shape[1:], -1, dtype=np.int64)
        for step in range(seen.shape[0]):
            fill_step[newly[step]] = step
        assert (fill_step >= 0).all()
        out[p + "fill_step"] = fill_step  # [C, T] step at which each cell was filled
        out[p + "codes"] = codes[b]  # [C, T] final codes
    # Predictions: _predict_tokens_with_scoring is called per step for every item with k > 0,
    # in item order. With every schedule entry > 0 that is steps * B calls.
    n_steps = len(rec.calls)
    assert len(rec.predictions) == n_steps * B, (len(rec.predictions), n_steps, B)
    for b in range(B):
        p = f"{prefix}item{b}_"
        out[p + "pred_tokens"] = np.stack([rec.predictions[st * B + b][0].numpy()
                                           for st in range(n_steps)]).astype(np.int64)  # [steps, C, T]
        out[p + "scores"] = np.stack([rec.predictions[st * B + b][1].numpy()
                                      for st in range(n_steps)]).astype(np.float32)  # [steps, C, T]
    return out


def dump(ckpt_dir: Path, out_dir: Path) -> list[Path]:
    ckpt_dir, out_dir = Path(ckpt_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = load_reference(ckpt_dir)
    from omnivoice.models.omnivoice import _resolve_instruct, _resolve_language

    C = model.config.num_audio_codebook
    n_layers = model.config.llm_config.num_hidden_layers
    keep = sorted({0, n_layers // 2, n_layers - 1})
    rng = np.random.default_rng(1234)
    written = []

    def save(name, arrays):
        path = out_dir / name
        np.savez_compressed(path, **arrays)
        written.append(path)

    save("backbone_tokenizer.npz", dump_tokenizer(model))
    save("backbone_schedule.npz", dump_schedule())

    # --- batch of three, different modes and lengths ---------------------------------------
    batch = [
        dict(text="Hello world, this is a test of the backbone.", T=64),
        dict(text="A voice designed from words.", T=12, lang=_resolve_language("English"),
             instruct=_resolve_instruct("female, low pitch")),
        dict(text="今天天气很好 and we clone.", T=30, lang=_resolve_language("zh"),
             ref_text="Reference words spoken here.",
             ref_codes=rng.integers(0, 1024, size=(C, 20))),
    ]
    rec, codes = run_iterative(model, batch, GREEDY, keep)
    arrays = item_arrays(model, batch, rec, codes, GREEDY)
    B = len(batch)
    first = rec.calls[0]
    c_lens = [arrays[f"item{b}_input_ids"].shape[1] for b in range(B)]
    t_lens = [s["T"] for s in batch]
    # Step-0 internals, rows unpadded and packed back to back in the order
    # cond_0..cond_{B-1}, uncond_0..uncond_{B-1}  (row lengths in `row_lengths`).
    lengths = c_lens + t_lens

    def packed(t):  # [2B, S_max, D] padded -> [N, D]
        return np.concatenate([t[r, :L].numpy() for r, L in enumerate(lengths)]).astype(np.float32)

    arrays["row_lengths"] = np.array(lengths, dtype=np.int64)
    arrays["embeds"] = packed(rec.first["embeds"])  # [N, D] fused input embeddings
    for i in keep:
        arrays[f"hidden_layer{i}"] = packed(rec.first[f"layer{i}"])  # [N, D] after layer i
    arrays["kept_layers"] = np.array(keep, dtype=np.int64)
    arrays["final_hidden"] = packed(rec.first["final"])  # [N, D] after the final norm
    # Uncond rows as the reference fed them: check they hold the targets only.
    for b in range(B):
        assert np.array_equal(first["input_ids"][B + b, :, :t_lens[b]].numpy(),
                              arrays[f"item{b}_input_ids"][:, -t_lens[b]:])
    # Step-0 logits of item 1 only (the full [C, T, V] of the others would be too large).
    lg = rec.first["logits"]
    arrays["item1_cond_logits"] = lg[1, :, c_lens[1] - t_lens[1]:c_lens[1]].numpy().astype(np.float32)
    arrays["item1_uncond_logits"] = lg[B + 1, :, :t_lens[1]].numpy().astype(np.float32)
    for k, v in GREEDY.items():
        arrays[f"gen_{k}"] = np.array(v)

    # The same batch in float64: identical codes mean no near-ties decide the fixture.
    model64 = load_reference(ckpt_dir, torch.float64)
    _, codes64 = run_iterative(model64, batch, GREEDY)
    arrays["float64_agrees"] = np.array(all(np.array_equal(a, b) for a, b in zip(codes, codes64)))
    if not arrays["float64_agrees"]:
        print("WARNING: float64 reference codes differ from float32: the fixture has near-ties",
              file=sys.stderr)
    del model64
    save("backbone_batch.npz", arrays)

    # --- single items: non-verbal tags, CJK, no guidance ----------------------------------
    singles = {}
    cases = [
        ("tags", dict(text="I can't believe it [laughter] really [sigh] ok.", T=24), GREEDY),
        ("cjk", dict(text="你好 世界（测试） today  is\tgood\n", T=20,
                     lang=_resolve_language("Chinese")), GREEDY),
        ("noguide", dict(text="No guidance at all.", T=16),
         dict(GREEDY, guidance_scale=0.0, num_step=10, t_shift=0.3)),
    ]
    for name, spec, gen in cases:
        rec, codes = run_iterative(model, [spec], gen)
        singles.update(item_arrays(model, [spec], rec, codes, gen, prefix=f"{name}_"))
        for k, v in gen.items():
            singles[f"{name}_gen_{k}"] = np.array(v)
    save("backbone_single.npz", singles)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, default=DEFAULT_CKPT)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(2)
    for path in dump(args.ckpt, args.out):
        print(f"{path}  {path.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
