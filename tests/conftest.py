"""Fixtures shared by several test modules: the tiny checkpoint's backbone config and params."""

from pathlib import Path

import pytest

from omnicore import backbone as bb
from omnicore.config import OmniVoiceConfig
from omnicore.weights import ParamReader

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"


@pytest.fixture(scope="module")
def cfg():
    return OmniVoiceConfig.from_file(TINY / "config.json")


@pytest.fixture(scope="module")
def params(cfg):
    reader = ParamReader.open(TINY / "model.safetensors")
    p = bb.load_params(reader, cfg)
    reader.finish()  # every tensor of the checkpoint is used
    return p
