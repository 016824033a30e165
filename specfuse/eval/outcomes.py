"""An evaluation's outcomes: each system's answer to each problem graded from its traces (outcome_of),
and an evaluation read back for the views (load_outcomes: a report JSON or a --runs folder;
systems_of, disagreements).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import SpecfuseError, TraceError
from ..trace import Trace, load_trace
from .ifeval import grade, load_ifeval
from .problems import Outcome, Problem, extract_answer, load_problems, majority

log = logging.getLogger(__name__)


class EvalError(SpecfuseError):
    """An evaluation's files that cannot be used: traces on disk that do not match the requested
    systems, a report or a data file that cannot be read."""


def outcome_of(system: str, problem: Problem, runs: Sequence[tuple[Path, Trace | str]]) -> Outcome:
    """One system's answer to one problem, graded from its runs (traces, or the errors that ended them):
    GSM8K's number (the majority over self-consistency samples), IFEval's instructions followed."""
    traces = [(p, t) for p, t in runs if isinstance(t, Trace)]
    errors = [t for _, t in runs if isinstance(t, str)]
    results = [t.result for _, t in traces]
    figures: dict[str, Any] = dict(
        system=system,
        problem=problem.id,
        seconds=sum(r.seconds for r in results),
        rounds=sum(r.rounds for r in results),
        draft_calls=sum(r.draft_calls for r in results),
        verify_calls=sum(r.verify_calls for r in results),
        traces=tuple(str(p) for p, _ in traces),
        gold=problem.gold,
        error="; ".join(errors) or None,
    )
    if problem.instructions:
        # IFEval: the checker's verdict per instruction on the (first) answer; a failed run follows
        # none of them, so it still counts in the instruction-level denominators.
        answer = results[0].answer if results and not errors else ""
        strict, loose = grade(problem, answer) if answer else ((False,) * len(problem.instructions),) * 2
        return Outcome(
            **figures, predicted=f"{sum(strict)}/{len(strict)} followed", correct=all(strict),
            answer=answer, followed=strict, followed_loose=loose,
        )  # fmt: skip
    answers = [extract_answer(r.answer) for r in results]
    predicted = (answers[0] if len(answers) == 1 else majority(answers)) if not errors else None
    answer = next(
        (r.answer for r, a in zip(results, answers) if a == predicted), results[0].answer if results else ""
    )
    correct = predicted is not None and predicted == problem.gold
    return Outcome(**figures, predicted=predicted, correct=correct, answer=answer)


def load_outcomes(path: str | os.PathLike[str], data: str | os.PathLike[str] | None = None) -> list[Outcome]:
    """Outcomes from a report JSON (write_reports) or from a --runs folder of traces.

    From a folder, systems are named by their folders (`ensemble@a+b` → `ensemble` when only one
    mix is present; `sc-<m>` with K samples → `sc<K>-<m>`), and gold comes from `data` (a GSM8K
    JSONL) when given; without it gold is None and no outcome counts as correct.
    """
    path = Path(path)
    if path.is_file():
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            return [_report_outcome(row) for row in document["outcomes"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EvalError(f"{path.name} is not an evaluation report: {e}") from e
    if not path.is_dir():
        raise EvalError(f"no report or runs folder at {str(path)!r}")
    known = {p.id: p for p in _read_problems(data)} if data is not None else {}
    folders = sorted(d for d in path.iterdir() if d.is_dir())
    mixes = Counter(d.name.split("@", 1)[0] for d in folders)
    outcomes = []
    for folder in folders:
        runs: dict[str, list[tuple[Path, Trace | str]]] = {}
        for file in sorted(folder.glob("*.json")):
            stem = file.name.removesuffix(".json")
            error = stem.endswith(".error")
            pid = re.sub(r"-s\d+$", "", stem.removesuffix(".error"))
            if error:
                try:
                    runs.setdefault(pid, []).append((file, str(json.loads(file.read_text())["error"])))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            else:
                try:
                    runs.setdefault(pid, []).append((file, load_trace(file)))
                except TraceError as e:
                    log.warning("skipping %s: %s", file, e)
        base = folder.name.split("@", 1)[0]
        for pid, found in runs.items():
            system = base if mixes[base] == 1 else folder.name
            if folder.name.startswith("sc-"):
                system = f"sc{len(found)}-{folder.name.removeprefix('sc-')}"
            problem = known.get(pid) or Problem(pid, "", None)
            outcomes.append(outcome_of(system, problem, found))
    return outcomes


def _read_problems(data: str | os.PathLike[str]) -> list[Problem]:
    """GSM8K or IFEval rows (told apart by the first row's fields), every row of the file."""
    if not Path(data).is_file():
        raise EvalError(f"no data file at {str(data)!r}")
    with open(data, encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
    return load_ifeval(data, rows=None) if '"instruction_id_list"' in first else load_problems(data)


# A report row needs system, problem, predicted and correct; the run figures may be left out (a report
# written by hand or by another tool), and keys this version does not know are ignored.
_OPTIONAL: dict[str, Any] = {"seconds": 0.0, "rounds": 0, "draft_calls": 0, "traces": ()}


def _report_outcome(row: Any) -> Outcome:
    if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("system", "problem")):
        raise ValueError(f"an outcome without a system and a problem: {str(row)[:200]}")
    known = {k: v for k, v in row.items() if k in Outcome.__dataclass_fields__}
    traces = known.get("traces") or ()
    known |= {k: tuple(map(bool, known[k])) for k in ("followed", "followed_loose") if k in known}
    return Outcome(**_OPTIONAL | known | {"traces": (traces,) if isinstance(traces, str) else tuple(traces)})


def systems_of(outcomes: Iterable[Outcome]) -> list[str]:
    return list(dict.fromkeys(o.system for o in outcomes))


def disagreements(outcomes: Sequence[Outcome], a: str, b: str) -> dict[str, list[tuple[Outcome, Outcome]]]:
    """Problems where exactly one of systems a and b is right: {"only_a": [...], "only_b": [...]}."""
    mine = {o.problem: o for o in outcomes if o.system == a}
    theirs = {o.problem: o for o in outcomes if o.system == b}
    shared = [p for p in mine if p in theirs]
    return {
        "only_a": [(mine[p], theirs[p]) for p in shared if mine[p].correct and not theirs[p].correct],
        "only_b": [(mine[p], theirs[p]) for p in shared if theirs[p].correct and not mine[p].correct],
    }
