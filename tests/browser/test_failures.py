"""The failure-case browser over a shipped study (`python app.py --eval-dir results/eval/gsm8k.json`;
with `--eval-dir results/eval` it opens the largest of the reports, this one), in a browser.

It listed 150 problems and opened none: the report names runs/gsm8k/… traces that are not shipped,
and the copies it ships (results/eval/gsm8k-cases/…) were never read. The replay also sat 3,700 px
above the table, "guarded" was not called the ensemble, and "300 answers" meant 150 problems × 2
systems (issue 24, item 8).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfuse import load_trace

from ..conftest import TINY
from ..helpers_browser import launched, opened

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
REPORT_FILE = ROOT / "results/eval/gsm8k.json"
REPORT = json.loads(REPORT_FILE.read_text(encoding="utf-8"))


def shipped(copy: str) -> Path:
    """A failure case's copy, which the report names from the checkout's root
    (`results/eval/gsm8k-cases/…`): it ships beside the report."""
    return ROOT / copy


@pytest.fixture
def page(browser, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the shipped paths must resolve from the folder, not the checkout
    build = {"default_models": TINY[:2], "eval_dir": REPORT_FILE}
    with (
        launched(tmp_path / "gradio", dict.fromkeys(TINY), **build) as address,
        opened(browser, address, "#failures-table") as page,
    ):
        yield page


def open_problem(page, problem: str) -> None:
    page.locator("#failures-table").get_by_text(problem, exact=True).locator("visible=true").first.click()
    page.wait_for_function(
        f"document.querySelector('#failures-case').innerText.includes('Problem {problem}')"
    )


def test_the_shipped_study_opens_its_failure_cases_right_under_the_table(page):
    note = page.inner_text("#failures-note")
    assert "150 problems × 2 systems" in note and "guarded (the ensemble)" in note
    assert "best member" in note and "12 of them have the ensemble's trace here" in note
    assert "guarded (the ensemble)" in page.inner_text("#failures-table")

    page.locator("#plain-box button").first.click()  # the answer as plain text, to compare
    page.locator("#failures-filter label", has_text="with a trace to replay").click()
    page.wait_for_function("!document.querySelector('#failures-table').innerText.includes('gsm8k-0000')")
    cases = REPORT["failure_cases"]["guarded"]
    for case in (cases["wrong_best_right"][0], cases["right_best_wrong"][0]):
        problem = case["problem"]
        open_problem(page, problem)
        page.wait_for_function(f"document.querySelector('#status').innerText.includes('problem {problem}')")
        trace = load_trace(shipped(case["system_copy"]))
        assert page.input_value("#plain textarea") == trace.rounds[-1].text  # replayed exactly
        shown = page.inner_text("#failures-case")
        assert f"gold answer {case['gold']}" in shown and "guarded (the ensemble)" in shown
        assert trace.rounds[-1].text.strip()[:40] in shown  # the ensemble's answer, from its trace
        assert load_trace(shipped(case["best_copy"])).rounds[-1].text.strip()[:40] in shown
    # The answers sit right under the table, and the replay right under them.
    table, opened = page.locator("#failures").bounding_box(), page.locator("#failures-case").bounding_box()
    chat, status = page.locator("#chat").bounding_box(), page.locator("#status").bounding_box()
    assert table and opened and chat and status
    assert opened["y"] < table["y"] + table["height"]  # inside the browser's panel
    # The replay begins right under the table: the conversation it opened as, then the status line.
    assert 0 <= chat["y"] - (table["y"] + table["height"]) < 200
    assert 0 <= status["y"] - (chat["y"] + chat["height"]) < 200


def test_a_problem_without_a_trace_shows_both_answers_and_says_why_there_is_no_replay(page):
    outcomes = {(o["system"], o["problem"]): o for o in REPORT["outcomes"]}
    open_problem(page, "gsm8k-0003")  # a replay first: it must not stay under another problem
    page.wait_for_function("document.querySelector('#status').innerText.includes('problem gsm8k-0003')")
    open_problem(page, "gsm8k-0000")
    page.wait_for_function("document.querySelector('#status').innerText.includes('no trace')")
    shown = page.inner_text("#failures-case")
    assert outcomes[("guarded", "gsm8k-0000")]["answer"].strip()[:40] in shown
    assert outcomes[("single-qwen2.5-coder-0.5b", "gsm8k-0000")]["answer"].strip()[:40] in shown
    assert page.locator("#answer .token").count() == 0
    assert page.locator(".toast-body").count() == 0
