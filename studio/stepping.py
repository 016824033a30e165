"""Step mode's handlers: a live run that starts paused before round 1 and plays one round per Next,
in two beats (the members' drafts, then Reveal: scores, matrix, winner, weights), with Back, Home,
End, Play at a pace, Stop, and the room's guess of each winner. A recorded run (a lesson opened, a
trace uploaded, or the trace shown when the box is checked) steps the same way, through
studio.recorded's ticket: no model loaded.

Each session's stepping run is a StepRun: its ticket in the scheduler (submit(step=True)), the
rounds revealed, the round played but not yet revealed, and the guesses' tally. A beat reads the
ticket's stream up to its next Paused (aevents(until_pause=True)), so the next beat's handler goes on
from there. Knows nothing about layout: studio.layout's `wire_step` wires them once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import gradio as gr

from specfuse import Round, SpecfuseError, Trace
from specfuse.records import Draft, Finished, Queued

from . import views
from .handlers import Studio
from .i18n import _, said
from .recorded import RecordedTicket, StepRun
from .request import RunRequest
from .serving import Held, in_worker
from .step_panel import PAUSE, PLAY, StepBar
from .step_views import (
    ENDED,
    FORWARD,
    NEXT,
    REVEAL,
    drafting_note,
    drafts_note,
    ended_note,
    guess_choices,
    guess_right,
    hidden_matrix,
    looking_note,
    ready_note,
    verdict_note,
)
from .untrusted import md
from .updates import Update, download_value, session_of, unchanged

if TYPE_CHECKING:
    from specfuse.engine import Ticket

# A link's round in step mode (Stepper.replaying): the rounds before it revealed
FROM_ROUND = (
    "**Step mode**, a recorded run of {n} rounds: the rounds before round {k} are shown, Next plays it."
)
NO_RUN = "No stepping run: check **Step mode (teach)** and press **Run**."


@dataclass
class Stepper:
    """Step mode over Studio's panels: the step bar's handlers, and Run's when its box is checked."""

    studio: Studio
    bar: StepBar
    mode: gr.Checkbox
    runs: dict[str, StepRun] = field(default_factory=dict)  # by session

    def outputs(self) -> list[gr.components.Component]:
        """What a beat may change: the run's panels (as a round's update does) and the step bar."""
        s, v = self.studio, self.studio.display
        return [
            s.trace,
            *v.by_name().values(),
            v.round,
            v.segment,
            s.controls.download,
            v.plain,
            *v.what_if.round_outputs(),
            *self.bar.outputs(),
        ]

    # ---- Run with the box checked ---------------------------------------------------------------

    async def start(self, request: RunRequest) -> AsyncIterator[Update]:
        """Load the members, submit a run paused before round 1, and say that Next plays it."""
        s, v = self.studio, self.studio.display
        held = Held()
        try:  # the prologue of every run (Studio.begin), on a thread of its own as a run's is
            async for update in in_worker(s.begin(request, held, step=True)):
                yield update
        except BaseException:  # refused, or cancelled (a new Run, the page closed) while it loaded:
            held.cancel()  # a ticket submitted meanwhile does not wait paused for its idle limit
            raise
        ticket = cast("Ticket", held.ticket)
        run = StepRun(ticket, ticket.prompt, ticket.config)
        self.runs[request.session] = run
        yield {
            **s.cleared(None),
            **s.panels(None, view=request.view),
            **s.clear_branch(),
            v.round: views.slider_value(None),
            v.compared: "",
            v.status: _("**Step mode**: round 1 has not been played yet."),
            **self.bar_update(run, 0, ready_note(ticket.members)),
            **self.still(True),
        }

    def replaying(self, trace: Trace | None, view: str, session: str, at: int | None = None) -> Update:
        """Step mode over a recorded run: the panels emptied, round 1 not yet played, Next plays it
        from the trace (no model); from round `at` (a link's): the rounds before it revealed, Next
        plays it. Without a trace with rounds: the bar as no run leaves it."""
        self.drop(session)
        if trace is None or not trace.rounds:
            return self.reset()
        s, v = self.studio, self.studio.display
        run = StepRun(RecordedTicket(trace), trace.prompt, trace.config)
        self.runs[session] = run
        before = min(max(at or 1, 1), len(trace.rounds)) - 1
        if before:  # as if Next and Reveal had been pressed that often, with no guesses
            run.rounds, run.ticket.played = list(trace.rounds[:before]), before  # type: ignore[union-attr]
            shown = {v.plain: views.plain_answer(run.rounds), s.controls.download: download_value(None)}
            status = {v.status: _(FROM_ROUND, n=len(trace.rounds), k=before + 1)}
            return self.scene(run, before, view) | shown | status | self.still(True)
        return {
            s.trace: None,
            **s.panels(None, view=view),
            v.round: views.slider_value(None),
            v.segment: "",
            v.plain: "",
            s.controls.download: download_value(None),
            v.status: _(
                "**Step mode**, a recorded run of {n} rounds: round 1 is not shown.", n=len(trace.rounds)
            ),
            self.bar.guess: gr.Radio(visible=False, value=None),
            **self.bar_update(run, 0, ready_note(trace.members, recorded=len(trace.rounds))),
            **self.still(True),
        }

    def reset(self) -> Update:
        """The step bar as a run that is not stepping leaves it."""
        return {**self.bar_update(None, 0, ""), **self.still(False)}

    # ---- the beats ----------------------------------------------------------------------------------

    async def advance(
        self, shown: float, view: str, guess: str | None, request: gr.Request
    ) -> AsyncIterator[Update]:
        """Next (→, PageDown), and each of Play's ticks: the beat that is due. Forward again after
        Back, Reveal once the drafts are in, else one more round's drafts."""
        run = self.runs.get(session_of(request))
        if run is None:
            yield {
                **self.reset(),
                self.bar.note: _(NO_RUN),
            }
            return
        async with run.beat:  # after the beat under way, if any (Play's, or the key pressed before)
            beat = run.due(shown)
            if beat == FORWARD:
                yield self.scene(run, int(shown) + 1, view)
            elif beat == REVEAL:
                yield self.revealed(run, view, guess, session_of(request))
            elif beat == NEXT:
                async for update in self.drafted(run, view):
                    yield update
            else:
                yield self.finished(run, shown)

    async def reveal(self, shown: float, view: str, guess: str | None, request: gr.Request) -> Update:
        """Reveal: the drafted round's verdict, when that is what is due."""
        run = self.runs.get(session_of(request))
        if run is None:
            return unchanged()
        async with run.beat:
            if run.due(shown) != REVEAL:
                return unchanged()
            return self.revealed(run, view, guess, session_of(request))

    async def drafted(self, run: StepRun, view: str) -> AsyncIterator[Update]:
        """Beat 1: play one more round; its drafts appear as they arrive, its verdict is kept."""
        s, v, b = self.studio, self.studio.display, self.bar
        k = len(run.rounds) + 1
        expected = run.rounds[-1].next_drafters if run.rounds else run.ticket.members
        began, since = time.perf_counter(), run.since()
        try:
            run.ticket.next()
            yield {
                v.status: drafting_note(k),
                b.note: drafting_note(k),
                b.next: gr.Button(interactive=False),
                b.guess: gr.Radio(visible=False),
            }
            async with contextlib.aclosing(run.ticket.aevents(until_pause=True)) as events:
                async for event in events:
                    if isinstance(event, Queued):  # waiting for a place in the batch
                        yield {v.status: views.waiting_status(event.place, s.schedulers.stats()["running"])}
                    elif isinstance(event, Draft):
                        run.drafts.append(event)
                        # a recorded round's wait is the one it had; a live one's, this beat's
                        waited = time.perf_counter() - began
                        if run.recorded is not None:
                            waited = run.drafts[0].elapsed - since
                        run.drafting = views.arriving_status(run.drafts, expected, waited, since=since)
                        yield {v.candidates: views.arriving_value(run.drafts), v.status: run.drafting}
                    elif isinstance(event, Round):
                        run.pending, run.over = event, event.stop_reason is not None
                    elif isinstance(event, Finished):
                        run.over = True
        except SpecfuseError as e:  # the engine ended it: past the idle limit, a member failed, …
            yield self.gone(run, view, run.ticket.error or e)
            return
        if run.pending is None:  # ended without a round: stopped
            run.end(_("The run ended before this round was decided."))
            yield self.finished(run, len(run.rounds))
            return
        yield self.scene(run, len(run.rounds), view, fresh=True)

    def revealed(self, run: StepRun, view: str, guess: str | None, session: str) -> Update:
        """Beat 2: the round's scores, matrix, winner (the answer grows) and weights; the guess judged."""
        s, v = self.studio, self.studio.display
        rnd = run.pending
        assert rnd is not None  # due() said REVEAL
        run.rounds.append(rnd)
        run.pending, run.drafts = None, []
        run.tally = run.tally.add(guess_right(rnd, guess))
        trace = run.trace()
        update = {
            s.trace: trace,
            **s.panels(trace, None, view),
            v.round: views.slider_value(trace),
            v.segment: "",
            v.plain: views.plain_answer(run.rounds),
            s.controls.download: download_value(trace if run.over else None, session),
            self.bar.guess: gr.Radio(visible=False, value=None),
            **self.bar_update(run, len(run.rounds), verdict_note(rnd, guess, run.tally, run.over)),
        }
        return update | (self.still(False) if run.over else {})

    def scene(self, run: StepRun, k: int, view: str, fresh: bool = False) -> Update:
        """The page at round k of the revealed ones (k = 0: none yet), with the drafts of the round
        played after it, and the guess, when k is the latest and that round is not yet revealed.
        `fresh`: the drafts just came in (the guess starts empty)."""
        s, v, b = self.studio, self.studio.display, self.bar
        trace, n = run.trace(), len(run.rounds)
        update = {
            s.trace: trace,
            **s.panels(trace, k if 0 < k < n else None, view),
            v.round: views.slider_value(trace, k or None),
            v.segment: "",
        }
        if run.pending is not None and k >= n:
            choices = guess_choices(run.drafts)
            guess = gr.Radio(choices, value=None, visible=True) if fresh else gr.Radio(choices, visible=True)
            update |= {
                v.candidates: views.arriving_value(run.drafts),
                v.matrix: hidden_matrix(n + 1),
                v.status: run.drafting,
                b.guess: guess,
                **self.bar_update(run, k, drafts_note(n + 1, run.drafts)),
            }
            return update
        update[b.guess] = gr.Radio(visible=False)
        return update | self.bar_update(run, k, looking_note(k, n, run.pending is not None, run.over))

    async def back(self, trace: Trace | None, shown: float, view: str, request: gr.Request) -> Update:
        """Back (←, PageUp): the round before the one shown, in every panel."""
        run = self.runs.get(session_of(request))
        if run is None:  # no stepping run here (any more): the trace shown
            return self.looked_back(None, trace, int(shown), view)
        async with run.beat:
            return self.looked_back(run, run.trace(), int(shown), view)

    def looked_back(self, run: StepRun | None, trace: Trace | None, shown: int, view: str) -> Update:
        if trace is None or not trace.rounds or shown <= 1:
            return unchanged()
        k = min(shown, len(trace.rounds) + 1) - 1
        drafted = run is not None and run.pending is not None
        return {
            **self.studio.panels(trace, k, view),
            self.studio.display.round: views.slider_value(trace, k),
            self.studio.display.segment: "",
            self.bar.guess: gr.Radio(visible=False),
            **self.bar_update(run, k, looking_note(k, len(trace.rounds), drafted)),
        }

    def finished(self, run: StepRun, shown: float) -> Update:
        last = run.rounds[-1] if run.rounds else None
        return {
            **self.bar_update(run, int(shown), ended_note(last, run.tally, run.why)),
            self.bar.guess: gr.Radio(visible=False),
            **self.still(False),
        }

    def gone(self, run: StepRun, view: str, error: BaseException) -> Update:
        """The engine ended the run (its message on the status line and the note); what was revealed stays."""
        why = self.studio.servers.scrub(str(error))
        run.end(why)
        n = len(run.rounds)
        return {
            **self.scene(run, n, view),
            self.studio.display.status: md(said(why)),  # the page's language; run.end keeps the English
            **self.finished(run, n),
        }

    async def home(self, shown: float, view: str, request: gr.Request) -> Update:
        """Home: round 1 of the rounds revealed."""
        return await self.go(1, view, request)

    async def end_(self, shown: float, view: str, request: gr.Request) -> Update:
        """End: the latest round revealed (with its successor's drafts and the guess, if they wait)."""
        return await self.go(None, view, request)

    async def go(self, k: int | None, view: str, request: gr.Request) -> Update:
        run = self.runs.get(session_of(request))
        if run is None or not run.rounds:
            return unchanged()
        async with run.beat:
            return self.scene(run, len(run.rounds) if k is None else k, view)

    # ---- the bar --------------------------------------------------------------------------------

    def bar_update(self, run: StepRun | None, shown: int, note: str) -> Update:
        """The buttons as what is due allows them, and the note."""
        b = self.bar
        beat = run.due(shown) if run is not None else ENDED
        return {  # the press that → makes is the primary button
            b.next: gr.Button(
                interactive=beat != ENDED, variant="secondary" if beat == REVEAL else "primary"
            ),
            b.reveal: gr.Button(
                interactive=beat == REVEAL, variant="primary" if beat == REVEAL else "secondary"
            ),
            b.back: gr.Button(interactive=shown > 1),
            b.home: gr.Button(interactive=shown > 1),
            b.end: gr.Button(interactive=run is not None and shown < len(run.rounds)),
            b.play: gr.Button(interactive=beat != ENDED),
            b.note: note,
        }

    def still(self, playable: bool) -> Update:
        """Play stopped: the timer off, the button says Play (and takes a press if `playable`)."""
        b = self.bar
        return {
            b.timer: gr.Timer(active=False),
            b.play: gr.Button(_(PLAY), interactive=playable),
            b.playing: False,
        }

    def play(self, playing: bool, pace: float, shown: float, request: gr.Request) -> Update:
        """Play / Pause (space): one beat every half `pace` seconds, until Pause or the end."""
        run = self.runs.get(session_of(request))
        if playing or run is None or run.due(shown) == ENDED:
            return self.still(run is not None and run.due(shown) != ENDED)
        b = self.bar
        return {b.timer: gr.Timer(float(pace) / 2, active=True), b.play: gr.Button(_(PAUSE)), b.playing: True}

    def set_pace(self, playing: bool, pace: float) -> Update:
        return {self.bar.timer: gr.Timer(float(pace) / 2, active=bool(playing))}

    def stop(self, shown: float, request: gr.Request) -> Update:
        """Stop: the session's stepping run ends (Studio's own Stop keeps what was revealed)."""
        run = self.runs.get(session_of(request))
        if run is None:
            return self.still(False)
        run.end(_("Stopped by the user."))
        last = run.rounds[-1] if run.rounds else None
        return {
            **self.bar_update(run, int(shown), ended_note(last, run.tally, run.why)),
            self.bar.guess: gr.Radio(visible=False),
            **self.still(False),
        }

    def toggle(self, on: bool, trace: Trace | None, view: str, request: gr.Request) -> Update:
        """The box: the bar shows while it is checked. Checked with a run shown, that run steps as a
        recorded one from round 1; unchecked, the stepping run ends (a recorded one is shown whole
        again)."""
        session = session_of(request)
        shown = {self.bar.bar: gr.Group(visible=bool(on))}
        if on:
            return shown | self.still(False) | (self.replaying(trace, view, session) if trace else {})
        run = self.runs.get(session)
        self.drop(session)
        whole = run.recorded if run is not None else None
        if whole is None:
            return shown | self.still(False)
        s, v = self.studio, self.studio.display
        return (
            shown
            | self.reset()
            | {
                s.trace: whole,
                **s.panels(whole, None, view),
                v.round: views.slider_value(whole),
                v.segment: "",
                v.plain: views.plain_answer(whole.rounds),
                s.controls.download: download_value(whole, session),
            }
        )

    def opened(self, step: bool, trace: Trace | None, view: str, request: gr.Request) -> Update:
        """A trace was uploaded (or a lesson opened): with the box checked, it steps from round 1."""
        if not step:
            return unchanged()
        return self.replaying(trace, view, session_of(request))

    def drop(self, session: str) -> None:
        run = self.runs.pop(session, None)
        if run is not None:
            run.end("")

    async def unload(self, request: gr.Request) -> None:
        """The page was closed: its stepping run ends now, not at the server's idle limit."""
        self.drop(session_of(request))
