"""Verification on static KV slots (members/hf/slot_verify.py, the "graphs" decode path): all runs'
candidates read by one member in one padded pass, candidates that begin alike read once (a prefix
tree). On a CPU the same step runs uncaptured, and its scores equal the eager pass's in fp32 on
three architectures (gemma3 with its sliding-window layers), for several runs of different lengths
in one batch, and what it leaves in each run's cache lets accept() and the next draft go on exactly
as after an eager pass; through the scheduler too. Start-up's preparation of every bucket (the
progress it says, a capture that fails) is tested here uncaptured; the CUDA graphs themselves in
the `gpu` tests at the end, skipped without CUDA."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from specfuse.config import EnsembleConfig, MemberSettings
from specfuse.engine import Scheduler
from specfuse.members.hf import HFMember, slot_verify, slots
from specfuse.members.hf.scoring import Block
from specfuse.members.process import ProcessMember
from specfuse.models.preparation import step_of, warm_up
from specfuse.records import Candidate

from ..conftest import TINY_SPECS, tiny_member
from ..helpers_prefill import assert_same_state
from ..runs import collected_apart, same_rounds, solo

NAMES = list(TINY_SPECS)  # llama-bytes, qwen-merges, gemma-meta
PROMPTS = ["Once upon a time", "Why is the sky blue? Explain it to a child, slowly.", "x = 1 + 2 * 3", "Hi"]
# Candidates that begin alike (a shared first word, one drafted twice) and one unlike the others;
# one final (it ends with the member's end marker).
TEXTS = [" The sky is blue", " The sky is red", " The sky is blue", " Because", " No."]


def cands(texts=TEXTS) -> list[Candidate]:
    return [Candidate("x", t, 3, final=(i == len(texts) - 1), seconds=0.0) for i, t in enumerate(texts)]


def started(member: HFMember, logprob: bool = False) -> list:
    """Four runs of different lengths (different prompts, and answers of 0 to 3 drafts)."""
    settings = MemberSettings(max_new_tokens=60, score="logprob" if logprob else "logit")
    states = [member.start(p, settings) for p in PROMPTS]
    for i, state in enumerate(states):
        for _ in range(i):
            member.accept(state, member.draft(state, 4).text)
    return states


def evidence(member: HFMember, states, texts=TEXTS) -> list[list[tuple]]:
    out = member.verify_many(states, [cands(texts[: 2 + i]) for i in range(len(states))])
    return [[(d.tokens, d.logits, d.logprobs) for d in row] for row in out]


def close(a, b, tol=1e-5) -> None:
    for row_a, row_b in zip(a, b, strict=True):
        for (ta, la, pa), (tb, lb, pb) in zip(row_a, row_b, strict=True):
            assert ta == tb
            assert la == pytest.approx(lb, abs=tol, rel=tol)
            assert pa == pytest.approx(pb, abs=tol, rel=tol)


@pytest.mark.parametrize("gpu_way", [False, True], ids=["cpu", "gpu-way"])
@pytest.mark.parametrize("name", NAMES)
def test_scores_on_the_slots_equal_the_eager_pass(name, gpu_way):
    eager, slotted = tiny_member(name, decode="eager"), tiny_member(name, decode="graphs")
    # A GPU's way: the runs' keys loaded into the slots in one write a layer (not a copy a run), and
    # the RMSNorms fused.
    slotted.slots.batched = slotted.slots.fuse = gpu_way
    e_states, s_states = started(eager, logprob=True), started(slotted, logprob=True)
    assert len({len(s.ids) for s in s_states}) >= 3  # runs of different lengths
    want, got = evidence(eager, e_states), evidence(slotted, s_states)
    close(want, got)
    assert slotted.slots.counts["verifies"] == 1  # all four runs in one pass
    assert any(p for row in got for _, _, p in row)  # log-probabilities compared too
    # The pass's keys and values sit beside each run's cache, which holds its committed tokens only,
    # equal to those the eager pass appended to it (accept appends the winner's from there; the eager
    # pass also leaves its shorter rows' placeholders, past them).
    for i, (e, s) in enumerate(zip(e_states, s_states)):
        packed = sum(len(b.tokens) for b, _, _ in slotted._blocks(s, cands(TEXTS[: 2 + i])))
        assert s.cache.get_seq_length() == len(s.ids) and len(s.ids) + packed <= e.cache.get_seq_length()
        kept = s.packed.side.columns(0, s.packed.side.size)
        for le, ls, side in zip(e.cache.layers, s.cache.layers, kept, strict=True):
            for name, beside in zip(("keys", "values"), side):
                assert beside.shape[2] == packed
                both = torch.cat([getattr(ls, name), beside], dim=-2)
                want = getattr(le, name)[..., : both.shape[2], :]
                torch.testing.assert_close(both, want, atol=1e-5, rtol=1e-5)
    # accept() each run's second candidate, then draft on: the same answers as after the eager pass.
    for member, states in ((eager, e_states), (slotted, s_states)):
        for state in states:
            member.accept(state, TEXTS[1])
    assert [s.ids for s in s_states] == [s.ids for s in e_states]
    next_e = [c.text for c in eager.draft_many(e_states, [6] * 4)]
    assert [c.text for c in slotted.draft_many(s_states, [6] * 4)] == next_e


def test_a_lone_long_run_is_read_drafted_and_verified_wider_in_the_same_memory():
    """A store made for four runs of 512 columns holds one run of 1,300 tokens as one row of 2,048
    columns (members/hf/slot_layer.py): no new allocation, so on a GPU the other widths' graphs stay
    valid; its prompt's read, its draft and its scores are the eager path's. Four runs of 600 tokens
    need more: then the store is made again, wider."""
    eager, slotted = tiny_member("llama-bytes", decode="eager"), tiny_member("llama-bytes", decode="graphs")
    eager.max_positions = slotted.max_positions = 4096  # its config says 512; its rotary has no bound
    store = slotted.slots
    evidence(slotted, started(slotted, logprob=True))  # four runs: a store of 4 x 512
    memory = [layer.memory[0].data_ptr() for layer in store.layers]
    settings = MemberSettings(max_new_tokens=60, score="logprob")
    prompt = "word " * 260  # 1,300 byte tokens
    reads = store.counts["prefills"]
    want, got = eager.start(prompt, settings), slotted.start(prompt, settings)
    assert store.counts["prefills"] - reads == 6  # on the slots, 256 tokens a step, widths 512 to 2,048
    assert_same_state(got, want, slotted)
    assert slotted.draft_many([got], [8])[0].text == eager.draft_many([want], [8])[0].text
    close(evidence(eager, [want]), evidence(slotted, [got]))
    assert store.shape.width == 2048 and store.counts["verifies"] == 2
    assert [layer.memory[0].data_ptr() for layer in store.layers] == memory
    assert (store.rows, store.capacity) == (4, slots.MIN_WIDTH)
    slotted.draft_many([slotted.start("word " * 120, settings) for _ in range(4)], [4] * 4)
    assert (store.rows, store.capacity) == (4, 1024)  # 4 x 1,024 columns: made again


def test_candidates_that_begin_alike_are_read_once():
    member = tiny_member("llama-bytes", decode="graphs")
    (state,) = started(member)[:1]
    blocks = member._blocks(state, cands())
    tree = slot_verify.tree([b for b, _, _ in blocks])
    eager_tokens = sum(len(b.tokens) for b, _, _ in blocks)
    assert len(tree.node_of) == eager_tokens
    # The anchor is shared by all five, " The sky is" by three, one candidate is another's double.
    assert len(tree.tokens) < eager_tokens - 10
    assert tree.parents.count(-1) == 1
    # Blocks with different anchors never share, even with the same tokens.
    two = slot_verify.tree([Block(3, (7, 8, 9)), Block(4, (7, 8, 9)), Block(3, (7, 8, 5))])
    assert two.parents == (-1, 0, 1, -1, 3, 4, 1) and two.node_of == (0, 1, 2, 3, 4, 5, 0, 1, 6)
    assert two.positions == (3, 4, 5, 4, 5, 6, 5)


def test_too_many_tokens_or_a_busy_store_verify_eagerly_and_the_same():
    eager, slotted = tiny_member("qwen-merges", decode="eager"), tiny_member("qwen-merges", decode="graphs")
    long = [" word" * 60, " other" * 4]  # over 256 nodes: past the largest bucket
    want = evidence(eager, started(eager)[:2], long)
    close(want, evidence(slotted, started(slotted)[:2], long))
    store = slotted.slots
    assert store.counts["verifies"] == 0
    states = started(slotted)
    with store._lock:  # another thread holds the slots
        got = evidence(slotted, states)
    close(evidence(eager, started(eager)), got)
    assert store.counts["verifies"] == 0 and store.counts["busy"] >= 1


def test_verification_through_the_scheduler_on_slots_equals_eager_solo_runs():
    eager = [tiny_member(n, decode="eager") for n in NAMES]
    slotted = [tiny_member(n, decode="graphs") for n in NAMES]
    config = EnsembleConfig(segment_len=4, max_new_tokens=16)
    expected = [solo(eager, NAMES, p, config) for p in PROMPTS]
    got = collected_apart(Scheduler(slotted, batch_size=4), [(p, config, None) for p in PROMPTS], gap=0.1)
    for want, (_, rounds) in zip(expected, got):
        same_rounds(want, rounds, atol=1e-5)
    assert all(m.slots.counts["verifies"] > 0 for m in slotted)


# -- start-up ----------------------------------------------------------------------------------------


def test_preparing_every_bucket_says_its_progress_and_keeps_the_answers():
    # On a CPU nothing is captured; the same start-up code runs each step once, uncaptured.
    member = tiny_member("gemma-meta", decode="graphs")
    said: list[tuple[float, str]] = []
    state = member.start("Say hello.", MemberSettings(max_new_tokens=4))
    captured = member.slots.prepare(state.cache, lambda f, m: said.append((f, m)), rows=(1, 2, 4))
    n = 3 + 3 * len(slots.STARTUP_VERIFY)
    assert captured == 0
    how = "(uncaptured: no CUDA graphs on this device)"
    assert [m for _, m in said] == [f"gemma-meta: capturing graphs {k}/{n} {how}" for k in range(1, n + 1)]
    assert [f for f, _ in said] == sorted(f for f, _ in said) and said[-1][0] < 1.0
    assert {step_of(m) for _, m in said} == {"capturing graphs"}
    assert (member.slots.rows, member.slots.capacity) == (4, slots.STARTUP_CAPACITY)
    eager = tiny_member("gemma-meta", decode="eager")
    close(evidence(eager, started(eager)), evidence(member, started(member)))


def test_a_capture_that_fails_at_start_up_is_said_and_the_member_runs_uncaptured(caplog):
    # The CPU has no CUDA graphs: a store told to capture fails at its first capture, as a GPU's
    # would (out of memory, an operation capture forbids), and says so once.
    member = tiny_member("llama-bytes", decode="graphs")
    member.slots.capture = True
    said: list[str] = []
    state = member.start("Say hello.", MemberSettings(max_new_tokens=4))
    with caplog.at_level(logging.WARNING, logger="specfuse.members.hf.slots"):
        assert member.slots.prepare(state.cache, lambda f, m: said.append(m), rows=(1, 2)) == 0
    assert said[0] == f"llama-bytes: capturing graphs 1/{2 + 2 * len(slots.STARTUP_VERIFY)}"
    assert len(said) == 2 and said[1].startswith("llama-bytes: capturing graphs failed: steps run uncaptured")
    assert "drafting and verifying uncaptured on KV slots (CUDA graph capture failed" in caplog.text
    assert member.slots.capture_off and not member.slots.graphs
    eager = tiny_member("llama-bytes", decode="eager")
    close(evidence(eager, started(eager)), evidence(member, started(member)))
    assert member.slots.counts["verifies"] == 1


def test_warm_up_prepares_the_steps_where_they_are_captured_only():
    said: list[str] = []
    member = tiny_member("qwen-merges", decode="graphs")  # a CPU: uncaptured, nothing to prepare
    warm_up(member, progress=lambda f, m: said.append(m))
    assert said == [] and member.slots.counts["verifies"] == 1
    member = tiny_member("qwen-merges", decode="graphs")
    member.slots.capture = True  # as on a GPU: prepared at warm-up, and here it fails (no CUDA)
    warm_up(member, progress=lambda f, m: said.append(m))
    assert said[0].startswith("qwen-merges: capturing graphs 1/") and "failed" in said[-1]
    # The warm-up's own prompt was read before the slots existed: eagerly, nothing captured for it.
    assert member.slots.counts["prefills"] == 0


def capturing(name: str) -> HFMember:
    """A member built (in a worker process) as on a GPU, told to capture: on a CPU that fails."""
    member = tiny_member(name, decode="graphs")
    member.slots.capture = True
    return member


def test_a_member_in_a_worker_process_prepares_there_and_says_how_it_went():
    member = ProcessMember(functools.partial(capturing, "llama-bytes"), threads=1)
    plain = ProcessMember(functools.partial(tiny_member, "qwen-merges", decode="graphs"), threads=1)
    said: list[str] = []
    try:
        warm_up(plain, progress=lambda f, m: said.append(m))
        assert said == [] and not plain.captures  # uncaptured on a CPU: nothing to say
        warm_up(member, progress=lambda f, m: said.append(m))
    finally:
        member.close()
        plain.close()
    assert member.captures and said[0] == "llama-bytes: capturing graphs (in its worker process)"
    assert len(said) == 2 and said[1].startswith("llama-bytes: capturing graphs failed: steps run uncaptured")
    assert {step_of(m) for m in said} == {"capturing graphs"}


# -- on a GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_captured_verification_equals_the_eager_pass(name):
    """On CUDA, fp32: every bucket captured at start-up, the runs' scores from a replay equal the
    eager pass's, and accept() and the next drafts go on as after it."""
    cpu = tiny_member(name)
    model = cpu.model.to("cuda")
    eager = HFMember(name, model, cpu.tokenizer, device="cuda", decode="eager")
    graphs = HFMember(name, model, cpu.tokenizer, device="cuda", decode="graphs")
    said: list[str] = []
    warm_up(graphs, progress=lambda f, m: said.append(m))
    store = graphs.slots
    assert store.capture_off is None, store.capture_off
    n = len(slots.BUCKETS) * (1 + len(slots.STARTUP_VERIFY))
    assert store.counts["captures"] == n and said[-1] == f"{name}: capturing graphs {n}/{n}"
    assert store.replay_ms == {}  # start-up captures, it times nothing
    store.time_replays()  # bench serve's, after its levels
    assert len(store.replay_ms) == n and all(ms > 0 for ms in store.replay_ms.values())
    e_states, g_states = started(eager, logprob=True), started(graphs, logprob=True)
    close(evidence(eager, e_states), evidence(graphs, g_states), tol=1e-4)
    assert store.counts["verify_replays"] >= 1 and store.counts["replays"] >= 1
    for member, states in ((eager, e_states), (graphs, g_states)):
        for state in states:
            member.accept(state, TEXTS[1])
    next_e = [c.text for c in eager.draft_many(e_states, [6] * 4)]
    assert [c.text for c in graphs.draft_many(g_states, [6] * 4)] == next_e


@pytest.mark.gpu
def test_gpu_a_lone_long_run_leaves_the_start_up_graphs_valid():
    """On CUDA, fp32: a run of 1,300 tokens after start-up's captures (32 runs x 512 columns) reads,
    drafts and verifies wider in the same memory, as the eager path does; the start-up's graphs are
    kept (none captured again) and four short runs replay them, scoring as the eager pass."""
    cpu = tiny_member("llama-bytes")
    model = cpu.model.to("cuda")
    eager = HFMember("llama-bytes", model, cpu.tokenizer, device="cuda", decode="eager")
    graphs = HFMember("llama-bytes", model, cpu.tokenizer, device="cuda", decode="graphs")
    eager.max_positions = graphs.max_positions = 4096  # its config says 512; its rotary has no bound
    warm_up(graphs)
    store = graphs.slots
    assert store.capture_off is None, store.capture_off
    kept = {key: graph.graph for key, graph in store.graphs.items()}
    settings = MemberSettings(max_new_tokens=60, score="logprob")
    want, got = (m.start("word " * 260, settings) for m in (eager, graphs))
    assert graphs.draft_many([got], [8])[0].text == eager.draft_many([want], [8])[0].text
    close(evidence(eager, [want]), evidence(graphs, [got]), tol=1e-4)
    assert all(store.graphs[key].graph is graph for key, graph in kept.items())
    replays = store.counts["verify_replays"]
    close(
        evidence(eager, started(eager, logprob=True)),
        evidence(graphs, started(graphs, logprob=True)),
        tol=1e-4,
    )
    assert store.counts["verify_replays"] > replays
