"""Take the README screenshot (assets/screenshot.png) and the example trace (assets/example-trace.json).

The screenshot shows the round where the ensemble is seen at work (specfuse.lessons.checks.
ensemble_at_work: three candidates or more, a full matrix, weights that moved, an answer won by more
than one member), its segment selected in the whole answer; the trace saved is the one it shows
(tests/classroom/test_lessons.py checks that round).

A real run: the catalogue's default members, loaded through specfuse.models.loading.load_member, answer
the GSM8K example in the app, driven by Playwright in Debian's chromium. On a shared 2-core machine
wrap it so it does not overlap other heavy jobs:

    flock /tmp/specfuse-heavy.lock .venv/bin/python assets/make_screenshot.py [--max-new-tokens 48]

With --from-trace PATH it replays a trace of a real run (from `specfuse --trace` or the app's
download) through the app's upload instead, which loads no model and takes seconds. With --step it
takes step mode's two beats instead (assets/step-drafts.png, assets/step-reveal.png) at 1280×720, a
projector's size, driven by the keyboard as a teacher drives it. With --lessons it takes only the
classroom's screenshots, from the shipped lessons (no model, seconds): the lesson gallery with a
lesson open (assets/lessons.png) and the presenter view at 1280×720 (assets/presenter.png). It
prints the load average it ran under (the timings on the status line depend on it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import app  # noqa: E402
from specfuse import load_trace  # noqa: E402
from specfuse.lessons import lesson  # noqa: E402
from specfuse.lessons.checks import ensemble_at_work  # noqa: E402
from studio.panels import EXAMPLES  # noqa: E402
from tests.chromium import launch  # noqa: E402
from tests.conftest import free_port  # noqa: E402


def main() -> None:
    from playwright.sync_api import sync_playwright

    from specfuse.models.catalogue import CATALOGUE, DEFAULT_MEMBERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--example", type=int, default=3, help="which example prompt (3 = GSM8K)")
    parser.add_argument("--out", type=Path, default=ROOT / "assets")
    parser.add_argument("--timeout-min", type=float, default=30)
    parser.add_argument(
        "--arriving",
        action="store_true",
        help="only assets/arriving.png: round 1 while the slower members are still drafting",
    )
    parser.add_argument(
        "--from-trace", type=Path, help="replay this trace of a real run instead of running (loads no model)"
    )
    parser.add_argument(
        "--step",
        action="store_true",
        help="only step mode's assets/step-drafts.png and assets/step-reveal.png (1280×720)",
    )
    parser.add_argument(
        "--lessons",
        action="store_true",
        help="only assets/lessons.png and assets/presenter.png, from the shipped lessons (loads no model)",
    )
    args = parser.parse_args()
    print(f"load average at start: {load_average()}")

    demo = app.build_demo(
        app.SharedLoader(),
        choices=list(CATALOGUE),
        default_models=DEFAULT_MEMBERS,
        device="cpu",
        defaults={"max_new_tokens": args.max_new_tokens},
    )
    _, url, _ = app.serve(demo, port=free_port(), prevent_thread_lock=True)
    began = time.perf_counter()
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            page.set_default_timeout(args.timeout_min * 60_000)
            if args.step:
                page.close()
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                page.set_default_timeout(args.timeout_min * 60_000)
            page.goto(url)
            page.wait_for_selector("#prompt textarea")
            if args.step or args.lessons:
                if args.step:
                    step_shots(page, EXAMPLES[args.example][0], args.out)
                else:
                    classroom(page, args.out)
                browser.close()
                return
            if args.from_trace:
                page.locator("#replay button").first.click()  # open the accordion
                page.locator("#upload input[type=file]").set_input_files(str(args.from_trace))
                page.wait_for_function("document.querySelector('#status').innerText.includes('replayed')")
                page.fill("#prompt textarea", load_trace(args.from_trace).prompt)
            elif args.arriving:  # the first candidates, before round 1 is decided
                page.fill("#prompt textarea", EXAMPLES[args.example][0])
                page.click("#run")
                page.wait_for_function(
                    "document.querySelector('#status').innerText.includes('candidates in')",
                    polling=20,
                )
                page.locator("#candidates").scroll_into_view_if_needed()
                print(page.inner_text("#status"))
                page.screenshot(path=str(args.out / "arriving.png"), full_page=False)
                page.click("#stop")
                browser.close()
                return
            else:
                page.fill("#prompt textarea", EXAMPLES[args.example][0])
                page.click("#run")
                page.wait_for_function("document.querySelector('#status').innerText.includes('stopped:')")
            print(page.inner_text("#status"))
            with page.expect_download() as download:
                page.click("#download")
            saved = args.out / "example-trace.json.part"
            download.value.save_as(saved)
            trace = load_trace(saved)  # validate before it replaces the old one
            # The first picture shows the method at work: inspect a contested round (three candidates
            # or more, a full matrix, weights that moved, an answer of several members), not the last.
            k = ensemble_at_work(trace)
            if isinstance(k, str):
                saved.unlink()
                sys.exit(f"this run shows no round of the ensemble at work ({k}): try another --example")
            segment_token(page, trace, k).click()
            page.wait_for_function(
                "k => document.querySelector('#segment').innerText.includes('round ' + k)", arg=k
            )
            page.wait_for_selector("#matrix .js-plotly-plot")
            page.mouse.move(0, 0)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(args.out / "screenshot.png"), full_page=True)
            print(f"screenshot of round {k}: {page.inner_text('#segment')!r}")
            shutil.move(saved, args.out / "example-trace.json")
            browser.close()
    finally:
        demo.close()
        print(f"load average at the end: {load_average()} ({time.perf_counter() - began:.0f} s)")
    print(f"{len(trace.rounds)} rounds, {time.perf_counter() - began:.0f} s: {trace.rounds[-1].text!r}")


def segment_token(page, trace, k: int):
    """The answer's first token of segment k: the page breaks segments at blank lines, so the k-th
    token is not segment k; the token whose text starts where segment k starts is (newlines aside)."""
    start = len("".join(r.winner.text for r in trace.rounds[: k - 1]).replace("\n", ""))
    tokens, at = page.locator("#answer .token"), 0
    for i in range(tokens.count()):
        if at >= start:
            return tokens.nth(i)
        at += len(tokens.nth(i).inner_text().replace("\n", ""))
    raise SystemExit(f"no token of the answer starts segment {k}")


LESSON = "weak-member-exits"  # the gallery's shot: a lesson open, its notes beside the panels
PRESENTED = ("numbers-differ", "matrix")  # the presenter's shot: this lesson, this panel


def classroom(page, out: Path) -> None:
    """assets/lessons.png (the gallery, a lesson open under it) and assets/presenter.png (1280×720)."""
    page.set_viewport_size({"width": 1400, "height": 1950})
    page.click(f"#class-open-{LESSON}")
    page.wait_for_function("document.querySelector('#status').innerText.includes('recorded run')")
    page.wait_for_selector("#matrix .js-plotly-plot")
    page.mouse.move(0, 0)  # no hover highlight on a card or the answer's legend
    page.wait_for_timeout(1000)
    page.screenshot(path=str(out / "lessons.png"))
    print(page.inner_text("#status"))
    slug, panel = PRESENTED
    page.set_viewport_size({"width": 1280, "height": 720})
    page.click(f"#class-open-{slug}")
    title = lesson(slug).title
    page.wait_for_function("t => document.querySelector('#class-lesson').innerText.includes(t)", arg=title)
    page.locator("body").click(position={"x": 1, "y": 1})
    page.keyboard.press("p")
    page.locator("#presenter-panel label", has_text=panel).click()
    page.mouse.move(0, 0)
    page.wait_for_timeout(1500)
    size = page.locator("#answer .token").first.evaluate("e => getComputedStyle(e).fontSize")
    print(f"presenter view at 1280×720: the answer at {size}")
    page.screenshot(path=str(out / "presenter.png"))


def load_average() -> str:
    """The machine's load over the last 1, 5 and 15 minutes, and its cores."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min; {os.cpu_count()} cores)"


def step_shots(page, prompt: str, out: Path) -> None:
    """Step mode's two beats of round 2 (round 1 revealed first, so the answer has begun): the
    drafts with the room's guess, then Reveal. The keys, as a teacher presses them."""

    def note_says(*texts: str) -> None:
        page.wait_for_function(
            "(ts) => { const n = document.querySelector('#step-note')?.innerText || '';"
            " return ts.every((t) => n.includes(t)); }",
            arg=list(texts),
        )

    def shoot(name: str) -> None:
        top = "document.querySelector('#step-bar').getBoundingClientRect().top + window.scrollY - 8"
        page.evaluate(f"window.scrollTo(0, {top})")
        page.wait_for_timeout(800)  # the charts settle
        page.screenshot(path=str(out / name))
        print(name, "·", page.inner_text("#status"))

    page.locator("#step-mode input").check()
    page.fill("#prompt textarea", prompt)
    page.click("#run")
    note_says("ready")
    page.evaluate("document.activeElement && document.activeElement.blur()")
    for beat in (("Round 1: ", "drafts are in"), ("Round 1: ", "won"), ("Round 2: ", "drafts are in")):
        page.keyboard.press("ArrowRight")
        note_says(*beat)
    page.locator("#step-guess label").first.click()  # the room's guess
    shoot("step-drafts.png")
    page.keyboard.press("ArrowRight")
    note_says("Round 2: ", "won")
    page.wait_for_function("document.querySelector('#matrix').innerText.includes('round 2')")
    shoot("step-reveal.png")


if __name__ == "__main__":
    main()
