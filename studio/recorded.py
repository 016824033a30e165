"""A session's stepping run (StepRun: its ticket, the rounds revealed, the guesses' tally), and a
recorded run (a lesson's trace, an uploaded one) played in step mode as a live run is: a
ticket that gives one round per next(), its drafts first, then its Round, then Paused (or Finished
after the last). No model is loaded and nothing leaves the process: the rounds are the trace's.

studio.stepping reads it through the same four calls it makes of the scheduler's Ticket (next,
aevents(until_pause=True), cancel, and the members and id), so guessing, the tally, Back and Play
work on recorded rounds exactly as on live ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specfuse import EnsembleConfig, Round, SpecfuseError, Trace
from specfuse.prompts import Prompt
from specfuse.records import Draft, Finished, Paused

from .i18n import _
from .step_views import Tally, due

if TYPE_CHECKING:
    from specfuse.engine import Ticket

Event = Draft | Round | Paused | Finished


def arrivals(rnd: Round, since: float) -> list[Draft]:
    """Round k's drafts in the order they came in when it was recorded (each drafter's draft time;
    a trace without timings keeps the drafters' order), each stamped with the run's clock as a
    live Draft is: `since` (the round before's end) plus its draft time."""
    took = {t.member: t.draft_s for t in rnd.timings}
    order = sorted(range(len(rnd.candidates)), key=lambda j: took.get(rnd.candidates[j].member, 0.0))
    return [Draft(rnd.k, rnd.candidates[j], since + took.get(rnd.candidates[j].member, 0.0)) for j in order]


class RecordedTicket:
    """A trace's rounds, one per next(), as a step-mode ticket streams them."""

    def __init__(self, trace: Trace) -> None:
        if not trace.rounds:
            raise SpecfuseError(_("The trace has no rounds to step through."))
        self.trace = trace
        self.id = trace.id
        self.members = tuple(trace.members)
        self.error: SpecfuseError | None = None
        self.played = 0  # rounds handed out so far
        self.asked = False  # next() was called and its round not yet read
        self.cancelled = False

    @property
    def ended(self) -> bool:
        return self.cancelled or self.played >= len(self.trace.rounds)

    def next(self) -> None:
        """Play exactly one more round (a no-op while one is asked and not yet read, as a live
        ticket's next() during its round); on an ended ticket, SpecfuseError as a live one."""
        if self.ended:
            raise SpecfuseError(_("This recorded run has no more rounds."))
        self.asked = True

    def cancel(self) -> None:
        self.cancelled = True

    async def aevents(self, *, until_pause: bool = False) -> AsyncGenerator[Event, None]:
        """The round asked for: its drafts, the Round, then Paused(k), or Finished after the last.
        Without a next() first, nothing (a live ticket would wait; a recorded one has no one to
        wait for). `until_pause` is accepted for the live ticket's signature: a recorded stream always
        stops at its pause."""
        if self.cancelled:
            yield Finished("cancelled")
            return
        if not self.asked or self.ended:
            return
        rnd = self.trace.rounds[self.played]
        since = self.trace.rounds[self.played - 1].elapsed if self.played else 0.0
        self.played, self.asked = self.played + 1, False
        for draft in arrivals(rnd, since):
            yield draft
        yield rnd
        if self.played >= len(self.trace.rounds):
            yield Finished("done" if rnd.stop_reason else "cancelled")
        else:
            yield Paused(rnd.k)


@dataclass
class StepRun:
    """One session's stepping run, as the server keeps it between the page's presses."""

    ticket: Ticket | RecordedTicket
    prompt: Prompt
    config: EnsembleConfig
    rounds: list[Round] = field(default_factory=list)  # revealed
    drafts: list[Draft] = field(default_factory=list)  # of the round played and not yet revealed
    pending: Round | None = None  # that round's verdict, kept until Reveal
    drafting: str = ""  # the status line that round's drafts left
    over: bool = False  # no more rounds will come (the last one has, or the run ended)
    why: str = ""  # what ended it early: the engine's message, or the user's Stop
    tally: Tally = field(default_factory=Tally)
    beat: asyncio.Lock = field(default_factory=asyncio.Lock)  # one beat at a time (Play's, a key's)

    @property
    def recorded(self) -> Trace | None:
        """The whole recorded run this one steps through (None: a live run)."""
        return self.ticket.trace if isinstance(self.ticket, RecordedTicket) else None

    def trace(self) -> Trace | None:
        """The revealed rounds as a trace (what replay, Back and the download show)."""
        if not self.rounds:
            return None
        return Trace(self.prompt, self.ticket.members, self.config, tuple(self.rounds), id=self.ticket.id)

    def since(self) -> float:
        """The run's clock at the end of the last revealed round: a round's draft times count from it."""
        return self.rounds[-1].elapsed if self.rounds else 0.0

    def due(self, shown: float | None) -> str:
        return due(int(shown or 0), len(self.rounds), self.pending is not None, self.over)

    def end(self, why: str) -> None:
        """Cancel its ticket (idempotent) and drop the round not yet revealed."""
        self.ticket.cancel()
        self.over, self.pending, self.drafts = True, None, []
        self.why = self.why or why
