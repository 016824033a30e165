"""What every handler's update is made of: the {component: value} dict, "leave it", the trace
download button, the session and the round shown.

Knows nothing about layout or about runs: handlers.py and what_if.py build their updates from these.
"""

from __future__ import annotations

from typing import Any, cast

import gradio as gr

from specfuse import Round, Trace

from .downloads import TraceFiles

Update = dict[Any, Any]  # {component: value}


def unchanged() -> Update:
    """Leave every output as it is. (An empty dict is not that: Gradio reads `{}` as one value for
    the first output and fails the event with "didn't return enough output values".)"""
    return cast(Update, gr.skip())


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
