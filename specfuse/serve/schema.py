"""OpenAI's request and response bodies in the engine's terms: a chat or completion request → the
prompt, an EnsembleConfig, the members and the stream options; rounds → completion and chunk bodies.

Knows nothing about HTTP, sockets or the scheduler's thread: api.py reads the body, calls these, and
sends what they return. Errors are ApiError, which carries OpenAI's error JSON and its status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import EnsembleConfig
from ..errors import ConfigError
from ..records import Result, Round

ENSEMBLE_MODEL = "specfuse"  # the model id of the ensemble of every loaded member
ROLES = ("system", "user", "assistant")
SPEAKERS = {"system": "System", "user": "User", "assistant": "Assistant"}
MAX_STOP = 4  # OpenAI's limit on stop strings
SERVER_SETTINGS = ("parallel",)  # EnsembleConfig fields that are the server's, not a request's


class ApiError(Exception):
    """A request refused: OpenAI's {"error": {message, type, param, code}} with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; the operator sets them (specfuse-serve's flags)."""

    max_prompt_chars: int = 32_000  # the rendered prompt; longer: 413
    max_tokens: int = 1024  # max_tokens (the answer budget); more: 400
    request_timeout_s: float = 600.0  # from arrival to the last round, time in line included
    traces: int = 256  # recent traces kept for GET /v1/traces/{id}

    @property
    def max_body_bytes(self) -> int:
        return 4 * self.max_prompt_chars + 65_536  # UTF-8 and JSON escapes, plus the other fields


@dataclass(frozen=True)
class Ask:
    """One parsed request, in the engine's terms."""

    kind: str  # "chat" or "text" (/v1/completions)
    model: str
    prompt: str
    config: EnsembleConfig
    members: tuple[str, ...] | None  # None: every loaded member
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage


def render_messages(messages: Any) -> str:
    """The chat messages as the one prompt the members' chat templates wrap as a user turn.

    A lone user message is its own text. Anything else (a system message, earlier turns) becomes a
    plain transcript, one paragraph per message: "System: …", "User: …", "Assistant: …", in order;
    the last message must be the user's.
    """
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    turns: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ApiError(400, f"{where} must be an object with role and content", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise ApiError(
                400, f"{where}.role {role!r} is not supported; use one of {', '.join(ROLES)}", param=where
            )
        turns.append((role, _content(message.get("content"), where)))
    if turns[-1][0] != "user":
        raise ApiError(400, "the last message must be the user's", param=f"messages[{len(turns) - 1}]")
    if len(turns) == 1:
        return turns[0][1]
    return "\n\n".join(f"{SPEAKERS[role]}: {text}" for role, text in turns)


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ApiError(400, f"{where}.content must be text (or a list of text parts)", param=f"{where}.content")


def parse_request(
    body: Any,
    kind: str,
    *,
    names: Sequence[str],
    base: EnsembleConfig,
    limits: Limits,
) -> Ask:
    """Read and validate a /v1/chat/completions ("chat") or /v1/completions ("text") body.

    400 for anything malformed, 404 for an unknown model, 413 for a prompt over the limit."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(
            400, "model is required: 'specfuse' (the ensemble) or one member's name", param="model"
        )
    if model != ENSEMBLE_MODEL and model not in names:
        raise ApiError(
            404,
            f"the model {model!r} does not exist; use {ENSEMBLE_MODEL!r} or one of {', '.join(names)}",
            param="model",
            code="model_not_found",
        )
    n = body.get("n", 1)
    if n not in (1, None):
        raise ApiError(400, "n must be 1: the ensemble gives one answer per request", param="n")
    prompt = render_messages(body.get("messages")) if kind == "chat" else _prompt(body.get("prompt"))
    if len(prompt) > limits.max_prompt_chars:
        raise ApiError(
            413,
            f"the prompt has {len(prompt):,} characters; "
            f"this server takes at most {limits.max_prompt_chars:,}",
            param="messages" if kind == "chat" else "prompt",
            code="context_length_exceeded",
        )
    stream = _typed(body, "stream", bool, False)
    options = _typed(body, "stream_options", dict, {})
    values = _standard(body, base, limits)
    members: tuple[str, ...] | None = None if model == ENSEMBLE_MODEL else (model,)
    extra = _typed(body, "specfuse", dict, {})
    for key, value in extra.items():
        if key == "members":
            if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
                raise ApiError(
                    400, "specfuse.members must be a list of member names", param="specfuse.members"
                )
            if members is not None and tuple(value) != members:
                raise ApiError(
                    400, f"model {model!r} is one member; leave specfuse.members out", param="model"
                )
            members = tuple(value)
        elif key in SERVER_SETTINGS:
            raise ApiError(
                400, f"specfuse.{key} is the server's setting, not a request's", param=f"specfuse.{key}"
            )
        elif key in EnsembleConfig.__dataclass_fields__:
            values[key] = value
        else:
            raise ApiError(400, f"specfuse.{key} is not a setting", param=f"specfuse.{key}")
    try:
        config = dataclasses.replace(base, **values)
    except ConfigError as e:
        raise ApiError(400, str(e)) from None
    except TypeError as e:  # a value of a type a field cannot hold at all
        raise ApiError(400, str(e)) from None
    if config.max_new_tokens > limits.max_tokens:
        raise ApiError(
            400,
            f"max_tokens {config.max_new_tokens} is over this server's limit of {limits.max_tokens}",
            param="max_tokens",
        )
    return Ask(kind, model, prompt, config, members, stream, bool(options.get("include_usage", False)))


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, str):
        return prompt
    raise ApiError(400, "prompt must be one string (one prompt per request)", param="prompt")


def _typed(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ApiError(400, f"{key} must be {kind.__name__}, got {type(value).__name__}", param=key)
    return value


def _standard(body: dict[str, Any], base: EnsembleConfig, limits: Limits) -> dict[str, Any]:
    """OpenAI's sampling fields as EnsembleConfig values; a field left out keeps the server's."""
    values: dict[str, Any] = {}
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    if budget is not None:
        values["max_new_tokens"] = budget
    elif base.max_new_tokens > limits.max_tokens:
        values["max_new_tokens"] = limits.max_tokens
    for key in ("temperature", "top_p", "seed"):
        if body.get(key) is not None:
            values[key] = body[key]
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise ApiError(400, "stop must be a non-empty string or a list of them", param="stop")
        if len(stop) > MAX_STOP:
            raise ApiError(400, f"stop takes at most {MAX_STOP} strings", param="stop")
        values["stop_strings"] = tuple(stop)
    return values


# ---- responses ------------------------------------------------------------------------------------


def finish_reason(stop_reason: str) -> str:
    """OpenAI's finish_reason for the engine's stop reason: "length" when a budget ended it."""
    return "length" if stop_reason in ("budget", "rounds", "cancelled") else "stop"


def summary(trace_id: str, members: Sequence[str], rounds: Sequence[Round], result: Result) -> dict[str, Any]:
    """The response's `specfuse` object: rounds, winners per member, exits and the trace's id."""
    return {
        "trace_id": trace_id,
        "members": list(members),
        "rounds": result.rounds,
        "wins": dict(result.wins),
        "exits": [{"member": e.member, "round": e.k, "reason": e.reason} for r in rounds for e in r.exits],
        "stop_reason": result.stop_reason,
        "seconds": round(result.seconds, 3),
    }


def usage(prompt_tokens: int, result: Result | None) -> dict[str, int]:
    completion = result.tokens if result is not None else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def completion(
    ask: Ask, rid: str, created: int, text: str, finish: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """A whole (non-streamed) response: chat.completion or text_completion."""
    if ask.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": ask.model, "choices": [choice], **extra}


def chunk(
    ask: Ask,
    rid: str,
    created: int,
    text: str | None,
    finish: str | None = None,
    extra: dict[str, Any] | None = None,
    *,
    first: bool = False,
) -> dict[str, Any]:
    """One streamed chunk; text None: a chunk without a choice (the usage chunk)."""
    choices: list[dict[str, Any]] = []
    if text is not None and ask.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        choices = [
            {"index": 0, "delta": delta if text or first else {}, "logprobs": None, "finish_reason": finish}
        ]
    elif text is not None:
        choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    obj = "chat.completion.chunk" if ask.kind == "chat" else "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": ask.model,
        "choices": choices,
        **(extra or {}),
    }


def models(names: Sequence[str], created: int) -> dict[str, Any]:
    """GET /v1/models: the ensemble, then each member alone."""
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "specfuse"}
            for name in (ENSEMBLE_MODEL, *names)
        ],
    }
