"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/chat/completions, /v1/completions
(streamed as server-sent events or whole), /v1/traces/{id} and /health, in front of one Scheduler.

Knows nothing about models or rounds beyond the Scheduler's tickets: schema.py and ask.py turn
bodies into requests, replies.py rounds into responses; cli.py loads the members and runs uvicorn.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import secrets
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..engine import QueueFull, Scheduler, SchedulerClosed, Ticket
from ..errors import ConfigError
from ..limits import Limits
from ..prompts import conversation
from ..trace import Trace, dump_trace
from . import bodies, replies, schema
from .ask import Ask, parse_request
from .logprobs import Reference, is_token_id
from .metrics import CONTENT_TYPE, CountResponses, Metrics
from .schema import ApiError
from .streams import Answer, next_round, sse


class Serving:
    """What the app's routes share: the scheduler (None while the members load: 503), the key, the
    limits and the recent traces."""

    def __init__(self, scheduler: Scheduler | None, api_key: str | None, limits: Limits) -> None:
        self.scheduler = scheduler
        self.api_key = api_key
        self.limits = limits
        self.reading = bodies.Reading(limits.bodies_at_once)
        self.metrics = Metrics(lambda: self.scheduler.stats() if self.scheduler is not None else None)
        self.traces: collections.OrderedDict[str, Trace] = collections.OrderedDict()
        self.created = int(time.time())
        self.count_tokens: Callable[[str], int] = lambda text: len(text.split())
        # While the members load: what /health says they are doing (models.preparation.Preparation)
        self.preparing: Callable[[], dict[str, Any]] | None = None
        self.reference: Reference | None = None  # None: a served lead member, no tokenizer here

    def attach(self, scheduler: Scheduler) -> None:
        """The members are loaded: requests are served from now on."""
        lead = scheduler.ensemble.members[0]
        encode = getattr(lead, "encode", None)  # HFMember's tokenizer; a served member has none here
        if callable(encode):
            self.count_tokens = lambda text: len(encode(text))
        tokenizer = getattr(lead, "tokenizer", None)  # the reference tokenizer (logprobs.Reference)
        if tokenizer is not None and callable(getattr(tokenizer, "decode", None)):
            self.reference = Reference(tokenizer, getattr(lead, "max_positions", None))
        self.scheduler = scheduler

    def ready(self) -> Scheduler:
        if self.scheduler is None:
            raise ApiError(503, "the models are still loading; try again shortly", type="server_error")
        return self.scheduler

    def keep(self, ticket: Ticket, prompt_tokens: int) -> None:
        """A completion request has ended: its trace kept, its work counted."""
        rounds = list(ticket.rounds)
        self.metrics.run_done(rounds, prompt_tokens, ticket.result().tokens if rounds else 0)
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
    app.add_middleware(CountResponses, metrics=serving.metrics)
    _add_error_handlers(app)
    _add_info_routes(app, serving)
    _add_tokenizer_routes(app, serving)
    _add_completion_routes(app, serving)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body: ours (ApiError) and Starlette's (404, 405, …)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

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

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """Prometheus' text format (metrics.py); behind the key, like the API (a scraper sends it as
        its bearer token)."""
        serving.authorize(request)
        return Response(serving.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        serving.authorize(request)
        scheduler = serving.ready()
        contexts = [getattr(m, "max_positions", None) for m in scheduler.ensemble.members]
        return JSONResponse(replies.models(scheduler.names, serving.created, contexts))

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


def _add_tokenizer_routes(app: FastAPI, serving: Serving) -> None:
    """vLLM's /tokenizer_info, /tokenize and /detokenize with the reference tokenizer: what lm-eval's
    remote tokenizer reads (its context lengths are then counted in the tokens we answer with)."""

    def reference(request: Request) -> Reference:
        serving.authorize(request)
        serving.ready()
        if serving.reference is None:
            raise ApiError(404, "this server's first member has no tokenizer here (a served model)")
        return serving.reference

    async def body(request: Request) -> dict[str, Any]:
        raw = await serving.reading.read(
            request.stream(), request.headers.get("content-length"), serving.limits.max_body_bytes
        )
        parsed = bodies.parse(raw)
        bodies.screen(parsed)
        if not isinstance(parsed, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return parsed

    @app.get("/tokenizer_info")
    async def tokenizer_info(request: Request) -> JSONResponse:
        return JSONResponse(reference(request).info())

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        ref, given = reference(request), await body(request)
        text = given.get("prompt")
        if not isinstance(text, str) or len(text) > serving.limits.max_prompt_chars:
            raise ApiError(400, "prompt must be a string within the prompt limit", param="prompt")
        tokens = await asyncio.to_thread(ref.encode, text)
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": ref.context})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        ref, given = reference(request), await body(request)
        ids = given.get("tokens")
        if not isinstance(ids, list) or not all(is_token_id(t) for t in ids) or len(ids) > 1_000_000:
            raise ApiError(400, "tokens must be a list of token ids", param="tokens")
        try:
            return JSONResponse({"prompt": ref.decode(ids)})
        except ValueError as e:
            raise ApiError(400, str(e), param="tokens") from None


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
    raw = await serving.reading.read(
        request.stream(), request.headers.get("content-length"), serving.limits.max_body_bytes
    )
    body = bodies.parse(raw)
    bodies.screen(body)
    if isinstance(body, dict):
        bodies.unsupported(body)
    reference = serving.reference
    ask = parse_request(
        body,
        kind,
        names=scheduler.names,
        base=scheduler.config,
        limits=serving.limits,
        detokenize=reference.decode if reference is not None else None,
    )
    await asyncio.to_thread(_check_context, scheduler, ask)  # before any member reads the prompt
    prompt_tokens = sum(serving.count_tokens(m.content) for m in conversation(ask.prompt))
    configs = [dataclasses.replace(ask.config, seed=ask.config.seed + i) for i in range(ask.n)]
    tickets: list[Ticket] = []
    top = ask.logprobs
    if ask.echo:  # the next token (max_tokens 1) is the likeliest of the verifiers' alternatives
        top = max(top or 0, 1 if ask.echo_next else 0)
    try:
        for config in configs:  # n > 1: submitted together, so they join the batch's next round together
            tickets.append(
                scheduler.submit(ask.prompt, config, members=ask.members, logprobs=top, echo=ask.echo)
            )
    except QueueFull as e:
        raise ApiError(429, str(e), type="rate_limit_error", code="queue_full") from None
    except SchedulerClosed as e:
        raise ApiError(503, str(e), type="server_error") from None
    except ConfigError as e:
        raise ApiError(400, str(e), param="specfuse.members" if "member" in str(e) else None) from None
    finally:
        if len(tickets) < len(configs):  # refused part-way: the others leave the line too
            for ticket in tickets:
                ticket.cancel()
    deadline = arrived + serving.limits.request_timeout_s
    if ask.stream:  # accepted: the headers and the role chunks now, keep-alives while they wait in line
        runs = [
            Answer.begin(ask, t, prompt_tokens, request, deadline, serving, i) for i, t in enumerate(tickets)
        ]
        for run in runs[1:]:  # one response: every chunk carries its id, whatever its choice
            run.rid, run.created = runs[0].rid, runs[0].created
        return StreamingResponse(sse(runs), media_type="text/event-stream")
    answers = await asyncio.gather(
        *(_whole(ask, t, prompt_tokens, request, deadline, serving) for t in tickets), return_exceptions=True
    )
    failed = next((a for a in answers if isinstance(a, BaseException)), None)
    if failed is not None:
        for ticket in tickets:
            ticket.cancel()
        raise failed
    return JSONResponse(replies.several([a for a in answers if isinstance(a, dict)]))


async def _whole(
    ask: Ask, ticket: Ticket, prompt_tokens: int, request: Request, deadline: float, serving: Serving
) -> dict[str, Any]:
    """One ticket's whole answer; an error before its first round is a status."""
    run = Answer.begin(ask, ticket, prompt_tokens, request, deadline, serving)
    if ask.echo and serving.reference is not None:
        run.reference = serving.reference.spans(
            ask.prompt if isinstance(ask.prompt, str) else "", ask.prompt_ids
        )
    try:
        first = await next_round(run.events, ticket, run.watch)
    except BaseException:
        run.watch.cancel()
        await run.events.aclose()
        serving.keep(ticket, prompt_tokens)
        raise
    return await run.whole(first)


def _check_context(scheduler: Scheduler, ask: Ask) -> None:
    """Refuse (413) a prompt that a member cannot hold with the answer budget, from its token count in
    that member's own template, before the request joins the batch: a member reads a newcomer's
    prompt inside the batch's round, so one that would refuse it only after the others had read it
    stalled every running stream for as long (144 s for 30,000 characters; counting takes 0.02 s a
    member). A member that cannot count here (no prompt_ids, or no known context) checks in start()."""
    chosen = set(ask.members or scheduler.names)
    for member in scheduler.ensemble.members:
        if member.name not in chosen:
            continue
        count = getattr(member, "prompt_ids", None)
        context = getattr(member, "max_positions", None) or getattr(member, "context_tokens", None)
        if not callable(count) or not isinstance(context, int) or context <= 0:
            continue
        try:
            tokens = len(count(ask.prompt))
        except ConfigError as e:
            raise ApiError(400, str(e), param="messages" if ask.kind == "chat" else "prompt") from None
        budget = ask.config.max_new_tokens
        if tokens + budget > context:
            raise ApiError(
                413,
                f"{member.name}: the prompt takes {tokens} tokens and max_tokens {budget} more, beyond "
                f"the model's context of {context}; shorten the prompt or lower max_tokens",
                param="messages" if ask.kind == "chat" else "prompt",
                code="context_length_exceeded",
            )


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
