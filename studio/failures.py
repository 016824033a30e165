"""The failure-case browser's data: an evaluation run folder → one row per problem, and its traces.

Reads the report JSON that specfuse.eval.cli writes (`eval-*.json`: outcomes with system, problem,
predicted, correct, gold, traces) defensively, since its format may grow, and finds each trace at
the path it names or at `<runs>/<system>/<problem>.json`. Knows nothing about Gradio or models.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

ENSEMBLE = "ensemble"
SINGLE = "single-"
FILTERS = ("all problems", "ensemble wrong, best member right", "ensemble right, best member wrong")


@dataclass(frozen=True)
class Outcome:
    system: str
    problem: str
    predicted: str | None
    correct: bool
    gold: str | None
    trace: Path | None  # the (first) trace of this answer, when it can be found


@dataclass(frozen=True)
class EvalRun:
    folder: Path
    outcomes: tuple[Outcome, ...]
    best_member: str | None  # the single-* system with the most correct answers (its member name)

    def systems(self) -> list[str]:
        return list(dict.fromkeys(o.system for o in self.outcomes))

    def ensemble(self) -> str:
        """The system compared with the best member: `ensemble` when it ran, else the ensemble system
        with the most correct answers (a study may run only named variants)."""
        systems = self.systems()
        if ENSEMBLE in systems:
            return ENSEMBLE
        others = [s for s in systems if not s.startswith(SINGLE) and not re.match(r"sc\d*-", s)]
        right = {s: sum(o.correct for o in self.outcomes if o.system == s) for s in others}
        return max(others, key=lambda s: right[s]) if others else ENSEMBLE

    def get(self, system: str, problem: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.system == system and o.problem == problem), None)


def _reports(folder: Path) -> list[Path]:
    """Evaluation reports (write_reports' JSON: RESULTS-*.json, or eval-*.json from older runs)."""
    found = [p for p in folder.rglob("*.json") if p.name.startswith(("eval-", "RESULTS"))]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _trace_path(folder: Path, system: str, problem: str, named: list[Any]) -> Path | None:
    for name in named:
        if isinstance(name, str) and name:
            for candidate in (Path(name), folder / name):
                if candidate.is_file():
                    return candidate
    for runs in (folder, folder / "runs"):
        candidate = runs / system / f"{problem}.json"
        if candidate.is_file():
            return candidate
    return None


def load_eval(folder: str | Path) -> EvalRun:
    """The newest evaluation report under `folder`; ValueError when there is none or it is unreadable."""
    folder = Path(folder)
    reports = _reports(folder)
    if not reports:
        raise ValueError(f"no evaluation report (eval-*.json) under {folder}")
    try:
        document = json.loads(reports[0].read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{reports[0]} is not a readable report: {e}") from e
    rows = document.get("outcomes") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"{reports[0]} has no outcomes list")
    outcomes = []
    for row in rows:
        if not isinstance(row, dict) or "system" not in row or "problem" not in row:
            continue
        system, problem = str(row["system"]), str(row["problem"])
        traces = row.get("traces") or []
        outcomes.append(
            Outcome(
                system,
                problem,
                None if row.get("predicted") is None else str(row["predicted"]),
                bool(row.get("correct")),
                None if row.get("gold") is None else str(row["gold"]),
                _trace_path(folder, system, problem, traces if isinstance(traces, list) else [traces]),
            )
        )
    return EvalRun(folder, tuple(outcomes), _best_member(outcomes, document))


def _best_member(outcomes: list[Outcome], document: dict[str, Any]) -> str | None:
    named = (document.get("failure_cases") or {}).get("best_member")
    if isinstance(named, str) and named:
        return named
    scores: dict[str, int] = {}
    for o in outcomes:
        if o.system.startswith(SINGLE):
            scores[o.system.removeprefix(SINGLE)] = scores.get(o.system.removeprefix(SINGLE), 0) + o.correct
    return max(scores, key=lambda m: scores[m]) if scores else None


def mark(o: Outcome | None) -> str:
    if o is None:
        return ""
    return f"{o.predicted if o.predicted is not None else '—'} {'✓' if o.correct else '✗'}"


def problems_table(run: EvalRun, which: str = FILTERS[0]) -> pd.DataFrame:
    """One row per problem: the gold answer and each system's answer, ✓ or ✗; filtered by `which`."""
    systems = run.systems()
    best = f"{SINGLE}{run.best_member}" if run.best_member else None
    rows = []
    for problem in dict.fromkeys(o.problem for o in run.outcomes):
        mine, theirs = run.get(run.ensemble(), problem), run.get(best, problem) if best else None
        if which == FILTERS[1] and not (mine and theirs and not mine.correct and theirs.correct):
            continue
        if which == FILTERS[2] and not (mine and theirs and mine.correct and not theirs.correct):
            continue
        gold = next((o.gold for o in run.outcomes if o.problem == problem and o.gold is not None), None)
        rows.append(
            {"problem": problem, "gold": gold or ""} | {s: mark(run.get(s, problem)) for s in systems}
        )
    return pd.DataFrame(rows, columns=["problem", "gold", *systems])
