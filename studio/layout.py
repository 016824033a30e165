"""The page: panels top to bottom, then the listeners; build_demo() is the whole app.

Knows nothing about how a member loads (the loader is passed in) and computes no values itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gradio as gr

from specfuse import EnsembleConfig
from specfuse.models.catalogue import CATALOGUE, DEFAULT_MEMBERS

from .browse import FailureBrowser
from .chat_panel import chat_panel
from .conversation import Conversing, wire_chat
from .explain import Notes, keymap_panel, presenter_bar, wire_keys, wire_presenter
from .failures import FILTERS, EvalRun, load_eval, problems_table
from .gallery import Shelf, gallery_panel, lesson_panel, shipped, wire_gallery
from .handlers import Studio
from .i18n import _, language_switch, localize, said, wire_language
from .loading import DEVICES, DevicePlan, Loader, same_device
from .panels import Failures, controls_panel, failures_panel, views_panel
from .room_page import Desk, room_button, room_panel, student_route, wire_room
from .serving import DEFAULT_CONCURRENCY, Schedulers
from .step_panel import step_panel
from .stepping import Stepper
from .take_home import handouts_panel, wire_handouts
from .untrusted import Servers, md
from .updates import PANEL_INTERVAL_S

CACHE_LIFETIME = (3600, 86400)  # Gradio's delete_cache: every hour, files older than a day


def build_demo(
    loader: Loader,
    *,
    choices: Sequence[str] | None = None,
    default_models: Sequence[str] | None = None,
    allow_paths: bool = False,
    device: str = "auto",
    devices: Sequence[str] = DEVICES,
    plan_devices: DevicePlan = same_device,
    concurrency_limit: int | None = DEFAULT_CONCURRENCY,
    defaults: dict[str, Any] | None = None,
    eval_dir: str | Path | None = None,
    served: dict[str, str] | None = None,
    schedulers: Schedulers | None = None,
    lessons: Shelf | None = None,
    draw_interval: float = PANEL_INTERVAL_S,
) -> gr.Blocks:
    """The whole app. `loader(name, device, progress)` returns a (shared) member; nothing loads here.

    Every run, compare and branch is a request to `schedulers` (default: new ones, batch size 8):
    users share one rolling batch, `concurrency_limit` runs at once (more wait in the page's queue).

    `served` maps the operator's name of each served member to its spec: the page offers the name
    and the loader gets the spec, so no browser user sees a server's URL or options.

    `lessons`: the gallery's lessons (default: the ones specfuse ships). `draw_interval`: a run's
    panels drawn at most once per so many seconds (0: every round and every arrival; updates.Pacing).
    """
    choices, default_models = offered(choices, default_models)
    config = EnsembleConfig(**(defaults or {}))

    # Gradio keeps a copy of every file it serves (trace downloads, uploads): a day's worth at most.
    with gr.Blocks(title="SpecFuse Studio", delete_cache=CACHE_LIFETIME) as demo:
        switch = language_switch()  # English / 中文: the page reloads in the language picked
        gr.Markdown(
            "# SpecFuse Studio\nSeveral small language models answer together, one segment per round: "
            "each drafts a candidate, all score all, the best weighted candidate is appended."
        )
        keymap_panel()  # "?" shows it
        trace = gr.State(None)
        # The lessons, then the failure browser: the problem opened replays in the panels right below it.
        shelf = shipped() if lessons is None else lessons
        opens = gallery_panel(shelf)
        study, panel = failures_first(eval_dir) if eval_dir is not None else (None, None)
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                controls = controls_panel(choices, default_models, allow_paths, devices, device, config)
                handouts = handouts_panel()
            with gr.Column(scale=3, min_width=600):
                presenter, start = presenter_bar(room_button)  # a class session's button beside P
                room = room_panel(start)
                gallery, notes = lesson_panel(shelf, opens), Notes()
                step_bar = step_panel()
                chat = chat_panel()
                shown = views_panel(notes)
        runs = schedulers or Schedulers(config)
        studio = Studio(
            loader, choices, allow_paths, plan_devices, controls, shown, trace, Servers(served), runs
        )
        studio.draw_interval = draw_interval
        if study is not None and panel is not None:
            wire_failures(studio, study, panel)
        stepper = Stepper(studio, step_bar, controls.step)
        conversing = Conversing(studio, chat, controls.system, stepper)
        # The gallery first: its "close the lesson" on Run and upload goes before a run's stream.
        wire_gallery(studio, gallery, notes, concurrency_limit, stepper, conversing, page=demo)
        desk = wire_room(Desk(stepper), demo, room, wire(studio, concurrency_limit, conversing))
        wire_handouts(studio, handouts, desk.spread)  # the class's votes go into the handout
        wire_presenter(demo, presenter)
        wire_keys(demo)
        demo.unload(studio.unload)  # a closed page's run leaves the batch
        demo.unload(stepper.unload)
        wire_language(demo, switch)  # last: it sends every component its text in the session's language
    student_route(desk, demo)  # the class session's phone page (/join)
    track_shown_progress_only(demo)
    return demo


def track_shown_progress_only(demo: gr.Blocks) -> None:
    """An event whose progress is hidden tracks it on no component. Gradio's page keeps a loading
    status for every output of every event that ran (the language's load alone: 134 components) and,
    at each status message of any event, sets it again on each of them, finding each by a walk of the
    whole component tree: a run's every update paid for all of them (a fifth of the page's script
    time in a profiled run). With `show_progress_on=[]` such an event registers none (its progress is
    not shown anyway; an error still comes as a toast)."""
    for fn in demo.fns.values():
        if fn.show_progress == "hidden" and fn.show_progress_on is None:
            fn.show_progress_on = []


def offered(
    choices: Sequence[str] | None, default_models: Sequence[str] | None
) -> tuple[list[str], Sequence[str]]:
    """The members the page offers and those picked at first: the catalogue and the
    default trio unless the operator names them."""
    if choices is None or default_models is None:
        choices = list(CATALOGUE) if choices is None else choices
        default_models = DEFAULT_MEMBERS if default_models is None else default_models
    return list(choices), default_models


def wire(studio: Studio, concurrency_limit: int | None, conversing: Conversing) -> list[Any]:
    """The listeners of the run, its replay and its what-if panels, in this order (then step mode's
    and the conversation's). Step mode's beats' events."""
    wire_run(studio, concurrency_limit, conversing)
    uploaded = wire_replay(studio)
    wire_branch(studio, concurrency_limit)
    events = wire_step(conversing.stepper, concurrency_limit, uploaded)
    wire_chat(conversing, concurrency_limit)
    return events


def wire_run(studio: Studio, concurrency_limit: int | None, conversing: Conversing) -> None:
    """Run (the button and the prompt's Enter) and Stop: Run starts a new conversation (the system
    prompt set), stepping when step mode's box is checked."""
    controls, shown = studio.controls, studio.display
    run, inputs, outputs = conversing.event()
    common: dict[str, Any] = {
        "show_progress_on": [shown.status],  # one progress bar and one error, on the status line
        "concurrency_limit": concurrency_limit,
        "concurrency_id": "run",
    }
    run_events = [
        controls.run.click(run, inputs, outputs, api_name="run", **common),
        controls.prompt.submit(run, inputs, outputs, api_visibility="private", **common),
    ]
    controls.stop.click(
        studio.stop,
        [studio.trace],
        [shown.status, controls.download],
        cancels=run_events,  # type: ignore[arg-type]
        api_name="stop",
        show_progress_on=[shown.status],
        concurrency_limit=None,  # it waits for its own run's end: never behind another user's Stop
    )


def wire_replay(studio: Studio) -> Any:
    """Replay a round (the slider, the view, a segment of the answer, an uploaded trace), and the
    evidence pickers. The upload's event (step mode goes on from it)."""
    controls, shown, trace = studio.controls, studio.display, studio.trace
    on_status = [shown.status]
    w = shown.what_if
    panels = [*shown.by_name().values(), *w.round_outputs()]
    replay = (studio.replay, [trace, shown.round, shown.view], panels)  # the round shown, in the view shown
    shown.round.release(*replay, api_name="replay", show_progress_on=on_status)
    # its keys (arrows, Home, End, Page keys) and a typed round: no release comes
    shown.round.input(*replay, api_visibility="private", trigger_mode="always_last", show_progress="hidden")
    shown.view.change(*replay, api_visibility="private", show_progress_on=on_status)
    shown.answer.select(
        studio.select_segment,
        [trace, shown.view],
        [shown.segment, *panels, shown.round],
        api_visibility="private",
        show_progress_on=on_status,
    )
    uploaded = controls.upload.upload(
        studio.load_trace_file,
        [controls.upload, shown.view],
        [trace, *panels, shown.round, shown.segment, controls.download, shown.plain, *w.branch_outputs()],
        api_name="load_trace",
        show_progress_on=on_status,
    )
    for picker in (w.verifier, w.candidate):
        picker.input(  # a person's pick only: the round's own update sets the evidence shown
            studio.evidence,
            [trace, shown.round, w.verifier, w.candidate],
            [w.tokens],
            api_visibility="private",
            show_progress="hidden",
        )
    return uploaded


def wire_branch(studio: Studio, concurrency_limit: int | None) -> None:
    """Branch the run shown: force a candidate or a typed segment at the round shown, then continue."""
    shown = studio.display
    w = shown.what_if
    w.branch.click(
        studio.branch_handler(),
        [studio.trace, shown.round, w.branch_candidate, w.branch_text, studio.controls.device],
        [w.branch_view, w.branch_download],
        api_name="branch",
        show_progress_on=[w.branch_view],
        concurrency_limit=concurrency_limit,
        concurrency_id="run",
    )


def failures_first(eval_dir: str | Path) -> tuple[EvalRun | None, Failures]:
    """The failure-case browser's panel over an evaluation report (its handlers come later)."""
    try:
        run = load_eval(eval_dir)
    except ValueError as e:
        failed = failures_panel(f"Could not open the evaluation run: {e}", None)
        why = str(e)
        localize(
            failed.note, lambda: {"value": md(_("Could not open the evaluation run: {why}", why=said(why)))}
        )
        return None, failed
    panel = failures_panel(run.note(), problems_table(run, FILTERS[0]))
    # built once in English; each page gets the note and the table in its session's language
    localize(panel.note, lambda: {"value": md(run.note())})
    localize(panel.table, lambda: table_texts(problems_table(run, FILTERS[0])))
    return run, panel


def table_texts(table: Any) -> dict[str, Any]:
    """A table's value and its headers together (the load's walk would set the English headers)."""
    return {"value": table, "headers": list(table.columns)}


def wire_failures(studio: Studio, run: EvalRun, panel: Failures) -> None:
    """The failure-case browser's listeners: filter the table, open a problem."""
    browser = FailureBrowser(run, studio, panel)
    shown, controls = studio.display, studio.controls
    panel.filter.change(browser.filter, [panel.filter], [panel.table], api_visibility="private")
    panel.table.select(
        browser.open,
        [shown.view],
        [
            studio.trace,
            *shown.by_name().values(),
            *shown.what_if.round_outputs(),
            shown.round,
            shown.segment,
            controls.download,
            shown.plain,
            shown.compared,
            *shown.what_if.branch_outputs(),
            panel.case,
        ],
        api_visibility="private",
        show_progress_on=[shown.status],
    )


def wire_step(stepper: Stepper, concurrency_limit: int | None, uploaded: Any = None) -> list[Any]:
    """The step bar's listeners, Stop's part in step mode, and the box that shows the bar.
    `uploaded`: the upload's event, after which a trace steps when the box is checked. The beats'
    events (a class session follows each)."""
    s, b = stepper.studio, stepper.bar
    shown = s.display
    outputs = stepper.outputs()
    beat = [shown.round, shown.view, b.guess]
    quiet: dict[str, Any] = {"show_progress": "hidden"}
    # A key pressed again while its last press is answered is kept (the last one), not dropped.
    pressed: dict[str, Any] = {"trigger_mode": "always_last", **quiet}
    playing: dict[str, Any] = {"concurrency_limit": concurrency_limit, "concurrency_id": "step"}
    now: dict[str, Any] = {"concurrency_limit": None, **pressed}  # answered at once, beside a playing beat
    events = [
        b.next.click(stepper.advance, beat, outputs, api_name="step_next", **playing, **pressed),
        b.timer.tick(
            stepper.advance, beat, outputs, api_visibility="private", trigger_mode="once", **playing, **quiet
        ),
        b.reveal.click(stepper.reveal, beat, outputs, api_name="step_reveal", **now),
        b.back.click(stepper.back, [s.trace, *beat[:2]], outputs, api_name="step_back", **now),
        b.home.click(stepper.home, beat[:2], outputs, api_name="step_home", **now),
        b.end.click(stepper.end_, beat[:2], outputs, api_name="step_end", **now),
    ]
    if uploaded is not None:
        uploaded.success(
            stepper.opened, [stepper.mode, s.trace, shown.view], outputs, api_visibility="private", **quiet
        )
    b.play.click(
        stepper.play,
        [b.playing, b.pace, shown.round],
        [b.timer, b.play, b.playing],
        api_visibility="private",
        concurrency_limit=None,
        **quiet,
    )
    b.pace.change(stepper.set_pace, [b.playing, b.pace], [b.timer], api_visibility="private", **quiet)
    s.controls.stop.click(
        stepper.stop,
        [shown.round],
        b.outputs(),
        cancels=events,  # type: ignore[arg-type]
        api_name="step_stop",
        concurrency_limit=None,
        **quiet,
    )
    stepper.mode.input(  # a person's click only: a lesson's or a run's update never toggles it
        stepper.toggle,
        [stepper.mode, s.trace, shown.view],
        [b.bar, *outputs],
        api_name="step_mode",  # checked with a trace shown: it steps as a recorded run
        **quiet,
    )
    return events
