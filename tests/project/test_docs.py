"""The documentation: the README stays a short front page, and every relative link in it and in
docs/*.md leads to a file that exists (and, for a heading anchor in a Markdown page, to that heading).

Pure text: reads the Markdown files, imports nothing of the package.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..links import DOCS, EXTERNAL, PAGES, README, ROOT, slugs, targets


def test_the_link_finder_finds_links_and_skips_code():
    text = (
        'See [a](docs/a.md#x) and ![img](assets/p.png "t"), [web](https://x.org), [m](mailto:a@b).\n'
        "`[not](a link)` and\n```\n[nor](this.md)\n```\n[ref]: <other file.md>\n"
    )
    assert targets(text) == ["docs/a.md#x", "assets/p.png", "https://x.org", "mailto:a@b", "other file.md"]
    assert slugs("# The app\n## What if another candidate had won?\n## The app\n") == {
        "the-app",
        "what-if-another-candidate-had-won",
        "the-app-1",
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in targets(text):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_a_short_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"
    assert lines[0] == "---" and "app_file: app.py" in lines and "sdk: gradio" in lines  # the Space's card


def test_docs_has_its_pages_and_the_readme_links_each():
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert len(pages) >= 5, pages
    linked = {Path(t.partition("#")[0]).name for t in targets(README.read_text(encoding="utf-8"))}
    assert not set(pages) - linked, f"docs pages the README does not link: {sorted(set(pages) - linked)}"


def test_the_readme_layout_lists_every_module():
    text = README.read_text(encoding="utf-8")
    tree = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed, stack = set(), []
    for line in tree.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        stack[depth:] = [name]
        listed.add("".join(stack))
    modules = {str(p.relative_to(ROOT)) for pkg in ("specfuse", "studio") for p in (ROOT / pkg).rglob("*.py")}
    missing = sorted(m for m in modules if m not in listed)
    assert not missing, f"modules missing from the README's layout: {missing}"


def test_the_docs_print_the_one_key_map():
    """docs/app.md holds the key map exactly as specfuse.handout.keys prints it (issue 53): the app's
    keys, the handout's and the docs' are one table."""
    from specfuse.handout.keys import markdown

    assert markdown() in (ROOT / "docs" / "app.md").read_text(encoding="utf-8")
