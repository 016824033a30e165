"""The round loop: draft → verify → choose → feedback → accept → exit, yielding one Round per cycle.

Knows nothing about tokenizers, tensors or devices: members hide them behind the Member protocol,
and the arithmetic lives in feedback.py.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from . import feedback
from .config import EnsembleConfig, MemberSettings
from .errors import ConfigError, MemberError, SpecfuseError
from .records import ExitEvent, MemberTiming, Result, Round, summarize
from .segments import cut_at_stop, echoes_prompt

if TYPE_CHECKING:  # members.py imports torch; the engine itself never needs it
    from .members import Member

log = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 100_000  # far beyond any small model's context; stops pasted files early

T = TypeVar("T")


class Ensemble:
    """Several members answering one prompt together (SpecEM). Members are shared, runs are not."""

    def __init__(self, members: Sequence[Member], config: EnsembleConfig | None = None) -> None:
        if not members:
            raise ConfigError("an ensemble needs at least one member")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ConfigError(f"member names must be unique, got {', '.join(names)}")
        self.members: tuple[Member, ...] = tuple(members)
        self.config = config or EnsembleConfig()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    def stream(self, prompt: str, config: EnsembleConfig | None = None) -> Iterator[Round]:
        """Yield one Round per cycle; the last one has stop_reason set.

        Stopping early is closing the generator: every state lives inside this call, so nothing
        is left behind and the next call starts clean.
        """
        config = config or self.config
        check_prompt(prompt)
        calls = _Calls(self.members, _parallel(self.members, config))
        try:
            calls.start(prompt, [config.member_settings(i) for i in range(len(self.members))])
            yield from self._rounds(calls, config, prompt)
        finally:
            calls.shutdown()

    def stream_many(
        self, prompts: Sequence[str], config: EnsembleConfig | Sequence[EnsembleConfig] | None = None
    ) -> Iterator[tuple[int, Round]]:
        """Answer several prompts; yield (prompt index, Round) as rounds finish.

        `config` is one config for all prompts or one per prompt. Each prompt's rounds are exactly
        those stream() would yield for it alone.
        """
        configs = _per_prompt(config or self.config, len(prompts))
        for i, (prompt, cfg) in enumerate(zip(prompts, configs)):
            for rnd in self.stream(prompt, cfg):
                yield i, rnd

    def run(self, prompt: str, config: EnsembleConfig | None = None) -> Result:
        """The whole answer and its totals, for scripts: a consumer of stream()."""
        return summarize(list(self.stream(prompt, config)))

    # -- the loop ------------------------------------------------------------------------------------

    def _rounds(self, calls: _Calls, config: EnsembleConfig, prompt: str) -> Iterator[Round]:
        names = self.names
        n = len(names)
        index = {m: i for i, m in enumerate(names)}
        weights = feedback.uniform(n)
        quality = dict.fromkeys(names, 0.0)
        active = list(names)
        exited: list[str] = []
        answer, tokens = "", 0
        began = time.perf_counter()
        for k in itertools.count(1):
            round_began = time.perf_counter()
            verifiers = [m for m in names if m in active or (config.exited_verify and m in exited)]
            budget = min(config.segment_len, config.max_new_tokens - tokens)

            # 1. Draft: each active member continues its own context for at most L tokens.
            drafted, _ = calls.each(active, "draft", budget)
            candidates = tuple(drafted)
            drafted_text = [bool(c.text or c.final) for c in candidates]  # an empty non-final draft: nothing
            scorable = any(drafted_text)

            # 2. Verify: each verifier scores every candidate in one packed pass (raw z_ij).
            verify_s: dict[str, float] = {}
            if scorable:
                rows, verify_s = calls.each(verifiers, "score", candidates)
                raw = [list(row) for row in rows]
            else:  # every draft came back empty: nothing to choose from
                raw = [[0.0] * len(candidates) for _ in verifiers]

            # 3. Normalize each verifier's row, aggregate with the weights learned so far, choose.
            scores = feedback.normalize(raw, config.normalization)
            voting = [weights[index[v]] for v in verifiers]
            y = feedback.aggregate(scores, voting, verifiers, active, config.self_scores)
            # An empty non-final draft never wins; nor, with the echo guard, a candidate that would
            # leave the answer a verbatim piece of the prompt (unless every candidate would).
            eligible = list(drafted_text)
            if config.echo_guard:
                fresh = [
                    ok and not echoes_prompt(prompt, answer, c.text) for ok, c in zip(eligible, candidates)
                ]
                eligible = fresh if any(fresh) else eligible
            pool = [j for j, ok in enumerate(eligible) if ok] or list(range(len(candidates)))
            chosen, margin = feedback.choose(y, pool)

            # 4. Feedback *after* the choice, so round k is judged with weights from rounds < k.
            # SpecEM: the reference updated the weights before using them in the same round.
            r = feedback.rewards(scores, verifiers, active) if config.feedback else [0.0] * len(active)
            after = weights
            if config.feedback and len(active) > 1:
                eta = feedback.learning_rate(config.learning_rate, n, k)
                after = feedback.update_weights(weights, names, active, r, eta)

            # 5. Append the winner; decide the stop.
            winner = candidates[chosen]
            stop_reason: str | None = None
            cut = _stop_string_cut(answer, winner.text, config.stop_strings)
            if cut is not None:
                winner = replace(winner, text=winner.text[:cut], final=True)
                candidates = candidates[:chosen] + (winner,) + candidates[chosen + 1 :]
                stop_reason = "stop"
            answer += winner.text
            tokens += winner.num_tokens
            if not scorable:
                stop_reason = "empty"
            elif stop_reason is None and winner.final:
                stop_reason = "final"
            elif stop_reason is None and tokens >= config.max_new_tokens:
                stop_reason = "budget"
            elif stop_reason is None and config.max_rounds is not None and k >= config.max_rounds:
                stop_reason = "rounds"

            # 6. Model exit: members whose candidates keep losing stop drafting.
            for j, m in enumerate(active):
                quality[m] += y[j]
            exits: list[ExitEvent] = []
            if config.exit and stop_reason is None:
                for d in feedback.exit_decisions(
                    quality,
                    active,
                    k,
                    config.exit_threshold,
                    config.exit_warmup,
                    config.exit_temperature,
                    config.exit_min_active,
                ):
                    exits.append(
                        ExitEvent(
                            member=d.member,
                            k=k,
                            keep_probability=d.keep_probability,
                            threshold=d.threshold,
                            reason=f"keep-probability {d.keep_probability:.3f} < δ/|A| = {d.threshold:.3f} "
                            f"after {k} rounds (cumulative quality {quality[d.member]:.3f})",
                        )
                    )

            # 7. Every member that plays on appends the winner's text to its own context.
            accept_s: dict[str, float] = {}
            if stop_reason is None:
                leaving = {e.member for e in exits}
                playing = [m for m in active if m not in leaving]
                judging = [*exited, *leaving] if config.exited_verify else []
                still = [m for m in names if m in playing or m in judging]
                _, accept_s = calls.each(still, "accept", winner.text)

            draft_s = {c.member: c.seconds for c in candidates}
            now = time.perf_counter()
            yield Round(
                k=k,
                members=names,
                active=tuple(active),
                verifiers=tuple(verifiers),
                candidates=candidates,
                raw_scores=_freeze(raw),
                scores=_freeze(scores),
                aggregate=tuple(y),
                chosen=chosen,
                margin=margin,
                weights_before=tuple(weights),
                weights_after=tuple(after),
                rewards=tuple(r),
                exits=tuple(exits),
                timings=tuple(
                    MemberTiming(m, draft_s.get(m, 0.0), verify_s.get(m, 0.0), accept_s.get(m, 0.0))
                    for m in names
                ),
                seconds=now - round_began,
                elapsed=now - began,
                text=answer,
                stop_reason=stop_reason,
                eligible=tuple(eligible),
            )
            if stop_reason is not None:
                return
            weights = after
            for e in exits:
                active.remove(e.member)
                exited.append(e.member)


def _per_prompt(config: EnsembleConfig | Sequence[EnsembleConfig], n: int) -> list[EnsembleConfig]:
    if isinstance(config, EnsembleConfig):
        return [config] * n
    configs = list(config)
    if len(configs) != n:
        raise ConfigError(f"{n} prompts but {len(configs)} configs; give one config or one per prompt")
    return configs


def check_prompt(prompt: str) -> None:
    """Refuse a prompt no member could answer: not text, empty, or absurdly long."""
    if not isinstance(prompt, str):
        raise ConfigError(f"the prompt must be text, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ConfigError("the prompt is empty; type a question or an instruction")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"the prompt has {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}")


def _stop_string_cut(answer: str, text: str, stops: Sequence[str]) -> int | None:
    """Where in `text` the answer must end because a stop string appears (it may begin in `answer`)."""
    if not stops:
        return None
    reach = max(len(s) for s in stops) - 1
    lead = answer[-reach:] if reach > 0 else ""
    found = cut_at_stop(lead + text, stops)
    return None if found is None else max(0, found - len(lead))


def _freeze(matrix: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in matrix)


class _Calls:
    """Calls one Member method on several members with their states: timed, concurrently when they
    sit on several devices, and re-raising a failure with the member's name and the phase."""

    def __init__(self, members: Sequence[Member], parallel: bool) -> None:
        self.members = {m.name: m for m in members}
        self.states: dict[str, Any] = {}
        self.pool = ThreadPoolExecutor(len(members), thread_name_prefix="specfuse") if parallel else None

    def start(self, prompt: str, settings: Sequence[MemberSettings]) -> None:
        names = list(self.members)
        by_name = dict(zip(names, settings))
        started = self._map(names, "start", lambda m: self.members[m].start(prompt, by_name[m]))
        self.states = {m: state for m, (state, _) in zip(names, started)}

    def each(self, names: Sequence[str], phase: str, *args: Any) -> tuple[list[Any], dict[str, float]]:
        """member.<phase>(state, *args) for every member named, with its wall time in seconds."""
        pairs = self._map(names, phase, lambda m: getattr(self.members[m], phase)(self.states[m], *args))
        return [out for out, _ in pairs], {m: seconds for m, (_, seconds) in zip(names, pairs)}

    def _map(self, names: Sequence[str], phase: str, call: Callable[[str], T]) -> list[tuple[T, float]]:
        def timed(m: str) -> tuple[T, float]:
            began = time.perf_counter()
            try:
                out = call(m)
            except SpecfuseError:
                raise
            except Exception as e:  # re-raised with the member's name, never swallowed
                raise MemberError(f"{m}: {phase} failed: {type(e).__name__}: {e}") from e
            return out, time.perf_counter() - began

        if self.pool is None or len(names) < 2:
            return [timed(m) for m in names]
        return list(self.pool.map(timed, names))

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _parallel(members: Sequence[Member], config: EnsembleConfig) -> bool:
    if config.parallel == "auto":
        # On one device the members would only contend for the same cores or stream.
        return len({getattr(m, "device", "cpu") for m in members}) > 1
    return config.parallel == "on"
