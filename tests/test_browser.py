"""The app in a real browser: Playwright drives Debian's chromium (headless; no browser download)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import app
from specfuse import load_trace

from .conftest import TINY_SPECS, tiny_member
from .scripted import ScriptedMember

pytestmark = pytest.mark.browser

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

TINY = list(TINY_SPECS)
XSS_SCRIPT = "<script>alert(1)</script> "
XSS_IMG = "<img src=x onerror=alert(1)> "
TIMEOUT_MS = 60_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    members = {name: tiny_member(name) for name in TINY}
    members["xss-script"] = ScriptedMember(
        "xss-script", [XSS_SCRIPT] * 50, lambda t: 2.0 if "script" in t else 1.0
    )
    members["xss-img"] = ScriptedMember("xss-img", [XSS_IMG] * 50, lambda t: 2.0 if "script" in t else 1.0)
    # One server for the module, so one Gradio cache folder: files outside it are not served.
    cache = tmp_path_factory.mktemp("gradio")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(cache))
        demo = app.build_demo(
            lambda name, device, progress: members[name],
            choices=list(members),
            default_models=TINY[:2],
            defaults={"segment_len": 4, "max_new_tokens": 24},
        )
        _, address, _ = app.serve(demo, port=free_port(), prevent_thread_lock=True)
    try:
        yield address, cache
    finally:
        demo.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, url, monkeypatch):
    address, cache = url
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs
    page.goto(address)
    page.wait_for_selector("#prompt textarea")
    try:
        yield page
    finally:
        context.close()


def pick(page, member: str) -> None:
    box = page.locator("#models input[role=combobox]")
    box.click()
    box.fill(member)
    page.keyboard.press("Enter")
    page.keyboard.press("Escape")


def run_and_wait(page, prompt: str) -> str:
    page.fill("#prompt textarea", prompt)
    page.click("#run")
    page.wait_for_function("document.querySelector('#status').innerText.includes('stopped:')")
    return page.inner_text("#status")


def test_a_user_runs_the_ensemble_replays_a_round_and_downloads_the_trace(page, tmp_path):
    pick(page, "gemma-meta")
    assert page.locator("#models .token").count() == 3
    status = run_and_wait(page, "Hello there")
    assert "Round" in status and "tokens/s" in status
    assert page.locator("#answer .token").count() >= 1
    # Plotly drew both charts: a heatmap and one line per member.
    page.wait_for_selector("#matrix .js-plotly-plot .hm")
    assert page.locator("#weights .js-plotly-plot .scatterlayer .trace").count() >= 3
    assert "✓" in page.inner_text("#candidates")

    with page.expect_download() as download:
        page.click("#download")
    saved = tmp_path / "trace.json"
    download.value.save_as(saved)
    trace = load_trace(saved)
    assert trace.members == tuple(TINY) and trace.prompt == "Hello there"

    # Replay round 1 with the slider's number box (blur releases it).
    number = page.locator("#round input[type=number]")
    number.fill("1")
    number.blur()
    page.wait_for_function("document.querySelector('#status').innerText.startsWith('Round 1 ')")
    page.wait_for_function("document.querySelector('#matrix').innerText.includes('round 1:')")

    # Replay the downloaded trace in a fresh page: no model is loaded for it.
    page.reload()
    page.wait_for_selector("#prompt textarea")
    page.locator("#replay button").first.click()  # open the accordion
    page.locator("#upload input[type=file]").set_input_files(str(saved))
    page.wait_for_function("document.querySelector('#status').innerText.includes('replayed from a trace')")
    page.wait_for_selector("#matrix .js-plotly-plot .hm")
    page.screenshot(path=str(tmp_path / "app.png"), full_page=True)
    assert (tmp_path / "app.png").stat().st_size > 10_000


def test_model_html_is_shown_as_text_everywhere(page):
    while page.locator("#models .token-remove").count():
        page.locator("#models .token-remove").first.click()
    pick(page, "xss-script")
    pick(page, "xss-img")
    page.locator("#compare input[type=checkbox]").check()
    run_and_wait(page, "go")
    page.wait_for_function("document.querySelector('#compare-panel').innerText.includes('xss-img alone')")
    assert page.locator("img[src='x']").count() == 0
    assert (
        page.locator("#answer script, #candidates script, #compare-panel script, #segment script").count()
        == 0
    )
    assert "<script>alert(1)</script>" in page.inner_text("#answer")
    assert "<img src=x onerror=alert(1)>" in page.inner_text("#candidates")
    assert "<script>alert(1)</script>" in page.inner_text("#compare-panel")
    page.locator("#answer .token").first.click()
    page.wait_for_function("document.querySelector('#segment').innerText.includes('round 1')")
    assert page.locator("#segment img, #segment script").count() == 0
    assert page.dialogs == []
