"""The first minute of `python app.py`, measured from a cold model cache and from a warm one (issue 58).

For each cache state and each press delay, a fresh `app.py` process on a free port: the seconds to
the page (GET / answers 200), to the members' readiness (the app's log line "ready in" of its last
default member, prepared in the background), and to the first segment of a Run pressed that many
seconds after the page opened (through the page's own API, as a browser's Run; the seconds counted
from the press). "cold": an empty SPECFUSE_CACHE of its own (the models are converted again);
"warm": the cache given (default ~/.cache/specfuse), converted already. It prints a Markdown table
and the load average (the machine may be shared: say so beside the figures).

    .venv/bin/python tools/first_minute.py [--states cold warm] [--press 5 30] [--json out.json]
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAIN_LABEL = "Answer (plain text)"  # the run's output read as the first segment (found by its label)
PROMPT = "Explain in two sentences why the sky is blue."
# app.py with its loggers at INFO on stderr: the loader's "NAME: ready in S s" lines say when each is ready
LAUNCH = (
    "import logging, runpy, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr, "
    "format='%(relativeCreated)d %(name)s: %(message)s'); sys.argv = ['app.py', *sys.argv[1:]]; "
    "runpy.run_path('app.py', run_name='__main__')"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def page_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def first_segment(url: str, timeout: float) -> float:
    """Seconds from submitting a Run to its first update with an answer (a segment decided)."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    returns = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/run"]["returns"]
    plain = [r.get("label") for r in returns].index(PLAIN_LABEL)
    began = time.perf_counter()
    job = client.submit(prompt=PROMPT, api_name="/run")  # the form's defaults: the default members
    while time.perf_counter() - began < timeout:
        for output in job.outputs():
            # the plain answer (a component the update leaves alone comes as a dict: not text)
            if (
                isinstance(output, (list, tuple))
                and len(output) > plain
                and isinstance(output[plain], str)
                and output[plain]
            ):
                seconds = time.perf_counter() - began
                job.cancel()
                return seconds
        if job.done():
            job.result()  # raises the run's error
            break
        time.sleep(0.1)
    raise RuntimeError(f"no segment within {timeout:.0f} s")


def measure(state: str, press: float, cache: str, members: list[str], timeout: float) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = dict(os.environ, SPECFUSE_CACHE=cache, GRADIO_ANALYTICS_ENABLED="False")
    argv = [sys.executable, "-c", LAUNCH, "--port", str(port), "--models", *members]
    began = time.perf_counter()
    app = subprocess.Popen(
        argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    ready: dict[str, float] = {}

    def read_log() -> None:
        assert app.stderr is not None
        for line in app.stderr:
            found = re.search(r"specfuse\.studio: (\S+): ready in", line)
            if found:
                ready[found.group(1)] = time.perf_counter() - began

    threading.Thread(target=read_log, daemon=True).start()
    try:
        while not page_up(url):
            if app.poll() is not None:
                raise RuntimeError(f"app.py exited with {app.returncode}")
            time.sleep(0.1)
        page = time.perf_counter() - began
        time.sleep(max(0.0, press - (time.perf_counter() - began - page)))
        pressed = time.perf_counter() - began
        segment = first_segment(url, timeout)
        deadline = time.perf_counter() + timeout
        while len(ready) < len(members) and time.perf_counter() < deadline:
            time.sleep(0.2)
    finally:
        app.terminate()
        app.wait(30)
    return {
        "cache": state,
        "press_after_page_s": press,
        "page_s": round(page, 1),
        "members_ready_s": round(max(ready.values()), 1) if len(ready) == len(members) else None,
        "pressed_at_s": round(pressed, 1),
        "first_segment_after_press_s": round(segment, 1),
    }


def main(argv: list[str] | None = None) -> int:
    from specfuse.flags import Parser, add_loading_flags

    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", nargs="+", choices=("cold", "warm"), default=["cold", "warm"])
    parser.add_argument("--press", nargs="+", type=float, default=[5.0, 30.0], help="seconds after the page")
    add_loading_flags(parser, only=("models",))
    parser.add_argument(
        "--cache", default=os.environ.get("SPECFUSE_CACHE") or str(Path.home() / ".cache/specfuse")
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = []
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    for state in args.states:
        for press in args.press:
            with tempfile.TemporaryDirectory(prefix="specfuse-cold-") as empty:
                row = measure(
                    state, press, empty if state == "cold" else args.cache, args.models, args.timeout
                )
            row["load_average"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| cache | Run pressed | page | members ready | first segment after the press | load (1 min) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ready = "—" if r["members_ready_s"] is None else f"{r['members_ready_s']} s"
        print(
            f"| {r['cache']} | {r['press_after_page_s']:.0f} s after the page | {r['page_s']} s | {ready} | "
            f"{r['first_segment_after_press_s']} s | {r['load_average']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
