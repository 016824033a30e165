"""The evaluation's statistics: Wilson intervals, paired McNemar tests, loop and distinct-n metrics.

Pure functions on booleans and strings (stdlib only); knows nothing about models, traces or files.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

LOOP_NGRAM = 6  # words in an n-gram that, seen 3 times, makes a loop
LOOP_MIN_SENTENCE_WORDS = 4  # shorter sentences ("return x", "} else {") repeat in normal text
LOOP_REPEATS = 3
LOOP_TAIL = 0.4  # the share of the answer (by words) where a repetition must reach

_WORD = re.compile(r"\w+(?:[.,']\w+)*")  # "1,250", "3.5", "don't" stay one word; CJK runs are one word
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n+")


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
    """Whether an answer ends in repetition.

    Definition: the answer's words are w_1 … w_T (`words()`: lower-cased, punctuation dropped).
    It ends in a loop when some unit occurs ≥ 3 times in the whole answer *and* one of those
    occurrences starts in its last 40 % (word position ≥ 0.6 · T), where a unit is either
      - a 6-word n-gram, or
      - a sentence of ≥ 4 words (text between . ! ? 。！？ followed by white space, or a line break;
        compared by its words, so case and punctuation do not matter).
    Short sentences and lines (`return x`, `}`) are ignored because code and lists repeat them
    legitimately; a GSM8K solution that reuses the same numbers ("9 * 2 = 18") does not repeat a
    6-word n-gram three times. The tail condition keeps an answer that quotes a phrase three times
    early and then moves on from counting as stuck.
    """
    tokens = words(text)
    total = len(tokens)
    if total < LOOP_NGRAM:
        return False
    tail_start = math.ceil((1 - LOOP_TAIL) * total)
    starts: dict[tuple[str, ...], list[int]] = {}
    for i, gram in enumerate(ngrams(tokens, LOOP_NGRAM)):
        starts.setdefault(gram, []).append(i)
    if any(len(s) >= LOOP_REPEATS and s[-1] >= tail_start for s in starts.values()):
        return True
    position = 0
    sentence_starts: dict[tuple[str, ...], list[int]] = {}
    for piece in _SENTENCE_END.split(text):
        sentence = tuple(words(piece))
        if len(sentence) >= LOOP_MIN_SENTENCE_WORDS:
            sentence_starts.setdefault(sentence, []).append(position)
        position += len(sentence)
    return any(len(s) >= LOOP_REPEATS and s[-1] >= tail_start for s in sentence_starts.values())


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
