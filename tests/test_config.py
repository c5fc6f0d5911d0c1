"""config.json -> frozen dataclasses: HF field names, both RoPE layouts, clear errors."""

import dataclasses
import json

import pytest

from omnicore.config import GenerationConfig, OmniVoiceConfig, Qwen3Config, read_json
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
    ({"vocab_size": None}, "positive"),
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
    assert OmniVoiceConfig.from_file(tmp_path / "d.json").num_audio_codebook == 8


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
