"""The evaluation's statistics: Wilson intervals, paired McNemar tests, loop and distinct-n metrics.

Pure functions on booleans and strings (stdlib only); knows nothing about models, traces or files.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

# The loop definition lives in specfuse/segments.py, shared with the loop guard; named here for the eval.
from ..segments import ends_in_loop as ends_in_loop
from ..segments import loop_words as words


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default); (0, 1) when total is 0."""
    if total <= 0:
        return 0.0, 1.0
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar p-value: a binomial test of the discordant pairs against p = 1/2.

    p = min(1, 2 · Σ_{i ≤ min(b, c)} C(b + c, i) / 2^(b + c)); 1.0 when there are no discordant pairs.
    """
    if only_a < 0 or only_b < 0:
        raise ValueError(f"counts must be ≥ 0, got {only_a}, {only_b}")
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired(outcomes_a: Sequence[bool], outcomes_b: Sequence[bool]) -> dict[str, Any]:
    """Paired comparison of two systems on the same problems (position i = problem i in both).

    Returns the four cells (both_right, only_a, only_b, both_wrong), each accuracy with its Wilson
    interval, the difference a − b, and the exact McNemar p-value on the discordant pairs.
    """
    if len(outcomes_a) != len(outcomes_b):
        raise ValueError(f"paired outcomes need equal lengths, got {len(outcomes_a)} and {len(outcomes_b)}")
    pairs = list(zip(map(bool, outcomes_a), map(bool, outcomes_b)))
    n = len(pairs)
    cells = Counter(pairs)
    right_a, right_b = sum(a for a, _ in pairs), sum(b for _, b in pairs)
    return {
        "problems": n,
        "both_right": cells[True, True],
        "only_a": cells[True, False],
        "only_b": cells[False, True],
        "both_wrong": cells[False, False],
        "accuracy_a": right_a / n if n else 0.0,
        "accuracy_b": right_b / n if n else 0.0,
        "ci_a": wilson(right_a, n),
        "ci_b": wilson(right_b, n),
        "difference": (right_a - right_b) / n if n else 0.0,
        "p_value": mcnemar_exact(cells[True, False], cells[False, True]),
    }


# -- text metrics ----------------------------------------------------------------------------------


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(text: str, n: int) -> float | None:
    """Distinct-n of one answer: unique word n-grams / all word n-grams; None below n words."""
    grams = ngrams(words(text), n)
    return len(set(grams)) / len(grams) if grams else None


def text_metrics(texts: Sequence[str]) -> dict[str, float | None]:
    """Per-system text figures: loop share, and distinct-2 / distinct-3 averaged over the answers
    (answers shorter than n words are left out of distinct-n; None when none is long enough)."""

    def mean(values: Sequence[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        return sum(kept) / len(kept) if kept else None

    return {
        "loop_share": sum(ends_in_loop(t) for t in texts) / len(texts) if texts else 0.0,
        "distinct_2": mean([distinct_n(t, 2) for t in texts]),
        "distinct_3": mean([distinct_n(t, 3) for t in texts]),
    }
