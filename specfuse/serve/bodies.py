"""A request body from the socket to a JSON value the request models may read: bounded as it arrives
(Content-Length over the limit refused before a byte is read, a chunked body cut at the limit, and at
most `reading` bodies read at once), strict JSON (no NaN or Infinity, no nesting deeper than
MAX_DEPTH, no lone surrogate in any key or string), and the OpenAI fields this server does not do
refused by name rather than silently ignored.

Knows nothing about the engine: api.py calls read() and screen() before ask.parse_request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from .schema import ApiError

# A request's JSON is a few levels deep (messages[0].content[1].text is four); 32 leaves room for any
# client's extras while keeping every walk over a body (ours, pydantic's) far from the recursion limit.
MAX_DEPTH = 32
# How long a request may wait for its turn to read its body before a 503: bodies are read a few at
# a time (Reading), and one that waits holds no more than the socket's buffer meanwhile.
READ_WAIT_S = 10.0


class Reading:
    """At most `bodies` request bodies being read at once: the memory all bodies in flight can take
    is `bodies` × the body limit, whatever the number of clients."""

    def __init__(self, bodies: int) -> None:
        self.bodies = bodies
        self._slots = asyncio.Semaphore(bodies)

    async def read(self, chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
        """The body, refused with 413 once it is over `limit` bytes: at once from its Content-Length
        (`declared`), or as the bytes arrive (a chunked body, or one that sends more than it said)."""
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                raise ApiError(400, f"the Content-Length header is not a number: {declared[:40]!r}") from None
            if length > limit:
                raise _too_large(limit, f"its Content-Length is {length:,} bytes")
        try:
            await asyncio.wait_for(self._slots.acquire(), READ_WAIT_S)
        except asyncio.TimeoutError:
            raise ApiError(
                503,
                f"{self.bodies} request bodies are being read already; try again shortly",
                type="server_error",
                code="server_busy",
            ) from None
        try:
            parts: list[bytes] = []
            size = 0
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit, f"over {limit:,} bytes arrived")
                parts.append(chunk)
            return b"".join(parts)
        finally:
            self._slots.release()


def _too_large(limit: int, how: str) -> ApiError:
    return ApiError(
        413,
        f"the request body is over this server's limit of {limit:,} bytes ({how})",
        code="request_too_large",
        headers={"Connection": "close"},  # the server closes the socket: the rest is never read
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse(raw: bytes) -> Any:
    """Strict JSON: NaN, Infinity and nesting past the recursion limit are a 400, as is bad UTF-8."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(
            400, f"the request body is nested too deeply (the limit is {MAX_DEPTH} levels)"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, digits past int's limit, bad bytes
        raise ApiError(400, f"the request body is not valid JSON: {_clean(str(e))}") from None


def screen(body: Any) -> None:
    """Refuse, naming where it is, anything in a parsed body that no model could read or no trace
    could hold: nesting deeper than MAX_DEPTH, a lone surrogate in a key or a string (a broken
    client's \\ud800: no tokenizer takes it and no trace file could be written with it). One pass,
    iterative: a body is as wide as its size allows."""
    todo: list[tuple[Any, str, int]] = [(body, "", 0)]
    while todo:
        value, where, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise ApiError(
                400,
                f"{where or 'the body'} is nested more than {MAX_DEPTH} levels deep",
                param=_param(where),
            )
        if isinstance(value, str):
            _check_text(value, where, f"{where or 'the body'} holds")
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, where, f"{where or 'the body'} has a key with")
                todo.append((item, f"{where}.{key}" if where else key, depth + 1))
        elif isinstance(value, list):
            todo.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, where: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(
            400,
            f"{what} a character that is not valid text ({text[e.start]!r} at character {e.start}, "
            "a lone surrogate); send UTF-8 text",
            param=_param(where),
        ) from None


def _param(where: str) -> str | None:
    return where or None


def _clean(text: str) -> str:
    """Text safe to send back in an error (a client's own bytes may be quoted in it)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# ---- what this server does not do: refused by name, never silently ignored ------------------------

# Fields whose only meaning is a feature an ensemble of free-text drafters does not have here; their
# harmless values (what a client sends by default) pass.
_UNSUPPORTED = {
    "response_format": "structured output (response_format) is not supported: the ensemble writes free text",
    "tools": "tools are not supported: the ensemble writes free text, never a tool call",
    "tool_choice": "tool_choice is not supported: the ensemble never calls tools",
    "functions": "functions are not supported: the ensemble never calls functions",
    "function_call": "function_call is not supported: the ensemble never calls functions",
    "audio": "audio output is not supported: the ensemble writes text",
    "modalities": "only the text modality is supported",
    "logit_bias": "logit_bias is not supported: each member has its own tokenizer, so no token id "
    "means the same to all of them",
    "suffix": "suffix (fill in the middle) is not supported",
    "best_of": "best_of is not supported: ask for n answers instead",
}
_HARMLESS: dict[str, tuple[Any, ...]] = {
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "modalities": (["text"],),
    "logit_bias": ({},),
    "suffix": ("",),
    "best_of": (1,),
}
_PART_KINDS = {
    "image_url": "images",
    "input_image": "images",
    "image": "images",
    "input_audio": "audio",
    "audio": "audio",
    "file": "files",
    "input_file": "files",
    "video_url": "video",
}


def unsupported(body: dict[str, Any]) -> None:
    """A 400 naming the first field or content part the server cannot honour."""
    for key, message in _UNSUPPORTED.items():
        if key in body and body[key] is not None and body[key] not in _HARMLESS.get(key, ()):
            raise ApiError(400, message, param=key, code="unsupported_parameter")
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" or not isinstance(kind, str):
                continue  # text, or malformed: the request models say what is wrong
            what = _PART_KINDS.get(kind)
            refused = f"{what} are not supported" if what else "only text parts are supported"
            raise ApiError(
                400,
                f"messages[{i}].content[{j}] is a {kind[:40]!r} part: {refused}; the members read text only",
                param=f"messages[{i}].content[{j}]",
                code="unsupported_content",
            )
