"""The exported handout in a real browser, opened from file:// with every other request blocked and
recorded: the keys step through the rounds, space plays and pauses, a hostile trace stays text,
and the page asks the network for nothing (nor would it, were a load slipped into it)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from specfuse import Ensemble, EnsembleConfig, Trace, load_trace
from specfuse.handout import trace_html
from specfuse.handout.keys import HANDOUT, key_rows

from ..helpers_browser import TIMEOUT_MS, sync_api
from ..helpers_handout import (
    HOSTILE_DRAFTS,
    HOSTILE_MEMBERS,
    HOSTILE_PROMPT,
    XSS_SCRIPT,
    hostile_trace,
    long_trace,
)
from ..scripted import ScriptedMember, prefers

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT / "assets" / "example-gsm8k-trace.json"


@contextlib.contextmanager
def offline(browser, path: Path) -> Iterator:
    """A page at `path` (file://) in a fresh context where only file: requests go through. Kept on
    the page: `attempts`, every non-file request it tried (a load the page's policy blocks too);
    `blocked`, those the policy blocked; `requests`, those that got past it to the network layer
    (all aborted there); and the dialogs (dismissed) and script errors."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    requests: list[str] = []

    def guard(route) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            requests.append(route.request.url)
            route.abort()

    def failed(request) -> None:
        if "csp" in (request.failure or "").lower():
            page.blocked.append(request.url)

    try:
        context.route("**/*", guard)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.requests, page.attempts, page.blocked, page.dialogs, page.errors = requests, [], [], [], []
        page.on("request", lambda r: None if r.url.startswith("file:") else page.attempts.append(r.url))
        page.on("requestfailed", failed)
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.goto(path.as_uri())
        yield page
    finally:
        context.close()


def text(page, selector: str) -> str:
    """An element's text exactly (textContent: white space as it is)."""
    return page.eval_on_selector(selector, "e => e.textContent")


def test_the_keys_step_through_the_rounds_and_space_plays_and_pauses(browser, tmp_path):
    trace = load_trace(GSM8K)
    n = len(trace.rounds)
    path = tmp_path / "run.html"
    path.write_text(trace_html(trace), encoding="utf-8")
    with offline(browser, path) as page:
        assert text(page, "#counter") == f"round 1 of {n}"
        assert text(page, "#answer") == trace.rounds[0].text
        assert text(page, "#prompt") == trace.prompt
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        assert text(page, "#counter") == f"round 3 of {n}"
        assert text(page, "#answer") == trace.rounds[2].text
        assert text(page, "#answer .seg.current") == trace.rounds[2].winner.text
        page.keyboard.press("ArrowLeft")
        assert text(page, "#counter") == f"round 2 of {n}"
        assert text(page, "#answer") == trace.rounds[1].text
        r = trace.rounds[1]
        assert text(page, "#candidates tr.won td.text") == r.winner.text
        assert page.locator("#matrix td.cell").count() == len(r.verifiers) * len(r.candidates)
        assert text(page, "#matrix td.cell") == f"{r.scores[0][0]:.2f}"
        assert page.locator("#weights polyline").count() >= len(trace.members)
        page.keyboard.press("PageDown")
        assert text(page, "#counter") == f"round 3 of {n}"
        page.select_option("#pace", "1")  # the quickest pace, then space plays
        page.keyboard.press(" ")
        assert text(page, "#play-state") == "playing"
        sync_api.expect(page.locator("#counter")).to_have_text(f"round 4 of {n}")  # within a few s
        page.keyboard.press(" ")
        assert text(page, "#play-state") == "paused"
        stopped_at = text(page, "#counter")
        page.wait_for_timeout(1500)  # more than a round at this pace: paused, it stays
        assert text(page, "#counter") == stopped_at
        page.click("#back")  # the buttons, and Space on a focused button: that button's (issue 53)
        at = int(stopped_at.split()[1])
        assert text(page, "#counter") == f"round {at - 1} of {n}"
        page.keyboard.press(" ")  # Back again, never Play while a control has the focus
        assert text(page, "#counter") == f"round {at - 2} of {n}" and text(page, "#play-state") == "paused"
        page.evaluate("document.activeElement.blur()")
        page.keyboard.press(" ")
        assert text(page, "#play-state") == "playing"
        page.click("#pause")
        assert text(page, "#play-state") == "paused"
        page.keyboard.press("End")
        assert text(page, "#answer") == trace.rounds[-1].text
        assert page.errors == [] and page.dialogs == []
        assert page.attempts == [] and page.requests == []


def test_a_hostile_trace_is_shown_as_text_and_runs_nothing(browser, tmp_path):
    trace = hostile_trace()
    path = tmp_path / "hostile.html"
    path.write_text(trace_html(trace, title=XSS_SCRIPT), encoding="utf-8")
    with offline(browser, path) as page:
        assert text(page, "#title") == XSS_SCRIPT
        assert page.title() == XSS_SCRIPT
        assert text(page, "#prompt") == HOSTILE_PROMPT
        assert text(page, "#answer") == HOSTILE_DRAFTS[0]
        legend = page.locator("#legend span:not(.swatch)").all_text_contents()
        assert legend == list(HOSTILE_MEMBERS)
        cells = page.locator("#candidates td.text").all_text_contents()
        assert cells == list(HOSTILE_DRAFTS)
        for _ in range(len(trace.rounds)):  # every round's panels drawn, the exits and the lone draft
            page.keyboard.press("ArrowRight")
        assert text(page, "#counter") == f"round {len(trace.rounds)} of {len(trace.rounds)}"
        assert "was not verified: a lone draft" in text(page, "#matrix")
        assert page.locator("#exits tr").count() == 3  # the header and two exits
        injected = page.evaluate(
            "() => [document.querySelectorAll('img, iframe, object, embed, b, link').length,"
            " document.scripts.length]"
        )
        assert injected == [0, 2]  # the data and the player, nothing of the trace's
        assert page.dialogs == [] and page.errors == []
        assert page.attempts == [] and page.requests == []


def test_a_long_answer_scrolls_in_its_box_to_the_round_shown_and_the_page_stays_put(browser, tmp_path):
    trace = long_trace(rounds=20, members=3, chars=400)
    path = tmp_path / "long.html"
    path.write_text(trace_html(trace), encoding="utf-8")
    with offline(browser, path) as page:
        page.keyboard.press("End")
        assert text(page, "#counter") == "round 20 of 20"
        seen = page.evaluate(
            """() => {
                const box = document.getElementById("answer").getBoundingClientRect();
                const seg = document.querySelector("#answer .seg.current").getBoundingClientRect();
                return [window.scrollY, document.getElementById("answer").scrollTop > 0,
                        seg.top >= box.top - 1 && seg.bottom <= box.bottom + 1];
            }"""
        )
        assert seen == [0, True, True]
        assert page.attempts == [] and page.errors == []


def test_the_policy_stops_a_load_slipped_into_the_page_and_the_guard_sees_one(browser, tmp_path):
    """The controls: an image slipped into the page is blocked by the page's own policy before it
    reaches the network; without the policy the same image gets there and is recorded, so the empty
    records above mean something."""
    beacon = "http://127.0.0.1:9/beacon.png"
    slipped = tmp_path / "slipped.html"
    page_html = trace_html(load_trace(GSM8K))
    slipped.write_text(page_html.replace("<body>", f'<body><img src="{beacon}">', 1), encoding="utf-8")
    with offline(browser, slipped) as page:
        sync_api.expect(page.locator("#counter")).to_have_text(re.compile(r"round 1 of \d+"))
        page.wait_for_function("() => document.images[0].complete")
        assert page.attempts == [beacon] and page.blocked == [beacon] and page.requests == []
    bare = tmp_path / "bare.html"
    bare.write_text(f'<!DOCTYPE html><html><body><img src="{beacon}"></body></html>', encoding="utf-8")
    with offline(browser, bare) as page:
        page.wait_for_function("() => document.images[0].complete")
        assert page.requests == [beacon] and page.blocked == []


def scripted_trace(names: tuple[str, ...], prompt: str, rounds: int = 2) -> Trace:
    members = [ScriptedMember(m, [f"draft{i} "] * 9, prefers("draft0 ")) for i, m in enumerate(names)]
    config = EnsembleConfig(max_rounds=rounds, exit=False)
    return Trace(prompt, names, config, tuple(Ensemble(members, config).stream(prompt)))


def test_a_5000_character_name_and_a_bidi_override_stay_in_their_place(browser, tmp_path):
    """Issue 53, D5 and D6: a member named with 5,000 characters made the page 188,767 px wide; a
    right-to-left override in the prompt turned "gnp.exe" into "exe.png" on screen."""
    long_name = "m" * 5000
    trace = scripted_trace((long_name, "b"), "open the file \u202egnp.exe now")
    path = tmp_path / "hostile.html"
    path.write_text(trace_html(trace), encoding="utf-8")
    with offline(browser, path) as page:
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 2 * 1400, width
        legend = page.locator("#legend bdi").first
        assert legend.get_attribute("title") == long_name and len(legend.inner_text()) <= 60
        # The override is shown as what it is, and the text after it reads left to right on screen.
        assert "[U+202E]gnp.exe" in text(page, "#prompt")
        order = page.evaluate(
            """() => {
              const node = document.querySelector("#prompt").firstChild, s = node.textContent;
              const x = (i) => { const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
                                 return r.getBoundingClientRect().left; };
              const g = s.indexOf("gnp.exe");
              return [x(g), x(g + 4), x(g + 6)];
            }"""
        )
        assert order == sorted(order), order  # g, then e of ".exe", then its last e: left to right
        assert page.errors == [] and page.requests == []


def test_the_handouts_keys_come_from_the_one_key_map_and_a_paused_run_says_so(browser, tmp_path):
    trace = scripted_trace(("a", "b"), "go", rounds=3)  # max_rounds=3 ends it: make it look paused
    paused = Trace(trace.prompt, trace.members, trace.config, trace.rounds[:2])
    path = tmp_path / "paused.html"
    path.write_text(trace_html(paused), encoding="utf-8")
    with offline(browser, path) as page:
        assert "paused at round 2" in text(page, "#summary")
        page.keyboard.press("?")
        rows = page.locator("#keymap-table tr").all_inner_texts()
        assert [r.split("\t")[0] for r in rows] == [keys for keys, _ in key_rows(HANDOUT)]
        page.keyboard.press("Escape")
        assert page.locator("#keymap").is_hidden()
        page.keyboard.press("b")
        assert page.locator("#black").is_visible()
        page.keyboard.press("PageDown")  # any key brings the page back, and does only that
        assert page.locator("#black").is_hidden() and text(page, "#counter") == "round 1 of 2"
        page.keyboard.press("PageDown")
        assert text(page, "#counter") == "round 2 of 2"


def test_the_class_votes_show_beside_the_candidates_as_text(browser, tmp_path):
    trace = hostile_trace(rounds=2)
    votes = {HOSTILE_DRAFTS[0]: 3, HOSTILE_DRAFTS[1]: 5}
    path = tmp_path / "room.html"
    path.write_text(trace_html(trace, room=[{"k": 1, "votes": votes}]), encoding="utf-8")
    with offline(browser, path) as page:
        heads = page.locator("#candidates th").all_text_contents()
        assert "the class" in heads
        texts = page.locator("#candidates td.text").all_text_contents()
        column = heads.index("the class")
        counts = [
            page.locator("#candidates tr").nth(i + 1).locator("td").nth(column).text_content()
            for i in range(len(texts))
        ]
        assert counts == [str(votes.get(t, 0)) for t in texts]
        assert text(page, "#room-note") == "The class: 3 of 8 votes guessed the winner."
        page.keyboard.press("ArrowRight")  # round 2: no votes, no column, no note
        assert "the class" not in page.locator("#candidates th").all_text_contents()
        assert text(page, "#room-note") == ""
        assert page.dialogs == [] and page.errors == [] and page.requests == []
