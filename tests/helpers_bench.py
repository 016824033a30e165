"""The benchmark tests' shared check (bench/test_concurrency, bench/test_gpu): a mode's timings are
figures of the right shape, never checked for speed."""

from __future__ import annotations

import math

# What every mode of the concurrency and GPU benchmarks reports against the members alone.
RATIOS = (
    "s_per_token",
    "overhead_vs_single_sum",
    "overhead_vs_slowest",
    "first_segment_ratio",
    "floor_ratio",
)


def assert_ratios(mode: dict) -> None:
    """Each of RATIOS in `mode` is a finite positive number."""
    for key in RATIOS:
        assert math.isfinite(mode[key]) and mode[key] > 0, key
