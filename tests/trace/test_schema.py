"""docs/trace.schema.json: generated from the declaration the reader validates with (specfuse.trace,
types from the record dataclasses; tools/trace_schema.py), current, and matched by every trace the
repository ships, each of which loads and replays its stored result; a document that strays from it is
named and refused, by the checker and the reader alike."""

from __future__ import annotations

import dataclasses
import json

import pytest

from specfuse.config import EnsembleConfig
from specfuse.errors import TraceError
from specfuse.trace import SCHEMA, VERSION, dump_trace, load_trace, parse_trace

from ..repo_tools import TOOLS, load_tool

ROOT = TOOLS.parent

trace_schema = load_tool("trace_schema")


def _shipped_traces() -> list:
    skip = {".venv", ".git", "node_modules"}
    traces = []
    for path in sorted(ROOT.rglob("*.json")):
        if skip & set(path.relative_to(ROOT).parts):
            continue
        doc = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
            traces.append(path)
    return traces


def test_the_schema_file_is_current_and_names_every_setting():
    assert trace_schema.main([]) == 0, "run: python tools/trace_schema.py --write"
    schema = json.loads(trace_schema.SCHEMA_FILE.read_text(encoding="utf-8"))
    assert schema["title"] == f"specfuse trace, version {VERSION}"
    assert {"schema", "version", "prompt", "members", "config", "rounds"} <= set(schema["required"])
    config = schema["$defs"]["EnsembleConfig"]["properties"]
    assert set(config) == set(EnsembleConfig.__dataclass_fields__) and "parallel" not in config
    assert schema["$defs"]["Round"]["additionalProperties"] is False


def test_every_shipped_trace_matches_the_schema():
    traces = _shipped_traces()
    assert len(traces) >= 30  # the app's shipped study (24 cases), the assets, the lessons, the test data
    assert trace_schema.main([str(p) for p in traces]) == 0


def test_a_trace_that_strays_from_the_schema_is_named(tmp_path, capsys):
    good = json.loads(dump_trace(load_trace(_shipped_traces()[0])))
    strays = {
        "extra.json": lambda d: d["rounds"][0].update(bogus=1),
        "type.json": lambda d: d["rounds"][0].update(k="1"),
        "missing.json": lambda d: d.pop("members"),
        "version.json": lambda d: d.update(version=VERSION + 1),
    }
    for name, stray in strays.items():
        doc = json.loads(json.dumps(good))
        stray(doc)
        (tmp_path / name).write_text(json.dumps(doc), encoding="utf-8")
    (tmp_path / "good.json").write_text(json.dumps(good), encoding="utf-8")
    files = sorted(str(p) for p in tmp_path.iterdir())
    assert trace_schema.main(files) == 1
    out = capsys.readouterr()
    assert "1 of 5 traces match" in out.out
    for name, where in [("extra", "rounds.0.bogus"), ("type", "rounds.0.k"), ("missing", "members")]:
        assert any(line.startswith(str(tmp_path / f"{name}.json")) for line in out.err.splitlines())
        assert where in out.err
    with pytest.raises(ValueError, match="version"):
        trace_schema.check(json.dumps({**good, "version": VERSION + 1}))


def test_every_shipped_trace_loads_and_replays_to_its_stored_result():
    for path in _shipped_traces():
        trace = load_trace(path)
        stored = json.loads(path.read_text(encoding="utf-8"))["result"]
        assert json.loads(json.dumps(dataclasses.asdict(trace.result))) == stored, path


def test_the_reader_and_the_schema_are_one_declaration():
    """A field a version-2 document must carry although its record has a default: the schema
    requires it, the checker and the reader refuse a document without it."""
    schema = json.loads(trace_schema.SCHEMA_FILE.read_text(encoding="utf-8"))
    assert {"eligible", "token_scores"} <= set(schema["$defs"]["Round"]["required"])
    doc = json.loads(dump_trace(load_trace(_shipped_traces()[0])))
    del doc["rounds"][0]["eligible"]
    with pytest.raises(ValueError, match="rounds.0.eligible"):
        trace_schema.check(json.dumps(doc))
    with pytest.raises(TraceError, match=r"trace.rounds\[0\]: missing 'eligible'"):
        parse_trace(json.dumps(doc))
