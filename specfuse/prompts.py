"""What a run is asked, and how a member turns it into its own context.

A prompt is a conversation: an optional system message, then user and assistant turns, ending with
the user's (the ecosystem's convention: OpenAI's chat API, transformers' apply_chat_template). A
plain string is one user message. Each member renders the conversation with its own chat template,
or, for a base model without one, with the completion rendering PromptFormat.completion documents.

Stdlib only: the tokenizer that applies a chat template lives in members/templates.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from .errors import ConfigError

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = get_args(Role)
# The plain transcript's names for the roles (prompt_text: a conversation as one string, for people).
SPEAKERS = {"system": "System", "user": "User", "assistant": "Assistant"}


@dataclass(frozen=True)
class Message:
    """One message of a conversation: `role` one of ROLES, `content` its text."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


Conversation = tuple[Message, ...]
Prompt = str | Conversation  # a plain string is one user message


def as_prompt(prompt: object) -> Prompt:
    """Any accepted input as a Prompt: a string as it is (it is one user message), a sequence of
    Messages or {"role", "content"} mappings as a checked Conversation (conversation() says what is
    refused). Anything else is a ConfigError."""
    if isinstance(prompt, str):
        return prompt
    return conversation(prompt)


def conversation(prompt: object) -> Conversation:
    """The prompt as a checked Conversation: a string is one user message; a sequence of Messages or
    {"role", "content"} mappings (other keys are ignored) must be non-empty, have known roles and
    string contents, at most one system message and only first, and end with a user message.
    Each refusal is a ConfigError naming the message (`messages[2]: ...`)."""
    if isinstance(prompt, str):
        return (Message("user", prompt),)
    if isinstance(prompt, (bytes, Mapping)) or not isinstance(prompt, Sequence):
        raise ConfigError(
            f"the prompt must be text or a list of {{role, content}} messages, got {type(prompt).__name__}"
        )
    if not prompt:
        raise ConfigError("the conversation has no messages; give at least one user message")
    out = tuple(_message(i, m) for i, m in enumerate(prompt))
    for i, m in enumerate(out):
        if m.role == "system" and i > 0:
            raise ConfigError(
                f"messages[{i}]: a system message may only come first (at most one, before every turn)"
            )
    if out[-1].role != "user":
        raise ConfigError(
            f"messages[{len(out) - 1}]: the last message must be the user's, not the {out[-1].role}'s"
        )
    return out


def _message(i: int, m: object) -> Message:
    if isinstance(m, Message):
        role, content = m.role, m.content
    elif isinstance(m, Mapping):
        if "role" not in m or "content" not in m:
            raise ConfigError(f"messages[{i}]: a message needs a role and a content")
        role, content = m["role"], m["content"]
    else:
        raise ConfigError(f"messages[{i}]: a message is a {{role, content}} object, not {type(m).__name__}")
    if role not in ROLES:
        shown = repr(role) if len(repr(role)) <= 40 else repr(role)[:39] + "…"
        raise ConfigError(f"messages[{i}]: role {shown} is not supported; use one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise ConfigError(f"messages[{i}]: content must be text, not {type(content).__name__}")
    return m if isinstance(m, Message) else Message(role, content)


def last_user_text(prompt: Prompt) -> str:
    """The text of the last user turn: the question the answer is for (the echo guard's prompt)."""
    if isinstance(prompt, str):
        return prompt
    return next(m.content for m in reversed(prompt) if m.role == "user")


def prompt_chars(prompt: Prompt) -> int:
    """Characters of the whole prompt: every message's content."""
    return len(prompt) if isinstance(prompt, str) else sum(len(m.content) for m in prompt)


def prompt_text(prompt: Prompt) -> str:
    """The prompt as one string, for what shows or records one string (a handout's prompt, a lesson's
    check): a string or a lone user message is its own text; anything more is a plain transcript, one
    paragraph per message ("System: …", "User: …", "Assistant: …"). No member is ever shown this."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and prompt[0].role == "user":
        return prompt[0].content
    return "\n\n".join(f"{SPEAKERS[m.role]}: {m.content}" for m in prompt)


@dataclass(frozen=True)
class PromptFormat:
    """`chat`: the tokenizer's own chat template; `completion`: `template` with {prompt} filled in.

    Base models (no chat template) use `completion` with stop strings that end their answer where
    they would start the next question.
    """

    kind: str = "chat"  # "chat" or "completion"
    template: str = "{prompt}"  # completion only
    system: str | None = None  # chat only: the system message when the conversation has none
    stop_strings: tuple[str, ...] = field(default=())  # end a draft (final) where one appears

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "completion"):
            raise ValueError(f"prompt format kind must be 'chat' or 'completion', not {self.kind!r}")
        if self.kind == "completion" and "{prompt}" not in self.template:
            raise ValueError("a completion template must contain {prompt}")

    def messages(self, prompt: Prompt) -> list[dict[str, str]]:
        """The chat messages for `prompt` (chat kind): the conversation's own, with this format's
        system message first when the conversation has none of its own (its own replaces it)."""
        turns = conversation(prompt)
        own = turns[0].role == "system"
        system = [{"role": "system", "content": self.system}] if self.system and not own else []
        return [*system, *(m.as_dict() for m in turns)]

    def completion(self, prompt: Prompt) -> str:
        """The plain text a base model continues (completion kind). A string, or a lone user
        message, is `template` with {prompt} filled in, exactly. A conversation is, in order:

        - the system message's text, then a blank line ("\\n\\n"), when there is one;
        - each earlier user turn through `template`, followed by its assistant turn: a space, then
          the assistant's text (no space when that text begins with whitespace), then a blank line;
          a user turn without an answer is followed by the blank line alone;
        - the last user turn through `template`, which the model continues.

        With QA_COMPLETION, system "Be brief." and turns "2+2?", "4", "And 3+3?" a base model sees
        "Be brief.\\n\\nQuestion: 2+2?\\nAnswer: 4\\n\\nQuestion: And 3+3?\\nAnswer:". The stop strings
        are the format's own, unchanged: the answer ends where the model starts the next question."""
        if isinstance(prompt, str):
            return self._fill(prompt)
        text = ""
        turns = conversation(prompt)
        for i, m in enumerate(turns):
            if m.role == "system":
                text += m.content + "\n\n"
            elif m.role == "user":
                if i > 0 and turns[i - 1].role == "user":
                    text += "\n\n"  # an earlier question nobody answered
                text += self._fill(m.content)
            else:
                gap = "" if not text or m.content[:1].isspace() else " "
                text += gap + m.content + "\n\n"
        return text

    def _fill(self, question: str) -> str:
        return self.template.replace("{prompt}", question)


CHAT = PromptFormat("chat")
# For base models: a Q/A completion that stops where the model would begin the next question.
QA_COMPLETION = PromptFormat(
    "completion",
    template="Question: {prompt}\nAnswer:",
    stop_strings=("\nQuestion:", "\n\nQuestion", "Question:"),
)
