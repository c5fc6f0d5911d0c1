"""The committed fixtures are exactly the ones the manifest describes (no torch needed).

tests/fixtures/manifest.json is written by tools/reference/dump_reference.py. When a fixture is
added or regenerated, run `$OMNICORE_REF_VENV/bin/python tools/reference/dump_reference.py
--manifest-only` (or the full tools/reference/regenerate.sh) and commit the manifest with it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from conftest import missing, require_file, require_module

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "tests" / "fixtures" / "manifest.json"
REQUIREMENTS = ROOT / "tools" / "reference" / "requirements.txt"
FIXTURE_DIRS = ["weights/tiny-random", "tests/fixtures/reference", "tests/fixtures/onnx",
                "tests/fixtures/audio"]
MAX_TOTAL_BYTES = 30 * 1024 * 1024
REGEN_HINT = ("regenerate it: $OMNICORE_REF_VENV/bin/python tools/reference/dump_reference.py "
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


@pytest.mark.subprocess
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


# --- the fixtures are non-trivial and match their documented contracts ---------------------------

ONNX_CONTRACT = {
    # name: ([(input, dtype, rank)], [(output, dtype, rank)])
    "audio_embeddings_encoder": ([("input_ids", "tensor(int64)", 3), ("audio_mask", "tensor(bool)", 2)],
                                 [("inputs_embeds", "tensor(float)", 3)]),
    "llm_decoder": ([("inputs_embeds", "tensor(float)", 3), ("attention_mask", "tensor(bool)", 4)],
                    [("last_hidden_state", "tensor(float)", 3)]),
    "audio_heads_decoder": ([("hidden", "tensor(float)", 3)], [("logits", "tensor(float)", 4)]),
    "higgs_decoder": ([("audio_codes", "tensor(int64)", 3)], [("audio_values", "tensor(float)", 3)]),
    "higgs_acoustic_encoder": ([("input_values", "tensor(float)", 3)],
                               [("acoustic_features", "tensor(float)", 3)]),
    "higgs_semantic_encoder": ([("input_values_16k", "tensor(float)", 2)],
                               [("semantic_features", "tensor(float)", 3)]),
    "higgs_quantizer": ([("features", "tensor(float)", 3)], [("audio_codes", "tensor(int64)", 3)]),
}


@pytest.mark.parametrize("name", sorted(ONNX_CONTRACT))
def test_onnx_fixture_contract(name):
    ort = require_module("onnxruntime")
    path = require_file(ROOT / "tests" / "fixtures" / "onnx" / f"{name}.onnx",
                        "tools/reference/export_onnx.py")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ins = [(i.name, i.type, len(i.shape)) for i in sess.get_inputs()]
    outs = [(o.name, o.type, len(o.shape)) for o in sess.get_outputs()]
    assert (ins, outs) == ONNX_CONTRACT[name]


def test_onnx_decoder_output_depends_on_codes():
    ort = require_module("onnxruntime")
    np = require_module("numpy")
    path = require_file(ROOT / "tests" / "fixtures" / "onnx" / "higgs_decoder.onnx",
                        "tools/reference/export_onnx.py")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 1024, (1, 8, 6)).astype(np.int64) for _ in range(2))
    wa, wb = (sess.run(None, {"audio_codes": c})[0] for c in (a, b))
    assert wa.shape == (1, 1, 960 * 6)
    rms = float(np.sqrt(np.mean(wa ** 2)))
    assert 0.01 < rms < 2.0, rms
    assert float(np.sqrt(np.mean((wa - wb) ** 2))) > 0.1 * rms


def test_generate_fixture_codes_vary_along_time():
    # Greedy codes that collapse to one value per row would make token-exact tests meaningless.
    np = require_module("numpy")
    paths = sorted((ROOT / "tests" / "fixtures" / "reference").glob("generate_*.npz"))
    if not paths:
        missing("the generate_*.npz fixtures", "tools/reference/dump_generate.py")
    checked = 0
    for path in paths:
        with np.load(path, allow_pickle=False) as d:
            if "codes" not in d and "chunk_codes" not in d:
                continue
            codes = d["codes"] if "codes" in d else d["chunk_codes"]
        checked += 1
        assert codes.shape[0] == 8 and codes.dtype == np.int64
        assert codes.min() >= 0 and codes.max() < 1024, path.name
        distinct = [len(np.unique(row)) for row in codes]
        assert min(distinct) >= 10, (path.name, distinct)
    assert checked >= 10
