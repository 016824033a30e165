"""A stream accepted is answered at once: its headers and its role chunk before its first round, and
keep-alive comments while it waits in line, so that clients and proxies with short read timeouts
keep it. On a live server with scripted members whose drafts take a while (a batch of one: the
second stream really waits)."""

from __future__ import annotations

import json

import httpx
import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Scheduler
from specfuse.limits import Limits

from ..helpers_clients import api_on
from ..scripted import ScriptedMember, prefers

CHAT = "/v1/chat/completions"


@pytest.fixture
def slow_server():
    members = [ScriptedMember("slow", ["word "] * 50, prefers("word "), draft_delay=0.3)]
    scheduler = Scheduler(members, EnsembleConfig(max_new_tokens=40, exit=False), batch_size=1, queue=4)
    with api_on(scheduler, limits=Limits(keepalive_s=0.1)) as (url, _):
        yield url


def body(rounds: int) -> dict:
    return {
        "model": "specfuse",
        "messages": [{"role": "user", "content": "go"}],
        "stream": True,
        "max_tokens": 40,
        "specfuse": {"max_rounds": rounds},
    }


def test_a_queued_stream_gets_its_headers_role_chunk_and_keep_alives_while_it_waits(slow_server):
    url = slow_server
    with httpx.stream("POST", url + CHAT, json=body(12), timeout=60) as first:
        assert first.status_code == 200
        first_lines = first.iter_lines()  # kept: a dropped line iterator closes its response
        assert next(first_lines).startswith("data: ")
        with httpx.stream("POST", url + CHAT, json=body(2), timeout=60) as second:
            # Headers are here (httpx.stream returned), and the role chunk, while it is still in line.
            assert second.status_code == 200 and second.headers["content-type"].startswith(
                "text/event-stream"
            )
            lines = second.iter_lines()
            role = json.loads(next(line for line in lines if line)[6:])
            assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert httpx.get(url + "/health").json()["waiting"] == 1
            kept = next(line for line in lines if line)
            assert kept == ": keep-alive"  # a comment, while the other stream holds the batch
            assert httpx.get(url + "/health").json()["waiting"] == 1
            first.close()  # the first client leaves: the second one's turn
            rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    text = "".join(
        c["choices"][0]["delta"].get("content", "")
        for c in map(json.loads, (x[6:] for x in rest[:-1]))
        if c["choices"]
    )
    assert text == "word word "
