"""Members served by inference servers: SGLang, vLLM and llama.cpp's llama-server, behind `Member`.

One RemoteMember per server URL, with a small adapter per engine for its JSON (engines.py).
Tokens, drafting cuts and scored tokens are computed on the client with the model's own tokenizer,
through the same functions as HFMember (drafting.py), so a model behaves alike in-process and served;
the server's prefix cache stands in for our KV cache. Servers return log-probabilities, never raw
logits, so a remote member scores with score="logprob" only. How requests travel (deadlines,
retries, size caps, credentials) is transport.py's; this module knows nothing about the other members.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...config import MemberSettings
from ...errors import ConfigError, PromptTooLongError
from ...prompts import CHAT, Prompt, PromptFormat
from ...records import Candidate
from .. import drafting
from ..drafting import PROBE_TEXT, UTF8_GRACE_TOKENS, TokenState
from ..protocol import BaseMember
from .engines import ADAPTERS, ENGINES, Adapter, Generated
from .transport import PROXY_MODES, Http, redact, split_credentials

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0  # each request's whole deadline
# Chunked prefill: a long prompt is read by the server on one of WARMERS threads per member, and each
# prefill_many waits at most PREFILL_WAIT_S for it (the batch's loop does not spin while only such
# prompts are being read; a round under way waits no longer than that for them).
WARMERS = 4
PREFILL_WAIT_S = 0.05
OPTIONS = ("tokenizer", "timeout", "model", "proxy")


# ---- naming a served member -----------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSpec:
    """`ENGINE:URL[#NAME][?KEY=VALUE&...]`, e.g. `llama-server:http://127.0.0.1:8080#smollm2?tokenizer=smollm2-135m`.

    Options: tokenizer (a catalogue name, a local folder, a .gguf file or a hub id; default NAME),
    timeout (each request's whole deadline in seconds: connecting, waiting, reading, retries), model
    (the served model name, vLLM only; default: the first the server lists), proxy (`env`: through
    the environment's HTTP(S)_PROXY; default `none`, so prompts never go through a proxy unasked).
    A URL's `user:password@` is sent as basic auth, kept in `auth`, and never shown. Only the
    operator names servers (command-line flags); browser users pick among them.
    """

    engine: str  # one of ENGINES
    url: str  # scheme://host:port[/path], without credentials or a trailing slash
    name: str  # the member's name
    tokenizer: str
    timeout: float = DEFAULT_TIMEOUT_S
    model: str | None = None
    proxy: str = "none"  # one of transport.PROXY_MODES
    auth: tuple[str, str] | None = field(default=None, repr=False)  # (user, password) from the URL


def is_server_spec(text: str) -> bool:
    return any(text.startswith(f"{engine}:") for engine in ENGINES)


def parse_server_spec(spec: str) -> ServerSpec:
    """Parse and check a server spec; raises ConfigError naming what is wrong (never its credentials)."""
    engine, sep, rest = spec.partition(":")
    shown = redact(spec)
    if not sep or engine not in ENGINES:
        raise ConfigError(
            f"Unknown server spec {shown!r}; write ENGINE:URL#NAME with ENGINE one of {', '.join(ENGINES)}, "
            "e.g. llama-server:http://127.0.0.1:8080#smollm2-135m"
        )
    rest, _, query = rest.partition("?")
    url, _, name = rest.partition("#")
    url, auth = split_credentials(url)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (reading it checks it)
    except ValueError as e:
        raise ConfigError(f"Server spec {shown!r}: {redact(url)!r} has a bad port: {e}") from e
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(f"Server spec {shown!r}: {redact(url)!r} is not an http(s)://host:port URL")
    try:
        options = dict(urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError as e:
        raise ConfigError(f"Server spec {shown!r}: cannot read the options {redact(query)!r}: {e}") from e
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ConfigError(
            f"Server spec {shown!r}: unknown option(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(OPTIONS)}"
        )
    name = name or f"{engine}@{parts.netloc}"  # the netloc without credentials
    tokenizer = options.get("tokenizer") or name
    try:
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError as e:
        raise ConfigError(f"Server spec {shown!r}: timeout must be a number of seconds") from e
    if not 0 < timeout < math.inf:
        raise ConfigError(f"Server spec {shown!r}: timeout must be a positive number of seconds")
    proxy = options.get("proxy", "none")
    if proxy not in PROXY_MODES:
        raise ConfigError(
            f"Server spec {shown!r}: proxy must be one of {', '.join(PROXY_MODES)}, not {proxy!r}"
        )
    model = options.get("model") or None
    return ServerSpec(engine, url.rstrip("/"), name, tokenizer, timeout, model, proxy, auth)


# ---- the member ------------------------------------------------------------------------------------


@dataclass
class RemoteState(TokenState):
    """One request's context in one served member: the server caches the prefix, we keep the ids."""

    drafts: int = 0  # drafts made so far: each sampled draft gets its own seed
    token_logprobs: list[list[float]] = field(default_factory=list)  # last score(): [candidates][tokens]
    # Chunked prefill (prefill_many): the request that has the server read a long prompt, on a thread
    # of its own; `read` once it has come back (or was never needed).
    reading: Future[None] | None = field(default=None, repr=False)
    read: bool = False


def supported_scores(member: object) -> tuple[str, ...]:
    """The score settings a member supports: served members have log-probs only."""
    return tuple(getattr(member, "scores", ("logit", "logprob")))


class RemoteMember(BaseMember):
    """A model served by SGLang, vLLM or llama-server, as an ensemble member."""

    scores = ("logprob",)  # what score settings it supports

    def __init__(
        self,
        name: str,
        engine: str,
        url: str,
        tokenizer: PreTrainedTokenizerBase,
        *,
        prompt_format: PromptFormat = CHAT,
        timeout: float = DEFAULT_TIMEOUT_S,
        model: str | None = None,
        generation_eos: Any = None,
        auth: tuple[str, str] | None = None,
        proxy: str = "none",
    ) -> None:
        """`url` may hold `user:password@` (or give them as `auth`): sent as basic auth, shown as
        `***@`. `timeout`: each request's whole deadline. `proxy`: "none" or "env"."""
        if engine not in ADAPTERS:
            raise ConfigError(f"{name}: unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        if prompt_format.kind == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"{name}: the tokenizer has no chat template; use a completion prompt format")
        self.http = Http(name, engine, url, timeout, auth=auth, proxy=proxy)
        self.name = name
        self.engine = engine
        self.url = self.http.url  # credentials shown as ***: this URL appears in messages
        self.device = "server"  # its weights are the server's business
        self.host = self.url  # members on different servers run at the same time (parallel="auto")
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        self.stop_token_ids = frozenset(drafting.stop_token_ids(tokenizer, generation_eos))
        self.adapter = ADAPTERS[engine](self.http, model, self.stop_token_ids, self.decode)
        self.end_marker = tuple(drafting.end_marker(tokenizer, prompt_format, self.stop_token_ids))
        self.max_positions: int | None = None
        self.connected = False
        self._warm_pool: futures.ThreadPoolExecutor | None = None  # prefill_many's, made when first needed
        self._warm_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RemoteMember({self.name!r}, {self.engine}, {self.url!r})"

    def encode(self, text: str) -> list[int]:
        return drafting.encode(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        return drafting.decode(self.tokenizer, ids)

    def connect(self) -> RemoteMember:
        """Reach the server and check once that it tokenizes as our tokenizer does."""
        with self.http.reading("its start-up requests"):
            self.max_positions = self.adapter.connect()
            theirs = self.adapter.tokenize(PROBE_TEXT)
        ours = self.encode(PROBE_TEXT)
        if theirs != ours:
            raise ConfigError(
                f"{self.http.where()} tokenizes differently from the tokenizer given for it "
                f"(first difference at token {drafting.common_prefix_len(theirs, ours)}); "
                "name the served model's own tokenizer with ?tokenizer="
            )
        self.connected = True
        return self

    # -- the Member protocol -------------------------------------------------------------------------

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The member's own context for `prompt` (a conversation, or a string: one user message),
        rendered here with the served model's tokenizer (its chat template, or its completion format;
        the messages' text never read as control tokens) and sent to the server as token ids."""
        try:
            return drafting.prompt_ids(self.tokenizer, self.prompt_format, prompt)
        except ConfigError as e:
            raise type(e)(f"{self.name}: {e}") from None

    def start(self, prompt: Prompt, settings: MemberSettings) -> RemoteState:
        if settings.score not in self.scores:
            raise ConfigError(
                f"{self.name}: served by {self.engine} at {self.url}, which returns log-probabilities, "
                "not raw logits; score with log-probs (score='logprob', --score logprob)"
            )
        if not self.connected:
            self.connect()
        ids = self.prompt_ids(prompt)
        if not ids:
            raise ConfigError(f"{self.name}: the prompt formats to no tokens")
        if self.max_positions and len(ids) + settings.max_new_tokens > self.max_positions:
            raise PromptTooLongError(
                f"{self.name}: the prompt takes {len(ids)} tokens and the answer budget "
                f"{settings.max_new_tokens} more, beyond the server's context of {self.max_positions}; "
                "shorten the prompt or lower max_new_tokens"
            )
        return RemoteState(settings, len(ids), ids, "")

    def draft(self, state: RemoteState, max_new_tokens: int) -> Candidate:
        began = time.perf_counter()
        settings = state.settings
        seed = settings.seed + 7919 * state.drafts
        state.drafts += 1
        stop_ids = sorted(self.stop_token_ids)

        def tokens() -> Iterator[int]:  # L tokens in one request; more only to finish a character
            context, want = list(state.ids), max_new_tokens
            while True:
                out = self._generated(context, want, settings, seed, stop_ids)
                yield from out.ids
                if out.stopped or not out.ids:
                    if out.stopped and (not out.ids or out.ids[-1] not in self.stop_token_ids):
                        yield stop_ids[0]  # the server trimmed the stop token it ended at
                    return
                context += out.ids
                want = UTF8_GRACE_TOKENS

        stops = (*self.prompt_format.stop_strings, *settings.stop_strings)
        new, text, final = drafting.cut_draft(
            tokens(),
            max_new_tokens,
            decode=self.decode,
            ids=state.ids,
            stop_ids=self.stop_token_ids,
            stops=stops,
        )
        return Candidate(
            member=self.name,
            text=text,
            num_tokens=drafting.tokens_in(self.decode, state.ids, new, text),
            final=final,
            seconds=time.perf_counter() - began,
        )

    def score(self, state: RemoteState, candidates: Sequence[Candidate]) -> list[float]:
        """Raw scores z_i·: the mean log-probability of each candidate's tokens in context."""
        contexts, tails = [], []
        for cand in candidates:
            keep, _, tail = drafting.scored_tokens(
                self.encode, state.ids, state.prompt_len, state.answer, cand.text, cand.final, self.end_marker
            )
            contexts.append(state.ids[:keep])
            tails.append(tail)
        with self.http.reading("its log-prob request"):
            rows = self.adapter.logprobs(contexts, tails)
        state.token_logprobs = rows
        return [sum(row) / len(row) for row in rows]

    def prefill_many(self, states: Sequence[RemoteState], budget: int) -> list[bool]:
        """The server reads the prompts. Those that fit in `budget` (the first request's first) are
        read by their first draft, in the round, as before; a longer one is sent now as a request for
        one token on a thread of its own, so that the batch plays on while the server reads it (its
        prefix cache keeps it for the first draft), and is read once that request is back. A failed
        one counts as read: the first draft reads the prompt again, and says why if it fails too."""
        for state in states:
            if not state.read and state.reading is None:
                if len(state.ids) <= budget:
                    budget -= len(state.ids)
                    state.read = True
                else:
                    state.reading = self._warmers().submit(self._warm, state)
        futures.wait([s.reading for s in states if s.reading is not None], timeout=PREFILL_WAIT_S)
        for state in states:
            if state.reading is not None and state.reading.done():
                state.reading, state.read = None, True
        return [state.read for state in states]

    def _warmers(self) -> futures.ThreadPoolExecutor:
        with self._warm_lock:
            if self._warm_pool is None:
                self._warm_pool = futures.ThreadPoolExecutor(WARMERS, f"specfuse-prefill-{self.name}")
            return self._warm_pool

    def _warm(self, state: RemoteState) -> None:
        try:
            self._generated(state.ids, 1, state.settings, state.settings.seed, sorted(self.stop_token_ids))
        except Exception as e:  # the first draft sends the prompt again and reports its own failure
            log.info("%s: reading a prompt ahead of its first draft failed: %s", self.name, e)

    def accept(self, state: RemoteState, text: str) -> None:
        """Append the chosen candidate: re-tokenize the answer; the server caches the common prefix."""
        state.answer += text
        state.ids = state.ids[: state.prompt_len] + self.encode(state.answer)

    def _generated(
        self, context: Sequence[int], want: int, settings: MemberSettings, seed: int, stop_ids: Sequence[int]
    ) -> Generated:
        with self.http.reading("its generate request"):
            return self.adapter.generate(context, want, settings, seed, stop_ids)


__all__ = [
    "ADAPTERS",
    "DEFAULT_TIMEOUT_S",
    "ENGINES",
    "Adapter",
    "Generated",
    "RemoteMember",
    "RemoteState",
    "ServerSpec",
    "is_server_spec",
    "parse_server_spec",
    "supported_scores",
]
