"""Text cleaning, tokenization and prompt assembly, checked id for id against the reference
(tests/fixtures/reference/backbone_*.npz, dumped by tools/reference/dump_backbone.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.machinery import checkpoint
from omnicore.machinery.checkpoint import load_tokenizer
from omnicore.errors import ConfigError, InputError, ModelNotFoundError, WeightsError
from omnicore.model.tokenizer import (NONVERBAL_TAGS, SPECIAL_TOKENS, TextTokenizer, combine_text,
                                      prepare_item, tokenize_with_nonverbal_tags)

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "weights" / "tiny-random"
FIX = ROOT / "tests" / "fixtures" / "reference"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(CKPT)


@pytest.fixture(scope="module")
def cfg():
    return checkpoint.read_config(CKPT / "config.json")


@pytest.fixture(scope="module")
def ref():
    with np.load(FIX / "backbone_tokenizer.npz", allow_pickle=False) as z:
        return dict(z)


def _unragged(flat, offsets):
    return [flat[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


def _fixture_items():
    """(npz name, prefix) of every item whose prepared inputs the reference dumped."""
    out = []
    with np.load(FIX / "backbone_batch.npz", allow_pickle=False) as z:
        out += [("backbone_batch.npz", p[: -len("input_ids")]) for p in z.files if p.endswith("_input_ids")]
    with np.load(FIX / "backbone_single.npz", allow_pickle=False) as z:
        out += [("backbone_single.npz", p[: -len("input_ids")]) for p in z.files if p.endswith("_input_ids")]
    return out


def test_special_ids_come_from_the_file(tok, ref):
    assert list(ref["special_tokens"]) == list(SPECIAL_TOKENS)
    assert [tok.special_ids[t] for t in SPECIAL_TOKENS] == ref["special_ids"].tolist()
    # the tiny checkpoint's ids are nowhere near the real model's 151669..: nothing hard-coded
    assert max(tok.special_ids.values()) < 151669


def test_plain_encoding_matches_reference(tok, ref):
    want = _unragged(ref["plain_ids"], ref["plain_offsets"])
    for s, ids in zip(ref["strings"], want):
        assert tok.encode(str(s), add_special_tokens=True) == ids, repr(s)


def test_nonverbal_tag_tokenization_matches_reference(tok, ref):
    want = _unragged(ref["tagged_ids"], ref["tagged_offsets"])
    assert any(len(w) for w in want)
    for s, ids in zip(ref["strings"], want):
        assert tokenize_with_nonverbal_tags(tok, str(s)) == ids, repr(s)


def test_tags_are_tokenized_on_their_own(tok):
    # BPE across the bracket would differ from the tag alone for at least one neighbour
    # Punctuation next to a bracket would merge with it in a plain encoding ("?[" and "].").
    tag_ids = tok.encode("[laughter]")
    n = len(tag_ids)
    plain_differs = False
    for text in ("Really?[laughter].", "你好，[laughter]。世界", "x [laughter] y"):
        ids = tokenize_with_nonverbal_tags(tok, text)
        assert any(ids[i:i + n] == tag_ids for i in range(len(ids) - n + 1)), text
        plain_differs |= ids != tok.encode(text)
    assert plain_differs


def test_combine_text_matches_reference(ref):
    for text, r, want in zip(ref["combine_text"], ref["combine_ref"], ref["combine_out"]):
        r = None if str(r) == "<None>" else str(r)
        assert combine_text(str(text), r) == str(want)


_text = st.text(alphabet=st.sampled_from(list("ab 中文\t\r\n（）() \u3000x")), max_size=30)


@settings(max_examples=60, deadline=None)
@given(_text, st.one_of(st.none(), _text))
def test_combine_text_properties(text, ref_text):
    out = combine_text(text, ref_text)
    assert "\r" not in out and "\n" not in out
    assert "\uff08" not in out and "\uff09" not in out
    assert "  " not in out and "\t\t" not in out and " \t" not in out and "\t " not in out
    for i, ch in enumerate(out):
        if "\u4e00" <= ch <= "\u9fff":
            assert not (i > 0 and out[i - 1].isspace()) and not (i + 1 < len(out) and out[i + 1].isspace())


@pytest.mark.parametrize("npz,prefix", _fixture_items())
def test_prepared_inputs_match_reference(tok, cfg, npz, prefix):
    with np.load(FIX / npz, allow_pickle=False) as z:
        d = {k[len(prefix):]: z[k] for k in z.files if k.startswith(prefix)}
    item = prepare_item(tok, cfg, str(d["text"]), int(d["num_target"]),
                        ref_text=str(d["ref_text"]) or None, ref_codes=d.get("ref_codes"),
                        lang=str(d["lang"]) or None, instruct=str(d["instruct"]) or None,
                        denoise=bool(d["denoise"]))
    assert item.input_ids.dtype == np.int64
    np.testing.assert_array_equal(item.input_ids, d["input_ids"])
    np.testing.assert_array_equal(item.audio_mask, d["audio_mask"])
    T = int(d["num_target"])
    assert item.num_target == T and item.num_prompt == d["input_ids"].shape[1] - T
    np.testing.assert_array_equal(item.uncond_ids, d["input_ids"][:, -T:])
    assert item.uncond_audio_mask.all() and item.uncond_audio_mask.shape == (T,)


def test_layout_of_a_clone_prompt(tok, cfg):
    C, mask = cfg.num_audio_codebook, cfg.audio_mask_id
    ref_codes = np.arange(C * 5).reshape(C, 5) % 1000
    item = prepare_item(tok, cfg, "target", 7, ref_text="ref", ref_codes=ref_codes, lang="en")
    sp = tok.special_ids
    ids, S = item.input_ids, item.input_ids.shape[1]
    n_text = S - 5 - 7
    assert ids[0, 0] == sp["<|denoise|>"] and ids[0, 1] == sp["<|lang_start|>"]
    assert ids[0, n_text - 1] == sp["<|text_end|>"]
    assert (ids[:, :n_text] == ids[0, :n_text]).all()  # text repeated on every codebook row
    np.testing.assert_array_equal(ids[:, n_text:n_text + 5], ref_codes)
    assert (ids[:, -7:] == mask).all()
    assert not item.audio_mask[:n_text].any() and item.audio_mask[n_text:].all()
    # denoise only with reference codes, and only when asked
    no_ref = prepare_item(tok, cfg, "target", 7)
    assert no_ref.input_ids[0, 0] == sp["<|lang_start|>"]
    off = prepare_item(tok, cfg, "target", 7, ref_codes=ref_codes, denoise=False)
    assert off.input_ids[0, 0] == sp["<|lang_start|>"]
    # a missing language or instruct is spelled "None"
    none_ids = tok.encode("None")
    assert no_ref.input_ids[0, 1:1 + len(none_ids)].tolist() == none_ids


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_target=0), "positive integer"),
    (dict(num_target=2.5), "positive integer"),
    (dict(ref_codes=np.zeros((3, 4), np.int64)), "shape"),
    (dict(ref_codes=np.zeros((8, 0), np.int64)), "shape"),
    (dict(ref_codes=np.full((8, 4), 1024)), r"\[0, 1024\)"),
    (dict(ref_codes=np.full((8, 4), -1)), r"\[0, 1024\)"),
    (dict(ref_codes=np.zeros((8, 4), np.float32)), "integers"),
    (dict(text=None), "string"),
])
def test_bad_inputs_raise_input_error(tok, cfg, kwargs, match):
    args = dict(text="hello", num_target=5) | kwargs
    with pytest.raises(InputError, match=match):
        prepare_item(tok, cfg, **args)


def test_missing_or_foreign_tokenizer(tmp_path):
    with pytest.raises(ModelNotFoundError):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(WeightsError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    # a valid tokenizer without OmniVoice's control tokens
    data = json.loads((CKPT / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|text_end|>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="text_end"):
        load_tokenizer(tmp_path)


def test_token_ids_beyond_the_model_vocabulary_are_refused(tok, cfg):
    import dataclasses

    small = dataclasses.replace(cfg, llm_config=dataclasses.replace(cfg.llm_config, vocab_size=10))
    with pytest.raises(ConfigError, match="vocabulary"):
        prepare_item(tok, small, "hello", 3)


class _RecordingTokenizer:
    """Passes `encode` through to a tokenizer and records each piece of text it was given."""

    def __init__(self, tok):
        self.tok, self.pieces = tok, []

    def encode(self, text, **kw):
        self.pieces.append(text)
        return self.tok.encode(text, **kw)


def test_every_tag_is_encoded_on_its_own(tok):
    assert isinstance(tok, TextTokenizer)
    for tag in NONVERBAL_TAGS:
        rec = _RecordingTokenizer(tok)
        ids = tokenize_with_nonverbal_tags(rec, f"Oh?[{tag}].")
        assert rec.pieces == ["Oh?", f"[{tag}]", "."], tag  # a tag the splitter missed is one piece
        assert ids == tok.encode("Oh?") + tok.encode(f"[{tag}]") + tok.encode(".")
    # near misses are not tags: other case, unknown name, no closing bracket
    for text in ("Oh?[Laughter].", "Oh?[laughters].", "Oh?[laughter."):
        rec = _RecordingTokenizer(tok)
        assert tokenize_with_nonverbal_tags(rec, text) == tok.encode(text) and rec.pieces == [text]
