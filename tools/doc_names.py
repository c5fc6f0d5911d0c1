#!/usr/bin/env python3
"""Keep what the docs and docstrings name true: every omnicore name, file and signature they
state must exist.

    python3 tools/doc_names.py        # list what is off (file:line: what), exit 1 if any

Read: the docstrings (module, class and function) of every .py file under omnicore/, demo/,
benchmarks/ and tools/, and the code spans (`...`) of README.md, docs/*.md and the other
folders' READMEs (fenced examples are run by tests/test_readme.py instead). Checked there:

    a dotted name      `engine.pass_seed`, `Engine.submit`, `omnicore.model.backbone`: its first
                       part is an omnicore module, class or (in a .py file) a name the file
                       defines or imports, and every later part must exist
    a call form        `decode_stream(params, codes, cfg, chunk_frames=50)` of an omnicore
                       function or class: every keyword is one of its parameters, and no more
                       positional arguments than it takes (a bare name is, in a .py file, one
                       the file defines or imports; in Markdown, the package's only function,
                       method or class of that name)
    a signature        a call form followed by `->` (a docstring's API listing): also names its
                       positional parameters, and every parameter, unless it writes `...` or
                       `**rest` for the ones it leaves out; a default it states is the default
    a path             `omnicore/...`, `tests/...`, `docs/...` (any repository folder) exists;
                       in a docstring, a file name `x.py` / `x.md` exists beside the file, under
                       the package or the repository (README.md and docs/ paths are checked by
                       tools/readme_counts.py)

A name whose first part is not omnicore's is not checked: the way to name something external is
to write its package first (`omnivoice.OmniVoice.generate`, `openai.OpenAI`,
`transformers.Qwen3Model`). Words that are usually variables rather than modules (`model`,
`server`, ...; INSTANCES) are read as instances of the class they stand for. Nothing is
imported: the package is read with `ast`, so the check runs without numpy. Standard library only.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "omnicore"
SOURCE_FOLDERS = ("omnicore", "demo", "benchmarks", "tools")
REPO_FOLDERS = ("omnicore", "tests", "tools", "benchmarks", "demo", "weights", "docs")

# The docs' usual variables and the class they hold: `model.generate(...)` is OmniVoice's
# method (or, failing that, something of the omnicore.model package).
INSTANCES = {
    "model": ("omnicore.pipeline", "OmniVoice"),
    "server": ("omnicore.apps.server.state", "ServerState"),
    "stream": ("omnicore.streaming", "SpeechStream"),
    "prompt": ("omnicore.voice", "VoiceClonePrompt"),
}
# Module names that are also other libraries' values in the docs (Starlette's `request`, the
# OpenAI event and object types `audio.done`, `audio.voice`): unchecked unless the module's.
VARIABLES = {"request", "audio"}

_PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*[\w/])([*<{]?)" % "|".join(REPO_FOLDERS))
_FILE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*\w+\.(?:py|md))\b(?![\w/-])")
_CHAIN = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w-])")
_CALL = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\(")
_TICKED = re.compile(r"`([^`\n]+)`")
# a dotted word ending so is a file name, not an attribute
_FILE_SUFFIXES = {"py", "md", "json", "jsonl", "txt", "wav", "mp3", "flac", "ogg", "npz", "npy",
                  "onnx", "safetensors", "toml", "yaml", "yml", "sh", "html", "js", "css", "png",
                  "bin", "pt", "log", "csv", "cfg", "ini", "gz", "zip", "pcm", "opus", "aac"}


# --- the package, read with ast ----------------------------------------------------------------

@dataclass
class Ref:
    """A name a module imports: `attr` of module `module` (or the module itself)."""
    module: str
    attr: str | None


@dataclass
class Scope:
    """A module or a class: the names it defines (a class also has its bases')."""
    kind: str  # "module" | "class"
    qualname: str
    names: dict = field(default_factory=dict)
    bases: list = field(default_factory=list)  # a class's (module, base expression) pairs
    node: ast.AST | None = None


@dataclass
class Func:
    qualname: str
    node: ast.FunctionDef
    method: bool  # its first parameter is bound (self / cls)


class Value:
    """A variable, an external name, anything whose attributes are not known."""

    def __init__(self, qualname: str):
        self.qualname = qualname


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def _decorated(node, name: str) -> bool:
    return any(isinstance(d, ast.Name) and d.id == name for d in node.decorator_list)


class Index:
    """Every module and class of the package (and of the files being checked), by name."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.modules: dict[str, Scope] = {}
        self.by_short: dict[str, list[Scope]] = {}   # module or class short name -> scopes
        self.functions: dict[str, list[Func]] = {}   # function or method name -> them all
        self._public = True  # whether names being read go into by_short / functions
        files = [p for p in sorted((root / PACKAGE).rglob("*.py")) if "__pycache__" not in p.parts]
        self._paths = {_module_name(p, root) for p in files}
        for path in files:
            self.add_module(path)
        for name, scope in self.modules.items():  # a package holds its submodules
            parent, _, last = name.rpartition(".")
            if parent in self.modules:
                self.modules[parent].names.setdefault(last, scope)

    def add_module(self, path: Path, public: bool = True) -> Scope:
        """Read one file; `public`: a module of the package (its names are looked up by their
        short names), else a script whose docstrings are being checked."""
        self._public = public
        name = _module_name(path, self.root)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        scope = Scope("module", name, node=tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self._statements(tree.body, scope, package)
        for node in tree.body:  # a module __getattr__ serves the names of __all__ it imports
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                self._getattr_names(node, scope, package)
        self.modules[name] = scope
        if public:
            self.by_short.setdefault(name.rpartition(".")[2], []).append(scope)
        return scope

    def _statements(self, body, scope: Scope, package: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope.names[node.name] = Func(f"{scope.qualname}.{node.name}", node, False)
                if self._public:
                    self.functions.setdefault(node.name, []).append(scope.names[node.name])
            elif isinstance(node, ast.ClassDef):
                scope.names[node.name] = self._class(node, scope, package)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            scope.names.setdefault(n.id, Value(f"{scope.qualname}.{n.id}"))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        scope.names[a.asname] = Ref(a.name, None)
                    else:
                        top = a.name.split(".")[0]
                        scope.names[top] = Ref(top, None)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(node, package)
                for a in node.names:
                    if a.name != "*":
                        scope.names[a.asname or a.name] = Ref(base, a.name)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for part in ("body", "orelse", "finalbody"):
                    self._statements(getattr(node, part, []), scope, package)
                for h in getattr(node, "handlers", []):
                    self._statements(h.body, scope, package)

    @staticmethod
    def _absolute(node: ast.ImportFrom, package: str) -> str:
        if not node.level:
            return node.module or ""
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1])
        return f"{base}.{node.module}" if node.module else base

    def _getattr_names(self, fn: ast.FunctionDef, scope: Scope, package: str) -> None:
        """The names of `__all__` that a module `__getattr__` imports (by name, or from a
        module it imports) become the module's."""
        exported = []
        for node in scope.node.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple))
                    and any(getattr(t, "id", "") == "__all__" for t in node.targets)):
                exported = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
        imports = [(self._absolute(n, package), a.name) for n in ast.walk(fn)
                   if isinstance(n, ast.ImportFrom) for a in n.names]
        for name in exported:
            for base, a in imports:
                if a == name:
                    scope.names.setdefault(name, Ref(base, name))
                elif f"{base}.{a}" in self._paths:  # `from . import pipeline`: pipeline.name
                    scope.names.setdefault(name, Ref(f"{base}.{a}", name))

    def _class(self, node: ast.ClassDef, module: Scope, package: str) -> Scope:
        scope = Scope("class", f"{module.qualname}.{node.name}", node=node)
        for b in node.bases:
            if isinstance(b, ast.Name) and b.id == "object":
                continue
            scope.bases.append((module, b))
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope.names[item.name] = Func(f"{scope.qualname}.{item.name}", item,
                                              not _decorated(item, "staticmethod"))
                if self._public:
                    self.functions.setdefault(item.name, []).append(scope.names[item.name])
                for n in ast.walk(item):  # self.x = ... anywhere in a method
                    targets = []
                    if isinstance(n, ast.Assign):
                        targets = n.targets
                    elif isinstance(n, (ast.AnnAssign, ast.AugAssign)):
                        targets = [n.target]
                    for t in targets:
                        for a in ast.walk(t):
                            if (isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)
                                    and a.value.id in ("self", "cls")):
                                scope.names.setdefault(a.attr, Value(f"{scope.qualname}.{a.attr}"))
            elif isinstance(item, ast.ClassDef):
                scope.names[item.name] = self._class(item, module, package)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            scope.names[n.id] = Value(f"{scope.qualname}.{n.id}")
        if self._public:
            self.by_short.setdefault(node.name, []).append(scope)
        return scope

    # -- looking names up ---------------------------------------------------------------------

    def follow(self, target, depth: int = 0):
        """A Ref's target (a Scope, Func or Value), or a Value when it leaves the package."""
        while isinstance(target, Ref) and depth < 20:
            depth += 1
            module = self.modules.get(target.module)
            if module is None:
                return Value(target.module)  # external, or not indexed
            if target.attr is None:
                return module
            if target.attr in module.names:
                target = module.names[target.attr]
            elif f"{target.module}.{target.attr}" in self.modules:
                return self.modules[f"{target.module}.{target.attr}"]
            else:
                return None
        return target

    def attribute(self, scope: Scope, name: str, seen=None):
        """`scope.name`: the target, None when it does not exist, Value when unknowable."""
        if name in scope.names:
            return self.follow(scope.names[name])
        if scope.kind == "class":
            seen = seen or set()
            seen.add(scope.qualname)
            for module, b in scope.bases:
                base = self.expression(module, b)
                if isinstance(base, Scope) and base.kind == "class":
                    if base.qualname not in seen:
                        got = self.attribute(base, name, seen)
                        if got is not None:
                            return got
                else:
                    return Value(f"{scope.qualname}.{name}")  # an external base: unknowable
        return None

    def expression(self, module: Scope, node: ast.expr):
        """A base class expression (`Name` or `mod.Name`) looked up in `module`."""
        if isinstance(node, ast.Name):
            got = module.names.get(node.id)
            return self.follow(got) if got is not None else Value(node.id)
        if isinstance(node, ast.Attribute):
            inner = self.expression(module, node.value)
            if isinstance(inner, Scope):
                return self.attribute(inner, node.attr) or Value(node.attr)
        return Value(ast.dump(node))


# --- what a piece of text names ----------------------------------------------------------------

@dataclass
class Params:
    positional: list[str]
    defaults: dict[str, ast.expr]
    keyword_only: list[str]
    varargs: bool
    varkw: bool

    @property
    def all(self) -> list[str]:
        return self.positional + self.keyword_only


def _params(target) -> Params | None:
    """The parameters a call of `target` takes (a function, a method, a class)."""
    if isinstance(target, Func):
        a = target.node.args
        positional = [p.arg for p in a.posonlyargs + a.args]
        defaults = dict(zip(positional[len(positional) - len(a.defaults):], a.defaults))
        defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
        if target.method:
            positional = positional[1:]
        return Params(positional, defaults, [p.arg for p in a.kwonlyargs], a.vararg is not None,
                      a.kwarg is not None)
    if isinstance(target, Scope) and target.kind == "class":
        init = target.names.get("__init__")
        if isinstance(init, Func):
            return _params(init)
        if _is_dataclass(target.node) and not target.bases:
            fields_, defaults = [], {}
            for item in target.node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    if "ClassVar" in ast.dump(item.annotation):
                        continue
                    fields_.append(item.target.id)
                    if item.value is not None:
                        defaults[item.target.id] = item.value
            return Params(fields_, defaults, [], False, False)
    return None


def _call_text(text: str, start: int) -> tuple[str, int] | None:
    """The balanced `(...)` that opens at text[start], and where it ends."""
    depth = 0
    for i in range(start, min(len(text), start + 400)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1], i + 1
    return None


class Checker:
    """Checks the names of one file's text against the index."""

    def __init__(self, index: Index, path: Path, local: Scope | None):
        self.index, self.path, self.local = index, path, local
        self.found: list[str] = []

    def where(self, line: int) -> str:
        return f"{self.path.relative_to(self.index.root)}:{line}"

    def roots(self, first: str) -> list:
        """What the first part of a dotted name may be (empty: not omnicore's, not checked)."""
        instance = [self.index.follow(Ref(*INSTANCES[first]))] if first in INSTANCES else []
        if self.local is not None and first in self.local.names:
            got = self.index.follow(self.local.names[first])
            if isinstance(got, (Scope, Func)):
                return [got] + instance
            return []  # a local variable, or an external module: not checked
        if first == PACKAGE:
            return [self.index.modules[PACKAGE]]
        roots = list(self.index.by_short.get(first, []))
        if first in INSTANCES:
            roots.append(self.index.follow(Ref(*INSTANCES[first])))
        return roots

    def resolve(self, chain: str) -> tuple[bool, object, str]:
        """(found, the target or None, why not) for a dotted name; found when not checked."""
        parts = chain.split(".")
        roots = self.roots(parts[0])
        if not roots:
            return True, None, ""
        why = ""
        for target in roots:
            for i, name in enumerate(parts[1:], 1):
                if isinstance(target, Scope):
                    got = self.index.attribute(target, name)
                    if got is None:
                        why = why or f"{target.qualname} has no `{name}`"
                        target = None
                        break
                    target = got
                else:
                    target = Value(chain)  # attributes of a function or a value: not checked
                    break
            if target is not None:
                return True, target, ""
        if parts[0] in VARIABLES:
            return True, None, ""
        return False, None, why

    def check_text(self, text: str, line0: int, docstring: bool) -> None:
        """Every name, call and path of `text` (a docstring, or a Markdown code span) that
        starts at line `line0`."""
        def line_of(pos: int) -> int:
            return line0 + text.count("\n", 0, pos)

        for m in _CHAIN.finditer(text):
            chain = m.group(1)
            if chain.rsplit(".", 1)[1].lower() in _FILE_SUFFIXES:
                continue
            ok, _, why = self.resolve(chain)
            if not ok:
                self.found.append(f"{self.where(line_of(m.start()))}: `{chain}`: {why}")
        for m in _CALL.finditer(text):
            chain = m.group(1)
            ok, target, _ = self.resolve(chain) if "." in chain else self.resolve_single(chain)
            params = _params(target) if ok else None
            if params is None:
                continue
            got = _call_text(text, m.end() - 1)
            if got is None:
                continue
            args, end = got
            try:
                call = ast.parse(chain + args, mode="eval").body
            except SyntaxError:
                continue
            if not isinstance(call, ast.Call):
                continue
            signature = docstring and re.match(r"\s*->", text[end:end + 40]) is not None
            for why in self.check_call(call, params, signature, getattr(target, "qualname", chain)):
                self.found.append(f"{self.where(line_of(m.start()))}: `{chain}(...)`: {why}")
        if docstring:
            self.check_paths(text, line_of)

    def resolve_single(self, name: str):
        """A bare `name(`: in a .py file, the file's own function or class of that name; in
        Markdown, the package's one public function, method or class of that name (or nothing:
        not checked)."""
        if self.local is not None:
            got = self.index.follow(self.local.names[name]) if name in self.local.names else None
            return True, got if isinstance(got, (Func, Scope)) else None, ""
        found = self.index.functions.get(name, []) + [
            c for c in self.index.by_short.get(name, []) if c.kind == "class"]
        single = len(found) == 1 and not name.startswith("_")
        return True, found[0] if single else None, ""

    @staticmethod
    def check_call(call: ast.Call, p: Params, signature: bool, qualname: str) -> list[str]:
        out = []
        positional = [a for a in call.args if not (isinstance(a, ast.Constant) and a.value is ...)]
        abbreviated = len(positional) < len(call.args) or any(
            isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
        positional = [a for a in positional if not isinstance(a, ast.Starred)]
        if len(positional) > len(p.positional) and not p.varargs:
            out.append(f"{qualname} takes {len(p.positional)} positional arguments, "
                       f"{len(positional)} given")
        for k in call.keywords:
            if k.arg is not None and k.arg not in p.all and not p.varkw:
                out.append(f"{qualname} has no parameter `{k.arg}`")
        if not signature:
            return out
        for a, name in zip(positional, p.positional):
            if isinstance(a, ast.Name) and a.id != name:
                out.append(f"positional parameter `{a.id}` is `{name}` in {qualname}")
        for k in call.keywords:
            want = p.defaults.get(k.arg)
            if (isinstance(k.value, ast.Constant) and k.value.value is not ... and isinstance(want, ast.Constant)
                    and want.value != k.value.value):
                out.append(f"`{k.arg}` defaults to {want.value!r} in {qualname}, not {k.value.value!r}")
        if not abbreviated:
            named = set(p.positional[:len(positional)]) | {k.arg for k in call.keywords}
            missing = [n for n in p.all if n not in named]
            if missing:
                out.append(f"the signature leaves out {', '.join(f'`{n}`' for n in missing)} of "
                           f"{qualname} (name them, or write `...`)")
        return out

    def check_paths(self, text: str, line_of) -> None:
        root = self.index.root
        for m in _PATH.finditer(text):
            path = m.group(1) if not m.group(2) else m.group(1).rpartition("/")[0]  # a pattern
            if not (root / path).exists() and "__pycache__" not in path:  # made by running
                self.found.append(f"{self.where(line_of(m.start()))}: {m.group(1)} does not exist")
        if self.path.relative_to(root).parts[0] != PACKAGE:
            return  # elsewhere `x.py` may be an example, or a file a script writes
        for m in _FILE.finditer(text):
            name = m.group(1)
            if name.split("/")[0] in REPO_FOLDERS:
                continue  # a path from the root: checked above
            bases = [self.path.parent, root / PACKAGE, root]
            if not any((b / name).exists() for b in bases) and not any(
                    p.name == name for f in SOURCE_FOLDERS + ("tests", "docs") for p in (root / f).rglob(name)):
                self.found.append(f"{self.where(line_of(m.start()))}: {name} does not exist")


def docstrings(tree: ast.Module):
    """(text, line of its first line) of every docstring of a module."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                yield body[0].value.value, body[0].value.lineno


def python_files(root: Path = ROOT) -> list[Path]:
    out = []
    for folder in SOURCE_FOLDERS:
        out += [p for p in sorted((root / folder).rglob("*.py")) if "__pycache__" not in p.parts]
    return out


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md, docs/ and the other folders' READMEs (not the tests' fixtures)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))] + [
        p for f in ("benchmarks", "demo", "tools", "weights") for p in sorted((root / f).rglob("*.md"))]


def python_problems(path: Path, index: Index) -> list[str]:
    rel = path.relative_to(index.root)
    local = index.modules.get(_module_name(path, index.root)) if rel.parts[0] == PACKAGE else None
    if local is None:
        local = index.add_module(path, public=False)
    checker = Checker(index, path, local)
    for text, line in docstrings(local.node):
        checker.check_text(text, line, docstring=True)
    return checker.found


def _fenced(lines: list[str]) -> list[bool]:
    inside, out = False, []
    for line in lines:
        fence = line.lstrip().startswith("```")
        out.append(inside or fence)
        if fence:
            inside = not inside
    return out


def markdown_problems(path: Path, index: Index) -> list[str]:
    checker = Checker(index, path, None)
    lines = path.read_text(encoding="utf-8").split("\n")
    for n, (line, fenced) in enumerate(zip(lines, _fenced(lines))):
        if not fenced:
            for span in _TICKED.findall(line):
                checker.check_text(span, n + 1, docstring=False)
    return checker.found


def problems(root: Path = ROOT) -> list[str]:
    index = Index(root)
    found = []
    for path in python_files(root):
        found += python_problems(path, index)
    for path in markdown_files(root):
        found += markdown_problems(path, index)
    return found


def main() -> int:
    found = problems(ROOT)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
