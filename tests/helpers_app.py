"""The app tests' side: the app launched on a free port (every test that serves it, in a browser or
through gradio_client), the client on it, the /run outputs by position, hostile drafts, and the
helpers that submit a run and read its updates."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import plotly.io as pio
import pytest

from .conftest import free_port

XSS_SCRIPT = "<script>alert(1)</script> "
XSS_IMG = "<img src=x onerror=alert(1)> "
# the round panels (Views.by_name: the charts' text views last), then the slider and the rest
ANSWER, STATUS, CANDIDATES, MATRIX, WEIGHTS, EXITS, SUMMARY = range(7)
CANDIDATES_TEXT, MATRIX_TEXT, WEIGHTS_TEXT = range(7, 10)
SLIDER, SEGMENT, DOWNLOAD, COMPARE, PLAIN = range(10, 15)


def submit(client, members, prompt, **settings):
    values = dict(segment_len=4, max_new_tokens=24, device="cpu") | settings
    return client.submit(members=members, prompt=prompt, **values, api_name="/run")


def path_of(download) -> str:
    """The download button's file: the button is an update (hidden until a trace exists)."""
    return download["value"] if isinstance(download, dict) else download


def round_updates(outputs):
    """The updates a finished round sent (those for arriving candidates carry no round number)."""
    return [o for o in outputs if "value" in (o[SLIDER] or {})]


def wait_rounds(job, n: int, seconds: float = 30) -> list:
    """The round updates `job` has sent, once there are `n` of them or `seconds` have passed."""
    deadline = time.time() + seconds
    while len(round_updates(job.outputs())) < n and time.time() < deadline:
        time.sleep(0.05)
    return round_updates(job.outputs())


def stop_after_two_rounds(client, job):
    """Stop pressed in the job's session once it has sent two rounds: /stop's status and trace, when
    the job has ended too (10 s at most; the caller checks that it did)."""
    wait_rounds(job, 2)
    status, path = client.predict(api_name="/stop")
    deadline = time.time() + 10
    while not job.done() and time.time() < deadline:
        time.sleep(0.05)
    return status, path


def figure(output):
    return pio.from_json(output["plot"])


@contextlib.contextmanager
def launched(cache: Path, members, loader=None, *, concurrency=None, api=None, **build) -> Iterator[str]:
    """The app on a free loopback port serving `members` (through `loader`, or straight from the
    dict; the choices are its names unless `build` says), its Gradio cache in `cache` (files outside
    it are not served); `concurrency` runs at once (build_demo's limit and the queue's), `api` (an
    ASGI app) mounted beside the page; closed afterwards with the `schedulers` it was given. `build`
    goes to app.build_demo. The address."""
    import app  # gradio: imported by the tests that launch the app, not by every session

    load = loader or (lambda name, device, progress: members[name])
    build.setdefault("choices", list(members))
    serving = {"api": api}
    if concurrency is not None:
        build["concurrency_limit"] = serving["concurrency"] = concurrency
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(cache))
        demo = app.build_demo(load, **build)
        _, address, _ = app.serve(demo, port=free_port(), prevent_thread_lock=True, **serving)
    try:
        yield address
    finally:
        demo.close()
        if build.get("schedulers") is not None:
            build["schedulers"].close()


# gradio_client's own reads wait 5 s (its GET of /info, which describes the whole app): on two busy
# cores that once ran out (CI-like load, a suite's second worker). The queue's streams send a heartbeat
# every 15 s, so a minute of silence still means a stuck server.
CLIENT_TIMEOUT_S = 60


def gradio_client(address: str, downloads: Path | None = None):
    """A gradio_client on `address` (files it fetches go to `downloads`), patient with a busy machine."""
    from gradio_client import Client

    fetched = {} if downloads is None else {"download_files": str(downloads)}
    return Client(address, verbose=False, httpx_kwargs={"timeout": CLIENT_TIMEOUT_S}, **fetched)


def client_on(address: str, cache: Path, monkeypatch, downloads: Path | None = None):
    """A gradio_client on an app a module launched with its Gradio cache in `cache`: the test's own
    cache (conftest's, per test) is pointed back at it; files it fetches go to `downloads`."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    return gradio_client(address, downloads)
