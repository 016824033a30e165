"""Step mode in a real browser (issue 43, items 1-3), driven by the keyboard as a teacher (or a
presenter's clicker) drives it: the focus on the page, → / PageDown, ← / PageUp and space. Tiny
random-weight members; two people stepping at once, a third running freely; the idle limit."""

from __future__ import annotations

import time

import pytest

from studio.serving import Schedulers

from ..conftest import TINY, tiny_member
from ..helpers_browser import launched, opened

pytestmark = pytest.mark.browser

SKY = "Why is the sky blue? Explain it to a child."
TALE = "Once upon a time, in a land far away"
BUILD = {"default_models": TINY, "defaults": {"segment_len": 4, "max_new_tokens": 32}}
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def members():
    return {name: tiny_member(name) for name in TINY}


@pytest.fixture(scope="module")
def url(tmp_path_factory, members):
    with launched(tmp_path_factory.mktemp("gradio"), members, schedulers=Schedulers(), **BUILD) as address:
        yield address


def wait_in(page, selector: str, text: str, timeout: float = WAIT_MS) -> None:
    page.wait_for_function(
        "([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)",
        arg=[selector, text],
        timeout=timeout,
    )


def note(page) -> str:
    return page.inner_text("#step-note")


def blur(page) -> None:
    """The focus back on the page itself, as after a click on its background."""
    page.evaluate("document.activeElement && document.activeElement.blur()")


def start_stepping(page, prompt: str) -> None:
    """Step mode on, the prompt, Run; the plain answer's accordion open (answer_text reads it)."""
    open_plain(page)
    page.locator("#step-mode input").check()
    page.fill("#prompt textarea", prompt)
    page.click("#run")
    wait_in(page, "#step-note", "ready", timeout=3 * WAIT_MS)  # a busy machine's first run: 30 s were too few
    blur(page)


def open_plain(page) -> None:
    page.locator("#plain-box button").first.click()
    page.wait_for_selector("#plain textarea")


def shown_round(page) -> int:
    return int(float(page.input_value("#round input[type=number]")))


def answer_text(page) -> str:
    return page.input_value("#plain textarea")


def test_a_teacher_steps_a_run_with_the_keyboard_alone(browser, url):
    with opened(browser, url) as page:
        start_stepping(page, SKY)
        assert page.locator("#step-reveal").is_disabled() and page.locator("#step-back").is_disabled()
        assert not page.locator("#step-next").is_disabled() and not page.locator("#step-play").is_disabled()
        page.keyboard.press("ArrowRight")  # Next: round 1's drafts, and no verdict
        wait_in(page, "#step-note", "Round 1: 3 drafts are in")
        assert answer_text(page) == "" and "✓" not in page.inner_text("#candidates")
        assert all(member in page.inner_text("#candidates") for member in TINY)
        wait_in(page, "#matrix", "hidden until Reveal")
        assert not page.locator("#step-reveal").is_disabled()

        # The room's guess: a click on a radio, whose focus then stays on it. The arrows are the
        # guesses' there (one radio group, issue 53); the clicker's PageDown reveals and does not
        # move the radio to the next member.
        label = page.locator("#step-guess label").nth(1)
        guessed = label.inner_text().split(":")[0].split(". ", 1)[1].strip()  # "2. member: “its draft”"
        label.click()
        page.keyboard.press("PageDown")
        wait_in(page, "#step-note", "won")
        said = note(page)
        if "✓ Your guess was right." in said:
            assert f"Round 1: {guessed}'s candidate won" in said
        else:
            assert f"You guessed {guessed}." in said
        assert "of 1 guess right" in said
        assert answer_text(page) and "✓" in page.inner_text("#candidates")
        wait_in(page, "#matrix", "round 1:")
        assert not page.locator("#step-guess").is_visible()

        for k in (2, 3):  # a clicker's PageDown does the same: drafts, then the verdict
            page.keyboard.press("PageDown")
            wait_in(page, "#step-note", f"Round {k}: 3 drafts are in")
            before = answer_text(page)
            page.keyboard.press("PageDown")
            wait_in(page, "#step-note", f"Round {k}: ")
            wait_in(page, "#step-note", "won")
            assert answer_text(page).startswith(before) and len(answer_text(page)) > len(before)
            assert "No guess this round." in note(page) and "of 1 guess right" in note(page)

        # Keys typed into a field are the field's: the prompt takes the arrow, the run stays.
        page.click("#prompt textarea")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowLeft")
        page.wait_for_timeout(800)
        assert shown_round(page) == 3 and "Round 3: " in note(page)
        blur(page)

        # Back and forth over the revealed rounds: ← and PageUp back, → forward.
        page.keyboard.press("ArrowLeft")
        wait_in(page, "#step-note", "Round 2 of 3")
        assert page.inner_text("#status").startswith("Round 2 ") and shown_round(page) == 2
        page.keyboard.press("PageUp")
        wait_in(page, "#step-note", "Round 1 of 3")
        wait_in(page, "#matrix", "round 1:")
        page.keyboard.press("ArrowRight")
        wait_in(page, "#step-note", "Round 2 of 3")
        page.keyboard.press("ArrowRight")
        wait_in(page, "#step-note", "Round 3 of 3")

        # Play at the fastest pace (1 s a round) plays on by itself; space pauses it.
        pace = page.locator("#step-pace input[type=number]")
        pace.fill("1")
        pace.press("Enter")
        blur(page)
        page.keyboard.press(" ")
        wait_in(page, "#step-play", "Pause")
        page.wait_for_function(
            "document.querySelector('#round input[type=number]').value >= 5", timeout=WAIT_MS
        )
        page.keyboard.press(" ")
        wait_in(page, "#step-play", "Play")
        page.wait_for_timeout(1500)  # a beat under way when Pause came ends
        held = (shown_round(page), note(page))
        page.wait_for_timeout(3000)
        assert (shown_round(page), note(page)) == held
        assert page.dialogs == []


def test_two_people_step_apart_while_a_third_runs_freely(browser, url):
    with opened(browser, url) as first, opened(browser, url) as second, opened(browser, url) as third:
        start_stepping(first, TALE)
        first.keyboard.press("ArrowRight")
        wait_in(first, "#step-note", "Round 1: 3 drafts are in")

        start_stepping(second, SKY)
        for beat in ("Round 1: 3 drafts are in", "won", "Round 2: 3 drafts are in"):
            second.keyboard.press("ArrowRight")
            wait_in(second, "#step-note", beat)

        # The third person's run plays to its end while both others are paused.
        open_plain(third)
        third.fill("#prompt textarea", TALE)
        third.click("#run")
        wait_in(third, "#status", "stopped:", timeout=60_000)
        free = answer_text(third)

        # The first run was not moved by the others, and plays the rounds it would alone.
        assert "Round 1: 3 drafts are in" in note(first) and answer_text(first) == ""
        for k in (1, 2):
            first.keyboard.press("ArrowRight")
            wait_in(first, "#step-note", f"Round {k}: ")
            wait_in(first, "#step-note", "won")
            assert free.startswith(answer_text(first)) and answer_text(first)
            if k == 1:
                first.keyboard.press("ArrowRight")
                wait_in(first, "#step-note", "Round 2: 3 drafts are in")
        assert "Round 2: 3 drafts are in" in note(second)  # still where the second person left it

        # Stop ends a stepping run: the note says so, what was revealed stays.
        second.click("#stop")
        wait_in(second, "#step-note", "Stopped by the user.")
        wait_in(second, "#status", "stopped by the user")
        assert second.locator("#step-next").is_disabled() and second.locator("#step-play").is_disabled()
        assert answer_text(second)


def test_a_run_paused_past_the_idle_limit_says_it_ended(browser, members, tmp_path_factory):
    with (
        launched(
            tmp_path_factory.mktemp("gradio"), members, schedulers=Schedulers(pause_idle_s=6.0), **BUILD
        ) as address,
        opened(browser, address) as page,
    ):
        start_stepping(page, SKY)
        page.keyboard.press("ArrowRight")
        wait_in(page, "#step-note", "drafts are in")
        page.keyboard.press("ArrowRight")
        wait_in(page, "#step-note", "won")
        kept = answer_text(page)
        # no step for longer than the limit (6 s: on a loaded machine 2 s could pass before the first key)
        time.sleep(7.5)
        page.keyboard.press("ArrowRight")
        wait_in(page, "#step-note", "no step for 6 s")
        wait_in(page, "#status", "no step for 6 s")
        assert "The run has ended after round 1" in note(page) and answer_text(page) == kept
        assert page.locator("#step-next").is_disabled()
