"""The ensemble's log-probabilities through the API (docs/api.md#log-probabilities): on chat and
completions, whole and streamed, equal to what the trace's token evidence says; echo scoring a given
text as the verification pass does, in the reference tokenizer's tokens (/tokenize); the refusals of
bad combinations; the span arithmetic that lays one tokenization on another. Tiny random-weight
members of three architectures and tokenizers."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import httpx
import pytest
import torch

from specfuse import feedback
from specfuse.config import EnsembleConfig
from specfuse.engine import Scheduler
from specfuse.limits import Limits
from specfuse.serve import logprobs
from specfuse.trace import parse_trace

from ..conftest import TINY_SPECS, tiny_member
from ..helpers_clients import ROOT, api_on, run_lm_eval

MC_TASK = ROOT / "tests" / "data" / "lm_eval_mc"  # specfuse_mc40.yaml: docs/evaluation.md runs it whole

BASE = EnsembleConfig(segment_len=5, max_new_tokens=20)
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
PROMPT = "Why is the sky blue?"


def printable(member):
    """The member with an output head that rules out every token but printable ASCII and its end:
    random weights otherwise write bytes that are no text, which no tokenization spells back."""
    head = member.model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight
    with torch.no_grad():
        biased.bias.fill_(0.0)
        for token in range(head.out_features):
            text = member.tokenizer.decode([token]) if token < len(member.tokenizer) else ""
            if token != member.tokenizer.eos_token_id and not (
                text and text.isascii() and text.isprintable()
            ):
                biased.bias[token] = -1e4
    member.model.lm_head = biased
    return type(member)(member.name, member.model, member.tokenizer, device="cpu")


@pytest.fixture(scope="module")
def members():
    return [printable(tiny_member(name)) for name in TINY_SPECS]


@pytest.fixture(scope="module")
def server(members):
    scheduler = Scheduler(members, BASE, batch_size=4, queue=8)
    with api_on(scheduler, limits=Limits(max_prompt_chars=2000, max_tokens=40)) as (url, _):
        yield url, members


def post(url, path, **body):
    got = httpx.post(url + path, json={"model": "specfuse", **body}, timeout=120)
    assert got.status_code == 200, got.text
    return got.json()


def ask(**fields):
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16, **fields}


def trace_of(url, reply):
    return parse_trace(httpx.get(f"{url}/v1/traces/{reply['specfuse']['trace_id']}").text)


def test_a_member_alone_gets_its_own_token_log_probabilities_exactly():
    # Byte-level without merges, and ASCII only: its tokens are the answer's characters.
    with api_on(Scheduler([printable(tiny_member("llama-bytes"))], BASE)) as (url, _):
        reply = post(url, CHAT, **ask(logprobs=True, top_logprobs=3))
        trace = trace_of(url, reply)
    content = reply["choices"][0]["logprobs"]["content"]
    want = []
    for rnd in trace.rounds:
        (row,) = rnd.token_scores  # every round scored, the lone rounds too (by their drafter)
        n = len(rnd.winner.text.encode("utf-8"))  # one token a byte; the end marker is not the answer's
        want += row[rnd.chosen].logprobs[:n]
    assert [t["logprob"] for t in content] == pytest.approx(want, abs=1e-9)
    assert "".join(t["token"] for t in content) == reply["choices"][0]["message"]["content"]
    for t in content:  # its alternatives are its own top 3, the likeliest first
        values = [a["logprob"] for a in t["top_logprobs"]]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert t["logprob"] <= values[0] + 1e-9
        assert t["bytes"] == list(t["token"].encode("utf-8"))


def test_chat_logprobs_equal_the_weighted_median_of_the_traces_verifier_scores(server):
    url, members = server
    reply = post(url, CHAT, **ask(logprobs=True))
    content = reply["choices"][0]["logprobs"]["content"]
    trace = trace_of(url, reply)
    assert trace.config.aggregation == "median" and all(r.token_scores for r in trace.rounds)
    assert "".join(t["token"] for t in content) == trace.result.answer
    for t in content:
        assert t["top_logprobs"] == []  # none asked
    # Recomputed from the trace alone: each token's value is the weighted median, over that round's
    # verifiers (weights as the round was judged with), of each verifier's log-probabilities shared
    # out by characters onto the first verifier's tokens.
    got = iter(content)
    for rnd in trace.rounds:
        index = {m: i for i, m in enumerate(rnd.members)}
        weights = [rnd.weights_before[index[v]] for v in rnd.verifiers]
        for token in logprobs.round_tokens(rnd, trace.config, 0):
            mapped = []
            base = len(rnd.text) - len(rnd.winner.text)
            before, segment = rnd.text[:base], rnd.winner.text
            for row in rnd.token_scores:
                ts = row[rnd.chosen]
                shift = logprobs.shift_of(ts.tokens, before, segment)
                spans = logprobs.spans_in(ts.tokens, before[base - shift :] + segment)
                lo, hi = token.offset, token.offset + len(token.text)
                share = 0.0  # each of its tokens' log-probability, shared out by characters
                for (a, b), v in zip(spans, ts.logprobs):
                    a, b = base + a - shift, base + b - shift
                    if b > a and min(b, hi) > max(a, lo):
                        share += v * (min(b, hi) - max(a, lo)) / (b - a)
                mapped.append(share)
            assert next(got)["logprob"] == pytest.approx(feedback.weighted_median(mapped, weights), abs=1e-9)


def test_completions_logprobs_whole_and_streamed_agree(server):
    url, _ = server
    body = {"prompt": PROMPT, "max_tokens": 12, "logprobs": 2}
    whole = post(url, TEXT, **body)["choices"][0]
    lp = whole["logprobs"]
    assert "".join(lp["tokens"]) == whole["text"]
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert top[token] == value and len(top) <= 3  # the chosen token always in it, as OpenAI's
    streamed = {"tokens": [], "token_logprobs": []}
    with httpx.stream(
        "POST", url + TEXT, json={"model": "specfuse", **body, "stream": True}, timeout=120
    ) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    if choice["logprobs"]:
                        streamed["tokens"] += choice["logprobs"]["tokens"]
                        streamed["token_logprobs"] += choice["logprobs"]["token_logprobs"]
    assert streamed["tokens"] == lp["tokens"]
    assert streamed["token_logprobs"] == pytest.approx(lp["token_logprobs"])


def test_echo_scores_the_prompt_in_the_reference_tokens_first_null(server):
    url, members = server
    text = "The sky is blue because the air scatters blue light."
    ids = httpx.post(url + "/tokenize", json={"prompt": text}).json()["tokens"]
    assert httpx.post(url + "/detokenize", json={"tokens": ids}).json()["prompt"] == text
    info = httpx.get(url + "/tokenizer_info").json()
    assert info["eos_token"] == members[0].tokenizer.eos_token
    for prompt in (text, ids):  # as text, and as the reference tokenizer's ids (lm-eval's way)
        got = post(url, TEXT, prompt=prompt, max_tokens=0, echo=True, logprobs=1)["choices"][0]
        lp = got["logprobs"]
        assert got["text"] == text and len(lp["tokens"]) == len(ids) and "".join(lp["tokens"]) == text
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(v < 0 and math.isfinite(v) for v in lp["token_logprobs"][1:])
        assert got["finish_reason"] == "length"
    # max_tokens 1 (what lm-eval sends): one token more, the likeliest by the same aggregate.
    more = post(url, TEXT, prompt=text, max_tokens=1, echo=True, logprobs=1)["choices"][0]["logprobs"]
    assert more["tokens"][: len(ids)] == lp["tokens"] and len(more["tokens"]) == len(ids) + 1
    assert more["token_logprobs"][:-1] == lp["token_logprobs"]
    last = more["top_logprobs"][-1]
    assert more["token_logprobs"][-1] == max(last.values())


def test_echo_is_the_verification_pass_each_member_alone_agrees_with_its_own_score(server):
    url, members = server
    text = "the cat sat"
    alone = members[0].name
    got = post(url, TEXT, model=alone, prompt=text, max_tokens=0, echo=True, logprobs=0)
    lp = got["choices"][0]["logprobs"]["token_logprobs"]
    trace = trace_of(url, got)
    (rnd,) = trace.rounds
    ((ts,),) = rnd.token_scores
    assert rnd.verifiers == (alone,) and ts.tokens[: len(text)] == tuple(text)
    assert lp[1:] == pytest.approx(list(ts.logprobs[1 : len(text)]), abs=1e-9)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"top_logprobs": 2}, "top_logprobs"),
        (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (CHAT, {"logprobs": 1}, "logprobs"),
        (CHAT, {"echo": True}, "echo"),
        (CHAT, {"max_tokens": 0}, "max_tokens"),
        (TEXT, {"logprobs": 21}, "logprobs"),
        (TEXT, {"logprobs": True}, "logprobs"),
        (TEXT, {"top_logprobs": 3}, "top_logprobs"),
        (TEXT, {"max_tokens": 0}, "max_tokens"),
        (TEXT, {"echo": True, "max_tokens": 5}, "max_tokens"),
        (TEXT, {"echo": True, "max_tokens": 0, "stream": True}, "stream"),
        (TEXT, {"echo": True, "max_tokens": 0, "n": 2}, "n"),
        (TEXT, {"prompt": [1, -4]}, "prompt"),
        (TEXT, {"prompt": [10**9]}, "prompt"),
    ],
)
def test_bad_combinations_are_openai_errors_naming_the_field(server, path, body, param):
    url, _ = server
    base = {"messages": [{"role": "user", "content": "x"}]} if path == CHAT else {"prompt": "x"}
    got = httpx.post(url + path, json={"model": "specfuse", **base, **body}, timeout=60)
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_spans_lay_split_characters_and_end_markers_where_they_belong():
    text = "Paris. Ü and 日"
    pieces = ["Paris", ".", " \ufffd", "\ufffd", " and", " \ufffd", "\ufffd", "\ufffd", "<eos>"]
    spans = logprobs.spans_in(pieces, text)
    assert [text[a:b] for a, b in spans[:2]] == ["Paris", "."]
    assert spans[2] == (6, 8) and spans[3] == (7, 8)  # " Ü" and the rest of Ü end together
    assert text[slice(*spans[4])] == " and"
    assert spans[5] == (12, 14) and spans[6] == spans[7] == (13, 14)  # 日's three parts
    assert spans[-1] == (14, -1)  # the end marker: where the text stopped, counting toward nothing
    # A verifier that re-read the end of the answer (a merge across the boundary) scored its tail first.
    assert logprobs.shift_of(["is", " Paris"], "It is", " Paris") == 2


def test_logprobs_requests_play_the_same_answer(server):
    url, _ = server
    plain = post(url, CHAT, **ask())["choices"][0]["message"]["content"]
    scored = post(url, CHAT, **ask(logprobs=True, top_logprobs=2))["choices"][0]["message"]["content"]
    assert scored == plain


def test_gated_rounds_are_scored_by_the_gatekeeper_alone(server):
    url, members = server
    reply = post(url, CHAT, **ask(logprobs=True, specfuse={"gate": True, "gate_threshold": -100.0}))
    trace = trace_of(url, reply)
    gated = [r for r in trace.rounds if r.gated]
    assert gated and all(r.verifiers == (r.gate.member,) and not r.verified for r in gated)
    content = reply["choices"][0]["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == trace.result.answer
    assert replace(trace.config, gate=False) != trace.config


@pytest.mark.slow
def test_lm_eval_runs_a_multiple_choice_loglikelihood_task_against_the_served_ensemble(server, tmp_path):
    # lm-eval's local-completions: /tokenizer_info and /tokenize found (its remote tokenizer), each
    # choice sent as the ids of context + continuation with echo, max_tokens 1, logprobs 1.
    url, _ = server
    out = tmp_path / "out"
    done = run_lm_eval(url, MC_TASK, "specfuse_mc40", out, "--limit", "4", completions=True, concurrent=1)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "remote tokenizer" in done.stdout + done.stderr
    (results,) = out.rglob("results_*.json")
    scores = json.loads(results.read_text())["results"]["specfuse_mc40"]
    assert 0.0 <= scores["acc,none"] <= 1.0 and "acc_norm,none" in scores
    (samples,) = out.rglob("samples_specfuse_mc40_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:  # each choice: (its continuation's summed log-probability, is_greedy)
        assert len(row["resps"]) == 4
        for ((total, greedy),) in row["resps"]:
            assert (
                math.isfinite(float(total)) and float(total) < 0 and greedy in (True, False, "True", "False")
            )
