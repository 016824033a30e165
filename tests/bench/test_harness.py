"""The benchmark harness on tiny members: every reported figure exists and is finite; bad input exits 2."""

from __future__ import annotations

import json
import math

import pytest

from specfuse.bench import core as bench
from specfuse.records import MemberTiming

from .. import builders


def hand_round(k, text, *, timings=(), seconds=0.1, member="m", stop=None):
    """A one-candidate Round whose candidate is the whole answer `text` (the shared builder)."""
    return builders.hand_round(
        k,
        members=(member,),
        texts=(text,),
        final=stop is not None,
        timings=timings or None,
        seconds=seconds,
        elapsed=seconds * k,
        text=text,
        stop_reason=stop,
    )


def test_the_report_has_every_figure_the_issue_asks_for_and_all_are_finite(tiny_members):
    report = bench.run_bench(tiny_members, max_new_tokens=40, off_rounds=3, repeats=1)
    for key in (
        "round_time_ratio_late_early",
        "verify_share",
        "overhead_vs_single_sum",
        "first_segment_latency_s",
        "slowest_single_first_segment_s",
        "first_segment_latency_ratio",
        "peak_rss_gb",
        "ensemble_s_per_token",
        "single_sum_s_per_token",
        "floor_sum_s_per_token",
        "ensemble_floor_ratio",
    ):
        assert math.isfinite(report[key]), key
    for single in report["single"].values():  # each member's decode time beside its floor
        assert single["floor_ratio"] == pytest.approx(single["s_per_token"] / single["floor_s_per_token"])
        assert single["floor_ratio"] > 1  # nothing decodes faster than reading its weights once
    assert report["floor_sum_s_per_token"] == pytest.approx(
        sum(s["floor_s_per_token"] for s in report["single"].values())
    )
    assert report["cpu_model"] and set(report["dtypes"].values()) == {"float32"}
    assert set(report["single"]) == {m.name for m in tiny_members}
    accept = report["accept_cost"]
    assert set(accept["reuse_on_ms"]) == set(accept["reuse_off_ms"]) == {m.name for m in tiny_members}
    assert all(m.reuse_verified_kv for m in tiny_members)  # the switch is put back
    json.dumps(report)  # JSON-ready
    table = bench.format_table(report)
    assert "read bandwidth: cpu" in table and table.count("× the floor") == len(tiny_members) + 1
    for key, value, bound, holds in bench.verdicts(report):
        line = next(line for line in table.splitlines() if line.startswith(key + " "))
        assert holds == (value <= bound) and line.endswith("PASS" if holds else "MISS"), line


def test_a_verdict_passes_only_within_its_target():
    for key, bound in bench.TARGETS.items():
        verdict = {k: ok for k, _, _, ok in bench.verdicts({**bench.TARGETS, key: bound + 0.01})}
        assert verdict[key] is False and all(verdict[k] for k in bench.TARGETS if k != key)
        assert {k: ok for k, _, _, ok in bench.verdicts({**bench.TARGETS, key: math.nan})}[key] is False


def test_late_and_early_rounds_are_the_issues_ranges_or_what_exists():
    assert bench.late_early_ranges(60) == ((2, 11), (31, 40))
    assert bench.late_early_ranges(25) == ((2, 11), (16, 25))
    early, late = bench.late_early_ranges(9)
    assert early == (2, 5) and late == (6, 9)


def test_phase_shares_with_members_at_once_are_shares_of_wall_time():
    """Members at once overlap: summing their times gave a draft share of 1.96 and an engine share of
    -1.41 in one run (issue 21). A phase lasts as long as its slowest member."""
    timings = (MemberTiming("m", 0.5, 0.2, 0.1), MemberTiming("n", 0.6, 0.1, 0.1))
    rounds = [hand_round(1, "a", timings=timings, seconds=1.0)]
    shares = bench.phase_shares(rounds, concurrent=True)
    assert shares["draft_share"] == pytest.approx(0.6) and shares["verify_share"] == pytest.approx(0.2)
    assert shares["engine_share"] == pytest.approx(0.1) and sum(shares.values()) == pytest.approx(1.0)
    assert bench.phase_shares(rounds)["engine_share"] < 0  # in-turn arithmetic would not fit them


def test_phase_shares_add_up_to_one():
    rounds = [
        hand_round(1, "a", timings=(MemberTiming("m", 0.5, 0.2, 0.1),), seconds=1.0),
        hand_round(2, "b", timings=(MemberTiming("m", 0.4, 0.3, 0.0),), seconds=1.0),
    ]
    shares = bench.phase_shares(rounds)
    assert shares["verify_share"] == pytest.approx(0.25)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert bench.mean_round_seconds(rounds, 2, 11) == 1.0
    assert math.isnan(bench.mean_round_seconds(rounds, 31, 40))


def test_settings_apply_to_every_run_of_the_benchmark(tiny_members):
    report = bench.run_bench(
        tiny_members, max_new_tokens=40, off_rounds=3, repeats=1, settings={"max_rounds": 2}
    )
    assert report["rounds"] == 2 and len(report["round_seconds"]) == 2


def test_a_bad_setting_exits_2_naming_it(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--set", "own_draft_score=true", "--no-rss"])
    assert e.value.code == 2 and "unknown setting 'own_draft_score'" in capsys.readouterr().err


def test_an_unknown_model_exits_2_with_one_line(capsys):
    assert bench.main(["--models", "no-such-model", "--no-rss"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Unknown model 'no-such-model'") and "\n" not in err


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0 and "--quick" in capsys.readouterr().out
