"""Copies between the host and the device that do not hold up the host (members/hf/transfer.py): on
a CPU plain copies; a verification on the KV slots reads back to the host once, and copies onto the
device only through them (tools/slot_launches.py's count, which the GPU's stream would wait on);
marked `gpu`: on CUDA none of them synchronises, where torch.tensor(..., device=...) does. And the
same tool's --host clock: each phase timed without the steps."""

from __future__ import annotations

import time

import pytest
import torch

from specfuse.config import MemberSettings
from specfuse.members.hf import transfer
from specfuse.records import Candidate

from ..conftest import tiny_member
from ..repo_tools import load_tool


def test_on_a_cpu_they_are_plain_copies():
    host = torch.arange(12).reshape(3, 4)
    torch.testing.assert_close(transfer.to_device(host.T, "cpu"), host.T)  # not contiguous
    assert transfer.tensor_on([[1, 2], [3, 4]], "cpu", torch.int32).tolist() == [[1, 2], [3, 4]]
    assert transfer.tensor_on([1, 2], "cpu").dtype == torch.long
    buffer = torch.zeros(3, 4, dtype=torch.long)
    transfer.copy_into(buffer, host)
    assert torch.equal(buffer, host)
    assert transfer.read_later(host.double())() == host.double().tolist()


@pytest.mark.parametrize("runs", [1, 4])
def test_a_verification_on_the_slots_reads_back_once(runs):
    tool = load_tool("slot_launches")
    member = tiny_member("gemma-meta", decode="graphs")
    member.slots.batched = member.slots.fuse = True  # a GPU's way
    settings = MemberSettings(max_new_tokens=60, score="logprob")
    states = [member.start(f"Question {i}: why?", settings) for i in range(runs)]
    drafts = member.draft_many(states, [5] * runs)
    candidates = [[Candidate("m", t, 3, False, 0.0) for t in (d.text, "An answer")] for d in drafts]
    ops = tool.Ops()
    syncs = tool.Syncs(ops)
    ops.phase = "verify"
    with syncs:
        scored = member.verify_many(states, candidates)
    assert syncs.counts["verify"] == 1  # the logits and log-probabilities, in one read
    assert all(len(s.logprobs) == len(s.logits) > 0 for row in scored for s in row)
    # The counter sees what it should: a boolean mask's indexing and a blocking copy onto the device.
    with syncs:
        x = torch.arange(4)
        x[x > 1]
        torch.tensor([1], device="cpu")
    assert syncs.counts["verify"] == 3


@pytest.mark.gpu
def test_gpu_copies_onto_the_device_and_reads_later_do_not_synchronise():
    """On CUDA with sync debugging set to raise: the transfers queue behind the stream's work; a
    blocking copy onto the device raises there (the mode works)."""
    device = "cuda"
    buffer = torch.zeros(2, 3, dtype=torch.long, device=device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on = transfer.tensor_on([[1, 2, 3], [4, 5, 6]], device)
        transfer.copy_into(buffer, torch.ones(2, 3, dtype=torch.long))
        read = transfer.read_later(on.double() + buffer)
        with pytest.raises(RuntimeError):
            torch.tensor([1, 2], device=device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert read() == [[2.0, 3.0, 4.0], [5.0, 6.0, 7.0]]


def test_the_host_clock_times_each_phase_without_the_steps():
    """tools/slot_launches.py --host: a round's draft, verification and accept each timed, the
    store's steps taken out (here each step made 20 ms slower: none of it lands in a phase)."""
    tool = load_tool("slot_launches")
    member = tiny_member("llama-bytes", decode="graphs")
    states = tool.started(member, 2)
    clock = tool.Clock()
    run = member.slots.run

    def slow(*args):
        time.sleep(0.02)
        return run(*args)

    member.slots.run = clock.timed(slow)
    began = time.perf_counter()
    tool.one_round(member, states, clock.mark)
    wall = time.perf_counter() - began
    steps = member.slots.counts["steps"] + member.slots.counts["verifies"]
    assert steps >= 3 and clock.stepping >= 0.02 * steps
    assert set(clock.ms) == {"draft", "verify", "accept"} and all(ms > 0 for ms in clock.ms.values())
    assert sum(clock.ms.values()) == pytest.approx(1e3 * (wall - clock.stepping), abs=1.0)
    assert sum(clock.ms.values()) < 1e3 * 0.02 * steps  # none of the steps' sleeps
