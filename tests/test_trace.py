"""Trace files: a run round-trips through JSON; malformed or oversized files get a TraceError."""

from __future__ import annotations

import json

import pytest

from specfuse import EnsembleConfig, Trace, TraceError, dump_trace, load_trace, parse_trace, save_trace
from specfuse.engine import Ensemble
from specfuse.trace import MAX_TRACE_BYTES

from .scripted import ScriptedMember


@pytest.fixture
def trace():
    judge = lambda text: {"good ": 3.0, "<b>bold</b> ": 2.0, "猫。": 4.0}.get(text, 0.0)  # noqa: E731
    members = [
        ScriptedMember("a", ["<b>bold</b> "] * 9, judge),
        ScriptedMember("b", ["good "] * 7 + [("猫。", True)], judge),
        ScriptedMember("c", ["junk "] * 9, judge),
    ]
    config = EnsembleConfig(max_rounds=12, stop_strings=("STOP",))
    rounds = tuple(Ensemble(members, config).stream("prompt ✓"))
    return Trace("prompt ✓", ("a", "b", "c"), config, rounds)


def test_a_trace_round_trips_exactly(trace, tmp_path):
    path = save_trace(trace, tmp_path / "run.json")
    back = load_trace(path)
    assert back == trace
    assert back.result == trace.result and back.result.answer.endswith("猫。")
    assert any(r.exits for r in back.rounds)


def mutate(trace, edit):
    doc = json.loads(dump_trace(trace))
    edit(doc)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema="other"), "not a specfuse trace"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d.pop("rounds"), "missing 'rounds'"),
        (lambda d: d["rounds"][0].update(chosen=7), "not a candidate index"),
        (lambda d: d["rounds"][0]["scores"].pop(), "expected 3 rows"),
        (lambda d: d["rounds"][0]["candidates"][0].update(text=5), "expected str"),
        (lambda d: d["rounds"][0].update(stop_reason="bored"), "not one of"),
        (lambda d: d["rounds"][1].update(text="tampered"), "concatenation"),
        (lambda d: d["config"].update(segment_len=0), "config is invalid"),
        (lambda d: d["rounds"][0].update(weights_after=[1, 2]), "expected 3 values"),
    ],
)
def test_malformed_traces_get_a_clear_error(trace, edit, message):
    with pytest.raises(TraceError, match=message):
        parse_trace(mutate(trace, edit))


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"schema": "specfuse.trace"}', "[" * 100_000])
def test_garbage_is_refused_not_crashed(text):
    with pytest.raises(TraceError):
        parse_trace(text)


def test_oversized_and_missing_files_are_refused(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_TRACE_BYTES + 1))
    with pytest.raises(TraceError, match="limit"):
        load_trace(big)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.json")
