"""How a member's tokenizer turns text into token ids when that text is a message, never template
control: a conversation through its chat template, a base model's completion rendering, an answer.

A chat template writes its own control tokens (`<|im_start|>`, `<|im_end|>`, `<end_of_turn>`, …)
around the messages. Tokenized as one string, the rendered template would also turn any such token's
text inside a message into the control token itself: a user (or an earlier assistant turn, or the
answer being written) could end a turn or open another. So:

- a chat prompt whose messages hold no control token's text is rendered and tokenized as it always
  was (the ids are exactly the tokenizer's for the template's text); one that holds some goes through
  transformers' `apply_chat_template(..., sanitize_control_tokens=True)`, which encodes the control
  tokens found in the messages as plain text and those the template writes as control tokens;
- a completion rendering and an answer's text hold no template: a text with a control token's text
  in it is encoded with transformers' own markers (`mark_control_tokens`, `encode_marked_chat`, the
  functions behind that option), the tokenizer's added special tokens (BOS) around it as before.

Control tokens are transformers' (`sanitize_control_tokens`): the tokenizer's special added tokens,
plus the added tokens its chat template writes (or `tokenizer.chat_control_tokens` when set). Whether
a text holds one is the tokenizer's own answer: its ids for the text include a control token's id.
Knows nothing about members, models or servers: drafting.py calls these with a tokenizer.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# A text whose markers keep producing control tokens (each pass marks those it found) is refused
# after this many passes; one pass is all any real tokenizer has needed.
MARKING_PASSES = 4

_cache: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def control_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids of the tokenizer's control tokens (see the module's docstring), computed once."""
    with _cache_lock:
        known = _cache.get(tokenizer)
    if known is not None:
        return known
    template = getattr(tokenizer, "chat_template", None)
    listed = getattr(tokenizer, "chat_control_tokens", None)
    if not isinstance(template, str):
        template = ""
    ids = set()
    for token_id, token in tokenizer.added_tokens_decoder.items():
        content = str(token.content)
        in_template = content in template and not content.isspace()
        if token.special or (content in listed if listed is not None else in_template):
            ids.add(int(token_id))
    out = frozenset(ids)
    with _cache_lock:
        _cache[tokenizer] = out
    return out


def plain_ids(tokenizer: PreTrainedTokenizerBase, text: str, *, special: bool = False) -> list[int]:
    """The tokenizer's own ids for `text`, control tokens parsed (a template's text)."""
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def holds_control(tokenizer: PreTrainedTokenizerBase, text: str) -> bool:
    """Whether `text`, tokenized, holds a control token: it contains one's text."""
    controls = control_ids(tokenizer)
    return any(i in controls for i in plain_ids(tokenizer, text))


def texts_ids(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """text_ids of each of `texts`, in one call of the tokenizer (a verification's candidates, each
    after the answer: one call each took 1.2-1.7 times as long for 96 texts, tools/tokenizer_calls.py)."""
    if not texts:
        return []
    batch = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    controls = control_ids(tokenizer)
    return [
        text_ids(tokenizer, text) if any(i in controls for i in ids) else list(ids)
        for text, ids in zip(texts, batch)
    ]


def text_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text` as text: the tokenizer's ids for it, any control token's text in it spelled with
    ordinary tokens instead (marked and encoded as transformers' sanitize_control_tokens does)."""
    ids = plain_ids(tokenizer, text)
    controls = control_ids(tokenizer)
    found = {i for i in ids if i in controls}
    if not found:
        return ids
    from transformers.utils.chat_template_utils import encode_marked_chat, mark_control_tokens

    for _ in range(MARKING_PASSES):
        names = {str(t) for t in tokenizer.convert_ids_to_tokens(sorted(found))}
        strings = sorted(names, key=len, reverse=True)  # a longer token before one it contains
        marked = mark_control_tokens(text, re.compile("|".join(map(re.escape, strings))))
        try:
            ids = list(encode_marked_chat(tokenizer, marked))
        except ValueError as e:  # the tokenizer spells that token from plain text too
            raise ConfigError(f"the text holds a token this tokenizer cannot keep as text: {e}") from None
        left = {i for i in ids if i in controls}
        if not left:
            return ids
        if left <= found:  # marked, and the tokenizer still spells a control token
            break
        found |= left
    raise ConfigError(
        "the text holds control tokens of the chat template that this tokenizer cannot keep as text: "
        + ", ".join(repr(t) for t in tokenizer.convert_ids_to_tokens(sorted(found)))
    )


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]]) -> list[int]:
    """The chat template's context for `messages`, ready for the answer (add_generation_prompt)."""
    text = chat_text(tokenizer, messages)
    if not any(holds_control(tokenizer, m["content"]) for m in messages):
        return plain_ids(tokenizer, text)  # the template writes its own special tokens
    try:
        ids = tokenizer.apply_chat_template(
            list(messages),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            sanitize_control_tokens=True,
        )
    except ValueError as e:  # the tokenizer spells that token from plain text too
        raise ConfigError(f"a message holds a token this tokenizer cannot keep as text: {e}") from None
    return list(ids)  # type: ignore[arg-type]  # return_dict=False, one conversation: its ids


def chat_text(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]]) -> str:
    """The chat template's text for `messages` (add_generation_prompt), as chat_ids reads it. A
    template that refuses the conversation (jinja's raise_exception: "System role not supported",
    roles that must alternate) is a ConfigError saying so."""
    try:
        return str(tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True))
    except Exception as e:
        raise ConfigError(f"the chat template refuses this conversation: {type(e).__name__}: {e}") from None


def completion_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A completion rendering's ids: the tokenizer's added special tokens (BOS) around `text` read
    as text."""
    if not holds_control(tokenizer, text):
        return plain_ids(tokenizer, text, special=True)
    before, after = _added_around(tokenizer)
    return [*before, *text_ids(tokenizer, text), *after]


def _added_around(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The ids the tokenizer adds before and after a text (add_special_tokens), found on a probe."""
    bare, full = plain_ids(tokenizer, "a"), plain_ids(tokenizer, "a", special=True)
    for begin in range(len(full) - len(bare) + 1):
        if full[begin : begin + len(bare)] == bare:
            return full[:begin], full[begin + len(bare) :]
    return [], []


__all__ = [
    "chat_ids",
    "chat_text",
    "completion_ids",
    "control_ids",
    "holds_control",
    "plain_ids",
    "text_ids",
    "texts_ids",
]
