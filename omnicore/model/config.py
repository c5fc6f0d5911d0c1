"""Frozen configuration dataclasses, one per pipeline stage, built from the checkpoint's JSON.

Field names are the Hugging Face ones, so `config.json` maps onto them one to one (`from_dict`;
omnicore.machinery.checkpoint reads the file). Unknown JSON fields are ignored (the hub file carries
training-only keys); missing required fields or values omnicore cannot run raise ConfigError
naming the file and field.

Sampling knobs are not model config: they live in GenerationConfig with the reference's defaults.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import ConfigError, InputError


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not the number 1


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Declared field type -> (test, what the message asks for). Nested configs are not listed:
# each is built and checked by its own class.
_FIELD_TYPES = {
    "int": (_is_int, "an integer"),
    "float": (_is_number, "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "tuple[int, ...]": (lambda v: isinstance(v, (list, tuple)) and all(map(_is_int, v)), "a list of integers"),
    "tuple[float, ...]": (lambda v: isinstance(v, (list, tuple)) and all(map(_is_number, v)),
                          "a list of finite numbers"),
    "int | tuple[int, ...] | None": (
        lambda v: v is None or _is_int(v) or (isinstance(v, list) and all(map(_is_int, v))),
        "an integer, a list of integers or null"),
}


def _fields_of(cls, d: dict, where: str, required: tuple[str, ...] = (), nullable: tuple[str, ...] = ()) -> dict:
    """The keys of `d` that are fields of `cls`, each checked against the field's declared type
    (a string "1e-6" or true where a number belongs is refused here, not deep in the model);
    floats come back as float, lists as tuples. Keys in `nullable` may also be null."""
    missing = [k for k in required if k not in d]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}")
    types = {f.name: f.type for f in fields(cls)}
    out = {}
    for name, value in d.items():
        if name not in types:
            continue
        check = _FIELD_TYPES.get(types[name])
        if check is not None and not (value is None and name in nullable):
            ok, expected = check
            if not ok(value):
                raise ConfigError(f"{where}: {name} must be {expected}, got {value!r} "
                                  f"({type(value).__name__}); fix it in the config file")
            if types[name] == "float":
                value = float(value)
            elif isinstance(value, list):
                value = tuple(value)
        out[name] = value
    return out


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
        for name in ("rope_parameters", "rope_scaling"):
            if not isinstance(d.get(name), (dict, type(None))):
                raise ConfigError(f"{where}: {name} must be an object or null, got {d[name]!r}")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if "rope_theta" in rope:
            d["rope_theta"] = rope["rope_theta"]
        rope_type = rope.get("rope_type", "default")
        if rope_type not in ("default", None):
            raise ConfigError(f"{where}: rope_type {rope_type!r} is not supported (only 'default')")
        kw = _fields_of(cls, d, where, required=(
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads"))
        if "head_dim" not in kw and kw["num_attention_heads"] > 0:
            kw["head_dim"] = kw["hidden_size"] // kw["num_attention_heads"]
        kw.setdefault("head_dim", 0)  # refused below, with the zero head count
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
            raise ConfigError(f"{where}: rms_norm_eps and rope_theta must be positive, got "
                              f"{cfg.rms_norm_eps!r} and {cfg.rope_theta!r}")
        _positive_ints(cfg, where, "max_position_embeddings")
        return cfg


@dataclass(frozen=True)
class OmniVoiceConfig:
    """The top-level `config.json` of an OmniVoice checkpoint."""

    llm_config: Qwen3Config
    audio_vocab_size: int = 1025
    audio_mask_id: int = 1024
    num_audio_codebook: int = 8
    audio_codebook_weights: tuple[float, ...] = (8, 8, 6, 6, 4, 4, 2, 2)
    eos_token_id: int | tuple[int, ...] | None = None  # not used by inference; type-checked only
    pad_token_id: int | tuple[int, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str = "config.json") -> "OmniVoiceConfig":
        llm = d.get("llm_config")
        if not isinstance(llm, dict):
            raise ConfigError(f"{where}: missing the `llm_config` object; is this an OmniVoice "
                              "checkpoint (architectures [\"OmniVoice\"])?")
        kw = _fields_of(cls, d, where, nullable=("audio_codebook_weights",))
        kw["llm_config"] = Qwen3Config.from_dict(llm, f"{where}: llm_config")
        if kw.get("audio_codebook_weights", ()) is None:
            del kw["audio_codebook_weights"]
        cfg = cls(**kw)
        _positive_ints(cfg, where, "audio_vocab_size", "num_audio_codebook")
        if any(w < 0 for w in cfg.audio_codebook_weights):
            raise ConfigError(f"{where}: audio_codebook_weights must not be negative, got "
                              f"{list(cfg.audio_codebook_weights)}")
        if not 0 <= cfg.audio_mask_id < cfg.audio_vocab_size:
            raise ConfigError(f"{where}: audio_mask_id {cfg.audio_mask_id} outside the audio "
                              f"vocabulary of {cfg.audio_vocab_size}")
        return cfg


# The generation profiles. "exact" is the reference's algorithm, every step in full. "fast"
# approximates it: each pass keeps the keys and values of its prompt positions and reruns only
# its targets between refreshes, and reuses the unconditional log-probs between recomputations
# (docs/performance.md says what is and is not known of its quality). "live" is fast plus an
# early first audio for a stream: chunk 0 with fewer steps, and cut after less speech.
PROFILES = ("exact", "fast", "live")
# The fast profile's settings: the steps and reuse periods measured by others on real weights.
FAST_PROFILE = {"num_step": 16, "prefix_refresh": 8, "uncond_every": 3}
# The live profile's: fast's, chunk 0 of a stream in 4 steps and cut at the first clause end
# after 1 s of speech (docs/performance.md, "The live profile", derives both from the FLOPs)
# or, with no clause end by then, at a word break after 2 s (a reply streamed in waits for
# its words: at 3 s its first audio came 0.5-0.75 s later, benchmarks/README.md), or sooner,
# at the last word break whose unmasking fits 3.5 s on this machine (the 5 s goal less the
# first decode window and text streamed in).
LIVE_PROFILE = {**FAST_PROFILE, "first_chunk_steps": 4, "first_chunk_seconds": 1.0,
                "first_chunk_max_seconds": 2.0, "first_audio_seconds": 3.5}
MAX_STEPS = 1000
# A stream's chunk 0 ends at a clause end after this much speech (the exact setting of
# first_chunk_seconds), or at a word break after FIRST_CHUNK_MAX_FACTOR times as much (unless
# first_chunk_max_seconds says otherwise).
FIRST_CHUNK_SECONDS = 2.0
FIRST_CHUNK_MAX_FACTOR = 3.0
FIRST_CHUNK_SECONDS_RANGE = (0.5, 15.0)
FIRST_AUDIO_SECONDS_RANGE = (0.1, 60.0)  # first_audio_seconds, when set (0: no budget)


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling knobs of the iterative unmasking, with the reference's defaults.

    `profile`, `prefix_refresh` and `uncond_every` choose between the exact algorithm and its
    approximation: with profile "fast" (or "live") the conditional row runs in full only every
    `prefix_refresh` steps (between those, its targets alone, attending to the prompt's kept
    keys and values) and the unconditional row every `uncond_every` steps (its log-probs kept
    in between). "exact" requires both at 1. `GenerationConfig.for_profile("fast")` (or
    `profile="fast"` on a call) gives the fast profile's own settings (`FAST_PROFILE`); fast
    with both knobs at 1 computes exactly what exact computes.

    `first_chunk_steps` and `first_chunk_seconds` shape chunk 0 of a stream (`stream()`; not
    `generate`, whose audio comes all at once), for an early first audio; the "live" profile
    sets them (`LIVE_PROFILE`), and at their exact settings (0 and 2.0) nothing changes.
    Like `num_step`, they change how much work is done, not how a step is computed, so any
    profile takes them. `first_chunk_steps`: chunk 0 is unmasked in this many steps, the later
    chunks in `num_step` (0 or None: `num_step`); fewer steps sound worse (others measured 8
    steps ~3 WER points worse than 32, 12-16 the same), and in auto / design mode chunk 0 is
    the voice reference of the later chunks. `first_chunk_seconds`: chunk 0 ends at the first
    sentence or clause end after this much estimated speech, or at a word break after
    `first_chunk_max_seconds` (0, its exact setting: FIRST_CHUNK_MAX_FACTOR times
    first_chunk_seconds; never before first_chunk_seconds; live: 2 s, where text without an
    early clause end would otherwise wait for 3 s of words). Shorter comes sooner but, in auto
    and design mode, is a weaker voice reference for every later chunk (less of the voice to go
    on) and may sound choppy; with a voice prompt only chunk 0 itself pays. `first_audio_seconds` (0: off, its
    exact setting) is chunk 0's budget on this machine: whatever the punctuation, chunk 0 ends
    at the last word break whose estimated unmasking (cost.pass_flops over the rate `omnicore
    warmup` measured) fits it, so a slower machine gets a shorter chunk 0 (at least one word).
    """

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
    profile: str = "exact"
    prefix_refresh: int = 1  # fast: the conditional row in full every this many steps
    uncond_every: int = 1  # fast: the unconditional row every this many steps
    first_chunk_steps: int = 0  # live: a stream's chunk 0 in this many steps (0: num_step)
    first_chunk_seconds: float = FIRST_CHUNK_SECONDS  # live: where a stream's chunk 0 ends
    first_chunk_max_seconds: float = 0.0  # live: chunk 0's word-break cap (0: 3x the above)
    first_audio_seconds: float = 0.0  # live: chunk 0's unmasking budget on this machine (0: none)

    def __post_init__(self):
        from ..errors import InputError

        def finite(name):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InputError(f"{name} must be a finite number, got {v!r}")
            return v

        for name in ("num_step", "prefix_refresh", "uncond_every"):  # a period >= num_step: once
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_STEPS:
                raise InputError(f"{name} must be an integer between 1 and {MAX_STEPS}, got {v!r}")
        if self.profile not in PROFILES:
            raise InputError(f"profile must be one of {', '.join(map(repr, PROFILES))}, got {self.profile!r}")
        if self.profile == "exact" and (self.prefix_refresh, self.uncond_every) != (1, 1):
            raise InputError("prefix_refresh and uncond_every approximate the algorithm: they need "
                             "profile='fast' or profile='live' (exact runs every step in full)")
        if self.first_chunk_steps is None:  # None: as num_step, like 0 (one spelling kept)
            object.__setattr__(self, "first_chunk_steps", 0)
        v = self.first_chunk_steps
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_STEPS:
            raise InputError(f"first_chunk_steps must be 0 (as num_step) or an integer between 1 "
                             f"and {MAX_STEPS}, got {v!r}")
        lo, hi = FIRST_CHUNK_SECONDS_RANGE
        if not lo <= finite("first_chunk_seconds") <= hi:
            raise InputError(f"first_chunk_seconds must be between {lo:g} and {hi:g} seconds, got "
                             f"{self.first_chunk_seconds!r}")
        if finite("first_chunk_max_seconds") != 0 and not lo <= self.first_chunk_max_seconds <= hi:
            raise InputError(f"first_chunk_max_seconds must be 0 ({FIRST_CHUNK_MAX_FACTOR:g} x "
                             f"first_chunk_seconds) or between {lo:g} and {hi:g} seconds, got "
                             f"{self.first_chunk_max_seconds!r}")
        lo, hi = FIRST_AUDIO_SECONDS_RANGE
        if finite("first_audio_seconds") != 0 and not lo <= self.first_audio_seconds <= hi:
            raise InputError(f"first_audio_seconds must be 0 (no budget) or between {lo:g} and "
                             f"{hi:g} seconds, got {self.first_audio_seconds!r}")
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

    def full_row_at(self, step: int) -> bool:
        """Whether a pass's conditional row runs in full at `step` (0-based; else its targets
        alone, on its prompt's kept keys and values): every step for exact."""
        return step % self.prefix_refresh == 0

    def uncond_at(self, step: int) -> bool:
        """Whether a guided pass's unconditional row runs at `step` (else its last log-probs
        are reused): every step for exact."""
        return step % self.uncond_every == 0

    def for_chunk(self, k: int) -> "GenerationConfig":
        """The settings chunk k (from 0) of a stream is unmasked with: chunk 0 in
        `first_chunk_steps` steps when that is set, every other chunk (and chunk 0 otherwise)
        with these. The same profile, engine and step function either way."""
        if k == 0 and self.first_chunk_steps not in (0, self.num_step):
            return replace(self, num_step=self.first_chunk_steps)
        return self

    @classmethod
    def for_profile(cls, profile: str = "exact", **fields_) -> "GenerationConfig":
        """The settings of `profile` ("exact": the reference's defaults; "fast": FAST_PROFILE,
        "live": LIVE_PROFILE on top of them), then `fields_` (InputError for an unknown
        profile)."""
        if profile not in PROFILES:
            raise InputError(f"profile must be one of {', '.join(map(repr, PROFILES))}, got {profile!r}")
        base = {"fast": FAST_PROFILE, "live": LIVE_PROFILE}.get(profile, {})
        return cls(**{**base, "profile": profile, **fields_})


# --- Higgs Audio V2 codec ---
# `audio_tokenizer/config.json`: a top-level HiggsAudioV2Tokenizer config with two nested
# sub-configs, the acoustic DAC (`acoustic_model_config`) and the semantic HuBERT
# (`semantic_model_config`). The class defaults in transformers do NOT describe the released
# checkpoint (e.g. DAC ratios [8, 5, 4, 2] there vs [8, 5, 4, 2, 3] in the file), so every
# number is read from the JSON; the defaults below only fill fields the file may omit.


def _int_tuple(obj, where: str, name: str) -> None:
    value = getattr(obj, name)
    if (not isinstance(value, tuple) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ConfigError(f"{where}: {name} must be a non-empty list of positive integers, got {value!r}")


def _tuples(kw: dict, *names: str) -> dict:
    for name in names:
        if isinstance(kw.get(name), list):
            kw[name] = tuple(kw[name])
    return kw


@dataclass(frozen=True)
class DacConfig:
    """The acoustic branch: a DAC encoder (waveform -> latent) and decoder (latent -> waveform).

    As in transformers, `upsampling_ratios` defaults to the reversed `downsampling_ratios` and
    `hidden_size` to `encoder_hidden_size * 2**len(downsampling_ratios)` when the file omits them;
    the released file sets both ([8, 5, 4, 2, 3] and 256). Decoder block i has
    `decoder_hidden_size // 2**i` input channels (floored, like transformers).
    """

    encoder_hidden_size: int = 64
    decoder_hidden_size: int = 1024
    hidden_size: int = 256
    downsampling_ratios: tuple[int, ...] = (8, 5, 4, 2, 3)
    upsampling_ratios: tuple[int, ...] = (8, 5, 4, 2, 3)

    @classmethod
    def from_dict(cls, d: dict, where: str = "acoustic_model_config") -> "DacConfig":
        kw = _tuples(_fields_of(cls, d, where, required=("downsampling_ratios",)),
                     "downsampling_ratios", "upsampling_ratios")
        down = kw["downsampling_ratios"]
        for name in ("downsampling_ratios", "upsampling_ratios"):
            if len(kw.get(name, ())) > 16:  # each ratio is a conv stage; real codecs have 4-5
                raise ConfigError(f"{where}: {name} has {len(kw[name])} stages; at most 16 are supported")
        if isinstance(down, tuple):
            kw.setdefault("upsampling_ratios", down[::-1])
            kw.setdefault("hidden_size", kw.get("encoder_hidden_size", 64) * 2 ** len(down))
        cfg = cls(**kw)
        _positive_ints(cfg, where, "encoder_hidden_size", "decoder_hidden_size", "hidden_size")
        _int_tuple(cfg, where, "downsampling_ratios")
        _int_tuple(cfg, where, "upsampling_ratios")
        # Decoder block i maps decoder_hidden_size // 2**i channels to // 2**(i+1), floored as in
        # transformers' DacDecoderBlock (48 -> 24, 12, 6, 3, 1): any width works as long as the
        # last block keeps a channel.
        if cfg.decoder_hidden_size < 2 ** len(cfg.upsampling_ratios):
            raise ConfigError(f"{where}: decoder_hidden_size {cfg.decoder_hidden_size} leaves no channel "
                              f"after {len(cfg.upsampling_ratios)} halving decoder blocks; it must be "
                              f"at least {2 ** len(cfg.upsampling_ratios)}")
        return cfg


@dataclass(frozen=True)
class HubertConfig:
    """The semantic branch: HuBERT (conv feature encoder + post-LN transformer) at 16 kHz."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    feat_extract_norm: str = "group"
    feat_extract_activation: str = "gelu"
    feat_proj_layer_norm: bool = True
    conv_dim: tuple[int, ...] = (512, 512, 512, 512, 512, 512, 512)
    conv_stride: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)
    conv_kernel: tuple[int, ...] = (10, 3, 3, 3, 3, 2, 2)
    conv_bias: bool = False
    num_conv_pos_embeddings: int = 128
    num_conv_pos_embedding_groups: int = 16
    conv_pos_batch_norm: bool = False
    do_stable_layer_norm: bool = False

    @classmethod
    def from_dict(cls, d: dict, where: str = "semantic_model_config") -> "HubertConfig":
        kw = _tuples(_fields_of(cls, d, where), "conv_dim", "conv_stride", "conv_kernel")
        cfg = cls(**kw)
        _positive_ints(cfg, where, "hidden_size", "num_hidden_layers", "num_attention_heads",
                       "intermediate_size", "num_conv_pos_embeddings", "num_conv_pos_embedding_groups")
        for name in ("conv_dim", "conv_stride", "conv_kernel"):
            _int_tuple(cfg, where, name)
        if not cfg.layer_norm_eps > 0:
            raise ConfigError(f"{where}: layer_norm_eps must be positive, got {cfg.layer_norm_eps!r}")
        if not len(cfg.conv_dim) == len(cfg.conv_stride) == len(cfg.conv_kernel):
            raise ConfigError(f"{where}: conv_dim, conv_stride and conv_kernel must have the same length")
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ConfigError(f"{where}: hidden_size {cfg.hidden_size} is not a multiple of "
                              f"num_attention_heads {cfg.num_attention_heads}")
        if cfg.hidden_size % cfg.num_conv_pos_embedding_groups:
            raise ConfigError(f"{where}: hidden_size {cfg.hidden_size} is not a multiple of "
                              f"num_conv_pos_embedding_groups {cfg.num_conv_pos_embedding_groups}")
        # Only the variant the Higgs checkpoint uses (HuBERT-base) is implemented.
        unsupported = [(cfg.feat_extract_norm != "group", f"feat_extract_norm={cfg.feat_extract_norm!r}"),
                       (cfg.hidden_act != "gelu", f"hidden_act={cfg.hidden_act!r}"),
                       (cfg.feat_extract_activation != "gelu",
                        f"feat_extract_activation={cfg.feat_extract_activation!r}"),
                       (cfg.do_stable_layer_norm, "do_stable_layer_norm=true"),
                       (cfg.conv_pos_batch_norm, "conv_pos_batch_norm=true")]
        bad = [text for flag, text in unsupported if flag]
        if bad:
            raise ConfigError(f"{where}: {', '.join(bad)} is not supported (omnicore implements the "
                              "HuBERT-base layout: group norm, GELU, post-LN, weight-normed pos conv)")
        return cfg


@dataclass(frozen=True)
class HiggsAudioV2TokenizerConfig:
    """`audio_tokenizer/config.json`: the whole codec, with the derived sizes as properties."""

    acoustic_model_config: DacConfig
    semantic_model_config: HubertConfig
    sample_rate: int = 24000
    semantic_sample_rate: int = 16000
    downsample_factor: int = 320
    codebook_size: int = 1024
    codebook_dim: int = 64
    kernel_size: int = 3
    unit_kernel_size: int = 3
    strides: tuple[int, ...] = (1, 1)
    channel_ratios: tuple[float, ...] = (1, 1)
    block_dilations: tuple[int, ...] = (1, 1)
    target_bandwidths: tuple[float, ...] = (0.5, 1, 1.5, 2)

    @classmethod
    def from_dict(cls, d: dict, where: str = "audio_tokenizer/config.json") -> "HiggsAudioV2TokenizerConfig":
        if d.get("model_type", "higgs_audio_v2_tokenizer") != "higgs_audio_v2_tokenizer":
            raise ConfigError(f"{where}: model_type is {d.get('model_type')!r}, expected "
                              "'higgs_audio_v2_tokenizer' (is this the audio_tokenizer/ config?)")
        for sub in ("acoustic_model_config", "semantic_model_config"):
            if not isinstance(d.get(sub), dict):
                raise ConfigError(f"{where}: missing the `{sub}` object")
        kw = _tuples(_fields_of(cls, d, where, nullable=("codebook_dim",)),
                     "strides", "channel_ratios", "block_dilations", "target_bandwidths")
        kw["acoustic_model_config"] = DacConfig.from_dict(d["acoustic_model_config"],
                                                          f"{where}: acoustic_model_config")
        kw["semantic_model_config"] = HubertConfig.from_dict(d["semantic_model_config"],
                                                             f"{where}: semantic_model_config")
        if kw.get("codebook_dim", 0) is None:  # transformers: null means "the fused latent width"
            kw["codebook_dim"] = (kw["acoustic_model_config"].hidden_size
                                  + kw["semantic_model_config"].hidden_size)
        cfg = cls(**kw)
        _positive_ints(cfg, where, "sample_rate", "semantic_sample_rate", "downsample_factor",
                       "codebook_size", "codebook_dim", "kernel_size", "unit_kernel_size")
        for name in ("strides", "block_dilations"):
            _int_tuple(cfg, where, name)
        if len(cfg.strides) != len(cfg.channel_ratios):
            raise ConfigError(f"{where}: strides and channel_ratios must have the same length")
        if any(s != 1 for s in cfg.strides) or any(r != 1 for r in cfg.channel_ratios):
            raise ConfigError(f"{where}: only strides [1, ...] and channel_ratios [1, ...] are supported "
                              f"(got {list(cfg.strides)}, {list(cfg.channel_ratios)})")
        tb = cfg.target_bandwidths
        if not tb or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 for b in tb):
            raise ConfigError(f"{where}: target_bandwidths must be a non-empty list of positive numbers")
        if cfg.num_quantizers < 1:
            raise ConfigError(f"{where}: target_bandwidths {list(tb)} give no quantizer at this frame rate")
        if cfg.semantic_downsample_factor < 1:
            raise ConfigError(f"{where}: hop_length {cfg.hop_length} and downsample_factor "
                              f"{cfg.downsample_factor} give a semantic downsampling factor below 1")
        return cfg

    @property
    def hop_length(self) -> int:
        """Waveform samples per code frame (960 = 8*5*4*2*3 in the released checkpoint)."""
        return math.prod(self.acoustic_model_config.downsampling_ratios)

    @property
    def frame_rate(self) -> int:
        return math.ceil(self.sample_rate / self.hop_length)

    @property
    def codebook_nbits(self) -> int:
        return math.ceil(math.log2(self.codebook_size))

    @property
    def num_quantizers(self) -> int:
        """Codebooks at the highest target bandwidth (8 for the released checkpoint)."""
        return int(1000 * self.target_bandwidths[-1] // (self.frame_rate * self.codebook_nbits))

    @property
    def hidden_size(self) -> int:
        """Width of the fused latent the quantizer works in: acoustic + semantic channels."""
        return self.acoustic_model_config.hidden_size + self.semantic_model_config.hidden_size

    @property
    def semantic_downsample_factor(self) -> int:
        """HuBERT frames per code frame (2: HuBERT runs at 50 Hz, codes at 25 Hz)."""
        return int(self.hop_length / (self.sample_rate / self.semantic_sample_rate) / self.downsample_factor)


# The released codec's rates (24 kHz, 960 samples per frame = 25 frames per second), for what has
# no loaded codec at hand: input limits in seconds, the duration rule, defaults. What has one
# (the pipeline, streaming, the CLI's codec commands) reads its own rates from its config.
SAMPLE_RATE = 24000
HOP_LENGTH = 960
FRAME_RATE = SAMPLE_RATE // HOP_LENGTH


def resolve_generation_config(generation_config, kwargs: dict,
                              default_profile: str = "exact") -> GenerationConfig:
    """The GenerationConfig of a call from `generation_config` (a GenerationConfig, a dict of
    its fields, or None) and keyword arguments naming its fields.

    The reference lets `generation_config` silently win over the keyword arguments; here a
    keyword that disagrees with it is an InputError (it would be ignored), one that agrees is
    fine. Unknown names are an InputError. Without `generation_config`, the keyword `profile`
    (else `default_profile`: the model's) picks the base settings (`GenerationConfig.for_profile`)
    and the other keywords change them.
    """
    names = {f.name for f in fields(GenerationConfig)}
    unknown = set(kwargs) - names
    if unknown:
        raise InputError(f"unknown argument(s): {', '.join(sorted(unknown))}")
    if generation_config is None:
        rest = {k: v for k, v in kwargs.items() if k != "profile"}
        gen = GenerationConfig.for_profile(kwargs.get("profile", default_profile), **rest)
        validate_sampling(gen)
        return gen
    if isinstance(generation_config, dict):
        bad = [k for k in generation_config if k not in names]
        if bad:
            raise InputError(f"generation_config: unknown field(s) {', '.join(map(repr, bad))}; "
                             f"the fields are {', '.join(sorted(names))}")
        base = GenerationConfig(**generation_config)
    elif isinstance(generation_config, GenerationConfig):
        base = generation_config
    else:
        raise InputError("generation_config must be a GenerationConfig or a dict of its fields, "
                         f"got {type(generation_config).__name__}")
    clash = [k for k, v in kwargs.items() if getattr(base, k) != v]
    if clash:
        k = clash[0]
        raise InputError(
            f"{k}={kwargs[k]!r} conflicts with generation_config's {k}={getattr(base, k)!r}; "
            "pass each setting once: in generation_config (dataclasses.replace(config, "
            f"{k}=...) makes a changed copy) or as a keyword argument")
    validate_sampling(base)
    return base


# ---------------------------------------------------------------------------------------------
# Bounds of the sampling knobs
# ---------------------------------------------------------------------------------------------

# Seeds feed numpy's default_rng, which takes any non-negative integer; 64 bits is plenty.
MAX_SEED = 2**64 - 1

# Sampling knobs. Scoring runs in float32 (log-probabilities of a few hundred at most), so these
# bounds keep every product and quotient finite: guidance c + g (c - u), the layer penalty times
# a codebook index, a score divided by a temperature, and the shifted time grid. They are far
# outside what changes the output meaningfully (reference defaults: 2, 5, 5, 0, t_shift 0.1).
MAX_GUIDANCE = 100.0
MAX_LAYER_PENALTY = 1000.0
TEMPERATURE_RANGE = (1e-3, 1e3)  # or exactly 0 (greedy / pure confidence order)
T_SHIFT_RANGE = (1e-3, 1e3)


def real_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputError(f"{what} must be a number, got {type(value).__name__}.")
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range, e.g. 10**400
        raise InputError(f"{what} must be a finite number, got an integer of "
                         f"{int(value).bit_length()} bits.") from None
    if not math.isfinite(value):
        raise InputError(f"{what} must be a finite number, got {value}.")
    return value


def validate_seed(seed: object, n: int = 1) -> list[int | None]:
    """One seed per item from ``seed``: ``None`` (fresh entropy), one integer in
    [0, ``MAX_SEED``] for every item, or a list/tuple of ``n`` such integers (or ``None``)."""
    def one(s):
        if s is None:
            return None
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise InputError(f"seed must be an integer >= 0 or None, got {type(s).__name__} {s!r}.")
        if not 0 <= s <= MAX_SEED:
            raise InputError(f"seed must lie in [0, 2**64 - 1], got {s}; use e.g. seed=42.")
        return int(s)

    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise InputError(f"got {len(seed)} seeds for {n} texts; pass one seed or one per text.")
        return [one(s) for s in seed]
    return [one(seed)] * n


def validate_sampling(gen) -> None:
    """The sampling knobs of a ``GenerationConfig`` within the bounds above, else
    ``InputError`` (past them float32 scoring overflows and cells stay masked)."""
    def within(name, lo, hi, zero_ok=False):
        value = real_number(getattr(gen, name), name)
        if not (lo <= value <= hi or (zero_ok and value == 0)):
            zero = "0 or " if zero_ok else ""
            raise InputError(f"{name} is {value:g}; it must be {zero}between {lo:g} and {hi:g}.")

    within("guidance_scale", 0.0, MAX_GUIDANCE)
    within("layer_penalty_factor", 0.0, MAX_LAYER_PENALTY)
    within("position_temperature", *TEMPERATURE_RANGE, zero_ok=True)
    within("class_temperature", *TEMPERATURE_RANGE, zero_ok=True)
    within("t_shift", *T_SHIFT_RANGE)
