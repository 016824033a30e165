"""The evaluation's report: summary and paired tables, Plotly charts, failure cases, written beside the
Markdown page (specfuse.eval.page).

Works on Outcome lists (specfuse.eval.problems) and the pure statistics of specfuse.eval.stats; knows
nothing about models or how the runs were made.
"""

from __future__ import annotations

import datetime
import html
import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import ifeval
from .ceiling import ceiling
from .page import results_page
from .stats import paired, text_metrics, wilson
from .variants import describe

if TYPE_CHECKING:
    from ..config import EnsembleConfig
    from .problems import Outcome, Problem

log = logging.getLogger(__name__)


def _by_system(outcomes: Sequence[Outcome]) -> dict[str, list[Outcome]]:
    out: dict[str, list[Outcome]] = {}
    for o in outcomes:
        out.setdefault(o.system, []).append(o)
    return out


def summary_rows(outcomes: Sequence[Outcome], graded: bool = True) -> list[dict[str, Any]]:
    """One row per system: accuracy with its Wilson 95 % interval (when graded), loop share,
    distinct-2/3, models drafting per round, seconds per problem, failed runs."""
    rows = []
    for system, mine in _by_system(outcomes).items():
        n, correct = len(mine), sum(o.correct for o in mine)
        low, high = wilson(correct, n)
        rounds = sum(o.rounds for o in mine)
        row: dict[str, Any] = {"system": system, "problems": n}
        if graded:
            row |= {"correct": correct, "accuracy": correct / n, "ci_low": low, "ci_high": high}
        if any(o.followed for o in mine):  # IFEval: accuracy is prompt_strict; the paper's four beside it
            row |= ifeval.metrics(mine)
        row |= text_metrics([o.answer for o in mine])
        row |= {
            "models_drafting_per_round": sum(o.draft_calls for o in mine) / rounds if rounds else 0.0,
            "verify_passes_per_round": sum(o.verify_calls for o in mine) / rounds if rounds else 0.0,
            "seconds_per_problem": sum(o.seconds for o in mine) / n,
            "errors": sum(o.error is not None for o in mine),
        }
        rows.append(row)
    return rows


def best_single_system(outcomes: Sequence[Outcome]) -> str | None:
    """The single-<member> system with the most correct answers (ties: the first listed)."""
    singles = [(s, rows) for s, rows in _by_system(outcomes).items() if s.startswith("single-")]
    if not singles:
        return None
    return max(singles, key=lambda item: (sum(o.correct for o in item[1]), -singles.index(item)))[0]


def paired_rows(outcomes: Sequence[Outcome], baselines: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Each system against each baseline (default: the best single member, and `paper` when present),
    on the problems both answered: the four cells, the accuracy difference and McNemar's p."""
    systems = _by_system(outcomes)
    if baselines is None:
        best = best_single_system(outcomes)
        baselines = [b for b in (best, "paper") if b is not None and b in systems]
    rows = []
    for baseline in baselines:
        theirs = {o.problem: o.correct for o in systems[baseline]}
        for system, mine in systems.items():
            if system == baseline:
                continue
            shared = [o for o in mine if o.problem in theirs]
            stats = paired([o.correct for o in shared], [theirs[o.problem] for o in shared])
            rows.append(
                {
                    "system": system,
                    "baseline": baseline,
                    "problems": stats["problems"],
                    "both_right": stats["both_right"],
                    "only_system": stats["only_a"],
                    "only_baseline": stats["only_b"],
                    "both_wrong": stats["both_wrong"],
                    "difference": stats["difference"],
                    "p_value": stats["p_value"],
                }
            )
    return rows


def failure_cases(outcomes: Sequence[Outcome], system: str = "ensemble") -> dict[str, Any]:
    """Problems where `system` was wrong and the best single member right, and the reverse."""
    best = best_single_system(outcomes)
    mine = {o.problem: o for o in outcomes if o.system == system}
    if best is None or not mine:
        return {"system": system, "best_member": None, "wrong_best_right": [], "right_best_wrong": []}
    theirs = {o.problem: o for o in outcomes if o.system == best}

    def case(pid: str) -> dict[str, Any]:
        return {
            "problem": pid,
            "gold": mine[pid].gold,
            "system_answer": mine[pid].predicted,
            "best_answer": theirs[pid].predicted,
            "system_trace": mine[pid].traces[0] if mine[pid].traces else None,
            "best_trace": theirs[pid].traces[0] if theirs[pid].traces else None,
        }

    shared = [p for p in mine if p in theirs]
    return {
        "system": system,
        "best_member": best.removeprefix("single-"),
        "wrong_best_right": [case(p) for p in shared if not mine[p].correct and theirs[p].correct],
        "right_best_wrong": [case(p) for p in shared if mine[p].correct and not theirs[p].correct],
    }


def copy_cases(cases: dict[str, Any], dest: Path, limit: int = 6) -> int:
    """Copy up to `limit` traces of each failure list under `dest` (for the repository and the app)."""
    copied = 0
    for kind in ("wrong_best_right", "right_best_wrong"):
        for case in cases[kind][:limit]:
            for key in ("system_trace", "best_trace"):
                if not case.get(key):
                    continue
                source = Path(case[key])
                target = dest / kind / f"{source.parent.name}-{source.name}"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                case[key.replace("trace", "copy")] = str(target)
                copied += 1
    return copied


def _with(stem: Path, suffix: str) -> Path:
    return stem.with_name(stem.name + suffix)  # model names hold dots: never with_suffix


def write_reports(
    outcomes: Sequence[Outcome],
    problems: Sequence[Problem],
    report_dir: str | Path,
    name: str,
    png: bool = True,
    *,
    title: str | None = None,
    command: str | None = None,
    config: EnsembleConfig | None = None,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    cases: int = 6,
) -> dict[str, Any]:
    """Write `<name>.md` (the results page), `.csv` (summary), `-paired.csv`, `.json` (everything,
    outcomes included: `load_outcomes` reads it), `.html`/`.png` charts and `<name>-cases/` traces.

    Problems without gold (open-ended prompts) get no accuracy, paired statistics or failure cases.
    """
    import pandas as pd

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    stem = report_dir / name
    graded = any(p.gold is not None for p in problems)
    summary = summary_rows(outcomes, graded)
    pd.DataFrame(summary).to_csv(_with(stem, ".csv"), index=False)
    pairs = paired_rows(outcomes) if graded else []
    if pairs:
        pd.DataFrame(pairs).to_csv(_with(stem, "-paired.csv"), index=False)
    systems = list(_by_system(outcomes))
    compared = [s for s in systems if not s.startswith(("single-", "sc"))] if graded else []
    failures = {s: failure_cases(outcomes, s) for s in compared}
    for system, found in failures.items():
        copy_cases(found, report_dir / f"{name}-cases" / system, cases)
    document: dict[str, Any] = {
        "title": title or name,
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "problems": len(problems),
        "config": config.to_dict() if config is not None else None,
        "systems": {s: d for s, d in describe(variants).items() if s in systems},
        "summary": summary,
        "paired": pairs,
        "ceiling": ceiling(outcomes) if graded else None,
        "failure_cases": failures,
        "outcomes": [o.__dict__ | {"traces": list(o.traces)} for o in outcomes],
    }
    if any(p.instructions for p in problems):  # IFEval
        document["by_group"] = ifeval.by_group(outcomes, problems)
        pd.DataFrame(document["by_group"]).to_csv(_with(stem, "-groups.csv"), index=False)
    _with(stem, ".json").write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    document["charts"] = _charts(
        summary, pairs, stem, document["title"], graded, png, document.get("by_group"), document["ceiling"]
    )
    _with(stem, ".md").write_text(results_page(document, outcomes, problems, name))
    return document


def _charts(
    summary: Sequence[dict[str, Any]],
    pairs: Sequence[dict[str, Any]],
    stem: Path,
    title: str,
    graded: bool,
    png: bool,
    by_group: Sequence[dict[str, Any]] | None = None,
    limit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    import plotly.graph_objects as go

    figures: dict[str, Any] = {}
    names = [r["system"] for r in summary]
    if graded:
        figures[""] = go.Figure(
            go.Bar(
                x=names,
                y=[r["accuracy"] for r in summary],
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [r["ci_high"] - r["accuracy"] for r in summary],
                    "arrayminus": [r["accuracy"] - r["ci_low"] for r in summary],
                },
                text=[f"{r['accuracy']:.0%}" for r in summary],
            )
        ).update_layout(
            title=f"{title} (95 % Wilson intervals)", yaxis={"title": "accuracy", "range": [0, 1]}
        )
    else:
        figures[""] = go.Figure(
            [
                go.Bar(name="loop share", x=names, y=[r["loop_share"] for r in summary]),
                go.Bar(name="distinct-2", x=names, y=[r["distinct_2"] for r in summary]),
                go.Bar(name="distinct-3", x=names, y=[r["distinct_3"] for r in summary]),
            ]
        ).update_layout(title=title, barmode="group", yaxis={"range": [0, 1]})
    if pairs:
        first = pairs[0]["baseline"]
        rows = [r for r in pairs if r["baseline"] == first]
        figures["-paired"] = go.Figure(
            go.Bar(
                x=[r["system"] for r in rows],
                y=[r["difference"] for r in rows],
                text=[f"+{r['only_system']} / −{r['only_baseline']}, p={r['p_value']:.3g}" for r in rows],
            )
        ).update_layout(
            title=f"accuracy minus {first}'s on the same problems (+only system / −only baseline, McNemar p)",
            yaxis={"title": "accuracy difference"},
        )
    if by_group:
        groups = [html.escape(r["instruction group"]) for r in by_group]  # ids come from the data file
        figures["-groups"] = go.Figure(
            [go.Bar(name=system, x=groups, y=[r[system] for r in by_group]) for system in names]
        ).update_layout(
            title="instruction-level strict accuracy by instruction group",
            barmode="group",
            yaxis={"title": "instructions followed", "range": [0, 1]},
        )
    if limit:
        figures["-ceiling"] = _ceiling_chart(limit)
    return _write_charts(figures, stem, png)


def _write_charts(figures: dict[str, Any], stem: Path, png: bool) -> dict[str, Any]:
    """Each figure written beside the results as HTML (and PNG if asked): the files' paths, by kind."""
    done: dict[str, Any] = {}
    for suffix, figure in figures.items():
        axis = "instruction group" if suffix == "-groups" else "system"
        figure.update_layout(xaxis={"title": axis}, width=900, height=500)
        path = _with(stem, suffix + ".html")
        figure.write_html(path, include_plotlyjs="cdn")
        done[f"html{suffix}"], done[f"png{suffix}"] = str(path), None
        if png:
            try:
                figure.write_image(_with(stem, suffix + ".png"))
                done[f"png{suffix}"] = str(_with(stem, suffix + ".png"))
            except Exception as e:  # kaleido missing or no Chrome: the HTML still stands
                done["png_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning("PNG export failed (%s); the HTML chart is at %s", done["png_error"], path)
    return done


def _ceiling_chart(limit: dict[str, Any]) -> Any:
    """Each member's and ensemble's accuracy beside the oracle (1 − β): how much of the room the
    members leave the ensemble took."""
    import plotly.graph_objects as go

    rows = [(f"{r['member']} alone", r["accuracy"]) for r in limit["members"]]
    rows += [(d["system"], d["accuracy"]) for d in limit["discordance"]]
    names, accuracy = [html.escape(n) for n, _ in rows], [a for _, a in rows]
    figure = go.Figure(go.Bar(x=names, y=accuracy, text=[f"{a:.0%}" for a in accuracy]))
    figure.add_hline(
        y=limit["oracle"],
        line_dash="dash",
        annotation_text=f"oracle = 1 − β = {limit['oracle']:.0%} (at least one member right)",
    )
    return figure.update_layout(
        title=f"the ceiling: {limit['problems']} problems every member answered",
        yaxis={"title": "accuracy", "range": [0, 1]},
    )
