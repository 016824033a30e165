"""`specfuse export TRACE.json --html OUT.html --png OUT.png --round K`: a saved run to take home.

Reads a trace (load_trace: a bad one is refused with its reason) and writes the offline HTML page
(trace_html), one round as a PNG slide (round_png), or both. Exit status 2 with a one-line reason
for anything the user can fix; nothing is written unless everything asked for can be made.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ..errors import ConfigError, SpecfuseError
from ..trace import load_trace
from .html import trace_html
from .i18n import ENGLISH, LANGS
from .png import round_png

HELP_WIDTH = 100  # as specfuse's own --help: the same in every terminal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specfuse export",
        description="A saved run to take home: one HTML file that steps through it round by round "
        "(offline, from disk, no server; it loads nothing), and any round as a 1920x1080 PNG for a slide.",
        epilog="Examples: specfuse export run.json --html run.html; specfuse export run.json --png "
        "round5.png --round 5. The trace is any file written by `specfuse --trace`, the app's "
        "download or the API. Exit status 2 means bad input; the reason is printed.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH, max_help_position=32),
    )
    add = parser.add_argument
    add("trace", metavar="TRACE.json", help="the run: a trace file (JSON)")
    add(
        "--html",
        metavar="OUT.html",
        help="write the run as one self-contained page: prompt, the answer as it grew, each round's "
        "candidates, verification matrix, weights and exits; Next/Back/Play, keys → ← space",
    )
    add("--png", metavar="OUT.png", help="write one round's panels as a 1920x1080 PNG (see --round)")
    add("--round", type=int, metavar="K", help="the round --png draws, from 1 (default: the last)")
    add(
        "--title",
        metavar="TEXT",
        help="the page's heading (default: 'SpecFuse run: ' and the prompt's first line)",
    )
    add(
        "--lang",
        choices=sorted(LANGS),
        default=ENGLISH,
        help="the page's language when it opens (its switch shows the others): "
        + ", ".join(f"{code} ({name})" for code, name in LANGS.items()),
    )
    add(
        "--font",
        metavar="FILE",
        help="a TrueType font for --png (e.g. DejaVuSans.ttf); Pillow's built-in one draws ASCII only, "
        "other characters as empty boxes",
    )
    return parser


def main(
    argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.html is None and args.png is None:
        parser.error("nothing to write: give --html OUT.html, --png OUT.png or both")
    if args.round is not None and args.png is None:
        parser.error("--round K picks the round that --png draws: add --png OUT.png")
    try:
        return _export(args, out)
    except SpecfuseError as e:
        print(f"specfuse export: error: {e}", file=err)
        return 2


def _export(args: argparse.Namespace, out: TextIO) -> int:
    trace = load_trace(args.trace)
    n = len(trace.rounds)
    k = n if args.round is None else args.round
    if not 1 <= k <= n:
        raise ConfigError(f"--round {k}: the trace has rounds 1 to {n}")
    targets = [
        (flag, path) for flag, path in (("--html", args.html), ("--png", args.png)) if path is not None
    ]
    for flag, path in targets:
        _check_target(flag, path)
    made: list[tuple[str, bytes, str]] = []  # everything is made before anything is written
    if args.html is not None:
        page = trace_html(trace, title=args.title, lang=args.lang).encode("utf-8")
        made.append((args.html, page, f"the run's {n} rounds, to open in any browser"))
    if args.png is not None:
        made.append((args.png, round_png(trace, k, font=args.font), f"round {k} of {n}, 1920x1080"))
    for path, content, what in made:
        _write(Path(path).expanduser(), content)
        print(f"wrote {path} ({len(content):,} bytes): {what}", file=out)
    return 0


def _check_target(flag: str, path: str) -> None:
    if not path.strip():
        raise ConfigError(f"{flag} is empty; give a file name")
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"{flag} {path!r} is a folder; give a file name")
    if not target.parent.is_dir():
        raise ConfigError(
            f"{flag} {path!r}: the folder {str(target.parent)!r} does not exist; create it first"
        )


def _write(path: Path, content: bytes) -> None:
    """Atomically: a failure halfway never leaves half a file under the final name."""
    tmp = path.with_name(path.name + ".part")
    try:
        tmp.write_bytes(content)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SpecfuseError(f"cannot write {str(path)!r}: {e.strerror or e}") from e
