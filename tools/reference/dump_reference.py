#!/usr/bin/env python3
"""Single entry point for the reference fixtures: run every dump_*.py, then write the manifest.

    $OMNICORE_REF_VENV/bin/python tools/reference/dump_reference.py                 # all stages
    $OMNICORE_REF_VENV/bin/python tools/reference/dump_reference.py --only codec    # dump_codec.py only
    $OMNICORE_REF_VENV/bin/python tools/reference/dump_reference.py --manifest-only

Each `tools/reference/dump_<stage>.py` exposes `dump(ckpt_dir: Path, out_dir: Path) -> list[Path]`
and writes its `.npz` files into `tests/fixtures/reference/`. Every stage runs in the same
deterministic setting (torch seed 0, one thread, float32 default); a stage that raises is reported
and the others still run, but the exit status is then 1.

`tests/fixtures/manifest.json` records the pinned tool versions (from requirements.txt) next to
the versions actually installed, the seeds, and the sha256 and size of every fixture file
(weights/tiny-random, tests/fixtures/{reference,onnx,audio}); tests/test_fixtures_manifest.py
checks it without torch.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REQUIREMENTS = HERE / "requirements.txt"
MANIFEST = ROOT / "tests" / "fixtures" / "manifest.json"
DEFAULT_CKPT = ROOT / "weights" / "tiny-random"
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "reference"
# Folders whose every file the manifest lists (paths relative to the repo root).
FIXTURE_DIRS = ["weights/tiny-random", "tests/fixtures/reference", "tests/fixtures/onnx",
                "tests/fixtures/audio"]
TORCH_SEED = 0
_INITIAL_WARNING_FILTERS = list(__import__("warnings").filters)
MANIFEST_VERSION = 1


def read_pins(path: Path = REQUIREMENTS) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"{path}: every requirement must be pinned with ==, got {line!r}")
        pins[name.strip()] = version.strip()
    return pins


def installed_versions(names) -> dict[str, str | None]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git_known(paths: list[Path]) -> set[Path] | None:
    """The paths git tracks or has staged (None outside a git checkout)."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *FIXTURE_DIRS], cwd=ROOT,
                             check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {(ROOT / f).resolve() for f in out.decode().split("\0") if f}


def fixture_files(also: list[Path] = ()) -> list[Path]:
    """Fixture files to list: those git knows (tracked or staged) plus those written just now.

    Someone else's uncommitted work-in-progress fixture is left out, so the committed manifest
    never names a file that a fresh clone lacks. Stage a new fixture (git add) before running
    --manifest-only, or let this script write it.
    """
    files = []
    for d in FIXTURE_DIRS:
        base = ROOT / d
        if base.is_dir():
            files += [p.resolve() for p in base.rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts]
    known = git_known(files)
    if known is not None:
        fresh = {Path(p).resolve() for p in also}
        files = [p for p in files if p in known or p in fresh]
    return sorted(files)


def discover_stages() -> dict[str, Path]:
    """dump_<stage>.py files beside this one, by stage name."""
    return {p.stem[len("dump_"):]: p for p in sorted(HERE.glob("dump_*.py"))
            if p.name != Path(__file__).name}


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(f"omnicore_reference_dump_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not callable(getattr(mod, "dump", None)):
        raise AttributeError(f"{path.name} has no dump(ckpt_dir, out_dir) function")
    return mod


def deterministic_torch() -> None:
    """Same starting state for every stage (seed, threads, dtype, logging and warning filters)."""
    import logging
    import warnings

    import torch

    logging.disable(logging.NOTSET)
    warnings.filters[:] = _INITIAL_WARNING_FILTERS
    torch.manual_seed(TORCH_SEED)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)


def run_stages(names: list[str], ckpt: Path, out: Path) -> tuple[dict, list[str]]:
    stages = discover_stages()
    unknown = [n for n in names if n not in stages]
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; have {sorted(stages)}")
    out.mkdir(parents=True, exist_ok=True)
    results, failed = {}, []
    for name in names:
        t0 = time.time()
        try:
            deterministic_torch()
            mod = load_module(name, stages[name])
            paths = [Path(p) for p in mod.dump(ckpt, out)]
            missing = [str(p) for p in paths if not p.is_file()]
            if missing:
                raise FileNotFoundError(f"dump_{name} reported files it did not write: {missing}")
            results[name] = {"files": [rel(p) for p in paths],
                             "seed": getattr(mod, "SEED", None)}
            print(f"[dump_{name}] {len(paths)} file(s) in {time.time() - t0:.1f}s")
        except Exception:  # keep going: one broken stage must not hide the others
            traceback.print_exc()
            failed.append(name)
            print(f"[dump_{name}] FAILED after {time.time() - t0:.1f}s", file=sys.stderr)
    return results, failed


def rel(p: Path) -> str:
    p = Path(p).resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        return str(p)


def write_manifest(stage_results: dict | None = None) -> dict:
    old = {}
    if MANIFEST.is_file():
        try:
            old = json.loads(MANIFEST.read_text())
        except json.JSONDecodeError:
            old = {}
    stages = dict(old.get("stages", {}))
    stages.update(stage_results or {})
    pins = read_pins()
    files = {}
    written = [ROOT / f for r in (stage_results or {}).values() for f in r.get("files", [])]
    for p in fixture_files(written):
        files[rel(p)] = {"sha256": sha256_of(p), "bytes": p.stat().st_size}
    # stages whose files are gone are dropped
    stages = {k: v for k, v in stages.items()
              if all(f in files for f in v.get("files", []))}
    sys.path.insert(0, str(HERE))
    from make_checkpoint import DEFAULT_SEED  # noqa: E402

    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "generator": "tools/reference/dump_reference.py",
        "pins": pins,
        "installed": installed_versions(pins),
        "python": platform.python_version(),
        "seeds": {"checkpoint": DEFAULT_SEED, "torch_manual_seed": TORCH_SEED},
        "checkpoint": "weights/tiny-random",
        "stages": dict(sorted(stages.items())),
        "files": files,
        "total_bytes": sum(f["bytes"] for f in files.values()),
    }
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, default=DEFAULT_CKPT)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="+", metavar="STAGE", help="stage names (dump_<STAGE>.py)")
    ap.add_argument("--manifest-only", action="store_true", help="only rewrite the manifest")
    ap.add_argument("--list", action="store_true", help="list the stages found")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.list:
        for name, path in discover_stages().items():
            print(f"{name:12s} {rel(path)}")
        return
    failed = []
    results = {}
    if not args.manifest_only:
        names = args.only or list(discover_stages())
        results, failed = run_stages(names, args.ckpt.resolve(), args.out.resolve())
    m = write_manifest(results)
    print(f"manifest: {len(m['files'])} files, {m['total_bytes'] / 1e6:.2f} MB -> {rel(MANIFEST)}")
    if failed:
        raise SystemExit(f"failed stages: {failed}")


if __name__ == "__main__":
    main()
