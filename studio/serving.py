"""The app's runs through the batching scheduler (specfuse.serve): every browser user's run, compare
and branch is a Ticket in one rolling batch; and the OpenAI-compatible API mounted beside the page.

Knows nothing about panels: handlers.py turns a ticket's events into updates. No torch at import.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.datastructures import URLPath
from starlette.routing import BaseRoute, Match, NoMatchFound, get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from specfuse import EnsembleConfig, Prompt
from specfuse.engine import DEFAULT_BATCH_SIZE, Scheduler, ServerSettings, Ticket
from specfuse.engine.scheduler import Event

if TYPE_CHECKING:
    from specfuse.members.protocol import Member

try:  # On a Hugging Face ZeroGPU Space this grants a GPU per call; elsewhere it changes nothing.
    import spaces

    gpu = spaces.GPU(duration=300)
except ImportError:

    def gpu(fn: Callable) -> Callable:
        return fn


# Runs at once in the app (Gradio's concurrency limit on Run and Branch): a batch's worth play, the
# others wait in the scheduler's line and see their place in it; more than that wait in the page's queue.
DEFAULT_CONCURRENCY = 2 * DEFAULT_BATCH_SIZE


class Schedulers:
    """The app's schedulers. Members are shared across sessions (studio.loading), and one scheduler
    batches the runs of every member it holds; a scheduler's members have distinct names, so the same
    model loaded on two devices goes to a second scheduler (rare: per-gpu plans). Usually one.
    """

    def __init__(
        self, config: EnsembleConfig | None = None, settings: ServerSettings | None = None, **given: Any
    ) -> None:
        """`settings`: the operator's (--batch-size, --parallel, step mode's bounds, --prefill-chunk),
        or its fields by name on top of the defaults; every scheduler made here gets them."""
        self.config = config or EnsembleConfig()
        self.settings = dataclasses.replace(settings or ServerSettings(), **given)  # checked at once
        self.all: list[Scheduler] = []
        self._lock = threading.Lock()

    def adopt(self, scheduler: Scheduler) -> None:
        """A scheduler made elsewhere (the mounted API's): the app's runs of its members go there."""
        with self._lock:
            self.all.insert(0, scheduler)

    def of(self, members: Sequence[Member]) -> Scheduler:
        """The scheduler for these members: the first whose members of the same names are these very
        ones (it takes on those it lacks, between rounds), else a new one."""
        with self._lock:
            for scheduler in self.all:
                held = dict(zip(scheduler.names, scheduler.ensemble.members))
                if all(held.get(m.name, m) is m for m in members):
                    new = [m for m in members if m.name not in held]
                    if new:
                        scheduler.add_members(new)
                    return scheduler
            scheduler = Scheduler(members, self.config, self.settings)
            self.all.append(scheduler)
            return scheduler

    def submit(
        self, members: Sequence[Member], prompt: Prompt, config: EnsembleConfig, **branch: Any
    ) -> Ticket:
        """A run of `members` (in this order) in their scheduler's batch. Raises ConfigError, QueueFull
        or SchedulerClosed at once; the run's own errors come from its events()."""
        return self.of(members).submit(prompt, config, members=[m.name for m in members], **branch)

    def stats(self) -> dict[str, int]:
        """Runs under way and waiting, over every scheduler."""
        with self._lock:
            every = [s.stats() for s in self.all]
        return {"running": sum(s["running"] for s in every), "waiting": sum(s["waiting"] for s in every)}

    def paused(self) -> int:
        """Step mode's runs open (paused, or playing the step asked for), over every scheduler."""
        with self._lock:
            return sum(s.stats()["paused"] for s in self.all)

    def close(self) -> None:
        with self._lock:
            every, self.all = self.all, []
        for scheduler in every:
            scheduler.close()


class Held:
    """The ticket a handler is following now, so that Stop, a closed page or the handler's end cancels
    it from any thread; cancel() before hold() cancels the ticket the moment it is held."""

    def __init__(self) -> None:
        self.ticket: Ticket | None = None
        self.cancelled = False

    def keep(self, ticket: Ticket) -> Ticket:
        """Hold a submitted ticket (cancelled at once if cancel() came first)."""
        self.ticket = ticket
        if self.cancelled:
            ticket.cancel()
        return ticket

    def hold(self, ticket: Ticket) -> Generator[Event, None, None]:
        """Hold a submitted ticket and follow its events (its place in line while it waits, then
        Draft and Round, then Finished). Closing the stream cancels the ticket."""
        return self.keep(ticket).events()

    def cancel(self) -> None:
        self.cancelled = True
        if self.ticket is not None:
            self.ticket.cancel()


T = TypeVar("T")


async def in_worker(
    stream: Iterator[T], halt: asyncio.Event | None = None, held: Held | None = None
) -> AsyncIterator[T]:
    """Iterate a blocking generator in its own thread, so that a cancel (Stop) returns at once.

    Gradio iterates a sync generator in a thread that a cancel cannot interrupt, and its /cancel
    waits for the step in flight: the page keeps the cancelled run "pending" for up to a round and
    ignores Run meanwhile (trigger_mode "once"). Here a cancel, or setting `halt`, ends this
    coroutine at once; the thread finishes the step in flight, then closes the generator (and with
    it the engine's states). `held`: the ticket the generator follows, cancelled when this ends, so
    that its place in the batch goes at once (not at the ticket's next event).
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
        if held is not None:
            held.cancel()


# ---- the page's <head> and the API beside the page -------------------------------------------------

# Gradio 6.31's status tracker counts a pending event's seconds in a loop that asks for a frame every
# frame while the event is pending, shown or not (show_progress="hidden"), and goes on when the tracker
# is removed: the page's own "Loading..." tracker is removed while pending, so every page asked for 60
# frames a second for as long as it stayed open. An idle page cost a tenth of a core (headless
# chromium: 0.10-0.12 CPU-s a second; 0.00 without the loop).
# A frame that loop asks for while no tracker shows a pending event is not given, which ends it; a shown
# timer counts as before. Only the direct caller is looked at (Svelte's shared animation loop also
# starts from that module, and must never be cut). Served first in <head> by PageHead, before Gradio's
# modules take their copy of requestAnimationFrame: Gradio's own `head` is added after they ran.
STATUS_TIMER_GUARD = """<script>(() => {
  const frame = window.requestAnimationFrame.bind(window);
  const shown = () => document.querySelector('[data-testid="status-tracker"]:not(.hide) .progress-text');
  window.requestAnimationFrame = (callback) => {
    const caller = (new Error().stack || "").split("\\n")[2] || "";
    return caller.includes("/statustracker-") && !shown() ? 0 : frame(callback);
  };
})();</script>"""


class FirstRoute(BaseRoute):
    """A route put first in the page's own server's router after launch (Gradio builds that server
    there); it names no URL. Subclasses say what they match and how they answer."""

    server_app: Any = None

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        raise NoMatchFound(name, path_params)

    def mount(self, server_app: Any) -> None:
        self.server_app = server_app
        server_app.router.routes.insert(0, self)


class PageHead(FirstRoute):
    """A route of the page's own server that puts `html` first in the <head> of the app's pages (a
    GET of "/" or of a route's path, `demo.pages`), before their own scripts; never in a file it
    serves. It marks the request, hands it back to the router and edits the answer when it is HTML."""

    MARK = "specfuse.page_head"

    def __init__(self, html: str, demo: Any) -> None:
        self.html = html.encode()
        self.paths = frozenset(f"/{route}".rstrip("/") for route, *_ in demo.pages)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        page = scope["type"] == "http" and scope["method"] == "GET" and not scope.get(self.MARK)
        if page and get_route_path(scope).rstrip("/") in self.paths:
            return Match.FULL, {}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        held: list[dict[str, Any]] = []  # a page's answer: its start, then its body

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                kind = dict(message.get("headers", [])).get(b"content-type", b"")
                if not kind.startswith(b"text/html"):
                    return await send(message)
                held.append(message)
                return None
            if not held or message["type"] != "http.response.body":
                return await send(message)
            held.append(message)
            if message.get("more_body"):
                return None
            start, *chunks = held
            body = b"".join(c.get("body", b"") for c in chunks).replace(b"<head>", b"<head>" + self.html, 1)
            headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
            await send(start | {"headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.server_app.router({**scope, self.MARK: True}, receive, sending)


class ApiRoute(FirstRoute):
    """A route of the page's own server that hands /v1/… and /health, untouched, to the API app
    (specfuse.serve.api.create_app): one process, one port, one scheduler for browser and API users."""

    def __init__(self, api: ASGIApp) -> None:
        self.api = api

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http":
            path = get_route_path(scope)
            if path == "/health" or path == "/v1" or path.startswith("/v1/"):
                return Match.FULL, {}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.api(scope, receive, send)
