"""A teacher's whole lesson by keyboard alone at a projector's 1280×720 (issue 53): open a shipped
lesson from the gallery, step mode on, the recorded run stepped (no model loaded), the room's guess
picked by key, Reveal, Back, Home / End, Play / Pause, the presenter view, the round slider by key,
the key map and the black screen. Every beat is a key press; in the presenter view each beat
asserts the chosen panel inside the viewport and its chart's labels at least 24 px high.
Screenshots of the view at 1280×720 and 1920×1080 go to $SPECFUSE_SHOTS when it is set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specfuse.lessons import load_lesson

from ..helpers_browser import opened, scripted_pair

pytestmark = pytest.mark.browser

SLUG = "weak-member-exits"  # 10 recorded rounds, three members, one leaves
LABEL_PX = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from scripted_pair(tmp_path_factory)


def note(page) -> str:
    return page.inner_text("#step-note")


def wait_note(page, text: str) -> None:
    page.wait_for_function(
        "(t) => (document.querySelector('#step-note')?.innerText || '').includes(t)", arg=text
    )


def slider(page) -> int:
    return int(page.locator("#round input[type=number]").input_value() or 0)


def wait_round(page, k: int) -> None:
    page.wait_for_function(f"document.querySelector('#round input[type=number]').value === '{k}'")


def key(page, name: str) -> None:
    page.keyboard.press(name)


def inside(page, selector: str, scrolled: bool = False) -> None:
    """The element's box lies inside the viewport; unless `scrolled`, with the page not scrolled."""
    size = page.viewport_size
    box = page.locator(selector).first.bounding_box()  # a Group names its inner box alike
    assert box is not None, selector
    assert box["x"] >= -1 and box["y"] >= -1, (selector, box)  # a sub-pixel scroll: -0.03 px seen
    assert box["x"] + box["width"] <= size["width"] + 1, (selector, box, size)
    assert box["y"] + box["height"] <= size["height"] + 1, (selector, box, size)
    assert scrolled or page.evaluate("window.scrollY") == 0


def smallest_label(page, selector: str) -> float:
    """The smallest rendered text height in the panel: SVG text (a chart's ticks, cell values,
    title) and table cells, as the screen draws them (zoom included)."""
    return page.evaluate(
        """(sel) => {
          const root = document.querySelector(sel);
          const boxes = [...root.querySelectorAll("svg text, td, th, [role=gridcell]")]
            .filter((e) => e.textContent.trim() && e.getClientRects().length)
            .map((e) => {
              const r = e.getBoundingClientRect();
              const z = e.closest("svg") ? 1 : 1;
              const size = parseFloat(getComputedStyle(e).fontSize) * z;
              return e.tagName.toLowerCase() === "text" ? r.height / 1.15 : size;
            });
          return boxes.length ? Math.min(...boxes) : 0;
        }""",
        selector,
    )


def presenting(page, panel: str) -> None:
    inside(page, panel)
    inside(page, "#step-bar")
    look = f"#class-look-{panel[1:].removesuffix('-text')}"
    if page.locator(look).is_visible():  # the lesson's note for the panel is read, not cut (D10)
        inside(page, look)
        note_top = page.locator(look).bounding_box()["y"]
        answer = page.locator("#answer").bounding_box()
        assert answer["y"] + answer["height"] <= note_top + 1, (answer, note_top)  # nothing under it
        assert page.locator(look).evaluate("e => parseFloat(getComputedStyle(e).fontSize)") >= LABEL_PX
    assert smallest_label(page, panel) >= LABEL_PX * 0.95, (panel, smallest_label(page, panel))


# Gradio's own progress ("processing | 1.9/0.3s", its ETA bar) drawn inside the step bar (D8): every
# change to the bar is checked as it happens, so a flash between two beats is caught too.
WATCH_PROGRESS = """() => {
  window.sfProgressSeen = [];
  const look = () => {
    const bar = document.querySelector("#step-bar");
    if (!bar) return;
    const tracker = ".progress-text, .meta-text, .meta-text-center, .eta-bar, .progress-level";
    for (const e of bar.querySelectorAll(tracker)) {
      let shown = e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden";
      for (let a = e; shown && a && a !== bar; a = a.parentElement) {
        shown = Number(getComputedStyle(a).opacity) > 0.05;  // Gradio hides a done tracker by opacity
      }
      if (shown) {
        const near = e.parentElement.closest("[id]");
        const where = near ? "#" + near.id : "";
        window.sfProgressSeen.push(where + " " + e.className + ": " + e.textContent.trim());
      }
    }
  };
  const all = {subtree: true, childList: true, characterData: true, attributes: true};
  new MutationObserver(look).observe(document.body, all);
}"""


def shot(page, name: str) -> None:
    where = os.environ.get("SPECFUSE_SHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"))


def test_a_teacher_walks_a_recorded_lesson_by_keyboard_alone_at_1280x720(browser, served):
    address, loaded = served
    recorded = load_lesson(SLUG)
    with opened(browser, address) as page:
        page.set_viewport_size({"width": 1280, "height": 720})
        # Open the lesson from the gallery: its card's button by key.
        page.locator(f"#class-open-{SLUG}").focus()
        key(page, "Enter")
        page.wait_for_selector("#class-lesson", state="visible")
        page.wait_for_function("document.querySelector('#status').innerText.includes('recorded run')")
        page.wait_for_timeout(300)
        inside(page, "#class-lesson", scrolled=True)  # the lesson comes into view (1b)
        page.evaluate(WATCH_PROGRESS)
        shot(page, "lesson-opened-1280")
        # Step mode by key: Space on the box checks it, and the recorded run waits before round 1.
        page.locator("#step-mode input").focus()
        key(page, "Space")
        wait_note(page, "recorded run")
        assert page.locator("#step-mode input").is_checked()
        assert "Play" in page.inner_text("#step-play")  # Space was the box's, not Play's

        # → shows round 1's drafts and the guess, numbered; 2 picks the second guess.
        key(page, "PageDown")
        wait_note(page, "drafts are in")
        page.wait_for_selector("#step-guess input[type=radio]")
        radios = page.locator("#step-guess input[type=radio]")
        assert radios.count() == len(recorded.rounds[0].candidates)
        names = set(radios.evaluate_all("rs => rs.map(r => r.name)"))
        assert len(names) == 1  # one radio group: the arrows move within it
        assert page.locator("#step-guess label").first.inner_text().startswith("1. ")
        key(page, "2")
        page.wait_for_function("document.querySelectorAll('#step-guess input[type=radio]')[1].checked")
        key(page, "ArrowDown")  # within the group: the third guess, no step
        page.wait_for_function("document.querySelectorAll('#step-guess input[type=radio]')[2].checked")
        key(page, "Space")  # on a radio: never Play
        page.wait_for_timeout(300)
        assert "Play" in page.inner_text("#step-play") and "drafts are in" in note(page)
        picked = recorded.rounds[0].candidates[2].member
        key(page, "PageDown")  # Reveal
        wait_note(page, "won")
        right = recorded.rounds[0].winner.text == recorded.rounds[0].candidates[2].text
        assert ("✓ Your guess was right" if right else "✗ You guessed") in note(page), (picked, note(page))
        assert "1 guess right" in note(page) or "0 of 1" in note(page)

        # Round 2 by the clicker's key, then back, End, Home.
        key(page, "PageDown")
        wait_note(page, "drafts are in")
        key(page, "PageDown")
        wait_round(page, 2)
        wait_note(page, "Round 2:")
        page.evaluate("document.activeElement && document.activeElement.blur()")
        key(page, "PageUp")
        wait_round(page, 1)
        key(page, "End")
        wait_round(page, 2)
        key(page, "Home")
        wait_round(page, 1)
        key(page, "End")
        wait_round(page, 2)

        # Play and Pause with Space (nothing focused).
        key(page, "Space")
        page.wait_for_function("document.querySelector('#step-play').innerText.includes('Pause')")
        key(page, "Space")
        page.wait_for_function("document.querySelector('#step-play').innerText.includes('Play')")
        page.wait_for_timeout(500)  # a beat already under way lands

        # The presenter view: each panel in the viewport, its labels large.
        key(page, "p")
        page.wait_for_function("document.body.classList.contains('sf-presenter')")
        page.wait_for_timeout(600)
        shot(page, "presenter-1280-candidates")
        presenting(page, "#candidates-text")
        for digit, panel in (("2", "#matrix"), ("3", "#weights")):
            key(page, digit)
            page.wait_for_function(f"document.body.dataset.sfPanel === '{panel[1:]}'")
            page.wait_for_timeout(600)
            shot(page, f"presenter-1280-{panel[1:]}")
            presenting(page, panel)
        # → plays on in the view; the drafts beat and the verdict fit too.
        before = slider(page)
        key(page, "ArrowRight")
        wait_note(page, "drafts are in") if before == 2 else None
        key(page, "ArrowRight")
        wait_note(page, "won")
        presenting(page, "#weights")
        shot(page, "presenter-1280-verdict")

        # The round slider by key replays the round it moves to.
        page.locator("#round input[type=range]").focus()
        shown = slider(page)
        key(page, "ArrowLeft")
        wait_round(page, shown - 1)
        page.wait_for_function(
            f"document.querySelector('#status').innerText.startsWith('Round {shown - 1} ')"
        )
        page.evaluate("document.activeElement && document.activeElement.blur()")

        # ? shows the key map; Esc hides it. b blacks the screen; any key brings it back.
        key(page, "?")
        page.wait_for_selector("#sf-keymap", state="visible")
        assert "PageDown" in page.inner_text("#sf-keymap")
        shot(page, "keymap-1280")
        key(page, "Escape")
        page.wait_for_selector("#sf-keymap", state="hidden")
        key(page, "b")
        page.wait_for_selector("#sf-black", state="visible")
        key(page, "x")
        page.wait_for_selector("#sf-black", state="hidden")

        if os.environ.get("SPECFUSE_SHOTS"):
            page.set_viewport_size({"width": 1920, "height": 1080})
            page.wait_for_timeout(800)
            shot(page, "presenter-1920-weights")
        key(page, "Escape")
        page.wait_for_function("!document.body.classList.contains('sf-presenter')")
        seen = page.evaluate("[...new Set(window.sfProgressSeen)]")
        assert seen == [], seen[:10]  # no Gradio progress in the step bar (D8)
    assert loaded == []  # no model loaded, the whole lesson long
