"""The app tests' client side: the /run outputs by position, hostile drafts, and the helpers that
submit a run and read its updates (test_app, test_app_branch, test_app_serve, test_llamacpp)."""

from __future__ import annotations

import plotly.io as pio

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


def figure(output):
    return pio.from_json(output["plot"])
