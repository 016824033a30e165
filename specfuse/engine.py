"""The round loop, yielding one Round per cycle. One round is seven steps, in this order:

1. draft     each active member continues its own context for at most L tokens
2. verify    each verifier scores every candidate in one packed pass (raw z_ij)
3. choose    normalize each verifier's row, aggregate with the weights so far, pick the winner
4. feedback  reward the drafters and update the weights (after the choice)
5. stop      append the winner to the answer; decide whether the run ends
6. exit      members whose candidates keep losing stop drafting
7. accept    every member that plays on appends the winner to its own context

Batch._round calls them in that order, by these names: the members' steps here, each run's own in
run.py. (With the loop guard, exited members that come back for a round first catch up: an accept of
what they missed, before the draft.) Knows nothing about tokenizers, tensors or devices: members
hide them behind the Member protocol (members/protocol.py), and the arithmetic lives in feedback.py.
Several prompts can run in lockstep (stream_many, and the serving scheduler through Batch): each
member step then asks a member once for all the prompts it serves, which a member may batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator, Sequence

from .config import PARALLEL_MODES, EnsembleConfig
from .errors import ConfigError, SpecfuseError
from .limits import check_prompt as check_prompt
from .limits import check_request
from .members.protocol import Member
from .members.workers import MemberCalls, run_concurrently
from .records import Candidate, Draft, Result, Round, summarize
from .run import TYPED, Run

log = logging.getLogger(__name__)


class Ensemble:
    """Several members answering prompts together (SpecEM). Members are shared, runs are not."""

    def __init__(
        self, members: Sequence[Member], config: EnsembleConfig | None = None, *, parallel: str = "auto"
    ) -> None:
        """`parallel`: whether the members work at the same time (config.PARALLEL_MODES); a property
        of where they run, so it is the ensemble's, not a run's."""
        if parallel not in PARALLEL_MODES:
            raise ConfigError(f"parallel must be one of {', '.join(PARALLEL_MODES)}, got {parallel!r}")
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
        for name in names:  # a name is a key, a label and a trace field (workers.without_prompt)
            if not name.strip() or not name.isprintable():
                raise ConfigError(f"member name {name!r}: it must be printable text, not blank")
        self.members: tuple[Member, ...] = tuple(members)
        self.config = config or EnsembleConfig()
        self.parallel = parallel

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
        run = Run(prompt, config or self.config, self.names, start, forced, origin)
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
        runs = [Run(p, c, self.names) for p, c in zip(prompts, configs)]
        for i, event in self._lockstep(runs, batch_size or max(1, len(runs))):
            if isinstance(event, Round):
                yield i, event

    def run(self, prompt: str, config: EnsembleConfig | None = None) -> Result:
        """The whole answer and its totals, for scripts: a consumer of stream()."""
        return summarize(list(self.stream(prompt, config)))

    # -- the loop ------------------------------------------------------------------------------------

    def _lockstep(self, runs: list[Run], batch_size: int = 1) -> Iterator[tuple[int, Draft | Round]]:
        for run in runs:  # limits.py: every bound that needs no model, before any model work
            check_request(run.prompt, run.config, run.start, run.forced, run.names)
        batch = Batch(self.members, run_concurrently(self.members, self.parallel))
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
        self.live: list[Run] = []

    def join(self, runs: Sequence[Run]) -> Iterator[tuple[Run, SpecfuseError]]:
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

    def step(self) -> Iterator[tuple[Run, Draft | Round | SpecfuseError]]:
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
        self, runs: list[Run]
    ) -> Generator[tuple[Run, Draft | Round | SpecfuseError], None, list[Run]]:
        """One round of every run, steps 1-7 in order. The members' steps (draft, verify, accept) are
        asked once per member for all the runs it serves; the others are per run. Yields each
        candidate as it arrives, then the rounds; returns the runs that played the round through."""
        for run in runs:
            run.begin_round()
        drafted: dict[tuple[str, int], tuple[Candidate, float]] = {}
        self._catch_up(runs)  # exited members drafting again first read the answer they missed
        runs = yield from self._settle(runs)
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

    def _settle(self, runs: list[Run]) -> Generator[tuple[Run, SpecfuseError], None, list[Run]]:
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
        self, runs: list[Run], drafted: dict[tuple[str, int], tuple[Candidate, float]]
    ) -> Iterator[tuple[Run, Draft]]:
        """1. Draft: each active member continues its own context for at most L tokens."""
        by_id = {id(run): run for run in runs}
        work = [(m, run, run.play.budget) for run in runs for m in run.play.drafting]
        for key, out in self.calls.draft(work):
            drafted[key] = out
            run = by_id[key[1]]
            yield run, Draft(run.k, out[0], time.perf_counter() - run.began)

    def _catch_up(self, runs: list[Run]) -> None:
        """Before drafting: members back from an exit append what was accepted while they were out."""
        work = [
            (m, run, run.answer[run.read[m] :])
            for run in runs
            for m in run.play.rejoining
            if run.read[m] < len(run.answer)
        ]
        if work:
            self.calls.accept(work)
        for run in runs:
            run.read.update(dict.fromkeys(run.play.rejoining, len(run.answer)))

    def _verify(self, runs: list[Run]) -> None:
        """2. Verify: each verifier scores every candidate in one packed pass (raw z_ij)."""
        work = [
            (m, run, run.play.candidates) for run in runs if run.play.scorable for m in run.play.verifiers
        ]
        verdicts = self.calls.verify(work)
        for run in runs:
            if id(run) not in self.calls.failures:
                run.take_scores(verdicts)

    def _accept(self, runs: list[Run]) -> dict[tuple[str, int], tuple[None, float]]:
        """7. Accept: every member that plays on appends the winner's text to its own context."""
        return self.calls.accept([(m, run, run.winner_text) for run in runs for m in run.play.accepting])


def _per_prompt(config: EnsembleConfig | Sequence[EnsembleConfig], n: int) -> list[EnsembleConfig]:
    if isinstance(config, EnsembleConfig):
        return [config] * n
    configs = list(config)
    if len(configs) != n:
        raise ConfigError(f"{n} prompts but {len(configs)} configs; give one config or one per prompt")
    return configs
