"""Request bodies bounded as they arrive, on a live uvicorn server on loopback spoken to over a raw
socket (what a hostile client really sends): a Content-Length over the limit refused before a byte
of the body is read, a chunked body cut at the limit (512 MB streamed: a 413, memory nearly flat),
and at most `bodies_at_once` bodies read at once."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Scheduler
from specfuse.limits import Limits
from specfuse.serve import bodies

from ..conftest import rss_bytes
from ..helpers_clients import api_on
from ..scripted import ScriptedMember, prefers

CHAT = "/v1/chat/completions"
LIMITS = Limits(max_prompt_chars=1000, max_tokens=4, bodies_at_once=1)


@pytest.fixture(scope="module")
def served():
    members = [ScriptedMember("alpha", ["one ", ("two.", True)], prefers("one "))]
    scheduler = Scheduler(members, EnsembleConfig(max_new_tokens=4), join_wait=0)
    with api_on(scheduler, limits=LIMITS) as served:
        yield served


@pytest.fixture
def url(served):
    return served[0]


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def response(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the one response on `sock`, read until the server closes it or
    the body is complete."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split()[1]), json.loads(rest[:length])


def test_a_content_length_over_the_limit_is_refused_before_the_body_is_read(url):
    with connect(url) as sock:  # 512 MB announced, not a byte of it sent
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: {512 << 20}\r\n\r\n".encode())
        status, body = response(sock)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert f"its Content-Length is {512 << 20:,} bytes" in body["error"]["message"]
    assert (
        httpx.post(
            url + CHAT, json={"model": "specfuse", "messages": [{"role": "user", "content": "hi"}]}
        ).status_code
        == 200
    )


def test_a_chunked_body_of_512_mb_is_cut_at_the_limit_with_memory_nearly_flat(url):
    chunk = b"x" * (1 << 16)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    before = rss_bytes()
    sent = 0
    with connect(url) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        try:
            while sent < 512 << 20:
                sock.sendall(framed)
                sent += len(chunk)
        except OSError:  # the server answered and closed the connection: the rest is never read
            pass
        status, body = response(sock)
    grown = rss_bytes() - before
    assert status == 413 and f"over {LIMITS.max_body_bytes:,} bytes arrived" in body["error"]["message"]
    assert sent < 64 << 20  # cut long before the end: the socket's buffers, not the body
    assert grown < 20 << 20, f"memory grew {grown / 2**20:.1f} MiB"


def test_bodies_read_at_once_are_bounded(served, monkeypatch):
    url, app = served
    monkeypatch.setattr(bodies, "READ_WAIT_S", 0.5)
    with connect(url) as slow:  # one body under way, its end not sent yet
        slow.sendall(
            f'POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{{"mod\r\n'.encode()
        )
        deadline = time.monotonic() + 10
        while not app.state.serving.reading._slots.locked() and time.monotonic() < deadline:
            time.sleep(0.01)  # until the server has begun reading it
        busy = httpx.post(
            url + CHAT, json={"model": "specfuse", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "server_busy"
        rest = b'el": "specfuse", "messages": [{"role": "user", "content": "hi"}]}'
        slow.sendall(f"{len(rest):x}\r\n".encode() + rest + b"\r\n0\r\n\r\n")
        status, body = response(slow)
    assert status == 200 and body["choices"][0]["message"]["content"]
