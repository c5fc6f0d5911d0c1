"""Fixtures shared by several test modules: the tiny checkpoint's backbone config and params;
and the rule for test inputs that may be missing (`missing`, `require_file`, `require_module`)."""

import importlib
import os
from pathlib import Path

import pytest

from omnicore import backbone as bb
from omnicore.config import OmniVoiceConfig
from omnicore.weights import ParamReader, SafetensorsFile

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"
# CI installs every test dependency and ships every fixture, so there a missing one is a failure
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def read_safetensors(path) -> dict:
    """Every tensor of a safetensors file, read into memory (float tensors as float32): what
    the loader's SafetensorsFile gives, key by key (WeightsError for anything malformed)."""
    with SafetensorsFile(path) as f:
        return {key: f.read(key) for key in f}


def missing(what: str, how: str):
    """Fail under CI, skip elsewhere; either way say what is missing and how to get it."""
    message = f"{what} is not available ({how})"
    if IN_CI:
        pytest.fail(message + "; CI must have it (see .ci/run)")
    pytest.skip(message, allow_module_level=True)  # also when a test module needs it at import


def require_file(path: Path, how: str) -> Path:
    """`path` if it is a file; otherwise `missing` (a skip, or a failure under CI)."""
    if not Path(path).is_file():
        missing(str(path), how)
    return path


def require_module(name: str, extra: str = "test"):
    """The imported module; otherwise `missing` (a skip, or a failure under CI). `extra`: the
    package extra that installs it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"the Python module {name!r}", f"{e}; pip install -e '.[{extra}]'")


@pytest.fixture(scope="module")
def cfg():
    return OmniVoiceConfig.from_file(TINY / "config.json")


@pytest.fixture(scope="module")
def params(cfg):
    reader = ParamReader.open(TINY / "model.safetensors")
    p = bb.load_params(reader, cfg)
    reader.finish()  # every tensor of the checkpoint is used
    return p
