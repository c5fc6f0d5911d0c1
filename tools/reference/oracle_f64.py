#!/usr/bin/env python3
"""The float64 oracle: the reference run in float64, stage by stage, beside its own float32 run.

    $OMNICORE_REF_VENV/bin/python tools/reference/oracle_f64.py --ckpt weights/tiny-random \
        --out build/oracle/tiny [--cases design,auto] [--num-step 8] [--no-codec]

omnicore is float32, and so is the reference it must match; neither is the truth. This runs the
reference (omnivoice 0.2.1 + transformers) in float64 (`from_pretrained(dtype=float32).double()`,
the codec too) and dumps what every stage computed, so that any float32 implementation can be
measured against it, next to the reference's own float32 on *the same inputs*
(benchmarks/accuracy_table.py reads these files).

Same inputs: every step of the unmasking loop feeds the targets filled so far, and two
implementations that disagree on one cell feed different inputs from then on. So the float64
run decides the trajectory: the targets it saw before each step (`tokens_in`) are stored, and
the float32 reference is replayed on exactly those (teacher forcing); so is omnicore.

Files (np.savez, uncompressed: float64 arrays are what this is for, so expect tens of MB):

  gen_<case>.npz, one generation case:
    case_json        the case (text, language, instruct, duration, ref, num_step)
    cond_ids         int64 [C, S]  the conditional row as prepared (targets all MASK)
    cond_mask        bool  [S]     its audio mask (uncond row = its last T positions)
    tokens_in        int64 [steps, C, T]  the float64 run's targets before each step
    codes64          int64 [C, T]  the float64 run's greedy codes (scoring in float64 too)
    codes32          int64 [C, T]  the reference's own float32 `_generate_iterative` codes
    probe_steps      int64 [P]     steps whose layers are dumped (--probe-steps; first, middle, last)
    x64_* / x32_*    float64 / float32 stage tensors, reference in float64 / float32:
      embeds_c [P, S, D], embeds_u [P, T, D]     fused input embeddings (cond / uncond row)
      hidden_c [P, layers, S, D], hidden_u [P, layers, T, D]   residual stream after each layer
      logits_c [P, C, T, V], logits_u [P, C, T, V]   audio heads at the target positions
      lp   [steps, C, T, V]  guided log-probs (MASK column -inf), every step
      conf [steps, C, T]     confidences (max lp), every step
  codec.npz (unless --no-codec): the encoder on the speech fixture, and the decoder:
    input            float32 [L] the padded 24 kHz clip
    x64_* / x32_*    hubert_states [layers+1, F, Ds], semantic_hubert [T, Ds], semantic [T, Ds],
                     acoustic [T, Ca], fused [T, D], residuals [Q, T, D] (the residual each
                     quantizer saw, along that precision's own codes), codes [Q, T] (int64)
    dec_codes        int64 [Q, T]  random codes;  x64_wave / x32_wave [960 T] their decode
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from dump_codec import SPEECH_WAV, _encoder_tensors, speech_clip  # noqa: E402

# The generation cases: the modes of the generate fixtures (dump_generate.py), greedy.
CASES = {
    "auto": dict(text="Nice to meet you, this is a quick test.", language="English"),
    "design": dict(text="Good evening, everyone.", instruct="female, low pitch, british accent",
                   duration=1.6),
    "design_zh": dict(text="今天天气很好，我们去散步吧。", language="zh", instruct="female, low pitch"),
    "clone": dict(text="See you tomorrow at noon.", language="en", ref="speech_24k.wav"),
}
GREEDY = dict(position_temperature=0.0, class_temperature=0.0)


def load(ckpt: Path, dtype):
    """The reference, its codec included, in `dtype`."""
    from omnivoice.models.omnivoice import OmniVoice

    model = OmniVoice.from_pretrained(str(ckpt), dtype=torch.float32)
    model = model.to(dtype).eval()
    model.audio_tokenizer = model.audio_tokenizer.to(dtype).eval()
    # the reference hands its codec float32 clips: cast them to the codec's precision
    encode = model.audio_tokenizer.encode
    model.audio_tokenizer.encode = lambda x, *a, **k: encode(x.to(dtype), *a, **k)
    return model


def make_task(model, case: dict):
    """The GenerationTask the reference's generate() would run for `case` (one item)."""
    call = dict(text=case["text"], language=case.get("language"), instruct=case.get("instruct"),
                duration=case.get("duration"))
    if case.get("ref"):
        call["ref_audio"] = str(ROOT / "tests" / "fixtures" / "audio" / case["ref"])
        call["ref_text"] = case.get("ref_text") or (SPEECH_WAV.parent / "speech.txt").read_text().strip()
    return model._preprocess_all(**call)


def gen_config(case: dict, num_step: int):
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    return OmniVoiceGenerationConfig(num_step=num_step, **GREEDY, **case.get("gen", {}))


def guided_log_probs(c_logits, u_logits, guidance: float, mask_id: int):
    """The reference's `_predict_tokens_with_scoring` formula, log-probs kept (it returns
    only their argmax and max): log_softmax(c + g (c - u)) of the two log-softmaxes."""
    F = torch.nn.functional
    if guidance != 0:
        c, u = F.log_softmax(c_logits, dim=-1), F.log_softmax(u_logits, dim=-1)
        lp = torch.log_softmax(c + guidance * (c - u), dim=-1)
    else:
        lp = F.log_softmax(c_logits, dim=-1)
    lp[..., mask_id] = -float("inf")
    return lp


class Rows:
    """The padded two-row batch (cond, uncond) of one item, as `_generate_iterative` builds it."""

    def __init__(self, model, task):
        assert task.batch_size == 1
        inp = model._prepare_inference_inputs(task.texts[0], task.target_lens[0], task.ref_texts[0],
                                              task.ref_audio_tokens[0], task.langs[0],
                                              task.instructs[0], True)
        self.cond_ids, self.cond_mask = inp["input_ids"][0], inp["audio_mask"][0]
        C, S = self.cond_ids.shape
        T = self.T = task.target_lens[0]
        self.S = S
        self.ids = torch.full((2, C, S), model.config.audio_mask_id, dtype=torch.long)
        self.mask = torch.zeros((2, S), dtype=torch.bool)
        self.attn = torch.zeros((2, 1, S, S), dtype=torch.bool)
        self.ids[0], self.mask[0], self.attn[0] = self.cond_ids, self.cond_mask, True
        self.ids[1, :, :T], self.mask[1, :T] = self.cond_ids[:, -T:], self.cond_mask[-T:]
        self.attn[1, :, :T, :T] = True
        pad = torch.arange(T, S)
        self.attn[1, :, pad, pad] = True

    def set_targets(self, tokens):  # tokens [C, T]
        self.ids[0, :, self.S - self.T:] = tokens
        self.ids[1, :, :self.T] = tokens

    def targets(self):
        return self.ids[0, :, self.S - self.T:].clone()


class StageRecorder:
    """Hooks that keep the embeddings, every layer's output and the logits of one forward."""

    def __init__(self, model):
        self.on = False
        self.x = {}
        self.handles = [model.llm.register_forward_pre_hook(self._embeds, with_kwargs=True)]
        for i, layer in enumerate(model.llm.layers):
            self.handles.append(layer.register_forward_hook(self._layer(i)))

    def _embeds(self, module, args, kwargs):
        if self.on:
            self.x["embeds"] = kwargs["inputs_embeds"].detach().clone()

    def _layer(self, i):
        def hook(module, args, output):
            if self.on:
                out = output[0] if isinstance(output, tuple) else output
                self.x.setdefault("layers", []).append(out.detach().clone())
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def run_loop(model, task, gen, tokens_in=None, probes=()):
    """The unmasking loop of `_generate_iterative` for one item, scoring in the model's own
    precision (the reference casts logits to float32 first; in float32 that is a no-op, and the
    codes are checked equal to its own). With `tokens_in` [steps, C, T] the targets are forced
    to those before each step (the float32 replay); without, the loop follows its own picks.
    Returns (codes [C, T], tokens_in [steps, C, T], stages: dict of numpy arrays)."""
    rows = Rows(model, task)
    C, T, S = model.config.num_audio_codebook, rows.T, rows.S
    sched = schedule(C * T, gen)
    layer_ids = torch.arange(C).view(1, -1, 1)
    tokens = torch.full((1, C, T), model.config.audio_mask_id, dtype=torch.long)
    rec = StageRecorder(model)
    seen, st = [], {k: [] for k in ("embeds_c", "embeds_u", "hidden_c", "hidden_u", "logits_c",
                                    "logits_u", "lp", "conf")}
    try:
        with torch.inference_mode():
            for step in range(gen.num_step):
                if tokens_in is not None:
                    tokens[0] = torch.from_numpy(tokens_in[step])
                rows.set_targets(tokens[0])
                seen.append(rows.targets().numpy().copy())
                rec.on, rec.x = step in probes, {}
                logits = model(input_ids=rows.ids, audio_mask=rows.mask, attention_mask=rows.attn).logits
                c_logits, u_logits = logits[0:1, :, S - T:S], logits[1:2, :, :T]
                lp = guided_log_probs(c_logits, u_logits, gen.guidance_scale, model.config.audio_mask_id)
                pred, conf = model._predict_tokens_with_scoring(c_logits, u_logits, gen)
                assert torch.equal(pred, lp.argmax(-1)) and torch.equal(conf, lp.max(-1)[0])
                st["lp"].append(lp[0].numpy().copy())
                st["conf"].append(conf[0].numpy().copy())
                if rec.on:
                    x = rec.x
                    st["embeds_c"].append(x["embeds"][0].numpy().copy())
                    st["embeds_u"].append(x["embeds"][1, :T].numpy().copy())
                    st["hidden_c"].append(np.stack([h[0].numpy() for h in x["layers"]]))
                    st["hidden_u"].append(np.stack([h[1, :T].numpy() for h in x["layers"]]))
                    st["logits_c"].append(c_logits[0].numpy().copy())
                    st["logits_u"].append(u_logits[0].numpy().copy())
                k = sched[step]
                if k <= 0:
                    continue
                scores = conf - layer_ids * gen.layer_penalty_factor
                scores = scores.masked_fill(tokens != model.config.audio_mask_id, -float("inf"))
                _, top = torch.topk(scores.flatten(), k)
                flat = tokens.flatten()
                flat[top] = pred.flatten()[top]
                tokens = flat.view_as(tokens)
    finally:
        rec.close()
    stages = {k: np.stack(v) for k, v in st.items() if v}
    return tokens[0].numpy().astype(np.int64), np.stack(seen).astype(np.int64), stages


def schedule(num_cells: int, gen) -> list[int]:
    """Cells filled at each step, as `_generate_iterative` counts them."""
    from omnivoice.models.omnivoice import _get_time_steps

    t = _get_time_steps(t_start=0.0, t_end=1.0, num_step=gen.num_step, t_shift=gen.t_shift).tolist()
    rem, sched = num_cells, []
    for step in range(gen.num_step):
        k = rem if step == gen.num_step - 1 else min(math.ceil(num_cells * (t[step + 1] - t[step])), rem)
        sched.append(int(k))
        rem -= int(k)
    return sched


def reference_codes(model, task, gen) -> np.ndarray:
    """The reference's own `_generate_iterative` (float32 scoring whatever the model's dtype)."""
    with torch.inference_mode():
        return model._generate_iterative(task, gen)[0].numpy().astype(np.int64)


def generation_case(m64, m32, case: dict, num_step: int, probes=None) -> dict:
    task64 = make_task(m64, case)
    task32 = make_task(m32, case)
    # One set of inputs for everyone: the float64 prompt codes (clone mode) and target length.
    task32.ref_audio_tokens, task32.target_lens = task64.ref_audio_tokens, task64.target_lens
    gen = gen_config(case, num_step)
    probes = sorted(probes or {0, num_step // 2, num_step - 1})
    codes64, tokens_in, x64 = run_loop(m64, task64, gen, probes=probes)
    _, forced, x32 = run_loop(m32, task32, gen, tokens_in=tokens_in, probes=probes)
    assert np.array_equal(forced, tokens_in)
    codes32 = reference_codes(m32, task32, gen)
    own32, _, _ = run_loop(m32, task32, gen)
    assert np.array_equal(own32, codes32), "the oracle's loop drifted from _generate_iterative"
    rows = Rows(m64, task64)
    out = {
        "case_json": np.array(json.dumps({**case, "num_step": num_step}, ensure_ascii=False)),
        "cond_ids": rows.cond_ids.numpy().astype(np.int64),
        "cond_mask": rows.cond_mask.numpy().astype(bool),
        "tokens_in": tokens_in,
        "codes64": codes64,
        "codes32": codes32,
        "probe_steps": np.array(probes, np.int64),
    }
    out.update({f"x64_{k}": v.astype(np.float64) for k, v in x64.items()})
    out.update({f"x32_{k}": v.astype(np.float32) for k, v in x32.items()})
    return out


def codec_case(m64, m32, seed: int = 1234) -> dict:
    c64, c32 = m64.audio_tokenizer, m32.audio_tokenizer
    cfg = c32.config
    clip = speech_clip(cfg.sample_rate)
    clip = np.pad(clip, (0, -len(clip) % cfg.hop_length)).astype(np.float32)  # the feature extractor's rule
    out = {"input": clip}
    for tag, codec, dtype in (("x64", c64, np.float64), ("x32", c32, np.float32)):
        for k, v in _encoder_tensors(codec, clip.astype(dtype)).items():
            out[f"{tag}_{k}"] = v
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, cfg.codebook_size, size=(cfg.num_quantizers, 50), dtype=np.int64)
    out["dec_codes"] = codes
    with torch.no_grad():
        for tag, codec in (("x64", c64), ("x32", c32)):
            out[f"{tag}_wave"] = codec.decode(torch.from_numpy(codes)[None]).audio_values[0, 0].numpy()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, default=ROOT / "weights" / "tiny-random")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--case-json", help="one case of your own instead, as JSON: name, text and any "
                    "of language, instruct, duration, ref (e.g. a property case, to see where it turns)")
    ap.add_argument("--num-step", type=int, default=8)
    ap.add_argument("--probe-steps", help="comma-separated steps whose layers and logits are dumped "
                    "(default: first, middle, last)")
    ap.add_argument("--no-codec", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    m64, m32 = load(args.ckpt, torch.float64), load(args.ckpt, torch.float32)
    cases = dict(CASES)
    if args.case_json:
        own = json.loads(args.case_json)
        cases = {own.pop("name"): own}
    for name in (cases if args.case_json else args.cases.split(",")):
        probes = [int(x) for x in args.probe_steps.split(",")] if args.probe_steps else None
        arrs = generation_case(m64, m32, cases[name], args.num_step, probes)
        np.savez(args.out / f"gen_{name}.npz", **arrs)
        same = np.array_equal(arrs["codes64"], arrs["codes32"])
        print(f"{name}: T={arrs['codes64'].shape[1]} reference f32 codes "
              f"{'equal' if same else 'DIFFER from'} f64 ({(arrs['codes64'] == arrs['codes32']).mean():.0%} of cells)")
    if not args.no_codec:
        arrs = codec_case(m64, m32)
        np.savez(args.out / "codec.npz", **arrs)
        print(f"codec: encoder codes f32 vs f64 equal in {(arrs['x64_codes'] == arrs['x32_codes']).mean():.2%} of cells")


if __name__ == "__main__":
    main()
