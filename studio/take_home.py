"""Taking the run shown home: a handout (one offline HTML page) and the round shown as a PNG slide,
from specfuse.handout, served like the trace downloads (a click writes the file and the browser
downloads it; it also stays offered below the buttons). A teacher's class session's votes go into the
handout beside each round's candidates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import gradio as gr

from specfuse import SpecfuseError, Trace

from .downloads import slide_font
from .handlers import Studio
from .i18n import _, current
from .updates import TRACE_FILES, session_of, shown_round

NOTHING = "Nothing to take home yet: run the ensemble, open a lesson or upload a trace first."

# Once the file is written: the browser downloads it (the component's link stays as a fallback).
SAVE = """(file) => {
  if (!file || !file.url) return;
  const link = document.createElement("a");
  link.href = file.url;
  link.download = file.orig_name || "";
  document.body.appendChild(link);
  link.click();
  link.remove();
}"""


@dataclass
class Handouts:
    html: gr.Button
    png: gr.Button
    file: gr.File


def handouts_panel() -> Handouts:
    with gr.Row():
        html = gr.Button("Download handout (HTML)", size="sm", elem_id="class-handout")
        png = gr.Button("Round as PNG", size="sm", elem_id="class-round-png")
    file = gr.File(label="Your download", visible=False, interactive=False, elem_id="class-file")
    return Handouts(html, png, file)


def handout_file(trace: Trace | None, session: str = "", room: list[dict[str, Any]] | None = None) -> str:
    """The trace shown as a self-contained HTML page, written where downloads live; `room`: the class
    session's votes on its rounds (studio.room_page.Desk.spread), shown beside each round's candidates."""
    from specfuse.handout import trace_html

    if trace is None or not trace.rounds:
        raise gr.Error(_(NOTHING))
    page = trace_html(trace, lang=current(), room=room)
    return TRACE_FILES.write_file(page, session, "handout", "html")


def round_file(trace: Trace | None, k: float | None, session: str = "") -> str:
    """Round k of the trace shown (the slider's round) as a 1920×1080 PNG, written where downloads live."""
    from specfuse.handout import round_png

    rnd = shown_round(trace, k)
    if trace is None or rnd is None:
        raise gr.Error(_(NOTHING))
    lang = current()
    png = round_png(trace, rnd.k, font=slide_font(trace, cjk=lang != "en"), lang=lang)
    return TRACE_FILES.write_file(png, session, f"round{rnd.k}", "png")


def wire_handouts(
    studio: Studio, handouts: Handouts, spread: Callable[[str], list[dict[str, Any]]] | None = None
) -> None:
    """The handout's buttons; `spread`: a teacher's class session's votes (Desk.spread), if any."""

    def handout(
        trace: Trace | None,
        request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
    ) -> gr.File:
        session = session_of(request)
        try:
            room = spread(session) if spread is not None else None
            return gr.File(handout_file(trace, session, room), visible=True)
        except SpecfuseError as e:
            raise studio.error(e) from e

    def round_slide(
        trace: Trace | None,
        k: float | None,
        request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
    ) -> gr.File:
        try:
            return gr.File(round_file(trace, k, session_of(request)), visible=True)
        except SpecfuseError as e:
            raise studio.error(e) from e

    out = handouts.file
    handouts.html.click(handout, [studio.trace], [out], api_visibility="private").success(
        None, [out], None, js=SAVE
    )
    handouts.png.click(
        round_slide, [studio.trace, studio.display.round], [out], api_visibility="private"
    ).success(None, [out], None, js=SAVE)
