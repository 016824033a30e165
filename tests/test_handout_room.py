"""The handout carries a class session's spread (issue 55): per round, the class's votes beside each
candidate and how many guessed the winner, counts only; hostile candidate texts stay inert data; a
spread of another run is left out, a malformed one refused. And the app's side: Desk.spread turns a
session that followed a recorded run into that spread."""

from __future__ import annotations

import pytest

from specfuse import ConfigError
from specfuse.handout import trace_html
from specfuse.handout.data import room_votes
from studio.recorded import RecordedTicket, StepRun
from studio.room_page import Desk, beat_of

from .helpers_handout import HOSTILE_DRAFTS, XSS_IMG, XSS_SCRIPT, hostile_trace, page_json
from .scripted import scripted_rounds
from .test_handout import tags_of
from .test_room_page import play, reveal


@pytest.fixture(scope="module")
def hostile():
    return hostile_trace(rounds=3)


def test_the_class_votes_go_beside_each_candidate_as_inert_data(hostile):
    rnd = hostile.rounds[0]
    texts = [c.text for c in rnd.candidates]
    assert set(texts) == set(HOSTILE_DRAFTS) and rnd.winner.text == HOSTILE_DRAFTS[0]
    votes = {HOSTILE_DRAFTS[0]: 3, HOSTILE_DRAFTS[1]: 5}  # the third drew no vote
    page = trace_html(hostile, room=[{"k": 1, "votes": votes}])
    data = page_json(page)
    room = data["rounds"][0]["room"]
    assert room["votes"] == [votes.get(t, 0) for t in texts]
    assert room["made"] == 8 and room["right"] == 3
    assert "room" not in data["rounds"][1]  # no vote on round 2: its panel has no class column
    # the votes add no markup: the page parses to the tags it has without them, no raw text in it
    plain = trace_html(hostile)
    assert tags_of(page).tags == tags_of(plain).tags
    for raw in (XSS_SCRIPT, XSS_IMG):
        assert raw not in page
    assert '<p id="room-note" class="round-note"></p>' in page  # the player writes it as text
    assert 'T("The class: {right} of {made} votes guessed the winner."' in page
    assert "全班：{made} 票中有 {right} 票猜中了获胜者。" in page  # its Chinese travels with it


def test_a_text_drafted_twice_counts_once_and_another_runs_spread_is_left_out():
    trace = scripted_rounds(max_rounds=2)
    rnd = trace.rounds[0]
    texts = [c.text for c in rnd.candidates]
    votes = room_votes(trace, [{"k": 1, "votes": {texts[0]: 2}}, {"k": 2, "votes": {"not drafted": 4}}])
    assert list(votes) == [1]  # round 2's texts are not this run's
    first = {t: texts.index(t) for t in texts}
    assert votes[1]["votes"] == [
        (2 if t == texts[0] else 0) if first[t] == j else None for j, t in enumerate(texts)
    ]
    assert room_votes(trace, [{"k": 9, "votes": {}}]) == {}  # no such round


@pytest.mark.parametrize(
    "bad",
    [
        [{"k": "1", "votes": {}}],
        [{"k": 1, "votes": ["a"]}],
        [{"k": 1, "votes": {"a": -1}}],
        [{"k": 1, "votes": {"a": True}}],
        [{"k": 1, "votes": {"a": 1.5}}],
        ["k=1"],
    ],
)
def test_a_malformed_spread_is_refused_with_a_reason(bad):
    with pytest.raises(ConfigError, match="room's spread|counts"):
        room_votes(scripted_rounds(max_rounds=1), bad)


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
