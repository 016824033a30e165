"""Step mode's pure values: what a press of Next (→) does now, the room's guesses and their tally,
and the lines the step bar shows.

Knows nothing about events, tickets or components: studio.stepping turns these into updates. Member
names are untrusted (a served member's or a model folder's name): every one that reaches the
Markdown note goes through `md`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from specfuse import Round
from specfuse.records import Draft

from .i18n import _, said
from .text_views import gate_reason
from .untrusted import esc, md, shown_controls
from .views import CHART_FONT, CHART_PX, MARGIN

# What Next (→, PageDown) does, by what the page shows and what the run holds (`due`).
FORWARD = "forward"  # after Back: show the next round already revealed
REVEAL = "reveal"  # beat 2: the drafted round's scores, matrix, winner and weights
NEXT = "next"  # beat 1: play one more round, its drafts appear
ENDED = "ended"  # the run is over (or gone): nothing more to play

PACE_S = (1.0, 10.0, 3.0)  # Play's pace: seconds per round (least, most, default)


def due(shown: int, revealed: int, drafted: bool, over: bool) -> str:
    """What the next press of Next does. `shown`: the round the page shows (its round slider);
    `revealed`: rounds revealed so far; `drafted`: a played round's drafts are shown, its verdict
    not yet; `over`: the engine will play no more rounds."""
    if shown < revealed:
        return FORWARD
    if drafted:
        return REVEAL
    return ENDED if over else NEXT


@dataclass(frozen=True)
class Tally:
    """The room's guesses in one run: how many were right of how many made (rounds with no guess
    do not count)."""

    right: int = 0
    made: int = 0

    def add(self, verdict: bool | None) -> Tally:
        if verdict is None:
            return self
        return Tally(self.right + int(verdict), self.made + 1)

    def __str__(self) -> str:
        if not self.made:
            return _("no guesses yet")
        if self.made == 1:
            return _("{right} of {made} guess right", right=self.right, made=self.made)
        return _("{right} of {made} guesses right", right=self.right, made=self.made)


SHOWN_CHARS = 60  # of a candidate's text in the guess and the verdict (the tables below hold it whole)


def clip(text: str, chars: int = SHOWN_CHARS) -> str:
    """A candidate's text on one line: line breaks as ⏎, cut with … past `chars`."""
    flat = shown_controls(text.replace("\r\n", "\n").replace("\n", "⏎"))
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def guess_choices(drafts: Sequence[Draft]) -> list[tuple[str, str]]:
    """The guess's choices, (label, member): each member whose candidate is on the table, once, in
    the order they arrived, labelled with its number (its key) and its text (the room reads the
    drafts where it picks)."""
    first = {d.candidate.member: d.candidate.text for d in reversed(drafts)}
    members = dict.fromkeys(d.candidate.member for d in drafts)
    # numbered: the key that picks each (studio.explain), shown where the room reads it
    return [(f"{i}. {m}: “{clip(first[m])}”", m) for i, m in enumerate(members, 1)]


def guess_right(rnd: Round, guess: str | None) -> bool | None:
    """Whether the guessed member's candidate won the round: its own, or one with the very same text
    (drafts that agree are one candidate to the room). None when nobody guessed (or guessed a
    member that did not draft this round)."""
    mine = [c for c in rnd.candidates if c.member == guess]
    if not guess or not mine:
        return None
    return mine[0].text == rnd.winner.text


def ready_note(members: Sequence[str], recorded: int | None = None) -> str:
    """Before round 1: who answers; `recorded`: the rounds of a recorded run stepped (no model)."""
    names = ", ".join(md(m) for m in members)
    what = _("A recorded run of {n} rounds (no model needed): ", n=recorded) if recorded is not None else ""
    return _(
        "**Step mode: ready.** {what}{n} members ({names}) answer one segment per round. "
        "Press **Next** (→) to see round 1's drafts, or **Play**.",
        what=what,
        n=len(members),
        names=names,
    )


def drafting_note(k: int) -> str:
    return _("**Round {k}**: the members are drafting…", k=k)


def drafts_note(k: int, drafts: Sequence[Draft]) -> str:
    n = len(drafts)
    head = (
        _("**Round {k}: {n} draft is in.**", k=k, n=n)
        if n == 1
        else _("**Round {k}: {n} drafts are in.**", k=k, n=n)
    )
    return (
        head
        + " "
        + _("Which one will the ensemble choose? Pick your guess below, then press **Reveal** (→).")
    )


def verdict_note(rnd: Round, guess: str | None, tally: Tally, over: bool) -> str:
    """After Reveal: who won, whether the room's guess was right, the tally, and whether it ended."""
    won = _("**Round {k}: {member}'s candidate won**", k=rnd.k, member=md(rnd.winner.member))
    if rnd.gated and rnd.gate is not None:
        won += _(" (gated: {reason})", reason=md(gate_reason(rnd.gate)))
    elif not rnd.verified:
        why = _("the only draft") if len(rnd.candidates) == 1 else _("the drafts agreed")
        won += _(" ({why}: taken without scoring)", why=why)
    verdict = guess_right(rnd, guess)
    said = {
        None: _("No guess this round."),
        True: _("✓ Your guess was right."),
        False: _("✗ You guessed {member}.", member=md(guess or "")),
    }[verdict]
    parts = [won + _("."), said, f"{tally}" + _(".")]
    parts.append(ended_line(rnd) if over else _("Press **Next** (→) for round {k}.", k=rnd.k + 1))
    return " ".join(parts) + "\n\n" + scores_table(rnd)


def scores_table(rnd: Round) -> str:
    """The round's candidates as a small Markdown table: member, text, score y_j, the winner's ✓."""
    rows = [f"| {_('member')} | {_('candidate')} | {_('score')} | |", "|---|---|---|---|"]
    for j, c in enumerate(rnd.candidates):
        score = f"{rnd.aggregate[j]:.3f}" if rnd.verified and j < len(rnd.aggregate) else "—"
        mark = "✓" if j == rnd.chosen else ""
        rows.append(f"| {md(c.member)} | {md(clip(c.text))} | {score} | {mark} |")
    return "\n".join(rows)


def ended_line(rnd: Round | None) -> str:
    if rnd is None:
        return _("**The run has ended.**")
    reason = _(" (stopped: {reason})", reason=md(_(rnd.stop_reason))) if rnd.stop_reason else ""
    return _("**The run has ended after round {k}**{reason}.", k=rnd.k, reason=reason)


def ended_note(rnd: Round | None, tally: Tally, why: str = "") -> str:
    """The run is over: why (the engine's message, when it ended it), where, and the tally."""
    parts = [md(said(why))] if why else []
    parts += [ended_line(rnd), f"{tally}" + _(".") if tally.made else ""]
    return " ".join(p for p in parts if p)


def looking_note(shown: int, revealed: int, drafted: bool, over: bool = False) -> str:
    """After Back (or forward again): which round is shown, and what → does from there."""
    if shown < revealed:
        return _("**Round {k} of {n}** (looking back): → goes forward, ← further back.", k=shown, n=revealed)
    if drafted:
        then = _("round {k}'s drafts are waiting", k=revealed + 1)
    else:
        then = _("the run has ended") if over else _("→ plays round {k}", k=revealed + 1)
    return _("**Round {k} of {n}**, the latest: {then}.", k=shown, n=revealed, then=then)


def hidden_matrix(k: int) -> go.Figure:
    """The matrix's place while round k's drafts are in and its scores not yet revealed."""
    fig = go.Figure()
    fig.update_layout(
        height=CHART_PX,
        margin=MARGIN,
        font=CHART_FONT,
        uirevision="matrix",
        template="plotly_white",
        title=esc(_("round {k}: the scores are hidden until Reveal", k=k)),
        xaxis_visible=False,
        yaxis_visible=False,
    )
    return fig
