"""Packaging promises: omnicore imports without the reference stack, exposes its API, and ships
its licence."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

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
            "import omnicore.apps.cli, omnicore.streaming, omnicore.model.higgs_codec, omnicore.model.backbone\n"
            f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_declared_dependency_is_imported():
    """pyproject.toml's runtime dependencies are what the package imports: no leftover."""
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["dependencies"]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower().replace("-", "_") for d in declared}
    imported = set()
    for p in (ROOT / "omnicore").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported.add(node.module.split(".")[0])
    assert names and names <= imported, f"declared, never imported: {sorted(names - imported)}"


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    assert 'omnicore = "omnicore.apps.cli:main"' in text


def test_the_wheel_and_the_sdist_carry_the_licence_and_every_part(tmp_path):
    """LICENSE is the full Apache-2.0 text and both distributions carry it; the wheel holds
    every part of the package and not the test machinery. Built as a user builds them
    (`python -m build`: the sdist, then the wheel from the sdist) from a copy of what the
    build reads, so the checkout gets no build folders."""
    import tarfile
    import zipfile

    from conftest import require_module

    require_module("build")
    text = (ROOT / "LICENSE").read_text("utf-8")
    for part in ("Apache License\n                           Version 2.0, January 2004",
                 "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
                 "9. Accepting Warranty or Additional Liability", "END OF TERMS AND CONDITIONS"):
        assert part in text, part
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (ROOT / name).is_file():
            (src / name).write_bytes((ROOT / name).read_bytes())
    for package in ("omnicore", "omnicore_testing"):  # the second must stay out of the wheel
        shutil.copytree(ROOT / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"),
                           str(src)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("omnicore-*.tar.gz")
    (wheel,) = (tmp_path / "dist").glob("omnicore-*.whl")
    licence = (ROOT / "LICENSE").read_bytes()
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        assert tar.extractfile(f"{top}/LICENSE").read() == licence
    with zipfile.ZipFile(wheel) as whl:
        info = next(n.split("/")[0] for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        assert whl.read(f"{info}/licenses/LICENSE") == licence
        meta = whl.read(f"{info}/METADATA").decode()
        names = set(whl.namelist())
    # The three parts ship whole; the test machinery does not.
    assert {"omnicore/__main__.py", "omnicore/model/spec.py", "omnicore/apps/cli/__init__.py",
            "omnicore/apps/server/speaking.py", "omnicore/machinery/settings.py"} <= names
    assert not [n for n in names if n.startswith("omnicore_testing")]
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta


def test_the_readme_separates_the_codes_licence_from_the_weights():
    readme = (ROOT / "README.md").read_text("utf-8")
    assert "[LICENSE](LICENSE)" in readme and "Apache-2.0" in readme
    assert "CC-BY-NC" in readme and "Boson AI" in readme  # the weights' own licences
