"""omnicore's modules import each other without a cycle (at module level or inside functions),
and every module imports on its own."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "omnicore"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _imports(module: str) -> set[str]:
    """The omnicore modules that `module` imports anywhere in its source."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1 or base.startswith("omnicore"):
                base = base.removeprefix("omnicore").lstrip(".")
                if base:
                    found.add(base.split(".")[0])
                else:  # `from . import audio, text`: the names are modules
                    found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("omnicore."):
                    found.add(a.name.split(".")[1])
    return found & set(MODULES)


def test_no_import_cycle():
    graph = {m: _imports(m) for m in MODULES}
    assert graph["engine"] and "pipeline" in graph  # the walk sees imports at all
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


def test_streaming_and_engine_do_not_import_the_api():
    for m in ("streaming", "engine", "voice", "codec", "unmasking"):
        assert "pipeline" not in _imports(m), m


@pytest.mark.parametrize("module", MODULES)
def test_every_module_imports(module):
    importlib.import_module(f"omnicore.{module}")
