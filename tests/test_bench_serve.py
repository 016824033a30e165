"""`python -m specfuse.bench serve` on tiny models: every level runs through the live API, and the
report carries the figures the docs quote (a timing script, checked for shape, never for speed)."""

from __future__ import annotations

from specfuse.bench.serve import format_table, percentile, run_serve
from specfuse.config import EnsembleConfig


def test_percentile_interpolates_between_ranks():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.95) == 5.0


def test_the_serving_benchmark_reports_each_level_against_one_at_a_time(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=8)
    report = run_serve(tiny_members, levels=(1, 2, 8), requests=4, max_tokens=8, config=config)
    levels = report["levels"]
    assert list(levels) == ["1", "2", "8"] and report["batch_size"] == 8
    for level in levels.values():
        assert level["errors"] == [] and level["tokens"] > 0 and level["tokens_per_s"] > 0
        assert level["first_segment_p95_s"] >= level["first_segment_median_s"] > 0
        assert level["same_answers_as_one_at_a_time"] == 4  # fp32 greedy: batching changes nothing
        assert len(level["load_before"]) == 3
    assert levels["1"]["aggregate_speedup"] == 1.0
    table = format_table(report)
    assert "targets (8 clients against one at a time)" in table and "load avg" in table
