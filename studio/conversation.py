"""Conversations in the app (issue 44, item 4): Run asks a new conversation's first question, "Ask a
follow-up" the next one, and every run's prompt is the Conversation so far (chat_views.Chat).

Both go through Studio's own run handler (the scheduler's batch, Stop, Compare, the download), with
the prompt replaced by the conversation; the ensemble's answer becomes the assistant message every
member sees on the next turn. The conversation is the session's (a gr.State): bubbles, a turn
selector whose turn the panels show (and Branch and the download use), and New conversation.
studio.layout places the panel and calls `wire_chat` once.
"""

from __future__ import annotations

import inspect
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
from .updates import Update, download_value, session_of, unchanged

NEW = "New conversation: type a question and press **Run**; then ask follow-ups under the answer."


@dataclass
class Conversing:
    """Studio's runs as turns of the session's conversation."""

    studio: Studio
    panel: ChatPanel
    system: gr.Textbox

    def shown(self, chat: Chat, selected: int | None = None) -> Update:
        """The conversation's components for `chat`, the turn `selected` (default the latest) shown."""
        index = len(chat.turns) - 1 if selected is None else selected
        return {
            self.panel.state: chat,
            self.panel.bubbles: bubbles_html(chat, index),
            self.panel.turn: gr.Dropdown(choices=turn_choices(chat), value=index if chat.turns else None),
        }

    async def turns(
        self, run: Callable[..., AsyncIterator[Update]], chat: Chat, given: list[Any], extra: list[Any]
    ) -> AsyncIterator[Update]:
        """Run `chat`'s last question (`given[1]` is its prompt) and keep its run as the turn's
        answer; a turn with no answer at the end (stopped before round 1, refused) goes."""
        trace_box, seen = self.studio.trace, cast(Update, {})
        first = self.shown(chat)  # the question's bubble, with the run's first update (no extra one)
        try:
            async for update in run(*given, *extra):
                if trace_box in update and update[trace_box] is not None:
                    chat = chat.answering(update[trace_box])
                    update = update | self.shown(chat)
                update, first = first | update, {}
                seen |= update
                yield update
        except gr.Error:
            yield self.shown(chat.settled())  # the question refused leaves the bubbles, then the error
            raise
        if len(chat.settled().turns) < len(chat.turns):  # no answer: the whole page once more, so
            yield seen | self.shown(chat.settled())  # an API caller's last update has it all

    def around(
        self, run: Callable[..., AsyncIterator[Update]], inputs: list[Any], outputs: list[Any]
    ) -> tuple[Callable[..., AsyncIterator[Update]], list[Any], list[Any]]:
        """Run's handler with the conversation: it starts a new one (the system prompt set, the
        prompt its first question). Its parameters gain `system`; its outputs the conversation's,
        right after Studio's own (those another wrapper added stay last)."""

        async def run_new(*values: Any) -> AsyncIterator[Update]:
            *given, system, _chat, progress, request = values
            chat = Chat(system or "")
            question = given[1]
            if isinstance(question, str):
                given[1] = chat.prompt(question)
                chat = chat.asking(question)
            async for update in self.turns(run, chat, given, [progress, request]):
                yield update

        mine = self.panel.outputs()
        n = len(self.studio.run_outputs())
        run_new.__signature__ = self.signature(run)  # type: ignore[attr-defined]
        run_new.__annotations__ = dict(run.__annotations__)
        run_new.__doc__ = f"{run.__doc__ or ''} With system: the conversation's system message."
        return run_new, [*inputs, self.system, self.panel.state], [*outputs[:n], *mine, *outputs[n:]]

    @staticmethod
    def signature(run: Callable[..., Any], first: str = "prompt") -> inspect.Signature:
        """`run`'s signature with `system` and the conversation's state before progress and request
        (and its prompt parameter named `first`)."""
        keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = list(inspect.signature(run).parameters.values())
        parameters[1] = parameters[1].replace(name=first)
        added = [
            inspect.Parameter("system", keyword, default=""),
            inspect.Parameter("chat", keyword, default=None),
        ]
        return inspect.Signature([*parameters[:-2], *added, *parameters[-2:]])

    def followup_handler(self) -> Callable[..., AsyncIterator[Update]]:
        """ask(members, question, <settings>, device, compare, view_name, system): the next turn."""
        run = self.studio.run_handler()

        async def ask(*values: Any) -> AsyncIterator[Update]:
            *given, system, chat, progress, request = values
            chat = replace(chat or Chat(), system=system or "")
            question = given[1]
            if not isinstance(question, str) or not question.strip():
                raise self.studio.error(_("Type a follow-up question first."))
            try:
                chat.room()
                given[1] = chat.prompt(question)
            except SpecfuseError as e:
                raise self.studio.error(e) from e
            chat = chat.asking(question)
            first = {self.panel.followup: ""}
            async for update in self.turns(run, chat, given, [progress, request]):
                yield first | update
                first = {}

        ask.__signature__ = self.signature(run, "question")  # type: ignore[attr-defined]
        ask.__annotations__ = dict(run.__annotations__)
        ask.__doc__ = "Ask a follow-up: the session's conversation's next turn, through Run's batch."
        return ask

    # ---- the turn shown, a new conversation, an uploaded trace's ----------------------------------

    def show_turn(
        self,
        chat: Chat | None,
        index: int | None,
        view: str,
        request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
    ) -> Update:
        """The panels (and Branch, and the download) on the rounds of the turn picked."""
        s, v = self.studio, self.studio.display
        turn = (chat or Chat()).turn(index)
        if chat is None or turn is None or turn.trace is None or not turn.trace.rounds:
            return unchanged()
        trace = turn.trace
        return {
            **s.clear_branch(),
            s.trace: trace,
            **s.panels(trace, None, view),
            v.round: views.slider_value(trace),
            v.segment: "",
            v.compared: "",
            v.plain: views.plain_answer(trace.rounds),
            s.controls.download: download_value(trace, session_of(request)),
            self.panel.bubbles: bubbles_html(chat, index),
        }

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
    ask = conversing.followup_handler()
    inputs = [c.models, p.followup, *c.settings.values(), c.device, c.compare, v.view]
    inputs += [conversing.system, p.state]
    outputs = [*s.run_outputs(), *p.outputs(), p.followup]
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
