"""Step mode's components: the checkbox beside Run, and the step bar above the run's panels (Next,
Reveal, Back, Play / Pause, the pace, the room's guess, the note, the timer that plays).

Components, and `wire_step`, which hands their events to studio.stepping's handlers; no values
computed from rounds (studio.step_views has those). Every element id starts with `step-`;
studio.explain's key script presses these buttons for the keyboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gradio as gr

from .explain import keys_line
from .step_views import PACE_S

if TYPE_CHECKING:
    from .stepping import Stepper

PLAY, PAUSE = "Play", "Pause"


@dataclass
class StepBar:
    bar: gr.Group
    next: gr.Button
    reveal: gr.Button
    back: gr.Button
    home: gr.Button
    end: gr.Button
    play: gr.Button
    pace: gr.Slider
    guess: gr.Radio
    note: gr.Markdown
    timer: gr.Timer
    playing: gr.State

    def outputs(self) -> list[gr.components.Component]:
        """What a step changes on the bar (the run's panels are Studio's)."""
        return [
            self.next,
            self.reveal,
            self.back,
            self.home,
            self.end,
            self.play,
            self.guess,
            self.note,
            self.timer,
            self.playing,
        ]


def step_mode_box() -> gr.Checkbox:
    """The checkbox beside Run: Run then starts a run paused before round 1."""
    return gr.Checkbox(
        False, label="Step mode (teach): Run starts paused, then plays round by round", elem_id="step-mode"
    )


def step_panel() -> StepBar:
    """The step bar, hidden until step mode is on."""
    least, most, default = PACE_S
    with gr.Group(visible=False, elem_id="step-bar") as bar:
        with gr.Row():
            next_ = gr.Button(
                "Next ▸", variant="primary", interactive=False, elem_id="step-next", min_width=80
            )
            reveal = gr.Button("Reveal", interactive=False, elem_id="step-reveal", min_width=80)
            back = gr.Button("◂ Back", interactive=False, elem_id="step-back", min_width=80)
            home = gr.Button("◂◂ Round 1", interactive=False, elem_id="step-home", min_width=80)
            end = gr.Button("Latest ▸▸", interactive=False, elem_id="step-end", min_width=80)
            play = gr.Button(PLAY, interactive=False, elem_id="step-play", min_width=80)
        guess = gr.Radio(
            [],
            label="Your guess: whose candidate will the ensemble choose?",
            visible=False,
            elem_id="step-guess",
        )
        note = gr.Markdown("", elem_id="step-note")
        with gr.Row(equal_height=True):
            pace = gr.Slider(
                least,
                most,
                value=default,
                step=0.5,
                label="Play's pace: seconds per round",
                elem_id="step-pace",
            )
            gr.Markdown(keys_line(), elem_id="step-keys")
    timer = gr.Timer(default / 2, active=False)  # Play: one beat (drafts, then reveal) per tick
    return StepBar(bar, next_, reveal, back, home, end, play, pace, guess, note, timer, gr.State(False))


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
