"""The serving scheduler: requests that come and go at any time, from any thread, with their own
configs and members, each get exactly the rounds an Ensemble of their members gives them alone."""

from __future__ import annotations

import time

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import QueueFull, Scheduler, SchedulerClosed
from specfuse.engine import scheduler as scheduling
from specfuse.errors import ConfigError, MemberError
from specfuse.records import Draft, Finished, Queued, Round

from ..runs import PROMPTS, collect, collected_apart, rounds_played, same_rounds, solo
from ..scripted import ScriptedMember

SHORT = EnsembleConfig(segment_len=5, max_new_tokens=20, exit_warmup=2)
LONG = EnsembleConfig(segment_len=4, max_new_tokens=200, max_rounds=40)


def test_concurrent_requests_with_their_own_configs_and_members_equal_their_solo_runs(tiny_members):
    names = [m.name for m in tiny_members]
    jobs = [
        (PROMPTS[0], SHORT, None),
        (PROMPTS[1], EnsembleConfig(segment_len=3, max_new_tokens=18, aggregation="median"), names[:2]),
        (PROMPTS[2], EnsembleConfig(segment_len=6, max_new_tokens=24, prior="uniform"), [names[2], names[0]]),
        (PROMPTS[0], EnsembleConfig(segment_len=4, max_new_tokens=16, feedback=False), names[1:]),
        (PROMPTS[1], SHORT, [names[1]]),  # one member: its plain greedy decode
    ]
    expected = [solo(tiny_members, list(m or names), p, c) for p, c, m in jobs]
    got = collected_apart(Scheduler(tiny_members, batch_size=4), jobs, gap=0.15)
    for i, want in enumerate(expected):
        drafts, rounds = got[i]
        same_rounds(want, rounds)
        assert rounds[-1].stop_reason is not None
        assert rounds[0].members == tuple(jobs[i][2] or names)
        # every candidate of a round arrived as a Draft first, in that round
        for r in rounds:
            assert sorted(d.candidate.text for d in drafts if d.k == r.k) == sorted(
                c.text for c in r.candidates if c.member in r.active
            )


def test_a_branch_through_the_scheduler_equals_the_branch_alone(tiny_members):
    config = EnsembleConfig(segment_len=5, max_new_tokens=25)
    original = solo(tiny_members, [m.name for m in tiny_members], PROMPTS[2], config)
    start, forced = original[:2], original[2].candidates[-1].text + " typed"
    want = solo(tiny_members, [m.name for m in tiny_members], PROMPTS[2], config, start=start, forced=forced)
    scheduler = Scheduler(tiny_members)
    try:
        _, rounds = collect(scheduler.submit(PROMPTS[2], config, start=start, forced=forced))
    finally:
        scheduler.close()
    same_rounds(want, rounds)


@pytest.mark.parametrize("wait", [0.0, 5.0])
def test_a_request_sent_as_another_ends_joins_the_next_round(tiny_members, monkeypatch, wait):
    # A client that sends its next request when its last one ends (a script, lm-eval) lands just
    # after the next round began; the scheduler waits for it (at most join_wait, here long enough).
    monkeypatch.setattr(scheduling, "JOIN_WAIT_SHARE", 1e6)  # the tiny models' rounds take ms
    scheduler = Scheduler(tiny_members, batch_size=4, join_wait=wait)
    played = rounds_played(scheduler, monkeypatch)
    one_round = EnsembleConfig(segment_len=4, max_new_tokens=4)
    try:
        going_on = scheduler.submit(PROMPTS[1], LONG)
        ending = scheduler.submit(PROMPTS[0], one_round)
        collect(ending)
        time.sleep(0.3)  # the client's round trip: many rounds of the tiny models
        after = scheduler.submit(PROMPTS[2], SHORT)
        _, rounds = collect(after)
    finally:
        going_on.cancel()
        scheduler.close()
    ended = max(i for i, runs in enumerate(played) if ending.id in runs)
    joined = min(i for i, runs in enumerate(played) if after.id in runs)
    if wait:
        assert joined == ended + 1 and going_on.id in played[joined]
    else:
        assert joined > ended + 3 and going_on.id in played[joined - 1]  # it waited out rounds
    same_rounds(solo(tiny_members, [m.name for m in tiny_members], PROMPTS[2], SHORT), rounds)


def test_requests_that_arrive_while_newcomers_are_read_join_their_first_round(tiny_members, monkeypatch):
    scheduler = Scheduler(tiny_members, batch_size=4)
    played = rounds_played(scheduler, monkeypatch)
    member, late = tiny_members[0], []
    real = member.prefill_many

    def prefill_many(states, budget):  # two more arrive while the first prompt is read
        if not late:
            late.extend(scheduler.submit(p, SHORT) for p in PROMPTS[1:3])
        return real(states, budget)

    monkeypatch.setattr(member, "prefill_many", prefill_many)
    try:
        first = scheduler.submit(PROMPTS[0], SHORT)
        results = [collect(ticket)[1] for ticket in (first, *late)]
    finally:
        scheduler.close()
    assert played[0] == {ticket.id for ticket in (first, *late)}
    names = [m.name for m in tiny_members]
    for prompt, rounds in zip(PROMPTS, results):
        same_rounds(solo(tiny_members, names, prompt, SHORT), rounds)


def test_waiting_requests_know_their_place_and_a_full_line_refuses(tiny_members):
    scheduler = Scheduler(tiny_members, batch_size=1, queue=2)
    try:
        first = scheduler.submit(PROMPTS[0], LONG)
        deadline = time.monotonic() + 30
        while first.position() != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        second, third = scheduler.submit(PROMPTS[1], SHORT), scheduler.submit(PROMPTS[2], SHORT)
        assert (first.position(), second.position(), third.position()) == (0, 1, 2)
        with pytest.raises(QueueFull, match="2 requests are already waiting"):
            scheduler.submit(PROMPTS[0], SHORT)
        second.cancel()  # leaves the line: the one behind moves up
        assert second.state == "cancelled" and second.position() is None and third.position() == 1
        assert list(second.events(timeout=5)) == [Queued(1), Finished("cancelled")]
        first.cancel()  # leaves the batch; the next in line joins
        assert first.wait(30) and first.state == "cancelled"
        events = list(third.events(timeout=120))  # told its place each time it changed, then played
        assert [e.place for e in events if isinstance(e, Queued)] == [2, 1]
        assert events[-1] == Finished("done") and isinstance(events[2], Draft)
        rounds = [e for e in events if isinstance(e, Round)]
        assert third.state == "done" and third.position() is None
        same_rounds(solo(tiny_members, [m.name for m in tiny_members], PROMPTS[2], SHORT), rounds)
    finally:
        scheduler.close()
    with pytest.raises(SchedulerClosed):
        scheduler.submit(PROMPTS[0], SHORT)


def test_a_cancelled_request_leaves_at_once_and_drops_its_states_while_others_go_on(tiny_members):
    scheduler = Scheduler(tiny_members, batch_size=4)
    try:
        stays = scheduler.submit(PROMPTS[0], SHORT)
        leaves = scheduler.submit(PROMPTS[1], LONG)
        events = leaves.events(timeout=60)
        first = next(events)
        assert isinstance(first, Draft)
        events.close()  # the consumer goes away: that cancels it
        assert leaves.wait(30) and leaves.state == "cancelled"
        assert leaves.run.states == {}  # its caches are gone
        assert len(leaves.rounds) <= 2  # left within a round, not at the end of its 40
        _, rounds = collect(stays)
    finally:
        scheduler.close()
    same_rounds(solo(tiny_members, [m.name for m in tiny_members], PROMPTS[0], SHORT), rounds)


class Broken(ScriptedMember):
    """Drafts once, then fails: a member whose server or process went away mid-run."""

    def draft(self, state, max_new_tokens):
        if state["round"] >= 1:
            raise RuntimeError("connection reset")
        return super().draft(state, max_new_tokens)


def test_a_failed_member_ends_only_the_requests_that_use_it(tiny_members):
    broken = Broken("broken", ["one two ", "three "], judge=len)
    names = [m.name for m in tiny_members]
    scheduler = Scheduler([*tiny_members, broken], batch_size=4)
    try:
        doomed = scheduler.submit(PROMPTS[0], SHORT, members=[names[0], "broken"])
        fine = scheduler.submit(PROMPTS[1], SHORT, members=names[:2])
        with pytest.raises(MemberError, match="broken: draft failed: RuntimeError: connection reset"):
            collect(doomed)
        assert doomed.state == "failed" and doomed.run.states == {}
        _, rounds = collect(fine)
        assert fine.state == "done"
    finally:
        scheduler.close()
    same_rounds(solo(tiny_members, names[:2], PROMPTS[1], SHORT), rounds)


def test_bad_requests_are_refused_before_they_queue_or_end_with_the_reason(tiny_members):
    scheduler = Scheduler(tiny_members)
    try:
        with pytest.raises(ConfigError, match="unknown members nope"):
            scheduler.submit(PROMPTS[0], members=["nope"])
        with pytest.raises(ConfigError, match="prompt is empty"):
            scheduler.submit("  ")
        with pytest.raises(ConfigError, match="twice"):
            scheduler.submit(PROMPTS[0], members=[tiny_members[0].name] * 2)
        ticket = scheduler.submit(PROMPTS[0], EnsembleConfig(initial_weights=(1.0, 2.0)))  # 3 members
        with pytest.raises(ConfigError, match="initial_weights has 2 values for 3 members"):
            collect(ticket)
        assert ticket.state == "failed" and scheduler.stats()["running"] == 0
    finally:
        scheduler.close()


def test_members_loaded_later_join_between_rounds(tiny_members):
    scheduler = Scheduler(tiny_members[:2], batch_size=4)
    try:
        early = scheduler.submit(PROMPTS[0], LONG)
        next(early.events(timeout=60))  # it is under way
        with pytest.raises(ConfigError, match="unknown members"):
            scheduler.submit(PROMPTS[1], SHORT, members=[tiny_members[2].name])
        scheduler.add_members(tiny_members[2:])
        late = scheduler.submit(PROMPTS[1], SHORT, members=[tiny_members[2].name, tiny_members[0].name])
        _, rounds = collect(late)
        early.cancel()
    finally:
        scheduler.close()
    assert scheduler.names == tuple(m.name for m in tiny_members)
    same_rounds(solo(tiny_members, [tiny_members[2].name, tiny_members[0].name], PROMPTS[1], SHORT), rounds)
