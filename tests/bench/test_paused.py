"""`python -m specfuse.bench paused` on tiny models: the three cases run on one scheduler and the report
carries the figures the docs quote (a timing script, checked for shape, never for speed)."""

from __future__ import annotations

import pytest

from specfuse.bench.__main__ import SUBCOMMANDS
from specfuse.bench.paused import CASES, format_table, main, run_paused


def test_the_step_mode_benchmark_reports_a_running_user_in_each_case(tiny_members):
    report = run_paused(tiny_members, max_tokens=8, segment_len=4, step_every=0.05, repeats=2)
    assert list(report["cases"]) == list(CASES)
    for case in report["cases"].values():
        assert case["tokens_per_s"] > 0 and case["round_s"] > 0 and case["runs"] == 2
        assert case["same_answer_as_alone"] == 2  # fp32 greedy: a neighbour changes no answer
    assert report["cases"]["alone"]["ratio_to_alone"] == 1.0
    assert report["neighbour_steps"] >= 2 and report["neighbour_errors"] == []
    assert report["neighbour_step_median_s"] > 0 and len(report["load_before"]) == 3
    table = format_table(report)
    assert "beside a run stepping" in table and "load average" in table and "from next() to Paused" in table
    assert SUBCOMMANDS["paused"] == "specfuse.bench.paused"


def test_the_command_refuses_bad_numbers_before_loading(capsys):
    for bad in (["--repeats", "0"], ["--step-every", "-1"]):
        with pytest.raises(SystemExit) as exit:
            main(bad)
        assert exit.value.code == 2
        assert "--repeats and --max-tokens must be at least 1" in capsys.readouterr().err
