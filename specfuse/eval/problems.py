"""Problems and answers: GSM8K JSONL and open-ended prompts, answer extraction, the Outcome record.

Stdlib only; knows nothing about models, runs or reports.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecfuseError

INSTRUCTION = 'Solve the problem step by step. End your reply with "The answer is N." where N is a number.'
_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?"
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*[:=]?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)


class DataError(SpecfuseError):
    """A data file that is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    id: str  # "gsm8k-0007": the 0-based line number in the data file
    question: str
    gold: str | None  # the final number after "#### ", normalized; None for an open-ended prompt
    raw: bool = False  # the question is the whole prompt (open-ended): no answer-format instruction
    # IFEval: the verifiable instructions the reply must follow, as (instruction id, kwargs as JSON)
    instructions: tuple[tuple[str, str], ...] = ()

    @property
    def prompt(self) -> str:
        return self.question if self.raw else build_prompt(self.question)


@dataclass(frozen=True)
class Outcome:
    """One system's answer to one problem, as recomputed from its trace(s)."""

    system: str
    problem: str
    predicted: str | None
    correct: bool
    seconds: float  # Σ over the traces (K samples for self-consistency)
    rounds: int
    draft_calls: int
    traces: tuple[str, ...]
    gold: str | None = None
    answer: str = ""  # the reply (self-consistency: the first sample that gave the voted answer)
    error: str | None = None  # why the run failed (then predicted is None and correct False)
    # IFEval: per instruction, whether the answer follows it (strict, and the checker's loose reading);
    # correct is then "all followed, strict"
    followed: tuple[bool, ...] = ()
    followed_loose: tuple[bool, ...] = ()
    verify_calls: int = 0  # Σ verifiers over the rounds: verify="disagree" saves some


# -- data and answers --------------------------------------------------------------------------------


def parse_rows(text: str) -> range:
    """'0:300' → range(0, 300); 'A:B' rows A..B-1 of a data file, 0-based (--rows)."""
    try:
        first, last = (int(part) for part in text.split(":"))
    except ValueError:
        raise DataError(f"--rows takes FIRST:END (0-based, END excluded), e.g. 0:300; got {text!r}") from None
    if not 0 <= first < last:
        raise DataError(f"--rows {text!r}: need 0 ≤ FIRST < END")
    return range(first, last)


def load_problems(
    path: str | os.PathLike[str], limit: int | None = None, rows: range | None = None
) -> list[Problem]:
    """The problems of a GSM8K JSONL file (question, answer ending in "#### N"): the first `limit`
    of those on `rows` (0-based line numbers; None: all). A problem's id is its line number, so runs
    of different row ranges pair up."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no data file at {str(path)!r}; give the GSM8K JSONL with --data")
    problems: list[Problem] = []
    number = 0
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if rows is not None and number - 1 >= rows.stop:
                break
            if not line.strip() or (rows is not None and number - 1 not in rows):
                continue
            try:
                row = json.loads(line)
                question, answer = row["question"], row["answer"]
                if not isinstance(question, str) or not isinstance(answer, str) or "####" not in answer:
                    raise ValueError("expected text fields, the answer ending in '#### N'")
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{path.name}:{number}: malformed line ({type(e).__name__}: {e})") from e
            gold = normalize_number(answer.rsplit("####", 1)[1])
            if gold is None:
                raise DataError(f"{path.name}:{number}: no number after '####'")
            problems.append(Problem(f"gsm8k-{number - 1:04d}", question, gold))
            if limit is not None and len(problems) >= limit:
                break
        else:  # the file ended before the rows or the limit did
            if rows is not None and number < rows.stop:
                raise DataError(f"{path.name} has {number} lines; --rows asks up to row {rows.stop - 1}")
    if not problems:
        raise DataError(f"{path.name} holds no problems")
    return problems


def build_prompt(question: str) -> str:
    """The same prompt for every system: the question, then the answer-format instruction."""
    return f"{question.strip()}\n\n{INSTRUCTION}"


def normalize_number(text: str) -> str | None:
    """'$1,234.50' → '1234.5', '18.00' → '18', '-3' → '-3'; None when there is no number."""
    found = _ANY_NUMBER.search(text)
    if found is None:
        return None
    raw = re.sub(r"[\s$,]", "", found.group(0))
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return str(int(value)) if value == int(value) else f"{value:g}"


def extract_answer(text: str) -> str | None:
    """The final number of a reply: the last one after "answer is", else the last number at all."""
    stated = _ANSWER_IS.findall(text)
    if stated:
        return normalize_number(stated[-1])
    numbers = _ANY_NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-missing answer; ties go to the one given first (lowest seed)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


OPEN_PROMPTS = (
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "用一句话介绍长城。",
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for learning a new language, one sentence each.",
)


def open_problems(path: str | os.PathLike[str] | None = None) -> list[Problem]:
    """Open-ended prompts (no gold): one per non-empty line of `path`, or OPEN_PROMPTS."""
    if path is None:
        prompts = list(OPEN_PROMPTS)
    else:
        try:
            prompts = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read prompts from {str(path)!r}: {e}") from e
        prompts = [p for p in prompts if p]
        if not prompts:
            raise DataError(f"{Path(path).name} holds no prompts")
    return [Problem(f"open-{i:02d}", p, None, raw=True) for i, p in enumerate(prompts)]
