#!/usr/bin/env python3
"""Build a randomly initialised OmniVoice checkpoint in the exact hub layout.

    $OMNICORE_REF_VENV/bin/python tools/reference/make_checkpoint.py --size tiny --out weights/tiny-random
    $OMNICORE_REF_VENV/bin/python tools/reference/make_checkpoint.py --size full --out checkpoints/full

Layout written to OUT (same file names, config field names and tensor keys as k2-fsa/OmniVoice):

    config.json                  OmniVoiceConfig + nested Qwen3 llm_config
    model.safetensors            llm.*, audio_embeddings.weight, audio_heads.weight,
                                 codebook_layer_offsets (I64); no lm_head
    tokenizer.json               Qwen2-style byte-level BPE trained on corpus.txt
    tokenizer_config.json
    audio_tokenizer/config.json  HiggsAudioV2TokenizerConfig with the checkpoint's real DAC ratios
    audio_tokenizer/model.safetensors
    audio_tokenizer/preprocessor_config.json

Every tensor is drawn from numpy's PCG64 seeded by (seed, crc32(key)), so a tensor depends only on
the seed and its own name and the files are byte-identical for a given seed. The scales are chosen
so that tests on random weights can fail (see README.md, "Random-weight scaling"):
  * no tensor keeps a constant value (norm weights, Snake alphas, biases, RVQ codebooks);
  * convs use a fan-in scale with per-family gains so the codec neither vanishes nor explodes;
  * q/k norm weights in [2, 4] make attention sharp, audio heads are scaled so logits are peaked.

Only torch modules on the meta device are built here (for names and shapes); no forward pass, so
nothing data-dependent enters the weights. They give a *plan* (key -> shape and drawing rule, plain
JSON); `draw_tensors` and `write_checkpoint` need no torch, which is how the property tests
(tests/test_accuracy_property.py) rebuild, byte for byte, the checkpoints that
dump_property.py drew: importing this module imports numpy only.
"""

from __future__ import annotations

import argparse
import json
import os
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.txt"
DEFAULT_SEED = 1234

# Qwen2/Qwen3 pre-tokenizer split (the same regex the real tokenizer.json carries).
QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added tokens in the order (and with the special flag) of the real tokenizer: Qwen3's 26 added
# tokens sit right after the BPE vocabulary (151643..151668 in the real one), then OmniVoice's 7
# (151669..151675).
QWEN_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]
OMNIVOICE_ADDED = [
    "<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>",
    "<|instruct_end|>", "<|text_start|>", "<|text_end|>",
]
REAL_BPE_VOCAB = 151643  # ids 0..151642 are BPE tokens in the real tokenizer

SIZES = {
    "tiny": {
        "bpe_vocab": 1000,  # >= 1025 ids in all: the reference also looks up MASK (1024) in embed_tokens
        "llm": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=128),
        "codec": dict(codebook_dim=32, codebook_size=1024,
                      acoustic=dict(encoder_hidden_size=2, decoder_hidden_size=64, hidden_size=32),
                      semantic=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, conv_dim=[32] * 7)),
    },
    "full": {
        "bpe_vocab": None,  # padded to REAL_BPE_VOCAB
        "llm": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                    num_key_value_heads=8, head_dim=128, intermediate_size=3072),
        "codec": dict(codebook_dim=64, codebook_size=1024,
                      acoustic=dict(encoder_hidden_size=64, decoder_hidden_size=1024, hidden_size=256),
                      semantic=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                    intermediate_size=3072, conv_dim=[512] * 7)),
    },
}

# Logit scale of the audio heads: std of a logit when the final-normed hidden state has rms 1.
AUDIO_HEAD_LOGIT_STD = 4.0
# Gains (multiplying 1/sqrt(fan_in)) of the codec conv families, tuned by measuring rms through
# the decoder and encoder on random codes / noise (numbers in README.md).
GAIN_RES_BRANCH_CONV = 0.6   # dilated k7 conv inside each DAC residual unit
GAIN_RES_OUT_CONV = 0.5      # k1 conv closing a residual unit (kept small: residual sums grow)
GAIN_UP_DOWN_CONV = 1.0      # strided conv / transposed conv between blocks
GAIN_DEC_OUT_CONV = 0.06     # final 1-channel conv: sets the waveform level (rms ~0.2)
GAIN_HUBERT_FEATURE_CONV = 1.6  # HuBERT conv feature encoder: GELU halves the energy per layer


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------

def build_tokenizer(out: Path, bpe_vocab: int | None) -> dict:
    """Train the byte-level BPE on corpus.txt, append the added tokens, write both json files."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors, trainers

    lines = [ln for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab or 1024,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable
        special_tokens=[],
    )
    tok.train_from_iterator(lines, trainer=trainer)

    if bpe_vocab is None:
        # Full size: pad the BPE vocabulary with unreachable entries so that the added tokens
        # land on their real ids (151643..151675).
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        n = len(vocab)
        for i in range(n, REAL_BPE_VOCAB):
            vocab[f"<|pad_{i}|>"] = i
        tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    n_bpe = tok.get_vocab_size(with_added_tokens=False)

    for content, special in QWEN_ADDED:
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False,
                       special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
    for content in OMNIVOICE_ADDED:
        tok.add_special_tokens([AddedToken(content, single_word=False, lstrip=False, rstrip=False,
                                           normalized=False, special=True)])
    ids = {c: tok.token_to_id(c) for c, _ in QWEN_ADDED}
    ids.update({c: tok.token_to_id(c) for c in OMNIVOICE_ADDED})
    assert ids["<|endoftext|>"] == n_bpe and ids["<|text_end|>"] == n_bpe + 32, ids

    spec = json.loads(tok.to_str())
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False, indent=2) + "\n",
                                        encoding="utf-8")

    flags = dict(QWEN_ADDED) | {c: True for c in OMNIVOICE_ADDED}
    tk_cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[c]): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": flags[c]}
            for c in flags
        },
        "additional_special_tokens": [c for c, s in QWEN_ADDED if s and c != "<|endoftext|>"]
        + OMNIVOICE_ADDED,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tk_cfg, ensure_ascii=False, indent=2) + "\n",
                                               encoding="utf-8")
    return {"n_bpe": n_bpe, "vocab_size": n_bpe + len(QWEN_ADDED) + len(OMNIVOICE_ADDED), "ids": ids}


# ---------------------------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------------------------

def omnivoice_config(spec: dict, tok_info: dict, torch_dtype_name: str) -> dict:
    import transformers

    ids = tok_info["ids"]
    llm = spec["llm"]
    n_layers = llm["num_hidden_layers"]
    llm_config = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "dtype": torch_dtype_name,
        "eos_token_id": ids["<|im_end|>"],
        "head_dim": llm["head_dim"],
        "hidden_act": "silu",
        "hidden_size": llm["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": llm["intermediate_size"],
        "layer_types": ["full_attention"] * n_layers,
        "max_position_embeddings": 40960,
        "max_window_layers": n_layers,
        "model_type": "qwen3",
        "num_attention_heads": llm["num_attention_heads"],
        "num_hidden_layers": n_layers,
        "num_key_value_heads": llm["num_key_value_heads"],
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": tok_info["vocab_size"],
    }
    return {
        "architectures": ["OmniVoice"],
        "audio_codebook_weights": [8, 8, 6, 6, 4, 4, 2, 2],
        "audio_mask_id": 1024,
        "audio_vocab_size": 1025,
        "bos_token_id": None,
        "dtype": torch_dtype_name,
        "eos_token_id": ids["<|im_end|>"],
        "llm_config": llm_config,
        "model_type": "omnivoice",
        "num_audio_codebook": 8,
        "pad_token_id": ids["<|endoftext|>"],
        "transformers_version": transformers.__version__,
    }


def codec_config(spec: dict) -> dict:
    import transformers

    c = spec["codec"]
    acoustic = {
        "codebook_dim": 8,
        "codebook_loss_weight": 1.0,
        "codebook_size": 1024,
        "commitment_loss_weight": 0.25,
        "decoder_hidden_size": c["acoustic"]["decoder_hidden_size"],
        "downsampling_ratios": [8, 5, 4, 2, 3],
        "encoder_hidden_size": c["acoustic"]["encoder_hidden_size"],
        "hidden_size": c["acoustic"]["hidden_size"],
        "hop_length": 960,
        "model_type": "dac",
        "n_codebooks": 9,
        "quantizer_dropout": 0,
        "sampling_rate": 16000,
        "upsampling_ratios": [8, 5, 4, 2, 3],
    }
    s = c["semantic"]
    semantic = {
        "activation_dropout": 0.1,
        "apply_spec_augment": True,
        "attention_dropout": 0.1,
        "bos_token_id": 1,
        "classifier_proj_size": 256,
        "conv_bias": False,
        "conv_dim": s["conv_dim"],
        "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
        "conv_pos_batch_norm": False,
        "conv_stride": [5, 2, 2, 2, 2, 2, 2],
        "ctc_loss_reduction": "sum",
        "ctc_zero_infinity": False,
        "do_stable_layer_norm": False,
        "eos_token_id": 2,
        "feat_extract_activation": "gelu",
        "feat_extract_norm": "group",
        "feat_proj_dropout": 0.0,
        "feat_proj_layer_norm": True,
        "final_dropout": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout": 0.1,
        "hidden_size": s["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": s["intermediate_size"],
        "layer_norm_eps": 1e-05,
        "layerdrop": 0.1,
        "mask_feature_length": 10,
        "mask_feature_min_masks": 0,
        "mask_feature_prob": 0.0,
        "mask_time_length": 10,
        "mask_time_min_masks": 2,
        "mask_time_prob": 0.0,
        "model_type": "hubert",
        "num_attention_heads": s["num_attention_heads"],
        "num_conv_pos_embedding_groups": 16,
        "num_conv_pos_embeddings": 128,
        "num_feat_extract_layers": 7,
        "num_hidden_layers": s["num_hidden_layers"],
        "pad_token_id": 0,
        "use_weighted_layer_sum": False,
        "vocab_size": 32,
    }
    return {
        "acoustic_model_config": acoustic,
        "architectures": ["HiggsAudioV2TokenizerModel"],
        "block_dilations": [1, 1],
        "channel_ratios": [1, 1],
        "codebook_dim": c["codebook_dim"],
        "codebook_size": c["codebook_size"],
        "downsample_factor": 320,
        "dtype": "float32",
        "initializer_range": 0.02,
        "kernel_size": 3,
        "model_type": "higgs_audio_v2_tokenizer",
        "sample_rate": 24000,
        "semantic_model_config": semantic,
        "semantic_sample_rate": 16000,
        "strides": [1, 1],
        "target_bandwidths": [0.5, 1, 1.5, 2],
        "transformers_version": transformers.__version__,
        "unit_kernel_size": 3,
    }


PREPROCESSOR_CONFIG = {
    "feature_extractor_type": "DacFeatureExtractor",
    "feature_size": 1,
    "hop_length": 960,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}


# ---------------------------------------------------------------------------------------------
# random tensors
# ---------------------------------------------------------------------------------------------

def rng_for(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(key.encode("utf-8"))])


def normal(rng, shape, std) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def uniform(rng, shape, lo, hi) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def shapes_of(module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


# A plan says how each tensor is drawn: {key: [shape, rule, *args]} with the rules
#   ["normal", std]  ["uniform", lo, hi]  ["ones"]  ["arange", step] (int64, i * step)
#   ["times_rows", a, b]  (key a times key b[:, None]: the codebooks' EMA sum)
# It is plain JSON, so the tensors can be drawn again without torch (draw_tensors).


def omnivoice_plan(cfg: dict) -> dict[str, list]:
    import torch
    from omnivoice.models.omnivoice import OmniVoice, OmniVoiceConfig

    with torch.device("meta"):
        model = OmniVoice(OmniVoiceConfig(**cfg))
    shapes = shapes_of(model)
    hidden = cfg["llm_config"]["hidden_size"]
    plan = {}
    for key in sorted(shapes):
        shape = list(shapes[key])
        if key == "codebook_layer_offsets":
            plan[key] = [shape, "arange", cfg["audio_vocab_size"]]
        elif key in ("llm.embed_tokens.weight", "audio_embeddings.weight"):
            plan[key] = [shape, "normal", 1.0]
        elif key == "audio_heads.weight":
            plan[key] = [shape, "normal", float(AUDIO_HEAD_LOGIT_STD / np.sqrt(hidden))]
        elif key.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            plan[key] = [shape, "uniform", 2.0, 4.0]
        elif key.endswith("layernorm.weight") or key == "llm.norm.weight":
            plan[key] = [shape, "uniform", 0.6, 1.4]
        elif key.endswith("_proj.weight"):
            plan[key] = [shape, "normal", float(1.0 / np.sqrt(shape[1]))]
        else:
            raise KeyError(f"no init rule for {key}")
    return plan


def codec_plan(cfg: dict) -> dict[str, list]:
    import torch
    from transformers import HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel

    with torch.device("meta"):
        model = HiggsAudioV2TokenizerModel(HiggsAudioV2TokenizerConfig(**cfg))
    modules = dict(model.named_modules())
    shapes = shapes_of(model)
    plan = {}
    for key in sorted(shapes):
        shape = list(shapes[key])
        owner, _, leaf = key.rpartition(".")
        mod = modules.get(owner)
        if leaf == "alpha":  # Snake1d
            plan[key] = [shape, "uniform", 0.5, 1.5]
        elif key.endswith("codebook.embed"):
            plan[key] = [shape, "normal", 1.0]
        elif key.endswith("codebook.embed_avg"):  # the EMA state kept consistent with embed
            base = key[: -len("embed_avg")]
            plan[key] = [shape, "times_rows", base + "embed", base + "cluster_size"]
        elif key.endswith("codebook.cluster_size"):
            plan[key] = [shape, "uniform", 0.5, 2.0]
        elif key.endswith("codebook.inited"):
            plan[key] = [shape, "ones"]
        elif key.endswith("parametrizations.weight.original0"):  # HuBERT pos-conv weight-norm g
            plan[key] = [shape, "uniform", 0.2, 0.4]
        elif key.endswith("parametrizations.weight.original1"):  # HuBERT pos-conv direction v
            plan[key] = [shape, "normal", 1.0]
        elif leaf == "bias":
            plan[key] = [shape, "normal", 0.05]
        elif isinstance(mod, (torch.nn.LayerNorm, torch.nn.GroupNorm)):
            plan[key] = [shape, "uniform", 0.6, 1.4]
        elif isinstance(mod, torch.nn.Linear):
            plan[key] = [shape, "normal", float(1.0 / np.sqrt(shape[1]))]
        elif isinstance(mod, torch.nn.ConvTranspose1d):
            stride = mod.stride[0]
            fan_in = shape[0] * shape[2] / stride  # inputs feeding one output sample
            plan[key] = [shape, "normal", float(GAIN_UP_DOWN_CONV / np.sqrt(fan_in))]
        elif isinstance(mod, torch.nn.Conv1d):
            fan_in = shape[1] * shape[2]
            gain = 1.0
            if key.startswith(("acoustic_encoder.", "acoustic_decoder.")):
                if ".res_unit" in key:
                    gain = GAIN_RES_BRANCH_CONV if key.endswith("conv1.weight") else GAIN_RES_OUT_CONV
                elif key == "acoustic_decoder.conv2.weight":
                    gain = GAIN_DEC_OUT_CONV
                elif ".block." in key:
                    gain = GAIN_UP_DOWN_CONV
            elif key.startswith("semantic_model.feature_extractor.") and ".conv_layers.0." not in key:
                gain = GAIN_HUBERT_FEATURE_CONV
            elif ".res_units." in key:  # semantic encoder/decoder ELU residual units
                gain = GAIN_RES_BRANCH_CONV if key.endswith("conv1.weight") else GAIN_RES_OUT_CONV
            plan[key] = [shape, "normal", float(gain / np.sqrt(fan_in))]
        else:
            raise KeyError(f"no init rule for {key} ({type(mod).__name__})")
    return plan


def draw_tensors(plan: dict[str, list], seed: int) -> dict[str, np.ndarray]:
    """The tensors of a plan: each from PCG64 seeded by (seed, crc32(key)). No torch needed
    (the property tests rebuild their checkpoints with it)."""
    out = {}
    for key, (shape, rule, *args) in plan.items():
        rng = rng_for(seed, key)
        if rule == "normal":
            out[key] = normal(rng, tuple(shape), args[0])
        elif rule == "uniform":
            out[key] = uniform(rng, tuple(shape), args[0], args[1])
        elif rule == "ones":
            out[key] = np.ones(shape, np.float32)
        elif rule == "arange":
            out[key] = (np.arange(shape[0]) * args[0]).astype(np.int64)
        elif rule != "times_rows":
            raise KeyError(f"unknown rule {rule!r} for {key}")
    for key, (shape, rule, *args) in plan.items():
        if rule == "times_rows":
            out[key] = (out[args[0]] * out[args[1]][:, None]).astype(np.float32)
    for k, (shape, *_) in plan.items():
        assert out[k].shape == tuple(shape), (k, out[k].shape, shape)
    return out


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------

def to_bf16(a: np.ndarray):
    import ml_dtypes

    return a.astype(ml_dtypes.bfloat16)


def save_tensors(tensors: dict[str, np.ndarray], path: Path, dtype: str) -> None:
    from safetensors.numpy import save_file

    if dtype == "bf16":
        tensors = {k: (to_bf16(v) if v.dtype == np.float32 else v) for k, v in tensors.items()}
    save_file(dict(sorted(tensors.items())), str(path), metadata={"format": "pt"})


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def write_checkpoint(out: Path, parts: dict, seed: int, dtype: str = "f32") -> None:
    """The configs and weight files of a checkpoint from its parts (`config`, `plan`,
    `codec_config`, `codec_plan`, as `build` returns them): no torch needed, so the property
    tests rebuild the reference's checkpoints with it (the tokenizer files are not written)."""
    (out / "audio_tokenizer").mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", parts["config"])
    save_tensors(draw_tensors(parts["plan"], seed), out / "model.safetensors", dtype)
    write_json(out / "audio_tokenizer" / "config.json", parts["codec_config"])
    write_json(out / "audio_tokenizer" / "preprocessor_config.json", PREPROCESSOR_CONFIG)
    # The codec stays F32 even with --dtype bf16 (the real codec is F32 and is decoded in F32).
    save_tensors(draw_tensors(parts["codec_plan"], seed + 1),
                 out / "audio_tokenizer" / "model.safetensors", "f32")


def build(size: str, out: Path, dtype: str = "f32", seed: int = DEFAULT_SEED,
          spec: dict | None = None) -> dict:
    """Write a checkpoint of `size` (or of `spec`, a SIZES-like dict of other dimensions) to
    `out`; returns the tokenizer info and the parts (configs, plans) it was written from."""
    spec = spec or SIZES[size]
    out.mkdir(parents=True, exist_ok=True)
    tok_info = build_tokenizer(out, spec["bpe_vocab"])
    # The real config.json says bfloat16 although its tensors are F32; keep that quirk so loaders
    # are tested against it (load the reference with dtype=torch.float32).
    cfg = omnivoice_config(spec, tok_info, "bfloat16")
    ccfg = codec_config(spec)
    parts = {"config": cfg, "plan": omnivoice_plan(cfg), "codec_config": ccfg, "codec_plan": codec_plan(ccfg)}
    write_checkpoint(out, parts, seed, dtype)
    return {**tok_info, **parts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="storage dtype of model.safetensors (the real checkpoint is F32)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    info = build(args.size, args.out, args.dtype, args.seed)
    ids = info["ids"]
    print(f"wrote {args.out}: bpe={info['n_bpe']} vocab={info['vocab_size']} "
          f"endoftext={ids['<|endoftext|>']} im_end={ids['<|im_end|>']} "
          f"denoise={ids['<|denoise|>']} text_end={ids['<|text_end|>']}")


if __name__ == "__main__":
    main()
