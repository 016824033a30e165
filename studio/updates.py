"""What every handler's update is made of: the {component: value} dict, "leave it", the trace
download button, the session and the round shown.

Knows nothing about layout or about runs: handlers.py and what_if.py build their updates from these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import gradio as gr

from specfuse import Round, Trace

from .downloads import TraceFiles

Update = dict[Any, Any]  # {component: value}


def unchanged() -> Update:
    """Leave every output as it is. (An empty dict is not that: Gradio reads `{}` as one value for
    the first output and fails the event with "didn't return enough output values".)"""
    return cast(Update, gr.skip())


# Drawing one of a run's updates (two Plotly charts, the tables, the answer) takes a page's main
# thread about a quarter of a second on this machine's core. Rounds of tiny models or on a GPU come
# faster: a page drawing each one fell ever further behind the engine (18 s to show a run of tiny
# members in chromium here), too busy meanwhile to answer a click on Stop. Drawn at most twice a
# second, the same run shows in 6.4 s, every round still reachable on the slider once drawn.
PANEL_INTERVAL_S = 0.5


class Pacing:
    """A stream of updates drawn at most once per `interval` seconds. An update that comes sooner is
    held (as the function that makes it: a round's charts are built only if drawn), the newest of
    its kind replacing an older one; the next update that may be drawn, due() once the interval has
    passed, or flush() at the end draws what is held, merged component by component in the order the
    kinds last came (the newest value kept, as drawing them in turn would leave it). Pure: the clock
    is given."""

    def __init__(self, interval: float = PANEL_INTERVAL_S, clock: Callable[[], float] = time.perf_counter):
        self.interval = interval
        self.clock = clock
        self._drawn_at = -float("inf")
        self._held: dict[str, Callable[[], Update]] = {}

    def offer(self, kind: str, make: Callable[[], Update], *, now: bool = False) -> Update | None:
        """What to draw now (this update with what was held), or None: held for later."""
        self._held.pop(kind, None)  # re-inserted last: the order the kinds came in
        self._held[kind] = make
        return self.flush() if now else self.due()

    def due(self) -> Update | None:
        """What is held, once the interval since the last drawing has passed; else None."""
        return self.flush() if self.clock() - self._drawn_at >= self.interval else None

    def flush(self) -> Update | None:
        """Everything held, drawn now (None when nothing is)."""
        if not self._held:
            return None
        update: Update = {}
        for make in self._held.values():
            update |= make()
        self._held.clear()
        self._drawn_at = self.clock()
        return update


TRACE_FILES = TraceFiles()  # every trace download of this process (a bounded folder)


def write_trace(trace: Trace, session: str = "", kind: str = "run") -> str:
    """The trace as a JSON file for the download button (the session's previous one is deleted)."""
    return TRACE_FILES.write(trace, session, kind)


def download_value(trace: Trace | None, session: str = "", kind: str = "run") -> gr.DownloadButton:
    """The download button: hidden until there is a trace to download."""
    if trace is None or not trace.rounds:
        return gr.DownloadButton(value=None, visible=False)
    return gr.DownloadButton(value=write_trace(trace, session, kind), visible=True)


def session_of(request: gr.Request | None) -> str:
    return (request and request.session_hash) or ""


def shown_round(trace: Trace | None, k: int | float | None) -> Round | None:
    """Round k of the trace (default and past the end: the last), or None without rounds."""
    if trace is None or not trace.rounds:
        return None
    n = len(trace.rounds)
    return trace.rounds[max(1, min(int(k), n)) - 1] if k is not None else trace.rounds[-1]
