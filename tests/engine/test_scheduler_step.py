"""Step mode in the scheduler: a run that plays one round per next(), out of the batch and without
member caches in between, gets the rounds it would get free-running, and never slows the others."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import PauseExpired, Scheduler, SchedulerClosed, TooManyPaused
from specfuse.errors import ConfigError, SpecfuseError
from specfuse.records import Draft, Finished, Paused, Round

from ..runs import PROMPTS, collect, rounds_played, same_rounds, solo

# On the tiny members PROMPTS[0] ends in one round, PROMPTS[1] and [2] play on (LONG: 40 rounds).
SHORT = EnsembleConfig(segment_len=5, max_new_tokens=20, exit_warmup=2)
MEDIUM = EnsembleConfig(segment_len=4, max_new_tokens=40)
LONG = EnsembleConfig(segment_len=4, max_new_tokens=200, max_rounds=40)


def step_through(ticket, timeout: float = 120) -> list[list]:
    """next() until the run ends: each step's events, read by a reader of its own (until_pause)."""
    steps = []
    while not ticket.ended:
        ticket.next()
        steps.append(list(ticket.events(timeout, until_pause=True)))
    return steps


def rounds_of(steps) -> list[Round]:
    return [e for step in steps for e in step if isinstance(e, Round)]


CASES = {  # each plays several rounds; members exit in the first two
    "exits, trimmed drafts taken over": (
        PROMPTS[2],
        EnsembleConfig(segment_len=4, max_new_tokens=60, exit_warmup=2),
    ),
    "prompt prior, loop guard": (
        PROMPTS[1],
        EnsembleConfig(segment_len=3, max_new_tokens=24, prior="prompt", loop_guard=True, exit_warmup=2),
    ),
    "exited members verify, median": (
        PROMPTS[1],
        EnsembleConfig(
            segment_len=4, max_new_tokens=60, exited_verify=True, exit_warmup=2, aggregation="median"
        ),
    ),
    "every round verified": (PROMPTS[1], EnsembleConfig(segment_len=4, max_new_tokens=40, verify="always")),
    "a conversation, its messages read again each step": (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello<|eos|>."},
            {"role": "user", "content": PROMPTS[1]},
        ],
        EnsembleConfig(segment_len=4, max_new_tokens=40, exit_warmup=2),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_stepped_run_equals_the_same_run_free_running(tiny_members, case):
    prompt, config = CASES[case]
    names = [m.name for m in tiny_members]
    scheduler = Scheduler(tiny_members, batch_size=4)
    try:
        _, free = collect(scheduler.submit(prompt, config))
        ticket = scheduler.submit(prompt, config, step=True)
        steps = step_through(ticket)
    finally:
        scheduler.close()
    stepped = rounds_of(steps)
    assert ticket.state == "done" and len(steps) == len(stepped) > 2
    same_rounds(free, stepped)
    same_rounds(solo(tiny_members, names, prompt, config), stepped)
    for a, b in zip(free, stepped):  # fp32 greedy: the winners and the learned weights are the same
        assert (a.winner.member, a.winner.text, a.active, a.verifiers) == (
            b.winner.member,
            b.winner.text,
            b.active,
            b.verifiers,
        )
        assert a.weights_before == pytest.approx(b.weights_before, abs=1e-6)
        assert a.weights_after == pytest.approx(b.weights_after, abs=1e-6)
    # Each step starts its members afresh: no draft was taken over from a state kept across a pause
    # (free-running, a won-but-trimmed greedy draft's tokens are; stepped, they are decoded again).
    assert all(c.reused_tokens == 0 for r in stepped for c in r.candidates)


def test_a_stepped_branch_equals_the_branch_alone(tiny_members):
    config = EnsembleConfig(segment_len=5, max_new_tokens=25)
    names = [m.name for m in tiny_members]
    original = solo(tiny_members, names, PROMPTS[2], config)
    start, forced = original[:2], original[2].candidates[-1].text + " typed"
    want = solo(tiny_members, names, PROMPTS[2], config, start=start, forced=forced)
    scheduler = Scheduler(tiny_members)
    try:
        ticket = scheduler.submit(PROMPTS[2], config, start=start, forced=forced, step=True)
        steps = step_through(ticket)
    finally:
        scheduler.close()
    same_rounds(want, rounds_of(steps))
    assert rounds_of(steps)[0].winner.text == forced and steps[0][-1] == Paused(3)


def test_next_plays_exactly_one_round_and_between_steps_the_run_holds_nothing(tiny_members):
    scheduler = Scheduler(tiny_members, batch_size=4)
    try:
        ticket = scheduler.submit(PROMPTS[1], LONG, step=True)
        assert ticket.paused and ticket.state == "paused" and ticket.position() is None
        assert ticket.run.states == {} and scheduler.stats()["running"] == 0
        step_s = []
        for k in (1, 2, 3):
            began = time.perf_counter()
            ticket.next()
            ticket.next()  # already in line: a no-op, not a second round
            events = list(ticket.events(timeout=60, until_pause=True))
            step_s.append(time.perf_counter() - began)
            drafts = [e for e in events if isinstance(e, Draft)]
            assert events == [*drafts, events[-2], Paused(k)] and isinstance(events[-2], Round)
            assert events[-2].k == k and {d.k for d in drafts} == {k}
            assert sorted(d.candidate.text for d in drafts) == sorted(
                c.text for c in events[-2].candidates if c.member in events[-2].active
            )
            # Paused: out of the batch, its member states gone, only its rounds kept.
            assert ticket.paused and not ticket.ended and len(ticket.rounds) == k
            assert ticket.run.states == {} and scheduler._batch.live == ()
            assert scheduler.stats() | {"batch_size": 0, "queue": 0} == {
                "running": 0, "waiting": 0, "reading": 0, "paused": 1, "batch_size": 0, "queue": 0,
                "max_paused": 16,
            }  # fmt: skip
            time.sleep(0.3)
        rounds = ticket.rounds
        # Its clock stops while it waits: a round's elapsed time grows by its own step's time at
        # most (its prefill and round), never by the pause before it.
        assert all(0 < b.elapsed - a.elapsed <= s for a, b, s in zip(rounds, rounds[1:], step_s[1:]))
        assert len({r.text for r in rounds}) == 3 and ticket.id == ticket.trace().id == ticket.run.id
    finally:
        scheduler.close()


def test_free_running_requests_play_on_while_another_is_paused(tiny_members, monkeypatch):
    scheduler = Scheduler(tiny_members, batch_size=4)
    played = rounds_played(scheduler, monkeypatch)
    try:
        stepped = scheduler.submit(PROMPTS[1], LONG, step=True)
        free = scheduler.submit(PROMPTS[2], MEDIUM)
        stepped.next()
        assert list(stepped.events(timeout=60, until_pause=True))[-1] == Paused(1)
        paused_at = len(played)
        _, rounds = collect(free)  # all of its rounds while the other waits
        assert stepped.paused and len(stepped.rounds) == 1
        during = played[paused_at:]
        assert len(during) >= 3 and all(free.id in runs and stepped.id not in runs for runs in during)
        stepped.next()  # and it steps on beside newcomers
        late = scheduler.submit(PROMPTS[0], SHORT)
        assert list(stepped.events(timeout=60, until_pause=True))[-1] == Paused(2)
        _, late_rounds = collect(late)
    finally:
        scheduler.close()
    names = [m.name for m in tiny_members]
    same_rounds(solo(tiny_members, names, PROMPTS[2], MEDIUM), rounds)
    same_rounds(solo(tiny_members, names, PROMPTS[0], SHORT), late_rounds)


def test_paused_runs_are_bounded_and_a_step_never_counts_twice(tiny_members):
    scheduler = Scheduler(tiny_members, max_paused=2)
    try:
        first = scheduler.submit(PROMPTS[1], LONG, step=True)
        second = scheduler.submit(PROMPTS[2], LONG, step=True)
        message = re.escape("2 runs are already paused on this server (the limit is 2); finish or stop one")
        with pytest.raises(TooManyPaused, match=message):
            scheduler.submit(PROMPTS[2], LONG, step=True)
        first.next()  # playing its step, it still holds its place among the paused
        with pytest.raises(TooManyPaused, match=message):
            scheduler.submit(PROMPTS[2], LONG, step=True)
        assert list(first.events(timeout=60, until_pause=True))[-1] == Paused(1)
        free = scheduler.submit(PROMPTS[2], SHORT)  # free-running requests are not bounded by it
        assert scheduler.stats()["paused"] == 2 and scheduler.stats()["max_paused"] == 2
        second.cancel()  # a paused run ends at once and frees its place
        assert second.state == "cancelled" and list(second.events(timeout=5)) == [Finished("cancelled")]
        with pytest.raises(SpecfuseError, match=r"the run has ended \(cancelled\)"):
            second.next()
        third = scheduler.submit(PROMPTS[2], LONG, step=True)
        assert third.paused and scheduler.stats()["paused"] == 2
        collect(free)
    finally:
        scheduler.close()
    with pytest.raises(TooManyPaused, match="step mode is off"):
        Scheduler(tiny_members, max_paused=0).submit(PROMPTS[0], step=True)
    with pytest.raises(ConfigError, match="pause_idle_s must be > 0, got 0"):
        Scheduler(tiny_members, pause_idle_s=0)


def test_a_paused_run_left_without_a_step_expires(tiny_members):
    scheduler = Scheduler(tiny_members, max_paused=2, pause_idle_s=0.3)
    try:
        never = scheduler.submit(PROMPTS[2], LONG, step=True)  # paused before round 1
        once = scheduler.submit(PROMPTS[1], LONG, step=True)
        once.next()
        assert list(once.events(timeout=60, until_pause=True))[-1] == Paused(1)
        # Nothing else happens: the loop's timed wait, not a request, wakes it for the expiry.
        assert never.wait(5) and once.wait(5)
        for ticket in (never, once):
            assert ticket.state == "failed" and isinstance(ticket.error, PauseExpired)
            with pytest.raises(
                PauseExpired, match=r"the paused run ended: no step for 0\.3 s \(the server's idle"
            ):
                list(ticket.events(timeout=5))
            with pytest.raises(SpecfuseError, match="the run has ended"):
                ticket.next()
        assert scheduler.stats()["paused"] == 0
        again = scheduler.submit(PROMPTS[1], SHORT, step=True)  # their places are free again
        again.next()
        assert list(again.events(timeout=60, until_pause=True))[-1] == Paused(1)
    finally:
        scheduler.close()


def test_close_ends_paused_runs_like_the_others(tiny_members):
    scheduler = Scheduler(tiny_members)
    paused = scheduler.submit(PROMPTS[2], LONG, step=True)
    paused.next()
    assert list(paused.events(timeout=60, until_pause=True))[-1] == Paused(1)
    untouched = scheduler.submit(PROMPTS[1], LONG, step=True)
    scheduler.close()
    for ticket in (paused, untouched):
        assert ticket.wait(5) and ticket.state == "failed" and isinstance(ticket.error, SchedulerClosed)
        with pytest.raises(SchedulerClosed):
            list(ticket.events(timeout=5))
    with pytest.raises(SchedulerClosed):
        scheduler.submit(PROMPTS[0], step=True)


def test_readers_until_the_pause_read_one_stream_step_by_step_without_cancelling(tiny_members):
    scheduler = Scheduler(tiny_members)

    async def one_step(ticket) -> list:
        ticket.next()
        return [event async for event in ticket.aevents(until_pause=True)]

    try:
        ticket = scheduler.submit(PROMPTS[1], LONG, step=True)
        first = asyncio.run(one_step(ticket))  # one handler, then another, each on a loop of its own
        second = asyncio.run(one_step(ticket))
        assert (first[-1], second[-1]) == (Paused(1), Paused(2)) and ticket.paused
        assert [e.k for e in second if isinstance(e, Round)] == [2]
        # A reader that stops at the Paused it was given (closing there) does not cancel either.
        ticket.next()
        for event in ticket.events(timeout=60, until_pause=True):
            if isinstance(event, Paused):
                break
        assert ticket.paused and len(ticket.rounds) == 3
        # Without until_pause, closing early still cancels, as it always did.
        events = ticket.events(timeout=60)
        ticket.next()
        assert isinstance(next(events), Draft)
        events.close()
        assert ticket.wait(30) and ticket.state == "cancelled"
    finally:
        scheduler.close()
