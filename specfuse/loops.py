"""Loops: an answer that ends in one block of text repeated over and over.

The one definition of a loop, shared by the engine's loop guard (which keeps a candidate from
extending one) and the evaluation's loop share (which counts answers that end in one). Pure
functions on strings, stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

LOOP_COPIES = 3  # a block seen this many times in a row at the end is a loop
LOOP_MAX_UNITS = 8  # the longest block, in sentences or lines
LOOP_MAX_WORDS = 24  # the longest block, in words (for loops inside one endless line)
LOOP_MIN_CHARS = 20  # the repeated stretch must hold this many characters ("Yes. Yes. Yes." is not a loop)

_WORD = re.compile(r"\w+(?:[.,']\w+)*")  # "1,250", "3.5", "don't" stay one word; CJK runs are one word
_UNIT_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])|\n+")
_LETTER = re.compile(r"[^\W\d_]")


def words(text: str) -> list[str]:
    """Lower-cased words: runs of letters and digits (punctuation dropped, "1,250" kept whole)."""
    return _WORD.findall(text.lower())


def ends_in_loop(text: str, copies: int = LOOP_COPIES) -> bool:
    """Whether an answer ends in repetition: its end is one block repeated ≥ `copies` (3) times in a row.

    Definition. Split the answer into units: sentences (ending in . ! ? before white space, or in
    。！？) and lines; compare units by their lower-cased words (`words()`, punctuation dropped) and
    drop units without a letter (list numbers "2.", bare numbers, "}"). The answer ends in a loop
    when, for some block length q ≤ 8 units, its last 3q units are three copies of the same q
    units, or, inside one endless line, its last 3p words are three copies of p ≤ 24 words (with
    `copies` = 3; the loop guard asks for 2, to act before a loop sets in); the
    last unit (word) may be a truncated copy (a prefix of the one it repeats), since a budget can
    cut a loop anywhere; and the repeated stretch holds ≥ 20 characters of words.

    Restating the question's quantities ("the number of bolts of blue fiber" five times), a GSM8K
    solution reusing numbers, a counting list (16, 20, 24, …) and code with similar lines
    (`print(fib(1))`, `print(fib(2))`) are not loops; "The answer is 18." three times at the end is.
    """
    units = [tuple(words(piece)) for piece in _UNIT_END.split(text)]
    units = [u for u in units if any(_LETTER.search(w) for w in u)]
    if _repeats_at_end(units, LOOP_MAX_UNITS, copies, lambda last, earlier: earlier[: len(last)] == last):
        return True
    flat = words(text)
    return _repeats_at_end(
        [(w,) for w in flat], LOOP_MAX_WORDS, copies, lambda last, earlier: earlier[0].startswith(last[0])
    )


def _repeats_at_end(
    units: Sequence[tuple[str, ...]],
    max_period: int,
    copies: int,
    truncated: Callable[[tuple[str, ...], tuple[str, ...]], bool],
) -> bool:
    """Whether the sequence ends in ≥ `copies` copies of a block of ≤ max_period units."""
    n = len(units)
    for q in range(1, min(max_period, n // copies) + 1):
        last, earlier = units[n - 1], units[n - 1 - q]
        if last != earlier and not truncated(last, earlier):
            continue
        j = n - 2
        while j - q >= 0 and units[j] == units[j - q]:
            j -= 1
        covered = (n - 1 - j) + q  # units j+1 … n-1 repeat the q units before them
        if covered >= copies * q and sum(len("".join(u)) for u in units[n - covered :]) >= LOOP_MIN_CHARS:
            return True
    return False
