"""What a newcomer met in a real browser (issue 24, items 9 and 10): opening Settings broke Run, the
tables broke words and names at 1400 px, the rules table scrolled in a fixed height, dropdown labels
ran under their arrows, ✓ rendered as "√", and a branch's old view and download outlived it."""

from __future__ import annotations

import pytest

from ..conftest import TINY, tiny_member
from ..helpers_browser import fill_kept, launched, page_on, run_and_wait, show_round, upload
from ..scripted import ScriptedMember, SlowMember, scripted_trace

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def address(tmp_path_factory):
    members = {name: tiny_member(name) for name in TINY}
    long = "qwen2.5-coder-0.5b-instruct"  # a member name as long as real ones
    members[long] = ScriptedMember(long, [" and so the answer is forty-two"] * 50, len)
    members["slow-a"] = SlowMember("slow-a", ["a "] * 500, len)
    members["slow-b"] = SlowMember("slow-b", ["b "] * 500, len)
    cache = tmp_path_factory.mktemp("gradio")
    build = {"default_models": [TINY[0], long], "defaults": {"segment_len": 4, "max_new_tokens": 24}}
    with launched(cache, members, **build) as url:
        yield url, cache


@pytest.fixture
def page(browser, address, monkeypatch):
    with page_on(browser, *address, monkeypatch, accept_downloads=True) as page:
        yield page


# JavaScript: the most lines any one word of an element's text spans (2: it broke inside the word).
WORD_LINES = """(el) => {
  const t = [...el.childNodes].find(n => n.nodeType === 3);
  if (!t) return 1;
  const r = document.createRange();
  let most = 1, at = 0;
  for (const word of t.textContent.split(/\\s+/)) {
    if (!word) continue;
    const start = t.textContent.indexOf(word, at);
    at = start + word.length;
    r.setStart(t, start);
    r.setEnd(t, at);
    most = Math.max(most, r.getClientRects().length);
  }
  return most;
}"""
ONE_LINE = (
    "e => { const r = document.createRange(); r.selectNodeContents(e); return r.getClientRects().length; }"
)


def test_a_run_after_settings_changed_then_its_tables_and_dropdown_read_whole_at_1400_pixels(page):
    """Opening Settings put 0 in "Max rounds (empty: no limit)" and every Run then failed with
    `Value 0 is less than minimum value 1.` (issue 24, item 9). The tables broke words: "token s",
    "eligib le", "roun d" and "qwen2.5- coder-0.5b"; a dropdown's label ran under its arrow (issue 24,
    item 10)."""
    page.click("#settings")
    fill_kept(page, "#setting-max_new_tokens input[type=number]", "12")
    assert page.locator("#setting-max_rounds textarea").input_value() == ""  # still no limit
    run_and_wait(page, "Hello there")
    assert page.locator("#answer .token").count() >= 1
    assert page.locator(".toast-body").count() == 0
    assert "budget" in page.inner_text("#status") or "final" in page.inner_text("#status")

    page.locator("#what-if button").first.click()
    page.wait_for_selector("#rules [role=gridcell]")
    for table in ("#candidates", "#exits", "#summary", "#rules"):
        for header in page.locator(f"{table} th .header").all():
            assert header.evaluate(WORD_LINES) == 1, (table, header.inner_text())  # no word on two lines
    names = page.locator(
        "#candidates [role=gridcell]:first-child span, #summary [role=gridcell]:first-child span"
    )
    assert names.count() >= 2
    for name in names.all():
        assert name.evaluate(ONE_LINE) == 1, name.inner_text()  # the whole name on one line
    # The rules table shows every rule without scrolling inside a fixed height.
    viewport = page.locator("#rules .virtual-table-viewport, #rules .table-wrap").first
    assert viewport.evaluate("e => e.scrollHeight <= e.clientHeight + 1")
    # ✓ comes from a font that draws a check mark (the theme's monospace draws "√").
    mark = page.locator("#candidates [role=gridcell] span", has_text="✓").first
    assert mark.evaluate("e => getComputedStyle(e).fontFamily").replace('"', "").startswith("sf-marks")
    assert page.evaluate("document.fonts.check('14px sf-marks', '✓')")

    # The branch's candidate dropdown (the what-if panel is open): its label ends before its arrow.
    box = page.locator("#branch-candidate input[role=combobox]")
    page.wait_for_function("document.querySelector('#branch-candidate input')?.value.length > 10")
    text_right = box.evaluate(
        "e => e.getBoundingClientRect().right - parseFloat(getComputedStyle(e).paddingRight)"
    )
    arrow = page.locator("#branch-candidate .icon-wrap").bounding_box()
    assert arrow is not None and text_right <= arrow["x"] + 1
    assert box.evaluate("e => getComputedStyle(e).textOverflow") == "ellipsis"


def test_a_new_branch_hides_the_old_download_and_an_error_clears_the_old_view(page, tmp_path):
    """While a second branch ran, the first one's download was still offered; after a branch error
    the old view stayed, the Error badge over it (issue 24, item 10)."""
    path = tmp_path / "slow.json"
    scripted_trace(path, {"slow-a": ["a "] * 3, "slow-b": ["b "] * 3}, rounds=3)
    upload(page, path)
    page.wait_for_function("document.querySelector('#status').innerText.includes('replayed')")
    page.locator("#what-if button").first.click()
    show_round(page, 2)
    page.fill("#branch-text textarea", "typed ")
    page.click("#branch")
    page.wait_for_selector("#branch-download", state="visible")
    assert page.locator("#branch-view .sf-compare").count() == 1
    page.click("#branch")  # a second branch: slow-a and slow-b take 2.5 s a round
    page.wait_for_selector("#branch-download", state="hidden", timeout=2_000)
    page.wait_for_selector("#branch-download", state="visible")
    page.evaluate(
        "(() => { const t = document.querySelector('#branch-text textarea'); t.value = 'bad \\udfff';"
        " t.dispatchEvent(new Event('input', {bubbles: true})); })()"
    )
    page.click("#branch")
    page.wait_for_selector(".toast-body")
    assert page.locator("#branch-view .sf-compare").count() == 0
    assert not page.locator("#branch-download").is_visible()
