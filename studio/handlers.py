"""The event handlers: each returns (or yields) a {component: value} dict of only what it knows.

Loading, the run stream, stop, replay, segment selection and trace upload (the what-if panels and
branching: what_if.py, Studio's mixin). Errors a user can fix become one gr.Error, its text escaped
and with no server URL in it (studio.untrusted).
Knows nothing about layout (studio.layout places and wires the components).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

import gradio as gr

from specfuse import ConfigError, ModelLoadError, Prompt, Round, SpecfuseError, Trace, TraceError
from specfuse.limits import check_request
from specfuse.records import Draft, Queued
from specfuse.trace import MAX_TRACE_BYTES, load_trace

from . import views
from .i18n import _
from .loading import DevicePlan, Load, Loader, check_members
from .panels import Controls, Views
from .preparing import POLL_S, Preparing, relay
from .request import RunForm, RunRequest
from .serving import Held, Schedulers, gpu, in_worker
from .untrusted import Servers, error
from .updates import PANEL_INTERVAL_S, Pacing, Update, download_value, session_of, unchanged
from .what_if import WhatIf

if TYPE_CHECKING:  # members.py brings torch; the app needs it only once models load
    from specfuse.engine import Ticket
    from specfuse.members.protocol import Member

limits = {"trace_bytes": MAX_TRACE_BYTES}  # tests lower it

STOP_WAIT_S = 5.0  # how long Stop waits for its halted run to end before it answers anyway


@dataclass
class LiveRun:
    """A session's run in progress, as the server sees it: its latest trace, a halt, its end.

    The page sends Stop and the run's /cancel separately, and under load the cancel can take
    seconds to land: a run update sent after Stop's answer hid "stopped by the user". So Stop
    halts the run itself, waits for its end and answers from `trace`; the halted run's own last
    update says "stopped" too, so whichever the page shows last, it says so.
    """

    trace: Trace | None = None
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    held: Held = field(default_factory=Held)  # its ticket in the scheduler's batch


@dataclass
class RunClock:
    """When a run began, how long its members took to load, and how long its first round took."""

    began: float
    loading_s: float
    waited_s: float | None = None


@dataclass
class Studio(WhatIf):
    """The app's handlers over its components; `loader(name, device, progress)` gives shared members.

    The what-if panels' handlers and the branch are WhatIf's (what_if.py)."""

    loader: Loader
    choices: Sequence[str]
    allow_paths: bool
    plan_devices: DevicePlan
    controls: Controls
    display: Views
    trace: gr.State
    servers: Servers = field(default_factory=Servers)  # served members: name → spec (never shown)
    schedulers: Schedulers = field(default_factory=Schedulers)  # every run goes through one batch
    live: dict[str, LiveRun] = field(default_factory=dict)  # by session
    branching: dict[str, Held] = field(default_factory=dict)  # each session's branch under way
    draw_interval: float = PANEL_INTERVAL_S  # a run's panels drawn at most once per so many seconds

    def error(self, message: object) -> gr.Error:
        """A message for the page: escaped, and with every served member's URL replaced by its name."""
        return error(message, self.servers)

    # ---- run -----------------------------------------------------------------------------------

    def form(self) -> RunForm:
        """Run's own parameters (step mode and the conversation add theirs: studio.conversation)."""
        c = self.controls
        return RunForm(c.models, c.prompt, c.settings, c.device, c.compare, self.display.view)

    def run_outputs(self) -> list[gr.components.Component]:
        v = self.display
        return [
            self.trace,
            *v.by_name().values(),
            v.round,
            v.segment,
            self.controls.download,
            v.compared,
            v.plain,
            *v.what_if.round_outputs(),
            *v.what_if.branch_outputs(),
        ]

    async def run(self, request: RunRequest) -> AsyncIterator[Update]:
        """The session's live run (see `LiveRun`): load the members (once, shared), then one update
        per round, from stream_run on a thread of its own."""
        session, live = request.session, LiveRun()
        self.live[session] = live
        try:
            async for update in in_worker(self.stream_run(request, live), live.halt, live.held):
                live.trace = update.get(self.trace, live.trace)
                yield update
            if live.halt.is_set():  # Gradio re-sends a run's last update when it completes,
                # maybe after Stop's answer: let both say it (and clear what an earlier run left)
                yield self.stopped(live.trace, session) | self.cleared(live.trace)
        finally:  # a halted or cancelled run too: Stop waits for this, so it answers last
            live.ended.set()
            if self.live.get(session) is live:
                del self.live[session]

    def begin(
        self,
        request: RunRequest,
        held: Held,
        *,
        say: bool = True,
        unloadable: Callable[[SpecfuseError], str] | None = None,
        **branch: Any,
    ) -> Generator[Update, None, tuple[Ticket, list[Member]]]:
        """Every run's prologue (Run's, step mode's, a branch's): check the members, read the config,
        check the request (the engine checks it too: this fails before any loading), load the
        members (prepare: `say` puts its word on the status line), submit to the batch (`branch`:
        the scheduler's start, forced, origin, step) and hold the ticket. Refusals are one gr.Error;
        `unloadable(e)` words the page's message when the members cannot be checked or loaded.
        `ticket, members = yield from studio.begin(request, held)`."""
        loading = True  # while the members are checked, and again while they load
        try:
            names = check_members(request.members, self.choices, self.allow_paths)
            loading = False
            config = request.config()
            check_request(request.prompt, config, branch.get("start", ()), branch.get("forced"))
            loading = True
            loaded = yield from self.prepare(names, request.device, request.progress, say)
            loading = False
            return held.keep(self.schedulers.submit(loaded, request.prompt, config, **branch)), loaded
        except SpecfuseError as e:
            raise self.error(unloadable(e) if loading and unloadable is not None else e) from e

    def load(
        self,
        names: list[str],
        device: str,
        progress: Callable[..., Any],
        begin: Callable[[str, str], None] | None = None,
    ) -> list[Member]:
        """The members from the shared loader, placed by `plan_devices` (models.loading.load_each);
        `begin(name, device)` as each member starts (studio.preparing watches it)."""
        from specfuse.models.placement import load_each  # brings torch: only once members load

        try:
            devices = self.plan_devices(len(names), device)
        except ConfigError as e:  # its advice names the CLI flag; an app user picks from the form
            raise ConfigError(
                str(e).replace("use --device cpu", "choose Device “cpu” (or “auto”) under Settings")
            ) from e

        def one(name: str, dev: str, report: Callable[[float, str], None]) -> Member:
            if begin is not None:
                begin(name, dev)
            report(0.0, f"loading {name}")
            try:
                return self.loader(self.servers.spec(name), dev, report)  # a served member's URL
            except SpecfuseError:  # stays here: its spec goes to the loader, its name to the page
                raise
            except Exception as e:  # the app's edge: any load failure is a message, not a crash
                raise ModelLoadError(f"{name}: could not load: {type(e).__name__}: {e}") from e

        def shown(fraction: float, message: str) -> None:
            progress(fraction, desc=self.servers.scrub(message))  # the bar shows text as text

        return load_each(names, devices, one, shown)

    def prepare(
        self, names: list[str], device: str, progress: Callable[..., Any], say: bool = True
    ) -> Generator[Update, None, list[Member]]:
        """load()'s members, loaded on a thread of their own while this drives Gradio's progress bar
        and (`say`) yields the status line's word of what is happening (studio.preparing); members
        already loaded come back at once, nothing said. `members = yield from studio.prepare(...)`."""
        job = Preparing.start(self.load, names, device, self.under_way)
        last = None
        while not job.done.wait(POLL_S):
            text = relay(job, progress, last)
            if text is not None:
                last = text
                if say:
                    yield {self.display.status: text}
        return job.result()

    def under_way(self, name: str, device: str) -> Load | None:
        """The shared loader's load of this member under way (by its shown name), if it says."""
        under_way = getattr(self.loader, "under_way", None)
        return under_way(self.servers.spec(name), device) if under_way is not None else None

    @gpu
    def stream_run(self, request: RunRequest, live: LiveRun | None = None) -> Iterator[Update]:
        """Load the members (once, shared), then yield one update per round (and per compared member).

        The run is a ticket in the scheduler's batch, beside every other user's (and API client's);
        while it waits for a place the status says which."""
        v = self.display
        held = live.held if live is not None else Held()
        began = time.perf_counter()
        ticket, loaded = yield from self.begin(request, held)
        pacing = Pacing(self.draw_interval)  # rounds quicker than a page draws are drawn together
        stream = ticket.paced_events(pacing.interval)
        clock = RunClock(began, time.perf_counter() - began)
        drafts: list[Draft] = []  # the candidates of the round being drafted, as they arrive
        trace = None
        first = [True]

        def round_panels(trace: Trace) -> Update:  # made only when drawn: the first clears a branch
            fresh, first[0] = first[0], False
            return self.round_update(trace, request, clock, fresh=fresh)

        try:
            for event in stream:
                if event is None:  # nothing new for a while: what was held back is drawn
                    update = pacing.due()
                elif isinstance(event, Queued):  # still waiting for a place in the batch
                    status = views.waiting_status(event.place, self.schedulers.stats()["running"])
                    update = pacing.offer("status", partial(dict, {v.status: status}), now=True)
                elif isinstance(event, Draft):
                    drafts.append(event)
                    rounds = trace.rounds if trace else ()
                    update = pacing.offer(
                        "draft", partial(self.draft_update, list(drafts), rounds, ticket, clock)
                    )
                elif isinstance(event, Round):
                    drafts = []
                    clock.waited_s = clock.waited_s or time.perf_counter() - began
                    trace = ticket.trace(upto=event.k)  # the ticket may hold rounds not read yet
                    last = event.stop_reason is not None
                    update = pacing.offer("round", partial(round_panels, trace), now=last)
                else:  # Finished (after the last round) or Paused: the view catches up
                    update = pacing.flush()
                if update is not None:
                    yield update
            if held.cancelled:  # stopped: no member alone after it
                return
            if request.compare and trace is not None:
                yield from self.compare_updates(trace, loaded, request, clock, held)
        except SpecfuseError as e:
            raise self.error(e) from e
        finally:
            stream.close()  # a cancelled job closes this generator: its ticket leaves the batch
            held.cancel()

    def draft_update(
        self, drafts: list[Draft], rounds: Sequence[Round], ticket: Ticket, clock: RunClock
    ) -> Update:
        """A candidate of the round being drafted arrived: show the candidates so far."""
        v = self.display
        drafting = rounds[-1].next_drafters if rounds else ticket.members
        elapsed = time.perf_counter() - clock.began
        return {
            # Round 1's first candidate: Stop now keeps no older run, and none shows.
            **(self.cleared(None) if not rounds else {}),
            v.candidates: views.arriving_value(drafts),
            v.status: views.arriving_status(
                drafts, drafting, elapsed, clock.loading_s, since=rounds[-1].elapsed if rounds else 0.0
            ),
        }

    def round_update(self, trace: Trace, request: RunRequest, clock: RunClock, fresh: bool) -> Update:
        """A round was decided: every panel, for the run so far (its download once it is done);
        `fresh`: the run's first panels drawn."""
        rnd = trace.rounds[-1]
        done = rnd.stop_reason is not None and not request.compare
        return self.run_update(
            trace,
            request.view,
            clock,
            fresh=fresh,
            download=download_value(trace if done else None, request.session),
            compared=views.compare_html([("ensemble", rnd.text)]) if request.compare else "",
        )

    def compare_updates(
        self, trace: Trace, loaded: list[Member], request: RunRequest, clock: RunClock, held: Held
    ) -> Iterator[Update]:
        """Compare: each member alone, its answer growing beside the ensemble's; then the whole run."""
        v = self.display
        columns = [("ensemble", trace.rounds[-1].text)]
        for member in loaded:
            alone = ""
            for solo in self.alone(member, trace.prompt, trace.config, held):
                alone = solo.text
                yield {v.compared: views.compare_html([*columns, (f"{member.name} alone", alone)])}
            columns.append((f"{member.name} alone", alone))
        # everything again: an API caller reads the whole run from the last update
        download = download_value(trace, request.session)
        yield self.run_update(
            trace, request.view, clock, download=download, compared=views.compare_html(columns)
        )

    def run_update(
        self, trace: Trace, view: str, clock: RunClock, *, download: Any, compared: str, fresh: bool = False
    ) -> Update:
        """Every panel of a run, for its rounds so far (`fresh`: round 1, no branch of an older run)."""
        v = self.display
        return {
            self.trace: trace,
            **self.panels(trace, view=view),
            **(self.clear_branch() if fresh else {}),
            v.status: views.status_markdown(trace.rounds, waited_s=clock.waited_s, loading_s=clock.loading_s),
            v.round: views.slider_value(trace),
            v.segment: "",
            self.controls.download: download,
            v.compared: compared,
            v.plain: views.plain_answer(trace.rounds),
        }

    def alone(self, member: Member, prompt: Prompt, config: Any, held: Held) -> Iterator[Round]:
        """Compare: the member alone on the prompt, through the same batch as everyone's runs."""
        try:
            stream = held.hold(self.schedulers.submit([member], prompt, config))
        except SpecfuseError as e:
            raise self.error(e) from e
        try:
            for event in stream:
                if isinstance(event, Round):
                    yield event
        finally:
            stream.close()

    def cleared(self, trace: Trace | None) -> Update:
        """Without a trace: every panel an earlier run filled, emptied (the answer under "Nothing to
        keep" was the previous run's). With one: nothing."""
        if trace is not None and trace.rounds:
            return {}
        v = self.display
        return {
            self.trace: None,
            v.answer: views.answer_component(None),
            v.plain: "",
            v.segment: "",
            v.compared: "",
            self.controls.download: download_value(None),
        }

    def panels(
        self, trace: Trace | None, k: int | None = None, view: str = views.NORMALIZED, note: str = ""
    ) -> Update:
        names = self.display.by_name()
        update = {names[key]: value for key, value in views.round_panels(trace, k, view, note).items()}
        return update | self.what_if(trace, k)

    # ---- after a run ---------------------------------------------------------------------------

    async def stop(self, trace: Trace | None, request: gr.Request) -> Update:
        """End the session's run (see `LiveRun`), keep what it produced and offer it as a trace."""
        session = session_of(request)
        live = self.live.get(session)
        if live is not None:
            live.halt.set()
            live.held.cancel()  # its ticket leaves the batch; nobody else's does
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.ended.wait(), STOP_WAIT_S)
            trace = live.trace
        return self.stopped(trace, session)

    async def unload(self, request: gr.Request) -> None:
        """The page was closed: its run and branch leave the batch now. (Gradio stops reading a closed
        page's run but never closes it: it would play on to its budget, holding a place.)"""
        session = session_of(request)
        live, held = self.live.pop(session, None), self.branching.pop(session, None)
        if live is not None:
            live.halt.set()
            live.held.cancel()
        if held is not None:
            held.cancel()

    def stopped(self, trace: Trace | None, session: str = "") -> Update:
        """The status and the trace download of a run the user stopped."""
        if trace is None or not trace.rounds:  # stopped while round 1 was still being drafted
            return {
                self.display.status: _("Nothing to keep: stopped by the user before round 1 was decided."),
                self.controls.download: download_value(None),
            }
        return {
            self.display.status: views.status_markdown(trace.rounds, _("stopped by the user")),
            self.controls.download: download_value(trace, session),
        }

    def replay(self, trace: Trace | None, k: float | None, view_name: str) -> Update:
        # k is None or out of range while a round is typed (the box emptied first): nothing yet
        if trace is None or not trace.rounds or k is None or not 1 <= k <= len(trace.rounds):
            return unchanged()
        return self.panels(trace, int(k), view_name)

    def select_segment(self, trace: Trace | None, view_name: str, evt: gr.SelectData) -> Update:
        if trace is None or not trace.rounds or not isinstance(evt.index, int):
            return unchanged()
        k = min(evt.index + 1, len(trace.rounds))
        update = self.panels(trace, k, view_name)
        update[self.display.answer] = views.answer_component(trace, k - 1)  # whole, segment k marked
        update[self.display.segment] = views.segment_html(trace.rounds, k - 1)
        update[self.display.round] = views.slider_value(trace, k)
        return update

    def load_trace_file(
        self,
        path: str | None,
        view_name: str,
        request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
    ) -> Update:
        if not path:
            return unchanged()
        try:
            trace = load_trace(path, max_bytes=limits["trace_bytes"])
        except TraceError as e:
            raise self.error(_("Cannot replay this file: {e}", e=e)) from e
        if not trace.rounds:
            raise self.error(_("The trace has no rounds to replay."))
        note = _("replayed from a trace of {n} members", n=len(trace.members))
        return self.show_trace(trace, view_name, note, session_of(request))

    def show_trace(self, trace: Trace, view_name: str, note: str, session: str = "") -> Update:
        """A whole trace in every panel, no model loaded: an upload's, a lesson's (studio.gallery)."""
        return {
            **self.clear_branch(),
            self.trace: trace,
            **self.panels(trace, None, view_name, note),
            self.display.round: views.slider_value(trace),
            self.display.segment: "",
            self.controls.download: download_value(trace, session),
            self.display.plain: views.plain_answer(trace.rounds),
        }
