"""Links that open a lesson at a round (issue 53, item 6): the page's query read as untrusted text.
The page itself (Classroom.open_link on the app's load, the handout's fragment):
tests/browser/test_links.py."""

from __future__ import annotations

import pytest

from specfuse.lessons import LESSONS
from studio.gallery import Link, bounded, parse_link
from studio.views import status_markdown

SLUGS = [one.slug for one in LESSONS]
SLUG = "weak-member-exits"


def test_a_known_lesson_and_a_whole_round_are_what_the_link_asks_for():
    assert parse_link({"lesson": SLUG, "round": "3"}, SLUGS) == Link(SLUG, 3)
    assert parse_link({"lesson": f" {SLUG} ", "round": " 07 "}, SLUGS) == Link(SLUG, 7)
    assert parse_link({"lesson": SLUG}, SLUGS) == Link(SLUG)  # the lesson's key round
    assert parse_link({"lesson": SLUG, "round": ""}, SLUGS) == Link(SLUG)
    # Parameters that are not ours (a tracker's, Gradio's own) are left alone, and no link is no note.
    assert parse_link({"utm_source": "slides", "__theme": "dark"}, SLUGS) == Link()


@pytest.mark.parametrize("bad", ["three", "3.0", "-2", "1e3", "0x3", "3;4", "١٢", "9999999", "3 4"])
def test_a_round_that_is_not_a_whole_number_opens_the_key_round_with_a_note(bad):
    link = parse_link({"lesson": SLUG, "round": bad}, SLUGS)
    assert link.lesson == SLUG and link.round is None
    assert "is not a whole number" in link.note and bad[:5] in link.note


def test_an_unknown_lesson_opens_nothing_and_the_note_names_the_lessons_there_are():
    link = parse_link({"lesson": "weak-member", "round": "3"}, SLUGS)
    assert link.lesson is None and link.round is None
    assert "“weak-member” is not one of these lessons" in link.note
    assert all(slug in link.note for slug in SLUGS)
    assert "none here" in parse_link({"lesson": SLUG}, []).note
    # A round without a lesson says what the link lacks.
    assert "needs a lesson" in parse_link({"round": "3"}, SLUGS).note


def test_a_hostile_link_is_cut_and_shown_as_text():
    hostile = "<img src=x onerror=alert(1)>**bold** [a](javascript:alert(1))" + "x" * 5000
    link = parse_link({"lesson": hostile}, SLUGS)
    assert len(link.note) < 400  # the 5,000 characters are not quoted back
    shown = status_markdown((), link.note)
    assert "<img" not in shown and "**bold**" not in shown and "](javascript" not in shown
    round_note = parse_link({"lesson": SLUG, "round": "<script>alert(1)</script>"}, SLUGS).note
    assert "<script" not in status_markdown((), round_note)


@pytest.mark.parametrize(
    ("k", "n", "shown"), [(1, 10, 1), (10, 10, 10), (0, 10, 1), (11, 10, 10), (999999, 3, 3)]
)
def test_a_round_beyond_the_lesson_is_the_nearest_one_with_a_note(k, n, shown):
    near, note = bounded(k, n)
    assert near == shown
    assert (note == "") == (k == shown)
    if note:
        assert f"round {k} is not one of the lesson's {n} rounds: round {shown} is shown" in note


@pytest.mark.parametrize(
    ("value", "step"), [("1", True), ("on", True), (" TRUE ", True), ("0", False), ("no", False)]
)
def test_step_in_a_link_turns_step_mode_on_or_off(value, step):
    assert parse_link({"lesson": SLUG, "round": "4", "step": value}, SLUGS) == Link(SLUG, 4, step=step)
    assert parse_link({"lesson": SLUG, "step": value}, SLUGS) == Link(SLUG, step=step)


@pytest.mark.parametrize("bad", ["2", "maybe", "<b>x</b>" * 20])
def test_a_step_that_is_not_1_or_0_is_a_note_and_no_stepping(bad):
    link = parse_link({"lesson": SLUG, "round": "4", "step": bad}, SLUGS)
    assert link == Link(SLUG, 4, link.note, step=False) and "is not 1 or 0" in link.note
    both = parse_link({"lesson": SLUG, "round": "x", "step": bad}, SLUGS).note
    assert "not a whole number" in both and "is not 1 or 0" in both
