"""Hostile input as a habit, for the HTTP API (issue 24): any JSON body for either endpoint gives a
parsed request or one ApiError with an HTTP status and OpenAI's error shape, never another
exception. Bodies are built from the fields clients send, with any values, and from arbitrary JSON."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfuse.config import EnsembleConfig
from specfuse.limits import Limits
from specfuse.prompts import last_user_text, prompt_chars
from specfuse.serve.ask import parse_request
from specfuse.serve.schema import ApiError

HOSTILE = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
NAMES = ("alpha", "beta")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
VALID = {
    "model": st.sampled_from(["specfuse", "alpha", "beta"]),
    "messages": st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant"]),
                "content": st.text(min_size=1, max_size=40),
            }
        ),
        min_size=1,
        max_size=3,
    ),
}
OPTIONAL = {
    "prompt": st.text(min_size=1, max_size=60),
    "max_tokens": st.integers(1, 64),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1),
    "seed": st.integers(0, 1000),
    "stop": st.lists(st.text(min_size=1, max_size=5), max_size=3),
    "stream": st.booleans(),
    "n": st.just(1),
    "specfuse": st.fixed_dictionaries(
        {}, optional={"segment_len": st.integers(1, 20), "members": st.just(["alpha"])}
    ),
}
KEYS = [*VALID, *OPTIONAL, "bogus", "specfuse"]


def _spoil(pair: tuple[dict, tuple[str, object] | None]) -> dict:
    body, spoiled = pair
    if spoiled is not None:
        body = {**body, spoiled[0]: spoiled[1]}
    return body


# A well-formed body, or one with a single field replaced by any JSON value.
BODY = st.tuples(
    st.fixed_dictionaries(VALID, optional=OPTIONAL), st.none() | st.tuples(st.sampled_from(KEYS), JSON)
).map(_spoil)


def _outcome(body: object, kind: str) -> None:
    try:
        ask = parse_request(
            body, kind, names=NAMES, base=EnsembleConfig(), limits=Limits(max_prompt_chars=200)
        )
    except ApiError as e:
        assert e.status in (400, 404, 413) and e.message
        json.dumps(e.body())  # what the client reads back
        return
    # a chat's prompt is its conversation (issue 44): the question is its last user message
    assert ask.kind == kind and isinstance(ask.config, EnsembleConfig) and last_user_text(ask.prompt).strip()
    assert prompt_chars(ask.prompt) <= 200 and (ask.members is None or set(ask.members) <= set(NAMES))


@HOSTILE
@given(body=BODY, kind=st.sampled_from(["chat", "text"]))
def test_any_request_body_is_parsed_or_refused_with_an_http_status(body, kind):
    _outcome(body, kind)


@HOSTILE
@given(body=JSON, kind=st.sampled_from(["chat", "text"]))
def test_any_json_at_all_is_parsed_or_refused_with_an_http_status(body, kind):
    _outcome(body, kind)


def test_the_strategies_reach_both_outcomes():
    """The properties above mean something only if well-formed bodies are among those tried."""
    good = {"model": "specfuse", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    assert parse_request(good, "chat", names=NAMES, base=EnsembleConfig(), limits=Limits()).prompt
    seen = {"parsed": 0, "refused": 0}

    @settings(max_examples=300, deadline=None, database=None)
    @given(body=BODY)
    def count(body):
        try:
            parse_request(body, "chat", names=NAMES, base=EnsembleConfig(), limits=Limits())
            seen["parsed"] += 1
        except ApiError:
            seen["refused"] += 1

    count()
    assert seen["parsed"] > 0 and seen["refused"] > 0, seen
