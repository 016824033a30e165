"""The concurrency benchmark on tiny members (every mode, finite ratios) and its worker timing."""

from __future__ import annotations

import json
import math

import pytest

from specfuse.bench import concurrency as bench_concurrency

from ..conftest import REAL_MODEL_CACHE
from ..helpers_bench import assert_ratios


def test_every_mode_reports_finite_ratios_and_says_whether_answers_match(tiny_members):
    report = bench_concurrency.run_concurrency(tiny_members, max_new_tokens=30, segment_len=5, repeats=1)
    assert list(report["modes"]) == [
        "exit off, parallel off", "exit off, parallel on", "exit on, parallel off", "exit on, parallel on"
    ]  # fmt: skip
    for mode in report["modes"].values():
        assert_ratios(mode)
        assert 0 < mode["first_candidate_s"] <= mode["first_segment_s"]
        assert 0 <= mode["decode_steps_saved"] < mode["tokens"] * 3
    on = report["modes"]["exit off, parallel on"]
    assert on["same_answer_as_in_turn"] is True  # fp32 tiny members: one thread or two, same argmax
    assert on["drafters_per_round"] == 3.0
    assert set(report["thread_shares"]) == {m.name for m in tiny_members}
    table = bench_concurrency.format_table(report)
    assert "overhead_vs_single_sum" in table and "exit on, parallel on" in table
    assert table.count("× the floor") == len(report["single"])  # each member beside its floor
    assert all(s["floor_ratio"] > 1 for s in report["single"].values())
    json.dumps(report)


def test_the_ensemble_in_worker_processes_is_a_mode_beside_the_others(tiny_checkpoints):
    from specfuse.models.loading import load_member

    members = [load_member(p, dtype="float32") for p in tiny_checkpoints]
    report = bench_concurrency.run_concurrency(members, max_new_tokens=20, segment_len=5, repeats=1)
    mode = bench_concurrency.time_in_processes(report, tiny_checkpoints, "float32", repeats=1)
    report["modes"]["exit off, processes"] = mode
    assert (
        mode["tokens"] == 20 and math.isfinite(mode["overhead_vs_slowest"]) and mode["speedup_vs_in_turn"] > 0
    )
    assert mode["answer"] == report["modes"]["exit off, parallel off"]["answer"]  # fp32: the same argmaxes
    assert "exit off, processes" in bench_concurrency.format_table(report)


@pytest.mark.slow
def test_threads_and_processes_both_decode_every_member(monkeypatch):
    monkeypatch.setenv("SPECFUSE_CACHE", REAL_MODEL_CACHE)  # the children load the converted model
    out = bench_concurrency.compare_workers(["smollm2-135m"], "float32", tokens=3, prompt="Hi")
    assert out["thread_shares"]["smollm2-135m"] >= 1
    for key in ("in_turn_s", "threads_s", "processes_s"):
        assert 0 < out[key] < 120


def test_help_and_a_bad_model(capsys):
    with pytest.raises(SystemExit) as done:
        bench_concurrency.main(["--help"])
    assert done.value.code == 0 and "--max-new-tokens" in capsys.readouterr().out
    assert bench_concurrency.main(["--models", "no-such-model", "--no-workers"]) == 2
    assert "no-such-model" in capsys.readouterr().err
