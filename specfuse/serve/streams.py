"""One request's answer in progress: its rounds awaited (the client's disconnect and the deadline
watched), sent whole or as server-sent events (n > 1: the choices' chunks interleaved, each with its
index), with the ensemble's log-probabilities when asked, and its trace kept at the end.

Knows nothing about routes or bodies: api.py parses a request, submits its tickets and hands them
here; replies.py and logprobs.py make the JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from fastapi import Request

from ..engine import SchedulerClosed, Ticket
from ..errors import ConfigError, PromptTooLongError, SpecfuseError
from ..limits import Limits
from ..records import Finished, Round
from . import logprobs, replies
from .ask import Ask
from .logprobs import Scored
from .schema import ApiError


class Serving(Protocol):
    """What an answer needs of the app's shared state (api.Serving): the limits, and where a
    finished request's trace and counts go."""

    limits: Limits

    def keep(self, ticket: Ticket, prompt_tokens: int) -> None: ...


POLL_S = 0.25  # how often a request in progress checks for its client's disconnect and its deadline


async def _watch(request: Request, ticket: Ticket, deadline: float) -> str | None:
    """Cancel the ticket when its client goes away or its time is up; say which."""
    while not ticket.ended:
        if await request.is_disconnected():
            ticket.cancel()
            return "disconnected"
        if time.monotonic() > deadline:
            ticket.cancel()
            return "timeout"
        await asyncio.sleep(POLL_S)
    return None


async def next_round(
    events: AsyncGenerator[Any, None], ticket: Ticket, watch: asyncio.Task[str | None]
) -> Round | None:
    """The next Round (Drafts are the app's, not the API's); None when the stream has ended."""
    ended = None
    try:
        async for event in events:
            if isinstance(event, Round):
                return event
            if isinstance(event, Finished):
                ended = event.state
    except SpecfuseError as e:
        raise _as_api_error(e) from None
    if ended == "cancelled":
        reason = await watch if watch.done() else None
        if reason == "timeout":
            raise ApiError(
                504, "the request ran past this server's time limit", type="timeout", code="timeout"
            )
        raise ApiError(499, "the request was cancelled", code="cancelled")
    return None


def _as_api_error(e: SpecfuseError) -> ApiError:
    if isinstance(e, PromptTooLongError):  # over a member's context window with the budget
        return ApiError(413, str(e), code="context_length_exceeded")
    if isinstance(e, ConfigError):
        return ApiError(400, str(e))
    if isinstance(e, SchedulerClosed):
        return ApiError(503, str(e), type="server_error")
    return ApiError(500, str(e), type="server_error", code="member_error")


class Answer:
    """One request's answer (one choice of it: n > 1 has one each), sent whole or as server-sent
    events, and its trace kept at the end."""

    def __init__(
        self,
        ask: Ask,
        ticket: Ticket,
        prompt_tokens: int,
        watch: asyncio.Task[str | None],
        events: AsyncGenerator[Any, None],
        serving: Serving,
        index: int = 0,
    ) -> None:
        self.ask, self.ticket, self.prompt_tokens = ask, ticket, prompt_tokens
        self.watch, self.events, self.serving, self.index = watch, events, serving, index
        self.rid = ("chatcmpl-" if ask.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.reference: list[tuple[int, int]] | None = None  # echo: the reference tokens' spans

    @classmethod
    def begin(
        cls,
        ask: Ask,
        ticket: Ticket,
        prompt_tokens: int,
        request: Request,
        deadline: float,
        serving: Serving,
        index: int = 0,
    ) -> Answer:
        """The response to `ticket`, its watch (disconnect, deadline) started."""
        watch = asyncio.create_task(_watch(request, ticket, deadline))
        return cls(ask, ticket, prompt_tokens, watch, ticket.aevents(), serving, index)

    def _extra(self) -> dict[str, Any]:
        t = self.ticket
        result = t.result() if t.rounds else None
        extra: dict[str, Any] = {"usage": replies.usage(self.prompt_tokens, result)}
        if result is not None:
            extra["specfuse"] = replies.summary(t.id, t.members, t.rounds, result)
        return extra

    def _logprobs(self, tokens: list[Scored]) -> dict[str, Any] | None:
        """A choice's (or a chunk's) logprobs object, in the endpoint's shape; None when not asked."""
        top = self.ask.logprobs
        if top is None:
            return None
        if self.ask.kind == "chat":
            return {"content": logprobs.chat_content(tokens), "refusal": None}
        return logprobs.legacy(tokens, top)

    def _round_tokens(self, rnd: Round) -> list[Scored]:
        return logprobs.round_tokens(rnd, self.ticket.config, self.ask.logprobs or 0)

    async def whole(self, first: Round | None) -> dict[str, Any]:
        try:
            last = first
            while last is not None and last.stop_reason is None:
                last = await next_round(self.events, self.ticket, self.watch)
            if self.ask.echo:
                return self._echoed()
            text = self.ticket.rounds[-1].text if self.ticket.rounds else ""
            finish = replies.finish_reason(
                self.ticket.result().stop_reason if self.ticket.rounds else "final"
            )
            tokens = [t for rnd in self.ticket.rounds for t in self._round_tokens(rnd)]
            choice_logprobs = self._logprobs(tokens) if self.ask.logprobs is not None else None
            return replies.completion(
                self.ask, self.rid, self.created, text, finish, self._extra(), choice_logprobs
            )
        finally:
            await self._close()

    def _echoed(self) -> dict[str, Any]:
        """Echo: the prompt's tokens scored (the first without a log-probability, as OpenAI's: nothing
        precedes it), and with max_tokens 1 the ensemble's likeliest next token after them."""
        (rnd,) = self.ticket.rounds
        top = self.ask.logprobs or 0
        tokens = logprobs.round_tokens(rnd, self.ticket.config, top, self.reference)
        if tokens:
            tokens[0] = Scored(tokens[0].text, tokens[0].offset, None)
        text = rnd.winner.text
        if self.ask.echo_next and (following := logprobs.next_token(rnd, self.ticket.config)) is not None:
            tokens.append(Scored(following.text, following.offset, following.logprob, following.top[:top]))
            text += following.text
        extra = self._extra()
        extra["usage"] = replies.usage(self.prompt_tokens, None) | {
            "completion_tokens": int(self.ask.echo_next)
        }
        extra["usage"]["total_tokens"] = self.prompt_tokens + int(self.ask.echo_next)
        return replies.completion(
            self.ask, self.rid, self.created, text, "length", extra, self._logprobs(tokens)
        )

    async def events_out(self) -> AsyncIterator[dict[str, Any] | None]:
        """This choice's chunks: the role chunk at once, then one per round (with its tokens'
        logprobs when asked), then the final chunk; None while a round is awaited (in line, or a long
        first round), every `keepalive_s`. An error once the stream has begun is its last chunk."""
        ask, rid, created, index = self.ask, self.rid, self.created, self.index
        pending: asyncio.Future[Round | None] | None = None
        try:
            yield replies.chunk(ask, rid, created, "", first=True, index=index)
            current = None
            while True:
                pending = asyncio.ensure_future(next_round(self.events, self.ticket, self.watch))
                while not (await asyncio.wait({pending}, timeout=self.serving.limits.keepalive_s))[0]:
                    yield None
                try:
                    current = pending.result()
                except ApiError as e:  # the answer has begun: the error ends the stream
                    yield e.body()
                    current = None
                    break
                if current is None:
                    break
                lp = self._logprobs(self._round_tokens(current)) if ask.logprobs is not None else None
                yield replies.chunk(ask, rid, created, current.winner.text, index=index, logprobs=lp)
                if current.stop_reason is not None:
                    break
            if current is not None and current.stop_reason is not None:  # it ran to its end
                extra = self._extra()
                finish = replies.finish_reason(self.ticket.result().stop_reason)
                final_extra = {"specfuse": extra["specfuse"]} if "specfuse" in extra else {}
                yield replies.chunk(ask, rid, created, "", finish, final_extra, index=index)
        finally:
            if pending is not None and not pending.done():  # the client left while it waited
                pending.cancel()
            await self._close()

    async def _close(self) -> None:
        self.ticket.cancel()  # a no-op once it has ended; a client gone mid-stream ends its run
        self.watch.cancel()
        with contextlib.suppress(Exception):
            await self.events.aclose()
        self.serving.keep(self.ticket, self.prompt_tokens)


async def sse(runs: list[Answer]) -> AsyncIterator[str]:
    """The stream of every choice's chunks (n > 1: interleaved as their rounds come, each with its
    `index`), a keep-alive comment while none has anything to say, the usage chunk when asked (the
    prompt once, every choice's answer), then [DONE]."""
    queue: asyncio.Queue[tuple[int, dict[str, Any] | None]] = asyncio.Queue()
    ended = object()

    async def pump(i: int, run: Answer) -> None:
        try:
            async for item in run.events_out():
                if item is not None:
                    await queue.put((i, item))
        finally:
            queue.put_nowait((i, ended))  # type: ignore[arg-type]

    tasks = [asyncio.create_task(pump(i, run)) for i, run in enumerate(runs)]
    first, ask = runs[0], runs[0].ask
    try:
        left = len(runs)
        while left:
            try:
                _, item = await asyncio.wait_for(queue.get(), first.serving.limits.keepalive_s)
            except asyncio.TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if item is ended:
                left -= 1
            else:
                yield _data(item)  # type: ignore[arg-type]
        if ask.include_usage and all(r.ticket.rounds and r.ticket.state == "done" for r in runs):
            completion = sum(r.ticket.result().tokens for r in runs)
            usage = {
                "prompt_tokens": first.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": first.prompt_tokens + completion,
            }
            yield _data(replies.chunk(ask, first.rid, first.created, None, extra={"usage": usage}))
        yield "data: [DONE]\n\n"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
