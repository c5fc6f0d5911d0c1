#!/usr/bin/env python3
"""Assemble a ready-to-push Hugging Face Space from this repository.

    python3 tools/build_space.py OUT_DIR                # a CPU Space (the free "CPU basic")
    python3 tools/build_space.py --gpu OUT_DIR          # a GPU Space, CUDA 12 (--cuda cuda13)

writes into OUT_DIR exactly what the Space runs, and nothing else:

    README.md         demo/README.md: the Space card, its YAML front-matter checked (sdk: gradio,
                      sdk_version inside pyproject's gradio pin, app_file, licence, the weights'
                      CC-BY-NC note); with --gpu its suggested_hardware is a GPU
    app.py, *.py      the demo's modules (demo/*.py)
    examples/         the demo's example files (demo/examples/: the clone tab's voice clip)
    omnicore/         the package's source files (no caches, tests, fixtures or weights)
    requirements.txt  pyproject's runtime dependencies and its gradio pin; with --gpu also CuPy
                      for that CUDA major version with NVIDIA's CUDA libraries from PyPI (a Space
                      has the driver, not the toolkit): pyproject's gpu-cudaNN-pypi extra. The
                      app then runs on the CuPy backend when it finds the GPU.

OUT_DIR may be new, empty, or a clone of the Space's git repository (`.git`, `.gitattributes`
and the files of an earlier build are replaced or kept; anything else there is refused, so
nothing of yours is deleted). The new files are written beside OUT_DIR first and moved in at the
end, so a failed build leaves OUT_DIR as it was. Then: `cd OUT_DIR && git add -A && git commit
&& git push` (or `hf upload user/space OUT_DIR . --repo-type space`).

The Space compiles its kernels when it starts (the app warms up before it opens its page:
omnicore.machinery.warmup), once per restart, or once per CPU with persistent storage and the Space
variable NUMBA_CACHE_DIR=/data/numba (docs/platforms.md).

A script in tools/ rather than an `omnicore` sub-command: it reads demo/ and pyproject.toml,
which only a checkout has (the installed package has neither). Exit status 0 done, 2 refused.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "omnicore"
# What a Space clone may hold besides the build's own outputs.
_KEPT = {".git", ".gitattributes"}
# --gpu: the CUDA major versions CuPy has wheels for, and the Space hardware the card suggests
# (the smallest GPU Space; any NVIDIA GPU Space runs it).
GPU_CUDA = ("cuda12", "cuda13")
GPU_HARDWARE = "t4-small"


class BuildError(Exception):
    """The Space cannot be built as asked; the message says why and what to do."""


def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise BuildError("reading pyproject.toml needs Python 3.11+ or `pip install tomli`") from None
    return tomllib.loads(path.read_text(encoding="utf-8"))


def requirements(root: Path = ROOT, gpu: str | None = None) -> list[str]:
    """The Space's requirement lines: the package's runtime dependencies, then its demo extra
    (gradio, pinned as pyproject pins it), and for a GPU Space (`gpu` = "cuda12" or "cuda13")
    the gpu-cudaNN-pypi extra."""
    project = _load_toml(root / "pyproject.toml")["project"]
    extras = project.get("optional-dependencies", {})
    demo = extras.get("demo", [])
    if not any(_name(r) == "gradio" for r in demo):
        raise BuildError("pyproject.toml's [project.optional-dependencies] demo has no gradio pin")
    lines = list(project["dependencies"]) + list(demo)
    if gpu is not None:
        if gpu not in GPU_CUDA:
            raise BuildError(f"--gpu {gpu!r}: CuPy has wheels for {', '.join(GPU_CUDA)}")
        extra = f"gpu-{gpu}-pypi"
        if extra not in extras:
            raise BuildError(f"pyproject.toml has no {extra} extra (CuPy for a GPU Space)")
        lines += extras[extra]
    return lines


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement  # a dependency of huggingface-hub

    return Requirement(requirement).name.lower().replace("_", "-")


def front_matter(readme: str) -> dict:
    """The YAML block that opens a Space's README.md."""
    import yaml  # a dependency of huggingface-hub and gradio

    if not readme.startswith("---\n") or "\n---\n" not in readme[4:]:
        raise BuildError("demo/README.md must open with the Space's YAML front-matter (---)")
    meta = yaml.safe_load(readme[4:readme.index("\n---\n", 4)])
    if not isinstance(meta, dict):
        raise BuildError("demo/README.md's front-matter is not a YAML mapping")
    return meta


def check_card(readme: str, reqs: list[str], demo_dir: Path) -> dict:
    """The Space card's front-matter, checked against what the build ships: the gradio SDK at a
    version pyproject's pin allows (the Space installs gradio from sdk_version, pip then checks
    requirements.txt against it), an app_file that is shipped, Apache-2.0 for the code and the
    CC-BY-NC note for the weights it downloads."""
    from packaging.requirements import Requirement

    meta = front_matter(readme)
    if meta.get("sdk") != "gradio":
        raise BuildError(f"demo/README.md: sdk is {meta.get('sdk')!r}; the demo needs sdk: gradio")
    pin = next(Requirement(r) for r in reqs if _name(r) == "gradio")
    version = str(meta.get("sdk_version", ""))
    if not version or not pin.specifier.contains(version, prereleases=True):
        raise BuildError(f"demo/README.md: sdk_version {version!r} is outside pyproject's pin "
                         f"gradio{pin.specifier}; set sdk_version to a release inside it")
    app_file = meta.get("app_file")
    if not app_file or not (demo_dir / str(app_file)).is_file() or "/" in str(app_file):
        raise BuildError(f"demo/README.md: app_file {app_file!r} is not a file in demo/")
    if meta.get("license") != "apache-2.0":
        raise BuildError("demo/README.md: license must be apache-2.0 (omnicore's and the demo's)")
    if "CC-BY-NC" not in readme:
        raise BuildError("demo/README.md must say that the OmniVoice weights are CC-BY-NC 4.0")
    return meta


def _package_files(root: Path) -> list[Path]:
    """The package's source files, relative to `root`: what setuptools would package, without
    caches (Numba's and Python's) or editor leftovers."""
    files = []
    for path in sorted((root / PACKAGE).rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and "__pycache__" not in rel.parts and path.suffix == ".py":
            files.append(rel)
    if Path(PACKAGE, "__init__.py") not in files:
        raise BuildError(f"{root / PACKAGE} is not the package (no __init__.py)")
    return files


def gpu_card(readme: str) -> str:
    """The card of a GPU Space: the same, with `suggested_hardware` set to a GPU (it marks the
    Space as needing one; the hardware itself is chosen in the Space's settings)."""
    meta_end = readme.index("\n---\n", 4)
    head = [ln for ln in readme[4:meta_end].split("\n") if not ln.startswith("suggested_hardware:")]
    return "---\n" + "\n".join(head + [f"suggested_hardware: {GPU_HARDWARE}"]) + readme[meta_end:]


SCREENSHOTS = re.compile(r"<!-- screenshots.*?<!-- /screenshots -->\n?", re.S)


def without_screenshots(readme: str) -> str:
    """The card less its screenshots block: the pictures stay in the repository (a Space
    takes binary files only through LFS, and the build ships none)."""
    return SCREENSHOTS.sub("", readme)


def plan(root: Path = ROOT, gpu: str | None = None) -> dict[str, bytes]:
    """Every file of the Space: relative path -> contents (`gpu`: see `requirements`)."""
    demo = root / "demo"
    reqs = requirements(root, gpu)
    readme = (demo / "README.md").read_text(encoding="utf-8")
    check_card(readme, reqs, demo)
    if gpu is not None:
        readme = gpu_card(readme)
    files = {"README.md": without_screenshots(readme).encode("utf-8")}
    for module in sorted(demo.glob("*.py")):
        files[module.name] = module.read_bytes()
    for example in sorted((demo / "examples").glob("*")):
        if example.is_file():
            files[f"examples/{example.name}"] = example.read_bytes()
    for rel in _package_files(root):
        files[rel.as_posix()] = (root / rel).read_bytes()
    header = ["# Installed by the Space on top of its gradio SDK (sdk_version in README.md): omnicore's",
              "# runtime dependencies and the demo's gradio pin, from pyproject.toml. omnicore itself",
              "# is the folder beside app.py."]
    if gpu is not None:
        header.append(f"# A GPU Space: the last line is pyproject's gpu-{gpu}-pypi extra (CuPy with "
                      "the CUDA libraries).")
    files["requirements.txt"] = ("\n".join(header + reqs) + "\n").encode("utf-8")
    return files


def _outputs(files: dict[str, bytes]) -> set[str]:
    """Top-level names the build owns in OUT_DIR."""
    return {name.split("/", 1)[0] for name in files}


def build(out_dir: str | os.PathLike, root: Path = ROOT, gpu: str | None = None) -> list[str]:
    """Write the Space into `out_dir` (see the module docstring); returns the files written."""
    files = plan(root, gpu)
    out = Path(out_dir).resolve()
    owned = _outputs(files)
    if out.exists():
        if not out.is_dir():
            raise BuildError(f"{out_dir} exists and is not a folder")
        foreign = sorted(p.name for p in out.iterdir() if p.name not in owned | _KEPT)
        if foreign:
            raise BuildError(f"{out_dir} holds {', '.join(foreign)}, which a Space build does not "
                             "write; build into a new folder or a clean clone of the Space")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.build.", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(stage, 0o777 & ~umask)  # mkdtemp's 0700 would become OUT_DIR's mode
        for rel, data in files.items():
            target = stage / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if not out.exists():
            stage.rename(out)
        else:
            for name in sorted(owned):  # replace the earlier build's outputs, keep .git
                old = out / name
                if old.is_dir() and not old.is_symlink():
                    shutil.rmtree(old)
                elif old.exists() or old.is_symlink():
                    old.unlink()
                (stage / name).rename(old)
    finally:
        if stage.exists():
            shutil.rmtree(stage)
    return sorted(files)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Write a ready-to-push Hugging Face Space (demo app, omnicore package, "
                    "requirements.txt, README.md card) into OUT_DIR.")
    p.add_argument("out_dir", metavar="OUT_DIR", help="new or empty folder, or a clone of the Space")
    p.add_argument("--gpu", action="store_true",
                   help="a GPU Space: CuPy in requirements.txt and a GPU as the card's suggested "
                        "hardware")
    p.add_argument("--cuda", choices=GPU_CUDA, default=GPU_CUDA[0],
                   help=f"with --gpu: the CUDA major version of CuPy's wheels (default "
                        f"{GPU_CUDA[0]})")
    args = p.parse_args(argv)
    try:
        written = build(args.out_dir, gpu=args.cuda if args.gpu else None)
    except (BuildError, OSError) as exc:
        print(f"build_space: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files to {args.out_dir}; push that folder to a Gradio Space")
    return 0


if __name__ == "__main__":
    sys.exit(main())
