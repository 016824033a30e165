"""The app in a real browser: Playwright drives Debian's chromium (headless; no browser download)."""

from __future__ import annotations

import time

import pytest

from specfuse import load_trace

from ..conftest import TINY, tiny_member
from ..helpers_browser import (
    fill_kept,
    launched,
    opened,
    page_on,
    pick,
    run_and_wait,
    show_round,
    until,
    upload,
    use_members,
)
from ..helpers_eval import eval_folder
from ..scripted import ScriptedMember, SlowMember, scripted_trace

pytestmark = pytest.mark.browser

XSS_SCRIPT = "<script>alert(1)</script> "
XSS_IMG = "<img src=x onerror=alert(1)> "


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    members = {name: tiny_member(name) for name in TINY}
    members["xss-script"] = ScriptedMember(
        "xss-script", [XSS_SCRIPT] * 50, lambda t: 2.0 if "script" in t else 1.0
    )
    members["xss-img"] = ScriptedMember("xss-img", [XSS_IMG] * 50, lambda t: 2.0 if "script" in t else 1.0)
    members["slow-a"] = SlowMember("slow-a", ["a "] * 500, len)
    members["slow-b"] = SlowMember("slow-b", ["b "] * 500, len)
    members["quick"] = ScriptedMember("quick", [" quick fox"] * 50, len)
    members["slow-draft"] = ScriptedMember("slow-draft", [" slow tortoise"] * 50, len, draft_delay=2.0)

    def loader(name, device, progress):
        if name.startswith("slow"):  # loading takes a while, as a real model's does
            progress(0.5, f"loading {name}")
            time.sleep(0.6)
        return members[name]

    # One server for the module, so one Gradio cache folder: files outside it are not served.
    cache = tmp_path_factory.mktemp("gradio")
    build = {"default_models": TINY[:2], "defaults": {"segment_len": 4, "max_new_tokens": 24}}
    with launched(cache, members, loader, **build) as address:
        yield address, cache


@pytest.fixture
def page(browser, url, monkeypatch):
    with page_on(browser, *url, monkeypatch, accept_downloads=True) as page:
        yield page


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
    show_round(page, 1)
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
    # The last round's table may hold the leader alone (the other member exited); each member's own
    # answer stands in the compare panel, as text.
    assert "<img src=x onerror=alert(1)>" in page.inner_text("#compare-panel")
    assert "<script>alert(1)</script>" in page.inner_text("#compare-panel")
    page.locator("#answer .token").first.click()
    page.wait_for_function("document.querySelector('#segment').innerText.includes('round 1')")
    assert page.locator("#segment img, #segment script").count() == 0
    assert page.dialogs == []


def status_of(page) -> str:
    return page.inner_text("#status")


def test_run_clicked_half_a_second_after_stop_starts_at_once(page):
    """Gradio's /cancel waits for the round in flight, and the page ignored Run meanwhile (trigger
    mode "once"): Run 0.3–8 s after Stop did nothing (issue 8, item 1)."""
    use_members(page, "slow-a", "slow-b")
    page.fill("#prompt textarea", "go")
    for _ in range(2):  # every time, not once
        page.click("#run")
        page.wait_for_function(  # not the last pass's "Round 1 … stopped by the user"
            "(() => { const s = document.querySelector('#status').innerText;"
            " return s.startsWith('Round 1 ') && !s.includes('stopped'); })()"
        )
        page.click("#stop")
        page.wait_for_function("document.querySelector('#status').innerText.includes('stopped by the user')")
        page.wait_for_timeout(500)
        page.click("#run")
        page.wait_for_function(
            "(() => { const s = document.querySelector('#status').innerText;"
            " return s.startsWith('Round 1 ') && !s.includes('stopped'); })()",
            timeout=6_000,
        )
        page.click("#stop")
        page.wait_for_function("document.querySelector('#status').innerText.includes('stopped by the user')")
        page.wait_for_timeout(300)


def test_the_progress_bar_is_drawn_once_and_the_wait_is_reported(page):
    """The loading bar was drawn over eight panels at once, and the status said "first segment
    3.58 s" after a 12.75 s wait (issue 8, item 6): now one bar, on the status, and both figures."""
    use_members(page, "slow-a", "slow-b")
    page.fill("#prompt textarea", "go")
    page.click("#run")
    page.wait_for_selector(".progress-text", state="attached")
    most = 0
    while "Round" not in status_of(page):
        most = max(most, page.locator(".progress-text:visible").count())
        page.wait_for_timeout(50)
    assert most == 1  # one tracker (it was drawn on ten panels at once)
    page.wait_for_function("document.querySelector('#status').innerText.includes('first segment after')")
    status = status_of(page)
    assert "loading" in status and "round 1" in status and "first segment after" in status
    page.click("#stop")


def test_the_first_candidate_shows_while_a_slower_member_is_still_drafting(page):
    use_members(page, "quick", "slow-draft")
    page.fill("#prompt textarea", "go")
    page.click("#settings")  # one round: round 2's arriving candidates would replace round 1's table
    fill_kept(page, "#setting-max_rounds textarea", "1")  # optional numbers are text boxes
    page.click("#run")
    page.wait_for_function("document.querySelector('#status').innerText.includes('1 of 2 candidates in')")
    status, table = status_of(page), page.inner_text("#candidates")
    assert status.startswith("Round 1") and "still drafting: slow-draft" in status
    assert "quick fox" in table and "slow tortoise" not in table
    page.wait_for_function("document.querySelector('#status').innerText.includes('first segment after')")
    # Decided: both candidates, one chosen; read in one look at the page, not two.
    until(
        page,
        "(() => { const t = document.querySelector('#candidates').innerText;"
        " return t.includes('✓') && t.includes('quick fox') && t.includes('slow tortoise'); })()",
        *("#status", "#candidates"),
    )


def test_stop_while_round_1_is_drafted_says_so_and_run_works_again(page):
    use_members(page, "quick", "slow-draft")
    page.fill("#prompt textarea", "go")
    for _ in range(2):  # the second time, an earlier run's trace is in the session: it must not come back
        page.click("#run")
        page.wait_for_function("document.querySelector('#status').innerText.includes('candidates in')")
        page.click("#stop")
        page.wait_for_function("document.querySelector('#status').innerText.includes('before round 1')")
        assert not page.locator("#download").is_visible()
        page.wait_for_timeout(300)
    page.click("#run")
    page.wait_for_function("document.querySelector('#status').innerText.includes('first segment after')")
    page.click("#stop")
    page.wait_for_function("document.querySelector('#status').innerText.includes('stopped by the user')")


def test_the_plain_answer_is_exactly_the_trace_answer(page, browser, tmp_path):
    """The coloured answer put a newline at each segment boundary and dropped blank lines when
    copied (issue 8, item 3): the plain view and its copy button give the exact answer."""
    code = ["def f(x", "):\n    return", " x + 1\n\n", "\nprint(f(", "2))  # 3\n", "done."]
    trace = scripted_trace(tmp_path / "code.json", {"coder": code, "other": ["no "] * 6})
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    upload(page, tmp_path / "code.json")
    page.wait_for_function("document.querySelector('#status').innerText.includes('replayed')")
    page.locator("#plain-box button").first.click()
    assert page.locator("#plain textarea").input_value() == trace.rounds[-1].text
    page.locator("#plain button[aria-label='Copy'], #plain button[title='Copy']").first.click()
    assert page.evaluate("navigator.clipboard.readText()") == trace.rounds[-1].text


def test_clicking_a_segment_marks_it_in_the_whole_answer(page, tmp_path):
    """Clicking a segment cut the answer back to that round (issue 8, item 5)."""
    trace = scripted_trace(tmp_path / "t.json", {"a": ["one ", "two ", "three ", "four "], "b": ["x "] * 4})
    upload(page, tmp_path / "t.json")
    page.wait_for_function("document.querySelector('#status').innerText.includes('replayed')")
    tokens = page.locator("#answer .token")
    assert tokens.count() == len(trace.rounds)
    tokens.nth(1).click()
    page.wait_for_function("document.querySelector('#segment').innerText.includes('round 2')")
    page.wait_for_function("document.querySelector('#status').innerText.startsWith('Round 2 ')")
    assert page.locator("#answer .token").count() == len(trace.rounds)
    assert "selected segment" in page.inner_text("#answer")


def test_member_names_from_a_trace_render_as_text_in_the_charts(page, tmp_path):
    """An uploaded trace's member names reached Plotly unescaped: <a href> became a link in the
    heatmap and the legend, <b> rendered bold (issue 8, item 7)."""
    link, bold = "<a href='https://example.com/'>evil</a>", "<b>bold</b>"
    scripted_trace(tmp_path / "evil.json", {link: ["x "] * 6, bold: ["y "] * 6, "plain": ["z "] * 6})
    upload(page, tmp_path / "evil.json")
    page.wait_for_selector("#matrix .js-plotly-plot .hm")
    page.wait_for_selector("#weights .js-plotly-plot .legend")
    assert page.locator("#matrix svg a, #weights svg a").count() == 0  # the modebar has its own links
    assert page.locator("#matrix tspan[style*='bold'], #weights tspan[style*='bold']").count() == 0
    assert link in page.inner_text("#weights") or link in page.locator("#weights .legend").inner_text()
    assert page.dialogs == []


def test_a_run_s_tables_fit_1400_pixels_and_a_rejected_upload_shows_one_error_and_keeps_them(page, tmp_path):
    """The candidates table's reward/chosen columns and the summary's right side were off-screen at
    1400 px (issue 8, item 8). A bad upload painted "Error" on every panel; the download button
    looked enabled before any run and did nothing (issue 8, item 10)."""
    assert not page.locator("#download").is_visible()
    run_and_wait(page, "Hello there")
    width = page.viewport_size["width"]
    for table in ("#candidates", "#summary"):
        last = page.locator(f"{table} thead th").last
        box, block = last.bounding_box(), page.locator(table).bounding_box()
        assert box is not None and block is not None
        right = min(width, block["x"] + block["width"])  # on screen, and not scrolled out of its block
        assert box["x"] + box["width"] <= right + 1, (table, box, block)
    page.wait_for_selector("#download", state="visible")
    tokens = page.locator("#answer .token").count()
    bad = tmp_path / "bad.json"
    bad.write_text("not json at all")
    upload(page, bad)
    page.wait_for_selector(".toast-body", state="attached")
    page.wait_for_timeout(500)
    painted = page.evaluate(
        "Array.from(document.querySelectorAll('.error'))"
        ".filter(e => e.offsetParent && !e.closest('.toast-body')).map(e => e.closest('[id]')?.id)"
    )
    assert painted == ["status"]  # one error (beside the toast), on the status line
    assert page.locator("#answer .token").count() == tokens
    assert "✓" in page.inner_text("#candidates")


def test_a_replayed_trace_shows_a_cells_tokens_shaded_then_a_typed_segment_branches_it(page, tmp_path):
    """Run the tiny members, download the trace, replay it in a fresh page; pick a matrix cell of
    round 1, then branch from round 2 with a typed segment: both answers show."""
    run_and_wait(page, "Hello there")
    with page.expect_download() as download:
        page.click("#download")
    saved = tmp_path / "tiny.json"
    download.value.save_as(saved)
    page.reload()
    page.wait_for_selector("#prompt textarea")
    upload(page, saved)
    page.wait_for_function("document.querySelector('#status').innerText.includes('replayed')")
    original = load_trace(saved)

    # Round 1: every member drafts and is scored (a late round may be a lone, unverified draft).
    show_round(page, 1)
    page.locator("#what-if button").first.click()
    page.wait_for_selector("#tokens .sf-token")
    box = page.locator("#evidence-candidate input")
    box.click()
    page.locator("ul[role=listbox] li").nth(1).click()
    page.wait_for_function("document.querySelector('#tokens').innerText.includes('reading')")
    assert page.locator("#tokens .sf-token").count() >= 1
    shaded = "#tokens .sf-token[title*='raw logit'], #tokens .sf-token[title*='log-probability']"
    assert page.locator(shaded).count() >= 1
    rules = page.inner_text("#rules")
    assert "z-softmax, weighted mean" in rules and "weighted median" in rules

    show_round(page, 2)  # the what-if panel stays open
    typed = "<b>typed</b> by you "
    page.fill("#branch-text textarea", typed)
    page.click("#branch")
    page.wait_for_selector("#branch-download", state="visible")
    view = page.inner_text("#branch-view")
    assert "part at round 2" in view and "branch from round 2" in view
    assert original.rounds[-1].text.strip()[:20] in view and typed in view  # shown as text
    assert page.locator("#branch-view b:has-text('typed')").count() == 0
    assert page.locator("#branch-view mark").count() == 2  # each answer's part from round 2 on
    with page.expect_download() as download:
        page.click("#branch-download")
    branch = load_trace(download.value.path())
    assert branch.branch is not None and branch.branch.k == 2 and branch.branch.text == typed
    assert branch.branch.parent == original.id
    assert branch.rounds[0] == original.rounds[0] and branch.rounds[1].winner.text == typed


@pytest.fixture
def eval_page(browser, tmp_path):
    build = {"default_models": TINY[:2], "eval_dir": eval_folder(tmp_path / "eval")}
    with (
        launched(tmp_path / "gradio", dict.fromkeys(TINY), **build) as address,
        opened(browser, address, "#failures-table") as page,
    ):
        yield page


def test_a_failure_case_opens_beside_the_best_members_answer(eval_page):
    page = eval_page
    assert "p1" in page.inner_text("#failures-table") and "p2" in page.inner_text("#failures-table")
    page.locator("#failures-filter label", has_text="ensemble wrong, best member right").click()
    page.wait_for_function("!document.querySelector('#failures-table').innerText.includes('p2')")
    page.locator("#failures-table").get_by_text("p1", exact=True).locator("visible=true").first.click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('problem p1')")
    compared = page.inner_text("#failures-case")  # right under the table
    assert "The answer is 5." in compared and "So the answer is 7." in compared and "a alone" in compared
    assert page.locator("#answer .token").count() == 1
