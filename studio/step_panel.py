"""Step mode's components: the checkbox beside Run, and the step bar above the run's panels (Next,
Reveal, Back, Play / Pause, the pace, the room's guess, the note, the timer that plays).

Components only: no listeners (studio.layout's `wire_step` hands their events to studio.stepping's
handlers) and no values computed from rounds (studio.step_views has those). Every element id starts
with `step-`; studio.explain's key script presses these buttons for the keyboard.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .explain import keys_line
from .step_views import PACE_S

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
