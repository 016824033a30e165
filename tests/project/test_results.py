"""results/: the measured output that the docs cite, and nothing else (issue 42, item 4; issue 57,
item 4: one naming scheme, a size bound).

- It holds no code: benchmark and evaluation code lives in specfuse/bench/ and specfuse/eval/,
  one-off measuring scripts in tools/.
- Its files follow results/README.md's scheme: `bench/<benchmark>[-<setup>].<ext>`,
  `eval/<task>[-<study>].<ext>` and `eval/<task>-<study>-cases/` or `eval/mc40-lm-eval/` folders.
- It stays small: ≤ 6 MB and ≤ 35 % of the tracked bytes. Older figures live in git history and
  are named there as `<commit>:results/<path>` (what `git show` takes), which this test leaves alone.
- Every file in it is linked: its path, or a folder above it, is named in a doc (README.md,
  CONTRIBUTING.md, docs/), a test, a tool or the code (`results/x.json`, `../results/x.json`,
  `results/x-cases/`, `results/x.{txt,json}`, `results/x.*`), or a linked results page (.md, .html)
  links or names it. A file nothing links is output nobody reads: delete it, or cite it where its
  figures are discussed. Name a results file by its path in one string (`ROOT / "results/x.json"`),
  so that this test sees it.
- Every relative link from the docs into results/, and every results file that a doc, a test, a
  tool or the code names with its extension, exists.

Pure text: reads files, imports nothing of the package.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

from ..links import EXTERNAL, PAGES, targets

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
DOCS = [*PAGES, ROOT / "CONTRIBUTING.md"]
SKIP = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}

# The scheme (results/README.md): the first word of a name says which benchmark or task wrote it.
BENCHMARKS = ("bench", "concurrency", "cpu", "draft", "equality", "followup", "gpu", "llama", "remote")
BENCHMARKS += ("serve", "throughput", "verify")
TASKS = ("gsm8k", "ifeval", "open", "mc40")
WORD = r"[a-z0-9][a-z0-9.+]*"  # lower case; `.` and `+` only as in a version or a mix
FILE = rf"(?:-{WORD})*\.(?:md|json|jsonl|txt|png)"
SCHEME = re.compile(
    rf"README\.md|bench/(?:{'|'.join(BENCHMARKS)}){FILE}|eval/(?:{'|'.join(TASKS)}){FILE}"
    rf"|eval/(?:{'|'.join(TASKS)})(?:-{WORD})*-(?:cases|lm-eval)/.+"
)
LIMIT_BYTES, LIMIT_SHARE = 6_000_000, 0.35

# `results/…` not inside another path (`x/results/…` is not ours) nor in git history
# (`abc1234:results/…`, a file that results/ no longer holds); a `{a,b}` group may hold commas.
NAMED = re.compile(r"(?<![\w./:-])(?:\.\./)*results/((?:[^\s`'\"()\[\]<>;|:,{}]|\{[^{}\s]*\})+)")
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


def test_every_link_and_named_file_into_results_exists():
    files = _results()
    broken = []
    for place in _places():  # named with an extension by a doc, a test, a tool or the code
        for name in named(_read(place)):
            if Path(name).suffix and not matches(name, files):  # a command's output stem is not a file
                broken.append(f"{place.relative_to(ROOT)}: results/{name}")
    for page in DOCS:
        text = _read(page)
        for target in targets(text):
            path = target.partition("#")[0]
            if target.startswith(EXTERNAL) or not path:
                continue
            file = (page.parent / path).resolve()
            if file.is_relative_to(RESULTS.resolve()) and not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links or names into results/ that lead nowhere: " + "; ".join(broken)


def test_the_rule_reads_braces_globs_folders_and_pages():
    text = "see `results/a.{txt,json}`, results/b.* and [c](../results/c-cases/). Also results/…"
    assert named(text) == ["a.txt", "a.json", "b.*", "c-cases"]
    files = ["a.txt", "a.json", "b.png", "c-cases/x/1.json", "d.json"]
    assert set().union(*(matches(n, files) for n in named(text))) == set(files) - {"d.json"}
    assert named("x/results/e.json and specfuse/results/f.json") == []
    assert named("`git show 7407b66:results/RESULTS-gsm8k.png`") == []  # in history, not the tree


def test_every_results_file_follows_the_naming_scheme():
    files = _results()
    off = [f for f in files if not SCHEME.fullmatch(f)]
    assert not off, f"{len(off)} files in results/ outside results/README.md's scheme: {off[:20]}"
    assert SCHEME.fullmatch("bench/serve-profile-avx2-gguf.txt") and SCHEME.fullmatch("eval/gsm8k.json")
    assert SCHEME.fullmatch("eval/gsm8k-cases/guarded/right_best_wrong/single-q-gsm8k-0049.json")
    for bad in ("RESULTS-gsm8k.json", "IF-qwen.json", "bench/Serve.txt", "eval/serve-cpu.txt", "x.json"):
        assert not SCHEME.fullmatch(bad), bad


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # no git here (an unpacked archive): the tree
        return [
            p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts and not SKIP & set(p.parts)
        ]
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def test_results_stay_under_6_mb_and_35_percent_of_the_tracked_bytes():
    sizes = {p: p.stat().st_size for p in _tracked()}
    total = sum(sizes.values())
    ours = sum(size for p, size in sizes.items() if p.is_relative_to(RESULTS))
    assert ours > 0 and total > ours
    assert ours <= LIMIT_BYTES, f"results/ holds {ours:,} bytes (at most {LIMIT_BYTES:,}): keep a summary"
    assert ours <= LIMIT_SHARE * total, (
        f"results/ is {ours / total:.0%} of the tracked bytes (at most {LIMIT_SHARE:.0%}): move raw dumps "
        "to git history and cite them there (results/README.md)"
    )
