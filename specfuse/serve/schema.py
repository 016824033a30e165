"""OpenAI's request bodies in the engine's terms: a chat or completion request → the
prompt (a chat request's messages as a Conversation, which each member renders with its own chat
template; a completion request's prompt as one user message), an EnsembleConfig, the members and the
stream options (the response bodies: replies.py). Requests are validated by pydantic models
(ChatRequest, CompletionRequest, whose `specfuse` object is generated from the run settings' one
declaration), which the API also publishes (/openapi.json).

Knows nothing about HTTP, sockets or the scheduler's thread: api.py reads the body, calls these, and
sends what they return. Errors are ApiError, which carries OpenAI's error JSON and its status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from ..config import (
    MAX_SEED,
    EnsembleConfig,
    Setting,
    check_setting,
    setting_named,
    settings,
)
from ..engine.operator import SERVER_SETTINGS
from ..errors import ConfigError
from ..limits import MAX_MESSAGES, Limits
from ..prompts import ROLES, Message, Prompt, conversation, last_user_text, prompt_chars
from .logprobs import MAX_TOP_LOGPROBS, Refused, alternatives_field, asked_for, detokenized, is_token_id

ENSEMBLE_MODEL = "specfuse"  # the model id of the ensemble of every loaded member
MAX_STOP = 4  # OpenAI's limit on stop strings
MAX_N = 8  # answers one request may ask for: each is a run in the batch (its default size)


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
        headers: dict[str, str] | None = None,
    ) -> None:
        self.headers = headers  # e.g. Connection: close, so the rest of a refused body is never read
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")  # a client's bytes, quoted
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Ask:
    """One parsed request, in the engine's terms."""

    kind: str  # "chat" or "text" (/v1/completions)
    model: str
    prompt: Prompt  # chat: the messages as a Conversation; text: the prompt string
    config: EnsembleConfig
    members: tuple[str, ...] | None  # None: every loaded member
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    n: int = 1  # runs of the ensemble, seeds seed + i, each its own choice and trace
    logprobs: int | None = None  # None: not asked; else the alternatives per token (0: none)
    echo: bool = False  # /v1/completions' echo: the prompt scored (and with max_tokens 1, one token more)
    echo_next: bool = False  # echo with max_tokens 1: the ensemble's likeliest next token follows
    prompt_ids: tuple[int, ...] | None = None  # a prompt sent as the reference tokenizer's ids


# ---- requests: pydantic models, so that /openapi.json publishes what a body may hold ----------------


def _api_error(e: ValidationError) -> ApiError:
    """A body refused by the models: the first problem, named by where it is (`messages[0].role`).
    A check of ours (a setting's range, a role) says it in its own words; pydantic's own, after the
    place it found them."""
    first = e.errors(include_url=False)[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".")
    error = first.get("ctx", {}).get("error")
    if isinstance(error, (ValueError, ConfigError)):  # ours; a message's own field says which message
        message = f"{where}: {error}" if where.startswith("messages[") else str(error)
    else:
        message = f"{where}: {first['msg']}"
    return ApiError(400, message, param=where or None)


class TextPart(BaseModel):
    """One part of a message's content; only text parts are read."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text"]
    text: str = ""


class ChatMessage(BaseModel):
    """One message; other fields (name, …) are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    @field_validator("role", mode="before")
    @classmethod
    def _known_role(cls, role: Any) -> Any:
        if role not in ROLES:
            raise ValueError(f"role {_short(role)} is not supported; use one of {', '.join(ROLES)}")
        return role

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, content: Any) -> Any:
        if not isinstance(content, (str, list)):
            raise ValueError(
                f"content must be a string or a list of {{type: text}} parts, not {_kind(content)}"
            )
        return content

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _CheckedSettings(BaseModel):
    """The base of SpecfuseOptions: every key and value checked by the run settings' own rules."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            raise ValueError("specfuse must be an object of run settings")
        out = {}
        for key, value in values.items():
            setting = setting_named(key)
            if key == "members":
                if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
                    raise ValueError("specfuse.members must be a list of member names")
            elif key in SERVER_SETTINGS:  # `parallel` was once a run setting (config.RETIRED_KEYS)
                raise ValueError(f"specfuse.{key} is the server's setting, not a request's")
            elif setting is None:
                raise ValueError(f"specfuse.{_cut(key)} is not a setting")
            else:
                value = check_setting(setting, value)
            out[key] = value
        return out


def _bounds(setting: Setting) -> dict[str, Any]:
    """A setting's bounds as pydantic (and so OpenAPI) says them: ge/le, or gt/lt where open."""
    low, high = setting.low, setting.high
    return {
        "gt" if setting.low_open else "ge": low,
        "lt" if setting.high_open else "le": high,
    }


def _specfuse_model() -> type[BaseModel]:
    """The `specfuse` object of a request: `members`, and every run setting (config.settings(): the
    same declaration the CLI's flags and the app's form come from). Checked by
    config.check_setting first, so that a bad value gets the message the CLI and the app give."""

    def annotation(setting: Setting) -> Any:
        kind = Literal[setting.choices] if setting.choices else setting.kind  # type: ignore[valid-type]
        return kind | None

    fields: dict[str, Any] = {
        "members": (list[str] | None, Field(None, description="the members that play this request")),
        **{s.name: (annotation(s), Field(None, description=s.help, **_bounds(s))) for s in settings()},
    }
    return create_model(
        "SpecfuseOptions",
        __base__=_CheckedSettings,
        __doc__="SpecFuse's own request fields: the members and any run setting (docs/serve.md).",
        **fields,
    )


SpecfuseOptions = _specfuse_model()


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class _Request(BaseModel):
    """The fields both endpoints read; any other field a client sends is ignored, as OpenAI's
    servers do for fields they do not know."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str = Field(description="'specfuse' (the ensemble) or one member's name")
    n: int | None = Field(
        1, description=f"answers, 1..{MAX_N}: n runs of the ensemble with seeds seed + i, played together"
    )
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    specfuse: SpecfuseOptions | None = None  # type: ignore[valid-type]

    @field_validator("model", mode="before")
    @classmethod
    def _named(cls, model: Any) -> Any:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model is required: {ENSEMBLE_MODEL!r} (the ensemble) or one member's name")
        return model

    @field_validator("max_tokens", "max_completion_tokens", mode="before")
    @classmethod
    def _budget(cls, value: Any, info: ValidationInfo) -> Any:
        # 0 is /v1/completions' echo alone (the prompt scored, nothing added); parse_request says so
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(
                f"{info.field_name} must be a whole number of tokens, at least 1; got {_short(value)}"
            )
        return value

    @field_validator("n", mode="before")
    @classmethod
    def _one(cls, n: Any) -> Any:
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N):
            raise ValueError(
                f"n must be an integer in 1..{MAX_N} (answers, each a run of its own); got {_short(n)}"
            )
        return n

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, stop: Any) -> Any:
        listed = [stop] if isinstance(stop, str) else stop
        if listed is not None and (
            not isinstance(listed, list) or not all(isinstance(s, str) and s for s in listed)
        ):
            raise ValueError("stop must be a non-empty string or a list of them")
        if listed is not None and len(listed) > MAX_STOP:
            raise ValueError(f"stop takes at most {MAX_STOP} strings")
        return listed


class ChatRequest(_Request):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = Field(
        None, description="return each answer token's log-probability: the ensemble's (docs/api.md)"
    )
    top_logprobs: int | None = Field(
        None, description=f"alternatives per token, 0..{MAX_TOP_LOGPROBS}; needs logprobs: true"
    )

    @field_validator("top_logprobs", mode="before")
    @classmethod
    def _top(cls, value: Any) -> Any:
        return alternatives_field("top_logprobs", value)

    @field_validator("messages", mode="before")
    @classmethod
    def _listed(cls, messages: Any) -> Any:
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {role, content} objects")
        if len(messages) > MAX_MESSAGES:  # before any message is read
            raise ValueError(
                f"messages has {len(messages):,} messages; the limit is {MAX_MESSAGES} (MAX_MESSAGES)"
            )
        return messages


class CompletionRequest(_Request):
    """POST /v1/completions: one prompt per request, text or the reference tokenizer's ids (/tokenize)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(
        None,
        description=f"return each token's log-probability (the ensemble's, docs/api.md) and this many "
        f"alternatives, 0..{MAX_TOP_LOGPROBS}",
    )
    echo: bool | None = Field(
        None, description="score the prompt and return it first: with max_tokens 0 (or 1), logprobs"
    )

    @field_validator("logprobs", mode="before")
    @classmethod
    def _top(cls, value: Any) -> Any:
        return alternatives_field("logprobs", value)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and all(is_token_id(t) for t in prompt):
            return prompt
        raise ValueError("prompt must be one string, or one list of token ids (one prompt per request)")


REQUESTS: dict[str, type[_Request]] = {"chat": ChatRequest, "text": CompletionRequest}


def chat_prompt(messages: Sequence[ChatMessage]) -> Prompt:
    """The request's messages as the run's Conversation, passed through as they are (each member
    renders them with its own chat template): a system message first if any, then the turns, the
    last one the user's. A message's text parts are joined into its content."""
    try:
        return conversation([Message(m.role, m.text) for m in messages])
    except ConfigError as e:
        raise ApiError(400, str(e), param="messages") from None


def parse_request(
    body: Any,
    kind: str,
    *,
    names: Sequence[str],
    base: EnsembleConfig,
    limits: Limits,
    detokenize: Callable[[list[int]], str] | None = None,
) -> Ask:
    """Read and validate a /v1/chat/completions ("chat") or /v1/completions ("text") body.

    400 for anything malformed, 404 for an unknown model, 413 for a prompt (all its messages'
    text) over the limit. `detokenize`: a prompt of token ids as text (the server's reference
    tokenizer); None: such a prompt is refused."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        request = REQUESTS[kind].model_validate(body)
    except ValidationError as e:
        raise _api_error(e) from None
    model = request.model
    if model != ENSEMBLE_MODEL and model not in names:
        raise ApiError(
            404,
            f"the model {model!r} does not exist; use {ENSEMBLE_MODEL!r} or one of {', '.join(names)}",
            param="model",
            code="model_not_found",
        )
    prompt, ids = _prompt(request, kind, limits, detokenize)
    values, sent = _standard(request, base, limits)
    members: tuple[str, ...] | None = None if model == ENSEMBLE_MODEL else (model,)
    extra: dict[str, Any] = {}
    if request.specfuse is not None:
        extra = request.specfuse.model_dump(exclude_unset=True)
    if "members" in extra:  # a list of names (SpecfuseOptions checked it)
        chosen = tuple(extra.pop("members"))
        if members is not None and chosen != members:
            raise ApiError(400, f"model {model!r} is one member; leave specfuse.members out", param="model")
        members = chosen
    values.update(extra)
    sent.update({key: f"specfuse.{key}" for key in extra})
    try:
        logprobs, echo, asked = asked_for(request, kind, sent, body)
    except Refused as e:
        raise ApiError(e.status, e.message, param=e.param, code=e.code) from None
    if echo:  # nothing is drafted: the budget is the one next token (asked 1) or none
        values["max_new_tokens"] = 1
    budget = values.get("max_new_tokens", base.max_new_tokens)
    if budget > limits.max_tokens:
        field = sent.get("max_new_tokens", "max_tokens")
        raise ApiError(
            400, f"{field} {budget} is over this server's limit of {limits.max_tokens}", param=field
        )
    try:
        config = dataclasses.replace(base, **values)
    except ConfigError as e:
        raise _config_error(e, sent) from None
    include_usage = request.stream_options is not None and request.stream_options.include_usage
    n = request.n or 1
    if config.seed + n - 1 > MAX_SEED:
        raise ApiError(
            400, "seed + n - 1 must be at most 2**63 - 1 (run i samples with seed + i)", param="seed"
        )
    if echo and (n > 1 or request.stream):
        field = "n" if n > 1 else "stream"
        raise ApiError(400, f"echo is answered whole, in one answer: leave {field} out", param=field)
    return Ask(
        kind, model, prompt, config, members, bool(request.stream), include_usage, n, logprobs, echo,
        echo and asked == 1, ids,
    )  # fmt: skip


def _prompt(
    request: _Request, kind: str, limits: Limits, detokenize: Callable[[list[int]], str] | None
) -> tuple[Prompt, tuple[int, ...] | None]:
    """The request's prompt, checked (not empty, within the limit), and the ids it came as, if any."""
    prompt: Prompt
    ids: tuple[int, ...] | None = None
    if isinstance(request, ChatRequest):
        prompt = chat_prompt(request.messages)
    else:
        assert isinstance(request, CompletionRequest)
        if isinstance(request.prompt, str):
            prompt = request.prompt
        else:
            ids = tuple(t for t in request.prompt if isinstance(t, int))
            try:
                prompt = detokenized(ids, detokenize, limits.max_prompt_chars)
            except Refused as e:
                raise ApiError(e.status, e.message, param=e.param, code=e.code) from None
    if not last_user_text(prompt).strip():  # the engine's check_prompt too; here it names the field
        what = "the last user message" if kind == "chat" else "the prompt"
        raise ApiError(
            400,
            f"{what} is empty; send a question or an instruction",
            param="messages" if kind == "chat" else "prompt",
        )
    chars = prompt_chars(prompt)
    if chars > limits.max_prompt_chars:
        what = "the prompt has" if isinstance(prompt, str) else "the messages have, together,"
        raise ApiError(
            413,
            f"{what} {chars:,} characters; this server takes at most {limits.max_prompt_chars:,} "
            "(--max-prompt-chars)",
            param="messages" if kind == "chat" else "prompt",
            code="context_length_exceeded",
        )
    return prompt, ids


def _kind(value: Any) -> str:
    """A JSON value's kind, in JSON's words."""
    names = {bool: "a boolean", int: "a number", float: "a number", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    """A value for an error message, quoted and cut short: any client may send anything."""
    return _cut(repr(value))


def _cut(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _standard(
    request: _Request, base: EnsembleConfig, limits: Limits
) -> tuple[dict[str, Any], dict[str, str]]:
    """OpenAI's sampling fields as EnsembleConfig values (a field left out keeps the server's), and
    for each value the request field it came from (an error names the field the client sent)."""
    values: dict[str, Any] = {}
    sent: dict[str, str] = {}
    field = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    budget = getattr(request, field)
    if budget is not None:
        values["max_new_tokens"], sent["max_new_tokens"] = budget, field
    elif base.max_new_tokens > limits.max_tokens:
        values["max_new_tokens"] = limits.max_tokens
    for key in ("temperature", "top_p", "seed"):
        if getattr(request, key) is not None:
            values[key], sent[key] = getattr(request, key), key
    if request.stop is not None:
        values["stop_strings"], sent["stop_strings"] = tuple(request.stop), "stop"
    return values, sent


def _config_error(e: ConfigError, sent: dict[str, str]) -> ApiError:
    """A setting refused by EnsembleConfig (its messages begin with the setting's name), told in the
    client's words: the field it sent (`max_tokens`, `stop`, `specfuse.top_p`)."""
    message = str(e)
    for key, field in sent.items():
        if message.startswith(key):
            return ApiError(400, field + message[len(key) :], param=field)
    return ApiError(400, message)
