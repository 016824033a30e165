"""The limits on one request: what each input a user controls may hold, how each bound is derived,
and check_request, which the engine runs on every request before any model work.

Two kinds of bound. Those here need no model: a prompt's characters and messages (the whole
conversation's), a typed segment's characters, a branch's answer so far (EnsembleConfig bounds the
settings: segment length, budget, stop strings). Those that depend on a model's context live in the
members, which know it (HFMember.max_positions, RemoteMember.max_positions): start() refuses a
prompt (the whole conversation in the member's template) whose tokens and answer budget exceed the
context before its first forward pass, verify refuses a candidate that would run past it, accept
refuses an answer that would. docs/limits.md lists them all for operators. Limits: the bounds the
API server's operator sets per request (declared with setting(), so its flags come from flags.py).
Stdlib only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import check_fields, setting
from .errors import ConfigError
from .prompts import Prompt, as_prompt, last_user_text, prompt_chars

if TYPE_CHECKING:
    from .config import EnsembleConfig
    from .records import Round

# A prompt (every message of a conversation together): far beyond any small model's context (about
# 25k tokens of English), so it stops pasted files before they are even tokenized; each member then
# refuses one that does not fit its context (the whole conversation in its template, in tokens).
MAX_PROMPT_CHARS = 100_000
# A conversation's messages: each is rendered by every member's template and checked one by one, and
# a chat front end resends them all on every turn. 64 holds a long conversation (32 exchanges); a
# body of thousands of empty messages is refused before any is read.
MAX_MESSAGES = 64
# A branch's answer so far (the text of the rounds it starts from, from a live run or an uploaded
# trace) joins every member's context just as the prompt does: the same bound.
MAX_ANSWER_CHARS = MAX_PROMPT_CHARS
# A typed (or forced) segment stands in for one round's candidate, at most L tokens of a drafter.
# It may be as long as TYPED_ROUNDS rounds' worth at CHARS_PER_TOKEN characters per token (English
# averages about 4; 8 leaves room for code and long words), and never shorter than MIN_TYPED_CHARS,
# so that a sentence or two fits at any L: 400 characters at the default L = 10, 8,192 at the largest
# L = 256. Unbounded, one segment of 40,000 characters grew the app to 24 GB before verification was
# chunked. In tokens it is at most 4 per character (UTF-8 bytes, one token each at worst); each
# verifier also checks that it fits its context, and scores it in chunks (memory linear in length).
TYPED_ROUNDS = 4
CHARS_PER_TOKEN = 8
MIN_TYPED_CHARS = 400
# The answer budget's ceiling: the largest context of any catalogued model (128k tokens). A member
# refuses prompt + budget beyond its own context before its first pass; this bounds the members
# that cannot tell (a server that reports no context). The app's slider stops at 1,024.
MAX_NEW_TOKENS = 131_072
# Stop strings are searched at every drafted token and every round: their number and length bound
# that work (a few markers such as "\nQuestion:" are what they are for).
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 200


def typed_segment_chars(config: EnsembleConfig) -> int:
    """The most characters a forced segment may have under this config (see TYPED_ROUNDS)."""
    return max(MIN_TYPED_CHARS, TYPED_ROUNDS * CHARS_PER_TOKEN * config.segment_len)


def check_prompt(prompt: object) -> Prompt:
    """Refuse a prompt no member could answer, and return it as a Prompt (prompts.as_prompt): not
    text nor a conversation, a malformed conversation, an empty question, absurdly long in
    characters or in messages, or not encodable."""
    if isinstance(prompt, (list, tuple)) and len(prompt) > MAX_MESSAGES:
        raise ConfigError(
            f"the conversation has {len(prompt):,} messages; the limit is {MAX_MESSAGES} (MAX_MESSAGES)"
        )
    if not isinstance(prompt, (str, list, tuple)):
        raise ConfigError(
            f"the prompt must be text or a list of {{role, content}} messages, got {type(prompt).__name__}"
        )
    checked = as_prompt(prompt)
    if not last_user_text(checked).strip():
        what = "the prompt" if isinstance(checked, str) else "the last user message"
        raise ConfigError(f"{what} is empty; type a question or an instruction")
    chars = prompt_chars(checked)
    if chars > MAX_PROMPT_CHARS:
        what = "the prompt has" if isinstance(checked, str) else "the conversation has, in all its messages,"
        raise ConfigError(
            f"{what} {chars:,} characters; the limit is {MAX_PROMPT_CHARS:,} (MAX_PROMPT_CHARS)"
        )
    if isinstance(checked, str):
        _check_encodable(checked, "the prompt")
    else:
        for i, m in enumerate(checked):
            _check_encodable(m.content, f"messages[{i}]")
    return checked


def check_request(
    prompt: object,
    config: EnsembleConfig,
    start: Sequence[Round] = (),
    forced: str | None = None,
    names: Sequence[str] | None = None,
) -> None:
    """Everything about one request that can be refused before a member is asked anything. The
    config is valid already (EnsembleConfig checks itself); these are ceilings on what it costs.
    With `names` (the members that will play it), a branch's `start` must be theirs. `prompt`: a
    string or a conversation (check_prompt)."""
    check_prompt(prompt)
    if start and names is not None:
        check_branch(start, names)
    if config.gate_member and names is not None and config.gate_member not in names:
        raise ConfigError(
            f"gate_member {config.gate_member!r} is not a member of this run ({', '.join(names)}); "
            "name one of them, or leave it empty for the highest-weight active member"
        )
    if config.max_new_tokens > MAX_NEW_TOKENS:
        raise ConfigError(
            f"max_new_tokens is {config.max_new_tokens:,}; the limit is {MAX_NEW_TOKENS:,} (MAX_NEW_TOKENS)"
        )
    if len(config.stop_strings) > MAX_STOP_STRINGS:
        raise ConfigError(
            f"stop_strings has {len(config.stop_strings)} strings; the limit is {MAX_STOP_STRINGS} "
            "(MAX_STOP_STRINGS)"
        )
    longest = max(map(len, config.stop_strings), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise ConfigError(
            f"stop_strings holds a string of {longest:,} characters; the limit is "
            f"{MAX_STOP_STRING_CHARS} (MAX_STOP_STRING_CHARS)"
        )
    if start:
        answer = start[-1].text
        if len(answer) > MAX_ANSWER_CHARS:
            raise ConfigError(
                f"the answer to branch from has {len(answer):,} characters; the limit is "
                f"{MAX_ANSWER_CHARS:,} (MAX_ANSWER_CHARS); branch at an earlier round"
            )
    if forced is None:
        return
    if not isinstance(forced, str):
        raise ConfigError(f"the forced segment must be text, got {type(forced).__name__}")
    if not forced:
        raise ConfigError("the forced segment is empty; type some text or pick a candidate")
    limit = typed_segment_chars(config)
    if len(forced) > limit:
        raise ConfigError(
            f"the forced segment has {len(forced):,} characters; the limit is {limit:,} at segment "
            f"length {config.segment_len} ({TYPED_ROUNDS} rounds of {config.segment_len} tokens at "
            f"{CHARS_PER_TOKEN} characters each, at least {MIN_TYPED_CHARS}); type a shorter segment"
        )
    _check_encodable(forced, "the forced segment")


def _check_encodable(text: str, what: str) -> None:
    """A lone surrogate (undecodable bytes, or a broken API client) is no text a tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(
            f"{what} holds a character that is not valid text ({text[e.start]!r} at character "
            f"{e.start}, a lone surrogate); remove it"
        ) from None


def check_branch(start: Sequence[Round], names: Sequence[str]) -> None:
    """Refuse a branch point that does not belong to this ensemble or has already ended."""
    if tuple(start[0].members) != tuple(names):
        raise ConfigError(
            f"the rounds to branch from were played by {', '.join(start[0].members)}, "
            f"not by this ensemble ({', '.join(names)}); load those members"
        )
    if [r.k for r in start] != list(range(1, len(start) + 1)):
        raise ConfigError("the rounds to branch from must be rounds 1..k of one run, in order")
    if any(r.stop_reason for r in start):
        raise ConfigError("the run ended within the rounds to branch from; branch at an earlier round")


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; the operator sets them (specfuse-serve's flags, made from these
    setting() fields by specfuse.flags; the last two are no flag)."""

    max_prompt_chars: int = setting(  # every message's text together (a completion's prompt)
        32_000, "longest prompt, in characters; longer: 413", low=1, group="limits"
    )
    max_tokens: int = setting(1024, "largest max_tokens a request may ask; more: 400", low=1, group="limits")
    request_timeout_s: float = setting(
        600.0, "seconds a request may take, time in line included", above=0.0, group="limits"
    )
    traces: int = setting(256, "recent traces kept for GET /v1/traces/ID", low=1, group="limits")
    keepalive_s: float = 5.0  # a stream waiting for its next round sends a comment this often
    bodies_at_once: int = 8  # request bodies read at once (at most this × max_body_bytes in memory)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def max_body_bytes(self) -> int:
        return 4 * self.max_prompt_chars + 65_536  # UTF-8 and JSON escapes, plus the other fields
