"""A conversation in a real browser (issue 44, items 4-5): a system prompt set in Settings, a
question, a follow-up, the turn shown picked, a branch on turn 2 and New conversation. Tiny
random-weight members and short answers, so the whole conversation takes seconds."""

from __future__ import annotations

import re

import pytest

from specfuse.prompts import prompt_text
from specfuse.trace import load_trace
from studio.serving import Schedulers

from ..conftest import TINY, tiny_member
from ..helpers_browser import fill_kept, launched, opened

pytestmark = pytest.mark.browser

BUILD = {"default_models": TINY, "defaults": {"segment_len": 4, "max_new_tokens": 12}}
WAIT_MS = 30_000
SYSTEM = "Be <b>brief</b>."  # shown as text in the bubbles


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    members = {name: tiny_member(name) for name in TINY}
    with launched(tmp_path_factory.mktemp("gradio"), members, schedulers=Schedulers(), **BUILD) as address:
        yield address


def turns_answered(page, n: int) -> None:
    """Wait until the bubbles hold `n` turns, each answered."""
    page.wait_for_function(
        """(n) => { const log = document.querySelector('#chat-log');
           return log && log.querySelectorAll('.sf-turn').length === n && !log.querySelector('.sf-chat-wait')
             && log.querySelectorAll('.sf-turn .sf-seg').length > 0; }""",
        arg=n,
        timeout=WAIT_MS,
    )


def test_ask_follow_up_with_a_system_prompt_branch_turn_2_and_start_over(browser, url):
    with opened(browser, url) as page:
        page.click("#settings")
        fill_kept(page, "#chat-system textarea", SYSTEM)
        page.fill("#prompt textarea", "Name a colour.")
        page.click("#run")
        turns_answered(page, 1)
        page.wait_for_selector("#download", state="visible")
        assert page.locator("#chat-log .sf-system").inner_text().endswith(SYSTEM)  # as text, not bold
        assert page.locator("#chat-log .sf-system b").count() == 1  # only the "System" label

        page.fill("#chat-followup textarea", "And <i>another</i> one?")
        page.click("#chat-ask")
        turns_answered(page, 2)
        page.wait_for_function("document.querySelector('#chat-followup textarea').value === ''")
        log = page.locator("#chat-log")
        assert (
            "And <i>another</i> one?" in log.inner_text()
            and log.locator("i:has-text('another')").count() == 0
        )
        assert page.locator('#chat-log .sf-shown[data-turn="2"]').count() == 1  # the panels show turn 2
        assert page.locator("#chat-log .sf-seg").count() >= 2  # both answers, one span per segment

        # The download is turn 2's trace: the whole conversation was its prompt.
        page.wait_for_selector("#download", state="visible")
        with page.expect_download() as download:
            page.click("#download")
        second = load_trace(download.value.path())
        asked = second.prompt if isinstance(second.prompt, str) else prompt_text(second.prompt)
        assert all(text in asked for text in (SYSTEM, "Name a colour.", "And <i>another</i> one?"))

        # Turn 1 in the panels, then back to turn 2 and branch it at round 1 with a typed segment.
        page.locator("#chat-turn input").click()
        page.get_by_role("option", name=re.compile("^Turn 1")).click()
        page.wait_for_selector('#chat-log .sf-shown[data-turn="1"]')
        page.locator("#chat-turn input").click()
        page.get_by_role("option", name=re.compile("^Turn 2")).click()
        page.wait_for_selector('#chat-log .sf-shown[data-turn="2"]')
        page.locator("#what-if button").first.click()
        page.fill("#branch-text textarea", "typed here ")
        page.click("#branch")
        page.wait_for_selector("#branch-download", state="visible", timeout=WAIT_MS)
        assert "typed here" in page.inner_text("#branch-view")
        with page.expect_download() as download:
            page.click("#branch-download")
        branch = load_trace(download.value.path())
        assert branch.branch is not None and branch.branch.parent == second.id
        assert branch.prompt == second.prompt  # the earlier turns kept as its conversation

        page.click("#chat-new")
        page.wait_for_function("document.querySelector('#chat-log').innerText.includes('Ask a question')")
        assert page.locator("#chat-system textarea").input_value() == SYSTEM  # the system prompt stays
        assert page.dialogs == [] and page.locator(".toast-body").count() == 0
