"""The evaluation's statistics: Wilson intervals, paired McNemar tests, loop and distinct-n metrics.

Pure functions on booleans and strings (stdlib only); knows nothing about models, traces or files.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

LOOP_COPIES = 3  # a block seen this many times in a row at the end is a loop
LOOP_MAX_UNITS = 8  # the longest block, in sentences or lines
LOOP_MAX_WORDS = 24  # the longest block, in words (for loops inside one endless line)
LOOP_MIN_CHARS = 20  # the repeated stretch must hold this many characters ("Yes. Yes. Yes." is not a loop)

_WORD = re.compile(r"\w+(?:[.,']\w+)*")  # "1,250", "3.5", "don't" stay one word; CJK runs are one word
_UNIT_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])|\n+")
_LETTER = re.compile(r"[^\W\d_]")


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


def words(text: str) -> list[str]:
    """Lower-cased words: runs of letters and digits (punctuation dropped, "1,250" kept whole)."""
    return _WORD.findall(text.lower())


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(text: str, n: int) -> float | None:
    """Distinct-n of one answer: unique word n-grams / all word n-grams; None below n words."""
    grams = ngrams(words(text), n)
    return len(set(grams)) / len(grams) if grams else None


def ends_in_loop(text: str) -> bool:
    """Whether an answer ends in repetition: its end is one block repeated ≥ 3 times in a row.

    Definition. Split the answer into units: sentences (ending in . ! ? before white space, or in
    。！？) and lines; compare units by their lower-cased words (`words()`, punctuation dropped) and
    drop units without a letter (list numbers "2.", bare numbers, "}"). The answer ends in a loop
    when, for some block length q ≤ 8 units, its last 3q units are three copies of the same q
    units, or, inside one endless line, its last 3p words are three copies of p ≤ 24 words; the
    last unit (word) may be a truncated copy (a prefix of the one it repeats), since a budget can
    cut a loop anywhere; and the repeated stretch holds ≥ 20 characters of words.

    Restating the question's quantities ("the number of bolts of blue fiber" five times), a GSM8K
    solution reusing numbers, a counting list (16, 20, 24, …) and code with similar lines
    (`print(fib(1))`, `print(fib(2))`) are not loops; "The answer is 18." three times at the end is.
    """
    units = [tuple(words(piece)) for piece in _UNIT_END.split(text)]
    units = [u for u in units if any(_LETTER.search(w) for w in u)]
    if _repeats_at_end(units, LOOP_MAX_UNITS, lambda last, earlier: earlier[: len(last)] == last):
        return True
    flat = words(text)
    return _repeats_at_end(
        [(w,) for w in flat], LOOP_MAX_WORDS, lambda last, earlier: earlier[0].startswith(last[0])
    )


def _repeats_at_end(
    units: Sequence[tuple[str, ...]],
    max_period: int,
    truncated: Callable[[tuple[str, ...], tuple[str, ...]], bool],
) -> bool:
    """Whether the sequence ends in ≥ LOOP_COPIES copies of a block of ≤ max_period units."""
    n = len(units)
    for q in range(1, min(max_period, n // LOOP_COPIES) + 1):
        last, earlier = units[n - 1], units[n - 1 - q]
        if last != earlier and not truncated(last, earlier):
            continue
        j = n - 2
        while j - q >= 0 and units[j] == units[j - q]:
            j -= 1
        covered = (n - 1 - j) + q  # units j+1 … n-1 repeat the q units before them
        if (
            covered >= LOOP_COPIES * q
            and sum(len("".join(u)) for u in units[n - covered :]) >= LOOP_MIN_CHARS
        ):
            return True
    return False


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
