"""omnicore's modules import each other without a cycle (at module level or inside functions,
nested packages included), the model imports nothing of the product around it, the floors hold
(apps over the core over the machinery), and every module imports on its own."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "omnicore"


def _name(path: Path) -> str:
    """omnicore/model/higgs_codec.py -> "model.higgs_codec"; a package's __init__ -> the package."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
MODULES = sorted(m for m in FILES if m)  # "" is omnicore/__init__.py itself
# The leaves that model and product share: typed errors only.
SHARED = {"errors"}


def _resolve(target: str) -> str | None:
    """The module (or package) of ours that a dotted import target names, if any."""
    while target and target not in FILES:
        target = target.rpartition(".")[0]
    return target or None


def _imports(module: str) -> set[str]:
    """The omnicore modules that `module` imports anywhere in its source."""
    path = FILES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package[:len(package) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "omnicore":
                base = node.module.removeprefix("omnicore").lstrip(".")
            else:
                continue
            targets = [f"{base}.{a.name}" if base else a.name for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("omnicore.") for a in node.names
                       if a.name.startswith("omnicore.")]
        for t in targets:
            hit = _resolve(t)
            if hit and hit != module and not module.startswith(hit + "."):
                found.add(hit)
    return found


def test_no_import_cycle():
    graph = {m: _imports(m) for m in MODULES}
    assert graph["engine"] and "pipeline" in graph  # the walk sees imports at all
    assert "model.backbone" in graph["model.unmasking"]
    state: dict[str, str] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for dep in sorted(graph[m]):
            if state.get(dep) == "open":
                cycle = path[path.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, path + [dep])
        state[m] = "done"

    for m in MODULES:
        if m not in state:
            visit(m, [m])


def test_the_model_imports_nothing_of_the_product():
    model = [m for m in MODULES if m == "model" or m.startswith("model.")]
    assert len(model) > 8
    for m in model:
        outside = {d for d in _imports(m) if not d.startswith("model")} - SHARED
        assert not outside, f"{m} imports {sorted(outside)}"


def test_streaming_and_engine_do_not_import_the_api():
    for m in ("streaming", "engine", "voice", "model.higgs_codec", "model.unmasking"):
        assert "pipeline" not in _imports(m), m


def _floor(m: str) -> str:
    top = m.split(".")[0]
    if top == "__main__":  # `python -m omnicore`: the command line's entrance
        return "apps"
    return top if top in ("apps", "machinery", "model") else "core"


def test_the_floors_hold():
    """The apps stand on the core API; the core (and its model) never reach up into an app;
    the machinery serves the core and imports nothing of it but the model."""
    floors = {m: _floor(m) for m in MODULES}
    assert {"apps", "machinery", "model", "core"} <= set(floors.values())
    for m in MODULES:
        for dep in _imports(m) - SHARED:
            if floors[m] != "apps":
                assert floors[dep] != "apps", f"{m} ({floors[m]}) imports the app {dep}"
            if floors[m] == "machinery":
                assert floors[dep] in ("machinery", "model"), f"{m} imports {dep} of the core"
    assert "apps.cli" in _imports("__main__")  # `python -m omnicore` is the command line


def test_the_test_machinery_is_not_in_the_package():
    assert not list(PACKAGE.glob("testing/*.py"))
    for m in MODULES:
        for node in ast.walk(ast.parse(FILES[m].read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n.split(".")[0] == "omnicore_testing" for n in names):
                assert m == "machinery.settings", f"{m} imports the test machinery"  # strict only


@pytest.mark.parametrize("module", [m for m in MODULES if not m.endswith("__main__")])
def test_every_module_imports(module):  # (a __main__ module runs its program when imported)
    importlib.import_module(f"omnicore.{module}")
