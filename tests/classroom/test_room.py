"""The class session's state (studio.room), without Gradio or a model: codes and joins, the bounds,
one vote per student per round, nothing of the verdict before the reveal, scoring, expiry."""

from __future__ import annotations

import dataclasses

import pytest

from specfuse.records import Draft
from studio import room
from studio.ballot import Ballot, Beat, choices_of, verdict_of
from studio.room import (
    ALPHABET,
    CODE_LEN,
    FAILS_IN_ALL,
    FAILS_PER_CLIENT,
    IDLE_S,
    MAX_ROOMS,
    MAX_STUDENTS,
    VOTES_PER_S,
    RoomError,
    Rooms,
)
from studio.room_views import pick_choices, student_html, teacher_html

from ..scripted import scripted_rounds

T0 = 1000.0


@pytest.fixture(scope="module")
def trace():
    return scripted_rounds(max_rounds=4)  # a: "fine ", b: "good " (always wins), c: "junk "


def drafts_of(rnd):
    return [Draft(rnd.k, c, 0.0) for c in rnd.candidates]


def ballot(trace, k, run=1):
    return Ballot(run, k, choices_of(drafts_of(trace.rounds[k - 1])))


def drafted(trace, k, run=1, before=None):
    """The beat with round k's drafts on the table (and round k-1 revealed, when k > 1)."""
    verdict = revealed(trace, k - 1, run).verdict if k > 1 else None
    return Beat(run, ballot(trace, k, run), verdict)


def revealed(trace, k, run=1):
    b = ballot(trace, k, run)
    return Beat(run, None, verdict_of(run, trace.rounds[k - 1], b.choices))


def letter_of(b: Ballot, text: str) -> str:
    return next(c.letter for c in b.choices if c.text == text)


def voting(rooms, trace, *students):
    """A session opened at T0 on round 1's drafts, `students` joined: the session, its ballot and
    each student's token."""
    session = rooms.open("teacher", T0)
    session.follow(drafted(trace, 1), T0)
    return session, session.beat.ballot, [rooms.join(session.code, None, s, T0)[1] for s in students]


@pytest.fixture
def rooms():
    return Rooms(secret=b"k" * 32)


def test_a_code_is_six_unambiguous_symbols_and_is_typed_in_any_case(rooms):
    codes = {rooms.open(f"t{i}", T0).code for i in range(MAX_ROOMS)}
    assert len(codes) == MAX_ROOMS
    assert all(len(c) == CODE_LEN and set(c) <= set(ALPHABET) for c in codes)
    assert not set("01IO") & set(ALPHABET)
    code = next(iter(codes))
    typed = f" {code[:3].lower()}-{code[3:]} "
    session, token = rooms.join(typed, None, "phone", T0)
    assert session.code == code and rooms.student_id(token) in session.students
    with pytest.raises(RoomError, match="already holds"):
        rooms.open("one too many", T0)
    assert rooms.open("t0", T0).code in codes  # the teacher's page keeps its own session


def test_wrong_codes_are_limited_per_client_and_in_all(rooms):
    code = rooms.open("teacher", T0).code
    for _ in range(FAILS_PER_CLIENT):
        with pytest.raises(RoomError, match="No class session has that code"):
            rooms.join("AAAAAA" if code != "AAAAAA" else "BBBBBB", None, "guesser", T0)
    with pytest.raises(RoomError, match="Too many wrong codes"):  # even the right one, for a while
        rooms.join(code, None, "guesser", T0 + 1)
    rooms.join(code, None, "someone else", T0 + 1)  # the room goes on for everyone else
    rooms.join(code, None, "guesser", T0 + room.FAIL_WINDOW_S + 1)  # after the window
    # many clients guessing together: the server-wide limit
    for i in range(FAILS_IN_ALL):
        with pytest.raises(RoomError):
            rooms.join("ZZZZZ9", None, f"bot{i}", T0 + 100)
    with pytest.raises(RoomError, match="Too many wrong codes"):
        rooms.join(code, None, "fresh", T0 + 100)


def test_a_session_holds_at_most_its_students_and_a_rejoin_keeps_the_place(rooms):
    code = rooms.open("teacher", T0).code
    tokens = [rooms.join(code, None, f"p{i}", T0)[1] for i in range(MAX_STUDENTS)]
    with pytest.raises(RoomError, match="full"):
        rooms.join(code, None, "late", T0)
    session, again = rooms.join(code, tokens[7], "p7", T0)  # a reload: the same id, no new place
    assert again == tokens[7] and len(session.students) == MAX_STUDENTS


def test_the_server_follows_at_most_max_phones_in_all_its_sessions(rooms):
    codes = [rooms.open(f"teacher{i}", T0).code for i in range(3)]
    per = room.MAX_PHONES // 2
    assert per <= MAX_STUDENTS  # two full-enough sessions reach the bound
    tokens = [rooms.join(code, None, f"{code}-{i}", T0)[1] for code in codes[:2] for i in range(per)]
    with pytest.raises(RoomError, match=f"{room.MAX_PHONES} phones at most"):
        rooms.join(codes[2], None, "one more", T0)
    rooms.join(codes[0], tokens[0], "a reload", T0)  # a phone already in keeps its place
    rooms.close("teacher1")
    assert rooms.join(codes[2], None, "one more", T0)[0].code == codes[2]  # a place freed


def test_a_forged_or_foreign_id_is_refused_and_a_join_with_one_gets_a_new_id(rooms, trace):
    session, b, (token,) = voting(rooms, trace, "p")
    key = b.key
    sid, _mac = token.split(".")
    for forged in (f"{sid}.{'0' * 32}", "x" * 5000, f"other.{_mac}", None, 42, Rooms().new_token()):
        with pytest.raises(RoomError, match="id"):
            rooms.vote(session.code, forged, key, "A", T0)
    _, fresh = rooms.join(session.code, f"{sid}.{'0' * 32}", "p", T0)
    assert fresh != token and rooms.student_id(fresh) in session.students


def test_one_vote_per_student_per_round_a_later_one_replaces_it(rooms, trace):
    session, b, (one, two) = voting(rooms, trace, "1", "2")
    good, fine = letter_of(b, "good "), letter_of(b, "fine ")
    rooms.vote(session.code, one, b.key, fine, T0)
    rooms.vote(session.code, one, b.key, good, T0 + 0.1)  # changed: replaces
    rooms.vote(session.code, two, b.key, good, T0 + 0.1)
    assert session.counts == {fine: 0, good: 2} and len(session.votes) == 2
    version = session.version
    rooms.vote(session.code, two, b.key, fine, T0 + 0.2)
    assert session.version == version  # a vote wakes no student's page: only a beat does


@pytest.mark.parametrize(
    "letter, key, says",
    [
        ("Z", None, "no such candidate"),
        ("x" * 1_000_000, None, "no such candidate"),  # a 1 MB vote: refused unread
        (["A"], None, "no such candidate"),
        ("A", "1-2", "closed"),  # a round not on the table
        ("A", 12, "no such candidate"),
    ],
)
def test_a_vote_for_what_is_not_on_the_table_is_refused(rooms, trace, letter, key, says):
    session, b, (token,) = voting(rooms, trace, "p")
    with pytest.raises(RoomError, match=says):
        rooms.vote(session.code, token, b.key if key is None else key, letter, T0)
    assert not session.votes


def test_a_vote_after_the_reveal_is_refused(rooms, trace):
    session, b, (token,) = voting(rooms, trace, "p")
    session.follow(revealed(trace, 1), T0 + 1)
    with pytest.raises(RoomError, match="closed"):
        rooms.vote(session.code, token, b.key, "A", T0 + 2)


def test_a_thousand_votes_in_a_second_from_one_client_are_refused_past_the_rate(rooms, trace):
    session, b, (token, other) = voting(rooms, trace, "spam", "calm")
    refused = 0
    for i in range(1000):
        try:
            rooms.vote(session.code, token, b.key, b.choices[i % len(b.choices)].letter, T0 + i / 1000)
        except RoomError as e:
            assert "Too many votes" in str(e)
            refused += 1
    assert refused == 1000 - VOTES_PER_S
    assert sum(session.counts.values()) == 1  # still one vote
    rooms.vote(session.code, other, b.key, "A", T0 + 0.5)  # everyone else votes on
    rooms.vote(session.code, token, b.key, "A", T0 + 1.5)  # and the spammer, a second later
    assert sum(session.counts.values()) == 2


def test_nothing_of_the_verdict_reaches_a_student_before_the_reveal(rooms, trace):
    rnd = trace.rounds[0]
    named = tuple(dataclasses.replace(c, member=f"member-{c.member}") for c in rnd.candidates)
    rnd = dataclasses.replace(rnd, candidates=named)
    session = rooms.open("teacher", T0)
    session.follow(Beat(1, Ballot(1, 1, choices_of(drafts_of(rnd))), None), T0)
    token = rooms.join(session.code, None, "p", T0)[1]
    _, student = rooms.student(session.code, token)
    b = session.beat.ballot
    # The ballot itself is texts and letters (the members are there for the teacher only).
    assert {f.name for f in dataclasses.fields(Ballot)} == {"run", "k", "choices", "prompt", "answer"}
    page = student_html(session, student) + repr(pick_choices(b.choices))
    assert all(c.text.strip() in page for c in rnd.candidates)
    for secret in ("member-", "won", "drafted", "right", f"{rnd.aggregate[rnd.chosen]:.2f}", "✓"):
        assert secret not in page.replace("no votes counted", "")
    session.follow(Beat(1, None, verdict_of(1, rnd, b.choices)), T0 + 1)
    after = student_html(session, student)
    assert "won (drafted by member-b)" in after and "did not vote" in after


def test_each_student_is_scored_once_per_round_and_the_class_accuracy_adds_up(rooms, trace):
    session = rooms.open("teacher", T0)
    tokens = [rooms.join(session.code, None, f"p{i}", T0)[1] for i in range(3)]
    for k in (1, 2, 3):
        session.follow(drafted(trace, k), T0 + k)
        b = session.beat.ballot
        good, fine = letter_of(b, "good "), letter_of(b, "fine ")
        rooms.vote(session.code, tokens[0], b.key, good, T0 + k)  # always right
        rooms.vote(session.code, tokens[1], b.key, fine if k != 2 else good, T0 + k)  # right in round 2
        # the third votes in rounds 1 and 2 only
        if k < 3:
            rooms.vote(session.code, tokens[2], b.key, fine, T0 + k)
        session.follow(revealed(trace, k), T0 + k + 0.5)
        session.follow(revealed(trace, k), T0 + k + 0.6)  # the same beat again scores nothing
    scores = [rooms.student(session.code, t)[1] for t in tokens]
    assert [(s.right, s.made) for s in scores] == [(3, 3), (1, 3), (0, 2)]
    assert (session.right, session.made) == (4, 8)
    assert session.accuracy == "4 of 8 votes right (50 %)"
    goods = [[c.text for c in ballot(trace, s.k).choices].index("good ") for s in session.spreads]
    assert [s.counts[j] for s, j in zip(session.spreads, goods)] == [1, 2, 1]
    assert [(s.right, s.made) for s in session.spreads] == [(1, 3), (2, 3), (1, 2)]
    view = teacher_html(session, "http://room/join?code=X", show_votes=False)
    assert "4 of 8 votes right" in view and "the models" in view
    assert "Your score: 1 of 3 right." in student_html(session, scores[1])


def test_a_round_revealed_after_the_next_one_began_is_still_scored_once(rooms, trace):
    """The teacher revealed and went on before the room heard: the beat carries both."""
    session = rooms.open("teacher", T0)
    token = rooms.join(session.code, None, "p", T0)[1]
    session.follow(drafted(trace, 1), T0)
    b = session.beat.ballot
    rooms.vote(session.code, token, b.key, letter_of(b, "good "), T0)
    session.follow(drafted(trace, 2), T0 + 1)  # round 1's verdict and round 2's drafts at once
    assert rooms.student(session.code, token)[1].right == 1 and not session.votes


def test_a_new_run_starts_the_rounds_over_and_votes_do_not_carry(rooms, trace):
    session = rooms.open("teacher", T0)
    token = rooms.join(session.code, None, "p", T0)[1]
    session.follow(drafted(trace, 1, run=1), T0)
    rooms.vote(session.code, token, session.beat.ballot.key, "A", T0)
    session.follow(drafted(trace, 1, run=2), T0 + 1)  # Run again: round 1 of another run
    assert not session.votes and session.made == 0
    with pytest.raises(RoomError, match="closed"):
        rooms.vote(session.code, token, "1-1", "A", T0 + 1)


def test_an_idle_session_ends_and_its_state_is_freed(rooms, trace):
    session = rooms.open("teacher", T0)
    token = rooms.join(session.code, None, "p", T0)[1]
    session.follow(drafted(trace, 1), T0 + 10)
    waiting = session.changed
    assert rooms.sweep(T0 + 10 + IDLE_S - 1) == []  # a beat counts as activity
    assert rooms.sweep(T0 + 10 + IDLE_S) == [session]
    assert session.ended and waiting.is_set()  # the students' pages hear it
    assert not session.students and not session.votes and not rooms.by_code and not rooms.by_teacher
    with pytest.raises(RoomError, match="ended"):
        rooms.vote(session.code, token, "1-1", "A", T0 + IDLE_S + 20)
    with pytest.raises(RoomError, match="No class session"):
        rooms.join(session.code, token, "p", T0 + IDLE_S + 20)
    assert "ended" in student_html(session, None)


def test_a_session_no_student_joined_ends_sooner_and_frees_its_place(rooms):
    empty, used = rooms.open("left open", T0), rooms.open("teaching", T0)
    rooms.join(used.code, None, "p", T0)
    assert rooms.sweep(T0 + room.EMPTY_IDLE_S) == [empty]
    assert rooms.of_teacher("teaching", T0 + room.EMPTY_IDLE_S) is used


def test_the_teacher_ends_the_session(rooms):
    session = rooms.open("teacher", T0)
    assert rooms.close("teacher") is session and session.ended
    assert rooms.of_teacher("teacher", T0) is None and rooms.close("teacher") is None


def test_drafts_that_agree_are_one_choice_and_the_verdict_keeps_the_ballot_letters(trace):
    rnd = trace.rounds[0]
    first, *rest = rnd.candidates
    drafts = [Draft(1, c, 0.0) for c in reversed(rnd.candidates)] + [Draft(1, first, 0.0)]
    choices = choices_of(drafts)
    assert len(choices) == len(rnd.candidates) and [c.text for c in choices][-1] == first.text
    verdict = verdict_of(1, rnd, choices)
    assert verdict.choices == choices
    assert next(c for c in choices if c.letter == verdict.winner).text == rnd.winner.text
    assert verdict.scores[[c.letter for c in choices].index(verdict.winner)] == max(rnd.aggregate)
    assert verdict.winner in verdict.sentence and "judges" in verdict.sentence


def test_the_pages_escape_what_runs_and_people_bring(rooms, trace):
    rnd = trace.rounds[0]
    evil = dataclasses.replace(rnd.candidates[0], text="<img src=x onerror=alert(1)>", member="<b>m</b>")
    forged = dataclasses.replace(rnd, candidates=(evil, *rnd.candidates[1:]))
    session = rooms.open("teacher", T0)
    session.follow(Beat(1, Ballot(1, 1, choices_of(drafts_of(forged))), None), T0)
    page = teacher_html(session, "http://x/join?code=<script>", show_votes=True)
    assert "<img src=x" not in page and "<script>" not in page and "&lt;img" in page
    session.follow(Beat(1, None, verdict_of(1, forged)), T0 + 1)
    shown = teacher_html(session, "http://x/", show_votes=True) + student_html(session, None)
    assert "<b>m</b>" not in shown and "&lt;b&gt;m" in shown
