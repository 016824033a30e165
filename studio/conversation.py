"""Conversations in the app (issue 44, item 4): Run asks a new conversation's first question, "Ask a
follow-up" the next one, and every run's prompt is the Conversation so far (chat_views.Chat).

Both are one Gradio function over Studio's form (studio.request: the page's values become one
RunRequest), through Studio's own run (the scheduler's batch, Stop, Compare, the download) or step
mode's start, with the prompt replaced by the conversation; the ensemble's answer becomes the
assistant message every member sees on the next turn. The conversation is the session's (a
gr.State): bubbles, a turn selector whose turn the panels show (and Branch and the download use),
and New conversation. studio.layout places the panel and calls `wire_chat` once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any, Optional, cast

import gradio as gr

from specfuse import SpecfuseError, TraceError
from specfuse.trace import load_trace

from . import views
from .chat_panel import ChatPanel
from .chat_views import Chat, bubbles_html, chat_from_prompt, turn_choices
from .handlers import Studio, limits
from .i18n import _
from .request import RunForm, RunRequest
from .stepping import Stepper
from .updates import Update, session_of, unchanged

NEW = "New conversation: type a question and press **Run**; then ask follow-ups under the answer."
# What an API caller reads of Run and of the follow-up (Gradio shows a handler's __doc__)
RUN = (
    "Load the members (once, shared), then stream one update per round. With step=True: a run paused "
    "before round 1 (step mode). With system: the conversation's system message."
)
ASK = "Ask a follow-up: the session's conversation's next turn, through Run's batch."


@dataclass
class Conversing:
    """Studio's runs as turns of the session's conversation: Run (stepping when step mode's box is
    checked) asks a new one's first question, Ask a follow-up its next."""

    studio: Studio
    panel: ChatPanel
    system: gr.Textbox
    stepper: Stepper

    def shown(self, chat: Chat, selected: int | None = None) -> Update:
        """The conversation's components for `chat`, the turn `selected` (default the latest) shown."""
        index = len(chat.turns) - 1 if selected is None else selected
        return {
            self.panel.state: chat,
            self.panel.bubbles: bubbles_html(chat, index),
            self.panel.turn: gr.Dropdown(choices=turn_choices(chat), value=index if chat.turns else None),
        }

    def event(
        self, followup: bool = False
    ) -> tuple[Callable[..., AsyncIterator[Update]], list[Any], list[Any]]:
        """Run's handler, inputs and outputs (Ask a follow-up's with `followup`): its parameters are
        Studio's form with `system` and the conversation (and Run's `step`); its outputs Studio's, the
        conversation's, then step mode's bar (Ask's: the follow-up box, which it empties)."""
        form = replace(self.studio.form(), system=self.system, chat=self.panel.state)
        last: list[Any] = [self.panel.followup] if followup else self.stepper.bar.outputs()
        if followup:
            form = replace(form, prompt=self.panel.followup, question=True)
        else:
            form = replace(form, step=self.stepper.mode)
        outputs = [*self.studio.run_outputs(), *self.panel.outputs(), *last]
        run = form.signed(self.handler(form, followup), ASK if followup else RUN)
        run.__name__ = "ask" if followup else "run_new"  # the private events' API names, as they were
        return run, form.inputs(), outputs

    def handler(self, form: RunForm, followup: bool) -> Callable[..., AsyncIterator[Update]]:
        """The run of the request the page sent, as the conversation's next turn: its question's
        bubble with the run's first update, the answer kept as the run's trace grows, a turn with no
        answer at the end (stopped before round 1, refused) taken back. Run ends the session's
        stepping run (and starts one with the box checked); a follow-up leaves step mode alone."""
        s, stepper = self.studio, self.stepper

        async def run(*values: Any) -> AsyncIterator[Update]:
            request = self.asked(form.request(values), followup)
            chat = cast(Chat, request.chat)
            stepping = request.step and not followup
            if not followup:
                stepper.drop(request.session)
            updates = stepper.start(request) if stepping else s.run(request)
            reset = stepper.reset() if not (followup or stepping) else {}
            first, seen = self.shown(chat) | reset, cast(Update, {})
            emptied: Update = {self.panel.followup: ""} if followup else {}  # with the first yield
            try:
                async for update in updates:
                    if s.trace in update and update[s.trace] is not None:
                        chat = chat.answering(update[s.trace])
                        update = update | self.shown(chat)
                    update, first = first | update, {}
                    seen |= update
                    yield emptied | update
                    emptied = {}
            except gr.Error:
                yield emptied | self.shown(chat.settled())  # the refused question's bubble goes
                raise
            if len(chat.settled().turns) < len(chat.turns):  # no answer: the whole page once more, so
                yield seen | self.shown(chat.settled())  # an API caller's last update has it all

        return run

    def asked(self, request: RunRequest, followup: bool) -> RunRequest:
        """The request as its conversation's next turn: its prompt the conversation so far and the
        question, its chat the conversation with the question asked (Run's: a new one)."""
        question = request.prompt
        if not followup:
            chat = Chat(request.system or "")
            if not isinstance(question, str):  # an API caller's messages: a run as sent
                return replace(request, chat=chat)
            return replace(request, prompt=chat.prompt(question), chat=chat.asking(question))
        chat = replace(request.chat or Chat(), system=request.system or "")
        if not isinstance(question, str) or not question.strip():
            raise self.studio.error(_("Type a follow-up question first."))
        try:
            chat.room()
            prompt = chat.prompt(question)
        except SpecfuseError as e:
            raise self.studio.error(e) from e
        return replace(request, prompt=prompt, chat=chat.asking(question))

    # ---- the turn shown, a new conversation, an uploaded trace's ----------------------------------

    def show_turn(
        self,
        chat: Chat | None,
        index: int | None,
        view: str,
        request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
    ) -> Update:
        """The panels (and Branch, and the download) on the rounds of the turn picked."""
        turn = (chat or Chat()).turn(index)
        if chat is None or turn is None or turn.trace is None or not turn.trace.rounds:
            return unchanged()
        shown = self.studio.show_trace(turn.trace, view, "", session_of(request))
        return shown | {self.studio.display.compared: "", self.panel.bubbles: bubbles_html(chat, index)}

    def new(self, system: str) -> Update:
        """New conversation: no turns (the system prompt stays set), every panel emptied."""
        s, v = self.studio, self.studio.display
        return {
            **s.cleared(None),
            **s.panels(None),
            **s.clear_branch(),
            **self.shown(Chat(system or "")),
            v.round: views.slider_value(None),
            v.status: _(NEW),
            self.panel.followup: "",
        }

    def uploaded(self, path: str | None, system: str) -> Update:
        """An uploaded trace becomes the conversation it was the last turn of (its earlier answers as
        text), so a follow-up continues it. A file replay refuses says so in replay's own handler."""
        if not path:
            return unchanged()
        try:
            trace = load_trace(path, max_bytes=limits["trace_bytes"])
            chat = chat_from_prompt(trace.prompt, trace) if trace.rounds else None
        except (TraceError, SpecfuseError):
            return unchanged()
        return self.shown(chat) if chat is not None else unchanged()


def wire_chat(conversing: Conversing, concurrency_limit: int | None) -> None:
    """The follow-up (its button and its box's Enter), the turn selector, New conversation and the
    conversation an uploaded trace continues."""
    s, p = conversing.studio, conversing.panel
    c, v = s.controls, s.display
    ask, inputs, outputs = conversing.event(followup=True)
    for trigger, api in ((p.ask.click, "followup"), (p.followup.submit, None)):
        trigger(
            ask,
            inputs,
            outputs,
            api_name=api,
            api_visibility="public" if api else "private",
            show_progress_on=[v.status],
            concurrency_limit=concurrency_limit,
            concurrency_id="run",
        )
    panels = [*v.by_name().values(), *v.what_if.round_outputs()]
    p.turn.input(
        conversing.show_turn,
        [p.state, p.turn, v.view],
        [s.trace, *panels, v.round, v.segment, v.compared, v.plain, c.download, p.bubbles]
        + v.what_if.branch_outputs(),
        api_visibility="private",
        show_progress_on=[v.status],
    )
    p.new.click(
        conversing.new,
        [conversing.system],
        [*s.run_outputs(), *p.outputs(), p.followup],
        api_name="new_conversation",
        show_progress="hidden",
    )
    c.upload.upload(conversing.uploaded, [c.upload, conversing.system], p.outputs(), api_visibility="private")
