"""The app's Run as one request (issue 57): RunRequest, made in one place (RunForm.request) from the
values Gradio passes, over parameters written once (RunForm: the API's keywords in order, each with
its component and default). Run, step mode, a conversation's turn and a branch take it, and
Studio.begin (handlers.py) is the prologue they share.

Knows nothing about layout, the engine's events or the panels.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import gradio as gr

from specfuse import EnsembleConfig

from . import settings, views
from .chat_views import Chat
from .updates import Update, session_of

Component = gr.components.Component


def no_progress(*args: Any, **kwargs: Any) -> None:
    """A run's progress bar where no page shows one."""


@dataclass(frozen=True)
class RunRequest:
    """One Run (a follow-up, a lesson's Run live, a branch) as the page or an API caller sent it.

    The values are as sent (the prologue checks them: studio.loading.check_members, the settings
    form, specfuse.limits.check_request); `settings` is the form's values by field name, or a config
    as it is (a branch's: its trace's). `prompt` is the text typed, or the conversation a turn asks."""

    members: Any
    prompt: Any
    settings: Mapping[str, Any] | EnsembleConfig
    device: str = "auto"
    compare: bool = False
    view: str = views.NORMALIZED
    step: bool = False
    system: str = ""
    chat: Chat | None = None  # the session's conversation (studio.conversation)
    progress: Callable[..., Any] = field(default=no_progress, repr=False, compare=False)
    session: str = ""

    def config(self) -> EnsembleConfig:
        """The run's config: the form's values read back (a ConfigError names the field), or as given."""
        if isinstance(self.settings, EnsembleConfig):
            return self.settings
        return settings.config_from_form(self.settings)


@dataclass(frozen=True)
class RunForm:
    """Run's parameters, each with its component: the one place their names, order and defaults are
    written. Step mode adds `step`, a conversation `system` and `chat`; a follow-up names its prompt
    `question`."""

    members: Component
    prompt: Component
    settings: Mapping[str, Component]
    device: Component
    compare: Component
    view: Component
    step: Component | None = None
    system: Component | None = None
    chat: Component | None = None
    question: bool = False  # the prompt's keyword is `question` (Ask a follow-up)

    def parameters(self) -> list[tuple[str, Component, Any]]:
        """(keyword, component, default) in the API's order; members and the prompt have no default."""
        empty = inspect.Parameter.empty
        named = [("members", self.members, empty), (self.prompt_name, self.prompt, empty)]
        named += [(name, widget, widget.value) for name, widget in self.settings.items()]
        named += [(name, c, c.value) for name, c in self.fixed()]
        optional = (("step", self.step, False), ("system", self.system, ""), ("chat", self.chat, None))
        return named + [(name, c, default) for name, c, default in optional if c is not None]

    @property
    def prompt_name(self) -> str:
        return "question" if self.question else "prompt"

    def fixed(self) -> tuple[tuple[str, Component], ...]:
        return (("device", self.device), ("compare", self.compare), ("view_name", self.view))

    def inputs(self) -> list[Component]:
        return [component for _, component, _ in self.parameters()]

    def request(self, values: Sequence[Any]) -> RunRequest:
        """The RunRequest of the values Gradio passed (the parameters', then progress and the
        request, which Gradio fills in): by keyword, the one place it is made."""
        *given, progress, request = values
        named = dict(zip([name for name, _, _ in self.parameters()], given, strict=True))
        return RunRequest(
            members=named["members"],
            prompt=named[self.prompt_name],
            settings={name: named[name] for name in self.settings},
            device=named["device"],
            compare=named["compare"],
            view=named["view_name"],
            step=named.get("step", False),
            system=named.get("system", ""),
            chat=named.get("chat"),
            progress=progress,
            session=session_of(request),
        )

    def signed(
        self, handler: Callable[..., AsyncIterator[Update]], doc: str
    ) -> Callable[..., AsyncIterator[Update]]:
        """`handler` (which reads its values with request()) with a signature that names every
        parameter, so the API takes them as keywords (`segment_len=4`), then Gradio's progress and
        request; `doc` is what an API caller reads of it."""
        keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = [inspect.Parameter(n, keyword, default=d) for n, _, d in self.parameters()]
        parameters += [
            inspect.Parameter("progress", keyword, default=gr.Progress()),
            inspect.Parameter("request", keyword, default=None),
        ]
        handler.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        handler.__annotations__ = {"request": Optional[gr.Request]}  # noqa: UP045 (Gradio looks for this type)
        handler.__doc__ = doc
        return handler
