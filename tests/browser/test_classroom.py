"""The classroom in a real browser (issue 43): a lesson opens with no model loaded, its notes beside
the panels; Run it live; the presenter view at projector sizes; the lone-draft matrix says so; the
handout and round downloads; and the page asks nothing of any other host."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from specfuse import lessons
from specfuse.lessons import Lesson
from studio.gallery import Shelf

from ..helpers_browser import launched, page_on, show_round
from ..scripted import ScriptedMember, prefers, scripted_rounds

pytestmark = pytest.mark.browser

PANELS = ("#candidates", "#candidates-text", "#matrix", "#weights", "#exits")


SCRIPTED = {"members": ("a", "b", "c"), "settings": {"segment_len": 4, "max_rounds": 4}}
LESSONS = (
    Lesson(
        "winners",
        "Who wins a round",
        "Three members, one answer.",
        {"answer": "every segment is b's colour", "matrix": "the boxed column <b>b</b>"},
        "The verifiers agree: b's candidates win.",
        "Say something good",
        **SCRIPTED,
    ),
    Lesson(
        "exits",
        "Members leave",
        "Losers exit.",
        {"exits": "a and c leave"},
        "Exit saves calls.",
        "go",
        **SCRIPTED,
    ),
)
TRACES = {"winners": scripted_rounds(max_rounds=3), "exits": scripted_rounds(max_rounds=8)}
KEY_ROUNDS = {"winners": 2}


@pytest.fixture(scope="module")
def served_app(tmp_path_factory):
    members = {
        "a": ScriptedMember("a", ["fine "] * 50, prefers("good ")),
        "b": ScriptedMember("b", ["good "] * 50, prefers("good ")),
        "c": ScriptedMember("c", ["junk "] * 50, prefers("good ")),
    }
    loaded: list[str] = []

    def loader(name, device, progress):
        loaded.append(name)
        return members[name]

    cache = tmp_path_factory.mktemp("gradio")
    # The scripted lessons, and the ones specfuse ships (their members are not installed here).
    shelf = Shelf(
        (*LESSONS, *lessons.LESSONS),
        lambda slug: TRACES[slug] if slug in TRACES else lessons.load_lesson(slug),
        lambda slug, trace: KEY_ROUNDS.get(slug) if slug in TRACES else lessons.key_round(slug, trace),
    )
    build = {"default_models": ["a", "b"], "lessons": shelf}
    with launched(cache, members, loader, **build) as address:
        yield address, cache, loaded


@pytest.fixture
def page(browser, served_app, monkeypatch):
    address, cache, _ = served_app
    with page_on(browser, address, cache, monkeypatch, accept_downloads=True) as page:
        page.requested = []
        page.on("request", lambda r: page.requested.append(r.url))
        yield page


def open_lesson(page, slug: str) -> float:
    """Open a lesson's card; the seconds until its recorded run is in the panels."""
    began = time.perf_counter()
    page.click(f"#class-open-{slug}")
    page.wait_for_function("document.querySelector('#status').innerText.includes('recorded run')")
    page.wait_for_selector("#class-lesson", state="visible")
    return time.perf_counter() - began


def shown_panels(page) -> list[str]:
    return [p for p in PANELS if page.locator(p).is_visible()]


def test_a_lesson_opens_with_no_model_loaded_its_notes_beside_the_panels(page, served_app):
    loaded = served_app[2]
    before = len(loaded)
    open_lesson(page, "winners")  # how long it takes is a benchmark's (make_lessons.py --check), not a test's
    assert len(loaded) == before  # no model loaded: the recorded run replays
    trace = TRACES["winners"]
    answer = " ".join(page.locator("#answer .token").all_inner_texts())
    assert answer.split() == trace.rounds[-1].text.split()
    assert page.inner_text("#status").startswith("Round 2 ")  # its key round; the answer stays whole
    assert page.locator("#round input[type=number]").input_value() == "2"
    lesson = page.inner_text("#class-lesson")
    assert "Key takeaway: The verifiers agree: b's candidates win." in lesson
    assert "Prompt: Say something good" in lesson
    # The lesson's notes sit under their panels (its text as text), the others stay hidden.
    assert page.inner_text("#class-look-answer") == "Look for: every segment is b's colour"
    assert page.inner_text("#class-look-matrix") == "Look for: the boxed column <b>b</b>"
    assert not page.locator("#class-look-weights").is_visible()
    # Every panel explains itself, closed until asked.
    for name in ("answer", "candidates", "matrix", "normalization", "weights", "exits"):
        assert page.locator(f"#class-explain-{name}").is_visible()
    assert not page.get_by_text("one column per candidate").is_visible()
    page.locator("#class-explain-matrix button").first.click()
    page.get_by_text("one column per candidate", exact=False).wait_for(state="visible")
    # Another trace (an upload, or a run of one's own) closes the lesson.
    page.fill("#prompt textarea", "hello")
    page.click("#run")
    page.wait_for_selector("#class-lesson", state="hidden")
    assert not page.locator("#class-look-matrix").is_visible()


def test_run_it_live_fills_the_form_from_the_lesson_and_runs_on_its_members(page, served_app):
    open_lesson(page, "winners")
    page.click("#class-run-live")
    page.wait_for_function(
        "document.querySelector('#status').innerText.includes('stopped: rounds')"
        " && !document.querySelector('#status').innerText.includes('recorded run')"
    )
    assert page.locator("#prompt textarea").input_value() == "Say something good"
    page.click("#settings")
    assert page.locator("#setting-segment_len input[type=number]").input_value() == "4"
    assert {"a", "b", "c"} <= set(served_app[2])  # the lesson's members, loaded for the live run
    assert page.inner_text("#status").startswith("Round 4 ")
    assert "Live run of the lesson" in page.inner_text("#class-lesson")
    assert "its answer may differ" in page.inner_text("#class-lesson")  # the lesson's live note


def test_a_shipped_lesson_opens_at_its_key_round_with_no_model_installed(page, served_app):
    loaded = len(served_app[2])
    one = lessons.lesson("weak-member-exits")
    open_lesson(page, one.slug)
    k = lessons.key_round(one.slug, lessons.load_lesson(one.slug))
    assert page.inner_text("#status").startswith(f"Round {k} ")
    assert one.takeaway in page.inner_text("#class-lesson")
    assert page.inner_text("#class-look-exits") == f"Look for: {one.look_for['exits']}"
    assert "gemma3-270m" in page.inner_text("#exits")
    assert not page.locator("#class-look-matrix").is_visible()  # this lesson says nothing of it
    assert len(served_app[2]) == loaded
    # Live, it needs its members: they are not installed here, and the message says so.
    page.click("#class-run-live")
    page.wait_for_selector(".toast-body")
    assert "is not installed here" in page.inner_text(".toast-body")
    assert page.inner_text("#status").startswith(f"Round {k} ")  # the recorded run stays


def test_a_lone_draft_s_matrix_says_so_and_a_branch_lesson_has_its_typed_segment_ready(page):
    open_lesson(page, "exits")
    assert TRACES["exits"].rounds[-1].verified is False and "exits" not in KEY_ROUNDS
    page.wait_for_function("document.querySelector('#matrix').textContent.includes('nothing to verify')")
    assert "one draft this round: nothing to verify" in page.locator("#matrix").text_content()
    assert page.inner_text("#class-look-exits") == "Look for: a and c leave"
    # Another lesson on the same page: one whose key round is a branch, typed by a person.
    one = lessons.lesson("typed-wrong-number")
    page.click(f"#class-open-{one.slug}")  # the status already says "recorded run": wait for the lesson
    page.wait_for_function("document.querySelector('#class-lesson').innerText.includes('typed by a person')")
    page.locator("#what-if button").first.click()
    assert page.locator("#branch-text textarea").input_value() == one.branch[1]
    assert page.locator("#round input[type=number]").input_value() == str(one.branch[0])


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_the_presenter_view_shows_the_answer_large_and_one_panel_and_keeps_the_round(page, size):
    width, height = size
    page.set_viewport_size({"width": width, "height": height})
    open_lesson(page, "exits")
    show_round(page, 3)
    page.locator("body").click(position={"x": 1, "y": 1})  # the focus out of the round's field
    page.keyboard.press("p")
    page.wait_for_function("document.body.classList.contains('sf-presenter')")
    token = page.locator("#answer .token").first
    size = "e => parseFloat(getComputedStyle(e).fontSize)"
    # Gradio's tokens ease into a new size: measure once it has settled.
    page.wait_for_function(f"() => ({size})(document.querySelector('#answer .token')) >= 28", timeout=3_000)
    page.wait_for_timeout(500)
    size_px = token.evaluate(size)
    assert size_px >= 28 and size_px == token.evaluate(size), size_px
    assert page.locator("#answer").is_visible() and page.locator("#status").is_visible()
    assert page.inner_text("#status").startswith("Round 3 ")
    assert shown_panels(page) == ["#candidates-text"]  # the candidates as a 24 px table (issue 53)
    for hidden in ("#models", "#prompt", "#class-gallery", "#summary", "#what-if", "#class-lesson"):
        assert not page.locator(hidden).is_visible(), hidden
    box = page.locator("#answer").bounding_box()
    assert box is not None and box["x"] + box["width"] <= width and box["y"] < height / 3
    page.keyboard.press("2")
    page.wait_for_function("document.body.dataset.sfPanel === 'matrix'")
    assert shown_panels(page) == ["#matrix"]
    page.locator("#presenter-panel label", has_text="exits").click()
    page.wait_for_function("document.body.dataset.sfPanel === 'exits'")
    assert shown_panels(page) == ["#exits"]
    assert page.locator("#class-look-exits").is_visible()  # the lesson's note for that panel stays
    page.click("#presenter-toggle")  # and back: the run and the round shown are as they were
    page.wait_for_function("!document.body.classList.contains('sf-presenter')")
    assert shown_panels(page) == [p for p in PANELS if p != "#candidates-text"]
    assert page.locator("#models").is_visible()
    assert page.inner_text("#status").startswith("Round 3 ")
    assert page.locator("#round input[type=number]").input_value() == "3"
    page.keyboard.press("p")  # the key again, then Esc leaves
    page.wait_for_function("document.body.classList.contains('sf-presenter')")
    page.keyboard.press("Escape")
    page.wait_for_function("!document.body.classList.contains('sf-presenter')")


def test_p_typed_is_text_and_the_page_requests_nothing_from_another_host(page):
    page.locator("#prompt textarea").click()
    page.keyboard.type("pp")  # in a field: text, not the presenter view
    assert page.locator("#prompt textarea").input_value() == "pp"
    assert not page.evaluate("document.body.classList.contains('sf-presenter')")
    open_lesson(page, "winners")
    page.keyboard.press("p")
    page.keyboard.press("3")
    page.keyboard.press("Escape")
    page.locator("#class-explain-weights button").first.click()
    page.wait_for_timeout(500)
    hosts = {
        urlsplit(u).hostname for u in page.requested if urlsplit(u).scheme in ("http", "https", "ws", "wss")
    }
    assert page.requested and hosts <= {"127.0.0.1", "localhost"}, hosts


def test_the_handout_and_the_round_shown_download_as_files(page, tmp_path):
    page.click("#class-handout")  # nothing shown yet: nothing to take home, and it says so
    page.wait_for_selector(".toast-body")
    assert "Nothing to take home yet" in page.inner_text(".toast-body")
    open_lesson(page, "winners")
    with page.expect_download() as download:
        page.click("#class-handout")
    html = tmp_path / "handout.html"
    download.value.save_as(html)
    assert download.value.suggested_filename.endswith(".html")
    text = html.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "SpecFuse run: go" in text  # the trace shown
    with page.expect_download() as download:
        page.click("#class-round-png")
    png = tmp_path / "round.png"
    download.value.save_as(png)
    assert "round2" in download.value.suggested_filename  # the round shown: the lesson's key round
    from PIL import Image

    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1920, 1080)
    assert page.locator("#class-file").is_visible()  # the file stays offered below the buttons


def test_a_lesson_run_live_in_step_mode_steps_by_key_in_the_presenter_view(page):
    """Step mode's box checked, Run it live starts paused; the presenter view keeps the step bar,
    and → plays a round there."""
    open_lesson(page, "winners")
    page.locator("#step-mode input").check()  # the recorded run steps now; Run it live starts a live one
    page.click("#class-run-live")
    page.wait_for_function("document.querySelector('#status').innerText.includes('has not been played')")
    page.wait_for_function("(document.querySelector('#step-note')?.innerText || '').includes('ready')")
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.keyboard.press("p")
    page.wait_for_function("document.body.classList.contains('sf-presenter')")
    assert page.locator("#step-next").is_visible() and not page.locator("#models").is_visible()
    page.keyboard.press("ArrowRight")  # the drafts of round 1 (Reveal waits for them: wait too)
    page.wait_for_function(
        "(document.querySelector('#step-note')?.innerText || '').includes('drafts are in')"
    )
    page.keyboard.press("ArrowRight")  # the verdict
    page.wait_for_function("document.querySelector('#answer').innerText.includes('good')")
    assert page.inner_text("#status").startswith("Round 1 ")
    assert "Live run of the lesson" in page.evaluate("document.querySelector('#class-lesson').innerText")
