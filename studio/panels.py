"""The panels: each function builds one area's components (inside the caller's Blocks) and returns them.

Components only: no listeners (studio.layout wires them) and no values computed from rounds
(studio.views has those). Knows nothing about loading members.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr

from specfuse import EnsembleConfig, report
from specfuse.eval.problems import OPEN_PROMPTS

from . import failures, settings, untrusted, views, what_if_views
from .chat_panel import system_box
from .explain import Notes
from .step_panel import step_mode_box

# The evaluation's first four open-ended prompts (the serve benchmark sends the same four).
EXAMPLES = [[prompt] for prompt in OPEN_PROMPTS[:4]]


@dataclass
class Controls:
    models: gr.Dropdown
    prompt: gr.Textbox
    run: gr.Button
    stop: gr.Button
    compare: gr.Checkbox
    settings: dict[str, gr.components.Component]  # by EnsembleConfig field name
    device: gr.Dropdown
    upload: gr.File
    download: gr.DownloadButton
    step: gr.Checkbox  # step mode (studio.stepping)
    system: gr.Textbox  # the conversation's system prompt (studio.conversation)


@dataclass
class WhatIf:
    """Issue 9's panels for the round shown: rule comparison, token-level evidence, branching."""

    rules: gr.Dataframe
    verifier: gr.Dropdown
    candidate: gr.Dropdown
    tokens: gr.HTML
    branch_candidate: gr.Dropdown
    branch_text: gr.Textbox
    branch: gr.Button
    branch_view: gr.HTML
    branch_download: gr.DownloadButton

    def round_outputs(self) -> list[gr.components.Component]:
        """What changes with the round shown."""
        return [self.rules, self.verifier, self.candidate, self.tokens, self.branch_candidate]

    def branch_outputs(self) -> list[gr.components.Component]:
        """What a new run or trace clears: the branch of the previous one."""
        return [self.branch_view, self.branch_download]


@dataclass
class Views:
    status: gr.Markdown
    answer: gr.HighlightedText
    plain: gr.Textbox
    segment: gr.HTML
    round: gr.Slider
    candidates: gr.Dataframe
    view: gr.Radio
    matrix: gr.Plot
    weights: gr.Plot
    exits: gr.Dataframe
    summary: gr.Dataframe
    compared: gr.HTML
    what_if: WhatIf
    candidates_text: gr.HTML  # each chart's table (studio.text_views), after the what-if panels
    matrix_text: gr.HTML
    weights_text: gr.HTML

    def by_name(self) -> dict[str, gr.components.Component]:
        """The round panels by the names studio.views.round_panels gives their values."""
        return {
            "answer": self.answer,
            "status": self.status,
            "candidates": self.candidates,
            "matrix": self.matrix,
            "weights": self.weights,
            "exits": self.exits,
            "summary": self.summary,
            "candidates_text": self.candidates_text,
            "matrix_text": self.matrix_text,
            "weights_text": self.weights_text,
        }


def controls_panel(
    choices: Sequence[str],
    default_models: Sequence[str],
    allow_paths: bool,
    devices: Sequence[str],
    device: str,
    defaults: EnsembleConfig,
) -> Controls:
    """Members, prompt, Run/Stop, compare, the settings form, device, trace upload and download."""
    models = gr.Dropdown(
        choices=list(choices),
        value=[m for m in default_models if m in choices or allow_paths],
        multiselect=True,
        allow_custom_value=allow_paths,
        label="Members (two or more)",
        info="Local folders or hub ids allowed" if allow_paths else None,
        elem_id="models",
    )
    prompt = gr.Textbox(label="Prompt", lines=4, elem_id="prompt")
    gr.Examples(EXAMPLES, inputs=[prompt], label="Example prompts")
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id="run")
        stop = gr.Button("Stop", variant="stop", elem_id="stop")
    step = step_mode_box()
    compare = gr.Checkbox(False, label="Compare: also run each member alone", elem_id="compare")
    with gr.Accordion("Settings", open=False, elem_id="settings"):
        form = settings.build_settings(defaults)
        system = system_box()
        device_box = gr.Dropdown(
            list(devices), value=device if device in devices else devices[0], label="Device", elem_id="device"
        )
    with gr.Accordion("Replay a trace", open=False, elem_id="replay"):
        upload = gr.File(label="Upload a trace (.json)", file_types=[".json"], elem_id="upload")
    download = gr.DownloadButton("Download trace", value=None, visible=False, elem_id="download")
    return Controls(models, prompt, run, stop, compare, form, device_box, upload, download, step, system)


def table(label: str, headers: list[str], elem_id: str, **more: Any) -> gr.Dataframe:
    """A read-only table of the round (or its rules): its text wraps, its width fits the panel."""
    return gr.Dataframe(
        label=label,
        headers=headers,
        interactive=False,
        wrap=True,
        elem_id=elem_id,
        elem_classes=["sf-fit"],
        **more,
    )


def views_panel(notes: Notes | None = None) -> Views:
    """The run as it unfolds: status, answer (coloured and plain), the round's tables and charts;
    `notes` places what each panel shows (and a lesson's "look for") under it."""
    notes = notes or Notes()
    status = gr.Markdown(views.status_markdown(()), elem_id="status")
    answer = gr.HighlightedText(label="Answer", show_legend=True, combine_adjacent=False, elem_id="answer")
    notes.place("answer")
    with gr.Accordion("Answer as plain text (exact, for copying)", open=False, elem_id="plain-box"):
        plain = gr.Textbox(
            label="Answer (plain text)",
            lines=4,
            max_lines=30,
            interactive=False,
            buttons=["copy"],
            elem_id="plain",
        )
    segment = gr.HTML(elem_id="segment")
    round_slider = gr.Slider(1, 2, 1, step=1, label="Round (replay)", interactive=False, elem_id="round")
    candidates = table(
        "Candidates of the round",
        report.CANDIDATE_COLUMNS,
        "candidates",
        datatype=["str", "str", "number", "str", "str", "number", "number", "str"],  # yes/no: views._table
    )
    candidates_text = gr.HTML(elem_id="candidates-text", elem_classes=["sf-text-view"])  # presenter view's
    notes.place("candidates")
    with gr.Row():
        with gr.Column():
            view = gr.Radio(
                [views.NORMALIZED, views.RAW], value=views.NORMALIZED, label="Matrix", elem_id="view"
            )
            matrix = gr.Plot(label="Verification matrix", elem_id="matrix")
            matrix_text = gr.HTML(elem_id="matrix-text", elem_classes=["sf-text-view"])
            notes.place("matrix")
            notes.place("normalization")
        with gr.Column():
            weights = gr.Plot(label="Weights", elem_id="weights")
            weights_text = gr.HTML(elem_id="weights-text", elem_classes=["sf-text-view"])
            notes.place("weights")
    exits = table("Exited members", report.EXIT_COLUMNS, "exits")
    notes.place("exits")
    summary = table("Per-member summary", report.SUMMARY_COLUMNS, "summary")
    compared = gr.HTML(elem_id="compare-panel")
    what_if = what_if_panel()
    return Views(
        status,
        answer,
        plain,
        segment,
        round_slider,
        candidates,
        view,
        matrix,
        weights,
        exits,
        summary,
        compared,
        what_if,
        candidates_text,
        matrix_text,
        weights_text,
    )


def what_if_panel() -> WhatIf:
    """What if another candidate had won? Rules on the same scores, token evidence, a branch."""
    with gr.Accordion("What if another candidate had won?", open=False, elem_id="what-if"):
        rules = table(
            "Which candidate each selection rule would choose on this round's scores",
            what_if_views.RULE_COLUMNS,
            "rules",
            max_height=2000,  # all the rules in view: no scrolling inside a fixed height
        )
        with gr.Row():
            verifier = gr.Dropdown([], label="Verifier (matrix row)", elem_id="evidence-verifier")
            candidate = gr.Dropdown([], label="Candidate (matrix column)", elem_id="evidence-candidate")
        tokens = gr.HTML(elem_id="tokens")
        gr.Markdown(
            "**Branch** from the round shown: force another candidate, or type a segment, and the "
            "ensemble continues from there (the trace's members must be loadable here)."
        )
        with gr.Row():
            branch_candidate = gr.Dropdown([], label="Force this candidate", elem_id="branch-candidate")
            branch_text = gr.Textbox(label="…or type a segment", elem_id="branch-text")
        branch = gr.Button("Branch from this round", elem_id="branch")
        branch_view = gr.HTML(elem_id="branch-view")
        branch_download = gr.DownloadButton(
            "Download the branch trace", value=None, visible=False, elem_id="branch-download"
        )
    return WhatIf(
        rules,
        verifier,
        candidate,
        tokens,
        branch_candidate,
        branch_text,
        branch,
        branch_view,
        branch_download,
    )


@dataclass
class Failures:
    """The failure-case browser over an evaluation run folder (app.py --eval-dir)."""

    note: gr.Markdown
    filter: gr.Radio
    table: gr.Dataframe
    case: gr.HTML  # the problem opened: its answers, right under the table


def failures_panel(note: str, table: object) -> Failures:
    """The browser's note (plain text: it names files and systems), filter, table and opened case."""
    with gr.Accordion("Failure cases of an evaluation run", open=True, elem_id="failures"):
        shown_note = gr.Markdown(untrusted.md(note), elem_id="failures-note")
        which = gr.Radio(
            list(failures.FILTERS), value=failures.FILTERS[0], label="Show", elem_id="failures-filter"
        )
        problems = gr.Dataframe(
            value=table,
            label="Problems (click one: its answers show below, and the ensemble's trace replays under them)",
            interactive=False,
            wrap=True,
            max_height=360,
            elem_id="failures-table",
            elem_classes=["sf-fit"],
        )
        case = gr.HTML(elem_id="failures-case")
    return Failures(shown_note, which, problems, case)
