"""Fault injection: a served member whose server misbehaves (down, hangs, trickles, malformed, wrong
shape, HTML, HTTP 500 and 503, resets, dies mid-answer, redirects, floods) ends its run within the
deadline with one message that names the member, while another user's run at the same time finishes
with its own answer; and a load stuck on such a server holds up no other load."""

from __future__ import annotations

import threading
import time

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.errors import MemberError
from specfuse.members.remote import RemoteMember

from ..conftest import tiny_member
from ..remote_stub import FAULTS, StubServer

DEADLINE_S = 1.0  # the served member's ?timeout=: each request's whole deadline
SLACK_S = 2.5  # the local member's own work in the failing run, on a busy 2-core machine
FAULTY = EnsembleConfig(score="logprob", max_new_tokens=24, segment_len=4, exit=False)
HEALTHY = EnsembleConfig(max_new_tokens=24, segment_len=4)
PROMPT, OTHER_PROMPT = "Tell me a story.", "The cat sat"


@pytest.fixture(scope="module")
def members():
    """The served model's weights (behind the stand-in), the faulty run's local member, and the
    other user's two members with their answer when alone."""
    healthy = [tiny_member("qwen-merges"), tiny_member("llama-too", "llama-bytes")]
    alone = Ensemble(healthy, HEALTHY).run(OTHER_PROMPT).answer
    return {"served": tiny_member("llama-bytes"), "local": tiny_member("gemma-meta")}, healthy, alone


CASES = [(fault, "mid-run") for fault in ("down", *FAULTS)] + [
    (fault, "start-up") for fault in ("down", "hang", "trickle", "http503", "shape")
]


@pytest.mark.parametrize(("fault", "phase"), CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_a_misbehaving_server_ends_its_run_in_time_and_another_users_run_finishes(members, fault, phase):
    ours, healthy, alone = members
    stub = StubServer("sglang", ours["served"])
    remote = RemoteMember(
        "served",
        "sglang",
        stub.url,
        ours["served"].tokenizer,
        prompt_format=ours["served"].prompt_format,
        timeout=DEADLINE_S,
    )
    remote.http.max_body = 5000
    stub.big_bytes = 20_000
    if phase == "mid-run":
        remote.connect()  # healthy at start-up; the fault comes with the first draft
    other: dict[str, str] = {}

    def other_user() -> None:
        other["answer"] = Ensemble(healthy, HEALTHY).run(OTHER_PROMPT).answer

    user = threading.Thread(target=other_user)
    try:
        if fault == "down":
            stub.stop()
        else:
            stub.fault = fault
        user.start()
        began = time.monotonic()
        with pytest.raises(MemberError) as failed:
            Ensemble([ours["local"], remote], FAULTY).run(PROMPT)
        took = time.monotonic() - began
        user.join(60)
    finally:
        stub.stop()
    message = str(failed.value)
    assert message.startswith(f"served: the sglang server at {stub.url} "), message
    assert "\n" not in message and len(message) < 600
    assert took < DEADLINE_S + SLACK_S, f"{fault} at {phase} took {took:.1f} s: {message}"
    assert not user.is_alive() and other["answer"] == alone  # the other user got their own answer


@pytest.mark.slow  # seconds of waiting on a server: its file is dealt among the first
def test_a_load_stuck_on_a_server_holds_up_no_other_load(tiny_checkpoints):
    """SharedLoader holds no lock across a load: a user loading another model does not wait."""
    from specfuse.members.hf import HFMember
    from specfuse.models.loading import load_member
    from studio.loading import SharedLoader

    folder, other = tiny_checkpoints
    base = load_member(folder, dtype="float32")
    assert isinstance(base, HFMember)
    stub = StubServer("sglang", base)
    stub.fault = "hang"
    spec = f"sglang:{stub.url}#stuck?tokenizer={folder}&timeout=6"
    loader = SharedLoader(allow_paths=True, trusted=[spec], dtype="float32")
    failed: list[str] = []

    def stuck() -> None:
        try:
            loader(spec, "cpu", lambda fraction, message: None)
        except MemberError as e:
            failed.append(str(e))

    user = threading.Thread(target=stuck)
    try:
        user.start()
        for _ in range(300):  # until the stuck load waits on the server
            if stub.requests:
                break
            time.sleep(0.1)
        assert stub.requests
        member = loader(other, "cpu", lambda fraction, message: None)
        assert user.is_alive()  # loaded while the stuck load was still waiting
        user.join(30)
    finally:
        stub.stop()
    assert failed and failed[0].startswith("stuck: ") and "within 6 s" in failed[0]
    assert loader(other, "cpu", lambda fraction, message: None) is member  # still loaded once
