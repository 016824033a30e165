"""Hostile traces in a real browser: nothing from an uploaded trace becomes an element, a link or a
request. Gradio renders gr.Error's text as HTML: a trace's unknown key, a config value or a member
name put live links, bold text and a tracking image into the toasts (issue 24, item 2)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ..conftest import TINY, tiny_member
from ..helpers_browser import launched, opened, page_on, run_and_wait, upload, use_members
from ..scripted import ScriptedMember, scripted_trace

pytestmark = pytest.mark.browser

ATTACKER = "https://attacker.example/"
LINK = f'<a href="{ATTACKER}">click me</a>'


@pytest.fixture(scope="module")
def beacon():
    """A local HTTP server that counts the requests a page sends it (an <img> beacon's)."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def address(tmp_path_factory):
    members = {name: tiny_member(name) for name in TINY}
    members["quick"] = ScriptedMember("quick", [" quick fox"] * 50, len)
    members["slow-draft"] = ScriptedMember("slow-draft", [" slow tortoise"] * 50, len, draft_delay=2.0)
    cache = tmp_path_factory.mktemp("gradio")
    build = {"default_models": TINY[:2], "defaults": {"segment_len": 4, "max_new_tokens": 24}}
    with launched(cache, members, **build) as url:
        yield url, cache


@pytest.fixture
def page(browser, address, monkeypatch):
    with page_on(browser, *address, monkeypatch) as page:
        yield page


def toasts(page, n: int) -> str:
    """The text of the page's error toasts, once there are n of them."""
    page.wait_for_function(f"document.querySelectorAll('.toast-body').length >= {n}")
    page.wait_for_timeout(300)  # an image in a toast would have been requested by now
    return "\n".join(page.locator(".toast-body").all_inner_texts())


def fresh(page) -> None:
    """The page again: one upload per page (the file box holds the last file)."""
    page.reload()
    page.wait_for_selector("#prompt textarea")


def nothing_came_from_the_trace(page, hits: list[str]) -> None:
    assert page.locator("a[href*='attacker']").count() == 0
    assert page.locator(".toast-body a, .toast-body b, .toast-body img, .toast-body style").count() == 0
    assert page.locator("img[src*='beacon']").count() == 0
    assert page.locator("#status a, #status img").count() == 0
    assert hits == []
    assert page.dialogs == []


def test_crafted_traces_put_no_element_link_or_request_in_the_page(page, beacon, tmp_path):
    server, hits = beacon
    image = f"<img src={server}/beacon>"
    good = tmp_path / "good.json"
    scripted_trace(good, {"a": ["x "] * 4, "b": ["y "] * 4})
    doc = json.loads(good.read_text())

    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**doc, LINK: 1}))
    upload(page, unknown)
    assert LINK in toasts(page, 1)  # shown as the text it is
    nothing_came_from_the_trace(page, hits)

    bold = tmp_path / "bold.json"
    bold.write_text(json.dumps({**doc, "config": {**doc["config"], "score": "<b>bold</b>"}}))
    fresh(page)
    upload(page, bold)
    assert "<b>bold</b>" in toasts(page, 1)
    nothing_came_from_the_trace(page, hits)

    # A valid trace whose members are named with HTML and Markdown: it replays, and Branch (which
    # cannot load such members) says so, every name as text.
    names = tmp_path / "names.json"
    markdown = f"[click]({ATTACKER})"
    scripted_trace(names, {LINK: ["x "] * 4, image: ["y "] * 4, markdown: ["z "] * 4}, rounds=3)
    fresh(page)
    upload(page, names)
    page.wait_for_function("document.querySelector('#status').innerText.includes('replayed')")
    page.locator("#what-if button").first.click()
    page.click("#branch")
    text = toasts(page, 1)
    assert "cannot load them" in text and image in text and LINK in text and markdown in text
    nothing_came_from_the_trace(page, hits)
    assert page.locator("#branch-view .sf-compare").count() == 0  # no view of an earlier branch either


def type_into(page, selector: str, text_js: str) -> None:
    """Put text into a textbox as a browser's input would, lone surrogates and all (once the box is
    on the page: a panel opened by the click before may still be rendering it)."""
    page.wait_for_selector(selector, state="visible")
    page.evaluate(
        f"(() => {{ const t = document.querySelector('{selector}'); t.value = {text_js};"
        " t.dispatchEvent(new Event('input', {bubbles: true})); })()"
    )


def test_a_prompt_and_a_typed_segment_with_a_lone_surrogate_get_a_clear_message(page):
    """A lone surrogate (U+D800) reached the tokenizers: `TypeError: TextEncodeInput must be …`
    (issue 24, item 10)."""
    type_into(page, "#prompt textarea", "'Hello \\ud800 there'")
    page.click("#run")
    text = toasts(page, 1)
    assert "prompt holds" in text and "lone surrogate" in text and "TextEncodeInput" not in text
    fresh(page)
    run_and_wait(page, "Hello there")
    page.locator("#what-if button").first.click()
    type_into(page, "#branch-text textarea", "'typed \\udfff'")
    page.click("#branch")
    text = toasts(page, 1)
    assert "lone surrogate" in text and "TextEncodeInput" not in text


def test_a_stopped_run_before_round_1_keeps_no_earlier_answer(page):
    """After Stop before round 1, the Answer panel kept the previous run's text under "Nothing to
    keep" (issue 24, item 10)."""
    run_and_wait(page, "Hello there")
    page.locator("#plain-box button").first.click()
    assert page.locator("#answer .token").count() >= 1 and page.input_value("#plain textarea") != ""
    use_members(page, "quick", "slow-draft")  # slow-draft takes 2 s: round 1 is still being drafted
    page.click("#run")
    page.wait_for_function("document.querySelector('#status').innerText.includes('1 of 2 candidates in')")
    page.click("#stop")
    page.wait_for_function("document.querySelector('#status').innerText.includes('before round 1')")
    assert page.locator("#answer .token").count() == 0 and page.input_value("#plain textarea") == ""
    assert not page.locator("#download").is_visible()


def test_the_members_list_shows_a_served_members_name_and_no_url(browser, tmp_path):
    """The Members dropdown listed raw specs, `?tokenizer=…&timeout=5` and all (issue 24, item 4)."""
    spec = "llama-server:http://10.9.8.7:8080#served-one?tokenizer=/srv/t&timeout=5"
    build = {"default_models": [TINY[0], "served-one"], "served": {"served-one": spec}}
    with (
        launched(tmp_path / "gradio", dict.fromkeys([*TINY, "served-one"]), **build) as url,
        opened(browser, url, "#models input[role=combobox]") as page,
    ):
        page.locator("#models input[role=combobox]").click()
        page.wait_for_selector("ul[role=listbox]")
        shown = page.inner_text("#models") + page.inner_text("ul[role=listbox]")
        assert "served-one" in shown and "10.9.8.7" not in shown and "tokenizer" not in shown
        assert "10.9.8.7" not in page.content()
