"""Text normalisation (omnicore.text.normalize, `normalize_text=True`) against the reference.

The fixture (tests/fixtures/reference/normalize_cases.json, tools/reference/dump_normalize.py)
holds the reference's `normalize_text` outputs for a few hundred inputs and, for a set of
generate() calls, what its `_preprocess_all` / `_generate_chunked` made of the text: the
spoken text, the instruct resolved against it, the ref_text (untouched), the frame estimate and
the chunks. Both are compared string for string. The libraries are the `tn` extra: without
them these comparisons skip (fail under CI); the error a user gets without them is tested by
hiding the modules, so it runs everywhere.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import missing

from omnicore.text import normalize
from omnicore.errors import ConfigError, InputError
from omnicore import OmniVoice, VoiceClonePrompt
from omnicore.model.config import resolve_generation_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
FIXTURE = ROOT / "tests" / "fixtures" / "reference" / "normalize_cases.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))


def _require_tn():
    for name in ("tn", "pynini", "num2words"):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing(f"the Python module {name!r}", f"{exc}; pip install -e '.[tn]'")


def _versions_note() -> str:
    from importlib import metadata

    got = {}
    for name in CASES["versions"]:
        try:
            got[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            got[name] = None
    return f"fixture made with {CASES['versions']}, installed {got}"


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


@pytest.fixture
def fresh(monkeypatch):
    """Fresh lazily-built normalisers and an empty result cache, for tests that hide modules."""
    monkeypatch.setattr(normalize, "_ZH", normalize._Lazy("tn.chinese.normalizer", {}))
    monkeypatch.setattr(normalize, "_EN", normalize._Lazy("tn.english.normalizer", {}))
    normalize._normalize.cache_clear()
    yield
    normalize._normalize.cache_clear()


# ---------------------------------------------------------------------------------------------
# The reference's outputs
# ---------------------------------------------------------------------------------------------


def test_fixture_covers_what_it_claims():
    cases = CASES["cases"]
    langs = {c["language"] for c in cases}
    assert len(cases) >= 300 and {"en", "zh", None, "de", "ja", "ar", "yue"} <= langs
    assert sum(c["text"] != c["output"] for c in cases) >= 250  # mostly inputs that change
    assert any("[B EY1 S]" in c["output"] for c in cases)
    assert any("NI3" in c["output"] and c["language"] == "zh" for c in cases)


@pytest.mark.slow
def test_normalize_text_matches_reference_string_for_string():
    _require_tn()
    bad = []
    for c in CASES["cases"]:
        got = normalize.normalize_text(c["text"], c["language"])
        if got != c["output"]:
            bad.append(f"{c['language']!r} {c['text']!r}: got {got!r}, reference {c['output']!r}")
    assert not bad, f"{len(bad)} of {len(CASES['cases'])} differ ({_versions_note()}):\n" + "\n".join(bad[:20])


def test_generate_applies_it_where_the_reference_does(model):
    """Target text only (not ref_text), after the language is resolved, before the instruct's
    language is chosen, the length is estimated and long text is chunked."""
    _require_tn()
    gen = resolve_generation_config(None, {})
    for c in CASES["pipeline"]:
        prompt = None
        if c["ref_text"] is not None:
            prompt = VoiceClonePrompt(np.zeros((8, c["num_ref_frames"]), np.int64), c["ref_text"], 0.05)
        (r,), (plan,), _, _ = model._passes(
            c["text"], language=c["language"], voice_clone_prompt=prompt, instruct=c["instruct"],
            duration=c["duration"], speed=c["speed"], generation_config=gen, normalize_text=True)
        want = c["out"]
        got = {"text": r.paused.spoken, "language": r.language,
               "instruct": r.instruct_for(r.paused.spoken), "ref_text": r.ref_text,
               "frames": plan.frames}
        assert got == {k: want[k] for k in got}, c["text"][:80]
        if want["chunks"] is None:
            assert not plan.chunked
        else:
            chunks = [{"text": k.text, "frames": k.frames, "ref_text": k.ref_text}
                      for k in plan.chunks]
            assert chunks == want["chunks"], c["text"][:80]


def test_generate_speaks_the_normalised_text(model):
    _require_tn()
    kw = dict(num_step=2, seed=5, language="en")
    a = model.synthesize("I have 3 cats.", normalize_text=True, **kw)[0]
    b = model.synthesize("I have three cats.", **kw)[0]
    assert a.text_chunks == b.text_chunks == ["I have three cats."]
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.audio, b.audio)
    off = model.synthesize("I have 3 cats.", **kw)[0]  # off by default: the text as written
    assert off.text_chunks == ["I have 3 cats."]


def _stream_codes(model, text, **kw):
    """The codes of every chunk of a stream run to its end, joined along time."""
    st = model.stream(text, **kw)
    for _ in st:
        pass
    return np.concatenate([s["codes"] for s in st.chunk_stats], axis=1)


def test_stream_normalises_chunk_by_chunk(model):
    """Whole string and fragments alike; the same codes as the text written out."""
    from omnicore.text import planner

    _require_tn()
    kw = dict(num_step=2, seed=5, language="en")
    text = "It costs $45.50 today. I have 3 cats and 12 dogs, and they eat a lot every day."
    spoken = _stream_codes(model, text, normalize_text=True, **kw)
    frags = _stream_codes(model, iter([text[:9], text[9:30], text[30:]]), normalize_text=True, **kw)
    assert np.array_equal(spoken, frags)
    chunks = planner.split_text(text)
    assert len(chunks) >= 2
    written = [normalize.normalize_text(c, "en") for c in chunks]
    assert written[0] != chunks[0]
    ref = [model.synthesize(w, **kw)[0].codes for w in written]
    parts = np.split(spoken, np.cumsum([r.shape[1] for r in ref])[:-1], axis=1)
    # chunk 0 has no voice reference, as in synthesize(); later chunks are conditioned on it
    assert np.array_equal(parts[0], ref[0])
    pieces = list(model.stream(text, normalize_text=True, **kw))
    assert sum(len(p) for p in pieces) > 0
    # duration paces the spoken form too
    timed = _stream_codes(model, "I have 3 cats.", normalize_text=True, duration=3.0, **kw)
    same = _stream_codes(model, "I have three cats.", duration=3.0, **kw)
    assert np.array_equal(timed, same)


# ---------------------------------------------------------------------------------------------
# Errors and argument checks (no tn extra needed)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module,text,lang", [("tn.english.normalizer", "I have 3 cats.", "en"),
                                              ("tn.chinese.normalizer", "我有3只猫。", None),
                                              ("tn.english.normalizer", "[laughter]", "en"),
                                              ("num2words", "Ich habe 3 Katzen.", "de")])
def test_missing_extra_is_a_config_error_naming_the_fix(fresh, monkeypatch, module, text, lang):
    monkeypatch.setitem(sys.modules, module, None)  # import of it raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'omnicore\[tn\]'"):
        normalize.normalize_text(text, lang)


def test_missing_extra_fails_generate_before_any_work(fresh, monkeypatch, model):
    monkeypatch.setitem(sys.modules, "tn.english.normalizer", None)
    with pytest.raises(ConfigError, match=r"omnicore\[tn\]"):
        model.generate("I have 3 cats.", normalize_text=True, num_step=2)
    with pytest.raises(ConfigError, match=r"omnicore\[tn\]"):
        model.stream("I have 3 cats.", normalize_text=True, num_step=2)
    assert model.generate("I have 3 cats.", num_step=2, seed=1)[0].size  # off: not needed


def test_bad_arguments(model):
    for bad in ("yes", 1, None):
        with pytest.raises(InputError, match="normalize_text must be True or False"):
            model.generate("Hi.", normalize_text=bad, num_step=2)
    with pytest.raises(InputError):
        normalize.normalize_text(["a list"])
    with pytest.raises(InputError):
        normalize.normalize_text("12", language=3)
    assert normalize.normalize_text("   ") == "   " and normalize.normalize_text("") == ""


def test_language_codes_resolve_as_in_the_reference():
    r = normalize.resolve_lang_code
    assert r(None, "12 个") == "zh" and r(None, "12 cats") == "en" and r("none", "12") == "en"
    assert r(" German ", "x") == "de" and r("EN", "x") == "en" and r("DE", "x") == "de"
    assert r("Klingon", "x") == "klingon" and r("vai", "x") == "vai"  # ids before names


# ---------------------------------------------------------------------------------------------
# The CLI
# ---------------------------------------------------------------------------------------------


def test_cli_say_and_batch_normalize_text(tmp_path):
    from omnicore.apps import cli

    _require_tn()
    common = ["--model", str(TINY), "--steps", "2", "--seed", "3", "--language", "en", "-q"]
    assert cli.main(["say", "I have 3 cats.", "-o", str(tmp_path / "a.wav"), "--normalize-text",
                     *common]) == 0
    assert cli.main(["say", "I have three cats.", "-o", str(tmp_path / "b.wav"), *common]) == 0
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": "n", "text": "I have 3 cats."}) + "\n")
    assert cli.main(["batch", str(jobs), "--out-dir", str(tmp_path / "out"), "--normalize-text",
                     *common]) == 0
    assert (tmp_path / "out" / "n.wav").read_bytes() == (tmp_path / "a.wav").read_bytes()
