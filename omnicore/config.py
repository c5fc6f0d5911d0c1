"""Frozen configuration dataclasses, one per pipeline stage, built from the checkpoint's JSON.

Field names are the Hugging Face ones, so `config.json` maps onto them one to one. Unknown JSON
fields are ignored (the hub file carries training-only keys); missing required fields or values
omnicore cannot run raise ConfigError naming the file and field.

Sampling knobs are not model config: they live in GenerationConfig with the reference's defaults.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError


def read_json(path: str | Path) -> dict:
    """Read a JSON object from `path`, turning every failure into a ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; is this really a config.json?") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    return obj


def _pick(cls, d: dict, where: str, required: tuple[str, ...] = ()) -> dict:
    """Keep the keys of `d` that are fields of `cls`; check required ones are present."""
    missing = [k for k in required if k not in d]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def _positive_ints(obj, where: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Qwen3Config:
    """The bidirectional Qwen3 backbone (`llm_config` in OmniVoice's config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    hidden_act: str = "silu"
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    model_type: str = "qwen3"

    @classmethod
    def from_dict(cls, d: dict, where: str = "llm_config") -> "Qwen3Config":
        d = dict(d)
        # transformers 5 nests RoPE settings in `rope_parameters`; older exports kept
        # `rope_theta` at the top level. Accept both; the nested one wins.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if isinstance(rope, dict) and "rope_theta" in rope:
            d["rope_theta"] = rope["rope_theta"]
        rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
        if rope_type not in ("default", None):
            raise ConfigError(f"{where}: rope_type {rope_type!r} is not supported (only 'default')")
        if "head_dim" not in d and "hidden_size" in d and "num_attention_heads" in d:
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        kw = _pick(cls, d, where, required=(
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads"))
        cfg = cls(**kw)
        _positive_ints(cfg, where, "vocab_size", "hidden_size", "intermediate_size",
                       "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                       "head_dim")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ConfigError(f"{where}: num_attention_heads ({cfg.num_attention_heads}) is not a "
                              f"multiple of num_key_value_heads ({cfg.num_key_value_heads})")
        if cfg.head_dim % 2:
            raise ConfigError(f"{where}: head_dim must be even for rotary embeddings")
        if cfg.hidden_act != "silu":
            raise ConfigError(f"{where}: hidden_act {cfg.hidden_act!r} is not supported (only 'silu')")
        if cfg.attention_bias:
            raise ConfigError(f"{where}: attention_bias=true is not supported (Qwen3 has none)")
        if not (cfg.rms_norm_eps > 0 and cfg.rope_theta > 0):
            raise ConfigError(f"{where}: rms_norm_eps and rope_theta must be positive")
        return cfg


@dataclass(frozen=True)
class OmniVoiceConfig:
    """The top-level `config.json` of an OmniVoice checkpoint."""

    llm_config: Qwen3Config
    audio_vocab_size: int = 1025
    audio_mask_id: int = 1024
    num_audio_codebook: int = 8
    audio_codebook_weights: tuple[float, ...] = (8, 8, 6, 6, 4, 4, 2, 2)
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str = "config.json") -> "OmniVoiceConfig":
        llm = d.get("llm_config")
        if not isinstance(llm, dict):
            raise ConfigError(f"{where}: missing the `llm_config` object; is this an OmniVoice "
                              "checkpoint (architectures [\"OmniVoice\"])?")
        kw = _pick(cls, d, where)
        kw["llm_config"] = Qwen3Config.from_dict(llm, f"{where}: llm_config")
        if "audio_codebook_weights" in kw and kw["audio_codebook_weights"] is not None:
            kw["audio_codebook_weights"] = tuple(kw["audio_codebook_weights"])
        else:
            kw.pop("audio_codebook_weights", None)
        cfg = cls(**kw)
        _positive_ints(cfg, where, "audio_vocab_size", "num_audio_codebook")
        if not 0 <= cfg.audio_mask_id < cfg.audio_vocab_size:
            raise ConfigError(f"{where}: audio_mask_id {cfg.audio_mask_id} outside the audio "
                              f"vocabulary of {cfg.audio_vocab_size}")
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> "OmniVoiceConfig":
        return cls.from_dict(read_json(path), str(path))


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling knobs of the iterative unmasking, with the reference's defaults."""

    num_step: int = 32
    guidance_scale: float = 2.0
    t_shift: float = 0.1
    layer_penalty_factor: float = 5.0
    position_temperature: float = 5.0
    class_temperature: float = 0.0
    denoise: bool = True
    preprocess_prompt: bool = True
    postprocess_output: bool = True
    audio_chunk_duration: float = 15.0
    audio_chunk_threshold: float = 30.0
    pad_duration: float = 0.1
    fade_duration: float = 0.1

    def __post_init__(self):
        from .errors import InputError

        def finite(name):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InputError(f"{name} must be a finite number, got {v!r}")
            return v

        if isinstance(self.num_step, bool) or not isinstance(self.num_step, int) or not 1 <= self.num_step <= 1000:
            raise InputError(f"num_step must be an integer between 1 and 1000, got {self.num_step!r}")
        for name in ("guidance_scale", "layer_penalty_factor", "position_temperature",
                     "class_temperature", "pad_duration", "fade_duration"):
            if finite(name) < 0:
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < finite("t_shift"):
            raise InputError(f"t_shift must be > 0, got {self.t_shift!r}")
        if not (finite("audio_chunk_duration") > 0 and finite("audio_chunk_threshold") > 0):
            raise InputError("audio_chunk_duration and audio_chunk_threshold must be > 0")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GenerationConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
