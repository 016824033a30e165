"""Real clients of the ecosystem against a live server on loopback: lm-evaluation-harness on a small
offline GSM8K task, and a bounded soak of concurrent openai/httpx clients with cancels, disconnects
and bad requests mixed in (each good answer equal to its solo run; memory flat)."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import replace

import httpx
import openai
import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble, Scheduler

from ..conftest import rss_bytes
from ..helpers_clients import GSM8K, api_on, gsm8k_task, hang_up, openai_client, run_lm_eval, send_and_close

BASE = EnsembleConfig(segment_len=5, max_new_tokens=16)


@pytest.fixture(scope="module")
def server(tiny_members):
    scheduler = Scheduler(tiny_members, BASE, batch_size=4, queue=16)
    with api_on(scheduler) as (url, _):
        yield url, scheduler


@pytest.mark.skipif(not GSM8K.is_file(), reason="needs the GSM8K development slice in ../shared/data")
@pytest.mark.slow
def test_lm_eval_scores_an_offline_gsm8k_task_through_the_chat_api(server, tmp_path):
    url, _ = server
    task = gsm8k_task(tmp_path / "task", "specfuse_gsm8k_tiny", rows=6)
    out = tmp_path / "out"
    done = run_lm_eval(url, task, "specfuse_gsm8k_tiny", out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "specfuse_gsm8k_tiny" in done.stdout and "exact_match" in done.stdout  # the score table
    (results,) = out.rglob("results_*.json")
    scores = json.loads(results.read_text())["results"]["specfuse_gsm8k_tiny"]
    assert "exact_match,flexible-extract" in scores
    (samples,) = out.rglob("samples_specfuse_gsm8k_tiny_*.jsonl")
    assert len(samples.read_text().splitlines()) == 6


GOOD = [
    ("Explain in two sentences why the sky is blue.", {}, None),
    ("Write a Python function that returns the n-th Fibonacci number.", {"segment_len": 3}, [0, 2]),
    ("用一句话介绍长城。", {"aggregation": "median", "max_new_tokens": 12}, [1, 0]),
    ("Janet's ducks lay 16 eggs per day. How much does she make?", {"prior": "uniform"}, [2]),
]
BAD = [
    {"model": "specfuse", "messages": [{"role": "wizard", "content": "hi"}]},
    {"model": "specfuse", "messages": [{"role": "user", "content": "hi"}], "n": 9},  # 1..8
    {"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "specfuse", "prompt": "hi", "specfuse": {"top_p": 0}},
]


@pytest.mark.slow
def test_a_soak_of_concurrent_clients_with_cancels_disconnects_and_bad_requests(server, tiny_members):
    url, scheduler = server
    names = [m.name for m in tiny_members]
    expected = []
    for prompt, settings, subset in GOOD:
        members = tiny_members if subset is None else [tiny_members[i] for i in subset]
        expected.append(Ensemble(members).run(prompt, replace(BASE, **settings)).answer)
    failures: list[str] = []
    answered = [0]
    kinds: dict[str, int] = {}

    def good(rng: random.Random, client: openai.OpenAI) -> None:
        i = rng.randrange(len(GOOD))
        prompt, settings, subset = GOOD[i]
        extra = {"specfuse": {**settings, **({"members": [names[j] for j in subset]} if subset else {})}}
        if rng.random() < 0.5:
            reply = client.chat.completions.create(
                model="specfuse", messages=[{"role": "user", "content": prompt}], extra_body=extra
            )
            text = reply.choices[0].message.content
        else:
            stream = client.completions.create(model="specfuse", prompt=prompt, stream=True, extra_body=extra)
            text = "".join(c.choices[0].text for c in stream if c.choices)
        if text != expected[i]:
            failures.append(f"request {i}: {text!r} != {expected[i]!r}")
        answered[0] += 1

    def cancel(rng: random.Random) -> None:
        hang_up(url, GOOD[0][0])

    def disconnect(rng: random.Random) -> None:
        send_and_close(url, GOOD[1][0], rng)

    def bad(rng: random.Random) -> None:
        body = rng.choice(BAD)
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        status = httpx.post(url + path, json=body, timeout=30).status_code
        if status not in (400, 404):
            failures.append(f"bad request answered {status}")

    def client_loop(seed: int, requests: int) -> None:
        rng = random.Random(seed)
        client = openai_client(url)
        try:
            for _ in range(requests):
                kind = rng.choice(["good", "good", "good", "cancel", "disconnect", "bad"])
                kinds[kind] = kinds.get(kind, 0) + 1
                if kind == "good":
                    good(rng, client)
                else:
                    {"cancel": cancel, "disconnect": disconnect, "bad": bad}[kind](rng)
        except Exception as e:  # an error on a good request fails the soak
            failures.append(f"client {seed}: {type(e).__name__}: {e}")

    def wave(seed: int, clients: int = 8, requests: int = 8) -> None:
        threads = [threading.Thread(target=client_loop, args=(seed + c, requests)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        deadline = time.monotonic() + 20
        while scheduler.stats()["running"] + scheduler.stats()["waiting"] and time.monotonic() < deadline:
            time.sleep(0.05)

    wave(100, clients=4, requests=3)  # warm-up: allocators and caches reach their working size
    before = rss_bytes()
    wave(200)
    wave(300)
    after = rss_bytes()
    assert not failures, failures
    assert answered[0] >= 40 and min(kinds.values()) >= 5 and len(kinds) == 4, (answered, kinds)
    assert scheduler.stats()["running"] == 0 and scheduler.stats()["waiting"] == 0  # nothing left behind
    assert after <= 1.10 * before, (
        f"resident memory grew from {before / 2**20:.0f} to {after / 2**20:.0f} MiB"
    )
