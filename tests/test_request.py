"""The one request builder: every argument of a call checked once, one Request per text, a clip
encoded once however many texts it serves, and each chunk's pass made with its voice and seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnicore import OmniVoice, VoiceClonePrompt
from omnicore.errors import InputError
from omnicore.request import build_requests
from omnicore.text import planner

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
SPEECH = str(ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav")
REF_TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


def _paused(*texts):
    return [planner.split_pauses(t) for t in texts]


def test_one_value_for_all_texts_or_one_per_text(model):
    rs = build_requests(model, _paused("One.", "Two.", "Three."), language="en", speed=[1.0, 1.5, 2.0],
                        seed=7, instruct="female")
    assert [r.language for r in rs] == ["en"] * 3
    assert [r.speed for r in rs] == [1.0, 1.5, 2.0]
    assert [r.seed for r in rs] == [7, 7, 7]
    assert all(r.instruct_for(r.paused.spoken) == "female" for r in rs)
    with pytest.raises(InputError, match="speed: got 2 values for 3 texts"):
        build_requests(model, _paused("One.", "Two.", "Three."), speed=[1.0, 2.0])


def test_every_argument_is_checked_before_a_clip_is_encoded(model, monkeypatch):
    calls = []
    monkeypatch.setattr(model, "create_voice_clone_prompt", lambda *a: calls.append(a))
    for bad in (dict(on_step=3), dict(speed=-1), dict(instruct="femal"), dict(seed=-1),
                dict(pad_duration=99.0), dict(ref_text=None), dict(ref_text="   ")):
        kw = dict(ref_audio=SPEECH, ref_text=REF_TEXT)
        gen = {k: bad.pop(k) for k in ("pad_duration",) if k in bad}
        kw.update(bad)
        with pytest.raises(InputError):
            build_requests(model, _paused("Hello."), gen_kwargs=gen, **kw)
    assert calls == []


def test_a_clip_for_every_text_is_encoded_once(model, monkeypatch):
    made = []
    real = model.create_voice_clone_prompt

    def counting(*a):
        made.append(a)
        return real(*a)

    monkeypatch.setattr(model, "create_voice_clone_prompt", counting)
    rs = build_requests(model, _paused("One.", "Two.", "Three."), ref_audio=SPEECH, ref_text=REF_TEXT)
    assert len(made) == 1
    assert all(r.prompt is rs[0].prompt and r.voice_ready for r in rs)
    assert sum(r.encode_s for r in rs) > 0


def test_a_stream_keeps_its_clip_for_the_worker(model, monkeypatch):
    (r,) = build_requests(model, None, ref_audio=SPEECH, ref_text=REF_TEXT, instruct="male",
                          encode=False)
    assert not r.voice_ready and r.prompt is None and r.paused is None
    r.encode_voice(model)
    assert r.voice_ready and isinstance(r.prompt, VoiceClonePrompt) and r.encode_s > 0


def test_each_chunk_gets_its_voice_and_seed(model):
    prompt = VoiceClonePrompt(np.zeros((8, 30), np.int64), REF_TEXT, 0.05)
    (cloned,) = build_requests(model, _paused("A."), voice_clone_prompt=prompt, seed=3)
    (auto,) = build_requests(model, _paused("A."), seed=3)
    chunk = planner.ChunkPlan("A.", 10, "prompt", REF_TEXT)
    spec = cloned.spec(chunk, 0, None)
    assert spec.ref_codes is cloned.prompt.ref_audio_tokens and spec.after is None
    later = planner.ChunkPlan("B.", 10, "chunk0", "A.")
    waits = auto.spec(later, 1, None, first=4)  # a synchronous call: after chunk 0's pass
    assert waits.after == 4 and waits.ref_codes is None and waits.ref_text == "A."
    codes0 = np.ones((8, 12), np.int64)
    streamed = auto.spec(later, 1, None, chunk0_codes=codes0)  # a stream: chunk 0 is done
    assert streamed.after is None and streamed.ref_codes is codes0
    a, b = (np.random.default_rng(s.seed).random() for s in (waits, auto.spec(later, 2, None, first=4)))
    assert a != b  # chunk k draws from child k of the seed
