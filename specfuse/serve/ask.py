"""One request in the engine's terms: a chat or completion body, validated by schema.py's models,
read into an Ask (the prompt: a chat request's messages as a Conversation, which each member renders
with its own chat template, a completion request's prompt as one user message; an EnsembleConfig,
the members, the stream options) and checked against the server's limits: 400 for anything
malformed, 404 for an unknown model, 413 for a prompt over the limit, each an ApiError that names
the field the client sent.

Knows nothing about HTTP: api.py reads the body, calls parse_request, and answers the Ask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..config import MAX_SEED, EnsembleConfig
from ..errors import ConfigError
from ..limits import Limits
from ..prompts import Message, Prompt, conversation, last_user_text, prompt_chars
from .logprobs import Refused, asked_for, detokenized
from .schema import ENSEMBLE_MODEL, REQUESTS, ApiError, ChatMessage, ChatRequest, CompletionRequest

Request = ChatRequest | CompletionRequest


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
    _check_model(model, names)
    prompt, ids = _prompt(request, kind, limits, detokenize)
    values, sent = _standard(request, base, limits)
    members = _specfuse_values(request, model, values, sent)
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
    _check_answers(config, n, echo, bool(request.stream))
    return Ask(
        kind, model, prompt, config, members, bool(request.stream), include_usage, n, logprobs, echo,
        echo and asked == 1, ids,
    )  # fmt: skip


def _check_model(model: str, names: Sequence[str]) -> None:
    """404 unless the request names the ensemble or one of its members."""
    if model != ENSEMBLE_MODEL and model not in names:
        raise ApiError(
            404,
            f"the model {model!r} does not exist; use {ENSEMBLE_MODEL!r} or one of {', '.join(names)}",
            param="model",
            code="model_not_found",
        )


def _specfuse_values(
    request: Request, model: str, values: dict[str, Any], sent: dict[str, str]
) -> tuple[str, ...] | None:
    """The `specfuse` object's settings added to `values` (each noted in `sent` as specfuse.KEY),
    and the members the request runs (None: every loaded member)."""
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
    return members


def _check_answers(config: EnsembleConfig, n: int, echo: bool, stream: bool) -> None:
    """The answers asked for, possible together: every run's seed in range, an echo whole and alone."""
    if config.seed + n - 1 > MAX_SEED:
        raise ApiError(
            400, "seed + n - 1 must be at most 2**63 - 1 (run i samples with seed + i)", param="seed"
        )
    if echo and (n > 1 or stream):
        field = "n" if n > 1 else "stream"
        raise ApiError(400, f"echo is answered whole, in one answer: leave {field} out", param=field)


def _prompt(
    request: Request, kind: str, limits: Limits, detokenize: Callable[[list[int]], str] | None
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


def _standard(
    request: Request, base: EnsembleConfig, limits: Limits
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
