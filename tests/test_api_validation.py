"""Bad values at the public API get typed errors, never raw tracebacks or silent wrong audio:
voice prompt values (from a file or passed in), conflicting generation settings, seeds,
reference transcripts, codec inputs; and the demo shows the same messages.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnicore import OmniVoice, VoiceClonePrompt
from omnicore.text import limits
from omnicore.model.config import GenerationConfig
from omnicore.errors import AudioError, InputError, RefTextMismatchWarning, VoicePromptError

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
FAST = dict(num_step=2, position_temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


def _write_prompt(path, tokens, meta_update=None, raw_meta: bytes | None = None):
    meta = {"format": "omnicore-voice-prompt", "version": 1, "ref_text": "Hello there.",
            "ref_rms": 0.05}
    meta.update(meta_update or {})
    data = raw_meta if raw_meta is not None else json.dumps(meta).encode("utf-8")
    np.savez(path, ref_audio_tokens=tokens, meta=np.frombuffer(data, np.uint8))
    return path


GOOD_CODES = np.random.default_rng(0).integers(0, 1024, (8, 40))


# ---------------------------------------------------------------------------------------------
# Voice prompt values
# ---------------------------------------------------------------------------------------------


BAD_PROMPT_VALUES = [
    ({"ref_rms": -0.05}, GOOD_CODES, "ref_rms"),
    ({"ref_rms": float("nan")}, GOOD_CODES, "ref_rms"),
    ({"ref_rms": 1e38}, GOOD_CODES, "ref_rms"),
    ({"ref_rms": 0}, GOOD_CODES, "ref_rms"),
    ({"ref_rms": "0.05"}, GOOD_CODES, "ref_rms"),
    ({"ref_rms": True}, GOOD_CODES, "ref_rms"),
    ({"ref_text": 5}, GOOD_CODES, "ref_text"),
    ({"ref_text": ""}, GOOD_CODES, "ref_text"),
    ({"ref_text": "a\ud800b"}, GOOD_CODES, "surrogate"),
    ({"ref_text": "word " * 1000}, GOOD_CODES, "ref_text"),
    ({}, GOOD_CODES + 1024, "codes"),
    ({}, -GOOD_CODES - 1, "codes"),
    ({}, GOOD_CODES[:3], "codes"),
    ({}, GOOD_CODES[:, :0], "frames"),
    ({}, GOOD_CODES.astype(np.float32), "codes"),
    ({}, GOOD_CODES[0], "shape"),
]


@pytest.mark.parametrize("meta,tokens,match", BAD_PROMPT_VALUES)
def test_bad_values_in_a_prompt_file(tmp_path, model, meta, tokens, match):
    path = _write_prompt(tmp_path / "v.npz", tokens, meta)
    with pytest.raises(VoicePromptError, match=match) as err:
        VoiceClonePrompt.load(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("meta,tokens,match", BAD_PROMPT_VALUES)
def test_save_refuses_what_load_refuses(tmp_path, meta, tokens, match):
    """One check: a prompt whose file `load` would refuse is not written by `save`."""
    values = {"ref_text": "Hello there.", "ref_rms": 0.05, **meta}
    prompt = VoiceClonePrompt(tokens, values["ref_text"], values["ref_rms"])
    path = tmp_path / "v.npz"
    with pytest.raises(VoicePromptError, match=match) as err:
        prompt.save(path)
    assert str(path) in str(err.value) and "not saved" in str(err.value)
    assert list(tmp_path.iterdir()) == []


# Each part is a valid one in about half of the draws, so that both outcomes are common.
_TOKENS = st.one_of(
    st.tuples(st.sampled_from(["int64", "int32", "int16", "uint16"]), st.sampled_from([(8, 1), (8, 40)]),
              st.sampled_from([0, 1023]), st.integers(0, 2**16)),
    st.tuples(st.sampled_from(["int64", "float32", "bool"]),
              st.sampled_from([(8, 40), (8, 0), (7, 20), (20,), (1, 8, 20), (8, limits.MAX_REF_FRAMES + 1)]),
              st.sampled_from([0, 1024, -1]), st.integers(0, 2**16)))
_REF_TEXT = st.one_of(st.text(min_size=1, max_size=30),
                      st.sampled_from(["", "  ", "a\ud800b", "w" * 2001, 5, None]))
_REF_RMS = st.one_of(st.floats(1e-6, 1.0),
                     st.one_of(st.floats(), st.sampled_from([-1, 0, 1, 2, True, "0.05", None])))


def _tokens(dtype, shape, extreme, seed):
    codes = np.random.default_rng(seed).integers(0, 1024, shape)
    if codes.size:
        codes.flat[seed % codes.size] = extreme
    return codes.astype(dtype)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=_TOKENS, ref_text=_REF_TEXT, ref_rms=_REF_RMS)
def test_save_and_load_agree_on_every_prompt(tmp_path, tokens, ref_text, ref_rms):
    """Any prompt: `save` writes it exactly when `load` would read the same values from a file,
    and what it writes loads back as the same voice."""
    codes = _tokens(*tokens)
    raw = _write_prompt(tmp_path / "raw.npz", codes, {"ref_text": ref_text, "ref_rms": ref_rms})
    try:
        VoiceClonePrompt.load(raw)
        loads = True
    except VoicePromptError:
        loads = False
    saved = tmp_path / "saved.npz"
    saved.unlink(missing_ok=True)
    try:
        VoiceClonePrompt(codes, ref_text, ref_rms).save(saved)
    except VoicePromptError:
        assert not loads and not saved.exists()
        return
    assert loads
    back = VoiceClonePrompt.load(saved)
    np.testing.assert_array_equal(back.ref_audio_tokens, codes)
    assert back.ref_text == ref_text and back.ref_rms == ref_rms


def test_a_prompt_shows_its_shape_length_and_transcript_not_its_codes():
    prompt = VoiceClonePrompt(np.arange(8 * 75, dtype=np.int64).reshape(8, 75), "Hello there.",
                              0.05)
    shown = repr(prompt)
    assert shown == "VoiceClonePrompt(codes 8x75, 3.00 s, ref_text='Hello there.', ref_rms=0.05)"
    long = VoiceClonePrompt(np.zeros((8, 250), np.int64), "word " * 100, 0.05)
    assert len(repr(long)) < 160 and "10.00 s" in repr(long)


def test_unreadable_meta_is_a_voice_prompt_error(tmp_path):
    for raw in (b"\xff\xfe", b"[1, 2]", b'{"format": "omnicore-voice-prompt"'):
        with pytest.raises(VoicePromptError):
            VoiceClonePrompt.load(_write_prompt(tmp_path / "v.npz", GOOD_CODES, raw_meta=raw))


def test_a_good_prompt_file_loads_and_generates(tmp_path, model):
    p = VoiceClonePrompt.load(_write_prompt(tmp_path / "v.npz", GOOD_CODES.astype(np.int32),
                                            {"ref_rms": 0.05}))
    assert p.ref_audio_tokens.dtype == np.int64 and p.ref_rms == 0.05
    wav = model.generate("Hi there.", voice_clone_prompt=p, **FAST)[0]
    assert np.isfinite(wav).all() and wav.size


@pytest.mark.parametrize("tokens,ref_text,ref_rms,match", [
    (GOOD_CODES, "Hi.", -1.0, "ref_rms"),
    (GOOD_CODES, "Hi.", float("inf"), "ref_rms"),
    (GOOD_CODES, "Hi.", None, "ref_rms"),
    (GOOD_CODES, 5, 0.05, "ref_text"),
    (GOOD_CODES, "Hi \udcff.", 0.05, "surrogate"),
    (GOOD_CODES + 2000, "Hi.", 0.05, "codes"),
    (GOOD_CODES[:4], "Hi.", 0.05, "codes"),
    (GOOD_CODES.tolist(), "Hi.", 0.05, "codes"),
    (np.zeros((8, limits.MAX_REF_FRAMES + 1), np.int64), "Hi.", 0.05, f"{limits.MAX_REF_S:g} s"),
])
def test_bad_prompt_objects_passed_to_generate(model, tokens, ref_text, ref_rms, match):
    p = VoiceClonePrompt(tokens, ref_text, ref_rms)
    with pytest.raises(InputError, match=match):
        model.generate("Hello.", voice_clone_prompt=p, **FAST)
    with pytest.raises(InputError, match=match):
        model.stream("Hello.", voice_clone_prompt=p, **FAST)


def test_prompt_made_from_a_clip_is_always_loadable(tmp_path, model):
    # A float clip louder than full scale has RMS > 1; stored capped, it still loads, and the
    # output is what the uncapped value gives (any RMS >= 0.1 leaves the output as it is).
    rng = np.random.default_rng(1)
    loud = (3.0 * rng.standard_normal(24000 * 2)).astype(np.float32)
    p = model.create_voice_clone_prompt((loud, 24000), "Loud.", preprocess_prompt=False)
    assert p.ref_rms == limits.MAX_REF_RMS
    p.save(tmp_path / "loud.npz")
    assert VoiceClonePrompt.load(tmp_path / "loud.npz").ref_rms == limits.MAX_REF_RMS
    with pytest.raises(AudioError, match="silence"):
        model.create_voice_clone_prompt((np.zeros(24000, np.float32), 24000), "Nothing.",
                                        preprocess_prompt=False)


# ---------------------------------------------------------------------------------------------
# Generation settings
# ---------------------------------------------------------------------------------------------


def test_conflicting_generation_settings_are_refused(model):
    cfg = GenerationConfig(num_step=2)
    with pytest.raises(InputError, match="num_step=7 conflicts"):
        model.synthesize("Hi.", generation_config=cfg, num_step=7)
    with pytest.raises(InputError, match="conflicts"):
        model.stream("Hi.", generation_config=cfg, num_step=7)
    # agreeing values are fine, and the config's steps are the ones run
    assert model.synthesize("Hi.", generation_config=cfg, num_step=2)[0].num_steps == 2
    assert model.synthesize("Hi.", generation_config=cfg)[0].num_steps == 2
    changed = dataclasses.replace(cfg, num_step=3)
    assert model.synthesize("Hi.", generation_config=changed)[0].num_steps == 3


def test_generation_config_as_a_dict(model):
    out = model.synthesize("Hi.", generation_config={"num_step": 3, "guidance_scale": 1.0})[0]
    assert out.num_steps == 3
    a = model.generate_codes("Hi.", generation_config={"num_step": 2}, seed=1)[0]
    b = model.generate_codes("Hi.", num_step=2, seed=1)[0]
    assert np.array_equal(a, b)
    for bad, match in (({"num_steps": 2}, "unknown field"), ({"num_step": "2"}, "num_step"),
                       ("num_step=2", "GenerationConfig"), ([("num_step", 2)], "GenerationConfig")):
        with pytest.raises(InputError, match=match):
            model.synthesize("Hi.", generation_config=bad)
    with pytest.raises(InputError, match="conflicts"):
        model.synthesize("Hi.", generation_config={"num_step": 2}, num_step=4)


# ---------------------------------------------------------------------------------------------
# Seeds, transcripts, callbacks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, [1, -2], 1.5, True, "3", 2**64, [1], np.float64(2.0)])
def test_bad_seeds(model, seed):
    texts = ["One.", "Two."]
    with pytest.raises(InputError, match="seed"):
        model.generate_codes(texts, seed=seed, **FAST)


def test_seed_per_text_reaches_chunked_items(model):
    # Chunked by a low threshold rather than by a text over the default 30 s: three chunks of
    # 8 s of speech instead of seven of 53 s, and the same path (chunk 0, then the rest).
    long = "The quick brown fox jumps over the lazy dog. " * 3
    kw = dict(num_step=2, position_temperature=1.0, audio_chunk_duration=2.0,
              audio_chunk_threshold=4.0)
    both = model.synthesize([long, "Short."], seed=[11, 12], **kw)
    assert len(both[0].text_chunks) > 1
    alone_long = model.synthesize(long, seed=11, **kw)[0]
    alone_short = model.synthesize("Short.", seed=12, **kw)[0]
    assert np.array_equal(both[0].codes, alone_long.codes)
    assert np.array_equal(both[1].codes, alone_short.codes)
    assert model.generate_codes("Short.", seed=np.uint64(12), **kw)[0].shape == alone_short.codes.shape


@pytest.mark.parametrize("ref_text,match", [(5, "string"), ("a\ud800b", "surrogate"),
                                            ("  ", "ref_text"), (None, "ref_text"),
                                            ("word " * 1000, "2,000")])
def test_bad_reference_transcripts(model, ref_text, match):
    with pytest.raises(InputError, match=match):
        model.generate("Hello.", ref_audio=str(CLIP), ref_text=ref_text, **FAST)
    with pytest.raises(InputError, match=match):
        model.create_voice_clone_prompt(str(CLIP), ref_text)


def _pace_warnings(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    return [w for w in seen if issubclass(w.category, RefTextMismatchWarning)]


def test_a_transcript_that_cannot_be_the_clips_is_warned_about(model):
    """The clip says "The quick brown fox jumps over the lazy dog." in 3.5 s: that transcript
    passes; one word, or the sentence four times, is not what a clip of that length can say.
    The warning is the prompt's pace_problem(), and the voice still works."""
    right = (ROOT / "tests" / "fixtures" / "audio" / "speech.txt").read_text().strip()
    assert _pace_warnings(lambda: model.create_voice_clone_prompt(str(CLIP), right)) == []
    for wrong, says in (("Hi.", "too long"), (" ".join([right] * 4), "too short")):
        made = []
        (w,) = _pace_warnings(lambda: made.append(model.create_voice_clone_prompt(str(CLIP), wrong)))
        assert str(w.message) == made[0].pace_problem() and says in str(w.message)
        assert "a normal speaking rate" in str(w.message)
        assert Path(w.filename).resolve() == Path(__file__).resolve()  # points at the caller
    (w,) = _pace_warnings(lambda: model.generate("Hello.", ref_audio=str(CLIP), ref_text="Hi.", **FAST))
    assert "too long" in str(w.message)


def test_on_step_must_be_callable(model):
    with pytest.raises(InputError, match="on_step"):
        model.generate("Hello.", on_step=5, **FAST)


# ---------------------------------------------------------------------------------------------
# The codec
# ---------------------------------------------------------------------------------------------


def test_codec_decode_validates_its_input(model):
    codec = model.codec
    assert codec.decode(np.zeros((0, 8, 5), np.int64)).shape == (0, 5 * codec.hop_length)
    for bad, match in (([[1, 2], [3]], "integer array"), (np.zeros((8,), np.int64), "shape"),
                       (np.full((8, 4), 1024), "lie in"), (np.full((8, 4), -1), "lie in"),
                       (np.full((8, 4), 0.5), "integers"), (np.zeros((2, 9, 4), np.int64), "codebooks"),
                       ("codes", "shape")):
        with pytest.raises(InputError, match=match):
            codec.decode(bad)
    codes = np.random.default_rng(3).integers(0, 1024, (2, 8, 6))
    batch = codec.decode(codes)
    assert batch.shape == (2, 6 * codec.hop_length)
    assert np.allclose(batch[1], codec.decode(codes[1]), atol=1e-6)


def test_long_codes_are_decoded_in_windows(model, monkeypatch):
    codec = model.codec
    codes = np.random.default_rng(4).integers(0, 1024, (8, 90))
    whole = codec.decode(codes)
    monkeypatch.setattr(limits, "MAX_PASS_FRAMES", 32)  # forces windows of 32 frames
    windowed = codec.decode(codes)
    assert windowed.shape == whole.shape
    # the windows overlap by the decoder's receptive field: equal up to float rounding
    assert np.abs(windowed - whole).max() <= 1e-5 * max(1.0, np.abs(whole).max())


# ---------------------------------------------------------------------------------------------
# The demo shows the same messages
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_client(demo_server):
    """A client of the session's demo (conftest.demo_server, which test_demo.py drives)."""
    gradio_client = pytest.importorskip("gradio_client")
    return gradio_client.Client(demo_server.url, verbose=False)


def _demo_error(client, **kwargs) -> str:
    """The page's refusal of a call: its visitor's line (AppError, or ValidationError for a
    field), or gradio's own 400 for a value outside a control's range (no line of ours)."""
    import httpx
    from gradio_client.exceptions import AppError, ValidationError

    with pytest.raises((AppError, ValidationError, httpx.HTTPStatusError)) as err:
        client.predict(**kwargs)
    if isinstance(err.value, httpx.HTTPStatusError):
        assert err.value.response.status_code == 400
        return ""
    msg = str(err.value)
    assert "Traceback" not in msg and "Internal error" not in msg and "bug" not in msg, msg
    assert "/tmp" not in msg and "omnicore " not in msg, msg  # no server path, no command
    return msg


@pytest.mark.subprocess
def test_demo_refuses_what_the_api_refuses(demo_client, tmp_path):
    """What the API refuses the page refuses too, in a visitor's words (test_demo holds the
    wording; the API's own messages keep their detail: the tests above)."""
    from gradio_client import handle_file

    msg = _demo_error(demo_client, text="Hi.", duration=600, num_step=2, api_name="/auto")
    assert "too long" in msg
    _demo_error(demo_client, text="Hi.", duration=limits.MAX_DURATION_S + 1, num_step=2,
                api_name="/auto")
    _demo_error(demo_client, text="Hi.", seed=2**70, num_step=2, api_name="/auto")
    for meta in ({"ref_rms": -1.0}, {"ref_text": "a\ud800b"}):
        bad = _write_prompt(tmp_path / "bad.npz", GOOD_CODES, meta)
        _demo_error(demo_client, text="Hi.", ref_audio=None,
                    voice_prompt_file=handle_file(str(bad)), num_step=2, api_name="/clone")
    _demo_error(demo_client, text="Hi.", ref_audio=handle_file(str(CLIP)),
                ref_text="word " * 1000, voice_prompt_file=None, num_step=2, api_name="/clone")



def test_prompt_paths_that_are_not_prompt_files(tmp_path):
    fifo = tmp_path / "v.npz"
    os.mkfifo(fifo)  # np.load would block here forever
    for path in (fifo, tmp_path, tmp_path / "missing.npz"):
        with pytest.raises(VoicePromptError):
            VoiceClonePrompt.load(path)
    npy = tmp_path / "codes.npy"
    np.save(npy, GOOD_CODES)
    with pytest.raises(VoicePromptError, match="npz"):
        VoiceClonePrompt.load(npy)
