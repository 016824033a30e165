"""The operator's view of a server: GET /metrics in Prometheus' text format (prometheus-client), one
registry per app so that two apps in one process (tests, a bench) never mix their counts.

What it counts: requests by endpoint and HTTP status (an ASGI middleware sees every response, the
refusals included); the scheduler's queue, running and paused runs, read at each scrape; the garbage
collector's passes by generation and the objects start-up froze out of them (specfuse.heap); and, as each
completion request ends, its prompt and completion tokens, its rounds, and each member's drafting,
verifying and accepting seconds in those rounds (Round.timings).

Knows nothing about HTTP routes beyond their paths, nor about the engine beyond its records.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, GCCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..records import Round

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The endpoints counted by name; any other path (a scanner's guesses) counts as "other", so that a
# client cannot grow the series without bound.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/traces", "/health", "/metrics")


class Metrics:
    """The server's counters, and its gauges read from `stats` (the scheduler's, None while loading)."""

    def __init__(self, stats: Callable[[], dict[str, int] | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "specfuse_requests",
            "HTTP requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "specfuse_prompt_tokens",
            "prompt tokens of completion requests (the lead member's count)",
            registry=r,
        )
        self.completion_tokens = Counter(
            "specfuse_completion_tokens", "answer tokens of completion requests", registry=r
        )
        self.rounds = Counter("specfuse_rounds", "ensemble rounds played for completion requests", registry=r)
        self.gated_rounds = Counter(
            "specfuse_gated_rounds",
            "of those rounds, the ones the gatekeeper played alone (config.gate: it was sure)",
            registry=r,
        )
        self.member_seconds = Counter(
            "specfuse_member_seconds",
            "seconds each member spent in each phase of the rounds (draft, verify, accept)",
            ["member", "phase"],
            registry=r,
        )
        r.register(_SchedulerGauges(stats))
        GCCollector(registry=r)  # python_gc_collections_total by generation: a full pass holds every round

    def request_done(self, path: str, status: int) -> None:
        self.requests.labels(_endpoint(path), str(status)).inc()

    def run_done(self, rounds: list[Round], prompt_tokens: int, completion_tokens: int) -> None:
        """One completion request's work, when it ends (done, failed or cancelled)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.rounds.inc(len(rounds))
        self.gated_rounds.inc(sum(r.gated for r in rounds))
        for r in rounds:
            for t in r.timings:
                for phase, seconds in (("draft", t.draft_s), ("verify", t.verify_s), ("accept", t.accept_s)):
                    if seconds > 0:
                        self.member_seconds.labels(t.member, phase).inc(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SchedulerGauges(Collector):
    """The scheduler's state at each scrape: no copies to keep in step."""

    def __init__(self, stats: Callable[[], dict[str, int] | None]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self.stats() or {}
        for key, help_text in (
            ("waiting", "requests waiting in line for a place in the batch"),
            ("running", "runs in the batch now"),
            ("reading", "runs in the batch whose prompts are still read, a part per round (chunked prefill)"),
            ("paused", "step-mode runs open (paused, or playing the step asked for)"),
            ("batch_size", "places in the batch (--batch-size)"),
            ("queue", "places in line (--queue)"),
        ):
            yield GaugeMetricFamily(f"specfuse_{key}", help_text, value=stats.get(key, 0))
        yield GaugeMetricFamily("specfuse_ready", "1 once the members are loaded", value=1 if stats else 0)
        yield GaugeMetricFamily(
            "specfuse_gc_frozen_objects",
            "objects kept out of the garbage collector's full passes once start-up was over (gc.freeze)",
            value=gc.get_freeze_count(),
        )


def _endpoint(path: str) -> str:
    if path.startswith("/v1/traces/"):
        return "/v1/traces"
    return path if path in ENDPOINTS else "other"


class CountResponses:
    """ASGI middleware: each HTTP response's status counted by Metrics.request_done."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.metrics.request_done(scope["path"], int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:  # a bug: the server's error handler answers 500 outside this middleware
            self.metrics.request_done(scope["path"], 500)
            raise
