"""Text tokenization and the model input of one synthesis item: the product's form of
`spec.prompt_row` (model/spec.py; tests/test_spec.py holds the two equal).

OmniVoice's backbone reads one "conditional" row per item, laid out along the sequence axis as

    [<|denoise|>] <|lang_start|>lang<|lang_end|> <|instruct_start|>instruct<|instruct_end|>
    <|text_start|> ref_text + " " + text <|text_end|>   reference codes (R)   MASK x T

Every text token is copied onto all C codebook rows, so the row is an integer matrix [C, S]. An
`audio_mask` marks the audio part (reference codes and targets); the backbone embeds those
positions with the audio tables and the rest with the text table. Classifier-free guidance
uses an "unconditional" row made of the T target positions alone.

Dimension legend:
    C  audio codebooks (8)          S  length of the conditional row
    R  reference (prompt) frames    T  target frames to generate

The text tokenizer is the checkpoint's own `tokenizer.json` (read by omnicore.machinery.checkpoint) run
through the `tokenizers` library. The ids of OmniVoice's control tokens are read from that file, never assumed: the
real checkpoint puts them at 151669..151675, the tiny test checkpoint somewhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import OmniVoiceConfig
from ..errors import ConfigError, InputError, WeightsError

SPECIAL_TOKENS = ("<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>",
                  "<|instruct_end|>", "<|text_start|>", "<|text_end|>")

# Tags the model was trained to voice as sounds. They are plain text to the tokenizer, so they
# are cut out and tokenized on their own: the ids of "[laughter]" then never depend on the
# characters around it (BPE would otherwise merge across the bracket in some scripts).
NONVERBAL_TAGS = ("laughter", "sigh", "confirmation-en", "question-en", "question-ah",
                  "question-oh", "question-ei", "question-yi", "surprise-ah", "surprise-oh",
                  "surprise-wa", "surprise-yo", "dissatisfaction-hnn")
_NONVERBAL_RE = re.compile(r"\[(?:" + "|".join(re.escape(t) for t in NONVERBAL_TAGS) + r")\]")

_LINE_BREAKS_RE = re.compile(r"[\r\n]+")
_BLANKS_RE = re.compile(r"[ \t]+")
# Whitespace (any kind, as the reference uses \s) touching a CJK ideograph on either side.
_SPACE_NEAR_CJK_RE = re.compile(r"(?<=[\u4e00-\u9fff])\s+|\s+(?=[\u4e00-\u9fff])")


class TextTokenizer:
    """The checkpoint's BPE tokenizer plus the ids of OmniVoice's control tokens."""

    def __init__(self, backend, path: str = "<memory>"):
        self.backend = backend  # a tokenizers.Tokenizer
        self.path = str(path)
        ids = {}
        for tok in SPECIAL_TOKENS:
            tid = backend.token_to_id(tok)
            # A control token must be a single added token, or "<|text_start|>" typed by the
            # prompt builder would be split into ordinary pieces and the model sees garbage.
            if tid is None or backend.encode(tok, add_special_tokens=False).ids != [tid]:
                raise ConfigError(f"{self.path}: the tokenizer has no single token {tok!r}; "
                                  "this is not an OmniVoice tokenizer.json")
            ids[tok] = tid
        self.special_ids: dict[str, int] = ids

    @classmethod
    def from_json(cls, text: str, path: str | Path = "<memory>") -> "TextTokenizer":
        """The tokenizer described by a tokenizer.json's text (`path` names it in errors)."""
        try:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(text)
        except Exception as exc:  # the Rust side raises plain Exception on bad JSON
            raise WeightsError(f"{path}: cannot load the tokenizer ({exc})") from None
        return cls(backend, path)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids


def combine_text(text: str, ref_text: str | None = None) -> str:
    """The transcript the model reads: reference transcript, a space, then the target text.

    Cleaned the way the model saw text in training: line breaks removed, fullwidth
    parentheses made ASCII, runs of spaces/tabs collapsed, and no whitespace next to a CJK
    ideograph (Chinese is written without spaces, so a space there would be a foreign token).
    The product's form of `spec.clean_text`.
    """
    full = f"{ref_text.strip()} {text.strip()}" if ref_text else text.strip()
    full = _LINE_BREAKS_RE.sub("", full)
    full = full.replace("\uff08", "(").replace("\uff09", ")")
    full = _BLANKS_RE.sub(" ", full)
    return _SPACE_NEAR_CJK_RE.sub("", full)


def tokenize_with_nonverbal_tags(tok: TextTokenizer, text: str) -> list[int]:
    """Token ids of `text` with every non-verbal tag and every stretch between tags encoded apart.
    The product's form of `spec.text_ids`."""
    pieces = []
    start = 0
    for m in _NONVERBAL_RE.finditer(text):
        pieces.append(text[start:m.start()])
        pieces.append(m.group())
        start = m.end()
    pieces.append(text[start:])
    ids = [i for piece in pieces if piece for i in tok.encode(piece)]
    # Only a text made of nothing at all yields no pieces; the reference then falls back to a
    # plain call with the tokenizer's default post-processing.
    return ids if ids else tok.encode(text, add_special_tokens=True)


@dataclass(frozen=True)
class PreparedItem:
    """The backbone input of one item: its conditional row and where the targets are.

    input_ids  [C, S] int64: text ids (same on every row), reference codes, then MASK x T
    audio_mask [S] bool: True from the first reference frame (or first target) on
    num_target T: the last T positions are the frames to generate
    """

    input_ids: np.ndarray
    audio_mask: np.ndarray
    num_target: int

    @property
    def num_prompt(self) -> int:
        """Positions before the targets (style, text and reference frames)."""
        return self.input_ids.shape[1] - self.num_target

    @property
    def uncond_ids(self) -> np.ndarray:
        # [C, S] -> [C, T]: guidance compares against the targets seen without any prompt
        return self.input_ids[:, -self.num_target:]

    @property
    def uncond_audio_mask(self) -> np.ndarray:
        return self.audio_mask[-self.num_target:]  # [S] -> [T]


def style_ids(tok: TextTokenizer, lang: str | None, instruct: str | None,
              with_denoise: bool) -> list[int]:
    """Ids of the control prefix: optional <|denoise|>, then language and instruct fields.

    `lang` is an already resolved language id (e.g. "en") and `instruct` an already validated
    instruct string; missing ones are written as the literal word "None", as in training.
    The product's form of the style prefix of `spec.prompt_row`.
    """
    text = "<|denoise|>" if with_denoise else ""
    text += f"<|lang_start|>{lang or 'None'}<|lang_end|>"
    text += f"<|instruct_start|>{instruct or 'None'}<|instruct_end|>"
    # The reference encodes this string with the tokenizer's default post-processing on.
    return tok.encode(text, add_special_tokens=True)


def prepare_item(tok: TextTokenizer, cfg: OmniVoiceConfig, text: str, num_target: int,
                 ref_text: str | None = None, ref_codes: np.ndarray | None = None,
                 lang: str | None = None, instruct: str | None = None,
                 denoise: bool = True) -> PreparedItem:
    """Build the conditional row of one item.

    text       target text (already normalised by the text front-end)
    num_target T, the number of frames to generate (>= 1)
    ref_text   transcript of the reference audio (voice cloning), or None
    ref_codes  [C, R] integer codes of the reference audio, or None
    lang, instruct  resolved language id and validated instruct string, or None
    denoise    put <|denoise|> first; only takes effect with reference codes
    The product's form of `spec.prompt_row`.
    """
    C, mask_id = cfg.num_audio_codebook, cfg.audio_mask_id
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
    if isinstance(num_target, bool) or not isinstance(num_target, (int, np.integer)) or num_target < 1:
        raise InputError(f"the number of target frames must be a positive integer, got {num_target!r}")
    if ref_codes is not None:
        ref_codes = np.asarray(ref_codes)
        if ref_codes.ndim != 2 or ref_codes.shape[0] != C or ref_codes.shape[1] < 1:
            raise InputError(f"reference codes must have shape [{C}, frames] with at least one "
                             f"frame, got {list(ref_codes.shape)}")
        if ref_codes.dtype.kind not in "iu":
            raise InputError(f"reference codes must be integers, got dtype {ref_codes.dtype}")
        if ref_codes.min() < 0 or ref_codes.max() >= mask_id:
            raise InputError(f"reference codes must lie in [0, {mask_id}); got values "
                             f"{int(ref_codes.min())}..{int(ref_codes.max())}: were they "
                             "produced by this model's audio tokenizer?")

    prefix = style_ids(tok, lang, instruct, with_denoise=denoise and ref_codes is not None)
    transcript = f"<|text_start|>{combine_text(text, ref_text)}<|text_end|>"
    text_ids = np.asarray(prefix + tokenize_with_nonverbal_tags(tok, transcript), dtype=np.int64)
    if text_ids.max() >= cfg.llm_config.vocab_size:
        raise ConfigError(f"{tok.path}: token id {int(text_ids.max())} is outside the model's "
                          f"text vocabulary ({cfg.llm_config.vocab_size}); tokenizer.json and "
                          "config.json do not belong together")

    R = 0 if ref_codes is None else ref_codes.shape[1]
    parts = [np.broadcast_to(text_ids, (C, text_ids.size))]  # [L] -> [C, L]
    if ref_codes is not None:
        parts.append(ref_codes.astype(np.int64))  # [C, R]
    parts.append(np.full((C, num_target), mask_id, dtype=np.int64))  # [C, T]
    input_ids = np.concatenate(parts, axis=1)  # [C, L + R + T]
    audio_mask = np.arange(input_ids.shape[1]) >= text_ids.size  # [S]
    return PreparedItem(input_ids=input_ids, audio_mask=audio_mask, num_target=int(num_target))
