"""The OpenAI-compatible API on a live uvicorn server on loopback, spoken to by the official `openai`
client (and by plain httpx where the client hides what is on the wire): answers equal to the solo
runs, streaming in OpenAI's chunk format, the `specfuse` extras, traces, errors and disconnects."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import httpx
import openai
import pytest

from specfuse.bench.serve import running
from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble, Scheduler
from specfuse.limits import Limits
from specfuse.prompts import Message
from specfuse.serve.api import create_app
from specfuse.trace import parse_trace

from ..helpers_clients import api_on, openai_client, unanswered

BASE = EnsembleConfig(segment_len=5, max_new_tokens=24)
LONG = {"max_tokens": 400, "specfuse": {"max_rounds": 80, "segment_len": 4, "exit": False}}
PROMPT = "Explain in two sentences why the sky is blue."


@pytest.fixture(scope="module")
def server(tiny_members):
    scheduler = Scheduler(tiny_members, BASE, batch_size=4, queue=8)
    with api_on(scheduler, limits=Limits(max_prompt_chars=2000, max_tokens=500)) as (url, app):
        yield url, scheduler, app


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server[0])


def solo(members, prompt, config, names=None):
    chosen = [m for m in members if names is None or m.name in names]
    return Ensemble(chosen).run(prompt, config)


def wait_idle(url, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stats = httpx.get(url + "/health").json()
        if stats["running"] == 0 and stats["waiting"] == 0:
            return stats
        time.sleep(0.05)
    raise AssertionError(f"still busy after {seconds}s: {stats}")


def test_chat_whole_equals_the_solo_run_with_usage_and_the_ensembles_account(client, server, tiny_members):
    reply = client.chat.completions.create(
        model="specfuse", messages=[{"role": "user", "content": PROMPT}], max_tokens=20, temperature=0
    )
    want = solo(tiny_members, PROMPT, replace(BASE, max_new_tokens=20, temperature=0.0))
    assert reply.object == "chat.completion" and reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == want.answer
    assert reply.choices[0].finish_reason == ("length" if want.stop_reason == "budget" else "stop")
    assert reply.usage.completion_tokens == want.tokens and reply.usage.prompt_tokens > 0
    extra = reply.to_dict()["specfuse"]
    assert extra["rounds"] == want.rounds and extra["wins"] == dict(want.wins)
    assert extra["members"] == [m.name for m in tiny_members] and extra["stop_reason"] == want.stop_reason
    trace = parse_trace(httpx.get(f"{server[0]}/v1/traces/{extra['trace_id']}").text)
    assert trace.id == extra["trace_id"] and trace.result.answer == want.answer
    assert trace.prompt == (Message("user", PROMPT),)  # the messages as sent (trace format 3)


def test_chat_streams_openai_chunks_whose_deltas_make_the_solo_answer(client, tiny_members):
    stream = client.chat.completions.create(
        model="specfuse",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"specfuse": {"segment_len": 3, "repeat_penalty": 1.0}},
    )
    chunks = list(stream)
    want = solo(tiny_members, PROMPT, replace(BASE, segment_len=3, repeat_penalty=1.0))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.answer
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].to_dict()["specfuse"]["rounds"] == want.rounds
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == want.tokens


def test_completions_whole_and_streamed_honour_stop_and_a_subset_of_members(client, tiny_members):
    names = [m.name for m in tiny_members]
    subset = [names[2], names[0]]
    config = replace(BASE, max_new_tokens=30, seed=3)
    ensemble = Ensemble([tiny_members[2], tiny_members[0]])
    want = ensemble.run(PROMPT, config)
    # A stop string from the answer's second half that ends the run early: with it, the drafter that
    # would write it cuts its draft, and the ensemble may then pick another candidate instead.
    for start in range(len(want.answer) // 2, len(want.answer) - 1):
        stop = want.answer[start : start + 2]
        cut = ensemble.run(PROMPT, replace(config, stop_strings=(stop,)))
        if stop.strip() and cut.stop_reason in ("stop", "final") and len(cut.answer) < len(want.answer):
            break
    else:
        pytest.fail(f"no stop string from {want.answer!r} ends the run early")
    body = {"specfuse": {"members": subset}}
    whole = client.completions.create(
        model="specfuse", prompt=PROMPT, max_tokens=30, seed=3, stop=[stop], extra_body=body
    )
    assert whole.object == "text_completion" and whole.choices[0].text == cut.answer
    assert stop not in whole.choices[0].text and whole.choices[0].finish_reason == "stop"
    assert whole.to_dict()["specfuse"]["members"] == subset
    streamed = client.completions.create(
        model="specfuse", prompt=PROMPT, max_tokens=30, seed=3, stream=True, extra_body=body
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want.answer
    alone = client.completions.create(model=names[1], prompt=PROMPT, max_tokens=12)  # one member's name
    assert (
        alone.choices[0].text
        == solo(tiny_members, PROMPT, replace(BASE, max_new_tokens=12), [names[1]]).answer
    )


def test_n_answers_are_n_runs_with_seeds_seed_plus_i_each_its_own_choice_and_trace(
    client, server, tiny_members
):
    ask = {"model": "specfuse", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12}
    ask |= {"temperature": 1.0, "seed": 5, "n": 3}
    reply = client.chat.completions.create(**ask)
    config = replace(BASE, max_new_tokens=12, temperature=1.0)
    wants = [solo(tiny_members, PROMPT, replace(config, seed=5 + i)) for i in range(3)]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.message.content for c in reply.choices] == [w.answer for w in wants]
    assert reply.usage.completion_tokens == sum(w.tokens for w in wants)
    runs = reply.to_dict()["specfuse"]["choices"]
    assert len({r["trace_id"] for r in runs}) == 3
    for i, run in enumerate(runs):
        trace = parse_trace(httpx.get(f"{server[0]}/v1/traces/{run['trace_id']}").text)
        assert trace.config.seed == 5 + i and trace.result.answer == wants[i].answer
    # Streamed, the same n runs: each chunk says its choice's index, all under one response id.
    stream = client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    texts, finished = ["", "", ""], set()
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finished.add(choice.index)
    assert texts == [w.answer for w in wants] and finished == {0, 1, 2}
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].usage.completion_tokens == sum(w.tokens for w in wants)


def test_models_lists_the_ensemble_and_each_member(client, tiny_members):
    assert [m.id for m in client.models.list()] == ["specfuse", *(m.name for m in tiny_members)]


def test_errors_come_as_openai_error_json_with_the_right_status(client, server):
    url = server[0]
    chat = {"model": "specfuse", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=chat["messages"])
    assert e.value.body["code"] == "model_not_found" and "gpt-9" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError, match=r"n must be an integer in 1\.\.8"):
        client.chat.completions.create(model="specfuse", messages=chat["messages"], n=9)
    with pytest.raises(openai.BadRequestError, match="'tool' is not supported"):
        client.chat.completions.create(model="specfuse", messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="segment_len must be an integer in 1..256"):
        client.chat.completions.create(**chat, extra_body={"specfuse": {"segment_len": 0}})
    with pytest.raises(openai.BadRequestError, match="specfuse.colour is not a setting"):
        client.chat.completions.create(**chat, extra_body={"specfuse": {"colour": 1}})
    with pytest.raises(openai.BadRequestError, match="specfuse.parallel is the server's setting"):
        client.chat.completions.create(**chat, extra_body={"specfuse": {"parallel": "on"}})
    with pytest.raises(openai.BadRequestError, match="unknown members nobody"):
        client.chat.completions.create(**chat, extra_body={"specfuse": {"members": ["nobody"]}})
    with pytest.raises(openai.BadRequestError, match="temperature must be ≥ 0"):
        client.chat.completions.create(**chat, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="over this server's limit of 500"):
        client.chat.completions.create(**chat, max_tokens=501)
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="specfuse", messages=[{"role": "user", "content": "x" * 2001}])
    assert e.value.status_code == 413 and e.value.body["code"] == "context_length_exceeded"
    raw = httpx.post(url + "/v1/chat/completions", content=b"{not json")
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(url + "/v1/traces/nope").status_code == 404
    assert httpx.get(url + "/v1/nothing").json()["error"]["type"] == "not_found_error"


def test_a_key_is_required_when_set_and_a_server_still_loading_answers_503(tiny_members):
    with api_on(Scheduler(tiny_members[:1], BASE), api_key="sesame") as (url, _):
        with pytest.raises(openai.AuthenticationError):
            openai_client(url).models.list()
        good = openai_client(url, api_key="sesame")
        assert [m.id for m in good.models.list()] == ["specfuse", tiny_members[0].name]
    with running(create_app()) as url:
        loading = openai_client(url)
        with pytest.raises(openai.InternalServerError) as e:
            loading.chat.completions.create(model="specfuse", messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 503 and httpx.get(url + "/health").status_code == 503


def test_a_full_line_answers_429(tiny_members):
    with api_on(Scheduler(tiny_members, BASE, batch_size=1, queue=0)) as (url, _):
        body = {
            "model": "specfuse",
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
            **LONG,
        }
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as busy:
            assert busy.status_code == 200
            with pytest.raises(openai.RateLimitError) as e:
                openai_client(url).chat.completions.create(
                    model="specfuse", messages=[{"role": "user", "content": "hi"}]
                )
            assert e.value.body["code"] == "queue_full"


def test_a_client_that_disconnects_cancels_its_request(server, tiny_members):
    url, scheduler, app = server
    wait_idle(url)
    body = {"model": "specfuse", "messages": [{"role": "user", "content": PROMPT}], "stream": True, **LONG}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        # The role chunk comes at once (the stream is accepted); then the first round's text.
        chunks = (json.loads(line[6:]) for line in lines if line.startswith("data: "))
        first = next(c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content"))
        assert first["object"] == "chat.completion.chunk"
        assert httpx.get(url + "/health").json()["running"] == 1
    wait_idle(url, 10)  # the stream was closed: the request left the batch long before its 80 rounds
    # The same for a whole (non-streamed) answer: the connection closes while the server works.
    with unanswered(url, "/v1/chat/completions", {**body, "stream": False}):
        deadline = time.monotonic() + 20  # until its first round is played (it then has a trace)
        while not any(t.rounds for t in list(scheduler._running.values())) and time.monotonic() < deadline:
            time.sleep(0.02)
    wait_idle(url, 10)
    deadline = time.monotonic() + 10  # the handlers keep the traces as they wind up, just after
    while time.monotonic() < deadline:
        kept = list(app.state.serving.traces.values())[-2:]
        if [t.result.stop_reason for t in kept] == ["cancelled", "cancelled"]:
            break
        time.sleep(0.05)
    assert [t.result.stop_reason for t in kept] == ["cancelled", "cancelled"]


def test_a_request_past_the_time_limit_is_cancelled_with_a_504_or_an_error_event(tiny_members):
    scheduler = Scheduler(tiny_members, BASE, batch_size=2)
    with api_on(scheduler, limits=Limits(request_timeout_s=1.5)) as (url, _):
        # One token a round, every member drafting, under the mean (here the tiny members never
        # pick a final candidate under it): far longer than the 1.5 s limit.
        endless = {
            "max_tokens": 440,
            "specfuse": {"max_rounds": 440, "segment_len": 1, "exit": False, "aggregation": "mean"},
        }
        body = {"model": "specfuse", "messages": [{"role": "user", "content": PROMPT}], **endless}
        whole = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        assert whole.status_code == 504 and whole.json()["error"]["code"] == "timeout"
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as streamed:
            events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert streamed.status_code == 200 and events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["error"]["code"] == "timeout"
        assert wait_idle(url)["running"] == 0


def test_openapi_json_publishes_the_request_bodies_with_the_specfuse_fields_behind_the_key():
    from fastapi.testclient import TestClient

    from specfuse.config import settings

    client = TestClient(create_app(api_key="sesame"))
    assert client.get("/openapi.json").status_code == 401
    spec = client.get("/openapi.json", headers={"Authorization": "Bearer sesame"}).json()
    schemas = spec["components"]["schemas"]
    for path, body in (("/v1/chat/completions", "ChatRequest"), ("/v1/completions", "CompletionRequest")):
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{body}" and "specfuse" in schemas[body]["properties"]
    fields = schemas["SpecfuseOptions"]["properties"]
    assert set(fields) == {"members"} | {s.name for s in settings()}  # every run setting, declared once
    segment = next(t for t in fields["segment_len"]["anyOf"] if t["type"] == "integer")
    assert (segment["minimum"], segment["maximum"]) == (1, 256)
    assert {"enum": ["mean", "median", "filtered"], "type": "string"} in fields["aggregation"]["anyOf"]
    assert schemas["ChatMessage"]["properties"]["role"]["enum"] == ["system", "user", "assistant"]


def test_a_gated_request_says_which_rounds_the_gatekeeper_played_alone(client, tiny_members):
    gate = {"gate": True, "gate_threshold": -100.0, "gate_member": tiny_members[1].name}
    reply = client.chat.completions.create(
        model="specfuse", messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
        extra_body={"specfuse": gate},
    )  # fmt: skip
    extra = reply.to_dict()["specfuse"]
    assert extra["gated_rounds"] == extra["rounds"] == len(extra["gated"]) > 0  # it always passes
    first = extra["gated"][0]
    assert first["round"] == 1 and first["member"] == tiny_members[1].name and first["threshold"] == -100.0
    assert first["measure"] == "mean_logprob" and first["confidence"] <= 0 and "was sure" in first["reason"]
    plain = client.chat.completions.create(
        model="specfuse", messages=[{"role": "user", "content": PROMPT}], max_tokens=12
    )
    assert plain.to_dict()["specfuse"]["gated_rounds"] == 0 and plain.to_dict()["specfuse"]["gated"] == []


def test_health_says_what_the_loading_is_doing_while_the_members_load(tmp_path):
    """Issue 58: while the members load, /health names the phase, the member and its step."""
    from specfuse.models.preparation import Preparation

    app = create_app()
    preparation = Preparation(
        ["smollm2-135m", "gemma3-270m"], lambda name: "none", lambda line: None, tmp_path
    )
    app.state.serving.preparing = preparation.snapshot
    preparation.progress(0.3, "gemma3-270m: converting GGUF (once; this takes a while)")
    with running(app) as url:
        health = httpx.get(url + "/health")
    said = health.json()
    assert health.status_code == 503 and said["status"] == "loading"
    assert (said["phase"], said["member"], said["step"]) == ("preparing", "gemma3-270m", "converting")
    assert said["progress"] == 0.3 and said["usual_s"] is None  # nothing measured in this cache yet
