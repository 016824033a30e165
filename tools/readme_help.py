"""Paste `specfuse --help` into docs/cli.md between its markers (--write), or check it is current.

The CLI reference's help block is generated, never typed: tests/project/test_cli.py runs the check, and
`make readme-help` runs --write. (The name is older than docs/: the block used to live in the README.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse.cli import build_parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "cli.md"
BEGIN, END = "<!-- specfuse --help: begin -->", "<!-- specfuse --help: end -->"


def block() -> str:
    return f"{BEGIN}\n```text\n{build_parser().format_help().rstrip()}\n```\n{END}"


def current(text: str) -> str:
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    return text[start:stop]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite {TARGET.relative_to(ROOT)} in place")
    args = parser.parse_args()
    name = TARGET.relative_to(ROOT)
    text = TARGET.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        print(f"{name} lacks the markers {BEGIN} … {END}", file=sys.stderr)
        return 1
    if args.write:
        TARGET.write_text(text.replace(current(text), block()), encoding="utf-8")
        return 0
    if current(text) != block():
        print(f"{name}'s CLI help is stale: run `make readme-help`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
