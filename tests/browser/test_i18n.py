"""The classroom in Chinese (issue 53, item 4): a browser whose language is Chinese opens a recorded
lesson (no model loaded), turns on step mode, steps a round by keyboard, and the visible page holds
no English word but names, model text and the short allow-list of tests/i18n_keys.ALLOWED (the test
lists any it finds); the visible switch (English / 中文) reloads the page in the other language."""

from __future__ import annotations

import re

import pytest

from specfuse.lessons import LESSONS, load_lesson
from studio.panels import EXAMPLES

from ..helpers_browser import opened, scripted_pair
from ..i18n_keys import english_words, trace_words

pytestmark = pytest.mark.browser

SLUG = "weak-member-exits"

# Every visible text node of the page, and the accessible names a screen reader reads out.
VISIBLE = """() => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || !el || el.closest("script, style, noscript")) continue;
    if (!el.getClientRects().length || getComputedStyle(el).visibility === "hidden") continue;
    out.push(n.textContent.trim());
  }
  for (const el of document.querySelectorAll("[aria-label], [placeholder]")) {
    if (el.closest(".modebar")) continue;  // Plotly's own toolbar, in Plotly's English
    if (el.getClientRects().length) out.push(el.getAttribute("aria-label") || el.getAttribute("placeholder"));
  }
  return out;
}"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from scripted_pair(tmp_path_factory)


def wait_text(page, selector: str, text: str) -> None:
    page.wait_for_function(
        "([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)", arg=[selector, text]
    )


# Gradio's own accessible names that its Chinese locale leaves in English (a slider's, a table's:
# written into its components, not locale keys). Its status tracker's "processing |" and "queue: 1/2
# |" are visible text: a page in Chinese hides them (TRACKER_TEXT), so they are not listed here.
GRADIO_OWN = (
    "number input for",
    "range slider for",
    "Reset to default value",
    "Table actions",
    "Copy table data",
    "Fullscreen",
    "Gradio footer navigation",
    "Empty value",
)
# Whether Gradio's status tracker line ("processing | 1.9s") would show on this page: one made up.
TRACKER_TEXT = """() => {
  const line = document.createElement("div");
  line.className = "meta-text";
  line.textContent = "processing | 1.9s";
  document.body.append(line);
  const shown = getComputedStyle(line).display !== "none";
  line.remove();
  return [document.documentElement.lang, shown];
}"""
PROMPTS = [str(x) for e in EXAMPLES for x in (e if isinstance(e, (list, tuple)) else [e])]


# What Gradio's status region says to a screen reader (an event's start and end, one per 5 s, each
# shown for 1 s): kept as it comes, so a test reads every announcement of its walk.
HEARD = """() => {
  window.sfHeard = new Set();
  setInterval(() => document.querySelectorAll('[role=status][aria-live]')
    .forEach((e) => e.textContent.trim() && window.sfHeard.add(e.textContent.trim())), 20);
}"""


def english_left(page, allowed: set[str]) -> list[tuple[str, str]]:
    shown = [t for t in page.evaluate(VISIBLE) if not t.startswith(GRADIO_OWN)]
    # an example prompt is cut with "..." in its button: model input, like the lessons' prompts
    texts = [t for t in shown if not any(e.startswith(t.rstrip(".…")) for e in PROMPTS)]
    return [(w, text[:80]) for text in texts for w in english_words(text, allowed)]


def test_a_lesson_stepped_in_chinese_shows_no_english(browser, served):
    address, loaded = served
    trace = load_lesson(SLUG)
    # The page's members, the switch's own name, the model text the lesson cards quote, and the example
    # prompts (a model's input, as the lessons' prompts are).
    allowed = (
        {"a", "b", "English"}
        | trace_words(trace)
        | set().union(*(trace_words(load_lesson(one.slug)) for one in LESSONS))
    )
    allowed |= set(re.findall(r"[A-Za-z][A-Za-z0-9_]+", " ".join(map(str, EXAMPLES))))
    with opened(browser, address, locale="zh-CN") as page:
        wait_text(page, "#step-mode", "分步模式")
        wait_text(page, "#status", "选择两个或更多成员")  # the status line as the page opens
        page.evaluate(HEARD)
        found = english_left(page, allowed)
        assert not found, f"{len(found)} English words in the Chinese page as it opens: {found[:40]}"
        page.wait_for_function("document.documentElement.lang === 'zh-CN'")
        assert page.evaluate(TRACKER_TEXT) == ["zh-CN", False]
        page.locator(f"#class-open-{SLUG}").focus()
        page.keyboard.press("Enter")
        page.wait_for_selector("#class-lesson", state="visible")
        wait_text(page, "#status", "录制的运行")
        page.locator("#step-mode input").focus()
        page.keyboard.press("Space")
        wait_text(page, "#step-note", "就绪")
        page.evaluate("document.activeElement && document.activeElement.blur()")
        page.keyboard.press("PageDown")  # round 1's drafts
        wait_text(page, "#step-note", "草稿已到")
        page.wait_for_selector("#step-guess input[type=radio]")
        page.keyboard.press("1")
        page.keyboard.press("PageDown")  # Reveal
        wait_text(page, "#step-note", "获胜")
        page.wait_for_timeout(500)
        found = english_left(page, allowed)
        assert not found, f"{len(found)} English words in the Chinese page: {found[:40]}"
        page.keyboard.press("?")  # the key map, in Chinese too
        page.wait_for_selector("#sf-keymap", state="visible")
        assert "下一步" in page.inner_text("#sf-keymap")
        assert not english_left(page, allowed)
        page.keyboard.press("Escape")
        page.keyboard.press("p")  # the presenter view: its toggle says how to leave, in Chinese
        page.wait_for_function("document.body.classList.contains('sf-presenter')")
        wait_text(page, "#presenter-toggle", "退出演示视图")
        page.wait_for_timeout(300)
        assert not english_left(page, allowed)
        # an event's end is announced too (Gradio's own key, which its locales lack: app.serve adds it)
        page.wait_for_function("window.sfHeard.has('完成')", timeout=8_000)
        heard = page.evaluate("[...window.sfHeard]")
        assert not [w for text in heard for w in english_words(text, allowed)], heard
    assert loaded == []


def test_the_switch_reloads_the_page_in_the_language_picked(browser, served):
    address, _loaded = served
    with opened(browser, address, locale="en-US") as page:
        wait_text(page, "#step-mode", "Step mode")
        page.wait_for_function("document.documentElement.lang === 'en'")
        assert page.evaluate(TRACKER_TEXT) == ["en", True]  # English pages keep Gradio's timer line
        page.locator("#sf-lang label", has_text="中文").click()
        page.wait_for_url("**lang=zh**")
        wait_text(page, "#step-mode", "分步模式")
        assert page.locator("#sf-lang input[value=zh]").is_checked()
        page.locator("#sf-lang label", has_text="English").click()
        page.wait_for_url("**lang=en**")
        wait_text(page, "#step-mode", "Step mode")


def test_the_handout_opens_in_chinese_and_its_switch_shows_english(browser, tmp_path):
    from specfuse.handout import trace_html

    trace = load_lesson(SLUG)
    path = tmp_path / "handout.html"
    path.write_text(trace_html(trace, lang="zh"), encoding="utf-8")
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri() + "#round=4")
        wait_text(page, "#counter", "第 4 轮")
        page.keyboard.press("?")
        found = english_left(page, trace_words(trace) | {"English"})
        assert not found, f"{len(found)} English words in the Chinese handout: {found[:40]}"
        assert page.evaluate("document.documentElement.lang") == "zh-CN"
        page.click("#lang")  # the switch: the same round in English, offline
        wait_text(page, "#counter", "round 4 of")
        assert "Prompt" in page.inner_text("#prompt-panel") and "中文" in page.inner_text("#lang")
        assert not errors
    finally:
        context.close()


def test_a_phone_in_chinese_joins_votes_and_hears_the_verdict_in_chinese(browser, served):
    """The class session's phone page (/join) speaks the phone's language (its own Accept-Language,
    not the teacher's English): the page, the drafts beat, its pick, the verdict and a refusal."""
    address, loaded = served
    trace = load_lesson(SLUG)
    with opened(browser, address, locale="en-US") as teacher:
        teacher.click(f"#class-open-{SLUG}")
        wait_text(teacher, "#status", "recorded run")
        teacher.locator("#step-mode input").check()
        wait_text(teacher, "#step-note", "recorded run")
        teacher.evaluate("document.activeElement && document.activeElement.blur()")
        teacher.keyboard.press("c")
        teacher.wait_for_selector("#room-link")
        link = teacher.get_attribute("#room-link", "href")
        code = teacher.inner_text("#room-code")
        allowed = trace_words(trace) | set(re.findall(r"[A-Za-z][A-Za-z0-9_]+", code)) | {"A", "B", "C"}
        context = browser.new_context(locale="zh-CN", viewport={"width": 390, "height": 844})
        try:
            phone = context.new_page()
            phone.set_default_timeout(30_000)
            phone.goto(link)
            wait_text(phone, "#room-student", "你已加入")
            wait_text(phone, "#room-title", "加入课堂")
            assert not english_left(phone, allowed), english_left(phone, allowed)
            phone.wait_for_function("document.documentElement.lang === 'zh-CN'")
            assert phone.evaluate(TRACKER_TEXT) == ["zh-CN", False]
            teacher.keyboard.press("ArrowRight")  # round 1's drafts
            phone.wait_for_selector("#room-pick input[type=radio]")
            phone.keyboard.press("1")
            wait_text(phone, "#room-student", "你的选择：A")
            found = english_left(phone, allowed)
            assert not found, f"{len(found)} English words on the phone at the drafts: {found[:20]}"
            wait_text(teacher, "#step-note", "drafts are in")  # a key pressed mid-step is dropped
            teacher.keyboard.press("ArrowRight")  # Reveal
            wait_text(teacher, "#step-note", "won")
            wait_text(phone, "#room-student", "你的得分：1 次中")  # only a verdict counts the vote
            found = english_left(phone, allowed)
            assert not found, f"{len(found)} English words on the phone at the verdict: {found[:20]}"
            wait_text(teacher, "#room-accuracy", "of 1 votes right")  # the teacher's page stays English
            other = context.new_page()  # a wrong code: refused in the phone's language
            other.goto(f"{address.rstrip('/')}/join?code=ZZZZZZ")
            wait_text(other, "#room-note", "没有使用该代码的课堂会话")
            # The refusal (a queued event) can land before the page's texts (one update of the load)
            wait_text(other, "#room-title", "加入课堂")
            assert not english_left(other, allowed)
        finally:
            context.close()
    assert loaded == []
