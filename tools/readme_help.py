"""Paste `specfuse --help` into README.md between its markers (--write), or check it is current.

The README's CLI section is generated, never typed: tests/test_cli.py runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse.cli import build_parser  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- specfuse --help: begin -->", "<!-- specfuse --help: end -->"


def block() -> str:
    return f"{BEGIN}\n```text\n{build_parser().format_help().rstrip()}\n```\n{END}"


def current(text: str) -> str:
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    return text[start:stop]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite README.md in place")
    args = parser.parse_args()
    text = README.read_text(encoding="utf-8")
    if args.write:
        README.write_text(text.replace(current(text), block()), encoding="utf-8")
        return 0
    if current(text) != block():
        print("README.md's CLI help is stale: run `make readme-help`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
