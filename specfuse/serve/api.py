"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/chat/completions, /v1/completions
(streamed as server-sent events or whole), /v1/traces/{id} and /health, in front of one Scheduler.

Knows nothing about models or rounds beyond the Scheduler's tickets: schema.py turns bodies into
requests and rounds into responses; cli.py loads the members and runs uvicorn.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..engine import QueueFull, Scheduler, SchedulerClosed, Ticket
from ..errors import ConfigError, PromptTooLongError, SpecfuseError
from ..prompts import conversation
from ..records import Finished, Round
from ..trace import Trace, dump_trace
from . import schema
from .schema import ApiError, Ask, Limits

POLL_S = 0.25  # how often a request in progress checks for its client's disconnect and its deadline


class Serving:
    """What the app's routes share: the scheduler (None while the members load: 503), the key, the
    limits and the recent traces."""

    def __init__(self, scheduler: Scheduler | None, api_key: str | None, limits: Limits) -> None:
        self.scheduler = scheduler
        self.api_key = api_key
        self.limits = limits
        self.traces: collections.OrderedDict[str, Trace] = collections.OrderedDict()
        self.created = int(time.time())
        self.count_tokens: Callable[[str], int] = lambda text: len(text.split())
        # While the members load: what /health says they are doing (models.preparation.Preparation)
        self.preparing: Callable[[], dict[str, Any]] | None = None

    def attach(self, scheduler: Scheduler) -> None:
        """The members are loaded: requests are served from now on."""
        lead = scheduler.ensemble.members[0]
        encode = getattr(lead, "encode", None)  # HFMember's tokenizer; a served member has none here
        if callable(encode):
            self.count_tokens = lambda text: len(encode(text))
        self.scheduler = scheduler

    def ready(self) -> Scheduler:
        if self.scheduler is None:
            raise ApiError(503, "the models are still loading; try again shortly", type="server_error")
        return self.scheduler

    def keep(self, ticket: Ticket) -> None:
        if ticket.rounds:
            self.traces[ticket.id] = ticket.trace()
            while len(self.traces) > self.limits.traces:
                self.traces.popitem(last=False)

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not secrets.compare_digest(token.encode(), self.api_key.encode()):
            raise ApiError(
                401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key"
            )


def create_app(
    scheduler: Scheduler | None = None, *, api_key: str | None = None, limits: Limits | None = None
) -> FastAPI:
    """The API over `scheduler` (or none yet: app.state.serving.attach(scheduler) when loaded)."""
    app = FastAPI(title="SpecFuse Studio API", docs_url=None, redoc_url=None, openapi_url=None)
    serving = Serving(None, api_key, limits or Limits())
    if scheduler is not None:
        serving.attach(scheduler)
    app.state.serving = serving
    _add_error_handlers(app)
    _add_info_routes(app, serving)
    _add_completion_routes(app, serving)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body: ours (ApiError) and Starlette's (404, 405, …)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            ApiError(e.status_code, str(e.detail), type=kind).body(), status_code=e.status_code
        )


def _add_info_routes(app: FastAPI, serving: Serving) -> None:
    """/openapi.json, /health, /v1/models and /v1/traces/{id}."""

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        """The API's schema, request bodies included (the `specfuse` fields with their ranges)."""
        serving.authorize(request)
        if app.openapi_schema is None:
            app.openapi_schema = _openapi(app)
        return JSONResponse(app.openapi_schema)

    @app.get("/health")
    async def health() -> JSONResponse:
        if serving.scheduler is None:  # and what the loading is doing: member, step, how far
            said = serving.preparing() if serving.preparing is not None else {}
            return JSONResponse({"status": "loading", **said}, status_code=503)
        return JSONResponse({"status": "ok", **serving.scheduler.stats()})

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        serving.authorize(request)
        return JSONResponse(schema.models(serving.ready().names, serving.created))

    @app.get("/v1/traces/{trace_id}")
    async def get_trace(trace_id: str, request: Request) -> Response:
        serving.authorize(request)
        trace = serving.traces.get(trace_id)
        if trace is None:
            raise ApiError(
                404,
                f"no trace {trace_id!r}: unknown, or older than the last {serving.limits.traces} requests",
            )
        return Response(dump_trace(trace), media_type="application/json")


def _add_completion_routes(app: FastAPI, serving: Serving) -> None:
    """/v1/chat/completions and /v1/completions."""

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _respond(serving, request, "chat")

    @app.post("/v1/completions")
    async def text(request: Request) -> Response:
        return await _respond(serving, request, "text")


async def _respond(serving: Serving, request: Request, kind: str) -> Response:
    """One completion request ("chat" or "text"): checked, submitted, answered whole or streamed."""
    arrived = time.monotonic()
    serving.authorize(request)
    scheduler = serving.ready()
    raw = await request.body()
    if len(raw) > serving.limits.max_body_bytes:
        raise ApiError(413, f"the request body is over {serving.limits.max_body_bytes:,} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    ask = schema.parse_request(
        body, kind, names=scheduler.names, base=scheduler.config, limits=serving.limits
    )
    try:
        ticket = scheduler.submit(ask.prompt, ask.config, members=ask.members)
    except QueueFull as e:
        raise ApiError(429, str(e), type="rate_limit_error", code="queue_full") from None
    except SchedulerClosed as e:
        raise ApiError(503, str(e), type="server_error") from None
    except ConfigError as e:
        raise ApiError(400, str(e), param="specfuse.members" if "member" in str(e) else None) from None
    prompt_tokens = sum(serving.count_tokens(m.content) for m in conversation(ask.prompt))
    watch = asyncio.create_task(_watch(request, ticket, arrived + serving.limits.request_timeout_s))
    events = ticket.aevents()
    try:
        first = await _next_round(events, ticket, watch)  # errors before any answer: a status
    except BaseException:
        watch.cancel()
        await events.aclose()
        serving.keep(ticket)
        raise
    run = _Response(ask, ticket, prompt_tokens, watch, events, serving)
    if ask.stream:
        return StreamingResponse(run.sse(first), media_type="text/event-stream")
    return JSONResponse(await run.whole(first))


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema of the routes, with the request bodies the handlers read themselves (they
    check the body's size before parsing it) described by schema.py's models."""
    spec = get_openapi(title=app.title, version=__version__, routes=app.routes)
    _, defs = models_json_schema(
        [(model, "validation") for model in schema.REQUESTS.values()],
        ref_template="#/components/schemas/{model}",
    )
    spec.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
    for path, model in (
        ("/v1/chat/completions", schema.ChatRequest),
        ("/v1/completions", schema.CompletionRequest),
    ):
        spec["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    return spec


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


async def _next_round(
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


class _Response:
    """One request's answer, sent whole or as server-sent events, and its trace kept at the end."""

    def __init__(
        self,
        ask: Ask,
        ticket: Ticket,
        prompt_tokens: int,
        watch: asyncio.Task[str | None],
        events: AsyncGenerator[Any, None],
        serving: Serving,
    ) -> None:
        self.ask, self.ticket, self.prompt_tokens = ask, ticket, prompt_tokens
        self.watch, self.events, self.serving = watch, events, serving
        self.rid = ("chatcmpl-" if ask.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _extra(self) -> dict[str, Any]:
        t = self.ticket
        result = t.result() if t.rounds else None
        extra: dict[str, Any] = {"usage": schema.usage(self.prompt_tokens, result)}
        if result is not None:
            extra["specfuse"] = schema.summary(t.id, t.members, t.rounds, result)
        return extra

    async def whole(self, first: Round | None) -> dict[str, Any]:
        try:
            last = first
            while last is not None and last.stop_reason is None:
                last = await _next_round(self.events, self.ticket, self.watch)
            text = self.ticket.rounds[-1].text if self.ticket.rounds else ""
            finish = schema.finish_reason(self.ticket.result().stop_reason if self.ticket.rounds else "final")
            return schema.completion(self.ask, self.rid, self.created, text, finish, self._extra())
        finally:
            await self._close()

    async def sse(self, first: Round | None) -> AsyncIterator[str]:
        ask, rid, created = self.ask, self.rid, self.created
        try:
            yield _data(schema.chunk(ask, rid, created, "", first=True))
            current = first
            while current is not None:
                yield _data(schema.chunk(ask, rid, created, current.winner.text))
                if current.stop_reason is not None:
                    break
                try:
                    current = await _next_round(self.events, self.ticket, self.watch)
                except ApiError as e:  # the answer has begun: the error ends the stream
                    yield _data(e.body())
                    break
            if current is not None and current.stop_reason is not None:  # it ran to its end
                extra = self._extra()
                finish = schema.finish_reason(self.ticket.result().stop_reason)
                final_extra = {"specfuse": extra["specfuse"]} if "specfuse" in extra else {}
                yield _data(schema.chunk(ask, rid, created, "", finish, final_extra))
                if ask.include_usage:
                    yield _data(schema.chunk(ask, rid, created, None, extra={"usage": extra["usage"]}))
            yield "data: [DONE]\n\n"
        finally:
            await self._close()

    async def _close(self) -> None:
        self.ticket.cancel()  # a no-op once it has ended; a client gone mid-stream ends its run
        self.watch.cancel()
        with contextlib.suppress(Exception):
            await self.events.aclose()
        self.serving.keep(self.ticket)


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
