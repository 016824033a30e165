"""The failure-case browser's data: an evaluation run folder → one row per problem, and its traces.

Reads the newest evaluation report under the folder (RESULTS-*.json, or eval-*.json from older
runs) with the evaluation's own reader, `specfuse.eval.runs.load_outcomes`, and names the best
member as the report does (`specfuse.eval.report.best_single_system`). Finds each answer's trace at
the path its outcome names, or at `<runs>/<system>/<problem>.json`. Knows nothing about Gradio or
models.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specfuse.eval.problems import Outcome
from specfuse.eval.report import best_single_system
from specfuse.eval.runs import EvalError, load_outcomes

ENSEMBLE = "ensemble"
SINGLE = "single-"
FILTERS = ("all problems", "ensemble wrong, best member right", "ensemble right, best member wrong")


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

    def trace(self, o: Outcome) -> Path | None:
        """The (first) trace of this answer, when it can be found."""
        return _trace_path(self.folder, o.system, o.problem, o.traces)


def _reports(folder: Path) -> list[Path]:
    """Evaluation reports (write_reports' JSON: RESULTS-*.json, or eval-*.json from older runs)."""
    found = [p for p in folder.rglob("*.json") if p.name.startswith(("eval-", "RESULTS"))]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _trace_path(folder: Path, system: str, problem: str, named: Sequence[str]) -> Path | None:
    for name in named:
        if name:
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
        raise ValueError(f"no evaluation report (RESULTS-*.json or eval-*.json) under {folder}")
    try:
        outcomes = load_outcomes(reports[0])
    except EvalError as e:
        raise ValueError(str(e)) from e
    best = best_single_system(outcomes)
    return EvalRun(folder, tuple(outcomes), best.removeprefix(SINGLE) if best is not None else None)


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
