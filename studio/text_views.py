"""Text beside every chart: the round's candidates, the verification matrix and the weights as HTML
tables with a sentence that says what they show, holding the same numbers as the charts (and the
values a lesson's note quotes), for a screen reader, a keyboard, and the back row of a room.

Each table has a caption, header cells with scope, and marks the winner with "✓ chosen" in words, so
colour never carries the meaning alone. Every string from a trace (member names, candidate text) is
escaped and isolated (<bdi>): a right-to-left override in a name cannot reorder the text after it.
Knows nothing about components or events; studio.views.round_panels puts these in the panels.
"""

from __future__ import annotations

from collections.abc import Sequence

from specfuse import Round, report

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
        return "<p class='sf-text-note'>No round yet.</p>"
    rows = []
    for j, c in enumerate(rnd.candidates):
        score = num(rnd.aggregate[j]) if rnd.verified and j < len(rnd.aggregate) else "—"
        rows.append(
            [
                iso(c.member),
                iso(c.text) if c.text else "(empty)",
                score,
                "✓ chosen" if j == rnd.chosen else "",
            ]
        )
    won = f"Round {rnd.k}: {iso(rnd.winner.member)}'s candidate was chosen"
    won += f" by a margin of {num(rnd.margin)}." if rnd.verified and len(rnd.candidates) > 1 else "."
    return f"<p class='sf-text-note'>{won}</p>" + _table(
        f"Candidates of round {rnd.k}", ["member", "candidate", "score", "chosen"], rows
    )


def matrix_html(rnd: Round | None, normalized: bool = True) -> str:
    """The verification matrix as a table: one row per verifier, one column per candidate's drafter,
    the chosen column named in its header; a sentence when the round was not verified."""
    if rnd is None:
        return _details("The matrix as a table", "<p>No round yet.</p>")
    if not rnd.verified:
        why = "a lone draft" if len(rnd.candidates) == 1 else "the drafts agreed"
        return _details(
            "The matrix as a table",
            f"<p>Round {rnd.k} was not verified ({why}): {iso(rnd.winner.member)}'s candidate was taken.</p>",
        )
    matrix = report.score_matrix(rnd, normalized)
    kind = "normalized ŝ" if normalized else "raw z"
    head = ["verifier \\ candidate"] + [
        iso(m) + (" (✓ chosen)" if j == rnd.chosen else "") for j, m in enumerate(matrix.columns)
    ]
    rows = [[iso(v)] + [num(x, 2) for x in row] for v, row in zip(matrix.index, matrix.to_numpy().tolist())]
    sentence = (
        f"Round {rnd.k}, {kind}: each row is how one verifier scored each candidate (higher is better); "
        f"{iso(rnd.winner.member)}'s candidate was chosen."
    )
    return _details(
        "The matrix as a table",
        f"<p>{sentence}</p>" + _table(f"Verification matrix, round {rnd.k} ({kind})", head, rows),
    )


def weights_html(rounds: Sequence[Round]) -> str:
    """The weights chart as a table: one row per round (0 = the start), one column per member, and
    a sentence on who leads and who left."""
    if not rounds:
        return _details("The weights as a table", "<p>No round yet.</p>")
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
    sentence = f"After round {rounds[-1].k}, {iso(lead)} has the largest weight ({num(last.get(lead, 0.0))})"
    sentence += (
        "; " + ", ".join(f"{iso(m)} left after round {k}" for m, k in exits.items()) + "." if exits else "."
    )
    head = ["round"] + [iso(m) for m in members] + ["exited"]
    return _details(
        "The weights as a table",
        f"<p>{sentence}</p>" + _table("Each member's weight after each round (0: the start)", head, rows),
    )


def _details(summary: str, body: str) -> str:
    """A closed disclosure: a button for the keyboard and a screen reader, the table inside."""
    return f"<details class='sf-text'><summary>{summary}</summary>{body}</details>"
