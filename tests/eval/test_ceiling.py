"""The ceiling of a study (specfuse.eval.ceiling) on a constructed set whose figures are known by
hand, in the report's page, JSON and console, and in the app's failure browser."""

from __future__ import annotations

import json

import pytest

from specfuse.eval import report as eval_report
from specfuse.eval.ceiling import ceiling, ceiling_lines, paired_difference_interval
from specfuse.eval.page import console_summary
from specfuse.eval.problems import Problem
from specfuse.eval.stats import mcnemar_exact, wilson
from studio.failures import EvalRun, load_eval

from ..helpers_eval import outcomes


def test_the_ceiling_of_a_constructed_set_is_the_one_counted_by_hand():
    found = ceiling(outcomes())
    assert found is not None and found["problems"] == 10 and found["best_member"] == "a"
    assert [(r["member"], r["correct"]) for r in found["members"]] == [("a", 6), ("b", 5), ("c", 1)]
    assert (found["members"][0]["ci_low"], found["members"][0]["ci_high"]) == wilson(6, 10)
    assert (found["oracle_correct"], found["oracle"]) == (9, 0.9)
    assert (found["all_wrong"], found["beta"]) == (1, 0.1)
    assert found["oracle"] == pytest.approx(1 - found["beta"])
    assert (found["beta_low"], found["beta_high"]) == wilson(1, 10)
    pairs = {(p["a"], p["b"]): p for p in found["pairs"]}
    # a wrong on 6-9, b on 0-2 and 8-9, c on all but 8
    assert pairs["a", "b"]["both_wrong"] == 2 and pairs["a", "b"]["overlap"] == pytest.approx(2 / 7)
    assert pairs["a", "c"]["both_wrong"] == 3 and pairs["b", "c"]["both_wrong"] == 4
    assert pairs["b", "c"]["co_failure"] == 0.4
    (d,) = found["discordance"]
    assert (d["system"], d["problems"], d["accuracy"]) == ("ensemble", 10, 0.8)
    assert (d["gained"], d["lost"]) == (3, 1) and d["difference"] == pytest.approx(0.2)
    assert d["p_value"] == mcnemar_exact(3, 1) == pytest.approx(0.625)
    assert (d["gained_low"], d["gained_high"]) == wilson(3, 10)
    assert d["difference_low"] < 0.2 < d["difference_high"]
    lines = ceiling_lines(found)
    assert "Oracle (at least one member right): 9/10 = 90.0%" in lines[1]
    assert "β (all wrong together): 1/10 = 10.0%" in lines[1] and "at most 90.0%" in lines[1]
    assert any("right where it was wrong 3" in line and "p = 0.625" in line for line in lines)


def test_the_paired_interval_is_mcnemars_wald_interval_and_stays_in_bounds():
    low, high = paired_difference_interval(3, 1, 10)
    se = (4 - 4 / 10) ** 0.5 / 10
    assert (low, high) == pytest.approx((0.2 - 1.96 * se, 0.2 + 1.96 * se))
    assert paired_difference_interval(0, 0, 10) == (0.0, 0.0)
    assert paired_difference_interval(10, 0, 10) == (1.0, 1.0)  # all gained: no spread left
    assert paired_difference_interval(0, 0, 0) == (-1.0, 1.0)


def test_no_ceiling_without_two_members_alone():
    only_a = [o for o in outcomes() if o.system in ("single-a", "ensemble")]
    assert ceiling(only_a) is None


def test_every_report_prints_the_oracle_beta_and_the_discordance(tmp_path):
    problems = [Problem(f"p{i}", "q", "1") for i in range(10)]
    document = eval_report.write_reports(outcomes(), problems, tmp_path, "RESULTS-c", png=False)
    page = (tmp_path / "RESULTS-c.md").read_text()
    assert "## The ceiling" in page and "Oracle (at least one member right): 9/10" in page
    assert "right where it was wrong 3" in page and (tmp_path / "RESULTS-c-ceiling.html").is_file()
    stored = json.loads((tmp_path / "RESULTS-c.json").read_text())["ceiling"]
    assert stored["beta"] == 0.1 and stored["discordance"][0]["lost"] == 1
    assert "β (all wrong together): 1/10" in console_summary(document)


def test_the_failure_browser_shows_the_ceiling_of_a_loaded_evaluation(tmp_path):
    problems = [Problem(f"p{i}", "q", "1") for i in range(10)]
    eval_report.write_reports(outcomes(), problems, tmp_path, "RESULTS-c", png=False)
    run = load_eval(tmp_path)
    note = run.note()
    assert "**The ceiling.**" in note and "Oracle (at least one member right): 9/10" in note
    assert "Co-failure a & b: both wrong on 2/10" in note
    ungraded = EvalRun(tmp_path, tuple(o.__class__(**{**o.__dict__, "gold": None}) for o in outcomes()), "a")
    assert ungraded.ceiling_lines() == []
