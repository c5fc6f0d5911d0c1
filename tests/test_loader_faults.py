"""Faults in the checkpoint files while or before a model is loaded: a file truncated or
overwritten under a loaded model, a FIFO in place of a file. The failure modes are a crash
(SIGBUS) and a hang, so every case runs in a child process with a time limit; what may come
back is the correct result or a typed error, never a signal or a timeout."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"
REPO = Path(__file__).resolve().parents[1]

# Loads the copy, generates, applies the fault named by argv[2], generates again.
CHILD = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import numpy as np
    from omnicore import OmniVoice
    from omnicore.errors import WeightsError

    ckpt, fault = Path(sys.argv[1]), sys.argv[2]
    model_file = ckpt / "model.safetensors"
    codec_file = ckpt / "audio_tokenizer" / "model.safetensors"
    m = OmniVoice.from_pretrained(ckpt)
    kw = dict(num_step=2, duration=0.4, seed=0)
    first = m.generate("Hello there.", **kw)[0]
    if fault == "truncate":
        os.truncate(model_file, 4096)
    elif fault == "overwrite":  # what `cp other.safetensors model.safetensors` does: O_TRUNC, write
        model_file.write_bytes(Path(sys.argv[3]).read_bytes())
    elif fault == "replace":  # a new file renamed over the old one
        tmp = ckpt / "new.safetensors"
        tmp.write_bytes(Path(sys.argv[3]).read_bytes())
        os.replace(tmp, model_file)
    elif fault == "truncate_codec":
        os.truncate(codec_file, 4096)
    try:
        again = m.generate("Hello there.", **kw)[0]
        print("SAME" if np.array_equal(first, again) else "DIFFERENT")
    except WeightsError as exc:
        print("WeightsError:", exc)
    if fault == "truncate_codec":  # the encoder half is read lazily, from the truncated file
        try:
            m.codec.encode(np.zeros(4800, np.float32), m.sampling_rate)
            print("ENCODED")
        except WeightsError as exc:
            print("WeightsError:", exc)
""")


def _copy_tiny(tmp_path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(TINY, dst)
    return dst


def _other_checkpoint(tmp_path) -> Path:
    """The tiny checkpoint with every float tensor scaled: same layout, different weights."""
    import numpy as np
    from safetensors.numpy import save_file

    from conftest import read_safetensors

    tensors = {k: (v * np.float32(1.5) if v.dtype == np.float32 else np.array(v))
               for k, v in read_safetensors(TINY / "model.safetensors").items()}
    path = tmp_path / "other.safetensors"
    save_file(tensors, str(path))
    return path


def _run(args, timeout=240):
    return subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.mark.subprocess
@pytest.mark.parametrize("fault", ["truncate", "overwrite", "replace"])
def test_checkpoint_changed_under_a_loaded_model_is_never_a_crash(tmp_path, fault):
    ckpt = _copy_tiny(tmp_path)
    res = _run([ckpt, fault, _other_checkpoint(tmp_path)])
    assert res.returncode == 0, f"child died with {res.returncode}: {res.stderr[-2000:]}"
    out = res.stdout.strip().splitlines()
    assert out and (out[-1] == "SAME" or out[-1].startswith("WeightsError:")), res.stdout + res.stderr
    if out[-1].startswith("WeightsError:"):
        assert "changed on disk" in out[-1] and "reload" in out[-1]
    if fault == "replace":  # the open file still holds the old contents: same output, no error
        assert out[-1] == "SAME"


@pytest.mark.subprocess
def test_codec_file_truncated_under_a_loaded_model(tmp_path):
    ckpt = _copy_tiny(tmp_path)
    res = _run([ckpt, "truncate_codec"])
    assert res.returncode == 0, f"child died with {res.returncode}: {res.stderr[-2000:]}"
    decoded, encoded = res.stdout.strip().splitlines()[-2:]
    assert decoded == "SAME"  # the decoder half is in memory
    assert encoded.startswith("WeightsError:") and "model.safetensors" in encoded


FIFO_CHILD = textwrap.dedent("""
    import sys
    from omnicore import OmniVoice
    from omnicore.errors import OmniCoreError
    try:
        OmniVoice.from_pretrained(sys.argv[1])
        print("LOADED")
    except OmniCoreError as exc:
        print(type(exc).__name__ + ":", exc)
""")


@pytest.mark.parametrize("name, error", [
    ("model.safetensors", "WeightsError"),
    ("config.json", "ConfigError"),
    ("audio_tokenizer/model.safetensors", "WeightsError"),
    ("audio_tokenizer/config.json", "ConfigError"),
    ("tokenizer.json", "ModelNotFoundError"),
])
@pytest.mark.subprocess
def test_fifo_in_place_of_a_checkpoint_file_is_refused(tmp_path, name, error):
    ckpt = _copy_tiny(tmp_path)
    (ckpt / name).unlink()
    os.mkfifo(ckpt / name)
    try:
        res = subprocess.run([sys.executable, "-c", FIFO_CHILD, str(ckpt)], capture_output=True,
                             text=True, timeout=60, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading hung on a FIFO at {name}")
    assert res.returncode == 0, res.stderr[-2000:]
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith(error + ":") and "not a regular file" in line and name.split("/")[-1] in line
