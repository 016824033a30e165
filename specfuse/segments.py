"""Text rules for a candidate segment: word-boundary trimming, stop strings, UTF-8-safe endings;
and the one definition of a loop (an answer ending in one block of text repeated over and over),
shared by the engine's loop guard (which keeps a candidate from extending one) and the evaluation's
loop share (which counts answers that end in one).

Pure functions on strings, stdlib only. Knows nothing about tokens: members.py decodes, these cut.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what a tokenizer's decode yields for an incomplete UTF-8 sequence


def is_word_char(ch: str) -> bool:
    """Letters, digits and `_`, but not ideographs or kana: CJK text has no spaces, so every one of
    its characters ends a word (trimming never has to cut inside CJK)."""
    if ch == "_":
        return True
    if not ch.isalnum():
        return False
    name = unicodedata.name(ch, "")
    return not name.startswith(("CJK", "HIRAGANA", "KATAKANA", "HANGUL", "IDEOGRAPHIC"))


def trim_to_word_boundary(text: str) -> str:
    """Cut a non-final candidate back so that it does not end inside a word.

    A draft that stopped at the token limit may end in a half word (`eggs_per_` of
    `eggs_per_breakfast`). If the text ends in a word character, the trailing word and the
    whitespace before it are cut off (the next round starts with " word", as tokenizers like it).
    A text that is a single word is kept whole: trimming never leaves nothing. Every character
    kept is kept exactly (no stripping, no replacement).
    """
    if not text or not is_word_char(text[-1]):
        return text
    cut = len(text)
    while cut > 0 and is_word_char(text[cut - 1]):
        cut -= 1
    while cut > 0 and text[cut - 1].isspace():
        cut -= 1
    return text[:cut] if cut > 0 else text


def cut_at_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Index of the earliest stop string found at or after `start`, or None."""
    found = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(found) if found else None


def strip_incomplete_tail(pieces: Sequence[str]) -> int:
    """How many trailing decoded pieces to drop so the text does not end in a broken character.

    `pieces[t]` is the decode of the first t+1 tokens. A byte-level tokenizer may split a
    multi-byte character across tokens; until its last byte arrives the decode ends in U+FFFD.
    Returns the number of tokens to keep (at least 1 when there is any token).
    """
    keep = len(pieces)
    while keep > 1 and pieces[keep - 1].endswith(REPLACEMENT):
        keep -= 1
    return keep


ECHO_MIN_CHARS = 16


def echoes_prompt(prompt: str, answer: str, text: str, min_chars: int = ECHO_MIN_CHARS) -> bool:
    """Whether appending `text` would leave an answer that is only a verbatim piece of the prompt.

    Small models often open by repeating the question, and every verifier finds copied text easy
    to predict, so a pure echo scores high and, once chosen, pulls the others into copying too.
    """
    whole = (answer + text).strip()
    return len(whole) >= min_chars and whole in prompt


_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """Lower-cased words and single punctuation marks: the units of the repetition measures."""
    return _WORD.findall(text.lower())


def repeated_fraction(answer: str, text: str, n: int = 3) -> float:
    """The share of the word n-grams that `text` adds which the answer already holds.

    An n-gram counts as added when it ends inside `text` (so one that straddles the boundary
    counts too). 0.0 for fresh text (or text too short to form an n-gram), 1.0 when every added
    n-gram repeats an earlier one: the signature of a loop, which likelihood-based verifiers reward
    because text that already appeared is easy to predict.
    """
    before = words(answer)
    added = words(text)
    if not added:
        return 0.0
    both = before + added
    seen = {tuple(both[i : i + n]) for i in range(len(before) - n + 1)}
    first_new = max(0, len(before) - n + 1)
    grams = [tuple(both[i : i + n]) for i in range(first_new, len(both) - n + 1)]
    if not grams:
        return 0.0
    repeats = 0
    for gram in grams:  # a repeat inside the candidate itself counts as well
        repeats += gram in seen
        seen.add(gram)
    return repeats / len(grams)


def agreement(candidates: Sequence[tuple[str, bool]]) -> int | None:
    """The candidate every drafter agrees with, as (text, ends the answer) pairs: the shortest text
    when it is not blank and every other text begins with it (all the same text is the plain case).
    None when they disagree, including on whether the answer ends here: a shortest text that ends
    the answer agrees only with copies that end it too. Ties go to the first candidate."""
    if len(candidates) < 2:
        return None
    shortest = min(len(text) for text, _ in candidates)
    tied = [j for j, (text, _) in enumerate(candidates) if len(text) == shortest]
    text = candidates[tied[0]][0]
    if not text.strip() or any(not other.startswith(text) for other, _ in candidates):
        return None
    ends = {candidates[j][1] for j in tied}
    if len(ends) > 1 or (True in ends and len(tied) < len(candidates)):
        return None
    return tied[0]


def stop_string_cut(answer: str, text: str, stops: Sequence[str]) -> int | None:
    """Where in `text` the answer must end because a stop string appears (it may begin in `answer`)."""
    if not stops:
        return None
    reach = max(len(s) for s in stops) - 1
    lead = answer[-reach:] if reach > 0 else ""
    found = cut_at_stop(lead + text, stops)
    return None if found is None else max(0, found - len(lead))


# -- loops: an answer that ends in one block of text repeated over and over ---------------------------

LOOP_COPIES = 3  # a block seen this many times in a row at the end is a loop
LOOP_MAX_UNITS = 8  # the longest block, in sentences or lines
LOOP_MAX_WORDS = 24  # the longest block, in words (for loops inside one endless line)
LOOP_MIN_CHARS = 20  # the repeated stretch must hold this many characters ("Yes. Yes. Yes." is not a loop)

_LOOP_WORD = re.compile(r"\w+(?:[.,']\w+)*")  # "1,250", "3.5", "don't" stay one word; CJK runs are one word
_UNIT_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])|\n+")
_LETTER = re.compile(r"[^\W\d_]")


def loop_words(text: str) -> list[str]:
    """Lower-cased words: runs of letters and digits (punctuation dropped, "1,250" kept whole)."""
    return _LOOP_WORD.findall(text.lower())


def ends_in_loop(text: str, copies: int = LOOP_COPIES) -> bool:
    """Whether an answer ends in repetition: its end is one block repeated ≥ `copies` (3) times in a row.

    Definition. Split the answer into units: sentences (ending in . ! ? before white space, or in
    。！？) and lines; compare units by their lower-cased words (`loop_words()`, punctuation dropped) and
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
    units = [tuple(loop_words(piece)) for piece in _UNIT_END.split(text)]
    units = [u for u in units if any(_LETTER.search(w) for w in u)]
    if _repeats_at_end(units, LOOP_MAX_UNITS, copies, lambda last, earlier: earlier[: len(last)] == last):
        return True
    flat = loop_words(text)
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
