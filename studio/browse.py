"""The failure-case browser's handlers: filter the problems, open one beside the table.

Opening a problem shows, right under the table, its gold answer and the ensemble's and the best
member's answers side by side, and replays the ensemble's trace in the round panels below it when
the report's folder holds it (studio.failures finds it). Knows nothing about layout.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import gradio as gr

from specfuse import SpecfuseError
from specfuse.eval.problems import Outcome
from specfuse.trace import load_trace

from . import failures, views
from .handlers import Studio, limits
from .i18n import _
from .panels import Failures
from .untrusted import esc, md
from .updates import Update, unchanged


@dataclass
class FailureBrowser:
    """Handlers of the failure-case browser over one evaluation report."""

    run: failures.EvalRun
    studio: Studio
    panel: Failures

    def filter(self, which: str) -> Update:
        return {self.panel.table: failures.problems_table(self.run, which)}

    def answer(self, o: Outcome | None) -> str:
        """The answer's text: its trace's last round when the trace is here, else the report's copy."""
        if o is None:
            return ""
        found = self.run.trace(o)
        if found is not None:
            with contextlib.suppress(SpecfuseError, IndexError):
                return load_trace(found, max_bytes=limits["trace_bytes"]).rounds[-1].text
        return o.answer

    def open(self, view_name: str, evt: gr.SelectData) -> Update:
        row = evt.row_value if isinstance(evt.row_value, list) else None
        if not row:
            return unchanged()
        problem = str(row[0])
        run = self.run
        mine, best = run.get(run.ensemble(), problem), run.get(run.best(), problem)
        if mine is None:
            raise self.studio.error(
                _(
                    "The report has no answer of {system} to problem {problem}.",
                    system=run.ensemble(),
                    problem=problem,
                )
            )
        columns = [(f"{run.label(mine.system)}: {failures.mark(mine)}", self.answer(mine))]
        if best is not None:
            columns.append((f"{run.label(best.system)}: {failures.mark(best)}", self.answer(best)))
        found = run.trace(mine)
        status = self.studio.display.status
        if found is None:
            where = run.report.parent if run.report is not None else run.folder
            note = _(
                "Problem {problem}: no trace of the ensemble's run is in {where} (the report ships the "
                "traces of its failure cases only, {mark} in the table); both answers are shown above "
                "without a replay.",
                problem=problem,
                where=where,
                mark=_(failures.REPLAY),
            )
            return {  # an earlier problem's replay goes: the panels below would not be this one's
                **self.studio.cleared(None),
                **self.studio.panels(None),
                self.panel.case: case_html(problem, mine.gold, columns, False),
                status: md(note),
                self.studio.display.round: views.slider_value(None),
            }
        update = self.studio.load_trace_file(str(found), view_name)
        note = _("problem {problem}: the ensemble's trace, replayed", problem=problem)
        update[status] = views.status_markdown(update[self.studio.trace].rounds, note)
        update[self.studio.display.compared] = ""  # the answers stand under the table
        update[self.panel.case] = case_html(problem, mine.gold, columns, True)
        return update


def case_html(problem: str, gold: str | None, columns: list[tuple[str, str]], replayed: bool) -> str:
    """One problem under the table: its gold answer, then each system's answer side by side."""
    after = (
        _("The ensemble's run is replayed round by round in the panels below.")
        if replayed
        else _("No trace of the ensemble's run is here: no replay.")
    )
    head = _(
        "<b>Problem {problem}</b> · gold answer <b>{gold}</b>", problem=esc(problem), gold=esc(gold or "—")
    )
    return f"<p class='sf-case'>{head} · {after}</p>{views.compare_html(columns)}"
