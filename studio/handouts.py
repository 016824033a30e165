"""Take the run shown home: a handout (one offline HTML page to step through) and the round shown
as a PNG slide, from specfuse.handout, served like the trace downloads (studio.downloads).

A click writes the file and the browser downloads it at once; the file also stays offered below
the buttons. Knows nothing about layout beyond its own buttons.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import gradio as gr

from specfuse import SpecfuseError, Trace

from .handlers import Studio
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


def handout_file(trace: Trace | None, session: str = "") -> str:
    """The trace shown as a self-contained HTML page, written where downloads live."""
    from specfuse.handout import trace_html

    if trace is None or not trace.rounds:
        raise gr.Error(NOTHING)
    return TRACE_FILES.write_file(trace_html(trace), session, "handout", "html")


# Fonts that draw more than ASCII (Pillow's built-in one draws other characters as empty boxes),
# tried in order where the system has them: Latin, Greek and symbols; then Chinese, Japanese, Korean.
FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",)
CJK_FONTS = (
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
)
CJK = re.compile("[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")


def slide_font(trace: Trace) -> str | None:
    """A font on this system that draws the trace's text (a CJK one when it holds CJK), or None."""
    texts = [trace.prompt, *(c.text for r in trace.rounds for c in r.candidates)]
    wanted = CJK_FONTS if any(CJK.search(t) for t in texts) else FONTS
    return next((f for f in wanted if Path(f).is_file()), None)


def round_file(trace: Trace | None, k: float | None, session: str = "") -> str:
    """Round k of the trace shown (the slider's round) as a 1920×1080 PNG, written where downloads live."""
    from specfuse.handout import round_png

    rnd = shown_round(trace, k)
    if trace is None or rnd is None:
        raise gr.Error(NOTHING)
    png = round_png(trace, rnd.k, font=slide_font(trace))
    return TRACE_FILES.write_file(png, session, f"round{rnd.k}", "png")


def wire_handouts(studio: Studio, handouts: Handouts) -> None:
    def handout(
        trace: Trace | None,
        request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
    ) -> gr.File:
        try:
            return gr.File(handout_file(trace, session_of(request)), visible=True)
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
