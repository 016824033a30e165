"""The round loop, yielding one Round per cycle. One round is seven steps, in this order:

1. draft     each active member continues its own context for at most L tokens
2. verify    each verifier scores every candidate in one packed pass (raw z_ij)
3. choose    normalize each verifier's row, aggregate with the weights so far, pick the winner
4. feedback  reward the drafters and update the weights (after the choice)
5. stop      append the winner to the answer; decide whether the run ends
6. exit      members whose candidates keep losing stop drafting
7. accept    every member that plays on appends the winner to its own context

Batch._round calls them in that order, by these names. Knows nothing about tokenizers, tensors
or devices: members hide them behind the Member protocol (members/protocol.py), and the arithmetic
lives in feedback.py. Several prompts can run in lockstep (stream_many, and the serving scheduler
through Batch): each member step then asks a member once for all the prompts it serves, which a
member may batch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from . import feedback
from .config import EnsembleConfig
from .errors import ConfigError, MemberError, SpecfuseError
from .limits import check_prompt as check_prompt
from .limits import check_request
from .members.protocol import Member, Verdict
from .members.workers import MemberCalls, run_concurrently
from .records import Candidate, Draft, ExitEvent, MemberTiming, Result, Round, TokenScores, summarize
from .segments import agreement, echoes_prompt, repeated_fraction, stop_string_cut

log = logging.getLogger(__name__)

TYPED = "you"  # the origin of a segment a person typed into a branch


class Ensemble:
    """Several members answering prompts together (SpecEM). Members are shared, runs are not."""

    def __init__(self, members: Sequence[Member], config: EnsembleConfig | None = None) -> None:
        if not members:
            raise ConfigError("an ensemble needs at least one member")
        for m in members:
            if not isinstance(m, Member):
                raise ConfigError(
                    f"{m!r} is not a member: it must offer everything in specfuse.members.protocol.Member "
                    "(subclass BaseMember there for the optional parts)"
                )
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
        for run in runs:  # limits.py: every bound that needs no model, before any model work
            check_request(run.prompt, run.config, run.start, run.forced, run.names)
        config = runs[0].config if runs else self.config
        batch = Batch(self.members, run_concurrently(self.members, config.parallel))
        index = {id(run): i for i, run in enumerate(runs)}
        waiting = list(runs)
        try:
            while waiting or batch.live:
                room = batch_size - len(batch.live)
                joining, waiting = waiting[:room], waiting[room:]
                for _, error in batch.join(joining):
                    raise error  # every run here needs every member: one failure ends them all
                for run, event in batch.step():
                    if isinstance(event, SpecfuseError):
                        raise event
                    yield index[id(run)], event
        finally:
            batch.close()


class Batch:
    """The one round loop: runs join between rounds, every live run plays a round per step (each
    member asked once per step for all the runs it serves), and a run leaves the moment it ends,
    fails or is cancelled, its states dropped. Ensemble and the serving scheduler play runs here;
    a run may use a subset of the members (its `names`). A failed member call ends only the runs it
    served: they come out of join() or step() with the error (naming the member); the others go on.
    """

    def __init__(self, members: Sequence[Member], concurrent: bool) -> None:
        self.calls = MemberCalls(members, concurrent, isolate=True)
        self.live: list[_Run] = []

    def join(self, runs: Sequence[_Run]) -> Iterator[tuple[_Run, SpecfuseError]]:
        """Start each run's own members (the prompt's prefill) and set its starting point (resume).
        Runs that could not start are yielded with the reason; the others are live from now on."""
        for run in runs:
            run.began = time.perf_counter()  # a run's clock includes its prefill
        self.calls.start(runs)
        for run in runs:
            error = self.calls.failures.pop(id(run), None)
            if error is None:
                try:
                    run.resume(self.calls)
                except SpecfuseError as e:
                    error = e
                error = error or self.calls.failures.pop(id(run), None)  # a branch's accept
            if error is None:
                self.live.append(run)
            else:
                run.states.clear()
                yield run, error

    def step(self) -> Iterator[tuple[_Run, Draft | Round | SpecfuseError]]:
        """One round of every live run: each Draft as it arrives, then each Round, or the error that
        ended a run. A run cancelled from any thread (run.cancelled) leaves at the next phase."""
        runs = [run for run in self.live if not run.cancelled]
        ended = yield from self._round(runs)
        going_on = {id(run) for run in ended if not run.done}
        for run in self.live:
            if id(run) not in going_on:
                run.states.clear()  # cancelled before the round began
        self.live = [run for run in self.live if id(run) in going_on]

    def close(self) -> None:
        for run in self.live:
            run.states.clear()
        self.live = []
        self.calls.shutdown()

    def _round(
        self, runs: list[_Run]
    ) -> Generator[tuple[_Run, Draft | Round | SpecfuseError], None, list[_Run]]:
        """One round of every run, steps 1-7 in order. The members' steps (draft, verify, accept) are
        asked once per member for all the runs it serves; the others are per run. Yields each
        candidate as it arrives, then the rounds; returns the runs that played the round through."""
        for run in runs:
            run.begin_round()
        drafted: dict[tuple[str, int], tuple[Candidate, float]] = {}
        yield from self._draft(runs, drafted)  # 1
        runs = yield from self._settle(runs)
        for run in runs:
            run.take_candidates(drafted)
        self._verify(runs)  # 2
        runs = yield from self._settle(runs)
        for run in runs:
            run.choose()  # 3
            run.feedback()  # 4
            run.stop()  # 5
            run.exit()  # 6
        accepted = self._accept(runs)  # 7
        runs = yield from self._settle(runs)
        for run in runs:
            rnd = run.record(accepted)
            if run.done:
                run.states.clear()  # a finished run's caches go now, not at the end
            yield run, rnd
        return runs

    def _settle(self, runs: list[_Run]) -> Generator[tuple[_Run, SpecfuseError], None, list[_Run]]:
        """The runs that go on after a member phase: not those a failed member call served (yielded
        with the error), nor those cancelled meanwhile."""
        going_on = []
        for run in runs:
            error = self.calls.failures.pop(id(run), None)
            if error is None and not run.cancelled:
                going_on.append(run)
                continue
            run.states.clear()
            if error is not None:
                yield run, error
        return going_on

    def _draft(
        self, runs: list[_Run], drafted: dict[tuple[str, int], tuple[Candidate, float]]
    ) -> Iterator[tuple[_Run, Draft]]:
        """1. Draft: each active member continues its own context for at most L tokens."""
        by_id = {id(run): run for run in runs}
        work = [(m, run, run.play.budget) for run in runs for m in run.play.drafting]
        for key, out in self.calls.draft(work):
            drafted[key] = out
            run = by_id[key[1]]
            yield run, Draft(run.k, out[0], time.perf_counter() - run.began)

    def _verify(self, runs: list[_Run]) -> None:
        """2. Verify: each verifier scores every candidate in one packed pass (raw z_ij)."""
        work = [
            (m, run, run.play.candidates) for run in runs if run.play.scorable for m in run.play.verifiers
        ]
        verdicts = self.calls.verify(work)
        for run in runs:
            if id(run) not in self.calls.failures:
                run.take_scores(verdicts)

    def _accept(self, runs: list[_Run]) -> dict[tuple[str, int], tuple[None, float]]:
        """7. Accept: every member that plays on appends the winner's text to its own context."""
        return self.calls.accept([(m, run, run.winner_text) for run in runs for m in run.play.accepting])


@dataclass
class _Play:
    """The round being played by one run: made afresh each round, turned into a Round by record()."""

    began: float
    drafting: list[str]  # A_k
    verifiers: list[str]
    budget: int  # tokens each drafter may add this round
    candidates: tuple[Candidate, ...] = ()
    scorable: bool = False  # some candidate has text (or ends the answer)
    agreed: int | None = None  # verify="contested"/"disagree": the draft taken unscored (lone, or agreed on)
    raw: list[list[float]] = field(default_factory=list)  # [verifiers][candidates]: z_ij
    details: tuple[tuple[TokenScores, ...], ...] = ()
    draft_s: dict[str, float] = field(default_factory=dict)
    verify_s: dict[str, float] = field(default_factory=dict)
    scores: list[list[float]] = field(default_factory=list)  # normalized ŝ_ij
    y: list[float] = field(default_factory=list)  # aggregate per candidate
    eligible: list[bool] = field(default_factory=list)
    chosen: int = 0
    margin: float = 0.0
    rewards: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)  # weights after feedback
    stop_reason: str | None = None
    exits: list[ExitEvent] = field(default_factory=list)
    accepting: list[str] = field(default_factory=list)


@dataclass
class _Run:
    """One prompt's run in progress: everything that belongs to one request (never to a member)."""

    prompt: str
    config: EnsembleConfig
    names: tuple[str, ...]
    start: Sequence[Round] = ()
    forced: str | None = None
    origin: str = TYPED
    states: dict[str, Any] = field(default_factory=dict)  # each member's state for this request
    # Set by resume(), then carried from round to round.
    k: int = 0
    weights: list[float] = field(default_factory=list)
    quality: dict[str, float] = field(default_factory=dict)  # Q_i: cumulative aggregate scores
    active: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)
    answer: str = ""
    tokens: int = 0
    began: float = 0.0
    done: bool = False
    cancelled: bool = False  # set from any thread: the run leaves its batch at the next phase
    play: _Play = field(default_factory=lambda: _Play(0.0, [], [], 0))

    def resume(self, calls: MemberCalls) -> None:
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
        calls.accept([(m, self, self.answer) for m in self.names if m in playing])

    def begin_round(self) -> None:
        self.k += 1
        cfg = self.config
        verifiers = [m for m in self.names if m in self.active or (cfg.exited_verify and m in self.exited)]
        budget = min(cfg.segment_len, cfg.max_new_tokens - self.tokens)
        self.play = _Play(time.perf_counter(), list(self.active), verifiers, budget)

    def take_candidates(self, drafted: dict[tuple[str, int], tuple[Candidate, float]]) -> None:
        play = self.play
        candidates = [drafted[(m, id(self))][0] for m in play.drafting]
        play.draft_s = {c.member: c.seconds for c in candidates}
        if self.forced is not None and not any(c.text == self.forced for c in candidates):
            # A typed segment joins the round as one more candidate, scored by every verifier.
            candidates.append(Candidate(self.origin, self.forced, _count_tokens(self.forced), False, 0.0))
        play.candidates = tuple(candidates)
        play.scorable = any(c.text or c.final for c in play.candidates)
        mode = self.config.verify
        if mode != "always" and self.forced is None:
            if len(candidates) == 1:  # a lone draft wins anyway
                play.agreed = 0
            elif mode == "disagree":
                play.agreed = agreement([(c.text, c.final) for c in candidates])
            if play.agreed is not None:
                play.verifiers = []  # nothing to decide: no verify pass

    def take_scores(self, verdicts: dict[tuple[str, int], tuple[Verdict, float]]) -> None:
        play = self.play
        if play.scorable:
            rows = [verdicts[(m, id(self))][0] for m in play.verifiers]
            play.raw = [list(z) for z, _ in rows]
            for m, row in zip(play.verifiers, play.raw):
                _check_finite(m, row, play.candidates)
            play.details = tuple(d for _, d in rows) if all(d for _, d in rows) else ()
            play.verify_s = {m: verdicts[(m, id(self))][1] for m in play.verifiers}
        else:  # every draft came back empty: nothing to choose from
            play.raw = [[0.0] * len(play.candidates) for _ in play.verifiers]

    def choose(self) -> None:
        """3. Choose: normalize each verifier's row, aggregate with the weights learned so far, pick."""
        cfg, play = self.config, self.play
        candidates = play.candidates
        if play.agreed is not None:
            play.y, play.eligible = [0.0] * len(candidates), [True] * len(candidates)
            play.chosen, play.margin = play.agreed, 0.0
            return
        raw = (
            feedback.contrast(play.raw, play.verifiers, [c.member for c in candidates])
            if cfg.contrastive
            else play.raw
        )
        play.scores = feedback.normalize(raw, cfg.normalization)
        y = feedback.aggregate(
            play.scores,
            self._voting(),
            play.verifiers,
            [c.member for c in candidates],
            cfg.self_scores,
            cfg.aggregation,
            cfg.outlier_gap,
        )
        if cfg.repeat_penalty:
            repeated = [repeated_fraction(self.answer, c.text) for c in candidates]
            y = feedback.penalize_repeats(y, repeated, cfg.repeat_penalty)
        play.y = y
        # An empty non-final draft never wins; nor, with the echo guard, a candidate that would
        # leave the answer a verbatim piece of the prompt (unless every candidate would).
        eligible = [bool(c.text or c.final) for c in candidates]
        if cfg.echo_guard:
            fresh = [
                ok and not echoes_prompt(self.prompt, self.answer, c.text)
                for ok, c in zip(eligible, candidates)
            ]
            eligible = fresh if any(fresh) else eligible
        play.eligible = eligible
        pool = [j for j, ok in enumerate(eligible) if ok] or list(range(len(candidates)))
        if self.forced is not None:  # a branch: this round's winner is given
            chosen = next(j for j, c in enumerate(candidates) if c.text == self.forced)
            others = [y[j] for j in range(len(y)) if j != chosen]
            play.chosen, play.margin = chosen, (y[chosen] - max(others)) if others else 0.0
        else:
            play.chosen, play.margin = feedback.choose(y, pool)

    def feedback(self) -> None:
        """4. Feedback *after* the choice, so round k is judged with weights from rounds < k.
        SpecEM: the reference updated the weights before using them in the same round."""
        cfg, play = self.config, self.play
        drafted = len(play.drafting)  # a typed candidate (last) earns no reward
        play.rewards = [0.0] * len(play.candidates)
        play.after = self.weights
        if not cfg.feedback or play.agreed is not None:  # an unscored round carries no evidence
            return
        drafted_scores = [row[:drafted] for row in play.scores]
        judges = self._voting() if cfg.weighted_rewards else None
        play.rewards[:drafted] = feedback.rewards(drafted_scores, play.verifiers, play.drafting, judges)
        if drafted > 1:
            eta = feedback.learning_rate(cfg.learning_rate, len(self.names), self.k)
            play.after = feedback.update_weights(
                self.weights, self.names, play.drafting, play.rewards[:drafted], eta
            )

    def stop(self) -> None:
        """5. Stop: append the winner to the answer and decide whether the run ends here."""
        cfg, play = self.config, self.play
        winner = play.candidates[play.chosen]
        stop_reason: str | None = None
        cut = stop_string_cut(self.answer, winner.text, cfg.stop_strings)
        if cut is not None:
            winner = replace(winner, text=winner.text[:cut], final=True)
            play.candidates = play.candidates[: play.chosen] + (winner,) + play.candidates[play.chosen + 1 :]
            stop_reason = "stop"
        self.answer += winner.text
        self.tokens += winner.num_tokens
        if not play.scorable:
            stop_reason = "empty"
        elif stop_reason is None and winner.final:
            stop_reason = "final"
        elif stop_reason is None and self.tokens >= cfg.max_new_tokens:
            stop_reason = "budget"
        elif stop_reason is None and cfg.max_rounds is not None and self.k >= cfg.max_rounds:
            stop_reason = "rounds"
        play.stop_reason = stop_reason

    def exit(self) -> None:
        """6. Exit: members whose candidates keep losing stop drafting; then who accepts the winner."""
        cfg, play = self.config, self.play
        for j, m in enumerate(play.drafting):
            self.quality[m] += play.y[j]
        play.exits = []
        if play.stop_reason is not None:
            return  # the run ends: nobody exits, nobody needs the winner in its context
        if cfg.exit:
            for d in feedback.exit_decisions(
                self.quality,
                self.active,
                self.k,
                cfg.exit_threshold,
                cfg.exit_warmup,
                cfg.exit_temperature,
                cfg.exit_min_active,
            ):
                play.exits.append(
                    ExitEvent(
                        member=d.member,
                        k=self.k,
                        keep_probability=d.keep_probability,
                        threshold=d.threshold,
                        reason=f"keep-probability {d.keep_probability:.3f} < δ/|A| = {d.threshold:.3f} "
                        f"after {self.k} rounds (cumulative quality {self.quality[d.member]:.3f})",
                    )
                )
        leaving = {e.member for e in play.exits}
        playing = [m for m in self.active if m not in leaving]
        judging = [*self.exited, *leaving] if cfg.exited_verify else []
        play.accepting = [m for m in self.names if m in playing or m in judging]

    def _voting(self) -> list[float]:
        """The verifiers' weights this round (the weights learned in rounds < k)."""
        index = {m: i for i, m in enumerate(self.names)}
        return [self.weights[index[v]] for v in self.play.verifiers]

    @property
    def winner_text(self) -> str:
        return self.play.candidates[self.play.chosen].text

    def record(self, accepted: dict[tuple[str, int], tuple[None, float]]) -> Round:
        """The round as a plain record; then the run moves on (or ends)."""
        play = self.play
        accept_s = {m: accepted[(m, id(self))][1] for m in play.accepting}
        now = time.perf_counter()
        rnd = Round(
            k=self.k,
            members=self.names,
            active=tuple(play.drafting),
            verifiers=tuple(play.verifiers),
            candidates=play.candidates,
            raw_scores=_freeze(play.raw),
            scores=_freeze(play.scores),
            aggregate=tuple(play.y),
            chosen=play.chosen,
            margin=play.margin,
            weights_before=tuple(self.weights),
            weights_after=tuple(play.after),
            rewards=tuple(play.rewards),
            exits=tuple(play.exits),
            timings=tuple(
                MemberTiming(m, play.draft_s.get(m, 0.0), play.verify_s.get(m, 0.0), accept_s.get(m, 0.0))
                for m in self.names
            ),
            seconds=now - play.began,
            elapsed=now - self.began,
            text=self.answer,
            stop_reason=play.stop_reason,
            eligible=tuple(play.eligible),
            token_scores=play.details,
            verified=play.agreed is None,
        )
        self.forced = None  # only the branch round is forced
        self.weights = play.after
        for e in play.exits:
            self.active.remove(e.member)
            self.exited.append(e.member)
        self.done = play.stop_reason is not None
        return rnd


Run = _Run  # what a Batch plays: the serving scheduler makes its own, each with its members' names


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


def _check_finite(member: str, row: Sequence[float], candidates: Sequence[Candidate]) -> None:
    """A verifier whose raw scores hold nan or ±inf (damaged weights, a broken server) ends the
    request with its name: normalizing them would fail with a bare ValueError, or choose at random."""
    bad = [(v, c.member) for v, c in zip(row, candidates) if not math.isfinite(v)]
    if bad:
        value, of = bad[0]
        raise MemberError(
            f"{member}: its scores are not finite ({value}, for the candidate of {of}; {len(bad)} of "
            f"{len(row)}); its weights or its server's answers are damaged (a model file that changed "
            "on disk?), so this request ends"
        )


def _freeze(matrix: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in matrix)
