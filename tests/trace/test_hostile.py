"""Hostile input as a habit (issue 24): property-based tests (Hypothesis) of the trace loader, the
settings validation, a request's limits and the CLI's argument checks. Any input gives a result or
one clear error of the project's own kind, never another exception, a traceback or a hang."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfuse.cli import main
from specfuse.config import EnsembleConfig
from specfuse.errors import ConfigError, TraceError
from specfuse.limits import check_request
from specfuse.records import TokenScores
from specfuse.trace import Trace, dump_trace, load_trace, parse_trace

from ..builders import hand_round

# No example database on disk (the suite leaves nothing behind); no per-example deadline (the first
# CLI example imports torch).
HOSTILE = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)
# What an API body or a hand-edited file may put where a setting goes.
VALUES = st.one_of(
    JSON,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(
        [10**400, -(10**400), float("nan"), float("inf"), "", " ", "1e999", "\ud800", "x" * 5000]
    ),
    st.tuples(JSON, JSON),
    st.lists(st.floats(), max_size=4).map(tuple),
)
NAMES = [f.name for f in fields(EnsembleConfig)]


def valid_document() -> dict[str, Any]:
    scores = (TokenScores(("a",), (1.0,), (-0.5,)), TokenScores(("b",), (0.5,), (-1.0,)))
    rounds = (
        hand_round(1, token_scores=(scores, scores)),
        hand_round(2, before="a1 ", stop_reason="final", token_scores=(scores, scores)),
    )
    return json.loads(dump_trace(Trace("go", ("a", "b"), EnsembleConfig(), rounds)))


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON document: keys of objects, indices of lists."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


def replaced(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    if delete and not rest:
        del copy[head]
    else:
        copy[head] = replaced(doc[head], rest, value, delete)
    return copy


def read_or_refuse(text: str | bytes) -> None:
    try:
        trace = parse_trace(text)
    except TraceError as e:
        assert str(e) and "\n" not in str(e).strip()  # one line
        return
    assert trace.result.rounds == len(trace.rounds)  # what it accepts, the views can summarize


VALID = valid_document()
PLACES = paths(VALID)


def test_the_document_these_properties_mutate_is_valid():
    assert parse_trace(json.dumps(VALID)).rounds[-1].stop_reason == "final"


@HOSTILE
@given(st.text(max_size=300))
def test_any_text_is_a_trace_or_a_trace_error(text):
    read_or_refuse(text)


@HOSTILE
@given(st.binary(max_size=300))
def test_any_bytes_are_a_trace_or_a_trace_error(data):
    read_or_refuse(data)


@HOSTILE
@given(JSON)
def test_any_json_document_is_a_trace_or_a_trace_error(doc):
    read_or_refuse(json.dumps(doc))


@settings(HOSTILE, max_examples=400)
@given(st.sampled_from(PLACES), VALUES, st.booleans())
def test_a_valid_trace_with_any_one_value_replaced_is_a_trace_or_a_trace_error(place, value, delete):
    read_or_refuse(json.dumps(replaced(VALID, place, value, delete and bool(place))))


@HOSTILE
@given(st.binary(max_size=200))
def test_any_file_is_a_trace_or_a_trace_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("upload") / "t.json"
    path.write_bytes(data)
    with pytest.raises(TraceError):
        load_trace(path)


@HOSTILE
@given(st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=4))
def test_any_settings_are_a_config_or_a_config_error_that_names_the_setting(values):
    try:
        config = EnsembleConfig(**values)
    except ConfigError as e:
        message = str(e)
        assert any(name in message for name in values), message
        assert len(message) < 400, message  # a hostile value is shown cut short
        return
    assert EnsembleConfig.from_dict(config.to_dict()) == config  # what it accepts, a trace keeps


@HOSTILE
@given(st.dictionaries(st.text(max_size=20), JSON, max_size=4))
def test_any_stored_config_is_a_config_or_a_config_error(data):
    with contextlib.suppress(ConfigError):  # anything else fails the test
        EnsembleConfig.from_dict(data)


@HOSTILE
@given(st.text(max_size=50), st.none() | st.text(max_size=50), st.integers(min_value=1, max_value=256))
def test_any_prompt_and_segment_pass_the_limits_or_are_refused_by_name(prompt, forced, segment_len):
    try:
        check_request(prompt, EnsembleConfig(segment_len=segment_len), forced=forced)
    except ConfigError as e:
        assert str(e).startswith(("the prompt", "the forced segment")), str(e)


FLAGS = [
    "--segment-len",
    "--max-new-tokens",
    "--max-rounds",
    "--temperature",
    "--top-p",
    "--seed",
    "--score",
    "--normalization",
    "--stop",
    "--initial-weights",
    "--exit-threshold",
    "--exit-min-active",
    "--parallel",
    "--feedback",
    "--no-exit",
    "--device",
    "--dtype",
    "--quiet",
]
ARGUMENT = st.one_of(
    st.sampled_from(FLAGS),
    st.text(max_size=12).filter(lambda a: a != "-"),  # "-" reads standard input
    st.sampled_from(["0", "-1", "1e999", "nan", "none", "None", "256", "257", "0.5", "", " ", "\ud800"]),
)


@settings(HOSTILE, max_examples=100)
@given(st.lists(ARGUMENT, max_size=8))
def test_any_command_line_ends_with_a_status_and_at_most_a_usage_and_a_reason(argv):
    """Every run ends before loading: the last --models names no model (refused first of all work)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # argparse writes to sys's
        try:
            status = main([*argv, "--models", "no-such-model"], stdout=out, stderr=err)
        except SystemExit as e:  # argparse: usage and one line, status 2 (--help: 0)
            status = e.code
    assert status in (0, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()
    if status == 2:
        lines = err.getvalue().strip().split("\n")  # not splitlines(): an argument may hold U+0085
        assert lines and lines[-1].startswith("specfuse: error: "), err.getvalue()
