"""The round loop: draft → verify → choose → feedback → accept → exit, yielding one Round per cycle.

Knows nothing about tokenizers, tensors or devices: members hide them behind the Member protocol,
and the arithmetic lives in feedback.py. Several prompts can run in lockstep (stream_many): each
phase then asks a member once for all the prompts it serves, which a member may batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from . import feedback
from .config import EnsembleConfig
from .errors import ConfigError, MemberError, SpecfuseError
from .members.workers import MemberWorkers, run_concurrently
from .records import Candidate, Draft, ExitEvent, MemberTiming, Result, Round, TokenScores, summarize
from .segments import cut_at_stop, echoes_prompt, repeated_fraction

if TYPE_CHECKING:  # members.py imports torch; the engine itself never needs it
    from .members.hf import Member

log = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 100_000  # far beyond any small model's context; stops pasted files early
TYPED = "you"  # the origin of a segment a person typed into a branch

T = TypeVar("T")


class Ensemble:
    """Several members answering prompts together (SpecEM). Members are shared, runs are not."""

    def __init__(self, members: Sequence[Member], config: EnsembleConfig | None = None) -> None:
        if not members:
            raise ConfigError("an ensemble needs at least one member")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ConfigError(f"member names must be unique, got {', '.join(names)}")
        if TYPED in names:
            raise ConfigError(f"{TYPED!r} is reserved for typed segments; rename that member")
        self.members: tuple[Member, ...] = tuple(members)
        self.config = config or EnsembleConfig()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    def stream(
        self,
        prompt: str,
        config: EnsembleConfig | None = None,
        *,
        start: Sequence[Round] = (),
        forced: str | None = None,
        origin: str = TYPED,
    ) -> Iterator[Round]:
        """Yield one Round per cycle; the last one has stop_reason set.

        Branching: `start` holds the first rounds of an earlier run of the same prompt (from a live
        run or a trace). They are not drafted again: every member's state is rebuilt from their
        answer, and weights, qualities and exits continue from where they stood. With `forced`, the
        next round's winner is that text: one of its candidates (by text), or a segment typed by a
        person (`origin`), which every verifier scores like any candidate.

        Stopping early is closing the generator: every state lives inside this call, so nothing
        is left behind and the next call starts clean.
        """
        for event in self.events(prompt, config, start=start, forced=forced, origin=origin):
            if isinstance(event, Round):
                yield event

    def events(
        self,
        prompt: str,
        config: EnsembleConfig | None = None,
        *,
        start: Sequence[Round] = (),
        forced: str | None = None,
        origin: str = TYPED,
    ) -> Iterator[Draft | Round]:
        """stream(), with each candidate also yielded as a Draft the moment its drafter is done.

        With members at the same time (parallel), the fastest member's candidate arrives first: a
        view shows it while the others are still drafting, instead of waiting for the whole round.
        """
        run = _Run(prompt, config or self.config, self.names, start, forced, origin)
        for _, event in self._lockstep([run]):
            yield event

    def stream_many(
        self,
        prompts: Sequence[str],
        config: EnsembleConfig | Sequence[EnsembleConfig] | None = None,
        *,
        batch_size: int | None = None,
    ) -> Iterator[tuple[int, Round]]:
        """Answer several prompts in lockstep; yield (prompt index, Round) as rounds finish.

        `config` is one config for all prompts or one per prompt (a study runs its variants side by
        side). A member asked for several prompts at once batches them when it can (HFMember does);
        each prompt's rounds are those stream() yields for it alone (exactly in fp32 greedy, up to
        batched arithmetic's rounding otherwise). At most `batch_size` prompts (default: all) are
        under way at once: a finished prompt drops out and the next waiting one takes its place.
        """
        configs = _per_prompt(config or self.config, len(prompts))
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        runs = [_Run(p, c, self.names) for p, c in zip(prompts, configs)]
        for i, event in self._lockstep(runs, batch_size or max(1, len(runs))):
            if isinstance(event, Round):
                yield i, event

    def run(self, prompt: str, config: EnsembleConfig | None = None) -> Result:
        """The whole answer and its totals, for scripts: a consumer of stream()."""
        return summarize(list(self.stream(prompt, config)))

    # -- the loop ------------------------------------------------------------------------------------

    def _lockstep(self, runs: list[_Run], batch_size: int = 1) -> Iterator[tuple[int, Draft | Round]]:
        for run in runs:
            check_prompt(run.prompt)
        config = runs[0].config if runs else self.config
        calls = _Calls(self.members, run_concurrently(self.members, config.parallel))
        waiting = list(range(len(runs)))
        live: list[int] = []
        try:
            while waiting or live:
                joining, waiting = waiting[: batch_size - len(live)], waiting[batch_size - len(live) :]
                if joining:
                    for i in joining:
                        runs[i].began = time.perf_counter()  # a run's clock includes its prefill
                    calls.start([runs[i] for i in joining])
                    for i in joining:
                        runs[i].resume(calls)
                    live += joining
                rounds = yield from self._round([(i, runs[i]) for i in live], calls)
                yield from zip(live, rounds)
                live = [i for i in live if not runs[i].done]
                for i in range(len(runs)):
                    if runs[i].done:
                        runs[i].states.clear()  # a finished run's caches go now, not at the end
        finally:
            calls.shutdown()

    def _round(
        self, live: list[tuple[int, _Run]], calls: _Calls
    ) -> Generator[tuple[int, Draft], None, list[Round]]:
        """One round of every run: the members' work batched across runs, the rest per run. Yields
        each candidate as it arrives; returns the rounds."""
        runs = [run for _, run in live]
        by_id = {id(run): (i, run) for i, run in live}
        for run in runs:
            run.begin_round()

        # 1. Draft: each active member continues its own context for at most L tokens.
        drafted = {}
        for key, out in calls.arrivals("draft", [(m, run, run.budget) for run in runs for m in run.drafting]):
            drafted[key] = out
            i, run = by_id[key[1]]
            yield i, Draft(run.k, out[0], time.perf_counter() - run.began)
        for run in runs:
            run.take_candidates(drafted)

        # 2. Verify: each verifier scores every candidate in one packed pass (raw z_ij).
        verified = calls.phase(
            "score", [(m, run, run.candidates) for run in runs if run.scorable for m in run.verifiers]
        )

        # 3-6. Per run: normalize, aggregate, choose, feedback, stop, exit.
        for run in runs:
            run.decide(verified)

        # 7. Every member that plays on appends the winner's text to its own context.
        accepted = calls.phase("accept", [(m, run, run.winner_text) for run in runs for m in run.accepting])
        return [run.record(accepted) for run in runs]


@dataclass
class _Run:
    """One prompt's run in progress: everything that belongs to one request (never to a member)."""

    prompt: str
    config: EnsembleConfig
    names: tuple[str, ...]
    start: Sequence[Round] = ()
    forced: str | None = None
    origin: str = TYPED
    states: dict[str, Any] = field(default_factory=dict)
    # Filled in by resume(), then carried from round to round.
    k: int = 0
    weights: list[float] = field(default_factory=list)
    quality: dict[str, float] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)
    answer: str = ""
    tokens: int = 0
    began: float = 0.0
    done: bool = False
    # The round being played.
    round_began: float = 0.0
    drafting: list[str] = field(default_factory=list)
    verifiers: list[str] = field(default_factory=list)
    budget: int = 0
    candidates: tuple[Candidate, ...] = ()
    scorable: bool = False
    raw: list[list[float]] = field(default_factory=list)
    details: tuple[tuple[TokenScores, ...], ...] = ()
    scores: list[list[float]] = field(default_factory=list)
    y: list[float] = field(default_factory=list)
    eligible: list[bool] = field(default_factory=list)
    chosen: int = 0
    margin: float = 0.0
    rewards: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    winner: Candidate | None = None
    stop_reason: str | None = None
    exits: list[ExitEvent] = field(default_factory=list)
    accepting: list[str] = field(default_factory=list)
    draft_s: dict[str, float] = field(default_factory=dict)
    verify_s: dict[str, float] = field(default_factory=dict)

    def resume(self, calls: _Calls) -> None:
        """Set the run's starting point: round 1, or the round after a branch's `start` rounds."""
        n = len(self.names)
        given = self.config.initial_weights
        if given and len(given) != n:
            raise ConfigError(
                f"initial_weights has {len(given)} values for {n} members ({', '.join(self.names)})"
            )
        if given:
            self.weights = [w / sum(given) for w in given]
        elif self.config.prior == "prompt":
            surprise = [calls.surprise(m, self) for m in self.names]
            self.weights = feedback.prior_weights(surprise, self.config.prior_temperature)
        elif self.config.prior == "trust":
            self.weights = feedback.trust_weights([calls.trust(m) for m in self.names])
        else:
            self.weights = feedback.uniform(n)
        self.quality = dict.fromkeys(self.names, 0.0)
        self.active = list(self.names)
        if not self.start:
            return
        _check_branch(self.start, self.names, self.forced)
        for rnd in self.start:
            for j, c in enumerate(rnd.candidates):
                if c.member in self.quality:
                    self.quality[c.member] += rnd.aggregate[j]
            for e in rnd.exits:
                self.active.remove(e.member)
                self.exited.append(e.member)
        last = self.start[-1]
        self.weights = list(last.weights_after)
        self.answer = last.text
        self.tokens = sum(r.winner.num_tokens for r in self.start)
        self.k = last.k
        playing = [*self.active, *(self.exited if self.config.exited_verify else [])]
        calls.phase("accept", [(m, self, self.answer) for m in self.names if m in playing])

    def begin_round(self) -> None:
        self.k += 1
        self.round_began = time.perf_counter()
        cfg = self.config
        self.drafting = list(self.active)
        self.verifiers = [
            m for m in self.names if m in self.active or (cfg.exited_verify and m in self.exited)
        ]
        self.budget = min(cfg.segment_len, cfg.max_new_tokens - self.tokens)

    def take_candidates(self, drafted: dict[tuple[str, int], tuple[Any, float]]) -> None:
        candidates = [drafted[(m, id(self))][0] for m in self.drafting]
        self.draft_s = {c.member: c.seconds for c in candidates}
        if self.forced is not None and not any(c.text == self.forced for c in candidates):
            # A typed segment joins the round as one more candidate, scored by every verifier.
            candidates.append(Candidate(self.origin, self.forced, _count_tokens(self.forced), False, 0.0))
        self.candidates = tuple(candidates)
        self.scorable = any(c.text or c.final for c in self.candidates)

    def decide(self, verified: dict[tuple[str, int], tuple[Any, float]]) -> None:
        cfg, names, candidates = self.config, self.names, self.candidates
        index = {m: i for i, m in enumerate(names)}
        if self.scorable:
            rows = [verified[(m, id(self))][0] for m in self.verifiers]
            self.raw = [list(z) for z, _ in rows]
            self.details = tuple(d for _, d in rows) if all(d for _, d in rows) else ()
            self.verify_s = {m: verified[(m, id(self))][1] for m in self.verifiers}
        else:  # every draft came back empty: nothing to choose from
            self.raw = [[0.0] * len(candidates) for _ in self.verifiers]
            self.details, self.verify_s = (), {}

        # 3. Normalize each verifier's row, aggregate with the weights learned so far, choose.
        self.scores = feedback.normalize(self.raw, cfg.normalization)
        voting = [self.weights[index[v]] for v in self.verifiers]
        drafters = [c.member for c in candidates]
        y = feedback.aggregate(
            self.scores, voting, self.verifiers, drafters, cfg.self_scores, cfg.aggregation, cfg.outlier_gap
        )
        if cfg.repeat_penalty:
            repeated = [repeated_fraction(self.answer, c.text) for c in candidates]
            y = feedback.penalize_repeats(y, repeated, cfg.repeat_penalty)
        self.y = y
        # An empty non-final draft never wins; nor, with the echo guard, a candidate that would
        # leave the answer a verbatim piece of the prompt (unless every candidate would).
        eligible = [bool(c.text or c.final) for c in candidates]
        if cfg.echo_guard:
            fresh = [
                ok and not echoes_prompt(self.prompt, self.answer, c.text)
                for ok, c in zip(eligible, candidates)
            ]
            eligible = fresh if any(fresh) else eligible
        self.eligible = eligible
        pool = [j for j, ok in enumerate(eligible) if ok] or list(range(len(candidates)))
        if self.forced is not None:  # a branch: this round's winner is given
            chosen = next(j for j, c in enumerate(candidates) if c.text == self.forced)
            others = [y[j] for j in range(len(y)) if j != chosen]
            self.chosen, self.margin = chosen, (y[chosen] - max(others)) if others else 0.0
        else:
            self.chosen, self.margin = feedback.choose(y, pool)

        # 4. Feedback *after* the choice, so round k is judged with weights from rounds < k.
        # SpecEM: the reference updated the weights before using them in the same round.
        drafted = len(self.drafting)  # a typed candidate (last) earns no reward
        self.rewards = [0.0] * len(candidates)
        self.after = self.weights
        if cfg.feedback:
            drafted_scores = [row[:drafted] for row in self.scores]
            judges = voting if cfg.weighted_rewards else None
            self.rewards[:drafted] = feedback.rewards(drafted_scores, self.verifiers, self.drafting, judges)
            if drafted > 1:
                eta = feedback.learning_rate(cfg.learning_rate, len(names), self.k)
                self.after = feedback.update_weights(
                    self.weights, names, self.drafting, self.rewards[:drafted], eta
                )

        # 5. Append the winner; decide the stop.
        winner = candidates[self.chosen]
        stop_reason: str | None = None
        cut = _stop_string_cut(self.answer, winner.text, cfg.stop_strings)
        if cut is not None:
            winner = replace(winner, text=winner.text[:cut], final=True)
            self.candidates = candidates[: self.chosen] + (winner,) + candidates[self.chosen + 1 :]
            stop_reason = "stop"
        self.winner = winner
        self.answer += winner.text
        self.tokens += winner.num_tokens
        if not self.scorable:
            stop_reason = "empty"
        elif stop_reason is None and winner.final:
            stop_reason = "final"
        elif stop_reason is None and self.tokens >= cfg.max_new_tokens:
            stop_reason = "budget"
        elif stop_reason is None and cfg.max_rounds is not None and self.k >= cfg.max_rounds:
            stop_reason = "rounds"
        self.stop_reason = stop_reason

        # 6. Model exit: members whose candidates keep losing stop drafting.
        for j, m in enumerate(self.drafting):
            self.quality[m] += y[j]
        self.exits = []
        if cfg.exit and stop_reason is None:
            for d in feedback.exit_decisions(
                self.quality,
                self.active,
                self.k,
                cfg.exit_threshold,
                cfg.exit_warmup,
                cfg.exit_temperature,
                cfg.exit_min_active,
            ):
                self.exits.append(
                    ExitEvent(
                        member=d.member,
                        k=self.k,
                        keep_probability=d.keep_probability,
                        threshold=d.threshold,
                        reason=f"keep-probability {d.keep_probability:.3f} < δ/|A| = {d.threshold:.3f} "
                        f"after {self.k} rounds (cumulative quality {self.quality[d.member]:.3f})",
                    )
                )
        self.accepting = []
        if stop_reason is None:
            leaving = {e.member for e in self.exits}
            playing = [m for m in self.active if m not in leaving]
            judging = [*self.exited, *leaving] if cfg.exited_verify else []
            self.accepting = [m for m in names if m in playing or m in judging]

    @property
    def winner_text(self) -> str:
        return self.candidates[self.chosen].text

    def record(self, accepted: dict[tuple[str, int], tuple[Any, float]]) -> Round:
        """The round as a plain record; then the run moves on (or ends)."""
        assert self.winner is not None
        accept_s = {m: accepted[(m, id(self))][1] for m in self.accepting}
        now = time.perf_counter()
        rnd = Round(
            k=self.k,
            members=self.names,
            active=tuple(self.drafting),
            verifiers=tuple(self.verifiers),
            candidates=self.candidates,
            raw_scores=_freeze(self.raw),
            scores=_freeze(self.scores),
            aggregate=tuple(self.y),
            chosen=self.chosen,
            margin=self.margin,
            weights_before=tuple(self.weights),
            weights_after=tuple(self.after),
            rewards=tuple(self.rewards),
            exits=tuple(self.exits),
            timings=tuple(
                MemberTiming(m, self.draft_s.get(m, 0.0), self.verify_s.get(m, 0.0), accept_s.get(m, 0.0))
                for m in self.names
            ),
            seconds=now - self.round_began,
            elapsed=now - self.began,
            text=self.answer,
            stop_reason=self.stop_reason,
            eligible=tuple(self.eligible),
            token_scores=self.details,
        )
        self.forced = None  # only the branch round is forced
        self.weights = self.after
        for e in self.exits:
            self.active.remove(e.member)
            self.exited.append(e.member)
        self.done = self.stop_reason is not None
        return rnd


def _check_branch(start: Sequence[Round], names: Sequence[str], forced: str | None) -> None:
    """Refuse a branch point that does not belong to this ensemble or has already ended."""
    if tuple(start[0].members) != tuple(names):
        raise ConfigError(
            f"the rounds to branch from were played by {', '.join(start[0].members)}, "
            f"not by this ensemble ({', '.join(names)}); load those members"
        )
    if [r.k for r in start] != list(range(1, len(start) + 1)):
        raise ConfigError("the rounds to branch from must be rounds 1..k of one run, in order")
    if any(r.stop_reason for r in start):
        raise ConfigError("the run ended within the rounds to branch from; branch at an earlier round")
    if forced is not None and not forced:
        raise ConfigError("the forced segment is empty; type some text or pick a candidate")


def _count_tokens(text: str) -> int:
    """A typed segment's length for the budget: its words and marks (it has no drafter tokenizer)."""
    return max(1, len(text.split()))


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


Work = tuple[str, _Run, Any]  # (member name, run, the phase's argument for that run)


class _Calls:
    """The members' work for one phase of a round, over every run that needs it: timed, batched
    per member when the member can batch, concurrently across members (workers.py) when asked to,
    and re-raising a failure with the member's name and the phase."""

    def __init__(self, members: Sequence[Member], concurrent: bool) -> None:
        self.members = {m.name: m for m in members}
        self.workers = MemberWorkers(members) if concurrent else None

    def start(self, runs: Sequence[_Run]) -> None:
        def begin(m: str, group: list[_Run]) -> list[Any]:
            member = self.members[m]
            i = list(self.members).index(m)
            return [member.start(r.prompt, r.config.member_settings(i)) for r in group]

        out = self._by_member([(m, r, None) for r in runs for m in self.members], "start", begin)
        for (m, key), (state, _) in out:
            next(r for r in runs if id(r) == key).states[m] = state

    def surprise(self, m: str, run: _Run) -> float | None:
        """The member's surprise at the prompt (nats per byte), when it can tell (prior weights)."""
        measure = getattr(self.members[m], "prompt_surprise", None)
        return None if measure is None else measure(run.states[m])

    def trust(self, m: str) -> float | None:
        return getattr(self.members[m], "trust", None)

    def phase(self, phase: str, work: Sequence[Work]) -> dict[tuple[str, int], tuple[Any, float]]:
        """Run `phase` for every (member, run, argument); results by (member, id(run))."""
        return dict(self.arrivals(phase, work))

    def arrivals(
        self, phase: str, work: Sequence[Work]
    ) -> Iterator[tuple[tuple[str, int], tuple[Any, float]]]:
        """phase(), one result at a time, as each member finishes (the fastest first)."""
        return self._by_member(work, phase, getattr(self, f"_{phase}"))

    def _draft(self, m: str, group: list[_Run], budgets: list[int]) -> list[Candidate]:
        member, states = self.members[m], [r.states[m] for r in group]
        if hasattr(member, "draft_many"):
            return list(member.draft_many(states, budgets))
        return [member.draft(s, b) for s, b in zip(states, budgets)]

    def _score(
        self, m: str, group: list[_Run], candidates: list[Sequence[Candidate]]
    ) -> list[tuple[list[float], tuple[TokenScores, ...]]]:
        """Raw scores z_i· and, from members that keep it, the token-level evidence behind them."""
        member, states = self.members[m], [r.states[m] for r in group]
        if not hasattr(member, "verify_many"):
            return [(list(member.score(s, c)), ()) for s, c in zip(states, candidates)]
        out = []
        for run, details in zip(group, member.verify_many(states, candidates)):
            z = [d.mean(run.config.score) for d in details]
            out.append((z, tuple(details)))
        return out

    def _accept(self, m: str, group: list[_Run], texts: list[str]) -> list[None]:
        member = self.members[m]
        for r, t in zip(group, texts):
            member.accept(r.states[m], t)
        return [None] * len(group)

    def _by_member(
        self, work: Sequence[Work], phase: str, call: Callable[..., list[Any]]
    ) -> Iterator[tuple[tuple[str, int], tuple[Any, float]]]:
        groups: dict[str, list[tuple[_Run, Any]]] = {}
        for m, run, arg in work:
            groups.setdefault(m, []).append((run, arg))

        def timed(m: str) -> list[tuple[Any, float]]:
            runs = [r for r, _ in groups[m]]
            began = time.perf_counter()
            try:
                outs = call(m, runs, [a for _, a in groups[m]]) if phase != "start" else call(m, runs)
            except SpecfuseError:
                raise
            except Exception as e:  # re-raised with the member's name, never swallowed
                raise MemberError(f"{m}: {phase} failed: {type(e).__name__}: {e}") from e
            each = (time.perf_counter() - began) / max(1, len(runs))  # a batch's time, shared out
            return [(o, each) for o in outs]

        names = list(groups)
        if self.workers is None:
            finished: Iterator[tuple[str, list[tuple[Any, float]]]] = ((m, timed(m)) for m in names)
        else:
            finished = self.workers.as_completed(timed, names)
        for m, outs in finished:
            for (run, _), out in zip(groups[m], outs):
                yield (m, id(run)), out

    def shutdown(self) -> None:
        if self.workers is not None:
            self.workers.shutdown()
