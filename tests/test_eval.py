"""The evaluation harness: answer extraction, Wilson intervals, resumable runs, failure-case lists."""

from __future__ import annotations

import json

import pytest

from specfuse import eval as ev
from specfuse.config import EnsembleConfig

from . import builders


def hand_round(k, text, *, timings=(), seconds=0.1, member="m", stop=None):
    """A one-candidate Round built by hand."""
    return builders.hand_round(
        k,
        members=(member,),
        texts=(text,),
        final=stop is not None,
        timings=timings or None,
        seconds=seconds,
        text=text,
        stop_reason=stop,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She pays 3 * 4 = 12 dollars. The answer is 12.", "12"),
        ("The answer is $1,250.", "1250"),
        ("so 18.00 in total. The answer is: 18.00", "18"),
        ("The answer is 5. Wait, 7 eggs... The answer is 6.", "6"),
        ("First 3, then 4, so 9 apples", "9"),
        ("The answer is -4 degrees", "-4"),
        ("The answer is **42**.", "42"),
        ("It costs 0.5 dollars each, 2.50 total", "2.5"),
        ("no number here", None),
        ("The answer is N.", None),
    ],
)
def test_the_final_number_is_extracted_from_tricky_replies(text, expected):
    assert ev.extract_answer(text) == expected


def test_wilson_interval_matches_known_values_and_stays_in_bounds():
    low, high = ev.wilson(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-3) and high == pytest.approx(0.9433, abs=1e-3)
    assert ev.wilson(0, 5)[0] == 0.0 and ev.wilson(5, 5)[1] == pytest.approx(1.0)
    assert ev.wilson(0, 0) == (0.0, 1.0)


def test_majority_vote_ties_go_to_the_first_sample():
    assert ev.majority(["3", "4", "4"]) == "4"
    assert ev.majority(["3", "4", None]) == "3"
    assert ev.majority([None, None]) is None


def write_data(path, n=2):
    rows = [
        {"question": f"Tom has {i} apples and buys 2 more. How many?", "answer": f"{i}+2\n#### {i + 2}"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_problems_load_with_their_gold_numbers(tmp_path):
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl", 3), limit=2)
    assert [(p.id, p.gold) for p in problems] == [("gsm8k-0000", "2"), ("gsm8k-0001", "3")]


def test_every_system_runs_once_and_a_second_run_loads_the_traces(tiny_members, tmp_path, monkeypatch):
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl"))
    config = EnsembleConfig(max_new_tokens=12, segment_len=4)
    runs = tmp_path / "runs"
    first = ev.evaluate(tiny_members, problems, runs, config=config)
    systems = {o.system for o in first}
    assert {f"single-{m.name}" for m in tiny_members} < systems
    assert {"ensemble", "ensemble-no-feedback", "ensemble-no-exit"} < systems
    sc = [o for o in first if o.system.startswith("sc3-")]
    assert len(sc) == 2 and all(len(o.traces) == 3 for o in sc)
    assert len(list(runs.rglob("*.json"))) == 2 * (3 + 3 + 3)

    def no_generation(*args, **kwargs):
        raise AssertionError("a saved trace was generated again")

    monkeypatch.setattr(ev.Ensemble, "stream", no_generation)
    again = ev.evaluate(tiny_members, problems, runs, config=config)
    assert again == first

    document = ev.write_reports(again, problems, tmp_path / "report", "tiny-0.5b", png=False)
    rows = {r["system"]: r for r in document["summary"]}
    assert (
        rows["ensemble"]["problems"] == 2 and 0 <= rows["ensemble"]["ci_low"] <= rows["ensemble"]["ci_high"]
    )
    assert rows["single-llama-bytes"]["models_drafting_per_round"] == 1.0
    assert 1.0 <= rows["ensemble"]["models_drafting_per_round"] <= 3.0
    for suffix in (".csv", ".md", ".json", ".html"):
        assert (tmp_path / "report" / f"eval-tiny-0.5b{suffix}").is_file()  # a dot in a name survives


def outcome(system, problem, correct, trace="t.json"):
    return ev.Outcome(system, problem, "1" if correct else "2", correct, 1.0, 1, 1, (trace,))


def test_failure_cases_list_both_directions_against_the_best_member(tmp_path):
    outcomes = [
        outcome("single-a", "p0", True),
        outcome("single-a", "p1", True),
        outcome("single-a", "p2", False),
        outcome("single-b", "p0", False),
        outcome("single-b", "p1", False),
        outcome("single-b", "p2", False),
        outcome("ensemble", "p0", False, str(tmp_path / "ensemble" / "p0.json")),
        outcome("ensemble", "p1", True),
        outcome("ensemble", "p2", True, str(tmp_path / "ensemble" / "p2.json")),
    ]
    cases = ev.failure_cases(outcomes)
    assert cases["best_member"] == "a"
    assert [c["problem"] for c in cases["ensemble_wrong_best_right"]] == ["p0"]
    assert [c["problem"] for c in cases["ensemble_right_best_wrong"]] == ["p2"]
    assert cases["ensemble_wrong_best_right"][0]["ensemble_trace"].endswith("p0.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no data file"),
        ('{"question": "q", "answer": "#### 3"}\nnot json\n', "d.jsonl:2: malformed line"),
        ('{"question": "q"}\n', "d.jsonl:1: malformed line"),
        ('{"question": "q", "answer": "no marker"}\n', "d.jsonl:1: malformed line"),
    ],
)
def test_bad_data_exits_2_with_a_one_line_reason(tmp_path, capsys, content, message):
    data = tmp_path / "d.jsonl"
    if content is not None:
        data.write_text(content)
    assert ev.main(["gsm8k", "--data", str(data), "--runs", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_an_unknown_model_exits_2(tmp_path, capsys):
    data = write_data(tmp_path / "d.jsonl")
    args = ["gsm8k", "--data", str(data), "--models", "no-such-model", "--runs", str(tmp_path / "r")]
    assert ev.main(args) == 2
    assert "Unknown model 'no-such-model'" in capsys.readouterr().err
