"""Every bad input a 4xx in OpenAI's error JSON, with `param` naming the field the client sent and the
message naming the part refused; after each, the server answers a good request. In-process (the
ASGI app through Starlette's TestClient) on one tiny random-weight member: what is checked here is
the API's reading of bodies, not the answers."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from specfuse.config import EnsembleConfig
from specfuse.engine import Scheduler
from specfuse.limits import Limits
from specfuse.serve.api import create_app

BASE = EnsembleConfig(segment_len=3, max_new_tokens=4)
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def api(tiny_members):
    scheduler = Scheduler(tiny_members[:1], BASE, batch_size=2, queue=4)
    try:
        with TestClient(create_app(scheduler, limits=Limits(max_prompt_chars=2000, max_tokens=8))) as client:
            yield client
    finally:
        scheduler.close()


def refused(api, body, status=400, path=CHAT):
    """POST `body` (a dict, or raw JSON text when a str), check the refusal and that a good request
    still gets its answer; the error object."""
    raw = body if isinstance(body, str) else json.dumps(body)
    got = api.post(
        path, content=raw.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"}
    )
    assert got.status_code == status, got.text
    error = got.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    ok = api.post(CHAT, json={"model": "specfuse", "messages": HELLO, "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    return error


def chat(**fields):
    return json.dumps({"model": "specfuse", "messages": HELLO, **fields}, ensure_ascii=True)


def test_a_lone_surrogate_in_a_specfuse_key_or_a_member_name_is_a_400_naming_the_field(api):
    error = refused(api, chat(specfuse={"\ud800": 1}))
    assert error["param"] == "specfuse" and "lone surrogate" in error["message"]
    error = refused(api, chat(specfuse={"members": ["\ud800"]}))
    assert error["param"] == "specfuse.members[0]" and "'\\ud800'" in error["message"]
    error = refused(api, chat(model="gemma\udfff"))
    assert error["param"] == "model"


def test_a_lone_surrogate_in_a_stop_string_is_refused_so_no_trace_holds_one(api):
    error = refused(api, chat(stop=["ok", "\ud800"]))
    assert error["param"] == "stop[1]" and "lone surrogate" in error["message"]
    error = refused(api, chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a\udc80"}]}]))
    assert error["param"] == "messages[0].content[0].text"


def test_deep_nesting_is_a_400_whether_json_or_our_walk_meets_it_first(api):
    error = refused(api, '{"model": "specfuse", "messages": ' + "[" * 30_000 + "]" * 30_000 + "}")
    assert "nested too deeply" in error["message"]
    deep = {"model": "specfuse", "messages": HELLO, "metadata": 0}
    for _ in range(40):
        deep["metadata"] = {"x": deep["metadata"]}
    error = refused(api, deep)
    assert "nested more than 32 levels" in error["message"] and error["param"].startswith("metadata.x.x")


def test_a_huge_seed_is_the_clients_400_never_a_member_error(api):
    error = refused(api, chat(seed=2**64, temperature=1))
    assert error["param"] == "seed" and "2**63 - 1" in error["message"] and error["code"] != "member_error"
    error = refused(api, chat(specfuse={"seed": 2**70}, temperature=1))
    assert error["param"] == "specfuse.seed"
    ok = api.post(
        CHAT,
        json={"model": "specfuse", "messages": HELLO, "max_tokens": 2, "seed": 2**63 - 1, "temperature": 1},
    )
    assert ok.status_code == 200, ok.text


def test_an_image_or_audio_part_is_refused_by_name(api):
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
    ]
    error = refused(api, chat(messages=[{"role": "user", "content": parts}]))
    assert error["param"] == "messages[0].content[1]"
    assert "'image_url' part: images are not supported" in error["message"]
    audio = [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]
    error = refused(
        api, chat(messages=[{"role": "system", "content": "hi"}, {"role": "user", "content": audio}])
    )
    assert error["param"] == "messages[1].content[0]" and "audio are not supported" in error["message"]


def test_max_tokens_zero_names_the_field_the_client_sent(api):
    error = refused(api, chat(max_tokens=0))
    assert error["param"] == "max_tokens" and error["message"].startswith("max_tokens must be")
    error = refused(api, chat(max_completion_tokens=-3))
    assert error["param"] == "max_completion_tokens"
    error = refused(api, chat(max_completion_tokens=9))
    assert error["param"] == "max_completion_tokens" and "limit of 8" in error["message"]
    error = refused(api, chat(top_p=0))
    assert error["param"] == "top_p" and error["message"].startswith("top_p must be in (0, 1]")


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("response_format", {"type": "json_object"}, "structured output"),
        ("tools", [{"type": "function", "function": {"name": "f"}}], "tools are not supported"),
        ("tool_choice", "auto", "tool_choice is not supported"),
        ("logit_bias", {"42": 5}, "logit_bias is not supported"),
    ],
)
def test_fields_we_do_not_do_are_a_400_that_says_so(api, field, value, says):
    error = refused(api, chat(**{field: value}))
    assert error["param"] == field and says in error["message"]
    assert error["code"] == "unsupported_parameter"


def test_the_harmless_values_of_those_fields_pass(api):
    body = {
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "logit_bias": {},
        "logprobs": False,
    }
    got = api.post(CHAT, json={"model": "specfuse", "messages": HELLO, "max_tokens": 2, **body})
    assert got.status_code == 200, got.text


def test_nan_and_infinity_are_not_json(api):
    error = refused(
        api, '{"model": "specfuse", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}'
    )
    assert "NaN is not a JSON number" in error["message"]
    refused(api, '{"model": "specfuse", "messages": [], "top_p": -Infinity}')


def test_a_temperature_too_small_to_sample_is_refused_not_a_member_error(api):
    # Found by tests/serve/test_fuzz.py: logits / 1e-210 are infinite, every probability NaN in the member.
    error = refused(api, chat(temperature=1.7871850788805654e-210))
    assert error["param"] == "temperature" and "0 (greedy) or at least 1e-05" in error["message"]
    error = refused(api, chat(specfuse={"temperature": 1e-9}))
    assert error["param"] == "specfuse.temperature"


def test_a_prompt_a_member_cannot_hold_is_refused_from_its_token_count_before_it_joins(monkeypatch):
    from ..conftest import TINY, tiny_member

    small = tiny_member(TINY[1])
    small.max_positions = 64  # its context, in tokens: the prompt below takes more with the budget
    scheduler = Scheduler([small], BASE)
    submitted = []
    monkeypatch.setattr(scheduler, "submit", lambda *a, **k: submitted.append(a) or pytest.fail("joined"))
    try:
        with TestClient(create_app(scheduler)) as client:
            long = {
                "model": "specfuse",
                "messages": [{"role": "user", "content": "word " * 80}],
                "max_tokens": 4,
            }
            got = client.post(CHAT, json=long)
            assert got.status_code == 413, got.text
            error = got.json()["error"]
            assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
            assert error["message"].startswith(f"{small.name}: the prompt takes ")
            assert "beyond the model's context of 64;" in error["message"] and not submitted
    finally:
        scheduler.close()
