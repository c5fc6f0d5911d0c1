"""The README and docs/ stay true: every line count they state is within 10 % of the tree (the
counts are refreshed by tools/readme_counts.py), every path and relative link they name exists,
the README's file map names every module of the package, every omnicore name, file and signature
that they and the docstrings name exists (tools/doc_names.py), and every Python example runs as
written (on the tiny checkpoint)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


counts = _tool("readme_counts")
names = _tool("doc_names")

DOCS = counts.markdown_files(ROOT)
INSTALL = "python3 -m pip install -e . && omnicore say \"Hello! This is OmniVoice running on numpy.\" -o hello.wav"
TEST = "python3 -m pip install -e '.[test,demo,tn,server,ray,wyoming,mcp,voice-agents]' && python3 -m pytest -q"


@pytest.mark.parametrize("md", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_statements_are_true(md):
    assert counts.problems(md, ROOT) == []


def test_the_readme_states_counts():
    stated = counts.stated_counts((ROOT / "README.md").read_text(encoding="utf-8"))
    named = {p for c in stated for p in c.paths}
    assert len(stated) >= 20, "the file map lost its lines column"
    assert {"omnicore/model/", "omnicore/"} <= named, "the model's and the package's totals"


def test_the_file_map_names_every_module():
    assert counts.unmapped_modules(ROOT) == [], \
        "add a row to README.md's file map (or name the folder), then run tools/readme_counts.py"


def test_the_two_commands_are_the_readme_s():
    # The first thing a reader runs, and the test command CI runs (quietly: .ci/run).
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"    {INSTALL}\n" in text and f"    {TEST}\n" in text


def test_the_readme_stays_a_front_door():
    # The details live in docs/; the README says what, how to run it, and how it works.
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 320


# --- the tool itself, on a small tree -------------------------------------------------------

def _tree(tmp_path: Path, readme: str, docs: dict[str, str] | None = None) -> Path:
    (tmp_path / "omnicore" / "model").mkdir(parents=True)
    (tmp_path / "omnicore" / "__init__.py").write_text("")
    (tmp_path / "omnicore" / "model" / "a.py").write_text("x = 1\n" * 100)
    (tmp_path / "omnicore" / "b.py").write_text("y = 2\n" * 50)
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "docs").mkdir()
    for name, text in (docs or {}).items():
        (tmp_path / "docs" / name).write_text(text)
    return tmp_path


MAP = """# T

The model is [`omnicore/model/`](omnicore/model/) (7 lines); all: `omnicore/` (1,000 lines).

## A table

| file | lines | what |
|---|---:|---|
| [`a.py`](omnicore/model/a.py) | 99 | a |
| [`b.py`](omnicore/b.py), [`a.py`](omnicore/model/a.py) | 1 | both |
| `omnicore/b.py` | 50 | b, named in backticks |
| [`no count`](omnicore/) | — | a row without a count |
"""


def test_refresh_rewrites_every_count(tmp_path):
    root = _tree(tmp_path, MAP)
    md = root / "README.md"
    new = counts.refresh(MAP, md, root)
    assert "(100 lines)" in new and "`omnicore/` (150 lines)" in new
    assert "| 100 | a |" in new and "| 150 | both |" in new and "| 50 | b, named" in new
    md.write_text(new)
    assert counts.problems(md, root) == []
    assert counts.refresh(new, md, root) == new


def test_a_count_off_by_more_than_ten_percent_is_reported(tmp_path):
    root = _tree(tmp_path, MAP)
    found = counts.problems(root / "README.md", root)
    assert any("omnicore/model/ states 7 lines, has 100" in f for f in found)
    assert any("omnicore/ states 1,000 lines, has 150" in f for f in found)
    assert any("states 1 lines, has 150" in f for f in found)
    assert not any("states 99 lines" in f for f in found)  # within 10 %


def test_missing_paths_links_anchors_and_loose_counts_are_reported(tmp_path):
    text = MAP + (
        "\nSee `omnicore/gone.py`, [gone](docs/gone.md), [x](docs/x.md#nope), "
        "[ok](docs/x.md#a-heading), [web](https://example.com) and about 30 lines of glue.\n")
    root = _tree(tmp_path, text, {"x.md": "# A heading\n\n[back](../README.md#a-table)\n"})
    root_problems = counts.problems(root / "README.md", root)
    assert any("`omnicore/gone.py` does not exist" in f for f in root_problems)
    assert any("docs/gone.md does not exist" in f for f in root_problems)
    assert any("docs/x.md#nope: no heading" in f for f in root_problems)
    assert any("'30 lines' is not a checked count" in f for f in root_problems)
    assert not any("a-heading" in f or "example.com" in f for f in root_problems)
    assert counts.problems(root / "docs" / "x.md", root) == []


def test_unmapped_modules(tmp_path):
    text = "All: `omnicore/` (150 lines).\n\n| file | lines |\n|---|---|\n| [`a`](omnicore/model/) | 100 |\n"
    root = _tree(tmp_path, text)  # a total in prose maps nothing
    assert counts.unmapped_modules(root) == ["omnicore/b.py"]


def test_a_module_that_became_a_package_keeps_its_row(tmp_path):
    text = "| file | lines |\n|---|---|\n| [`b.py`](omnicore/b.py) | 50 |\n"
    root = _tree(tmp_path, text)
    (root / "omnicore" / "b.py").unlink()
    (root / "omnicore" / "b").mkdir()
    (root / "omnicore" / "b" / "__init__.py").write_text("z = 3\n" * 30)
    (root / "omnicore" / "b" / "part.py").write_text("w = 4\n" * 20)
    new = counts.refresh(text, root / "README.md", root)
    assert "| [`b/`](omnicore/b/) | 50 |" in new


# --- what the docs and docstrings name exists ---------------------------------------------------

def test_the_names_docs_and_docstrings_give_exist():
    assert names.problems(ROOT) == [], \
        "fix the name (or qualify an external one with its package: `omnivoice.OmniVoice.x`)"


PACKAGE_A = '''"""A module.

    run(params, x, cfg, *, steps=8, later=None) -> y      the whole signature
    run(params, x, cfg, steps=8, later=None) -> y        in order, with its defaults
    run(params, x, ...) -> y                              or a part, then `...`
"""
from .b import Thing

__all__ = ["run", "Thing"]


def run(params, x, cfg, *, steps=8, later=None):
    """Calls `b.Thing.go`, `Thing.count` and `omnicore.b.helper(1, 2)`."""


def _private():
    pass
'''

PACKAGE_B = '''"""Things; see `a.run(params, x, cfg, steps=4)` and `omnicore/a.py`."""


class Thing:
    """A thing: `Thing(size, name="x")`."""

    limit = 3

    def __init__(self, size, name="t"):
        self.count = size

    def go(self, fast=False):
        pass


def helper(a, b):
    pass
'''


def _package(tmp_path: Path, extra: dict[str, str] | None = None) -> Path:
    files = {"omnicore/__init__.py": "", "omnicore/a.py": PACKAGE_A, "omnicore/b.py": PACKAGE_B,
             "README.md": "", **(extra or {})}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def _named(tmp_path: Path, doc: str, where: str = "omnicore/c.py", code: str = "") -> list[str]:
    """What the check finds in one more file whose docstring (or Markdown text) is `doc`."""
    text = doc if where.endswith(".md") else f'"""{doc}"""\n{code}'
    return names.problems(_package(tmp_path, {where: text}))


def test_a_tree_whose_names_exist_passes(tmp_path):
    assert names.problems(_package(tmp_path)) == []


@pytest.mark.parametrize("doc, says", [
    ("See `b.gone`.", "omnicore/c.py:1: `b.gone`: omnicore.b has no `gone`"),
    ("Calls b.Thing.stop() then Thing.count.", "`b.Thing.stop`: omnicore.b.Thing has no `stop`"),
    ("`omnicore.b.Thing.limit` and omnicore.z.run", "`omnicore.z.run`: omnicore has no `z`"),
    ("Line one.\n\nUses Thing.gone here.", "omnicore/c.py:3: `Thing.gone`"),
    ("`b.helper(1, 2, 3)`", "omnicore.b.helper takes 2 positional arguments, 3 given"),
    ("`Thing.go(slow=True)`", "omnicore.b.Thing.go has no parameter `slow`"),
    ("`b.Thing(4, title='x')`", "omnicore.b.Thing has no parameter `title`"),
    ("See omnicore/gone.py.", "omnicore/c.py:1: omnicore/gone.py does not exist"),
    ("Beside `gone.py`.", "gone.py does not exist"),
])
def test_a_name_that_does_not_exist_is_reported(tmp_path, doc, says):
    found = _named(tmp_path, doc)
    assert len(found) == 1 and says in found[0], found


@pytest.mark.parametrize("signature, says", [
    ("run(params, x, cfg, steps=8) -> y", "leaves out `later` of omnicore.a.run"),
    ("run(params, x, cfg, steps=4, later=None) -> y", "`steps` defaults to 8 in omnicore.a.run, not 4"),
    ("run(params, y, cfg, steps=8, later=None) -> y", "positional parameter `y` is `x`"),
])
def test_a_signature_that_is_not_the_function_s_is_reported(tmp_path, signature, says):
    imports = "from .a import run\n"
    found = _named(tmp_path, f"From a.\n\n    {signature}\n", code=imports)
    assert len(found) == 1 and says in found[0], found
    # a call in prose (no `->`) states no signature: only its keywords and count are checked
    assert _named(tmp_path, f"From a: {signature.split(' ->')[0]}.", code=imports) == []


@pytest.mark.parametrize("doc", [
    "`omnivoice.OmniVoice._generate_iterative` and `openai.OpenAI().audio.speech.create(x=1)`",
    "Not ours: `np.zeros(3)`, `json.dumps`, `self.gone`, `cfg.gone`, e.g. this; config.json, "
    "`gone(x=1)`, https://example.com/omnicore/gone.py, x.y.z in `text.split`",
    "Reads omnicore/*.npz and omnicore/a_<name>.py.",
    "A local name: `Thing.limit`, and the re-exported `a.Thing.go(fast=True)`.",
])
def test_what_is_external_or_exists_is_not_reported(tmp_path, doc):
    assert _named(tmp_path, doc) == []


def test_markdown_code_spans_are_checked_and_fenced_blocks_run_instead(tmp_path):
    doc = ("# D\n\nCall `helper(1, 2, 3)` and `b.gone`, not b.gone2 in prose.\n\n"
           "```python\nb.gone3\n```\n")
    found = _named(tmp_path, doc, where="docs/d.md")
    assert [f.split(": ", 1)[0] for f in found] == ["docs/d.md:3"] * 2, found
    assert "3 given" in found[0] and "`b.gone`" in found[1]


def test_a_usual_variable_is_read_as_its_class(tmp_path, monkeypatch):
    monkeypatch.setattr(names, "INSTANCES", {"thing": ("omnicore.b", "Thing")})
    assert _named(tmp_path, "`thing.go()`, `thing.count`") == []
    assert "omnicore.b.Thing has no `stop`" in _named(tmp_path, "`thing.stop()`")[0]


# --- the Python examples run as written ------------------------------------------------------

CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
TINY = ROOT / "weights" / "tiny-random"


# docs/integrations.md's examples talk to servers of their own (Wyoming, MCP, the frameworks'):
# the tests of those servers run them (test_wyoming_server, test_mcp_server, test_voice_agents).
ELSEWHERE = ("docs/integrations.md",)


def python_examples() -> list[tuple[str, str]]:
    """(where, code) of every ```python block of the README and docs/."""
    from conftest import doc_examples

    pages = ["README.md", *(str(md.relative_to(ROOT)) for md in sorted((ROOT / "docs").glob("*.md")))]
    return [ex for page in pages if page not in ELSEWHERE for ex in doc_examples(page)]


EXAMPLES = python_examples()


def test_the_docs_have_python_examples():
    where = {w.split(":")[0] for w, _ in EXAMPLES}
    assert {"README.md", "docs/python.md", "docs/voices.md", "docs/streaming.md"} <= where


SERVER = "127.0.0.1:8000"  # where a server example expects `omnicore serve`


@pytest.mark.subprocess
@pytest.mark.parametrize("where, code", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_a_python_example_runs_as_written(where, code, tmp_path, monkeypatch, capsys):
    """Each example alone, in a folder holding `me.wav` (a short speech clip), on the tiny
    checkpoint instead of the hub's; `play` (the reader's audio output) collects its pieces. An
    example that talks to a server gets a real `omnicore serve` (at another port)."""
    from conftest import require_module, start_server, stop_process

    shutil.copy(CLIP, tmp_path / "me.wav")
    monkeypatch.chdir(tmp_path)
    played, proc = [], None
    if SERVER in code:
        require_module("websockets", "server")
        proc, url = start_server(tmp_path / "voices", log_path=tmp_path / "server.log")
        code = code.replace(SERVER, url.removeprefix("http://"))
    else:
        assert '"k2-fsa/OmniVoice"' in code, "an example loads the model it uses"
        code = code.replace('"k2-fsa/OmniVoice"', repr(str(TINY)))
    try:
        exec(compile(code, where, "exec"), {"__name__": "__example__", "play": played.append})
    finally:
        if proc is not None:
            stop_process(proc)
    for piece in played:
        assert piece.dtype == np.float32 and piece.ndim == 1
    assert ("play(" in code) == bool(played)
    if proc is not None:  # the WebSocket example prints its frames' sizes, then audio.done
        assert '"type": "audio.done"' in capsys.readouterr().out
