"""Packaging promises: omnicore imports without the reference stack, and exposes its API."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("torch", "torchaudio", "transformers", "onnxruntime", "omnivoice", "onnx")


def test_no_reference_stack_imports_in_the_package():
    pattern = re.compile(r"^\s*(?:import|from)\s+(%s)\b" % "|".join(FORBIDDEN), re.M)
    hits = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}"
            for p in (ROOT / "omnicore").rglob("*.py") for m in pattern.finditer(p.read_text("utf-8"))]
    assert hits == []


def test_import_loads_nothing_heavy_and_every_stage_imports_cleanly():
    code = ("import sys, omnicore\n"
            "assert 'numba' not in sys.modules, 'import omnicore should be light'\n"
            "from omnicore import OmniVoice, VoiceClonePrompt, Synthesis, GenerationConfig\n"
            "import omnicore.cli, omnicore.streaming, omnicore.model.codec, omnicore.model.backbone\n"
            f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    assert 'omnicore = "omnicore.cli:main"' in text
