"""omnicore.audio against the reference's recorded outputs (tools/reference/dump_audio.py),
plus properties: only AudioError escapes on bad input, and writes are atomic."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import require_file
import soundfile as sf
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from omnicore.audio import loading, postprocess, writers
from omnicore.model.resample import resample
from omnicore.model import resample as resample_mod
from omnicore.errors import AudioError

REF = Path(__file__).parent / "fixtures" / "reference"
SPEECH = Path(__file__).parent / "fixtures" / "audio"
SR = 24000


def _load(name: str):
    path = require_file(REF / f"audio_{name}.npz", "run tools/reference/dump_audio.py")
    return np.load(path, allow_pickle=False)


def _assert_same(got: np.ndarray, want: np.ndarray, tol: float, flips: float = 0.0):
    """Same shape, and |got - want| <= tol except for at most a `flips` share of samples that
    may be one int16 step (1/32768) off."""
    assert got.dtype == np.float32
    assert got.shape == want.shape
    if want.size:
        err = np.abs(got - want)
        assert float(err.max()) <= (tol if flips == 0 else 2**-15 + tol)
        assert np.mean(err > tol) <= flips


# ---------------------------------------------------------------------------
# resampler
# ---------------------------------------------------------------------------


def test_resample_matches_torchaudio():
    fx = _load("resample")
    worst = 0.0
    keys = [k[:-3] for k in fx.files if k.endswith("_in")]
    assert len(keys) >= 3 * len(fx["pairs"])
    for key in keys:
        o, n = (int(v) for v in key.split("_")[:2])
        x, want = fx[key + "_in"], fx[key + "_out"]
        assert want.shape[-1] == math.ceil(n * x.shape[-1] / o)
        got = resample(x, o, n)
        _assert_same(got, want, 1e-6)
        worst = max(worst, float(np.abs(got - want).max()))
    assert float(np.abs(fx["24000_16000_long_out"]).std()) > 0.05  # the fixture is not trivial
    print(f"resample worst abs error vs torchaudio: {worst:.2e}")


def test_resample_dense_and_banded_agree():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3001)).astype(np.float32)
    for o, n in [(24000, 16000), (44100, 24000), (8000, 24000)]:
        dense = resample(x, o, n)
        old, resample_mod._DENSE_MAX = resample_mod._DENSE_MAX, 0
        try:
            banded = resample(x, o, n)
        finally:
            resample_mod._DENSE_MAX = old
        assert float(np.abs(dense - banded).max()) <= 1e-6


def test_resample_shapes_and_identity():
    x = np.linspace(-1, 1, 480, dtype=np.float32)
    same = resample(x, SR, SR)
    assert same is not x and np.array_equal(same, x)
    assert resample(np.zeros((3, 2, 480), np.float32), 48000, 24000).shape == (3, 2, 240)
    assert resample(np.zeros(0, np.float32), 16000, 24000).shape == (0,)
    for bad in (0, -1, 1.5, float("nan"), True, "24000", 10**7):
        with pytest.raises(AudioError):
            resample(x, bad, SR)


@settings(max_examples=25, deadline=None)
@given(
    orig=st.integers(1, 200_000),
    new=st.integers(1, 200_000),
    length=st.integers(0, 300),
)
def test_resample_any_rates(orig, new, length):
    assume(length * new <= 2_000_000 * orig)  # keep outputs small
    x = np.random.default_rng(length).standard_normal(length).astype(np.float32)
    y = resample(x, orig, new)
    assert y.dtype == np.float32
    assert y.shape == (math.ceil(new * length / orig),) if orig != new else y.shape == (length,)
    assert np.isfinite(y).all()


# ---------------------------------------------------------------------------
# pydub-compatible silence handling
# ---------------------------------------------------------------------------


def test_silence_detection_matches_pydub():
    fx = _load("silence")
    for name in fx["names"]:
        x = fx[f"{name}_in"]
        pcm = postprocess._pcm16(x)
        assert postprocess._len_ms(len(pcm), SR) == int(fx[f"{name}_len_ms"])
        assert postprocess.detect_leading_silence(pcm, SR, -50) == int(fx[f"{name}_lead_ms"])
        assert postprocess.detect_leading_silence(pcm[::-1], SR, -50) == int(fx[f"{name}_trail_ms"])
        for key in [k[: -len("_silent")] for k in fx.files if k.startswith(f"{name}_") and k.endswith("_silent")]:
            msl, thr, step = (int(v) for v in key[len(name) + 1:].split("_"))
            sil = postprocess.detect_silence(pcm, SR, msl, -thr, step)
            non = postprocess.detect_nonsilent(pcm, SR, msl, -thr, step)
            assert sil == fx[key + "_silent"].tolist(), key
            assert non == fx[key + "_nonsilent"].tolist(), key


def test_remove_silence_matches_reference():
    fx = _load("silence")
    changed = 0
    for name in fx["names"]:
        x = fx[f"{name}_in"]
        for tag, (mid, lead, trail) in zip(fx["settings"], fx["settings_values"]):
            want = fx[f"{name}_{tag}_out"]
            got = postprocess.remove_silence(x, SR, mid_sil=int(mid), lead_sil=int(lead), trail_sil=int(trail))
            _assert_same(got, want, 1e-5)
            changed += want.shape != x.shape
    assert changed >= 10  # the crafted signals really lose silence


def test_trim_long_audio_matches_reference():
    fx = _load("trim")
    for name in fx["names"]:
        x, want = fx[f"{name}_in"], fx[f"{name}_out"]
        assert len(want) < len(x)
        _assert_same(postprocess.trim_long_audio(x, SR), want, 1e-5)
    short = fx["pauses_in"][: 19 * SR]
    assert postprocess.trim_long_audio(short, SR) is not None
    assert np.array_equal(postprocess.trim_long_audio(short, SR), short)


# ---------------------------------------------------------------------------
# compositions: reference prompt preparation and output post-processing
# ---------------------------------------------------------------------------


def _prompt_source(fx, name, tmp_path):
    if name.startswith("file_"):
        return str(SPEECH / f"{name[5:]}.wav")
    if name.startswith("quiet"):
        return (fx["quiet_in"], SR)
    if name.startswith("stereo16k"):
        return (fx["stereo16k_in"], 16000)
    if name.startswith("long"):
        return (fx["long_in"], SR)
    path = tmp_path / "loud.wav"
    sf.write(path, fx["loud_pcm"], 44100, subtype="PCM_16")
    return str(path)


def test_prepare_reference_audio_matches_reference(tmp_path):
    fx = _load("prompt")
    for name in fx["names"]:
        src = _prompt_source(fx, name, tmp_path)
        wav, rms = postprocess.prepare_reference_audio(
            src, bool(fx[f"{name}_preprocess"]), trim_long=bool(fx[f"{name}_trim_long"])
        )
        # Silence removal quantises to int16 by truncation; after a resample (float32 rounding
        # differs from torch's by ~1e-7) a sample sitting on a step boundary can land one step
        # away. Without a resample the result is exact.
        resampled = (isinstance(src, str) and "24k" not in src) or (isinstance(src, tuple) and src[1] != SR)
        pre = bool(fx[f"{name}_preprocess"])
        _assert_same(wav, fx[f"{name}_out"], 1e-6 if resampled else 1e-5, flips=1e-3 if resampled and pre else 0)
        assert len(wav) % postprocess.HOP_LENGTH == 0
        assert rms == pytest.approx(float(fx[f"{name}_ref_rms"]), rel=1e-6)


def _wave(fx, i):
    if f"wave{i}" in fx.files:
        return fx[f"wave{i}"]
    return sf.read(str(SPEECH / "speech_24k.wav"), dtype="float32")[0]  # wave4: the speech clip


def test_postprocess_output_matches_reference():
    fx = _load("post")
    for name in fx["names"]:
        waves = [_wave(fx, i) for i in fx[f"{name}_waves"]]
        rms = float(fx[f"{name}_ref_rms"])
        pad, fade = (float(v) for v in fx[f"{name}_pad_fade"])
        src = waves if name.startswith("chunks") else waves[0][None, :]
        got = postprocess.postprocess_output(
            src, None if math.isnan(rms) else rms, postprocess=bool(fx[f"{name}_postprocess"]),
            pad_duration=pad, fade_duration=fade,
        )
        _assert_same(got, fx[f"{name}_out"], 1e-5)


def test_cross_fade_and_fade_match_reference():
    fx = _load("post")
    a, b, c = fx["wave1"], fx["wave2"], fx["wave3"]
    _assert_same(postprocess.cross_fade_chunks([a, b, c], SR), fx["xfade_abc"], 1e-6)
    _assert_same(postprocess.cross_fade_chunks([c, a], SR, silence_duration=0.5), fx["xfade_ca"], 1e-6)
    for i, (pad, fade, w) in enumerate(fx["fade_params"]):
        got = postprocess.fade_and_pad(fx[f"wave{int(w)}"], pad, fade, SR)
        _assert_same(got, fx[f"fade{i}_out"], 1e-6)


def test_volume_rules():
    quiet = np.full(1000, 0.01, np.float32)
    boosted, rms = postprocess.normalize_reference_volume(quiet)
    assert rms == pytest.approx(0.01, rel=1e-6) and postprocess.reference_rms(boosted) == pytest.approx(0.1, rel=1e-5)
    loud = np.full(1000, 0.5, np.float32)
    assert np.array_equal(postprocess.normalize_reference_volume(loud)[0], loud)
    silent = np.zeros(10, np.float32)
    assert postprocess.normalize_reference_volume(silent)[1] == 0.0
    out = np.array([0.2, -0.4], np.float32)
    assert np.allclose(postprocess.match_output_volume(out, 0.05), out * 0.5)
    assert np.array_equal(postprocess.match_output_volume(out, 0.3), out)
    assert np.abs(postprocess.match_output_volume(out, None)).max() == pytest.approx(0.5)
    assert postprocess.peak_normalize(np.zeros(0, np.float32)).shape == (0,)


def test_all_silent_output_does_not_crash():
    out = postprocess.postprocess_output(np.zeros(SR, np.float32), None)
    assert out.shape == (0,)


def test_prepare_reference_audio_errors():
    with pytest.raises(AudioError, match="silent"):
        postprocess.prepare_reference_audio((np.zeros(SR, np.float32), SR))
    with pytest.raises(AudioError, match="too short"):
        postprocess.prepare_reference_audio((np.full(500, 0.3, np.float32), SR), preprocess_prompt=False)


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------


def test_load_audio_channels_and_int_scaling(tmp_path):
    rng = np.random.default_rng(5)
    stereo = rng.uniform(-0.5, 0.5, (2, 4410)).astype(np.float32)
    want = resample(np.mean(stereo, axis=0), 44100, SR)
    _assert_same(loading.load_audio((stereo, 44100)), want, 0)
    _assert_same(loading.load_audio((stereo.T, 44100)), want, 0)  # [L, C] is recognised
    pcm = (stereo.T * 32768).astype(np.int16)
    sf.write(tmp_path / "s.wav", pcm, 44100, subtype="PCM_16")
    from_file = loading.load_audio(tmp_path / "s.wav")
    from_ints = loading.load_audio((pcm, 44100))
    _assert_same(from_ints, from_file, 1e-7)
    assert loading.load_audio((np.zeros(10, np.uint8) + 128, SR)).max() == 0
    assert loading.load_audio((np.full(10, -(2**31), np.int32), SR)).min() == -1


@pytest.mark.parametrize(
    "src, message",
    [
        ((np.zeros(0, np.float32), SR), "empty"),
        ((np.array([0.1, np.nan], np.float32), SR), "NaN"),
        ((np.ones(100, np.float32), 0), "positive"),
        ((np.ones(100, np.float32), -8000), "positive"),
        ((np.ones((100, 100), np.float32), SR), "channels"),
        ((np.ones((2, 2, 2), np.float32), SR), "1-D"),
        ((np.ones(10, complex), SR), "real"),
        ((["a", "b"], SR), "real"),
        ((np.ones(10), SR, 3), "tuple"),
        (12345, "file path"),
        ("/nonexistent/ref.wav", "not found"),
    ],
)
def test_load_audio_rejects_bad_input(src, message):
    with pytest.raises(AudioError, match=message):
        loading.load_audio(src)


def test_load_audio_bad_files(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk")
    with pytest.raises(AudioError, match="convert it"):
        loading.load_audio(bad)
    with pytest.raises(AudioError, match="folder"):
        loading.load_audio(tmp_path)
    sf.write(tmp_path / "empty.wav", np.zeros(0, np.int16), SR, subtype="PCM_16")
    with pytest.raises(AudioError, match="empty"):
        loading.load_audio(tmp_path / "empty.wav")
    with pytest.raises(AudioError, match="at least"):
        loading.load_audio((np.ones(100, np.float32), SR), min_seconds=1.0)


_arrays = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=200).map(
        lambda v: np.array(v, np.float32)
    ),
    st.tuples(st.integers(0, 5), st.integers(0, 300)).map(lambda s: np.random.default_rng(s[1]).standard_normal(s)),
    st.lists(st.integers(-(2**15), 2**15 - 1), max_size=200).map(lambda v: np.array(v, np.int16)),
    st.lists(st.integers(0, 255), max_size=50).map(lambda v: np.array(v, np.uint8)),
    st.just(np.zeros((3, 4, 5))),
    st.just(np.array(["x"])),
)
_rates = st.one_of(st.integers(-10, 200_000), st.floats(allow_nan=True, allow_infinity=True), st.none())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=_arrays, sr=_rates)
def test_load_audio_only_raises_audio_error(samples, sr):
    try:
        out = loading.load_audio((samples, sr))
    except AudioError as exc:
        assert str(exc)
        return
    assert out.dtype == np.float32 and out.ndim == 1 and out.size > 0
    assert np.isfinite(out).all()


@settings(max_examples=15, deadline=None)
@given(samples=_arrays)
def test_postprocess_only_raises_audio_error(samples):
    try:
        out = postprocess.postprocess_output(samples, None)
    except AudioError:
        return
    assert out.dtype == np.float32 and out.ndim == 1


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


def test_write_audio_atomic_roundtrip(tmp_path):
    wav = np.array([0.0, 0.5, -0.5, 2.0, -2.0], np.float32)
    path = tmp_path / "out.wav"
    writers.write_audio_atomic(path, wav, SR)
    back, sr = sf.read(path, dtype="int16")
    assert sr == SR and back.tolist() == [0, 16384, -16384, 32767, -32768]
    assert sf.info(str(path)).subtype == "PCM_16"
    writers.write_audio_atomic(tmp_path / "out.flac", wav, SR)
    assert sf.info(str(tmp_path / "out.flac")).format == "FLAC"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.flac", "out.wav"]


def test_write_audio_atomic_leaves_nothing_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "out.wav"
    writers.write_audio_atomic(path, np.zeros(100, np.float32), SR)
    before = path.read_bytes()

    def broken_write(fh, data, *a, **k):
        fh.write(b"RIFF partial")
        raise OSError("disk full")

    monkeypatch.setattr(sf, "write", broken_write)
    with pytest.raises(AudioError, match="could not write"):
        writers.write_audio_atomic(path, np.ones(100, np.float32) * 0.1, SR)
    with pytest.raises(AudioError, match="could not write"):
        writers.write_audio_atomic(tmp_path / "new.wav", np.ones(100, np.float32) * 0.1, SR)
    assert path.read_bytes() == before  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]  # no temp or partial file


@pytest.mark.parametrize(
    "name, wav, message",
    [
        ("out.xyz", np.zeros(10, np.float32), "format"),
        ("out", np.zeros(10, np.float32), "format"),
        ("out.wav", np.zeros(0, np.float32), "empty"),
        ("out.wav", np.array([np.nan], np.float32), "NaN"),
        ("out.wav", np.zeros((2, 2, 2), np.float32), "channels"),
        ("missing/out.wav", np.zeros(10, np.float32), "does not exist"),
    ],
)
def test_write_audio_atomic_rejects(tmp_path, name, wav, message):
    with pytest.raises(AudioError, match=message):
        writers.write_audio_atomic(tmp_path / name, wav, SR)
    assert not os.path.exists(tmp_path / name)
