"""config.json -> frozen dataclasses: HF field names, both RoPE layouts, clear errors."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from omnicore.machinery import checkpoint
from omnicore.machinery.checkpoint import read_json
from omnicore.model.config import GenerationConfig, OmniVoiceConfig, Qwen3Config
from omnicore.errors import ConfigError, InputError

REAL_LLM = {
    "model_type": "qwen3", "vocab_size": 151676, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
    "max_position_embeddings": 40960, "attention_dropout": 0.0, "use_cache": True,
}
REAL = {"architectures": ["OmniVoice"], "model_type": "omnivoice", "audio_vocab_size": 1025,
        "audio_mask_id": 1024, "num_audio_codebook": 8,
        "audio_codebook_weights": [8, 8, 6, 6, 4, 4, 2, 2], "eos_token_id": 151645,
        "pad_token_id": 151643, "dtype": "bfloat16", "llm_config": REAL_LLM}


def test_real_config_parses():
    cfg = OmniVoiceConfig.from_dict(REAL)
    llm = cfg.llm_config
    assert (llm.vocab_size, llm.hidden_size, llm.num_attention_heads, llm.num_key_value_heads,
            llm.head_dim, llm.intermediate_size, llm.num_hidden_layers) == (151676, 1024, 16, 8, 128, 3072, 28)
    assert llm.rope_theta == 1e6 and llm.rms_norm_eps == 1e-6
    assert cfg.audio_codebook_weights == (8, 8, 6, 6, 4, 4, 2, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.audio_mask_id = 3


def test_legacy_top_level_rope_theta():
    llm = dict(REAL_LLM)
    del llm["rope_parameters"]
    llm["rope_theta"] = 12345.0
    assert Qwen3Config.from_dict(llm).rope_theta == 12345.0


@pytest.mark.parametrize("patch, match", [
    ({"num_key_value_heads": 5}, "multiple"),
    ({"hidden_size": 0}, "positive"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn"}}, "rope_type"),
    ({"vocab_size": None}, "vocab_size must be an integer"),
])
def test_bad_llm_config(patch, match):
    with pytest.raises(ConfigError, match=match):
        Qwen3Config.from_dict({**REAL_LLM, **patch})


def test_missing_fields_and_files(tmp_path):
    with pytest.raises(ConfigError, match="llm_config"):
        OmniVoiceConfig.from_dict({"audio_vocab_size": 1025})
    bad = {k: v for k, v in REAL_LLM.items() if k != "hidden_size"}
    with pytest.raises(ConfigError, match="hidden_size"):
        OmniVoiceConfig.from_dict({**REAL, "llm_config": bad})
    with pytest.raises(ConfigError, match="not found"):
        read_json(tmp_path / "config.json")
    (tmp_path / "c.json").write_text("{nope")
    with pytest.raises(ConfigError, match="invalid JSON"):
        read_json(tmp_path / "c.json")
    (tmp_path / "d.json").write_text(json.dumps(REAL))
    assert checkpoint.read_config(tmp_path / "d.json").num_audio_codebook == 8


def test_generation_defaults_match_reference():
    g = GenerationConfig()
    assert (g.num_step, g.guidance_scale, g.t_shift, g.layer_penalty_factor,
            g.position_temperature, g.class_temperature) == (32, 2.0, 0.1, 5.0, 5.0, 0.0)
    assert (g.denoise, g.preprocess_prompt, g.postprocess_output) == (True, True, True)
    assert (g.audio_chunk_duration, g.audio_chunk_threshold, g.pad_duration, g.fade_duration) == (15.0, 30.0, 0.1, 0.1)


@pytest.mark.parametrize("kw", [{"num_step": 0}, {"num_step": 2.5}, {"guidance_scale": float("nan")},
                                {"t_shift": 0}, {"class_temperature": -1}, {"position_temperature": "hot"}])
def test_generation_config_rejects_bad_values(kw):
    with pytest.raises(InputError):
        GenerationConfig(**kw)


# ---------------------------------------------------------------------------------------------
# Every field is type-checked: a string or a bool where a number belongs is a ConfigError naming
# the field, never a TypeError deep inside the model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("patch, field, expected", [
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps", "a finite number"),
    ({"rope_parameters": {"rope_theta": "1000000", "rope_type": "default"}}, "rope_theta", "a finite number"),
    ({"rope_theta": "1e6", "rope_parameters": None}, "rope_theta", "a finite number"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps", "a finite number"),
    ({"rope_parameters": {"rope_theta": float("inf")}}, "rope_theta", "a finite number"),
    ({"hidden_size": "1024"}, "hidden_size", "an integer"),
    ({"num_attention_heads": True}, "num_attention_heads", "an integer"),
    ({"head_dim": 128.0}, "head_dim", "an integer"),
    ({"max_position_embeddings": "40960"}, "max_position_embeddings", "an integer"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings", "true or false"),
    ({"attention_bias": 0}, "attention_bias", "true or false"),
    ({"hidden_act": 5}, "hidden_act", "a string"),
])
def test_llm_config_fields_are_type_checked(patch, field, expected):
    with pytest.raises(ConfigError, match=f"{field} must be {expected}.*got"):
        OmniVoiceConfig.from_dict({**REAL, "llm_config": {**REAL_LLM, **patch}})


@pytest.mark.parametrize("patch, match", [
    ({"audio_mask_id": "1024"}, "audio_mask_id must be an integer"),
    ({"audio_mask_id": True}, "audio_mask_id must be an integer"),
    ({"audio_vocab_size": 1025.0}, "audio_vocab_size must be an integer"),
    ({"num_audio_codebook": "8"}, "num_audio_codebook must be an integer"),
    ({"audio_codebook_weights": ["8"] * 8}, "audio_codebook_weights must be a list of finite numbers"),
    ({"audio_codebook_weights": 8}, "audio_codebook_weights must be a list"),
    ({"audio_codebook_weights": [8, -1, 6, 6, 4, 4, 2, 2]}, "must not be negative"),
    ({"eos_token_id": "151645"}, "eos_token_id must be an integer"),
    ({"pad_token_id": 1.5}, "pad_token_id must be an integer"),
])
def test_top_level_fields_are_type_checked(patch, match):
    with pytest.raises(ConfigError, match=match):
        OmniVoiceConfig.from_dict({**REAL, **patch})


@pytest.mark.parametrize("patch, match", [
    ({"rms_norm_eps": -1e-6}, "positive"),
    ({"rope_parameters": {"rope_theta": 0}}, "positive"),
    ({"max_position_embeddings": 0}, "max_position_embeddings must be a positive integer"),
    ({"rope_parameters": "default"}, "rope_parameters must be an object"),
])
def test_llm_numbers_must_be_in_range(patch, match):
    with pytest.raises(ConfigError, match=match):
        Qwen3Config.from_dict({**REAL_LLM, **patch})


def test_accepted_forms_of_numbers():
    # JSON integers where floats belong are fine (rope_theta 1000000 in the hub file), null
    # weights mean the defaults, token ids may be lists as in some HF configs
    cfg = OmniVoiceConfig.from_dict({**REAL, "audio_codebook_weights": None, "eos_token_id": [1, 2]})
    assert cfg.audio_codebook_weights == (8, 8, 6, 6, 4, 4, 2, 2) and cfg.eos_token_id == (1, 2)
    assert isinstance(cfg.llm_config.rope_theta, float) and cfg.llm_config.rope_theta == 1e6


TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"


@pytest.mark.parametrize("field", ["rms_norm_eps", "rope_theta", "audio_mask_id"])
def test_string_number_in_a_checkpoint_config_is_a_config_error(tmp_path, field):
    from omnicore import OmniVoice

    ckpt = tmp_path / "ckpt"
    shutil.copytree(TINY, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    if field == "audio_mask_id":
        cfg[field] = "1024"
    elif field == "rope_theta":
        cfg["llm_config"]["rope_parameters"][field] = "1000000"
    else:
        cfg["llm_config"][field] = "1e-06"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=f"config.json: .*{field} must be"):
        OmniVoice.from_pretrained(ckpt)


def test_hostile_json_files(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        read_json(deep)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(65 * 2**20)  # sparse: 65 MB of zero bytes without writing them
    with pytest.raises(ConfigError, match="larger than 64 MB"):
        read_json(huge)
    with pytest.raises(ConfigError, match="directory"):
        read_json(tmp_path)


# ---------------------------------------------------------------------------------------------
# Audio tokenizer config: types, and decoder widths floored like the reference
# ---------------------------------------------------------------------------------------------

TINY_CODEC = TINY / "audio_tokenizer"


@pytest.mark.parametrize("sub, patch, match", [
    (None, {"sample_rate": "24000"}, "sample_rate must be an integer"),
    (None, {"codebook_size": 1024.0}, "codebook_size must be an integer"),
    (None, {"target_bandwidths": ["2"]}, "target_bandwidths must be a list of finite numbers"),
    (None, {"channel_ratios": [1, float("nan")]}, "channel_ratios must be a list of finite numbers"),
    ("acoustic_model_config", {"encoder_hidden_size": "2"}, "encoder_hidden_size must be an integer"),
    ("acoustic_model_config", {"upsampling_ratios": [8, "5", 4, 2, 3]}, "upsampling_ratios must be a list of integers"),
    ("acoustic_model_config", {"downsampling_ratios": [2] * 40}, "at most 16"),
    ("semantic_model_config", {"layer_norm_eps": "1e-5"}, "layer_norm_eps must be a finite number"),
    ("semantic_model_config", {"layer_norm_eps": 0}, "layer_norm_eps must be positive"),
    ("semantic_model_config", {"conv_bias": "false"}, "conv_bias must be true or false"),
    ("semantic_model_config", {"num_hidden_layers": True}, "num_hidden_layers must be an integer"),
])
def test_codec_config_fields_are_type_checked(sub, patch, match):
    from omnicore.model.config import HiggsAudioV2TokenizerConfig

    d = json.loads((TINY_CODEC / "config.json").read_text())
    (d[sub] if sub else d).update(patch)
    with pytest.raises(ConfigError, match=match):
        HiggsAudioV2TokenizerConfig.from_dict(d)


def _floored_decoder_tensors(cfg, rng) -> dict:
    """The acoustic decoder's tensors in the reference's layout, block i mapping
    decoder_hidden_size // 2**i channels to // 2**(i+1) (transformers' DacDecoderBlock)."""
    import numpy as np

    ac = cfg.acoustic_model_config
    width = ac.decoder_hidden_size

    def w(*shape, fan_in):
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    def alpha(c):
        return (1 + 0.2 * rng.random((1, c, 1))).astype(np.float32)

    t = {"acoustic_decoder.conv1.weight": w(width, ac.hidden_size, 7, fan_in=7 * ac.hidden_size),
         "acoustic_decoder.conv1.bias": w(width, fan_in=100)}
    for i, s in enumerate(ac.upsampling_ratios):
        p = f"acoustic_decoder.block.{i}."
        cin, cout = width // 2 ** i, width // 2 ** (i + 1)
        t[p + "snake1.alpha"] = alpha(cin)
        t[p + "conv_t1.weight"] = w(cin, cout, 2 * s, fan_in=2 * cin)
        t[p + "conv_t1.bias"] = w(cout, fan_in=100)
        for j in (1, 2, 3):
            q = f"{p}res_unit{j}."
            t[q + "snake1.alpha"], t[q + "snake2.alpha"] = alpha(cout), alpha(cout)
            t[q + "conv1.weight"], t[q + "conv1.bias"] = w(cout, cout, 7, fan_in=7 * cout), w(cout, fan_in=100)
            t[q + "conv2.weight"], t[q + "conv2.bias"] = w(cout, cout, 1, fan_in=cout), w(cout, fan_in=100)
    last = width // 2 ** len(ac.upsampling_ratios)
    t["acoustic_decoder.snake1.alpha"] = alpha(last)
    t["acoustic_decoder.conv2.weight"] = w(1, last, 7, fan_in=7 * last)
    t["acoustic_decoder.conv2.bias"] = w(1, fan_in=100)
    return t


def test_decoder_width_not_divisible_by_the_block_count_is_floored_like_the_reference():
    import numpy as np

    from omnicore.model import higgs_codec
    from omnicore.model.config import HiggsAudioV2TokenizerConfig
    from conftest import read_safetensors
    from omnicore.model.weights import ParamReader

    d = json.loads((TINY_CODEC / "config.json").read_text())
    d["acoustic_model_config"]["decoder_hidden_size"] = 48  # 48 -> 24, 12, 6, 3, 1
    cfg = HiggsAudioV2TokenizerConfig.from_dict(d)
    tensors = {k: v for k, v in read_safetensors(TINY_CODEC / "model.safetensors").items()
               if not k.startswith("acoustic_decoder.")}
    tensors.update(_floored_decoder_tensors(cfg, np.random.default_rng(0)))
    params = higgs_codec.load_params(ParamReader(tensors, "floored.safetensors"), cfg)  # every key used

    dec = params.decoder
    assert [b.snake.alpha.shape[0] for b in dec.blocks] == [48, 24, 12, 6, 3]
    assert [b.conv_t_b.shape[0] for b in dec.blocks] == [24, 12, 6, 3, 1]
    assert dec.snake.alpha.shape == (1,)
    codes = np.random.default_rng(1).integers(0, cfg.codebook_size, (cfg.num_quantizers, 6))
    wav = higgs_codec.decode(params, codes, cfg)
    assert wav.shape == (6 * cfg.hop_length,) and np.all(np.isfinite(wav)) and wav.std() > 0
    # a width that leaves the last block no channel at all is still refused
    d["acoustic_model_config"]["decoder_hidden_size"] = 31
    with pytest.raises(ConfigError, match="decoder_hidden_size 31 leaves no channel"):
        HiggsAudioV2TokenizerConfig.from_dict(d)
