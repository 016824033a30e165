"""What a class session's beat shows of a round (studio.room): before its reveal a Ballot, the drafts as
lettered choices (text only: no score, weight or winner); at the reveal a Verdict, the winner, the
models' score per choice and the matrix's verdict in one sentence, kept as an English template and its
fields (`Said`) so that each page says it in its own reader's language.

Pure and typed: records in, plain values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specfuse import Round
from specfuse.records import Draft, Gate

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# A sentence kept as its English template and fields (studio.room_views says it in each reader's
# language: one beat is read by phones in several).
Said = tuple[str, tuple[tuple[str, object], ...]]


def english(said: Said) -> str:
    template, fields = said
    return template.format(**dict(fields))


@dataclass(frozen=True)
class Choice:
    letter: str  # what the room calls it: A, B, …
    text: str  # the candidate's text (drafts with the very same text are one choice)
    members: tuple[str, ...]  # who drafted it: the teacher's page only, and every page after the reveal


@dataclass(frozen=True)
class Ballot:
    """A round's drafts on the table, before its reveal: text only, no score, weight or winner."""

    run: int  # which of the teacher's stepping runs (a new lesson or Run starts another)
    k: int
    choices: tuple[Choice, ...]
    prompt: str = ""  # the question, and the answer so far (the rounds revealed): what they continue
    answer: str = ""

    @property
    def key(self) -> str:
        return f"{self.run}-{self.k}"


@dataclass(frozen=True)
class Verdict:
    """A round revealed: the winning choice, the models' score per choice and one sentence."""

    run: int
    k: int
    choices: tuple[Choice, ...]
    winner: str  # its letter
    scores: tuple[float | None, ...]  # per choice, the models' aggregate y (None: taken unscored)
    said: Said  # the matrix's verdict in one sentence (its gate's reason, if any: `gate`)
    last: bool = False  # the run's last round
    gate: Gate | None = None

    @property
    def sentence(self) -> str:
        return english(self.said)

    @property
    def key(self) -> str:
        return f"{self.run}-{self.k}"


@dataclass(frozen=True)
class Beat:
    """Where the teacher's run is: the round whose drafts wait for votes (if any) and the latest
    round revealed (if any)."""

    run: int = 0
    ballot: Ballot | None = None
    verdict: Verdict | None = None


def choices_of(drafts: Sequence[Draft]) -> tuple[Choice, ...]:
    """The round's drafts as the room sees them: one choice per distinct text, in arrival order."""
    by_text: dict[str, list[str]] = {}
    for d in drafts:
        by_text.setdefault(d.candidate.text, []).append(d.candidate.member)
    return tuple(
        Choice(LETTERS[i % len(LETTERS)], text, tuple(dict.fromkeys(members)))
        for i, (text, members) in enumerate(by_text.items())
    )


def verdict_of(run: int, rnd: Round, lettered: Sequence[Choice] | None = None, last: bool = False) -> Verdict:
    """Round `rnd` revealed, its choices lettered as its ballot had them (`lettered`, when they are
    this round's texts), else in the order of the round's candidates."""
    texts = {c.text for c in rnd.candidates}
    if lettered is not None and {c.text for c in lettered} == texts:
        choices = tuple(lettered)
    else:
        choices = choices_of([Draft(rnd.k, c, 0.0) for c in rnd.candidates])
    winner = next(c.letter for c in choices if c.text == rnd.winner.text)
    scored = rnd.verified and len(rnd.aggregate) == len(rnd.candidates)
    scores = tuple(
        max(rnd.aggregate[j] for j, cand in enumerate(rnd.candidates) if cand.text == c.text)
        if scored
        else None
        for c in choices
    )
    gate = rnd.gate if rnd.gated else None
    return Verdict(run, rnd.k, choices, winner, scores, sentence(rnd, choices, winner, scores), last, gate)


def sentence(rnd: Round, choices: Sequence[Choice], winner: str, scores: Sequence[float | None]) -> Said:
    """The matrix's verdict in one sentence (plain text: the pages escape it); a gated round's
    reason is its gate's recorded English (the Verdict keeps the gate, to say it in another language)."""
    if rnd.gated and rnd.gate is not None:
        said = (("winner", winner), ("reason", rnd.gate.reason))
        return "{winner} was taken by the gate ({reason}), without the full vote.", said
    if not rnd.verified or scores[0] is None:
        if len(choices) == 1:
            return "All the drafts said the same, so {winner} was taken without a vote.", (
                ("winner", winner),
            )
        return "{winner} was taken without scoring: the drafts agreed.", (("winner", winner),)
    ranked = sorted(zip(choices, scores), key=lambda cs: -(cs[1] or 0.0))
    top = ranked[0][1] or 0.0
    if len(ranked) == 1:
        return "{winner} was the only candidate.", (("winner", winner),)
    runner, second = ranked[1][0].letter, ranked[1][1] or 0.0
    fields = (("winner", winner), ("top", f"{top:.2f}"), ("second", f"{second:.2f}"), ("runner", runner))
    if top - second >= 0.2:
        return WIDE, fields
    return NARROW, fields


WIDE = (
    "The judges, weighted, gave {winner} {top} against {second} for {runner}: "
    "{winner} read most natural to them by a wide margin."
)
NARROW = (
    "The judges, weighted, gave {winner} {top} against {second} for {runner}: "
    "{winner} read most natural to them narrowly."
)
