"""What a browser test's page costs: chromium's CPU (all its processes) and this process's (the app's
Python, the members included) to open the app's page, to play one run of tiny random-weight members on
it and to leave it at rest for five seconds (chromium only), in the headless browser the tests drive,
for a few page settings in turn: the tests' own (1400×1000), an injected no-animation style,
`reduced_motion`, a smaller window. The suite's time is mostly this (docs/development.md, "The suite's
time"). Run it alone on the machine.

    python tools/page_cost.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the app's and the tests' own modules

from playwright.sync_api import sync_playwright  # noqa: E402

from studio.serving import Schedulers  # noqa: E402
from tests.chromium import launch  # noqa: E402
from tests.conftest import TINY, tiny_member  # noqa: E402
from tests.helpers_app import launched  # noqa: E402

NO_ANIMATION = """document.addEventListener('DOMContentLoaded', () => {
  const s = document.createElement('style');
  s.textContent = '*, *::before, *::after { animation: none !important; transition: none !important; }';
  document.head.appendChild(s);
});"""
SETTINGS = [  # (label, window, context options, init script); the first warms the caches up
    ("warm-up", (1400, 1000), {}, None),
    ("tests' own", (1400, 1000), {}, None),
    ("no animation", (1400, 1000), {}, NO_ANIMATION),
    ("reduced motion", (1400, 1000), {"reduced_motion": "reduce"}, None),
    ("1024x700", (1024, 700), {}, None),
]
STOPPED = "document.querySelector('#status').innerText.includes('stopped:')"
REST_S = 5.0


def chromium_cpu_s() -> float:
    ticks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"chrom" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    members = {name: tiny_member(name) for name in TINY}
    build = {"default_models": TINY, "defaults": {"segment_len": 4, "max_new_tokens": 96}}
    print(f"load average {os.getloadavg()[0]:.2f}; CPU-s: chromium / the app's Python; wall s")
    with (
        launched(Path(tempfile.mkdtemp()), members, schedulers=Schedulers(), **build) as url,
        sync_playwright() as p,
    ):
        browser = launch(p)
        for label, (width, height), options, script in SETTINGS:
            context = browser.new_context(viewport={"width": width, "height": height}, **options)
            if script:
                context.add_init_script(script)
            marks = [(chromium_cpu_s(), own_cpu_s(), time.perf_counter())]
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("#prompt textarea")
            time.sleep(1)
            marks.append((chromium_cpu_s(), own_cpu_s(), time.perf_counter()))
            page.fill("#prompt textarea", "Why is the sky blue?")
            page.click("#run")
            page.wait_for_function(STOPPED, polling=100)
            marks.append((chromium_cpu_s(), own_cpu_s(), time.perf_counter()))
            time.sleep(REST_S)  # the page at rest after its run draws nothing (serving.STATUS_TIMER_GUARD)
            marks.append((chromium_cpu_s(), own_cpu_s(), time.perf_counter()))
            (c0, p0, t0), (c1, p1, t1), (c2, p2, t2), (c3, _, t3) = marks
            print(
                f"{label:15s} open {c1 - c0:5.2f} / {p1 - p0:5.2f}, {t1 - t0:4.1f} s"
                f" | a 96-token run {c2 - c1:5.2f} / {p2 - p1:5.2f}, {t2 - t1:4.1f} s"
                f" | at rest {c3 - c2:4.2f} CPU-s in {t3 - t2:.0f} s",
                flush=True,
            )
            context.close()
        browser.close()


if __name__ == "__main__":
    main()
