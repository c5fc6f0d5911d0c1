"""docs/walkthrough.md stays true: a fresh run of tools/walkthrough.py gives the same page (text
and integers exactly, floats to rounding), and every function it links to is defined in the
file the link points to."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "walkthrough.md"

_spec = importlib.util.spec_from_file_location("walkthrough", ROOT / "tools" / "walkthrough.py")
walkthrough = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(walkthrough)

# [text](target): a relative link; the text `module.name` or `Class.method` names a definition
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
DOTTED = re.compile(r"`([A-Za-z_][\w.]*)`")


def test_page_matches_a_fresh_run():
    diff = walkthrough.differences(PAGE.read_text(encoding="utf-8"), walkthrough.render())
    assert not diff, ("docs/walkthrough.md is stale; regenerate it with "
                      "`python3 tools/walkthrough.py`:\n" + "\n".join(diff[:20]))


def test_differences_forgive_float_rounding_only():
    d = walkthrough.differences
    assert d("lp [8, 65] starts 0.1234, -35.90", "lp [8, 65] starts 0.1235, -35.91") == []
    assert d("RMS 0.2517.", "RMS 0.2518.") == []  # a float ending a sentence
    assert d("x 0.1234", "x 0.1334")  # a float beyond rounding
    assert d("[8, 95]", "[8, 96]")  # integers are exact
    assert d("a Qwen3 block", "a Qwen2 block")  # so is the text, digits in words included
    assert d("sum 1.000", "sum 1")  # a float never stands for an integer
    assert d("one\ntwo", "one")


def _defined(path: Path, names: list[str]) -> bool:
    """Whether `names` (e.g. ["OmniVoice", "synthesize"]) is a chain of definitions in `path`:
    a function, class or assigned name at the top level, then inside that class, ..."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    for name in names:
        found = None
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == name:
                    found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def test_every_link_resolves():
    links = LINK.findall(PAGE.read_text(encoding="utf-8"))
    assert len(links) >= 30, "the page lost its links (or this test its way of reading them)"
    bad = []
    for text, target in links:
        path = (PAGE.parent / target).resolve()
        if not path.exists():
            bad.append(f"{target}: no such file")
            continue
        named = DOTTED.fullmatch(text)
        if path.suffix != ".py" or not named:
            continue  # a link to a file, not to a definition in it
        names = named.group(1).split(".")
        if names[0] == path.stem:  # `backbone.embed` in backbone.py
            names = names[1:]
        if not _defined(path, names):
            bad.append(f"{text} -> {target}: not defined there")
    assert not bad, "\n".join(bad)
