"""The handout carries a class session's spread (issue 55): per round, the class's votes beside each
candidate and how many guessed the winner, counts only; hostile candidate texts stay inert data; a
spread of another run is left out, a malformed one refused. (Desk.spread, the app's side, is in
tests/classroom/test_room_page.py.)"""

from __future__ import annotations

import re

import pytest

from specfuse import ConfigError
from specfuse.handout import trace_html
from specfuse.handout.data import room_votes

from ..helpers_handout import HOSTILE_DRAFTS, XSS_IMG, XSS_SCRIPT, hostile_trace, page_json
from ..scripted import scripted_rounds


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
    tags = re.compile(r"<[a-zA-Z!/]")
    assert len(tags.findall(page)) == len(tags.findall(plain))  # the votes are data, never markup
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
