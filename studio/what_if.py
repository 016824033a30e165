"""Studio's what-if handlers: the rules and evidence of the round shown, and a branch from it.

A mixin of Studio (handlers.py), which holds the components, the loader and the schedulers: these
methods are its own, read apart. What they use of Studio is declared below, for the type checker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Optional

import gradio as gr

from specfuse import Round, SpecfuseError, Trace
from specfuse.engine import TYPED
from specfuse.records import Branch, Queued

from . import views, what_if_views
from .i18n import _
from .panels import Views
from .request import RunRequest
from .serving import Held, Schedulers, gpu, in_worker
from .updates import Update, download_value, session_of, shown_round

if TYPE_CHECKING:  # members.py brings torch; the app needs it only once models load
    from specfuse.engine import Ticket
    from specfuse.members.protocol import Member


class WhatIf:
    """Studio's what-if panels (rules, evidence, the branch pick) and the branch it runs."""

    if TYPE_CHECKING:  # Studio's (handlers.py)
        display: Views
        schedulers: Schedulers
        branching: dict[str, Held]
        begin: Callable[..., Generator[Update, None, tuple[Ticket, list[Member]]]]  # the prologue

        def error(self, message: object) -> gr.Error: ...

    def what_if(self, trace: Trace | None, k: int | float | None) -> Update:
        """The what-if panels for round k (default: the last): rules, evidence pickers, branch pick."""
        w = self.display.what_if
        rnd = shown_round(trace, k)
        verifiers, candidates = what_if_views.pair_choices(rnd)
        chosen = rnd.chosen if rnd is not None else None
        return {
            w.rules: what_if_views.rules_value(rnd, trace.config.score if trace is not None else None),
            w.verifier: gr.Dropdown(choices=verifiers, value=0 if verifiers else None),
            w.candidate: gr.Dropdown(choices=candidates, value=chosen),
            w.tokens: views.token_html(rnd, 0, chosen, trace.config.score) if trace is not None else "",
            w.branch_candidate: gr.Dropdown(choices=candidates, value=chosen),
        }

    def clear_branch(self) -> Update:
        w = self.display.what_if
        return {w.branch_view: "", w.branch_download: gr.DownloadButton(value=None, visible=False)}

    def evidence(self, trace: Trace | None, k: float, i: int | None, j: int | None) -> Update:
        rnd = shown_round(trace, k)
        score = trace.config.score if trace is not None else "logit"
        return {self.display.what_if.tokens: views.token_html(rnd, i, j, score)}

    def branch_handler(self) -> Callable[..., AsyncIterator[Update]]:
        async def branch(
            trace: Trace | None,
            k: float,
            pick: int | None,
            typed: str,
            device: str,
            progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's way to ask for a tracker)
            request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
        ) -> AsyncIterator[Update]:
            """Branch the run shown at round k: force a candidate or a typed segment, then continue."""
            session, held = session_of(request), Held()
            self.branching[session] = held
            try:
                async for update in in_worker(
                    self.stream_branch(trace, k, pick, typed, device, progress, session, held), held=held
                ):
                    yield update
            finally:
                if self.branching.get(session) is held:
                    del self.branching[session]

        return branch

    @gpu
    def stream_branch(
        self,
        trace: Trace | None,
        k: float,
        pick: int | None,
        typed: str,
        device: str,
        progress: Callable[..., Any],
        session: str = "",
        held: Held | None = None,
    ) -> Iterator[Update]:
        w = self.display.what_if
        held = held or Held()
        yield self.clear_branch()  # the previous branch (its view, its download) goes at once
        if trace is None or not trace.rounds:
            raise self.error(_("Run the ensemble or upload a trace first: a branch starts from a run."))
        k = max(1, min(int(k), len(trace.rounds)))
        rnd = trace.rounds[k - 1]
        if typed and typed.strip():
            forced, origin = typed, TYPED
        elif pick is not None and 0 <= int(pick) < len(rnd.candidates):
            forced, origin = rnd.candidates[int(pick)].text, rnd.candidates[int(pick)].member
        else:
            raise self.error(_("Pick a candidate to force, or type a segment."))
        start = trace.rounds[: k - 1]

        def unloadable(e: SpecfuseError) -> str:
            return _(
                "Branching runs the trace's members ({members}) again, and this app cannot load them: "
                "{e} The replay works without them; branching does not.",
                members=", ".join(trace.members),
                e=e,
            )

        # the trace's members, prompt and config, through the same prologue and batch as every run
        request = RunRequest(list(trace.members), trace.prompt, trace.config, device, progress=progress)
        branch = {"start": start, "forced": forced, "origin": origin}
        ticket, _loaded = yield from self.begin(request, held, say=False, unloadable=unloadable, **branch)
        stream = ticket.events()
        rounds = list(start)
        try:
            for new in stream:
                if isinstance(new, Queued):
                    running = self.schedulers.stats()["running"]
                    yield {w.branch_view: views.waiting_status(new.place, running, html=True)}
                if not isinstance(new, Round):
                    continue
                rounds.append(new)
                yield {w.branch_view: what_if_views.branch_html(trace.rounds, rounds, k, origin, forced)}
        except SpecfuseError as e:
            raise self.error(e) from e
        finally:
            stream.close()
            held.cancel()
        branched = Trace(
            trace.prompt,
            trace.members,
            trace.config,
            tuple(rounds),
            branch=Branch(trace.id, k, forced, origin),
        )
        yield {
            w.branch_view: what_if_views.branch_html(trace.rounds, rounds, k, origin, forced),
            w.branch_download: download_value(branched, session, "branch"),
        }
