"""An evaluation's report document as text: the Markdown results page (results_page) and the
terminal's summary (console_summary). Model text and names are escaped wherever they become Markdown.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .ceiling import ceiling_lines

if TYPE_CHECKING:
    from .problems import Outcome, Problem


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a GitHub Markdown table, floats to 3 decimals (no tabulate dependency)."""
    if not rows:
        return ""
    keys = list(rows[0])

    def cell(v: Any) -> str:
        if v is None:
            return "–"
        return f"{v:.3f}" if isinstance(v, float) else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _esc(text: str) -> str:
    """Model text and names inside Markdown: escaped as HTML, no table pipes, one line."""
    return html.escape(text).replace("|", "\\|").replace("\n", " ⏎ ")


def results_page(
    document: dict[str, Any], outcomes: Sequence[Outcome], problems: Sequence[Problem], name: str
) -> str:
    """The Markdown results page: how to rerun, the systems, the tables, the charts, the cases."""
    lines = [f"# {_esc(document['title'])}", ""]
    lines += [f"{document['date']}; {document['problems']} problems.", ""]
    if document["command"]:
        lines += ["Rerun (traces on disk are loaded, not re-run):", "", "```", document["command"], "```", ""]
    lines += ["## Systems", ""]
    lines += [f"- `{s}`: {_esc(d)}" for s, d in document["systems"].items()]
    lines += ["- `single-<member>`: that member alone; `sc<K>-<member>`: K samples (T = 0.7, top-p 0.95), "]
    lines[-1] += "majority vote"
    if document["config"]:
        shown = {k: v for k, v in document["config"].items() if k in ("segment_len", "max_new_tokens")}
        lines += [f"- base config: {', '.join(f'{k}={v}' for k, v in shown.items())}; greedy; seed 0"]
    lines += ["", "## Summary", "", markdown_table(document["summary"])]
    charts = document.get("charts", {})
    if charts.get("png"):
        lines += [f"![chart]({Path(charts['png']).name})", ""]
    lines += [f"Interactive chart: [{name}.html]({name}.html)", ""]
    lines += [
        "Loop share: answers that end in one block (≤ 8 sentences or lines, or ≤ 24 words) repeated ≥ 3 "
        "times in a row, the last copy possibly cut off (`specfuse.eval.stats.ends_in_loop`). "
        "distinct-n: unique word n-grams / all word n-grams, averaged over answers. seconds_per_problem: "
        "the runs' own wall time (batched runs overlap, so their sum exceeds the evaluation's wall time).",
        "",
    ]
    if document.get("by_group"):
        lines += ["## By instruction group", ""]
        lines += [
            "Instruction-level strict accuracy within each of IFEval's instruction groups (the id before "
            "':'): which kinds of instruction a system keeps or loses beside another "
            "(`specfuse.eval.ifeval.by_group`).",
            "",
            markdown_table(
                [r | {"instruction group": _esc(r["instruction group"])} for r in document["by_group"]]
            ),
        ]
        if charts.get("html-groups"):
            lines += [f"Chart: [{name}-groups.html]({name}-groups.html)", ""]
    if document["paired"]:
        lines += ["## Paired comparisons", ""]
        lines += [
            "Same problems; only_system / only_baseline are the discordant pairs; p: exact two-sided McNemar "
            "(binomial test of the discordant pairs, `specfuse.eval.stats.mcnemar_exact`).",
            "",
            markdown_table(document["paired"]),
        ]
        if charts.get("html-paired"):
            lines += [f"Chart: [{name}-paired.html]({name}-paired.html)", ""]
    lines += _ceiling_section(document.get("ceiling"), charts, name)
    lines += _failure_cases_section(document)
    lines += _answers_section(outcomes, problems)
    return "\n".join(lines).rstrip() + "\n"


def _failure_cases_section(document: dict[str, Any]) -> list[str]:
    """The problems each system got wrong where the best member was right, and the reverse, linked to
    their trace copies."""
    lines: list[str] = []
    cases = _against_a_member(document)
    if cases:
        lines += ["## Failure cases", "", "Trace copies replay in the app (Upload a trace).", ""]
        for system, found in cases.items():
            for kind, label in (("wrong_best_right", "wrong"), ("right_best_wrong", "right")):
                rows = found[kind]
                other = "right" if label == "wrong" else "wrong"
                lines += [f"**{system} {label}, {found['best_member']} {other}: {len(rows)}**", ""]
                for c in rows:
                    copy = Path(c["system_copy"]) if c.get("system_copy") else None
                    link = f" ([trace]({copy.relative_to(copy.parents[3]).as_posix()}))" if copy else ""
                    lines += [
                        f"- {c['problem']}: gold {c['gold']}, {system} {c['system_answer']}, "
                        f"{found['best_member']} {c['best_answer']}{link}"
                    ]
                lines += [""]
    return lines


def _answers_section(outcomes: Sequence[Outcome], problems: Sequence[Problem]) -> list[str]:
    """Ungraded problems (no gold answer): every system's answer under each question, cut at 600."""
    lines: list[str] = []
    if not any(p.gold is not None for p in problems):
        lines += ["## Answers", ""]
        by_problem = {p.id: p for p in problems}
        for pid, prob in by_problem.items():
            lines += [f"**{pid}**: {_esc(prob.question)}", ""]
            for o in outcomes:
                if o.problem == pid:
                    text = o.answer if len(o.answer) <= 600 else o.answer[:600] + " …"
                    lines += [f"- `{o.system}`: {_esc(text) or '(error: ' + _esc(o.error or '') + ')'}"]
            lines += [""]
    return lines


def _ceiling_section(limit: dict[str, Any] | None, charts: dict[str, Any], name: str) -> list[str]:
    """The results page's ceiling: its sentences, tables and chart link (none without a ceiling)."""
    if not limit:
        return []
    lines = ["## The ceiling", ""]
    lines += [
        "What the members could gain together at most (`specfuse.eval.ceiling`): the oracle is the share "
        "of problems at least one member got right, β the share all got wrong together (oracle = 1 − β; "
        "a selector of whole answers scores at most that), co-failure the share a pair got wrong "
        "together; gained / lost: the problems an ensemble got right where the best member was wrong, "
        "and the reverse (95 % Wilson intervals; the difference with a paired Wald interval; p: exact "
        "McNemar).",
        "",
    ]
    lines += [f"- {_esc(line)}" for line in ceiling_lines(limit)]
    lines += ["", markdown_table(limit["members"]), markdown_table(limit["pairs"])]
    if limit["discordance"]:
        lines += [markdown_table(limit["discordance"])]
    if charts.get("html-ceiling"):
        lines += [f"Chart: [{name}-ceiling.html]({name}-ceiling.html)", ""]
    return lines


def _against_a_member(document: dict[str, Any]) -> dict[str, Any]:
    """The failure cases that have a member to compare with (none when no member ran alone)."""
    return {system: found for system, found in document["failure_cases"].items() if found["best_member"]}


def console_summary(document: dict[str, Any]) -> str:
    """The tables for the terminal."""
    import pandas as pd

    parts = [pd.DataFrame(document["summary"]).to_string(index=False, float_format="%.3f")]
    if document["paired"]:
        parts.append(pd.DataFrame(document["paired"]).to_string(index=False, float_format="%.3g"))
    if document.get("ceiling"):
        parts.append("\n".join(ceiling_lines(document["ceiling"])))
    for system, found in _against_a_member(document).items():
        parts.append(
            f"{system}: wrong where {found['best_member']} is right: {len(found['wrong_best_right'])}; "
            f"right where it is wrong: {len(found['right_best_wrong'])}"
        )
    return "\n\n".join(parts)
