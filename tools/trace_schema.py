"""The trace format as a JSON Schema (docs/trace.schema.json), generated with pydantic from the record
dataclasses the trace is written from (specfuse/trace.py, specfuse/records.py), and trace files
checked against the same declaration.

    python tools/trace_schema.py              # is docs/trace.schema.json current? (exit 1 if not)
    python tools/trace_schema.py --write      # write it again after a record or setting changed
    python tools/trace_schema.py FILE...      # check trace files (exit 1, naming each bad one)

The schema describes documents of the current version (specfuse.trace.VERSION) as written now: every
key, type and nesting, no key beyond them. A version-1 file is checked in the form the reader upgrades
it to, and a setting earlier builds stored but that is no longer a run's is left out (as the reader does).
The checks across fields (matrix shapes, a winner among the candidates, ...) are the reader's.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError

from specfuse.config import RETIRED_KEYS
from specfuse.errors import TraceError
from specfuse.records import Result
from specfuse.trace import SCHEMA, VERSION, Trace, dump_trace, parse_trace

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "trace.schema.json"

# A trace document: the format's name and version, the run's result, then Trace's own fields (their
# types come from the dataclass, so a field added there is in the schema at the next --write).
TraceDocument = dataclasses.make_dataclass(
    "TraceDocument",
    [
        ("schema", Literal[SCHEMA]),  # type: ignore[valid-type]
        ("version", Literal[VERSION]),  # type: ignore[valid-type]
        ("result", Result | None),
        *typing.get_type_hints(Trace).items(),
    ],
    # Strict types, no key beyond the declared ones: the nested records take the same config.
    namespace={"__pydantic_config__": ConfigDict(extra="forbid", strict=True)},
)


@functools.cache
def adapter() -> TypeAdapter[Any]:  # built once: checking a folder of traces reuses it
    return TypeAdapter(TraceDocument)


def schema() -> dict[str, Any]:
    doc = adapter().json_schema(mode="validation")
    doc["title"] = f"specfuse trace, version {VERSION}"
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return doc


def schema_text() -> str:
    return json.dumps(schema(), indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def check(text: str) -> None:
    """Raise ValueError saying what is wrong where `text` is not a trace document of this format.

    An older version is checked as the reader upgrades it; a setting that is no longer a run's
    (config.RETIRED_KEYS, e.g. `parallel`) is left out of the config, as the reader leaves it out."""
    try:
        doc = json.loads(text)
        if doc.get("version") != VERSION:
            doc = json.loads(dump_trace(parse_trace(text)))
        config = doc.get("config")
        if isinstance(config, dict):
            doc["config"] = {k: v for k, v in config.items() if k not in RETIRED_KEYS}
        adapter().validate_json(json.dumps(doc))
    except (TraceError, ValidationError, ValueError, AttributeError) as e:
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
