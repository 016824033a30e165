"""`python -m specfuse.bench followup` on tiny models: each turn's conversation is the one before with
the ensemble's answer and a follow-up, and the report carries the figures docs/serve.md quotes (a
timing script, checked for shape, never for speed)."""

from __future__ import annotations

import pytest

from specfuse.bench.__main__ import SUBCOMMANDS
from specfuse.bench.followup import FOLLOW_UPS, format_table, main, play, run_followup
from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.prompts import Message


def test_each_turn_continues_the_last_with_the_ensembles_answer(tiny_members):
    ensemble = Ensemble(tiny_members, EnsembleConfig(segment_len=4, max_new_tokens=8, temperature=0.0))
    turns = play(ensemble, "Hi there", 3)
    first, second, third = (t.prompt for t in turns)
    assert first == "Hi there" and all(t.first_segment_s > t.round1_s > 0 for t in turns)
    assert second == (
        Message("user", "Hi there"),
        Message("assistant", ensemble.run("Hi there").answer),
        Message("user", FOLLOW_UPS[0]),
    )
    assert third[:3] == second and third[3] == Message("assistant", ensemble.run(second).answer)
    assert third[4] == Message("user", FOLLOW_UPS[1])


def test_the_follow_up_benchmark_reports_each_turns_first_segment_and_prefills(tiny_members):
    report = run_followup(
        tiny_members, questions=["Hi there", "Why?"], turns=3, answer_tokens=8, segment_len=4, repeats=2
    )
    assert [r["turn"] for r in report["turns"]] == [1, 2, 3] and report["turns"][0]["ratio_to_turn_1"] == 1.0
    assert report["questions"] == ["Hi there", "Why?"]
    assert report["questions"] == ["Hi there", "Why?"]
    names = [m.name for m in tiny_members]
    for r in report["turns"]:
        assert r["first_segment_s"] > 0 and len(r["first_segment_runs_s"]) == 2
        assert r["first_segment_s"] > r["prefill_s"] > 0 and r["round1_s"] > 0
    tokens = [r["prompt_tokens"][names[0]] for r in report["turns"]]
    assert tokens[0] < tokens[1] < tokens[2]  # each turn's context holds the one before
    assert report["ratio"] == report["turns"][1]["ratio_to_turn_1"] and report["target"] == 1.5
    assert len(report["load_before"]) == 3 and isinstance(report["niceness"], int)
    table = format_table(report)
    assert (
        "turn 2 / turn 1" in table
        and "load average" in table
        and "prefill s" in table
        and "round 1 s" in table
    )
    assert SUBCOMMANDS["followup"] == "specfuse.bench.followup"


def test_the_command_refuses_bad_numbers_before_loading(capsys):
    for bad in (["--repeats", "0"], ["--turns", "1"]):
        with pytest.raises(SystemExit) as exit:
            main(bad)
        assert exit.value.code == 2
        assert "--turns at least 2" in capsys.readouterr().err
