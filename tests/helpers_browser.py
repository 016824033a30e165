"""The browser tests' side of Playwright: Debian's chromium (a module that imports this is skipped
where chromium or playwright is missing), the app launched on a free port, pages opened on it, and
what a user does there (upload a trace, pick members). The `browser` fixture is conftest's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import app

from .conftest import free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
if not CHROMIUM.exists():
    pytest.skip(
        "needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (pip install)")

TIMEOUT_MS = 60_000


def upload(page, path: Path) -> None:
    page.locator("#replay button").first.click()  # open the accordion
    page.locator("#upload input[type=file]").set_input_files(str(path))


@contextlib.contextmanager
def launched(cache: Path, members, loader=None, **build) -> Iterator[str]:
    """The app on a free loopback port serving `members` (through `loader`, or straight from the
    dict), its Gradio cache in `cache` (files outside it are not served), closed afterwards with the
    `schedulers` it was given; `build` goes to app.build_demo. The address."""
    load = loader or (lambda name, device, progress: members[name])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(cache))
        demo = app.build_demo(load, choices=list(members), **build)
        _, address, _ = app.serve(demo, port=free_port(), prevent_thread_lock=True)
    try:
        yield address
    finally:
        demo.close()
        if build.get("schedulers") is not None:
            build["schedulers"].close()


def open_page(browser, address: str, ready: str = "#prompt textarea", **options):
    """A page of a fresh browser context at `address` once `ready` is on it (timeouts TIMEOUT_MS;
    dialogs dismissed and kept in page.dialogs); `options` go to new_context. The caller closes
    page.context (or lets `opened` do it)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, **options)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.dialogs = []
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        page.goto(address)
        page.wait_for_selector(ready)
    except BaseException:
        context.close()
        raise
    return page


@contextlib.contextmanager
def opened(browser, address: str, ready: str = "#prompt textarea", **options) -> Iterator:
    """open_page's page, its context closed afterwards."""
    page = open_page(browser, address, ready, **options)
    try:
        yield page
    finally:
        page.context.close()


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
