"""A teacher's links in a real browser at a projector's 1280×720 (issue 53, items 5 and 6): the app
opened at `/?lesson=NAME&round=K` shows that lesson at round K (a bad link: a note, as text, and the
page as usual); the offline handout opened at `#round=K` shows round K and keeps its fragment in
step with the round shown; and the page with a lesson open has no button, slider or radio without a
name in chromium's accessibility tree."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from specfuse.handout import trace_html
from specfuse.lessons import load_lesson

from .. import helpers_browser
from ..helpers_browser import launched
from ..scripted import ScriptedMember, prefers

pytestmark = pytest.mark.browser

SLUG = "weak-member-exits"  # 10 recorded rounds
NAMED = ("button", "slider", "radio", "checkbox", "spinbutton", "combobox", "textbox")


@pytest.fixture(scope="module")
def address(tmp_path_factory):
    members = {m: ScriptedMember(m, ["x "] * 9, prefers("x ")) for m in ("a", "b")}
    with launched(tmp_path_factory.mktemp("gradio"), members, default_models=["a"]) as served:
        yield served.rstrip("/")


def opened(browser, url: str, ready: str = "#prompt textarea"):
    """A page at `url` at a projector's 1280×720 from its first paint on."""
    return helpers_browser.opened(browser, url, ready, viewport={"width": 1280, "height": 720})


def wait_round(page, k: int) -> None:
    page.wait_for_function(f"document.querySelector('#round input[type=number]').value === '{k}'")


def wait_status(page, text: str) -> None:
    page.wait_for_function(
        "(t) => (document.querySelector('#status')?.innerText || '').includes(t)", arg=text
    )


WHERE = """function () {
  const near = this.parentElement && this.parentElement.closest("[id]");
  const tag = this.tagName.toLowerCase() + (this.id ? "#" + this.id : "");
  return tag + "." + String(this.className).split(" ")[0] + " in #" + (near ? near.id : "");
}"""


def unnamed_controls(page) -> list[str]:
    """Every control chromium's accessibility tree holds with no name (role, and its DOM id if any)."""
    cdp = page.context.new_cdp_session(page)
    nodes = cdp.send("Accessibility.getFullAXTree")["nodes"]
    bare = []
    for node in nodes:
        role = node.get("role", {}).get("value", "")
        if node.get("ignored") or role not in NAMED or str(node.get("name", {}).get("value", "")).strip():
            continue
        where = ""
        if "backendDOMNodeId" in node:  # where it is: its tag and the nearest element with an id
            held = cdp.send("DOM.resolveNode", {"backendNodeId": node["backendDOMNodeId"]})["object"]
            where = cdp.send(
                "Runtime.callFunctionOn",
                {"objectId": held["objectId"], "functionDeclaration": WHERE, "returnByValue": True},
            )["result"]["value"]
        bare.append(f"{role} {where}")
    cdp.detach()
    return bare


def test_a_link_opens_its_lesson_at_its_round_and_every_control_has_a_name(browser, address):
    with opened(browser, f"{address}/?lesson={SLUG}&round=3") as page:
        wait_round(page, 3)
        wait_status(page, "Round 3 ")
        assert page.inner_text("#status").startswith("Round 3 ")
        assert "A weak member exits" in page.inner_text("#class-lesson")
        assert page.locator("#class-run-live").is_visible()
        # The lesson's box is brought into view, as the gallery's Open does.
        page.wait_for_function("document.querySelector('#class-lesson').getBoundingClientRect().top < 720")
        bare = unnamed_controls(page)
        assert not bare, "\n".join(bare)
        # Step mode's bar too, with the room's guess asked (its radios): every control named.
        page.locator("#step-mode input").check()
        page.locator("#step-next").click()  # once enabled: the recorded run steps, no model
        page.wait_for_selector("#step-guess input[type=radio]")
        bare = unnamed_controls(page)
        assert not bare, "\n".join(bare)
        page.locator("#step-mode input").uncheck()
        wait_round(page, 10)  # the recorded run shown whole again
        # The slider moved by hand still replays: the link set a round, not a lock.
        number = page.locator("#round input[type=number]")
        number.fill("5")
        number.press("Enter")
        wait_status(page, "Round 5 ")


def test_a_step_link_opens_step_mode_with_the_rounds_before_its_round_revealed(browser, address):
    """`&step=1`: the box checked, the bar shown, rounds 1–3 revealed; → plays round 4's drafts (the
    room guesses with a key), Reveal decides it: a teacher's slide starts the class at round 4."""
    with opened(browser, f"{address}/?lesson={SLUG}&round=4&step=1") as page:
        wait_round(page, 3)
        wait_status(page, "the rounds before round 4 are shown")
        assert page.locator("#step-mode input").is_checked()
        # The bar may be drawn a moment after the status line (a loaded machine showed the gap).
        page.wait_for_selector("#step-next:not([disabled])", state="visible")
        page.locator("body").click(position={"x": 5, "y": 5})  # the keys act on the page, not a control
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("#step-guess input[type=radio]")
        assert "Round 4" in page.inner_text("#step-note")
        page.keyboard.press("1")  # the room's guess, by its key
        page.wait_for_function("document.querySelector('#step-guess input[type=radio]:checked') !== null")
        page.keyboard.press("PageDown")  # Reveal (→ would move within the guesses, where the focus is)
        wait_round(page, 4)
        assert not page.locator("#step-guess").is_visible()


def test_a_round_beyond_the_lesson_shows_the_nearest_one_and_says_so(browser, address):
    with opened(browser, f"{address}/?lesson={SLUG}&round=99") as page:
        wait_round(page, 10)
        wait_status(page, "round 99 is not one of the lesson")
        assert "round 10 is shown" in page.inner_text("#status")


def test_a_bad_link_is_a_note_shown_as_text_and_the_page_as_usual(browser, address):
    hostile = "<img src=x onerror=window.hit=1>"
    with opened(browser, f"{address}/?lesson={quote(hostile)}&round=2") as page:
        wait_status(page, "is not one of these lessons")
        assert hostile in page.inner_text("#status")  # quoted as text
        assert page.locator("#status img").count() == 0
        assert page.evaluate("window.hit") is None
        assert not page.locator("#class-lesson").is_visible()
        assert page.locator("#class-gallery").is_visible()
    with opened(browser, f"{address}/?lesson={SLUG}&round=three") as page:
        wait_status(page, "“three” is not a whole number")
        assert "A weak member exits" in page.inner_text("#class-lesson")


def test_the_handout_opens_at_its_fragments_round_and_keeps_the_fragment_in_step(browser, tmp_path):
    trace = load_lesson(SLUG)
    n = len(trace.rounds)
    path = tmp_path / "lesson.html"
    path.write_text(trace_html(trace), encoding="utf-8")
    with opened(browser, path.as_uri() + "#round=2", ready="#counter") as page:
        page.wait_for_function("document.querySelector('#counter').textContent !== ''")
        assert page.inner_text("#counter") == f"round 2 of {n}"
        assert page.inner_text("#matrix-note") == "(round 2)"
        assert not page.locator("#link-note").is_visible()
        page.keyboard.press("ArrowRight")
        page.wait_for_function("location.hash === '#round=3'")  # the address to copy onto a slide
        page.evaluate("location.hash = '#round=7'")  # a fragment typed into the address bar
        page.wait_for_function(f"document.querySelector('#counter').textContent === 'round 7 of {n}'")
    bad = (("#round=x<b>", "is not a round"), ("#round=99", f"round 99 is not one of the {n}"))
    for fragment, note in bad:
        with opened(browser, path.as_uri() + fragment, ready="#counter") as page:
            page.wait_for_function("document.querySelector('#counter').textContent !== ''")
            shown = n if "99" in fragment else 1
            assert page.inner_text("#counter") == f"round {shown} of {n}"
            assert note in page.inner_text("#link-note")
            assert page.locator("#link-note b").count() == 0
