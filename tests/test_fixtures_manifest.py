"""The committed fixtures are exactly the ones the manifest describes (no torch needed).

tests/fixtures/manifest.json is written by tools/reference/dump_reference.py. When a fixture is
added or regenerated, run `/work/venvs/ref/bin/python tools/reference/dump_reference.py
--manifest-only` (or the full tools/reference/regenerate.sh) and commit the manifest with it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "tests" / "fixtures" / "manifest.json"
REQUIREMENTS = ROOT / "tools" / "reference" / "requirements.txt"
FIXTURE_DIRS = ["weights/tiny-random", "tests/fixtures/reference", "tests/fixtures/onnx",
                "tests/fixtures/audio"]
MAX_TOTAL_BYTES = 30 * 1024 * 1024
REGEN_HINT = ("regenerate it: /work/venvs/ref/bin/python tools/reference/dump_reference.py "
              "--manifest-only")


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip()] = version.strip()
    return pins


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def manifest() -> dict:
    assert MANIFEST.is_file(), f"{MANIFEST} is missing; {REGEN_HINT}"
    return json.loads(MANIFEST.read_text())


def test_requirements_are_all_pinned():
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and name.strip() and version.strip(), f"unpinned requirement {line!r}"


def test_manifest_pins_match_requirements(manifest):
    assert manifest["pins"] == _pins(REQUIREMENTS), REGEN_HINT


def test_manifest_installed_versions_match_pins(manifest):
    # The fixtures were produced by exactly the pinned tools (local tags such as +cpu allowed).
    for name, version in manifest["pins"].items():
        got = manifest["installed"].get(name)
        assert got is not None and got.split("+")[0] == version, (name, got, version)


def test_every_listed_file_exists_with_its_hash(manifest):
    files = manifest["files"]
    assert files, "manifest lists no files"
    bad = []
    for rel, meta in files.items():
        path = ROOT / rel
        if not path.is_file():
            bad.append(f"{rel}: missing")
        elif path.stat().st_size != meta["bytes"]:
            bad.append(f"{rel}: {path.stat().st_size} bytes, manifest says {meta['bytes']}")
        elif _sha256(path) != meta["sha256"]:
            bad.append(f"{rel}: sha256 differs")
    assert not bad, "\n".join(bad) + "\n" + REGEN_HINT


def _committed_fixture_files() -> set[str]:
    """Fixture files git knows (a fresh clone's files); all present files outside git."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *FIXTURE_DIRS], cwd=ROOT,
                             check=True, capture_output=True).stdout
        return {f for f in out.decode().split("\0") if f and (ROOT / f).is_file()}
    except (OSError, subprocess.CalledProcessError):
        present = set()
        for d in FIXTURE_DIRS:
            base = ROOT / d
            if base.is_dir():
                present |= {p.relative_to(ROOT).as_posix() for p in base.rglob("*")
                            if p.is_file() and "__pycache__" not in p.parts}
        return present


def test_every_fixture_file_is_listed(manifest):
    listed = set(manifest["files"])
    present = _committed_fixture_files()
    assert present - listed == set(), f"not in the manifest: {sorted(present - listed)}; {REGEN_HINT}"


def test_tiny_checkpoint_is_listed_in_full(manifest):
    need = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "audio_tokenizer/config.json", "audio_tokenizer/model.safetensors",
            "audio_tokenizer/preprocessor_config.json"]
    for name in need:
        assert f"weights/tiny-random/{name}" in manifest["files"], name


def test_total_fixture_size_is_bounded(manifest):
    total = sum(meta["bytes"] for meta in manifest["files"].values())
    assert total == manifest["total_bytes"]
    assert total <= MAX_TOTAL_BYTES, f"fixtures total {total / 2**20:.1f} MiB > 30 MiB"
