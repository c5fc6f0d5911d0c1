"""benchmarks/compare_profiles.py runs: the script a user with the real weights runs to see how
far the fast (or live) profile's speech lies from exact's.

On the tiny random checkpoint its numbers mean nothing about speech (random weights make
noise either way); what is tested is that the script works end to end: it generates both
profiles for a text and voice, reports codes agreement and mel distances in range, and finds
no difference at all when the fast profile's knobs are set to compute exactly what exact does.
The script's runs are end to end (both profiles generated, decoded and compared): slow, out of
the quick loop; the profiles' own equivalence is test_profile's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import compare_profiles  # noqa: E402

TINY = str(ROOT / "weights" / "tiny-random")
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"


@pytest.mark.slow
def test_the_script_compares_the_profiles(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    text = (ROOT / "tests" / "fixtures" / "audio" / "speech.txt").read_text().strip()
    result = compare_profiles.main(["--model", TINY, "--max-texts", "1", "--seeds", "1",
                                    "--exact-steps", "6", "--fast-steps", "6",
                                    "--voice", f"{CLIP}={text}",
                                    "--json", str(out), "--save", str(tmp_path / "wav")])
    rows = result["rows"]
    assert [r["voice"] for r in rows] == ["auto", "clone 0"]
    for r in rows:
        assert 0.0 <= r["codes_equal"] <= 1.0 and r["frames"] > 0
        assert np.isfinite(r["mel_distance"]) and r["mel_distance"] >= 0
        assert r["seed_distance"] > 0  # two seeds: two takes
    assert json.loads(out.read_text())["summary"]["cases"] == 2
    assert len(list((tmp_path / "wav").glob("*.wav"))) == 4
    assert "mel distance fast-exact" in capsys.readouterr().out


@pytest.mark.slow
def test_the_script_sees_no_difference_where_there_is_none():
    """fast with both knobs at 1 and exact's steps is exact: all codes agree, distance 0."""
    result = compare_profiles.main(["--model", TINY, "--max-texts", "1", "--seeds", "1",
                                    "--exact-steps", "6", "--fast-steps", "6",
                                    "--prefix-refresh", "1", "--uncond-every", "1"])
    (row,) = result["rows"]
    assert row["codes_equal"] == 1.0 and row["mel_distance"] == 0.0


@pytest.mark.slow
def test_the_script_compares_live_streams(capsys):
    """--profile live streams both sides; at its exact settings (fast's knobs at 1, chunk 0 in
    the profile's steps and cut at 2 s and 6 s) it is exact's stream: all codes agree, distance 0; with
    its own knobs it reports the first audio of each."""
    same = compare_profiles.main(["--model", TINY, "--max-texts", "1", "--seeds", "1",
                                  "--profile", "live", "--exact-steps", "4", "--fast-steps", "4",
                                  "--prefix-refresh", "1", "--uncond-every", "1",
                                  "--first-chunk-steps", "0", "--first-chunk-seconds", "2",
                                  "--first-chunk-max-seconds", "0"])
    (row,) = same["rows"]
    assert row["codes_equal"] == 1.0 and row["mel_distance"] == 0.0
    own = compare_profiles.main(["--model", TINY, "--max-texts", "1", "--seeds", "1",
                                 "--profile", "live", "--exact-steps", "4", "--fast-steps", "4"])
    (row,) = own["rows"]
    assert row["mel_distance"] > 0 and row["profile_first_s"] > 0 and row["exact_first_s"] > 0
    assert own["profile"] == "live" and "first_audio_ratio" in own["summary"]
    assert "mel distance live-exact" in capsys.readouterr().out


def test_the_log_mel_of_a_tone_peaks_in_its_band():
    sr = 24000
    t = np.arange(sr) / sr
    mel = compare_profiles.log_mel(np.sin(2 * np.pi * 1000 * t), sr)
    fb = compare_profiles.mel_filterbank(sr, 1024, 80)
    band = int(np.argmax(fb[:, int(round(1000 * 1024 / sr))]))
    assert abs(int(np.argmax(mel.mean(axis=0))) - band) <= 1
    assert compare_profiles.mel_distance(t, t, sr) == 0.0


@pytest.mark.slow
def test_the_script_compares_a_precision_with_fp32(tmp_path):
    """--profile exact --precision int8: the compared side is the int8 model, exact stays fp32;
    the codes then differ (the test can fail) and the mel distance is measured."""
    result = compare_profiles.main(["--model", TINY, "--max-texts", "1", "--seeds", "1",
                                    "--exact-steps", "4", "--fast-steps", "4",
                                    "--profile", "exact", "--precision", "int8"])
    (row,) = result["rows"]
    assert result["precision"] == "int8" and row["codes_equal"] < 1.0
    assert np.isfinite(row["mel_distance"]) and row["mel_distance"] > 0
