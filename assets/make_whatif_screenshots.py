"""Screenshots of the "what if" panels and the failure-case browser (assets/whatif-*.png).

Loads no real model: the test suite's tiny random-weight members (tests/conftest.py) answer, so
the texts are noise, but every panel is the real one: a branch with a typed segment beside the
original, a candidate's tokens shaded by one verifier, and a failure case from a small evaluation
folder. Run from the repository root:

    HF_HUB_OFFLINE=1 .venv/bin/python assets/make_whatif_screenshots.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import app  # noqa: E402
from tests.chromium import launch  # noqa: E402
from tests.conftest import TINY_SPECS, free_port, tiny_member  # noqa: E402
from tests.helpers_browser import pick, run_and_wait, show_round  # noqa: E402
from tests.helpers_eval import eval_folder  # noqa: E402


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets")
    args = parser.parse_args()
    members = {name: tiny_member(name) for name in TINY_SPECS}
    scratch = Path(tempfile.mkdtemp(prefix="specfuse-shots-"))
    demo = app.build_demo(
        lambda name, device, progress: members[name],
        choices=list(members),
        default_models=list(members)[:2],
        defaults={"segment_len": 4, "max_new_tokens": 24},
        eval_dir=eval_folder(scratch / "eval"),
    )
    _, url, _ = app.serve(demo, port=free_port(), prevent_thread_lock=True)
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.wait_for_selector("#prompt textarea")
            pick(page, list(members)[2])
            run_and_wait(page, "Hello there")
            page.locator("#what-if button").first.click()
            page.wait_for_selector("#tokens .sf-token")
            page.locator("#tokens").scroll_into_view_if_needed()
            page.locator("#what-if").screenshot(path=str(args.out / "whatif-tokens.png"))
            show_round(page, 2)
            page.fill("#branch-text textarea", " (a segment typed by a person)")
            page.click("#branch")
            page.wait_for_selector("#branch-download", state="visible")
            page.locator("#what-if").screenshot(path=str(args.out / "whatif-branch.png"))
            page.locator("#failures-filter label", has_text="ensemble wrong, best member right").click()
            page.wait_for_function("!document.querySelector('#failures-table').innerText.includes('p2')")
            page.locator("#failures-table").get_by_text("p1", exact=True).locator(
                "visible=true"
            ).first.click()
            page.wait_for_function("document.querySelector('#status').innerText.includes('problem p1')")
            page.screenshot(path=str(args.out / "whatif-failures.png"), full_page=True)
            browser.close()
    finally:
        demo.close()
    print("wrote", *(args.out / f"whatif-{n}.png" for n in ("tokens", "branch", "failures")))


if __name__ == "__main__":
    main()
