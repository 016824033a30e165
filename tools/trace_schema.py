"""The trace format as a JSON Schema (docs/trace.schema.json), and trace files checked against it.

    python tools/trace_schema.py              # is docs/trace.schema.json current? (exit 1 if not)
    python tools/trace_schema.py --write      # write it again after a record or setting changed
    python tools/trace_schema.py FILE...      # check trace files (exit 1, naming each bad one)

Both come from the one declaration the reader validates with (specfuse.trace.TraceDocument, its
types the record dataclasses'): the schema describes documents of the current version
(specfuse.trace.VERSION) as written now, every key, type and nesting, no key beyond them. A file
is checked as the reader reads it: an older version in the form the reader upgrades it to, without
the settings that are no longer a run's (e.g. `parallel`). The checks across fields (matrix
shapes, a winner among the candidates, ...) are the reader's alone: load_trace makes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from specfuse.errors import TraceError
from specfuse.trace import document_adapter, json_schema, read_document

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "trace.schema.json"


def schema_text() -> str:
    return json.dumps(json_schema(), indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def check(text: str) -> None:
    """Raise ValueError saying what is wrong where `text` is not a trace document of this format
    (pydantic's own words: each place, as `rounds.0.k`, and what is wrong there)."""
    try:
        document_adapter().validate_python(read_document(text))
    except (TraceError, ValidationError) as e:
        raise ValueError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="trace files to check")
    parser.add_argument("--write", action="store_true", help=f"write {SCHEMA_FILE.name} again")
    args = parser.parse_args(argv)
    if args.write:
        SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
        print(f"wrote {SCHEMA_FILE}")
        return 0
    if not args.files:
        current = SCHEMA_FILE.exists() and SCHEMA_FILE.read_text(encoding="utf-8") == schema_text()
        print(f"{SCHEMA_FILE.name} is {'current' if current else 'out of date: run with --write'}")
        return 0 if current else 1
    bad = 0
    for path in args.files:
        try:
            check(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            bad += 1
            print(f"{path}: {e}", file=sys.stderr)
    print(f"{len(args.files) - bad} of {len(args.files)} traces match {SCHEMA_FILE.name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
