"""The event handlers: each returns (or yields) a {component: value} dict of only what it knows.

Loading, the run stream, stop, replay, segment selection and trace upload. Errors a user can fix
become one gr.Error. Knows nothing about layout (studio.layout places and wires the components).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

import gradio as gr

from specfuse import (
    ConfigError,
    Ensemble,
    ModelLoadError,
    Round,
    SpecfuseError,
    Trace,
    TraceError,
    UnknownModelError,
    dump_trace,
)
from specfuse.engine import TYPED, check_prompt
from specfuse.records import Branch, Draft
from specfuse.trace import MAX_TRACE_BYTES, load_trace

from . import failures, settings, views
from .panels import Controls, Failures, Views

if TYPE_CHECKING:  # members.py brings torch; the app needs it only once models load
    from specfuse.members.protocol import Member

try:  # On a Hugging Face ZeroGPU Space this grants a GPU per call; elsewhere it changes nothing.
    import spaces

    gpu = spaces.GPU(duration=300)
except ImportError:

    def gpu(fn: Callable) -> Callable:
        return fn


Loader = Callable[[str, str, Callable[[float, str], None]], "Member"]  # (name, device, progress) → member
DevicePlan = Callable[[int, str], list[str]]  # (members, device setting) → one device each
Update = dict[Any, Any]  # {component: value}


def unchanged() -> Update:
    """Leave every output as it is. (An empty dict is not that: Gradio reads `{}` as one value for
    the first output and fails the event with "didn't return enough output values".)"""
    return cast(Update, gr.skip())


limits = {"trace_bytes": MAX_TRACE_BYTES}  # tests lower it


def write_trace(trace: Trace) -> str:
    """The trace as a JSON file in a fresh temp folder, for the download button."""
    folder = tempfile.mkdtemp(prefix="specfuse-trace-")
    path = Path(folder) / f"specfuse-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(dump_trace(trace), encoding="utf-8")
    return str(path)


def download_value(trace: Trace | None) -> gr.DownloadButton:
    """The download button: hidden until there is a trace to download."""
    if trace is None or not trace.rounds:
        return gr.DownloadButton(value=None, visible=False)
    return gr.DownloadButton(value=write_trace(trace), visible=True)


def shown_round(trace: Trace | None, k: int | float | None) -> Round | None:
    """Round k of the trace (default and past the end: the last), or None without rounds."""
    if trace is None or not trace.rounds:
        return None
    n = len(trace.rounds)
    return trace.rounds[max(1, min(int(k), n)) - 1] if k is not None else trace.rounds[-1]


def check_members(names: Any, choices: Sequence[str], allow_paths: bool) -> list[str]:
    """Two or more distinct members, each from the catalogue unless paths and hub ids are allowed."""
    if isinstance(names, str):
        names = [names]
    names = [str(n).strip() for n in names or [] if str(n).strip()]
    if len(set(names)) < 2:
        raise ConfigError("Pick two or more different members: an ensemble of one is that model alone.")
    if len(set(names)) != len(names):
        raise ConfigError(f"Each member may be picked once; got {', '.join(names)}.")
    unknown = [n for n in names if n not in choices]
    if unknown and not allow_paths:
        raise UnknownModelError(
            f"Unknown model {unknown[0]!r}; known: {', '.join(choices)}. "
            "Start the app with --allow-paths to use local folders or hub ids."
        )
    return names


async def in_worker(stream: Iterator[Update], halt: asyncio.Event | None = None) -> AsyncIterator[Update]:
    """Iterate a blocking generator in its own thread, so that a cancel (Stop) returns at once.

    Gradio iterates a sync generator in a thread that a cancel cannot interrupt, and its /cancel
    waits for the step in flight: the page keeps the cancelled run "pending" for up to a round and
    ignores Run meanwhile (trigger_mode "once"). Here a cancel, or setting `halt`, ends this
    coroutine at once; the thread finishes the step in flight, then closes the generator (and with
    it the engine's states).
    """
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    stopped = threading.Event()
    if halt is not None:  # what is already queued is still yielded, then the end
        watch = asyncio.ensure_future(halt.wait())
        watch.add_done_callback(lambda _: items.put_nowait(("done", None)))

    def post(kind: str, value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (the server shut down): no reader
            loop.call_soon_threadsafe(items.put_nowait, (kind, value))

    def work() -> None:
        try:
            for item in stream:
                if stopped.is_set():
                    break
                post("item", item)
        except BaseException as e:  # handed to the coroutine, which raises it in the event
            post("error", e)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
            post("done", None)

    threading.Thread(target=work, name="specfuse-run", daemon=True).start()
    try:
        while True:
            kind, value = await items.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stopped.set()
        if halt is not None:
            watch.cancel()


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


@dataclass
class Studio:
    """The app's handlers over its components; `loader(name, device, progress)` gives shared members."""

    loader: Loader
    choices: Sequence[str]
    allow_paths: bool
    plan_devices: DevicePlan
    controls: Controls
    display: Views
    trace: gr.State
    live: dict[str, LiveRun] = field(default_factory=dict)  # by session

    # ---- run -----------------------------------------------------------------------------------

    def run_inputs(self) -> list[gr.components.Component]:
        c = self.controls
        return [c.models, c.prompt, *c.settings.values(), c.device, c.compare, self.display.view]

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

    def run_handler(self) -> Callable[..., AsyncIterator[Update]]:
        """run(members, prompt, <one argument per EnsembleConfig field>, device, compare, view_name).

        Its signature names every setting, so the API takes them as keywords (`segment_len=4`).
        """
        names = list(self.controls.settings)

        async def run(*values: Any) -> AsyncIterator[Update]:
            members, prompt, *rest = values
            form = dict(zip(names, rest[: len(names)]))
            device, compare, view, progress, request = rest[len(names) :]
            session, live = (request and request.session_hash) or "", LiveRun()
            self.live[session] = live
            try:
                async for update in in_worker(
                    self.stream_run(members, prompt, form, device, compare, view, progress), live.halt
                ):
                    live.trace = update.get(self.trace, live.trace)
                    yield update
                if live.halt.is_set():  # Gradio re-sends a run's last update when it completes,
                    yield self.stopped(live.trace)  # maybe after Stop's answer: let both say it
            finally:  # a halted or cancelled run too: Stop waits for this, so it answers last
                live.ended.set()
                if self.live.get(session) is live:
                    del self.live[session]

        keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
        c = self.controls
        parameters = [inspect.Parameter("members", keyword), inspect.Parameter("prompt", keyword)]
        parameters += [inspect.Parameter(n, keyword, default=c.settings[n].value) for n in names]
        parameters += [
            inspect.Parameter(name, keyword, default=widget.value)
            for name, widget in (
                ("device", c.device),
                ("compare", c.compare),
                ("view_name", self.display.view),
            )
        ]
        progress = inspect.Parameter("progress", keyword, default=gr.Progress())
        request = inspect.Parameter("request", keyword, default=None)
        run.__signature__ = inspect.Signature([*parameters, progress, request])  # type: ignore[attr-defined]
        run.__annotations__ = {"request": Optional[gr.Request]}  # noqa: UP045 (Gradio looks for this type)
        run.__doc__ = "Load the members (once, shared), then stream one update per round."
        return run

    def load(self, names: list[str], device: str, progress: Callable[..., Any]) -> list[Member]:
        """The members from the shared loader, placed by `plan_devices` (models.loading.load_each)."""
        from specfuse.models.loading import load_each  # brings torch: only once members load

        try:
            devices = self.plan_devices(len(names), device)
        except ConfigError as e:  # its advice names the CLI flag; an app user picks from the form
            raise ConfigError(
                str(e).replace("use --device cpu", "choose Device “cpu” (or “auto”) under Settings")
            ) from e

        def one(name: str, dev: str, report: Callable[[float, str], None]) -> Member:
            report(0.0, f"loading {name}")
            try:
                return self.loader(name, dev, report)
            except SpecfuseError:
                raise
            except Exception as e:  # the app's edge: any load failure is a message, not a crash
                raise ModelLoadError(f"{name}: could not load: {type(e).__name__}: {e}") from e

        return load_each(names, devices, one, lambda fraction, message: progress(fraction, desc=message))

    @gpu
    def stream_run(
        self,
        members: list[str],
        prompt: str,
        form: dict[str, Any],
        device: str,
        compare: bool,
        view: str,
        progress: Callable[..., Any],
    ) -> Iterator[Update]:
        """Load the members (once, shared), then yield one update per round (and per compared member)."""
        v = self.display
        began = time.perf_counter()
        try:
            names = check_members(members, self.choices, self.allow_paths)
            config = settings.config_from_form(form)
            check_prompt(prompt)  # the engine checks it too; this fails before any loading
            loaded = self.load(names, device, progress)
            ensemble = Ensemble(loaded, config)
        except SpecfuseError as e:
            raise gr.Error(str(e)) from e
        loading_s = time.perf_counter() - began
        waited_s: float | None = None
        rounds: list[Round] = []
        drafts: list[Draft] = []  # the candidates of the round being drafted, as they arrive
        trace = None
        stream = cast(Generator[Draft | Round, None, None], ensemble.events(prompt))
        try:
            for rnd in stream:
                if isinstance(rnd, Draft):
                    drafts.append(rnd)
                    drafting = rounds[-1].next_drafters if rounds else ensemble.names
                    yield {
                        **({self.trace: None} if not rounds else {}),  # Stop now keeps no older run
                        v.candidates: views.arriving_value(drafts),
                        v.status: views.arriving_status(
                            drafts, drafting, time.perf_counter() - began, loading_s
                        ),
                    }
                    continue
                drafts = []
                rounds.append(rnd)
                waited_s = waited_s or time.perf_counter() - began
                trace = Trace(prompt, ensemble.names, config, tuple(rounds))
                done = rnd.stop_reason is not None and not compare
                yield {
                    self.trace: trace,
                    **self.panels(trace, view=view),
                    **(self.clear_branch() if len(rounds) == 1 else {}),
                    v.status: views.status_markdown(rounds, waited_s=waited_s, loading_s=loading_s),
                    v.round: views.slider_value(trace),
                    v.segment: "",
                    self.controls.download: download_value(trace if done else None),
                    v.compared: views.compare_html([("ensemble", rnd.text)]) if compare else "",
                    v.plain: views.plain_answer(rounds),
                }
            if compare and trace is not None:
                columns = [("ensemble", trace.rounds[-1].text)]
                for member in loaded:
                    alone = ""
                    for solo in Ensemble([member], config).stream(prompt):
                        alone = solo.text
                        yield {v.compared: views.compare_html([*columns, (f"{member.name} alone", alone)])}
                    columns.append((f"{member.name} alone", alone))
                yield {  # everything again: an API caller reads the whole run from the last update
                    self.trace: trace,
                    **self.panels(trace, view=view),
                    v.status: views.status_markdown(trace.rounds, waited_s=waited_s, loading_s=loading_s),
                    v.round: views.slider_value(trace),
                    v.segment: "",
                    self.controls.download: download_value(trace),
                    v.compared: views.compare_html(columns),
                    v.plain: views.plain_answer(trace.rounds),
                }
        except SpecfuseError as e:
            raise gr.Error(str(e)) from e
        finally:
            stream.close()  # a cancelled job closes this generator: the engine's states go with it

    def panels(
        self, trace: Trace | None, k: int | None = None, view: str = views.NORMALIZED, note: str = ""
    ) -> Update:
        names = self.display.by_name()
        update = {names[key]: value for key, value in views.round_panels(trace, k, view, note).items()}
        return update | self.what_if(trace, k)

    def what_if(self, trace: Trace | None, k: int | float | None) -> Update:
        """The what-if panels for round k (default: the last): rules, evidence pickers, branch pick."""
        w = self.display.what_if
        rnd = shown_round(trace, k)
        verifiers, candidates = views.pair_choices(rnd)
        chosen = rnd.chosen if rnd is not None else None
        return {
            w.rules: views.rules_value(rnd),
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
        ) -> AsyncIterator[Update]:
            """Branch the run shown at round k: force a candidate or a typed segment, then continue."""
            async for update in in_worker(self.stream_branch(trace, k, pick, typed, device, progress)):
                yield update

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
    ) -> Iterator[Update]:
        w = self.display.what_if
        if trace is None or not trace.rounds:
            raise gr.Error("Run the ensemble or upload a trace first: a branch starts from a run.")
        k = max(1, min(int(k), len(trace.rounds)))
        rnd = trace.rounds[k - 1]
        if typed and typed.strip():
            forced, origin = typed, TYPED
        elif pick is not None and 0 <= int(pick) < len(rnd.candidates):
            forced, origin = rnd.candidates[int(pick)].text, rnd.candidates[int(pick)].member
        else:
            raise gr.Error("Pick a candidate to force, or type a segment.")
        try:
            names = check_members(list(trace.members), self.choices, self.allow_paths)
            loaded = self.load(names, device, progress)
        except SpecfuseError as e:
            raise gr.Error(
                f"Branching runs the trace's members ({', '.join(trace.members)}) again, and this app "
                f"cannot load them: {e} The replay works without them; branching does not."
            ) from e
        start = trace.rounds[: k - 1]
        before = start[-1].text if start else ""
        original = trace.rounds[-1].text
        rounds = list(start)
        stream = cast(
            Generator[Round, None, None],
            Ensemble(loaded, trace.config).stream(trace.prompt, start=start, forced=forced, origin=origin),
        )
        try:
            for new in stream:
                rounds.append(new)
                yield {w.branch_view: views.branch_html(original, new.text, before, k, origin)}
        except SpecfuseError as e:
            raise gr.Error(str(e)) from e
        finally:
            stream.close()
        branched = Trace(
            trace.prompt,
            trace.members,
            trace.config,
            tuple(rounds),
            branch=Branch(trace.id, k, forced, origin),
        )
        yield {
            w.branch_view: views.branch_html(original, rounds[-1].text, before, k, origin),
            w.branch_download: download_value(branched),
        }

    # ---- after a run ---------------------------------------------------------------------------

    async def stop(self, trace: Trace | None, request: gr.Request) -> Update:
        """End the session's run (see `LiveRun`), keep what it produced and offer it as a trace."""
        live = self.live.get(request.session_hash or "")
        if live is not None:
            live.halt.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.ended.wait(), STOP_WAIT_S)
            trace = live.trace
        return self.stopped(trace)

    def stopped(self, trace: Trace | None) -> Update:
        """The status and the trace download of a run the user stopped."""
        if trace is None or not trace.rounds:  # stopped while round 1 was still being drafted
            return {
                self.display.status: "Nothing to keep: stopped by the user before round 1 was decided.",
                self.controls.download: download_value(None),
            }
        return {
            self.display.status: views.status_markdown(trace.rounds, "stopped by the user"),
            self.controls.download: download_value(trace),
        }

    def replay(self, trace: Trace | None, k: float, view_name: str) -> Update:
        if trace is None or not trace.rounds:
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

    def load_trace_file(self, path: str | None, view_name: str) -> Update:
        if not path:
            return unchanged()
        try:
            trace = load_trace(path, max_bytes=limits["trace_bytes"])
        except TraceError as e:
            raise gr.Error(f"Cannot replay this file: {e}") from e
        if not trace.rounds:
            raise gr.Error("The trace has no rounds to replay.")
        note = f"replayed from a trace of {len(trace.members)} members"
        return {
            **self.clear_branch(),
            self.trace: trace,
            **self.panels(trace, None, view_name, note),
            self.display.round: views.slider_value(trace),
            self.display.segment: "",
            self.controls.download: download_value(trace),
            self.display.plain: views.plain_answer(trace.rounds),
        }


@dataclass
class FailureBrowser:
    """Handlers of the failure-case browser: filter the problems, open one in the replay panels."""

    run: failures.EvalRun
    studio: Studio
    panel: Failures

    def filter(self, which: str) -> Update:
        return {self.panel.table: failures.problems_table(self.run, which)}

    def open(self, view_name: str, evt: gr.SelectData) -> Update:
        row = evt.row_value if isinstance(evt.row_value, list) else None
        if not row:
            return unchanged()
        problem = str(row[0])
        mine = self.run.get(self.run.ensemble(), problem)
        found = self.run.trace(mine) if mine is not None else None
        if mine is None or found is None:
            raise gr.Error(f"No ensemble trace found for problem {problem!r} in {self.run.folder}.")
        update = self.studio.load_trace_file(str(found), view_name)
        ensemble_text = views.plain_answer(update[self.studio.trace].rounds)
        columns = [(f"ensemble ({failures.mark(mine)})", ensemble_text)]
        if self.run.best_member:
            best = self.run.get(f"{failures.SINGLE}{self.run.best_member}", problem)
            if best is not None:
                text, theirs = best.predicted or "", self.run.trace(best)
                if theirs is not None:
                    with contextlib.suppress(SpecfuseError, IndexError):  # else its answer
                        text = load_trace(theirs, max_bytes=limits["trace_bytes"]).rounds[-1].text
                columns.append((f"{self.run.best_member} alone ({failures.mark(best)})", text))
        note = f"problem {problem}: the ensemble's trace, replayed"
        update[self.studio.display.status] = views.status_markdown(update[self.studio.trace].rounds, note)
        update[self.studio.display.compared] = views.compare_html(columns)
        return update
