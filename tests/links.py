"""The documentation's pages and the links in them, read as GitHub renders Markdown: shared by
project/test_docs.py (every link resolves) and project/test_results.py (every results file is
linked). Pure text."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]+)\"", re.IGNORECASE)
EXTERNAL = ("http://", "https://", "mailto:", "ftp://", "data:")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def targets(text: str) -> list[str]:
    body = prose(text)
    found = [m.group(1) for m in INLINE_LINK.finditer(body)]
    found += [m.group(1) for m in REFERENCE_LINK.finditer(body)]
    found += [m.group(1) for m in HTML_LINK.finditer(body)]
    return [t[1:-1] if t.startswith("<") and t.endswith(">") else t for t in found]


def slugs(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"[`*_]|!?\[([^\]]*)\]\([^)]*\)", lambda g: g.group(1) or "", m.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out
