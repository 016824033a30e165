"""results/: the measured output that the docs cite, and nothing else (issue 42, item 4).

- It holds no code: benchmark and evaluation code lives in specfuse/bench/ and specfuse/eval/,
  one-off measuring scripts in tools/.
- Every file in it is linked: its path, or a folder above it, is named in a doc (README.md,
  CONTRIBUTING.md, docs/), a test, a tool or the code (`results/x.json`, `../results/x.json`,
  `results/x-cases/`, `results/x.{txt,json}`, `results/x.*`), or a linked results page (.md, .html)
  links or names it. A file nothing links is output nobody reads: delete it, or cite it where its
  figures are discussed. Name a results file by its path in one string (`ROOT / "results/x.json"`),
  so that this test sees it.
- Every relative link from the docs into results/, and every results file they name with its
  extension, exists.

Pure text: reads files, imports nothing of the package.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from .links import EXTERNAL, PAGES, targets

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
DOCS = [*PAGES, ROOT / "CONTRIBUTING.md"]
SKIP = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}

# `results/…` not inside another path (`x/results/…` is not ours); a `{a,b}` group may hold commas.
NAMED = re.compile(r"(?<![\w./-])(?:\.\./)*results/((?:[^\s`'\"()\[\]<>;|:,{}]|\{[^{}\s]*\})+)")
LINKED = re.compile(r"\]\(\s*<?([^)\s>]+)>?|\b(?:href|src)=\"([^\"]+)\"", re.IGNORECASE)


def _places() -> list[Path]:
    """Where a results file may be linked from: the docs, the tests, the tools and the code."""
    files = [*DOCS, ROOT / "Makefile", ROOT / "pyproject.toml", *ROOT.glob("*.py")]
    for folder in ("docs", "tests", "tools", "specfuse", "studio"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and not SKIP & set(p.parts)]
    return sorted(set(files) - {Path(__file__).resolve()})


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""


def _results() -> list[str]:
    return sorted(
        p.relative_to(RESULTS).as_posix()
        for p in RESULTS.rglob("*")
        if p.is_file() and not SKIP & set(p.relative_to(RESULTS).parts)
    )


def _expand(pattern: str) -> list[str]:
    """`a.{txt,json}` → `a.txt`, `a.json` (shell braces, as the docs write a file's twins)."""
    group = re.search(r"\{([^{}]*)\}", pattern)
    if not group:
        return [pattern]
    head, tail = pattern[: group.start()], pattern[group.end() :]
    return [p for alt in group.group(1).split(",") for p in _expand(head + alt + tail)]


def named(text: str) -> list[str]:
    """The results paths a text names, relative to results/, braces expanded (globs kept)."""
    found = []
    for match in NAMED.finditer(text):
        name = match.group(1).rstrip(".…/")
        if name:
            found += _expand(name)
    return found


def matches(name: str, files: list[str]) -> set[str]:
    """The files a named path stands for: itself, a glob's matches, or everything under a folder."""
    return {f for f in files if fnmatch.fnmatchcase(f, name) or f.startswith(name + "/")}


def linked_files(files: list[str]) -> set[str]:
    linked: set[str] = set()
    for place in _places():
        for name in named(_read(place)):
            linked |= matches(name, files)
    pages = [f for f in linked if f.endswith((".md", ".html"))]
    while pages:  # a linked results page passes its links on
        page = pages.pop()
        text = _read(RESULTS / page)
        found = set()
        for name in named(text):
            found |= matches(name, files)
        for match in LINKED.finditer(text):
            target = (match.group(1) or match.group(2)).partition("#")[0]
            if target and not target.startswith(EXTERNAL):
                path = (RESULTS / page).parent / target
                try:
                    found.add(path.resolve().relative_to(RESULTS.resolve()).as_posix())
                except ValueError:  # a link out of results/
                    continue
        new = (found & set(files)) - linked
        linked |= new
        pages += [f for f in new if f.endswith((".md", ".html"))]
    return linked


def test_results_hold_no_code():
    code = [f for f in _results() if f.endswith((".py", ".sh", ".ipynb"))]
    assert not code, f"code in results/ (move it to tools/ or specfuse/bench/): {code}"


def test_every_results_file_is_linked_from_a_doc_a_test_a_tool_or_the_code():
    files = _results()
    assert len(files) >= 100, len(files)  # the rule below must have something to judge
    unlinked = sorted(set(files) - linked_files(files))
    assert not unlinked, (
        f"{len(unlinked)} files in results/ that no doc, test, tool, code or linked results page names "
        f"(cite each where its figures are discussed, or delete it): {unlinked[:20]}"
    )


def test_every_link_and_named_file_from_the_docs_into_results_exists():
    files = _results()
    broken = []
    for page in DOCS:
        text = _read(page)
        for target in targets(text):
            path = target.partition("#")[0]
            if target.startswith(EXTERNAL) or not path:
                continue
            file = (page.parent / path).resolve()
            if file.is_relative_to(RESULTS.resolve()) and not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
        for name in named(text):
            if Path(name).suffix and not matches(name, files):  # a command's output stem is not a file
                broken.append(f"{page.relative_to(ROOT)}: results/{name}")
    assert not broken, "links or names into results/ that lead nowhere: " + "; ".join(broken)


def test_the_rule_reads_braces_globs_folders_and_pages():
    text = "see `results/a.{txt,json}`, results/b.* and [c](../results/c-cases/). Also results/…"
    assert named(text) == ["a.txt", "a.json", "b.*", "c-cases"]
    files = ["a.txt", "a.json", "b.png", "c-cases/x/1.json", "d.json"]
    assert set().union(*(matches(n, files) for n in named(text))) == set(files) - {"d.json"}
    assert named("x/results/e.json and specfuse/results/f.json") == []
