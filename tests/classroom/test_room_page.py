"""The room follows a stepping run (studio.room_page.beat_of) on a recorded run, as step mode plays
it: the drafts beat gives the phones texts only, the reveal gives the verdict lettered as the ballot
was, and the room scores it once; the class's spread goes into the teacher's handout (Desk.spread)."""

from __future__ import annotations

import asyncio

from specfuse.handout import trace_html
from studio.ballot import Beat
from studio.recorded import RecordedTicket, StepRun
from studio.room import Rooms
from studio.room_page import Desk, beat_of

from ..helpers_handout import page_json
from ..scripted import scripted_rounds


def play(run: StepRun) -> None:
    """Step mode's first beat on a recorded run: one round's drafts in, its verdict kept."""

    async def drafts() -> None:
        run.ticket.next()
        async for event in run.ticket.aevents(until_pause=True):
            kind = type(event).__name__
            if kind == "Draft":
                run.drafts.append(event)
            elif kind == "Round":
                run.pending = event

    asyncio.run(drafts())


def reveal(run: StepRun) -> None:
    assert run.pending is not None
    run.rounds.append(run.pending)
    run.pending, run.drafts = None, []


def test_the_room_sees_a_recorded_runs_drafts_then_its_verdict_lettered_alike():
    trace = scripted_rounds(max_rounds=3)
    run = StepRun(RecordedTicket(trace), trace.prompt, trace.config)
    rooms = Rooms(secret=b"s" * 32)
    session = rooms.open("teacher", 0.0)
    token = rooms.join(session.code, None, "phone", 0.0)[1]
    assert beat_of(run, 1, session.beat) == Beat(1)  # before round 1: nothing to vote on

    play(run)
    session.follow(beat_of(run, 1, session.beat), 1.0)
    ballot = session.beat.ballot
    assert ballot is not None and session.beat.verdict is None
    assert {c.text for c in ballot.choices} == {c.text for c in trace.rounds[0].candidates}
    assert ballot.prompt == "go" and ballot.answer == ""
    winner_text = trace.rounds[0].winner.text
    pick = next(c.letter for c in ballot.choices if c.text == winner_text)
    rooms.vote(session.code, token, ballot.key, pick, 1.0)

    reveal(run)
    beat = beat_of(run, 1, session.beat)
    assert beat.ballot is None and beat.verdict is not None
    assert beat.verdict.choices == ballot.choices and beat.verdict.winner == pick
    session.follow(beat, 2.0)
    assert beat_of(run, 1, session.beat) is not beat and beat_of(run, 1, session.beat) == session.beat
    assert not session.follow(beat_of(run, 1, session.beat), 3.0)  # the same beat: nothing moves
    assert rooms.student(session.code, token)[1].right == 1

    play(run)  # round 2's drafts: the answer so far is round 1's
    session.follow(beat_of(run, 1, session.beat), 4.0)
    assert session.beat.ballot is not None and session.beat.ballot.answer == trace.rounds[0].text


def test_the_desk_gives_the_handout_the_spread_of_the_run_on_screen():
    trace = scripted_rounds(max_rounds=3)
    run = StepRun(RecordedTicket(trace), trace.prompt, trace.config)
    desk = Desk(stepper=None)  # type: ignore[arg-type]  # spread reads the rooms only
    session = desk.rooms.open("teacher", 0.0)
    desk.serials["teacher"] = (1, run)
    tokens = [desk.rooms.join(session.code, None, f"phone{i}", 0.0)[1] for i in range(3)]
    play(run)
    session.follow(beat_of(run, 1, session.beat), 1.0)
    ballot = session.beat.ballot
    assert ballot is not None
    winner = next(c.letter for c in ballot.choices if c.text == trace.rounds[0].winner.text)
    other = next((c.letter for c in ballot.choices if c.letter != winner), winner)
    for token, letter in zip(tokens, (winner, other, winner)):
        desk.rooms.vote(session.code, token, ballot.key, letter, 1.0)
    reveal(run)
    session.follow(beat_of(run, 1, session.beat), 2.0)
    spread = desk.spread("teacher")
    by_letter = {c.letter: c.text for c in ballot.choices}
    expected: dict[str, int] = {}
    for letter in (winner, other, winner):
        expected[by_letter[letter]] = expected.get(by_letter[letter], 0) + 1
    assert spread == [{"k": 1, "votes": {c.text: expected.get(c.text, 0) for c in ballot.choices}}]
    data = page_json(trace_html(trace, room=spread))
    assert (
        data["rounds"][0]["room"]["made"] == 3
        and data["rounds"][0]["room"]["right"] == expected[by_letter[winner]]
    )
    desk.serials["teacher"] = (2, None)  # Run again: the old run's rounds are not the new one's
    assert desk.spread("teacher") == []
    desk.rooms.close("teacher")
    assert desk.spread("teacher") == []  # ended without End (the page closed, or idle): nothing kept
