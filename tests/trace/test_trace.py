"""Trace files: a run round-trips through JSON (version 3, with id, branch and token scores; a
conversation's messages: tests/trace/test_conversations.py); version-1 files still load; malformed or
oversized files get a specific TraceError."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from specfuse import EnsembleConfig, Trace, TraceError, dump_trace, load_trace, parse_trace, save_trace
from specfuse import trace as trace_module
from specfuse.engine import Ensemble
from specfuse.records import ROUND_STOP_REASONS, STOP_REASONS, Branch, Round, TokenScores, summarize
from specfuse.trace import MAX_KEYS, MAX_TRACE_BYTES, VERSION

from ..builders import hand_round, hand_run
from ..scripted import ScriptedMember

DATA = Path(__file__).resolve().parents[1] / "data"
RUN = Path(__file__).resolve().parents[2] / "specfuse" / "engine" / "run.py"  # where a run says why it ends


def with_token_scores(r):
    """Token evidence on every (verifier, candidate) pair, as a member that keeps it would give."""
    rows = tuple(
        tuple(
            TokenScores(("to", "k✓"), (1.5, -2.0 + i), (-0.5, -1.25 - j)) for j, _ in enumerate(r.candidates)
        )
        for i, _ in enumerate(r.verifiers)
    )
    return dataclasses.replace(r, token_scores=rows)


@pytest.fixture
def trace():
    judge = lambda text: {"good ": 3.0, "<b>bold</b> ": 2.0, "猫。": 4.0}.get(text, 0.0)  # noqa: E731
    members = [
        ScriptedMember("a", ["<b>bold</b> "] * 9, judge),
        ScriptedMember("b", ["good "] * 7 + [("猫。", True)], judge),
        ScriptedMember("c", ["junk "] * 9, judge),
    ]
    config = EnsembleConfig(max_rounds=12, stop_strings=("STOP",))
    rounds = list(Ensemble(members, config).stream("prompt ✓"))
    rounds[0] = with_token_scores(rounds[0])
    return Trace("prompt ✓", ("a", "b", "c"), config, tuple(rounds))


def test_a_trace_round_trips_exactly(trace, tmp_path):
    path = save_trace(trace, tmp_path / "run.json")
    back = load_trace(path)
    assert back == trace
    assert back.id == trace.id and re.fullmatch(r"[0-9a-f]{32}", back.id)
    assert back.result == trace.result and back.result.answer.endswith("猫。")
    assert any(r.exits for r in back.rounds)
    assert back.rounds[0].token_scores[2][1].tokens == ("to", "k✓")
    assert json.loads(path.read_text(encoding="utf-8"))["version"] == VERSION == 3


def test_every_run_gets_its_own_id_and_a_branch_names_its_parent(trace):
    assert Trace("p", ("a",), EnsembleConfig(), ()).id != Trace("p", ("a",), EnsembleConfig(), ()).id
    child = dataclasses.replace(
        trace, id="c" * 32, branch=Branch(parent=trace.id, k=2, text="forced ", origin="you")
    )
    back = parse_trace(dump_trace(child))
    assert back.branch == Branch(trace.id, 2, "forced ", "you") and back == child


def test_hand_built_rounds_with_implicit_eligibility_are_written_explicitly():
    rounds = hand_run(["one ", "two"])
    back = parse_trace(dump_trace(Trace("go", ("a", "b"), EnsembleConfig(), tuple(rounds))))
    assert [r.eligible for r in back.rounds] == [(True, True), (True, True)]
    assert [dataclasses.replace(r, eligible=()) for r in back.rounds] == rounds


def test_a_version_1_trace_still_loads():
    """Version 1 (before ids, branches and token scores) had optional eligibility flags."""
    text = (DATA / "trace-v1.json").read_text(encoding="utf-8")
    assert json.loads(text)["version"] == 1 and "eligible" not in json.loads(text)["rounds"][0]
    old = parse_trace(text)
    assert old.branch is None and re.fullmatch(r"[0-9a-f]{32}", old.id)
    assert parse_trace(text).id == old.id  # the same file, the same id
    assert all(r.eligible == (True,) * len(r.candidates) and r.token_scores == () for r in old.rounds)
    assert old.result.answer == "good good good good good 猫。" and old.result.stop_reason == "final"
    assert parse_trace(dump_trace(old)) == old  # and it is written as the current version


def mutate(trace, edit):
    doc = json.loads(dump_trace(trace))
    edit(doc)
    return json.dumps(doc)


def first(d):
    return d["rounds"][0]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema="other"), "not a specfuse trace"),
        (
            lambda d: d.update(version=99),
            "trace version 99 is not supported; this build reads versions 1, 2, 3",
        ),
        (lambda d: d.update(version=True), "trace version True is not supported"),
        (lambda d: d.pop("rounds"), "trace: missing 'rounds'"),
        (lambda d: d.update(rounds=[]), "a trace holds at least one round, this one has none"),
        (lambda d: d.pop("id"), "trace: missing 'id'"),
        (lambda d: d.update(extra=1), r"trace: unknown keys \['extra'\]"),
        (lambda d: first(d).pop("eligible"), r"rounds\[0\]: missing 'eligible'"),
        (lambda d: first(d).pop("token_scores"), r"rounds\[0\]: missing 'token_scores'"),
        (lambda d: first(d).update(chosen=7), "not a candidate index"),
        (lambda d: first(d).update(chosen=1.0), r"rounds\[0\].chosen: expected int, got float"),
        (lambda d: first(d)["scores"].pop(), r"rounds\[0\].scores: expected 3 rows, got 2"),
        (lambda d: first(d)["raw_scores"][1].pop(), r"rounds\[0\].raw_scores\[1\]: expected 3 values, got 2"),
        (
            lambda d: first(d)["candidates"][0].update(text=5),
            r"rounds\[0\].candidates\[0\].text: expected str, got int",
        ),
        (
            lambda d: first(d)["candidates"][0].update(final="yes"),
            r"candidates\[0\].final: expected bool, got str",
        ),
        (lambda d: first(d)["candidates"][0].update(votes=3), r"candidates\[0\]: unknown keys \['votes'\]"),
        (lambda d: first(d)["exits"].append("c"), r"rounds\[0\].exits\[0\]: expected an object, got str"),
        (
            lambda d: first(d)["token_scores"][1][2].update(logits=[1.0, "x"]),
            r"rounds\[0\].token_scores\[1\]\[2\].logits\[1\]: expected a number, got str",
        ),
        (
            lambda d: first(d)["token_scores"][1][2].update(logits=[1.0]),
            r"token_scores\[1\]\[2\]: tokens, logits and logprobs \(when kept\) differ in length",
        ),
        (lambda d: first(d)["token_scores"].pop(), r"rounds\[0\].token_scores: expected 3 rows, got 2"),
        (lambda d: first(d)["weights_after"].append(1e999), "not a finite number|expected 3 values"),
        (lambda d: first(d).update(weights_after=[1, 2]), r"weights_after: expected 3 values, got 2"),
        (lambda d: first(d).update(eligible=[True]), r"eligible: expected 3 values, got 1"),
        (lambda d: first(d).update(stop_reason="bored"), "not one of final, budget"),
        (lambda d: first(d).update(stop_reason="final"), "only the last round may carry a stop reason"),
        (lambda d: first(d).update(k=5), r"rounds\[0\].k: expected round 1, got 5"),
        (lambda d: first(d).update(members=["a", "b"]), "members do not match"),
        (lambda d: d["rounds"][1].update(text="tampered"), "concatenation"),
        (lambda d: d["config"].update(segment_len=0), "config is invalid"),
        (
            lambda d: d.update(branch={"parent": "p", "k": "2", "text": "", "origin": "you"}),
            r"branch.k: expected int",
        ),
        (
            lambda d: d.update(branch={"parent": "p", "k": 99, "text": "", "origin": "you"}),
            "round 99 is not in",
        ),
        (lambda d: d.update(branch=[]), "trace.branch: expected an object, got list"),
    ],
)
def test_malformed_traces_get_a_specific_error(trace, edit, message):
    with pytest.raises(TraceError, match=message):
        parse_trace(mutate(trace, edit))


def test_a_list_of_bad_items_costs_one_bad_item_and_a_crowd_of_keys_is_refused_while_parsing(trace):
    """pydantic reports every error it finds: a list stops at its first bad item, and an object of
    more keys than any record could hold is refused before validation (each key would be one)."""
    crowd = mutate(trace, lambda d: d.update(rounds=[{}] * 100_000))
    with pytest.raises(TraceError, match=r"trace.rounds\[0\]: missing 'k'") as refused:
        parse_trace(crowd)
    assert refused.value.__cause__.error_count() <= len(dataclasses.fields(Round))
    keys = mutate(trace, lambda d: first(d).update({f"k{i}": 0 for i in range(MAX_KEYS)}))
    with pytest.raises(TraceError, match=rf"an object of [\d,]+ keys \(the limit is {MAX_KEYS:,}\)"):
        parse_trace(keys)


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"schema": "specfuse.trace"}', "[" * 100_000])
def test_garbage_is_refused_not_crashed(text):
    with pytest.raises(TraceError):
        parse_trace(text)


def test_not_json_says_so():
    with pytest.raises(TraceError, match="not a JSON document"):
        parse_trace("{'schema': 'specfuse.trace'}")


def test_oversized_and_missing_files_are_refused(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_TRACE_BYTES + 1))
    with pytest.raises(TraceError, match="limit"):
        load_trace(big)
    with pytest.raises(TraceError, match="limit"):
        parse_trace(" " * (MAX_TRACE_BYTES + 1))
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.json")


def test_load_trace_takes_a_lower_limit_and_refuses_text_that_is_not_utf8(trace, tmp_path):
    path = save_trace(trace, tmp_path / "run.json")
    with pytest.raises(TraceError, match="the limit is 1,000"):
        load_trace(path, max_bytes=1000)
    assert load_trace(path, max_bytes=path.stat().st_size) == trace
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"schema": "caf\xe9"}')
    with pytest.raises(TraceError, match="not UTF-8"):
        load_trace(latin)


@dataclasses.dataclass(frozen=True)
class Later:
    """A record as someone might add one later: the reader handles its types without a change."""

    pairs: tuple[tuple[str, int], ...]
    maybe: float | None
    inner: TokenScores | None = None
    flag: bool = False


def test_the_reader_follows_the_records_types_not_a_list_of_names():
    read = lambda obj: trace_module._value(obj, Later, "x")  # noqa: E731
    assert read({"pairs": [["a", 1]], "maybe": None}) == Later((("a", 1),), None)
    nested = {"pairs": [], "maybe": 2, "inner": {"tokens": ["t"], "logits": [1], "logprobs": [-1]}}
    assert read(nested) == Later((), 2.0, TokenScores(("t",), (1.0,), (-1.0,)))
    for bad, message in [
        ({"pairs": [["a", "1"]], "maybe": None}, r"x.pairs\[0\]\[1\]: expected int, got str"),
        ({"pairs": [["a"]], "maybe": None}, r"x.pairs\[0\]: expected 2 items, got 1"),
        ({"pairs": [], "maybe": "2"}, "x.maybe: expected a number, got str"),
        ({"pairs": [], "maybe": None, "inner": {"tokens": []}}, "x.inner: missing 'logits'"),
        ({"pairs": []}, "x: missing 'maybe'"),
    ]:
        with pytest.raises(TraceError, match=message):
            read(bad)


def test_stop_reasons_list_every_reason_the_engine_and_summarize_produce():
    produced = set(re.findall(r'stop_reason = "(\w+)"', RUN.read_text(encoding="utf-8")))
    assert produced == set(ROUND_STOP_REASONS)
    cancelled = summarize([hand_round(1)])  # the consumer closed the stream after one round
    assert cancelled.stop_reason == "cancelled" and set(STOP_REASONS) == produced | {"cancelled"}
