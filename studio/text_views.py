"""Text beside every chart: the round's candidates, the verification matrix and the weights as HTML
tables with a sentence that says what they show, holding the same numbers as the charts (and the
values a lesson's note quotes), for a screen reader, a keyboard, and the back row of a room.

Each table has a caption, header cells with scope, and marks the winner with "✓ chosen" in words, so
colour never carries the meaning alone. Every string from a trace (member names, candidate text) is
escaped and isolated (<bdi>): a right-to-left override in a name cannot reorder the text after it.
Knows nothing about components or events; studio.views.round_panels puts these in the panels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from specfuse import Round, report
from specfuse.handout.i18n import ENGLISH
from specfuse.records import Gate

from .i18n import _, current
from .untrusted import esc


def iso(text: object) -> str:
    """Trace text for HTML: escaped, and isolated from the text around it (bidi)."""
    return f"<bdi>{esc(str(text))}</bdi>"


def num(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def _table(caption: str, head: Sequence[str], rows: Sequence[Sequence[str]], row_headers: bool = True) -> str:
    th = "".join(f"<th scope='col'>{h}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f"<th scope='row'>{cell}</th>" if i == 0 and row_headers else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return (
        f"<table class='sf-text-table'><caption>{caption}</caption>"
        f"<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
    )


def candidates_html(rnd: Round | None) -> str:
    """Round k's candidates: who drafted what, its score y_j and the winner, in words."""
    if rnd is None:
        return f"<p class='sf-text-note'>{_('No round yet.')}</p>"
    rows = []
    for j, c in enumerate(rnd.candidates):
        score = num(rnd.aggregate[j]) if rnd.verified and j < len(rnd.aggregate) else "—"
        rows.append(
            [
                iso(c.member),
                iso(c.text) if c.text else _("(empty)"),
                score,
                _("✓ chosen") if j == rnd.chosen else "",
            ]
        )
    won = _("Round {k}: {member}'s candidate was chosen", k=rnd.k, member=iso(rnd.winner.member))
    margin = rnd.verified and len(rnd.candidates) > 1
    won += _(" by a margin of {m}.", m=num(rnd.margin)) if margin else _(".")
    head = [_("member"), _("candidate"), _("score"), _("chosen")]
    return f"<p class='sf-text-note'>{won}</p>" + _table(_("Candidates of round {k}", k=rnd.k), head, rows)


def matrix_html(rnd: Round | None, normalized: bool = True) -> str:
    """The verification matrix as a table: one row per verifier, one column per candidate's drafter,
    the chosen column named in its header; a sentence when the round was not verified."""
    if rnd is None:
        return _details(_("The matrix as a table"), f"<p>{_('No round yet.')}</p>")
    if not rnd.verified:
        why = _("a lone draft") if len(rnd.candidates) == 1 else _("the drafts agreed")
        said = _(
            "Round {k} was not verified ({why}): {member}'s candidate was taken.",
            k=rnd.k,
            why=why,
            member=iso(rnd.winner.member),
        )
        return _details(_("The matrix as a table"), f"<p>{said}</p>")
    matrix = report.score_matrix(rnd, normalized)
    kind = _("normalized ŝ") if normalized else _("raw z")
    head = [_("verifier \\ candidate")] + [
        iso(m) + (_(" (✓ chosen)") if j == rnd.chosen else "") for j, m in enumerate(matrix.columns)
    ]
    rows = [[iso(v)] + [num(x, 2) for x in row] for v, row in zip(matrix.index, matrix.to_numpy().tolist())]
    sentence = _(
        "Round {k}, {kind}: each row is how one verifier scored each candidate (higher is better); "
        "{member}'s candidate was chosen.",
        k=rnd.k,
        kind=kind,
        member=iso(rnd.winner.member),
    )
    caption = _("Verification matrix, round {k} ({kind})", k=rnd.k, kind=kind)
    return _details(_("The matrix as a table"), f"<p>{sentence}</p>" + _table(caption, head, rows))


def weights_html(rounds: Sequence[Round]) -> str:
    """The weights chart as a table: one row per round (0 = the start), one column per member, and
    a sentence on who leads and who left."""
    if not rounds:
        return _details(_("The weights as a table"), f"<p>{_('No round yet.')}</p>")
    history = report.weights_history(rounds)
    members = list(rounds[-1].members)
    by_round: dict[int, dict[str, float]] = {}
    for r, m, w in zip(history["round"], history["member"], history["weight"]):
        by_round.setdefault(int(r), {})[str(m)] = float(w)
    exits = {e.member: r.k for r in rounds for e in r.exits}
    rows = []
    for k, weights in by_round.items():
        left = [m for m, after in exits.items() if after == k]
        rows.append(
            [str(k)]
            + [num(weights.get(m, 0.0)) for m in members]
            + [", ".join(iso(m) for m in left) if left else ""]
        )
    last = by_round[max(by_round)]
    lead = max(members, key=lambda m: last.get(m, 0.0))
    sentence = _(
        "After round {k}, {member} has the largest weight ({w})",
        k=rounds[-1].k,
        member=iso(lead),
        w=num(last.get(lead, 0.0)),
    )
    left = [_("{member} left after round {k}", member=iso(m), k=k) for m, k in exits.items()]
    sentence += (_("; ") + _(", ").join(left) if left else "") + _(".")
    head = [_("round")] + [iso(m) for m in members] + [_("exited")]
    caption = _("Each member's weight after each round (0: the start)")
    return _details(_("The weights as a table"), f"<p>{sentence}</p>" + _table(caption, head, rows))


def _details(summary: str, body: str) -> str:
    """A closed disclosure: a button for the keyboard and a screen reader, the table inside."""
    return f"<details class='sf-text'><summary>{summary}</summary>{body}</details>"


def token_html(rnd: Round | None, i: int | None, j: int | None, score: str = "logit") -> str:
    """Candidate j's tokens as verifier i read them, each shaded by that verifier's score of it.

    Darker is a higher raw logit (score "logit") or log-probability (score "logprob"), relative to
    the candidate's own tokens; hover shows the value. Every token is escaped (model text).
    """
    if rnd is None or i is None or j is None:
        return ""
    if not rnd.token_scores:
        return (
            "<p class='sf-note'>"
            + _(
                "This round has no token-level detail (an older trace, or members that do not report it): "
                "only the mean scores in the matrix were recorded."
            )
            + "</p>"
        )
    if not (0 <= i < len(rnd.token_scores) and 0 <= j < len(rnd.token_scores[i])):
        return ""
    detail = rnd.token_scores[i][j]
    values = detail.logprobs if score == "logprob" and detail.logprobs else detail.logits
    kind = _("log-probability") if values is detail.logprobs else _("raw logit")
    spans = "".join(
        f"<span class='sf-token' title='{esc(kind)} {value:.3f}' "
        f"style='background: rgba(99, 110, 250, {0.1 + 0.8 * shade:.2f})'>{esc(token)}</span>"
        for token, value, shade in report.token_shades(detail.tokens, values)
    )
    said = _(
        "Round {k}: <b>{verifier}</b> reading <b>{member}</b>'s candidate, each token shaded by its "
        "{kind} (darker = higher; hover for the value).",
        k=rnd.k,
        verifier=esc(rnd.verifiers[i]),
        member=esc(rnd.candidates[j].member),
        kind=esc(kind),
    )
    return f"<p>{said}</p><div class='sf-tokens'>{spans}</div>"


# The engine's recorded reason for an exit (specfuse/engine/run.py), said again in the page's language.
EXIT_REASON = re.compile(
    r"keep-probability (\S+) < δ/\|A\| = (\S+) after (\d+) rounds \(cumulative quality (\S+)\)"
)


def exit_reason(text: str) -> str:
    found = EXIT_REASON.fullmatch(text)
    if found is None:  # a reason of another form is the trace's text, shown as it is
        return text
    p, d, k, q = found.groups()
    return _(
        "keep-probability {p} < δ/|A| = {d} after {k} rounds (cumulative quality {q})", p=p, d=d, k=k, q=q
    )


def gate_reason(gate: Gate) -> str:
    """Why a gated round's others were (not) asked (engine/gate.decide's sentence): the recorded one
    in English, said again from its fields in another language."""
    if current() == ENGLISH:
        return gate.reason
    if gate.confidence is None:
        return _("{member} gave no confidence for its draft, so the others were asked", member=gate.member)
    said = {"member": gate.member, "measure": _(gate.measure), "value": f"{gate.confidence:.3f}"}
    if gate.passed:
        return _("{member} was sure: {measure} {value} ≥ {bar}, so its segment was taken without asking "
                 "the others", bar=f"{gate.threshold:g}", **said)  # fmt: skip
    return _("{member} was unsure ({measure} {value} < {bar}), so the others drafted and verified",
             bar=f"{gate.threshold:g}", **said)  # fmt: skip
