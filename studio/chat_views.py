"""A conversation's values (issue 44, item 4): its turns, the next run's Conversation, the bubbles.

A Chat is one session's conversation in the app: an optional system prompt and its turns, each a
user question and the ensemble's run that answered it (a Trace), or, for a turn read back from an
uploaded trace, the answer's text alone. The next run's prompt is the Conversation every member is
shown: the system message, each earlier question as a user message and the ensemble's answer to it
as an assistant message, then the new question. Pure values: no Gradio events, no torch.
Model text, member names and the system prompt are untrusted: every piece of HTML goes through `esc`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from specfuse import ConfigError, Round, Trace, answer_spans
from specfuse.limits import MAX_MESSAGES
from specfuse.prompts import Conversation, Message, Prompt, conversation

from .i18n import _
from .untrusted import esc, shown_controls
from .views import member_colors

NO_TURNS = "Ask a question (Run), then a follow-up: the conversation shows here."


@dataclass(frozen=True)
class Turn:
    """One exchange: the user's question and the ensemble's run that answered it (None while its
    first round is being drafted); `text` is the answer of a turn read back without its rounds."""

    question: str
    trace: Trace | None = None
    text: str = ""

    @property
    def answer(self) -> str:
        """The answer as the next turn's assistant message: exactly the run's text."""
        if self.trace is not None and self.trace.rounds:
            return self.trace.rounds[-1].text
        return self.text

    @property
    def rounds(self) -> Sequence[Round]:
        return self.trace.rounds if self.trace is not None else ()


@dataclass(frozen=True)
class Chat:
    """One session's conversation: the system prompt its turns were asked under, and the turns."""

    system: str = ""
    turns: tuple[Turn, ...] = ()

    def messages(self) -> int:
        """How many messages the conversation holds: the system's, and two per answered turn."""
        return int(bool(self.system.strip())) + 2 * len(self.answered())

    def answered(self) -> tuple[Turn, ...]:
        """The turns with an answer: a turn stopped before its first round is left out."""
        return tuple(t for t in self.turns if t.answer)

    def room(self) -> None:
        """Refuse a follow-up the engine's message limit has no room for, saying what to do."""
        if self.messages() + 1 > MAX_MESSAGES:
            raise ConfigError(
                _(
                    "This conversation holds {n} messages and a follow-up would make {m}; the limit is "
                    "{limit} (MAX_MESSAGES). Press New conversation to start another.",
                    n=self.messages(),
                    m=self.messages() + 1,
                    limit=MAX_MESSAGES,
                )
            )

    def prompt(self, question: str) -> Prompt:
        """The run's prompt for `question` after the turns: a plain string when it is the first
        question with no system prompt (a run as before), else the Conversation (next_conversation)."""
        if not self.answered() and not self.system.strip():
            return question
        return next_conversation(self.system, self.answered(), question)

    def asking(self, question: str) -> Chat:
        """The chat with `question` as its new, unanswered turn (the turns without an answer go)."""
        return replace(self, turns=(*self.answered(), Turn(question)))

    def answering(self, trace: Trace | None) -> Chat:
        """The chat with its last turn's run so far."""
        if not self.turns:
            return self
        return replace(self, turns=(*self.turns[:-1], replace(self.turns[-1], trace=trace)))

    def settled(self) -> Chat:
        """After a run: a last turn that got no answer (stopped before round 1, failed) goes."""
        return replace(self, turns=self.answered())

    def turn(self, index: int | float | None) -> Turn | None:
        """Turn `index` (0-based; None and past the end: the latest)."""
        if not self.turns:
            return None
        if index is None:
            return self.turns[-1]
        return self.turns[max(0, min(int(index), len(self.turns) - 1))]


def next_conversation(system: str, turns: Sequence[Turn], question: str) -> Conversation:
    """The Conversation the next run asks: the system prompt (when it has text), each earlier turn
    as its user message and the ensemble's answer as an assistant message, then `question`.
    Checked as the engine checks it (prompts.conversation)."""
    messages = [Message("system", system)] if system.strip() else []
    for turn in turns:
        messages += [Message("user", turn.question), Message("assistant", turn.answer)]
    return conversation([*messages, Message("user", question)])


def chat_from_prompt(prompt: Prompt, trace: Trace) -> Chat:
    """The chat an uploaded trace was the last turn of: its conversation's system message, its
    earlier exchanges (their answers as text: a trace holds only its own rounds), and its own turn."""
    messages = conversation(prompt)
    system = messages[0].content if messages[0].role == "system" else ""
    turns: list[Turn] = []
    for m in messages:
        if m.role == "user":
            turns.append(Turn(m.content))
        elif m.role == "assistant" and turns:
            turns[-1] = replace(turns[-1], text=m.content)
    turns[-1] = replace(turns[-1], trace=trace, text="")
    return Chat(system, tuple(turns))


def turn_choices(chat: Chat) -> list[tuple[str, int]]:
    """The turn selector's choices: "Turn 2: <the question, cut>" → its index."""
    return [
        (_("Turn {n}: {question}", n=i + 1, question=_cut(t.question)), i) for i, t in enumerate(chat.turns)
    ]


def _cut(text: str, width: int = 48) -> str:
    line = shown_controls(" ".join(text.split()))
    return line if len(line) <= width else line[: width - 1] + "…"


def bubbles_html(chat: Chat, selected: int | None = None) -> str:
    """The conversation as chat bubbles: the system prompt, then each question and answer; each
    answer's segments coloured by the member that won them (the answer view's colours), the turn
    whose panels show (`selected`, default the latest) marked. Every text is escaped and isolated
    (<bdi>, its directional formatting characters written out: untrusted.esc)."""
    if not chat.turns:
        return f'<div class="sf-chat" id="chat-log"><p class="sf-chat-empty">{esc(_(NO_TURNS))}</p></div>'
    shown = len(chat.turns) - 1 if selected is None else max(0, min(int(selected), len(chat.turns) - 1))
    parts = ['<div class="sf-chat" id="chat-log">']
    if chat.system.strip():
        parts.append(
            f'<div class="sf-bubble sf-system"><b>{_("System")}</b> <bdi>{esc(chat.system)}</bdi></div>'
        )
    for i, turn in enumerate(chat.turns):
        mark = " sf-shown" if i == shown else ""
        parts.append(
            f'<div class="sf-turn{mark}" data-turn="{i + 1}">'
            f'<div class="sf-bubble sf-user"><b>{_("Turn {n}", n=i + 1)}</b> '
            f"<bdi>{esc(turn.question)}</bdi></div>"
            f'<div class="sf-bubble sf-assistant">{_answer_html(turn)}</div></div>'
        )
    parts.append("</div>")
    return "".join(parts)


def _answer_html(turn: Turn) -> str:
    """An answer's segments, each in its winner's colour (the member named in its title); the
    text of a turn read back without rounds plain; a turn still drafting says so."""
    if turn.trace is None or not turn.trace.rounds:
        return f"<bdi>{esc(turn.text)}</bdi>" if turn.text else '<i class="sf-chat-wait">…answering</i>'
    colors = member_colors(turn.trace.members)  # as the answer view colours this run
    return (
        "<bdi>"
        + "".join(
            f'<span class="sf-seg" style="border-bottom: 3px solid {colors.get(member, "#999")}" '
            f'title="{esc(member)}">{esc(text)}</span>'
            for text, member in answer_spans(turn.trace.rounds)
        )
        + "</bdi>"
    )
