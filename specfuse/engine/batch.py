"""The round loop. One round is seven steps, in this order:

1. draft     each active member continues its own context for at most L tokens
2. verify    each verifier scores every candidate in one packed pass (raw z_ij)
3. choose    normalize each verifier's row, aggregate with the weights so far, pick the winner
4. feedback  reward the drafters and update the weights (after the choice)
5. stop      append the winner to the answer; decide whether the run ends
6. exit      members whose candidates keep losing stop drafting
7. accept    every member that plays on appends the winner to its own context

Batch._round calls them in that order, by these names: the members' steps here, each run's own in
run.py. A member reads the answer only when it is asked: one that missed part of it (back from an
exit under the loop guard, or not asked in gated rounds) first catches up, an accept of what it
missed in one call, before it drafts or verifies. Knows nothing about tokenizers, tensors or
devices: members hide them behind the Member protocol (members/protocol.py), and the arithmetic
lives in feedback.py.
Several runs play in lockstep (Ensemble.stream_many, and the Scheduler): each member step then asks
a member once for all the runs it serves, which a member may batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence

from ..errors import SpecfuseError
from ..members import profiling
from ..members.protocol import Member
from ..records import Candidate, Draft, Round
from .calls import MemberCalls
from .parts import PartSizer
from .run import Run

Event = Draft | Round


class Batch:
    """The one round loop: runs join between rounds, every live run plays a round per step (each
    member asked once per step for all the runs it serves), and a run leaves the moment it ends,
    fails or is cancelled, its states dropped. Ensemble and the Scheduler play runs here, through
    admit(), read() (chunked prefill), step() and close() only; a run may use a subset of the
    members (its `names`). A failed member call ends only the runs it served: they come out of
    admit(), read() or step() with the error
    (naming the member); the others go on.
    """

    def __init__(self, members: Sequence[Member], concurrent: bool, prefill_chunk: int = 0) -> None:
        """`prefill_chunk`: 0, a newcomer's prompt is read whole before it joins (the round waits for
        it); else each member reads at most this many tokens of the newcomers' prompts per read()
        (chunked prefill), between the live runs' rounds, each part sized to take part of a round
        (parts.PartSizer), and a run joins once it is read whole."""
        self._calls = MemberCalls(members, concurrent, isolate=True)
        self._live: list[Run] = []
        self.parts = PartSizer(prefill_chunk) if prefill_chunk else None  # None: read whole
        self._reading: list[Run] = []  # opened, their prompts being read, in the order they came
        self._unread: dict[str, set[str]] = {}  # run id → its members still reading its prompt

    @property
    def live(self) -> tuple[Run, ...]:
        """The runs under way, in the order they joined."""
        return tuple(self._live)

    @property
    def reading(self) -> tuple[Run, ...]:
        """The runs taken in whose prompts are still being read (chunked prefill), not yet live."""
        return tuple(self._reading)

    @property
    def members(self) -> tuple[Member, ...]:
        return tuple(self._calls.members.values())

    def use(self, members: Sequence[Member], concurrent: bool) -> None:
        """Between rounds: play with these members from now on (the Scheduler's add_members)."""
        self._calls.shutdown()
        self._calls = MemberCalls(members, concurrent, isolate=True)

    def admit(
        self, take: Callable[[int], Sequence[Run]], capacity: int
    ) -> Iterator[tuple[Run, SpecfuseError]]:
        """Fill the batch up to `capacity` live runs between rounds: `take(room)` hands over at most
        `room` waiting runs (none: nobody is waiting), which join together, their prompts read in one
        call per member; asked again while there is room, so that runs arriving while the last ones
        were read join this round too. Runs that could not start are yielded with the reason. With
        chunked prefill the runs are only opened here (their prompts checked against every member's
        context before any member reads them) and count against `capacity` while read() reads them."""
        while (room := capacity - len(self._live) - len(self._reading)) > 0 and (runs := take(room)):
            yield from (self._open(runs) if self.parts else self._join(runs))

    def read(self) -> Iterator[tuple[Run, SpecfuseError]]:
        """Chunked prefill, between rounds: each member reads its next part of the opened runs'
        prompts (the first come first; parts.PartSizer says how many tokens); a run read whole by
        all its members joins the live runs. Runs that failed (or were cancelled meanwhile) leave;
        the failed are yielded."""
        runs = [run for run in self._reading if not run.cancelled]
        for run in self._reading:
            if run.cancelled:
                run.states.clear()
                self._unread.pop(run.id, None)
        # Streaming: a live run has played a round and its client waits for the next. Runs that only
        # just joined wait for their first round with these (a burst starts in one round, as before).
        streaming = any(run.k for run in self._live)
        tokens = self.parts.size(streaming) if self.parts else 0
        work = [(m, run, tokens) for run in runs for m in run.names if m in self._unread[run.id]]
        began = time.perf_counter()
        with profiling.timed("phase", "prefill", items=len(runs)):
            done = self._calls.prefill(work) if work else {}
        if work and self.parts:
            self.parts.part_took(tokens, time.perf_counter() - began)
        self._reading, ready = [], []
        for run in runs:
            unread = self._unread[run.id]
            unread -= {m for m in unread if done.get((m, run.id), (False, 0.0))[0]}
            error = self._calls.failures.pop(run.id, None)
            if error is not None:
                run.states.clear()
                del self._unread[run.id]
                yield run, error
            elif unread:
                self._reading.append(run)
            else:
                del self._unread[run.id]
                ready.append(run)
        yield from self._ready(ready)

    def step(self) -> Iterator[tuple[Run, Event | SpecfuseError]]:
        """One round of every live run: each Draft as it arrives, then each Round, or the error that
        ended a run. A run cancelled from any thread (run.cancelled) leaves at the next phase; a run
        in step mode (run.pause) leaves after its round, as a finished one does."""
        runs = [run for run in self._live if not run.cancelled]
        began = time.perf_counter()
        ended = yield from self._round(runs)
        if runs and self.parts:
            self.parts.round_took(time.perf_counter() - began)
        going_on = {run.id for run in ended if not run.done and not run.pause}
        for run in self._live:
            if run.id not in going_on:
                run.states.clear()  # cancelled before the round began
        self._live = [run for run in self._live if run.id in going_on]

    def drop(self) -> list[Run]:
        """End every live run at once (their states go): the runs dropped."""
        dropped, self._live = [*self._live, *self._reading], []
        self._reading, self._unread = [], {}
        for run in dropped:
            run.states.clear()
        return dropped

    def close(self) -> None:
        self.drop()
        self._calls.shutdown()

    # -- one round -----------------------------------------------------------------------------------

    def _join(self, runs: Sequence[Run]) -> Iterator[tuple[Run, SpecfuseError]]:
        """Start each run's own members (the prompt's prefill) and set its starting point (resume)."""
        for run in runs:
            run.began = time.perf_counter() - run.played_s  # a run's clock includes its prefill
        with profiling.timed("phase", "start", items=len(runs)):
            self._calls.start(runs)
        yield from self._ready(runs)

    def _open(self, runs: Sequence[Run]) -> Iterator[tuple[Run, SpecfuseError]]:
        """Chunked prefill: open each run's own members (its prompt's tokens counted and checked by
        every member before any reads it); read() reads the prompts, a part per round."""
        for run in runs:
            run.began = time.perf_counter() - run.played_s
        with profiling.timed("phase", "open", items=len(runs)):
            self._calls.start(runs, read=False)
        for run in runs:
            error = self._calls.failures.pop(run.id, None)
            if error is None:
                self._reading.append(run)
                self._unread[run.id] = set(run.names)
            else:
                run.states.clear()
                yield run, error

    def _ready(self, runs: Sequence[Run]) -> Iterator[tuple[Run, SpecfuseError]]:
        """Runs whose prompts are read: each set at its starting point (resume), then live."""
        for run in runs:
            error = self._calls.failures.pop(run.id, None)
            if error is None:
                try:
                    run.resume(self._calls)
                except SpecfuseError as e:
                    error = e
                error = error or self._calls.failures.pop(run.id, None)  # a branch's accept
            if error is None:
                self._live.append(run)
            else:
                run.states.clear()
                yield run, error

    def _round(self, runs: list[Run]) -> Generator[tuple[Run, Event | SpecfuseError], None, list[Run]]:
        """One round of every run, steps 1-7 in order. The members' steps (draft, verify, accept) are
        asked once per member for all the runs it serves; the others are per run. Yields each
        candidate as it arrives, then the rounds; returns the runs that played the round through."""
        for run in runs:
            run.begin_round()
        drafted: dict[tuple[str, str], tuple[Candidate, float]] = {}
        first = {run.id: run.drafting_now() for run in runs}
        runs = yield from self._catch_up(runs, first)
        with profiling.timed("phase", "draft", items=len(runs)):
            yield from self._draft(runs, drafted, first)  # 1
        runs = yield from self._settle(runs)
        # Under the gate, a run whose gatekeeper was unsure drafts with the others now: one more draft
        # phase, shared by every such run (gated and full rounds of other runs went in the first).
        others = {run.id: run.take_gate(drafted) for run in runs}
        if any(others.values()):
            runs = yield from self._catch_up(runs, others)
            with profiling.timed("phase", "draft", items=sum(map(bool, others.values()))):
                yield from self._draft(runs, drafted, others)
            runs = yield from self._settle(runs)
        for run in runs:
            run.take_candidates(drafted)
        runs = yield from self._catch_up(
            runs, {run.id: run.play.verifiers for run in runs if run.play.scorable}
        )
        with profiling.timed("phase", "verify", items=len(runs)):
            self._verify(runs)  # 2
        runs = yield from self._settle(runs)
        with profiling.timed("phase", "choose", items=len(runs)):
            for run in runs:
                run.choose()  # 3
                run.feedback()  # 4
                run.stop()  # 5
                run.exit()  # 6
        with profiling.timed("phase", "accept", items=len(runs)):
            accepted = self._accept(runs)  # 7
        runs = yield from self._settle(runs)
        for run in runs:
            rnd = run.record(accepted)
            if run.done or run.pause:
                run.states.clear()  # a finished (or pausing) run's caches go now, not at the end
            yield run, rnd
        return runs

    def _settle(self, runs: list[Run]) -> Generator[tuple[Run, SpecfuseError], None, list[Run]]:
        """The runs that go on after a member phase: not those a failed member call served (yielded
        with the error), nor those cancelled meanwhile."""
        going_on = []
        for run in runs:
            error = self._calls.failures.pop(run.id, None)
            if error is None and not run.cancelled:
                going_on.append(run)
                continue
            run.states.clear()
            if error is not None:
                yield run, error
        return going_on

    def _draft(
        self,
        runs: list[Run],
        drafted: dict[tuple[str, str], tuple[Candidate, float]],
        who: dict[str, list[str]],
    ) -> Iterator[tuple[Run, Draft]]:
        """1. Draft: each active member continues its own context for at most L tokens (`who`: the
        members drafting now, per run id: under the gate, the gatekeeper before the others)."""
        by_id = {run.id: run for run in runs}
        work = [(m, run, run.play.budget) for run in runs for m in who.get(run.id, ())]
        for key, out in self._calls.draft(work):
            drafted[key] = out
            run = by_id[key[1]]
            yield run, Draft(run.k, out[0], time.perf_counter() - run.began)

    def _catch_up(
        self, runs: list[Run], who: Mapping[str, Sequence[str]]
    ) -> Generator[tuple[Run, SpecfuseError], None, list[Run]]:
        """Before the members in `who` (per run id) draft or verify: each that has not read the whole
        answer appends what it missed in one accept (back from an exit, or not asked in gated rounds,
        whose sure segments it reads only now: a run that stays gated never pays for its reading)."""
        work = [
            (m, run, run.answer[run.read[m] :])
            for run in runs
            for m in who.get(run.id, ())
            if run.read[m] < len(run.answer)
        ]
        if not work:
            return runs
        with profiling.timed("phase", "catch up", items=len({run.id for _, run, _ in work})):
            caught = self._calls.accept(work)
        for m, run, _ in work:
            if (m, run.id) in caught:
                run.read[m] = len(run.answer)
                run.play.catch_up_s[m] = caught[(m, run.id)][1]
        return (yield from self._settle(runs))

    def _verify(self, runs: list[Run]) -> None:
        """2. Verify: each verifier scores every candidate in one packed pass (raw z_ij)."""
        work = [
            (m, run, run.play.candidates) for run in runs if run.play.scorable for m in run.play.verifiers
        ]
        verdicts = self._calls.verify(work)
        for run in runs:
            if run.id not in self._calls.failures:
                run.take_scores(verdicts)

    def _accept(self, runs: list[Run]) -> dict[tuple[str, str], tuple[None, float]]:
        """7. Accept: every member that plays on appends the winner's text to its own context (with
        anything of the answer it had not read before)."""
        return self._calls.accept(
            [(m, run, run.answer[run.read[m] :]) for run in runs for m in run.play.accepting]
        )
