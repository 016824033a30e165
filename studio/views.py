"""Pure views: Round records → one component value each (a figure, a table, a string of HTML).

Knows nothing about loading, events or layout, never imports torch and does no arithmetic on scores:
a number the records lack is a function in specfuse.report. Model text and member names are
untrusted (they come from models and uploaded traces): every piece that reaches HTML or a Plotly
label goes through `esc`, every piece of the Markdown status line through `md` (studio.untrusted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from specfuse import Round, Trace, answer_spans, report
from specfuse.handout.data import member_colors  # one colour per member, as the handout's
from specfuse.records import Draft

from . import text_views
from .i18n import _
from .text_views import candidates_html, exit_reason, matrix_html, token_html, weights_html  # noqa: F401
from .untrusted import esc, md, shown_controls

SELECTED = "▶ selected segment"  # the answer's label for the segment being inspected
SELECTED_COLOR = "#FFD54F"
# config.gate: the answer's label for a segment its gatekeeper was sure of, taken without the others
GATED = " · sure, alone"
NORMALIZED, RAW = "normalized ŝ", "raw z"


def answer_value(rounds: Sequence[Round], selected: int | None = None) -> list[tuple[str, str]]:
    """The answer as (text, member) spans for HighlightedText: text, never HTML.

    `selected` (a 0-based segment index) relabels that one span, so the whole answer stays in view
    with the segment being inspected marked.
    """
    spans = [
        (shown_controls(t), f"{w}{_(GATED)}" if r.gated else w)
        for (t, w), r in zip(answer_spans(rounds), rounds)
    ]
    if selected is not None and 0 <= selected < len(spans):
        spans[selected] = (spans[selected][0], _(SELECTED))
    return spans


def answer_component(trace: Trace | None, selected: int | None = None) -> gr.HighlightedText:
    """The whole answer of `trace`, coloured by drafter, the selected segment (if any) marked."""
    rounds: Sequence[Round] = trace.rounds if trace is not None else ()
    colors = member_colors(trace.members if trace is not None else ())
    if any(r.gated for r in rounds):  # a gated segment keeps its member's colour, its label says so
        colors |= {f"{m}{_(GATED)}": c for m, c in list(colors.items())}
    if selected is not None:
        colors[_(SELECTED)] = SELECTED_COLOR
    spans: Any = answer_value(rounds, selected)
    return gr.HighlightedText(value=spans, color_map=colors)


def plain_answer(rounds: Sequence[Round]) -> str:
    """The answer exactly as the engine built it: what a copy must give, byte for byte."""
    return rounds[-1].text if rounds else ""


def status_markdown(
    rounds: Sequence[Round], note: str = "", *, waited_s: float | None = None, loading_s: float | None = None
) -> str:
    """One line: round, tokens, tokens/s, the first segment's latency, calls saved by exit, why it stopped.

    `waited_s` is what the person waited from pressing Run to the first segment (loading included)
    and `loading_s` the part of it spent loading members; the engine's own figure is "round 1".
    """
    if not rounds:
        return md(note) if note else _("Pick two or more members, type a prompt and press **Run**.")
    s = report.status(rounds)
    if waited_s is not None:
        loading = _("loading {s} s + ", s=f"{loading_s:.2f}") if _loaded(loading_s) else ""
        first = _(
            "first segment after {s} s ({loading}round 1 {r} s)",
            s=f"{waited_s:.2f}",
            loading=loading,
            r=f"{s.first_segment_latency_s:.2f}",
        )
    else:
        first = _("round 1 took {s} s", s=f"{s.first_segment_latency_s:.2f}")
    parts = [
        _("**Round {k}**", k=s.round),
        _("{n} tokens", n=s.tokens),
        _("{n} tokens/s", n=f"{s.tokens_per_s:.1f}"),
        first,
        _("{n} of {m} model calls saved by exit", n=s.calls_saved, m=s.calls_made + s.calls_saved),
    ]
    gated = sum(r.gated for r in rounds)
    if gated:
        parts.append(_("{n} of {m} rounds gated (a sure member alone)", n=gated, m=len(rounds)))
    if s.stop_reason:
        parts.append(_("stopped: {reason}", reason=md(_(s.stop_reason))))
    if note:
        parts.append(md(note))
    return " · ".join(parts)


def _table(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Round the floats and blank the NaNs, so the table is readable and JSON-safe; a yes/no column
    in words (Gradio draws a bool cell as a checkbox with no name: a screen reader says "checkbox"),
    directional formatting characters in text written out."""
    out = df.copy()
    for column in out.columns:
        if pd.api.types.is_float_dtype(out[column]):
            out[column] = out[column].round(digits)
        elif pd.api.types.is_bool_dtype(out[column]):
            out[column] = out[column].map({True: _("yes"), False: _("no")})
        elif not pd.api.types.is_numeric_dtype(out[column]):  # trace text: no override reorders a cell
            out[column] = out[column].map(lambda v: shown_controls(v) if isinstance(v, str) else v)
    out.columns = [_(str(c)) for c in out.columns]  # the headers, in the page's language
    return out.astype(object).where(out.notna(), "")


def candidates_value(rnd: Round | None) -> pd.DataFrame:
    if rnd is None:
        return pd.DataFrame(columns=[_(c) for c in report.CANDIDATE_COLUMNS])
    return _table(report.candidates_table(rnd))


def arriving_value(drafts: Sequence[Draft]) -> pd.DataFrame:
    return _table(report.arriving_table(drafts))


def _loaded(loading_s: float | None) -> bool:
    """Whether members were loaded for this run: members already loaded come back in well under
    5 ms, which printed as "(loading 0.00 s)"."""
    return loading_s is not None and loading_s >= 0.005


def waiting_status(place: int, running: int, html: bool = False) -> str:
    """While a run waits for a place in the batch (the scheduler's line): its place, and why."""
    text = _("place {p} in line ({n} runs under way); yours starts as soon as one ends.", p=place, n=running)
    return f"<p>{_('Waiting:')} {text}</p>" if html else f"**{_('Waiting')}**: {text}"


def arriving_status(
    drafts: Sequence[Draft],
    expected: Sequence[str],
    waited_s: float,
    loading_s: float | None = None,
    since: float = 0.0,
) -> str:
    """While round k is drafted: who is in (and when: seconds into the round, the run's clock less
    `since`, the end of the round before), who is still drafting."""
    k = drafts[-1].k
    arrived = [d.candidate.member for d in drafts]
    parts = [
        _("**Round {k}**", k=k),
        _("{n} of {m} candidates in: ", n=len(arrived), m=len(expected))
        + ", ".join(f"{md(d.candidate.member)} {d.elapsed - since:.2f} s" for d in drafts),
    ]
    if k == 1:
        loading = _(" (loading {s} s)", s=f"{loading_s:.2f}") if _loaded(loading_s) else ""
        parts.append(_("first candidate after {s} s{loading}", s=f"{waited_s:.2f}", loading=loading))
    waiting = [m for m in expected if m not in arrived]
    if waiting:
        parts.append(_("still drafting: ") + ", ".join(md(m) for m in waiting))
    return " · ".join(parts)


def exits_value(rounds: Sequence[Round]) -> pd.DataFrame:
    table = report.exit_table(rounds)
    table["reason"] = [exit_reason(str(r)) for r in table["reason"]]
    return _table(table)


def summary_value(rounds: Sequence[Round]) -> pd.DataFrame:
    return _table(report.member_summary(rounds))


def heatmap_figure(rnd: Round | None, normalized: bool = True, fixed_scale: bool = True) -> go.Figure:
    """The verification matrix of one round: verifier (rows) × candidate (columns), chosen column boxed.

    Normalized scores use a fixed 0..1 colour scale, so rounds compare at a glance; raw scores (and
    normalization "none") use their own range. Member names are escaped: Plotly renders HTML in labels.
    """
    fig = go.Figure()
    fig.update_layout(
        height=CHART_PX, margin=MARGIN, font=CHART_FONT, uirevision="matrix", template="plotly_white"
    )
    if rnd is None:
        return nothing_to_draw(fig.update_layout(title=_("verification matrix")), _("no round yet"))
    who = esc(rnd.winner.member)
    if rnd.gated and rnd.gate is not None:
        fig.update_layout(
            title=_("round {k}: gated: {member} was sure, nobody verified", k=rnd.k, member=who)
        )
        return nothing_to_draw(
            fig, _("why the others were not asked: {why}", why=esc(text_views.gate_reason(rnd.gate)))
        )
    if not rnd.verified:
        lone = len(rnd.candidates) == 1
        why = _("a lone draft") if lone else _("the drafts agreed")
        fig.update_layout(
            title=_("round {k}: not verified: {why}, {member}'s was taken", k=rnd.k, why=why, member=who)
        )
        return nothing_to_draw(
            fig,
            _("one draft this round: nothing to verify")
            if lone
            else _("the drafts agreed: nothing to verify"),
        )
    matrix = report.score_matrix(rnd, normalized)
    # Two members may share a name only by accident; the column number keeps the x labels distinct.
    columns = [esc(f"{m} ✓") if j == rnd.chosen else esc(m) for j, m in enumerate(matrix.columns)]
    scale = dict(zmin=0.0, zmax=1.0) if normalized and fixed_scale else {}
    fig.add_trace(
        go.Heatmap(
            z=matrix.to_numpy().tolist(),
            x=columns,
            y=[esc(v) for v in matrix.index],
            colorscale="Viridis",
            colorbar=dict(thickness=12),
            texttemplate="%{z:.2f}",
            hovertemplate=_("verifier %{y}<br>candidate %{x}<br>score %{z:.4f}<extra></extra>"),
            **scale,
        )
    )
    fig.add_shape(
        type="rect",
        xref="x",
        yref="paper",
        x0=rnd.chosen - 0.5,
        x1=rnd.chosen + 0.5,
        y0=0,
        y1=1,
        line=dict(color="#d62728", width=3),
    )
    kind = _("normalized ŝ") if normalized else _("raw z")
    fig.update_layout(
        title=_("round {k}: {kind}", k=rnd.k, kind=kind),  # the axes name verifier and candidate
        xaxis_title=_("candidate (drafter)"),
        yaxis_title=_("verifier"),
        yaxis_autorange="reversed",
    )
    return fig


# The charts' size and type: the presenter view draws them 1.5 times as large (assets/app.css), so
# 16 px is read as 24 px from the back of a room and 280 px tall still fits a 1280×720 projector
# under the step bar (issue 53, D4 and D10).
CHART_PX = 280
CHART_FONT = dict(size=16)
MARGIN = dict(l=10, r=10, t=44, b=10)


def nothing_to_draw(fig: go.Figure, why: str) -> go.Figure:
    """A chart with nothing to draw says so in words, in place of bare axes that read as broken."""
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig.add_annotation(
        text=why, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=18, color="#444")
    )


def weights_figure(rounds: Sequence[Round]) -> go.Figure:
    """One line per member: its weight over the rounds (0 = start), an ✕ where it exited."""
    fig = go.Figure()
    fig.update_layout(
        height=CHART_PX,
        margin=MARGIN,
        font=CHART_FONT,
        title=_("weights"),
        xaxis_title=_("round"),
        yaxis_title=_("weight"),
        uirevision="weights",
        template="plotly_white",
    )
    if not rounds:
        return nothing_to_draw(fig, _("no round yet"))
    history = report.weights_history(rounds)
    colors = member_colors(rounds[-1].members)
    # Rounds are whole numbers: ticks at 0, 1, 2 … (at most about ten of them), never 0.5 (D7).
    fig.update_xaxes(tickmode="linear", tick0=0, dtick=max(1, math.ceil(len(rounds) / 10)), tickformat="d")
    for member, rows in history.groupby("member", sort=False):
        fig.add_trace(
            go.Scatter(
                x=rows["round"].tolist(),
                y=rows["weight"].tolist(),
                mode="lines+markers",
                name=esc(member),
                hovertemplate=esc(member) + _("<br>round %{x}<br>weight %{y:.4f}<extra></extra>"),
                line=dict(color=colors[str(member)]),
            )
        )
    exits = report.exit_points(rounds)
    if len(exits):
        # Members that exit after the same round sit side by side, each ✕ in its member's colour:
        # two at nearly the same weight were drawn as one (issue 24, item 10).
        nth = exits.groupby("round").cumcount().tolist()
        count = exits.groupby("round")["member"].transform("size").tolist()
        x = [k + EXIT_SPREAD * (i - (n - 1) / 2) for k, i, n in zip(exits["round"], nth, count)]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=exits["weight"].tolist(),
                mode="markers",
                name=_("exit"),
                text=[esc(m) for m in exits["member"]],
                customdata=exits["round"].tolist(),
                marker=dict(
                    symbol="x",
                    size=14,
                    color=[colors.get(str(m), "black") for m in exits["member"]],
                    line=dict(color="black", width=1),
                ),
                hovertemplate=_("%{text} exited after round %{customdata}<extra></extra>"),
            )
        )
    return fig


EXIT_SPREAD = 0.25  # rounds between the ✕ of two members that exit after the same round


def compare_html(columns: Sequence[tuple[str, str]]) -> str:
    """Answers side by side: (title, answer) per column, every piece escaped (model text is untrusted)."""
    if not columns:
        return ""
    cells = "".join(
        f'<div class="sf-compare-col"><h4>{esc(title)}</h4><pre class="sf-answer">{esc(text)}</pre></div>'
        for title, text in columns
    )
    return f'<div class="sf-compare">{cells}</div>'


def segment_html(rounds: Sequence[Round], index: int) -> str:
    """What a selected segment of the answer was: its round, its drafter, and the candidates it beat."""
    if not 0 <= index < len(rounds):
        return ""
    rnd = rounds[index]
    rows = "".join(
        f"<tr><td>{esc(c.member)}</td><td><code>{esc(c.text)}</code></td>"
        f"<td>{rnd.aggregate[j]:.3f}</td><td>{'✓' if j == rnd.chosen else ''}</td></tr>"
        for j, c in enumerate(rnd.candidates)
    )
    gated = (
        "<p>"
        + _("A gated round: why the others were not asked: {why}.", why=esc(text_views.gate_reason(rnd.gate)))
        + "</p>"
        if rnd.gated and rnd.gate is not None
        else ""
    )
    return (
        "<p>"
        + _(
            "Segment {i} was won in <b>round {k}</b> by <b>{member}</b> (margin {margin}).",
            i=index + 1,
            k=rnd.k,
            member=esc(rnd.winner.member),
            margin=f"{rnd.margin:.3f}",
        )
        + f"</p>{gated}<table class='sf-segment'><tr><th>{_('member')}</th><th>{_('candidate')}</th>"
        f"<th>{_('score')}</th><th></th></tr>"
        f"{rows}</table>"
    )


def round_panels(
    trace: Trace | None, k: int | None = None, view: str = NORMALIZED, note: str = ""
) -> dict[str, object]:
    """Every round-dependent panel as of round k (default: the last), by panel name.

    The answer stays whole; at k < last its k-th segment is marked (the replay looks at one round
    of the answer, it does not cut it).
    """
    every: Sequence[Round] = trace.rounds if trace is not None else ()
    rounds = every[: max(1, int(k))] if k is not None else every
    current = rounds[-1] if rounds else None
    fixed = trace is None or trace.config.normalization != "none"
    marked = len(rounds) - 1 if k is not None and len(rounds) < len(every) else None
    # Before a round the charts stay empty (their labels and icons, as the empty tables): a figure
    # would load Plotly's 4.6 MB script on every page open, a third of what chromium spends there
    # (docs/app.md); it loads with the first round's figure instead.
    return {
        "answer": answer_component(trace, marked),
        "status": status_markdown(rounds, note),
        "candidates": candidates_value(current),
        "matrix": heatmap_figure(current, view == NORMALIZED, fixed) if current is not None else None,
        "weights": weights_figure(rounds) if rounds else None,
        "exits": exits_value(rounds),
        "summary": summary_value(rounds),
        # the charts' text beside them (issue 53, item 5)
        "candidates_text": candidates_html(current),
        "matrix_text": matrix_html(current, view == NORMALIZED),
        "weights_text": weights_html(rounds),
    }


def slider_value(trace: Trace | None, k: int | None = None) -> gr.Slider:
    n = len(trace.rounds) if trace is not None else 0
    return gr.Slider(minimum=1, maximum=max(2, n), value=k or max(1, n), step=1, interactive=n > 1)
