#!/usr/bin/env python3
"""Keep the README's numbers and paths true: recount every line count it states, in place.

    python3 tools/readme_counts.py           # rewrite every stated count in README.md and docs/
    python3 tools/readme_counts.py --check   # change nothing; list what is off, exit 1 if any

A count is stated in one of two forms, and any other "N lines" in these files is an error (a
number nobody checks):

    a table with a `lines` column     the row counts the paths its first cell links to (or,
                                      without links, names in backticks), summed
    prose                             a path in backticks, or a link whose text is in backticks,
                                      followed by " (N lines": "`omnicore/model/` (5,081 lines)"

A file counts its lines as `wc -l` does; a folder, the lines of every .py file under it. A link
to a module `x.py` that has become a package `x/` is pointed at the package.

`--check` and tests/test_readme.py also report a stated count off by more than 10 %, a path in
backticks or a relative link (with its #anchor) that does not exist, and a module of the package
that the README's file map does not name (a new module needs a row, written by hand: its job in
a line). Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.10  # a stated count may drift this far before the check fails

# A path in backticks is checked when it starts in one of the repository's own folders.
_REPO_PATH = re.compile(r"^(?:omnicore|tests|tools|benchmarks|demo|weights|docs)/[\w./-]*$")
_TICKED = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^)\s]+)\)")
_PROSE_COUNT = re.compile(r"(?:\[`[^`\n]+`\]\(([^)\s]+)\)|`([^`\s]+)`) \((\d[\d,]*) lines")
_ANY_COUNT = re.compile(r"\b(\d[\d,]*) lines\b")


def markdown_files(root: Path = ROOT) -> list[Path]:
    """The files whose statements are kept true: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def line_count(path: Path) -> int:
    """Lines of a file (as `wc -l`), or of every .py file under a folder."""
    if path.is_dir():
        files = [p for p in path.rglob("*.py") if "__pycache__" not in p.parts]
    else:
        files = [path]
    return sum(p.read_bytes().count(b"\n") for p in files)


@dataclass
class Count:
    """One stated line count: `text[start:end]` is the number, `paths` what it counts (link
    targets, relative to the Markdown file, when `linked`; else paths from the root), `row`
    whether it is a table's (a file map's) or prose."""
    start: int
    end: int
    paths: tuple[str, ...]
    linked: bool
    stated: int
    lineno: int
    row: bool

    def targets(self, md: Path, root: Path) -> list[Path]:
        base = md.parent if self.linked else root
        return [(base / p.split("#")[0]).resolve() for p in self.paths]


def _fenced(text: str) -> list[bool]:
    """For each line: is it inside a ``` fenced block (not prose, not checked)?"""
    inside, out = False, []
    for line in text.split("\n"):
        fence = line.lstrip().startswith("```")
        out.append(inside or fence)
        if fence:
            inside = not inside
    return out


def _cells(line: str) -> list[tuple[int, int]]:
    """Spans of a table row's cells, split at '|' outside backticks."""
    spans, start, ticked = [], None, False
    for i, ch in enumerate(line):
        if ch == "`":
            ticked = not ticked
        elif ch == "|" and not ticked:
            if start is not None:
                spans.append((start, i))
            start = i + 1
    return spans


def _row_paths(cell: str) -> tuple[tuple[str, ...], bool]:
    links = [target for _, target in _LINK.findall(cell)]
    return (tuple(links), True) if links else (tuple(_TICKED.findall(cell)), False)


def stated_counts(text: str) -> list[Count]:
    """Every line count `text` states, in either form (see the module docstring)."""
    counts: list[Count] = []
    lines = text.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    fenced = _fenced(text)
    column = None  # index of the `lines` column of the table being read
    for n, line in enumerate(lines):
        if fenced[n]:
            continue
        if not line.lstrip().startswith("|"):
            column = None
        else:
            spans = _cells(line)
            names = [line[a:b].strip().lower() for a, b in spans]
            if column is None:
                column = names.index("lines") if "lines" in names else -1
            elif column >= 0 and len(spans) > column and not set(names[column]) <= set("-: "):
                a, b = spans[column]
                number = re.search(r"\d[\d,]*", line[a:b])
                if number:
                    paths, linked = _row_paths(line[spans[0][0]:spans[0][1]])
                    counts.append(Count(offsets[n] + a + number.start(), offsets[n] + a + number.end(),
                                        paths, linked, int(number.group().replace(",", "")), n + 1,
                                        row=True))
        for m in _PROSE_COUNT.finditer(line):
            counts.append(Count(offsets[n] + m.start(3), offsets[n] + m.end(3),
                                (m.group(1) or m.group(2),), m.group(1) is not None,
                                int(m.group(3).replace(",", "")), n + 1, row=False))
    return counts


def unchecked_counts(text: str) -> list[tuple[int, str]]:
    """(line number, the words) of every "N lines" that is not a stated count of either form."""
    known = {c.start for c in stated_counts(text)}
    out, offset = [], 0
    for n, (line, fenced) in enumerate(zip(text.split("\n"), _fenced(text))):
        if not fenced:
            out += [(n + 1, m.group()) for m in _ANY_COUNT.finditer(line)
                    if offset + m.start(1) not in known]
        offset += len(line) + 1
    return out


def follow_packages(text: str, md: Path) -> str:
    """`text` with every link to a module `x.py` that has become a package `x/` pointing at the
    package instead (its text too, when that is the file name): a split keeps its row."""
    def package(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        if target.endswith(".py") and not (md.parent / target).exists():
            folder = target[:-3] + "/"
            if (md.parent / folder).is_dir():
                name = target.rsplit("/", 1)[-1]
                return f"[{label.replace(name, name[:-3] + '/')}]({folder})"
        return m.group()
    return _LINK.sub(package, text)


def refresh(text: str, md: Path, root: Path = ROOT) -> str:
    """`text` with links to modules that became packages followed (`follow_packages`) and every
    stated count recomputed (paths that do not exist are left alone)."""
    text = follow_packages(text, md)
    out, last = [], 0
    for c in stated_counts(text):
        paths = c.targets(md, root)
        if not paths or not all(p.exists() for p in paths):
            continue
        out += [text[last:c.start], f"{sum(map(line_count, paths)):,}"]
        last = c.end
    return "".join(out) + text[last:]


def _slug(heading: str) -> str:
    """The #anchor GitHub gives a heading."""
    words = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return words.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    """The #anchors of a Markdown file's headings (duplicates numbered as GitHub does)."""
    seen: dict[str, int] = {}
    text = md.read_text(encoding="utf-8")
    fenced = _fenced(text)
    for n, line in enumerate(text.split("\n")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not fenced[n]:
            slug = _slug(_LINK.sub(lambda k: k.group(1), m.group(1)))
            seen[slug] = seen.get(slug, -1) + 1
    out = set()
    for slug, extra in seen.items():
        out.add(slug)
        out.update(f"{slug}-{i}" for i in range(1, extra + 1))
    return out


def problems(md: Path, root: Path = ROOT, tolerance: float = TOLERANCE) -> list[str]:
    """What is untrue in one Markdown file: counts off by more than `tolerance`, counts of
    nothing, unchecked "N lines", missing paths, broken relative links and anchors."""
    text = md.read_text(encoding="utf-8")
    name = md.relative_to(root)
    found = []
    for c in stated_counts(text):
        paths = c.targets(md, root)
        if not paths:
            found.append(f"{name}:{c.lineno}: a line count that names no path")
            continue
        if not all(p.exists() for p in paths):
            continue  # reported below, as a missing path or link target
        actual = sum(map(line_count, paths))
        if abs(c.stated - actual) > tolerance * actual:
            found.append(f"{name}:{c.lineno}: {', '.join(c.paths)} states {c.stated:,} lines, "
                         f"has {actual:,} (run python3 tools/readme_counts.py)")
    for lineno, words in unchecked_counts(text):
        found.append(f"{name}:{lineno}: '{words}' is not a checked count; write it as "
                     "`PATH` (N lines) or in a table's lines column")
    fenced = _fenced(text)
    for n, line in enumerate(text.split("\n")):
        if fenced[n]:
            continue
        for ticked in _TICKED.findall(line):
            for word in ticked.split():
                if (_REPO_PATH.match(word) and not (root / word).exists()
                        and "__pycache__" not in word):  # a folder made by running the code
                    found.append(f"{name}:{n + 1}: `{word}` does not exist")
        for _, target in _LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto: ...
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                found.append(f"{name}:{n + 1}: link target {target} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                found.append(f"{name}:{n + 1}: link {target}: no heading with that anchor")
    return found


def mapped_paths(root: Path = ROOT) -> list[Path]:
    """The paths the rows of the README's tables with a `lines` column count (its file map)."""
    md = root / "README.md"
    out = []
    for c in stated_counts(md.read_text(encoding="utf-8")):
        if c.row:
            out += c.targets(md, root)
    return out


def unmapped_modules(root: Path = ROOT) -> list[str]:
    """Modules of the package (every .py under omnicore/ but __init__.py) that no path of the
    README's file map names or contains."""
    mapped = mapped_paths(root)
    package = (root / "omnicore").resolve()
    out = []
    for p in sorted(package.rglob("*.py")):
        if p.name == "__init__.py" or "__pycache__" in p.parts:
            continue
        if not any(p == m or m in p.parents for m in mapped):
            out.append(f"omnicore/{p.relative_to(package)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; report, exit 1 if off")
    args = parser.parse_args(argv)
    found = []
    for md in markdown_files(ROOT):
        if not args.check:
            text = md.read_text(encoding="utf-8")
            new = refresh(text, md, ROOT)
            if new != text:
                md.write_text(new, encoding="utf-8")
                print(f"{md.relative_to(ROOT)}: counts rewritten")
        found += problems(md, ROOT)
    found += [f"README.md: {m} is not in the file map (add a row, or name its folder)"
              for m in unmapped_modules(ROOT)]
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
