"""The room votes (issue 55) in a real browser: a teacher at 1280×720 steps a recorded lesson (no
model loaded) with a class session open; two phones (390×844) join by its link, vote by tap and by
key, one changes its vote; nothing of the verdict is on a phone before the reveal; at the reveal
each phone shows the winner and its own score, the teacher the class's spread and accuracy."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from specfuse.lessons import load_lesson
from studio.ballot import choices_of
from studio.recorded import arrivals

from ..helpers_browser import opened, scripted_pair, use_members

pytestmark = pytest.mark.browser

SLUG = "weak-member-exits"
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from scripted_pair(tmp_path_factory, b_drafts="y ")  # two drafts: a's win (the live test)


# The phone's page as it stands, without the app's shared style sheet (its comments name models).
SHOWN = """() => {
  const body = document.body.cloneNode(true);
  body.querySelectorAll("style, script").forEach((e) => e.remove());
  return body.innerHTML;
}"""


# Everything the server sends a phone, streamed answers included, as the page's scripts read it.
TAP = """
window.sfHeard = [];
const fetched = window.fetch;
window.fetch = async (...args) => {
  const response = await fetched(...args);
  try {
    const reader = response.clone().body.getReader();
    const text = new TextDecoder();
    (async () => {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        window.sfHeard.push(text.decode(value, { stream: true }));
      }
    })();
  } catch (e) {}
  return response;
};
const Source = window.EventSource;
if (Source) window.EventSource = class extends Source {
  constructor(...args) {
    super(...args);
    this.addEventListener("message", (e) => window.sfHeard.push(e.data));
  }
};
"""


def heard(page, since: int = 0) -> str:
    return "".join(page.evaluate("(n) => window.sfHeard.slice(n)", since))


def shot(page, name: str) -> None:
    where = os.environ.get("SPECFUSE_SHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"))


def key(page, name: str) -> None:
    page.keyboard.press(name)


def wait_text(page, selector: str, text: str) -> None:
    page.wait_for_function(
        "([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)", arg=[selector, text]
    )


def inside(page, selector: str) -> None:
    size, box = page.viewport_size, page.locator(selector).first.bounding_box()
    assert box is not None and box["x"] >= 0 and box["y"] >= 0, (selector, box)
    assert box["x"] + box["width"] <= size["width"] + 1 and box["y"] + box["height"] <= size["height"] + 1


def test_two_phones_vote_on_a_recorded_lesson_and_the_teacher_sees_the_spread(browser, served):
    address, loaded = served
    rnd = load_lesson(SLUG).rounds[0]
    choices = choices_of(arrivals(rnd, 0.0))
    winner = next(c.letter for c in choices if c.text == rnd.winner.text)
    loser = next(c.letter for c in choices if c.letter != winner)
    with opened(browser, address) as teacher:
        teacher.set_viewport_size({"width": 1280, "height": 720})
        teacher.click(f"#class-open-{SLUG}")
        teacher.wait_for_function("document.querySelector('#status').innerText.includes('recorded run')")
        teacher.locator("#step-mode input").check()
        wait_text(teacher, "#step-note", "recorded run")
        teacher.evaluate("document.activeElement && document.activeElement.blur()")
        key(teacher, "c")  # the class session, by key
        teacher.wait_for_selector("#room-link")
        link = teacher.get_attribute("#room-link", "href")
        code = teacher.inner_text("#room-code").replace("-", "")
        assert re.fullmatch(r"[A-Z2-9]{6}", code) and link.endswith(f"/join?code={code}")
        assert teacher.locator("#room-teacher img[alt^='QR code']").bounding_box()["width"] >= 200
        shot(teacher, "room-teacher-start")

        phones = [browser.new_context(viewport=PHONE).new_page() for _ in range(2)]
        try:
            marks = []
            for phone in phones:
                phone.set_default_timeout(30_000)
                phone.add_init_script(TAP)
                phone.goto(link)
                wait_text(phone, "#room-student", "You are in")
                marks.append(page_heard := len(phone.evaluate("window.sfHeard")))
                assert page_heard > 0  # the tap hears the page's traffic
                assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
            wait_text(teacher, "#room-joined", "2 joined")

            key(teacher, "ArrowRight")  # round 1's drafts: the phones get the candidates, text only
            for phone in phones:
                phone.wait_for_selector("#room-pick input[type=radio]")
                assert phone.locator("#room-pick input[type=radio]").count() == len(choices)
            for phone, mark in zip(phones, marks):  # the page, and all it was sent since it joined
                shown, sent = phone.evaluate(SHOWN), heard(phone, mark)
                assert choices[0].text.strip()[:12] in sent  # the candidates came by this road
                for secret in ("drafted by", "won", "judges", *rnd.members):
                    assert secret not in shown and secret not in sent, secret
            shot(phones[0], "room-phone-drafts")
            phones[0].locator("#room-pick input[type=radio]").nth(ord(winner) - 65).click()  # a tap
            key(phones[1], str(ord(loser) - 64))  # a key: the wrong one first …
            wait_text(phones[1], "#room-student", f"Your pick: {loser}")
            key(phones[1], str(ord(winner) - 64))  # … changed to the winner: it replaces the first
            wait_text(phones[1], "#room-student", f"Your pick: {winner}")
            wait_text(phones[0], "#room-student", f"Your pick: {winner}")
            wait_text(teacher, "#room-tally", "2 of 2 voted")  # hidden: how many only
            assert "%" not in teacher.inner_text("#room-tally")
            key(teacher, "v")  # the votes shown
            wait_text(teacher, "#room-tally", "2 (100 %)")

            key(teacher, "ArrowRight")  # Reveal
            wait_text(teacher, "#step-note", "won")
            for phone in phones:
                wait_text(phone, "#room-student", f"Round 1: {winner} won")
                wait_text(phone, "#room-student", "✓ You were right.")
                wait_text(phone, "#room-student", "Your score: 1 of 1 right.")
                assert not phone.locator("#room-pick").is_visible()
            assert rnd.winner.member in heard(phones[0], marks[0])  # now it is sent (the tap hears it)
            shot(teacher, "room-teacher-reveal")
            shot(phones[0], "room-phone-verdict")
            wait_text(teacher, "#room-tally", "the models")  # the teacher's panel follows the reveal
            spread = teacher.inner_text("#room-tally")
            assert "the class" in spread and "the models" in spread and "✓" in spread
            wait_text(teacher, "#room-accuracy", "2 of 2 votes right (100 %)")

            # Round 2: one phone votes wrong, the other not at all.
            key(teacher, "ArrowRight")
            phones[0].wait_for_selector("#room-pick input[type=radio]")
            rnd2 = load_lesson(SLUG).rounds[1]
            two = choices_of(arrivals(rnd2, rnd.elapsed))
            wrong = next(c.letter for c in two if c.text != rnd2.winner.text)
            key(phones[0], str(ord(wrong) - 64))
            wait_text(teacher, "#room-tally", "1 of 2 voted")
            key(teacher, "ArrowRight")
            wait_text(phones[0], "#room-student", f"✗ You picked {wrong}.")
            wait_text(phones[0], "#room-student", "Your score: 1 of 2 right.")
            wait_text(phones[1], "#room-student", "You did not vote this round.")
            wait_text(teacher, "#room-accuracy", "2 of 3 votes right (67 %)")

            key(teacher, "p")  # the presenter view keeps the room's panel, inside 1280×720
            teacher.wait_for_function("document.body.classList.contains('sf-presenter')")
            teacher.wait_for_timeout(300)
            shot(teacher, "room-presenter")
            inside(teacher, "#room-panel")
            inside(teacher, "#step-bar")
            assert loaded == []  # no model was loaded
            teacher.click("#room-end")
            for phone in phones:
                wait_text(phone, "#room-student", "ended")
        finally:
            for phone in phones:
                phone.context.close()


def test_a_phone_votes_on_a_live_run_too(browser, served):
    """A live stepping run (the scripted members, no model files): the phone gets the drafts, votes,
    and hears the verdict; it sees no step control of the teacher's page."""
    address, _ = served
    with opened(browser, address) as teacher:
        use_members(teacher, "a", "b")
        teacher.locator("#step-mode input").check()
        teacher.fill("#prompt textarea", "Say x")
        teacher.click("#run")
        wait_text(teacher, "#step-note", "ready")
        teacher.click("#room-start")
        teacher.wait_for_selector("#room-link")
        phone = browser.new_context(viewport=PHONE).new_page()
        try:
            phone.set_default_timeout(30_000)
            phone.goto(teacher.get_attribute("#room-link", "href"))
            wait_text(phone, "#room-student", "You are in")
            assert phone.locator("#step-next, #step-reveal, #run, #room-start").count() == 0
            teacher.click("#step-next")
            phone.wait_for_selector("#room-pick input[type=radio]")
            labels = phone.locator("#room-pick label").all_inner_texts()
            assert sorted(t.strip() for t in labels) == ["A. x", "B. y"] or sorted(labels) == sorted(
                ["A. y", "B. x"]
            ), labels
            mine = 1 + [t.strip().endswith("x") for t in labels].index(True)
            key(phone, str(mine))
            wait_text(teacher, "#room-tally", "1 of 1 voted")
            teacher.click("#step-reveal")
            wait_text(phone, "#room-student", "✓ You were right.")
            wait_text(phone, "#room-student", "drafted by a")
            wait_text(teacher, "#room-accuracy", "1 of 1 votes right (100 %)")
        finally:
            phone.context.close()
