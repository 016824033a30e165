"""The failure-case browser's data: an evaluation report → one row per problem, and its traces.

Reads an evaluation report (a RESULTS-*.json or eval-*.json file, or the newest under a folder) with
the evaluation's own reader, `specfuse.eval.outcomes.load_outcomes`, and names the best member as the
report does (`specfuse.eval.report.best_single_system`). Finds each answer's trace at the path its
outcome names, at the copy the report shipped for a failure case (`failure_cases[*].system_copy`
and `best_copy`, e.g. results/eval/gsm8k-cases/…), or at `<runs>/<system>/<problem>.json`; a
relative path is tried from the working directory, the folder and the report's own folder. Its
texts are in the session's language (studio.i18n); it knows nothing about Gradio's components or models.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specfuse.eval.ceiling import ceiling, ceiling_lines
from specfuse.eval.outcomes import EvalError, load_outcomes
from specfuse.eval.problems import Outcome
from specfuse.eval.report import best_single_system

from .i18n import _, said

ENSEMBLE = "ensemble"
SINGLE = "single-"
FILTERS = (
    "all problems",
    "ensemble wrong, best member right",
    "ensemble right, best member wrong",
    "with a trace to replay",
)
TOGETHER_S = 60.0  # reports written this close together count as one batch (see _reports)
REPLAY = "▶ replay"  # the table's mark for a problem whose ensemble trace is here


@dataclass(frozen=True)
class EvalRun:
    folder: Path
    outcomes: tuple[Outcome, ...]
    best_member: str | None  # the single-* system with the most correct answers (its member name)
    report: Path | None = None  # the report file read (None: built by hand)
    copies: dict[tuple[str, str], str] = field(default_factory=dict)  # (system, problem) → shipped copy

    def systems(self) -> list[str]:
        return list(dict.fromkeys(o.system for o in self.outcomes))

    def problems(self) -> list[str]:
        return list(dict.fromkeys(o.problem for o in self.outcomes))

    def ensemble(self) -> str:
        """The system compared with the best member: `ensemble` when it ran, else the ensemble system
        with the most correct answers (a study may run only named variants)."""
        systems = self.systems()
        if ENSEMBLE in systems:
            return ENSEMBLE
        others = [s for s in systems if not s.startswith(SINGLE) and not re.match(r"sc\d*-", s)]
        right = {s: sum(o.correct for o in self.outcomes if o.system == s) for s in others}
        return max(others, key=lambda s: right[s]) if others else ENSEMBLE

    def best(self) -> str | None:
        """The best member's system name (`single-<member>`)."""
        return f"{SINGLE}{self.best_member}" if self.best_member else None

    def get(self, system: str | None, problem: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.system == system and o.problem == problem), None)

    def trace(self, o: Outcome) -> Path | None:
        """The (first) trace of this answer, when it can be found."""
        named = [*o.traces, self.copies.get((o.system, o.problem), "")]
        roots = [self.folder, *([self.report.parent] if self.report is not None else [])]
        return _trace_path(roots, o.system, o.problem, named)

    def label(self, system: str) -> str:
        """A column title that says which system is the ensemble and which the best member."""
        if system == self.ensemble():
            return _("{system} (the ensemble)", system=system)
        if system == self.best():
            return _("{member} alone (best member)", member=self.best_member)
        return system

    def note(self) -> str:
        """What the table holds: problems × systems, which is which, how many can be replayed."""
        systems = self.systems()
        shown = ", ".join(self.label(s) for s in _ordered(self, systems))
        ensemble = self.ensemble()
        replayable = sum(1 for p in self.problems() if (o := self.get(ensemble, p)) and self.trace(o))
        where = self.report.name if self.report is not None else str(self.folder)
        text = _(
            "{problems} problems × {systems} systems from {where}: {shown}. {replayable} of them have the "
            "ensemble's trace here ({mark} in the table); the others show both answers without a replay.",
            problems=len(self.problems()),
            systems=len(systems),
            where=where,
            shown=shown,
            replayable=replayable,
            mark=_(REPLAY),
        )
        return text + "".join(f"\n\n{line}" for line in self.ceiling_lines())

    def ceiling_lines(self) -> list[str]:
        """The ceiling of the study (specfuse.eval.ceiling): each member alone, the oracle, β, the
        pairs' co-failure and each ensemble's gains and losses against the best member; none with
        fewer than two members run alone, or without gold answers."""
        if not any(o.gold is not None for o in self.outcomes):
            return []
        found = ceiling(self.outcomes)
        if found is None:
            return []
        first, *rest = ceiling_lines(found)
        return [_("**The ceiling.** {first}", first=said(first)), *map(said, rest)]


def _ordered(run: EvalRun, systems: Sequence[str]) -> list[str]:
    """The ensemble first, the best member second, then the rest as they came."""
    first = [s for s in (run.ensemble(), run.best()) if s is not None and s in systems]
    return [*first, *(s for s in systems if s not in first)]


def _reports(folder: Path) -> list[Path]:
    """Evaluation reports (write_reports' JSON: RESULTS-*.json, eval-*.json from older runs, or any
    JSON with its results page `<stem>.md` beside it, as results/eval/ names them: gsm8k.json).

    The newest first; of those written within a minute of it (a fresh clone writes them all at
    once), the largest: the main study, not a small side one.
    """
    if folder.is_file():
        return [folder]
    found = [
        p
        for p in folder.rglob("*.json")
        if p.name.startswith(("eval-", "RESULTS")) or p.with_suffix(".md").is_file()
    ]
    if not found:
        return []
    newest = max(p.stat().st_mtime for p in found)
    recent = [p for p in found if p.stat().st_mtime >= newest - TOGETHER_S]
    first = max(recent, key=lambda p: p.stat().st_size)
    return [first, *sorted((p for p in found if p != first), key=lambda p: -p.stat().st_mtime)]


def _candidates(root: Path, name: str) -> Iterable[Path]:
    """`name` under root, and each shorter tail of it (`results/eval/gsm8k-cases/…` under results/eval/)."""
    parts = Path(name).parts
    for i in range(len(parts)):
        yield root.joinpath(*parts[i:])


def _trace_path(roots: Sequence[Path], system: str, problem: str, named: Sequence[str]) -> Path | None:
    for name in named:
        if not name:
            continue
        if Path(name).is_file():
            return Path(name)
        for root in roots:
            for candidate in _candidates(root, name):
                if candidate.is_file():
                    return candidate
    for runs in (roots[0], roots[0] / "runs"):
        candidate = runs / system / f"{problem}.json"
        if candidate.is_file():
            return candidate
    return None


def _shipped_copies(report: Path) -> dict[tuple[str, str], str]:
    """(system, problem) → the trace copy the report shipped for each failure case, both ways."""
    try:
        cases = json.loads(report.read_text(encoding="utf-8")).get("failure_cases") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    copies: dict[tuple[str, str], str] = {}
    for system, found in cases.items() if isinstance(cases, dict) else ():
        if not isinstance(found, dict):
            continue
        best = f"{SINGLE}{found.get('best_member')}"
        for kind in ("wrong_best_right", "right_best_wrong"):
            for case in found.get(kind) or ():
                if not isinstance(case, dict) or not isinstance(case.get("problem"), str):
                    continue
                for key, owner in (("system_copy", system), ("best_copy", best)):
                    if isinstance(case.get(key), str):
                        copies.setdefault((owner, case["problem"]), case[key])
    return copies


def load_eval(folder: str | Path) -> EvalRun:
    """The report at `folder` (a file) or the newest under it; ValueError when none or unreadable."""
    folder = Path(folder)
    reports = _reports(folder)
    if not reports:
        raise ValueError(
            f"no evaluation report (RESULTS-*.json, eval-*.json or x.json beside x.md) under {folder}"
        )
    try:
        outcomes = load_outcomes(reports[0])
    except EvalError as e:
        raise ValueError(str(e)) from e
    best = best_single_system(outcomes)
    return EvalRun(
        folder if folder.is_dir() else folder.parent,
        tuple(outcomes),
        best.removeprefix(SINGLE) if best is not None else None,
        reports[0],
        _shipped_copies(reports[0]),
    )


def mark(o: Outcome | None) -> str:
    if o is None:
        return ""
    return f"{o.predicted if o.predicted is not None else '—'} {'✓' if o.correct else '✗'}"


def problems_table(run: EvalRun, which: str = FILTERS[0]) -> pd.DataFrame:
    """One row per problem: the gold answer and each system's answer, ✓ or ✗; filtered by `which`.

    The ensemble's column comes first and the best member's second, each titled as such; the last
    column marks the problems whose ensemble trace can be replayed here.
    """
    systems = _ordered(run, run.systems())
    by = {(o.system, o.problem): o for o in run.outcomes}
    ensemble, best = run.ensemble(), run.best()
    rows = []
    for problem in run.problems():
        mine, theirs = by.get((ensemble, problem)), by.get((best, problem)) if best else None
        if which == FILTERS[1] and not (mine and theirs and not mine.correct and theirs.correct):
            continue
        if which == FILTERS[2] and not (mine and theirs and mine.correct and not theirs.correct):
            continue
        found = mine is not None and run.trace(mine) is not None
        if which == FILTERS[3] and not found:
            continue
        gold = next((o.gold for o in run.outcomes if o.problem == problem and o.gold is not None), None)
        rows.append(
            [problem, gold or "", *(mark(by.get((s, problem))) for s in systems), _(REPLAY) if found else ""]
        )
    heads = [_("problem"), _("gold"), *(run.label(s) for s in systems), _("trace")]
    return pd.DataFrame(rows, columns=heads)
