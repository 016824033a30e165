"""The browser tests' side of Playwright: Debian's chromium (a module that imports this is skipped
where chromium or playwright is missing), the app launched on a free port (helpers_app.launched),
pages opened on it, and what a user does there (upload a trace, pick members, run, show a round).
The `browser` fixture is conftest's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .chromium import executable
from .helpers_app import launched as launched  # re-exported: the browser tests launch the app from here
from .scripted import ScriptedMember, prefers

if not executable().exists():
    pytest.skip(
        "needs Debian's chromium (apt-get install -y chromium chromium-headless-shell)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (pip install)")

TIMEOUT_MS = 60_000
# A Gradio page's loads have come back: the language's (studio/i18n.PAGE_LANG_JS) and, where the page has
# lesson cards, the link's (studio/gallery.LINK_LOADED). Other pages (a handout) have none.
LOADED = """(() => { const d = document.documentElement.dataset;
  if (!document.querySelector('gradio-app')) return true;
  return d.sfLoaded === '1' && (!document.querySelector('[id^=class-open-]') || d.sfLinked === '1'); })()"""


def until(page, predicate: str, *shown: str) -> None:
    """wait_for_function(predicate), which on a timeout says what the `shown` selectors held then
    (Playwright's own error says only that the time ran out)."""
    try:
        page.wait_for_function(predicate)
    except sync_api.TimeoutError:
        held = {s: page.locator(s).inner_text() if page.locator(s).count() else None for s in shown}
        raise AssertionError(f"timed out waiting for {predicate}; the page held {held}") from None


def upload(page, path: Path) -> None:
    page.locator("#replay button").first.click()  # open the accordion
    page.locator("#upload input[type=file]").set_input_files(str(path))


def open_page(browser, address: str, ready: str = "#prompt textarea", **options):
    """A new page at `address` once `ready` is on it (timeouts TIMEOUT_MS; dialogs dismissed and kept
    in page.dialogs), in the browser's context for these `options` (new_context's; a 1400×1000
    viewport unless they say). A page shares its context's HTTP and compiled-script caches with the
    module's earlier pages, which makes it about a fifth cheaper than a fresh context; a test that needs
    fresh storage makes its own context. The caller closes the page (or lets `opened` do it)."""
    page = context_for(browser, {"viewport": {"width": 1400, "height": 1000}} | options).new_page()
    try:
        page.set_default_timeout(TIMEOUT_MS)
        page.dialogs = []
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        page.goto(address)
        page.wait_for_selector(ready)
        # The page's loads have come back: what they send would otherwise overwrite what a first click
        # shows (under load a lesson opened by a click lost its status line to the load's empty one,
        # and the test waited for it in vain).
        page.wait_for_function(LOADED, polling=100)
    except BaseException:
        page.close()
        raise
    return page


def fill_kept(page, selector: str, text: str) -> None:
    """fill() a text box and leave it (Tab: its change lands before a click reads the form), again if the
    page dropped the text: a box in an accordion opened a moment ago may still be mounting, and Gradio's
    mount sets its first value over what was typed (a first page, about one time in three)."""
    for _ in range(3):
        page.fill(selector, text)
        page.press(selector, "Tab")
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        if page.locator(selector).input_value() == text:
            return
    raise AssertionError(f"{selector} kept dropping the text typed into it")


def context_for(browser, options: dict):
    """The browser's one context for `options`, made at its first use (closed with the browser)."""
    contexts = browser.__dict__.setdefault("specfuse_contexts", {})
    key = json.dumps(options, sort_keys=True)
    if key not in contexts:
        contexts[key] = browser.new_context(**options)
    return contexts[key]


@contextlib.contextmanager
def opened(browser, address: str, ready: str = "#prompt textarea", **options) -> Iterator:
    """open_page's page, closed afterwards."""
    page = open_page(browser, address, ready, **options)
    try:
        yield page
    finally:
        page.close()


def pick(page, member: str) -> None:
    box = page.locator("#models input[role=combobox]")
    box.click()
    box.fill(member)
    page.keyboard.press("Enter")
    page.keyboard.press("Escape")


def use_members(page, *names: str) -> None:
    while page.locator("#models .token-remove").count():
        page.locator("#models .token-remove").first.click()
    for name in names:
        pick(page, name)


@contextlib.contextmanager
def page_on(browser, address: str, cache: Path, monkeypatch, **options) -> Iterator:
    """opened's page on an app a module launched with its Gradio cache in `cache`: the test's own
    cache (conftest's, per test) is pointed back at it, or the files the page uploads would move."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    with opened(browser, address, **options) as page:
        yield page


def run_and_wait(page, prompt: str) -> str:
    """Run `prompt` with the members picked and wait for the run's end: the status line."""
    page.fill("#prompt textarea", prompt)
    page.click("#run")
    page.wait_for_function("document.querySelector('#status').innerText.includes('stopped:')")
    return page.inner_text("#status")


def show_round(page, k: int) -> None:
    """Round k on the panels, as the round number's box shows it."""
    number = page.locator("#round input[type=number]")
    number.fill(str(k))
    number.blur()
    page.wait_for_function(f"document.querySelector('#status').innerText.startsWith('Round {k} ')")


def scripted_pair(tmp_path_factory, b_drafts: str = "x "):
    """A module fixture's body (the lesson and room tests'): the app on two scripted members, a
    drafting "x " and b `b_drafts`, both scoring "x " highest (a's candidates win where b's differ),
    a picked; its address and the names its loader was asked for, in order (a recorded lesson
    loads none)."""
    members = {m: ScriptedMember(m, [text] * 9, prefers("x ")) for m, text in (("a", "x "), ("b", b_drafts))}
    loaded: list[str] = []

    def loader(name, device, progress):
        loaded.append(name)
        return members[name]

    with launched(tmp_path_factory.mktemp("gradio"), members, loader, default_models=["a"]) as address:
        yield address, loaded
