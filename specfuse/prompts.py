"""How a member turns the user's prompt into its own context: a chat template or a completion format.

Stdlib only: the tokenizer that applies a chat template lives in members.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PromptFormat:
    """`chat`: the tokenizer's own chat template; `completion`: `template` with {prompt} filled in.

    Base models (no chat template) use `completion` with stop strings that end their answer where
    they would start the next question.
    """

    kind: str = "chat"  # "chat" or "completion"
    template: str = "{prompt}"  # completion only
    system: str | None = None  # chat only: an optional system message
    stop_strings: tuple[str, ...] = field(default=())  # end a draft (final) where one appears

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "completion"):
            raise ValueError(f"prompt format kind must be 'chat' or 'completion', not {self.kind!r}")
        if self.kind == "completion" and "{prompt}" not in self.template:
            raise ValueError("a completion template must contain {prompt}")

    def messages(self, prompt: str) -> list[dict[str, str]]:
        """The chat messages for `prompt` (chat kind)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": prompt}]

    def completion(self, prompt: str) -> str:
        """The plain text context for `prompt` (completion kind)."""
        return self.template.replace("{prompt}", prompt)


CHAT = PromptFormat("chat")
# For base models: a Q/A completion that stops where the model would begin the next question.
QA_COMPLETION = PromptFormat(
    "completion",
    template="Question: {prompt}\nAnswer:",
    stop_strings=("\nQuestion:", "\n\nQuestion", "Question:"),
)
