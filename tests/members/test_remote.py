"""RemoteMember against in-process stubs that speak SGLang's, vLLM's and llama-server's JSON, backed by
the tiny models: drafts equal local greedy drafts, scores equal local log-prob scores, faults name
the member and the server."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

from specfuse.config import EnsembleConfig, MemberSettings
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError, MemberError, UnknownModelError
from specfuse.members.protocol import Member
from specfuse.members.remote.member import ENGINES, RemoteMember, parse_server_spec
from specfuse.members.workers import run_concurrently
from specfuse.models.loading import check_member_name, load_member

from ..conftest import tiny_member
from ..remote_stub import StubServer

LOGPROB = MemberSettings(score="logprob", max_new_tokens=64)
SCORE_TOLERANCE = 1e-4  # fp32, same weights: a full forward vs the packed pass


@pytest.fixture(scope="module")
def local():
    return {spec: tiny_member(spec) for spec in ("llama-bytes", "gemma-meta")}


def served(engine, member, **kwargs):
    stub = StubServer(engine, member, trim_stop=kwargs.pop("trim_stop", False))
    remote = RemoteMember(
        f"{member.name}@{engine}",
        engine,
        stub.url,
        member.tokenizer,
        prompt_format=member.prompt_format,
        timeout=kwargs.pop("timeout", 30),
    )
    return stub, remote


@contextlib.contextmanager
def serving(engine, member, **kwargs):
    """served()'s stub and member for the block; the stub stopped afterwards."""
    stub, remote = served(engine, member, **kwargs)
    try:
        yield stub, remote
    finally:
        stub.stop()


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def test_a_remote_member_implements_the_protocol(local):
    with serving("vllm", local["llama-bytes"]) as (stub, remote):
        assert isinstance(remote, Member)
        assert remote.host == stub.url and remote.device == "server"  # where it works; no local device


@pytest.mark.parametrize("spec", ["llama-bytes", "gemma-meta"])
def test_drafts_scores_and_accepts_equal_the_local_members(local, engine, spec):
    member = local[spec]
    with serving(engine, member, trim_stop=engine == "vllm") as (stub, remote):
        for prompt in ("Once upon a time", "Say something."):
            mine, theirs = member.start(prompt, LOGPROB), remote.start(prompt, LOGPROB)
            assert theirs.ids == mine.ids
            for limit in (1, 4, 10):
                a, b = member.draft(mine, limit), remote.draft(theirs, limit)
                assert (b.text, b.num_tokens, b.final) == (a.text, a.num_tokens, a.final)
            cands = [member.draft(mine, 10), member.draft(mine, 3)]
            cands.append(type(cands[0])("x", cands[0].text + " end", 3, True, 0.0))  # final: end marker
            local_scores = member.score(mine, cands)
            remote_scores = remote.score(theirs, cands)
            if engine == "llama-server":  # byte tokens cannot be forced there: left out of the mean
                local_scores = [whole_token_mean(member, mine, c) for c in cands]
                remote_scores = [
                    z if ref is not None else None for z, ref in zip(remote_scores, local_scores)
                ]
            assert remote_scores == pytest.approx(local_scores, abs=SCORE_TOLERANCE)
            assert len(theirs.token_logprobs) == len(cands) and all(theirs.token_logprobs)
            for text in (cands[0].text, " and then"):
                member.accept(mine, text)
                remote.accept(theirs, text)
                assert theirs.ids == mine.ids
            assert remote.draft(theirs, 10).text == member.draft(mine, 10).text


def whole_token_mean(member, state, cand):
    """The local mean log-prob over the tokens llama-server can force (no split UTF-8 character)."""
    import torch

    from specfuse.members.drafting import scored_tokens

    keep, _, tail = scored_tokens(
        member.encode, state.ids, state.prompt_len, state.answer, cand.text, cand.final, member.end_marker
    )
    ids = state.ids[:keep] + tail
    with torch.inference_mode():
        lp = torch.log_softmax(member.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    values = [
        float(lp[keep + t - 1, tok]) for t, tok in enumerate(tail) if "\ufffd" not in member.decode([tok])
    ]
    return sum(values) / len(values) if values else None  # None: the server spells it its own way


def test_a_remote_ensemble_plays_the_same_rounds_as_the_local_one(local, engine):
    first, second = tiny_member("qwen-merges"), local["gemma-meta"]
    stub, remote = served(engine, second)
    config = EnsembleConfig(score="logprob", max_new_tokens=40, segment_len=6)
    try:
        ours = list(Ensemble([first, second], config, parallel="off").stream("Tell me a story."))
        remote.name = second.name
        theirs = list(Ensemble([first, remote], config, parallel="off").stream("Tell me a story."))
        assert theirs[-1].text == "".join(r.winner.text for r in theirs)
        if engine == "llama-server":  # its scores leave out byte tokens: the rounds may differ
            return
        assert [r.chosen for r in theirs] == [r.chosen for r in ours]
        assert [tuple(c.text for c in r.candidates) for r in theirs] == [
            tuple(c.text for c in r.candidates) for r in ours
        ]
        for a, b in zip(ours, theirs):
            for row_a, row_b in zip(a.raw_scores, b.raw_scores):
                assert row_b == pytest.approx(row_a, abs=SCORE_TOLERANCE)
        assert theirs[-1].text == "".join(r.winner.text for r in theirs)
    finally:
        stub.stop()


def test_sampled_drafts_follow_the_seed(local):
    with serving("sglang", local["llama-bytes"]) as (stub, remote):
        settings = MemberSettings(score="logprob", temperature=1.0, seed=3)
        drafts = [remote.draft(remote.start("Sing", s), 8).text for s in (settings, settings)]
        assert drafts[0] == drafts[1]
        assert stub.requests[-1][1]["sampling_params"]["sampling_seed"] == 3


def test_asking_a_server_for_raw_logits_is_a_config_error_naming_the_member(local):
    with (
        serving("llama-server", local["llama-bytes"]) as (_, remote),
        pytest.raises(ConfigError, match=r"llama-bytes@llama-server: .*log-prob"),
    ):
        remote.start("hi", MemberSettings(score="logit"))


def test_members_on_different_servers_run_concurrently(local):
    (s1, r1), (s2, r2) = served("vllm", local["llama-bytes"]), served("sglang", local["gemma-meta"])
    try:
        assert run_concurrently([r1, r2], Ensemble([r1, r2]).parallel)
        config = EnsembleConfig(score="logprob", max_new_tokens=20)
        result = Ensemble([r1, r2], config, parallel="auto").run("Hello")
        assert result.rounds >= 1
    finally:
        s1.stop()
        s2.stop()


# ---- faults -------------------------------------------------------------------------------------------


def test_a_server_down_at_start_is_a_member_error_naming_member_and_server(local):
    stub, remote = served("sglang", local["llama-bytes"])
    stub.stop()
    with pytest.raises(
        MemberError, match=rf"llama-bytes@sglang: the sglang server at {stub.url} is unreachable"
    ):
        remote.start("hi", LOGPROB)


@pytest.mark.slow  # seconds of waiting on a server: its file is dealt among the first
def test_a_server_killed_mid_run_ends_the_run_with_a_member_error(local, engine):
    first = local["llama-bytes"]
    stub, remote = served(engine, local["gemma-meta"])
    config = EnsembleConfig(score="logprob", max_new_tokens=60, segment_len=4, exit=False)
    stream = Ensemble([first, remote], config).stream("Tell me a story.")
    next(stream)
    stub.stop()
    with pytest.raises(MemberError, match=rf"gemma-meta@{engine}: .*{stub.url}"):
        list(stream)
    # The ensemble is not left broken: with the server back, a new run works.
    stub2, remote2 = served(engine, local["gemma-meta"])
    try:
        assert Ensemble([first, remote2], config).run("Hi").rounds >= 1
    finally:
        stub2.stop()


def test_a_slow_server_times_out_with_a_member_error(local):
    stub, remote = served("llama-server", local["llama-bytes"], timeout=0.3)
    try:
        state = remote.start("hi", LOGPROB)
        stub.slow = 1.0
        with pytest.raises(MemberError, match=rf"{stub.url} did not answer /completion within 0.3 s"):
            remote.draft(state, 5)
    finally:
        stub.slow = 0
        stub.stop()


def test_malformed_json_is_a_member_error(local, engine):
    with serving(engine, local["llama-bytes"]) as (stub, remote):
        state = remote.start("hi", LOGPROB)
        stub.malformed = True
        with pytest.raises(
            MemberError, match=rf"@{engine}: the {engine} server at {stub.url} sent a malformed"
        ):
            remote.draft(state, 5)


def test_a_server_with_another_tokenizer_is_refused_at_start(local):
    stub = StubServer("vllm", local["gemma-meta"])
    remote = RemoteMember("m", "vllm", stub.url, local["llama-bytes"].tokenizer)
    try:
        with pytest.raises(ConfigError, match="tokenizes differently"):
            remote.connect()
    finally:
        stub.stop()


# ---- naming and loading -----------------------------------------------------------------------------


def test_server_specs_parse_with_name_and_options():
    spec = parse_server_spec("llama-server:http://127.0.0.1:8080#smollm2?tokenizer=smollm2-135m&timeout=5")
    assert (spec.engine, spec.url, spec.name, spec.tokenizer, spec.timeout) == (
        "llama-server",
        "http://127.0.0.1:8080",
        "smollm2",
        "smollm2-135m",
        5.0,
    )
    assert parse_server_spec("vllm:http://h:8000/").name == "vllm@h:8000"
    for bad in (
        "tgi:http://h:1#x",
        "vllm:ftp://h#x",
        "vllm:http://h:1#x?color=red",
        "sglang:http://h#x?timeout=-1",
    ):
        with pytest.raises(ConfigError):
            parse_server_spec(bad)


def test_only_the_operator_may_name_a_server():
    spec = "sglang:http://169.254.169.254:80#meta"
    assert check_member_name(spec).kind == "server"
    with pytest.raises(UnknownModelError, match="only the operator"):
        check_member_name(spec, allow_paths=True, allow_servers=False)
    with pytest.raises(UnknownModelError):
        check_member_name(spec, allow_paths=False)


def test_load_member_reaches_a_server_with_a_tokenizer_folder(tiny_checkpoints):
    from specfuse.members.hf import HFMember

    folder = tiny_checkpoints[0]  # llama-bytes
    base = load_member(folder, dtype="float32")
    assert isinstance(base, HFMember)
    stub = StubServer("llama-server", base)
    try:
        member = load_member(f"llama-server:{stub.url}#tiny?tokenizer={folder}")
        assert isinstance(member, RemoteMember) and member.name == "tiny" and member.connected
        assert (
            member.draft(member.start("Hi", LOGPROB), 6).text == base.draft(base.start("Hi", LOGPROB), 6).text
        )
    finally:
        stub.stop()


def test_load_member_sends_a_specs_credentials_and_keeps_them_out_of_sight(tiny_checkpoints):
    """The loader built RemoteMember from the spec's URL alone: the credentials were dropped (401)."""
    import base64

    folder = tiny_checkpoints[0]
    stub = StubServer("llama-server", load_member(folder, dtype="float32"))
    try:
        secret = stub.url.replace("http://", "http://bob:hunter2@")
        member = load_member(f"llama-server:{secret}#tiny?tokenizer={folder}")
        assert stub.headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"bob:hunter2").decode()
        assert "hunter2" not in f"{member!r} {member.url} {member.host}"
    finally:
        stub.stop()


def test_the_cli_takes_a_server_spec_among_its_models(tiny_checkpoints):
    import io

    from specfuse.cli import main
    from specfuse.members.hf import HFMember

    folder, other = tiny_checkpoints
    base = load_member(folder, dtype="float32")
    assert isinstance(base, HFMember)
    stub = StubServer("sglang", base)
    try:
        spec = f"sglang:{stub.url}#served?tokenizer={folder}"
        out, err = io.StringIO(), io.StringIO()
        argv = ["--models", f"{spec},{other}", "--max-new-tokens", "12", "--quiet", "Hi"]
        assert main(["--score", "logit", *argv], stdout=out, stderr=err) == 2  # raw logits of a server
        assert "served: served by sglang" in err.getvalue() and "--score logprob" in err.getvalue()
        assert main(argv, stdout=out, stderr=err) == 0  # log-probs: the default
    finally:
        stub.stop()


def test_served_members_support_log_probs_only(local):
    from specfuse.members.remote.member import supported_scores

    stub, remote = served("vllm", local["llama-bytes"])
    stub.stop()
    assert supported_scores(remote) == ("logprob",)
    assert supported_scores(local["llama-bytes"]) == ("logit", "logprob")


def test_the_app_lets_only_the_operators_servers_through():
    """A browser user of an app started with --allow-paths could otherwise make it reach any URL."""
    import app

    seen = {}

    def load(name, **kwargs):
        seen[name] = kwargs["allow_servers"]
        return types.SimpleNamespace(name=name)  # what the loader reads of a member it did not warm

    operator = "vllm:http://10.0.0.5:8000#big"
    loader = app.SharedLoader(load, allow_paths=True, trusted=[operator])
    for name in (operator, "vllm:http://169.254.169.254:80#typed"):
        loader(name, "cpu", lambda fraction, message: None)
    assert seen == {operator: True, "vllm:http://169.254.169.254:80#typed": False}


# ---- the transport: deadline, retries, redirects, proxies, size caps, credentials -------------------


def test_a_trickling_server_is_cut_off_at_the_overall_deadline(local):
    """One byte every 0.2 s never trips a per-read timeout of 1 s; the request's deadline ends it."""
    import time

    with serving("llama-server", local["llama-bytes"], timeout=1.0) as (stub, remote):
        state = remote.start("hi", LOGPROB)
        stub.fault, stub.trickle_s = "trickle", 0.2
        began = time.monotonic()
        with pytest.raises(MemberError, match=rf"{stub.url} did not answer /completion within 1 s"):
            remote.draft(state, 5)
        assert time.monotonic() - began < 1.5


def test_connections_are_pooled_and_503s_and_resets_are_retried(local):
    member = local["llama-bytes"]
    with serving("sglang", member) as (stub, remote):
        state = remote.start("hi", LOGPROB)
        expected = remote.draft(state, 6).text
        assert len(set(stub.clients)) == 1  # every request so far on one kept-alive connection
        stub.next_faults = ["http503", "reset", "http503"]
        assert remote.draft(state, 6).text == expected
        stub.fault = "http503"
        with pytest.raises(MemberError, match=r"answered HTTP 503 to /generate \(after 4 tries\): <html>"):
            remote.draft(state, 6)


def test_a_redirect_is_not_followed(local):
    stub, remote = served("sglang", local["llama-bytes"])
    elsewhere = StubServer("sglang", local["llama-bytes"])
    try:
        state = remote.start("hi", LOGPROB)
        stub.fault, stub.redirect_to = "redirect", elsewhere.url + "/generate"
        with pytest.raises(MemberError, match=r"HTTP 307 to /generate, a redirect .* not followed"):
            remote.draft(state, 5)
        assert elsewhere.requests == []
    finally:
        stub.stop()
        elsewhere.stop()


@pytest.mark.parametrize("fault", ["big", "flood"])
def test_an_answer_beyond_the_size_cap_is_a_member_error(local, fault):
    with serving("vllm", local["llama-bytes"]) as (stub, remote):
        state = remote.start("hi", LOGPROB)
        remote.http.max_body = 5000
        stub.fault, stub.big_bytes = fault, 20_000
        with pytest.raises(MemberError, match=r"answered /v1/completions with more than 5,000 bytes"):
            remote.draft(state, 5)


def test_an_error_body_is_read_only_in_part(local):
    with serving("vllm", local["llama-bytes"]) as (stub, remote):
        state = remote.start("hi", LOGPROB)
        stub.fault = "http500"
        with pytest.raises(MemberError, match=r"answered HTTP 500 to /v1/completions: <html>") as info:
            remote.draft(state, 5)
        assert len(str(info.value)) < 500


def test_the_environments_proxy_is_used_only_when_the_spec_asks(local, monkeypatch):
    member = local["llama-bytes"]
    stub, remote = served("vllm", member)
    proxy = StubServer("vllm", member)
    proxy.fault = "http500"  # a proxy that records what reaches it
    for var in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, proxy.url)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    try:
        remote.connect()  # the default: straight to the server
        assert proxy.requests == [] and stub.requests
        through = RemoteMember("via", "vllm", stub.url, member.tokenizer, timeout=5, proxy="env")
        with pytest.raises(MemberError, match="via: .* answered HTTP 500 to /v1/models"):
            through.connect()
        assert proxy.requests[0][0] == stub.url + "/v1/models"  # a proxy gets the absolute URL
    finally:
        stub.stop()
        proxy.stop()


def test_credentials_in_a_url_are_sent_as_basic_auth_and_never_shown(local):
    import base64

    member = local["llama-bytes"]
    stub = StubServer("vllm", member)
    secret_url = stub.url.replace("http://", "http://alice:s%40cr3t@")
    spec = parse_server_spec(f"vllm:{secret_url}?tokenizer=x&proxy=env")
    assert (spec.url, spec.auth, spec.proxy) == (stub.url, ("alice", "s@cr3t"), "env")
    assert spec.name == f"vllm@{stub.url.removeprefix('http://')}" and "cr3t" not in repr(spec)
    with pytest.raises(ConfigError) as bad:
        parse_server_spec(f"vllm:{secret_url}?colour=red")
    assert "cr3t" not in str(bad.value) and "***@" in str(bad.value)
    try:
        for remote in (
            RemoteMember(spec.name, "vllm", spec.url, member.tokenizer, auth=spec.auth),
            RemoteMember("m", "vllm", secret_url, member.tokenizer),
        ):
            remote.connect()
            expected = "Basic " + base64.b64encode(b"alice:s@cr3t").decode()
            assert stub.headers[-1]["Authorization"] == expected
            shown = f"{remote!r} {remote.url} {remote.host} {remote.http.where()}"
            assert "cr3t" not in shown and "alice" not in shown and "***@127.0.0.1" in shown
        stub.stop()
        with pytest.raises(MemberError, match=r"m: the vllm server at http://\*\*\*@127") as down:
            remote.connect()
        assert "cr3t" not in str(down.value)
    finally:
        stub.stop()


def test_after_a_refused_answer_the_member_works_on(local):
    """An answer left unread (too big, an error) must not be read as the next request's answer."""
    with serving("sglang", local["llama-bytes"]) as (stub, remote):
        state = remote.start("hi", LOGPROB)
        before = len(stub.requests)
        expected = remote.draft(state, 6).text
        each = len(stub.requests) - before  # requests of one draft, none retried
        remote.http.max_body = 5000
        for fault in ("big", "http500", "redirect"):
            stub.next_faults, stub.big_bytes = [fault], 20_000
            with pytest.raises(MemberError):
                remote.draft(state, 6)
            before = len(stub.requests)
            assert remote.draft(state, 6).text == expected
            assert len(stub.requests) - before == each  # no garbled answer, no retry


def test_a_server_spec_is_read_without_torch():
    """remote/ is a back end of its own (issue 57): reading a spec (the app, the server and the
    loader do it at start-up) loads neither torch nor transformers, as the token rules it shares need
    no tensors."""
    code = (
        "import sys; from specfuse.members.remote.member import parse_server_spec; "
        "spec = parse_server_spec('vllm:http://127.0.0.1:9#m'); "
        "print(spec.name, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["m", "False", "False"]
