"""OpenAI's request bodies as pydantic models (ChatRequest, CompletionRequest, whose `specfuse`
object is generated from the run settings' one declaration), which the API also publishes
(/openapi.json), and ApiError, which carries OpenAI's error JSON and its status. ask.py reads a
validated body into the engine's terms (an Ask); the response bodies are replies.py's.

Knows nothing about HTTP, sockets or the scheduler's thread.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from ..config import (
    Setting,
    check_setting,
    setting_named,
    settings,
)
from ..engine.operator import SERVER_SETTINGS
from ..limits import MAX_MESSAGES
from ..prompts import ROLES
from .logprobs import MAX_TOP_LOGPROBS, alternatives_field, is_token_id

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


# ---- requests: pydantic models, so that /openapi.json publishes what a body may hold ----------------


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


REQUESTS: dict[str, type[ChatRequest] | type[CompletionRequest]] = {
    "chat": ChatRequest,
    "text": CompletionRequest,
}


def _kind(value: Any) -> str:
    """A JSON value's kind, in JSON's words."""
    names = {bool: "a boolean", int: "a number", float: "a number", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    """A value for an error message, quoted and cut short: any client may send anything."""
    return _cut(repr(value))


def _cut(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
