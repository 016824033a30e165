"""The room votes (issue 55) in a real browser: a teacher at 1280×720 steps a recorded lesson (no
model loaded) with a class session open; three phones (390×844) join by its link and vote for three
rounds, by tap and by key, one changes its vote; nothing of the verdict is on a phone before the
reveal; at the reveal each phone shows the winner and its own score, the teacher the class's spread
and accuracy. A live run the same way."""

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


def test_three_phones_vote_on_a_recorded_lesson_and_the_teacher_sees_the_spread(browser, served):
    address, loaded = served
    lesson = load_lesson(SLUG)
    rnd = lesson.rounds[0]
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

        phones = [browser.new_context(viewport=PHONE).new_page() for _ in range(3)]
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
            wait_text(teacher, "#room-joined", "3 joined")

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
            key(phones[2], str(ord(loser) - 64))
            wait_text(phones[1], "#room-student", f"Your pick: {winner}")
            wait_text(phones[0], "#room-student", f"Your pick: {winner}")
            wait_text(phones[2], "#room-student", f"Your pick: {loser}")
            wait_text(teacher, "#room-tally", "3 of 3 voted")  # hidden: how many only
            assert "%" not in teacher.inner_text("#room-tally")
            key(teacher, "v")  # the votes shown: the changed vote counted once, as its last pick
            wait_text(teacher, "#room-tally", "2 (67 %)")
            assert "1 (33 %)" in teacher.inner_text("#room-tally")

            key(teacher, "ArrowRight")  # Reveal
            wait_text(teacher, "#step-note", "won")
            for phone, score in zip(phones, ("1 of 1", "1 of 1", "0 of 1")):
                wait_text(phone, "#room-student", f"Round 1: {winner} won")
                wait_text(phone, "#room-student", f"Your score: {score} right.")
                assert not phone.locator("#room-pick").is_visible()
            wait_text(phones[0], "#room-student", "✓ You were right.")
            wait_text(phones[2], "#room-student", f"✗ You picked {loser}.")
            assert rnd.winner.member in heard(phones[0], marks[0])  # now it is sent (the tap hears it)
            shot(teacher, "room-teacher-reveal")
            shot(phones[0], "room-phone-verdict")
            wait_text(teacher, "#room-tally", "the models")  # the teacher's panel follows the reveal
            spread = teacher.inner_text("#room-tally")
            assert "the class" in spread and "the models" in spread and "✓" in spread
            wait_text(teacher, "#room-accuracy", "2 of 3 votes right (67 %)")

            # Round 2: the first phone votes wrong, the second not at all, the third right.
            rnd2 = lesson.rounds[1]
            two = choices_of(arrivals(rnd2, rnd.elapsed))
            right2 = next(c.letter for c in two if c.text == rnd2.winner.text)
            wrong2 = next(c.letter for c in two if c.letter != right2)
            reveal(teacher, phones, drafts(teacher, phones), 2, right2, {0: wrong2, 2: right2})
            wait_text(phones[0], "#room-student", f"✗ You picked {wrong2}.")
            wait_text(phones[0], "#room-student", "Your score: 1 of 2 right.")
            wait_text(phones[1], "#room-student", "You did not vote this round.")
            wait_text(phones[1], "#room-student", "Your score: 1 of 1 right.")
            wait_text(phones[2], "#room-student", "Your score: 1 of 2 right.")
            wait_text(teacher, "#room-accuracy", "3 of 5 votes right (60 %)")

            # Round 3: all three right.
            rnd3 = lesson.rounds[2]
            right3 = next(
                c.letter for c in choices_of(arrivals(rnd3, rnd2.elapsed)) if c.text == rnd3.winner.text
            )
            reveal(teacher, phones, drafts(teacher, phones), 3, right3, dict.fromkeys(range(3), right3))
            for phone, score in zip(phones, ("2 of 3", "2 of 2", "2 of 3")):
                wait_text(phone, "#room-student", f"Your score: {score} right.")
            wait_text(teacher, "#room-accuracy", "6 of 8 votes right (75 %)")

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


def drafts(teacher, phones) -> list[int]:
    """The next round's drafts by the teacher's →, on every phone; how much each phone had been sent
    before them."""
    marks = [len(phone.evaluate("window.sfHeard")) for phone in phones]
    key(teacher, "ArrowRight")
    wait_text(teacher, "#step-note", "drafts are in")  # the step done: a key pressed mid-step is dropped
    for phone in phones:
        phone.wait_for_selector("#room-pick input[type=radio]")
    return marks


def reveal(teacher, phones, marks, k: int, winner: str, picks: dict[int, str]) -> None:
    """Phone i votes picks[i] by key (the others do not; a later pick of the same phone replaces its
    first); the reveal by → once the votes are counted, and each phone says `winner` won. Before the
    reveal, no phone's page nor anything it was sent since the drafts says who won round k."""
    verdict = re.compile(rf"Round {k}: [A-I] won")
    for i, letter in picks.items():
        key(phones[i], str(ord(letter) - 64))
        wait_text(phones[i], "#room-student", f"Your pick: {letter}")
    wait_text(teacher, "#room-tally", f"{len(picks)} of {len(phones)} voted")
    for phone, mark in zip(phones, marks):
        assert not verdict.search(phone.evaluate(SHOWN)) and not verdict.search(heard(phone, mark))
    key(teacher, "ArrowRight")
    wait_text(teacher, "#step-note", "won")
    for phone in phones:
        wait_text(phone, "#room-student", f"Round {k}: {winner} won")


def test_three_phones_vote_on_a_live_run_for_three_rounds(browser, served):
    """A live stepping run (the scripted members, no model files; a's "x " wins every round): the
    phones get the drafts, vote, change a vote, and hear each verdict and their score; they see no
    step control of the teacher's page."""
    address, _ = served
    with opened(browser, address) as teacher:
        use_members(teacher, "a", "b")
        teacher.locator("#step-mode input").check()
        teacher.fill("#prompt textarea", "Say x")
        teacher.click("#run")
        wait_text(teacher, "#step-note", "ready")
        teacher.click("#room-start")
        teacher.wait_for_selector("#room-link")
        teacher.evaluate("document.activeElement && document.activeElement.blur()")
        phones = [browser.new_context(viewport=PHONE).new_page() for _ in range(3)]
        try:
            for phone in phones:
                phone.set_default_timeout(30_000)
                phone.add_init_script(TAP)
                phone.goto(teacher.get_attribute("#room-link", "href"))
                wait_text(phone, "#room-student", "You are in")
                assert phone.locator("#step-next, #step-reveal, #run, #room-start").count() == 0
            wait_text(teacher, "#room-joined", "3 joined")
            # (x, y) votes per round: all right; one wrong, one changed to right; one wrong, one none
            plan = [["x", "x", "x"], ["y", "yx", "x"], ["x", "y", ""]]
            for k, votes in enumerate(plan, start=1):
                marks = drafts(teacher, phones)
                labels = [t.strip() for t in phones[0].locator("#room-pick label").all_inner_texts()]
                assert sorted(t[3:] for t in labels) == ["x", "y"], labels
                letter = {t[3:]: t[0] for t in labels}  # "A. x" → x: A
                for i, said in enumerate(votes):
                    for text in said[:-1]:  # a first pick, replaced by the last
                        key(phones[i], str(ord(letter[text]) - 64))
                        wait_text(phones[i], "#room-student", f"Your pick: {letter[text]}")
                picks = {i: letter[said[-1]] for i, said in enumerate(votes) if said}
                reveal(teacher, phones, marks, k, letter["x"], picks)
                wait_text(phones[0], "#room-student", "drafted by a")
            for phone, score in zip(phones, ("2 of 3", "2 of 3", "2 of 2")):
                wait_text(phone, "#room-student", f"Your score: {score} right.")
            wait_text(phones[2], "#room-student", "You did not vote this round.")
            wait_text(teacher, "#room-accuracy", "6 of 8 votes right (75 %)")
        finally:
            for phone in phones:
                phone.context.close()
