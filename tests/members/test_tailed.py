"""accept() after a verification on the KV slots leaves the winner's keys and values where the
verification put them (members/hf/tailed.py): the run's cache layers note them as a tail, the next
batched load into the slots joins them in the concatenation it makes anyway (each run's layers then
views of it), and anything else that reads a layer gets them joined first. The same answers as the
eager path, on three architectures, a layer at a time and through the scheduler."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specfuse.config import EnsembleConfig, MemberSettings
from specfuse.engine import Scheduler
from specfuse.members.hf import HFMember
from specfuse.members.hf.tailed import IDLE_LOADS, Tail, TailedLayer, defer, run_parts
from specfuse.models.preparation import warm_up
from specfuse.records import Candidate

from ..conftest import TINY_SPECS, tiny_member
from ..runs import collected_apart, same_rounds, solo

NAMES = list(TINY_SPECS)  # llama-bytes, qwen-merges, gemma-meta
PROMPTS = ["Once upon a time", "Why is the sky blue? Explain it to a child.", "x = 1 + 2 * 3", "Hi there"]
TEXTS = [" The sky is blue", " The sky is red", " Because", " No."]


def candidates() -> list[Candidate]:
    return [Candidate("x", t, 3, final=False, seconds=0.0) for t in TEXTS[:3]]


def verified_and_accepted(member) -> list:
    """Four runs of different lengths, each verifying three candidates and accepting the second."""
    settings = MemberSettings(max_new_tokens=60)
    states = [member.start(p, settings) for p in PROMPTS]
    for i, state in enumerate(states[1:], 1):
        member.accept(state, member.draft(state, 2 + i).text)
    member.verify_many(
        states, [[Candidate("x", t, 3, final=False, seconds=0.0) for t in TEXTS[:3]] for _ in states]
    )
    for state in states:
        member.accept(state, TEXTS[1])
    return states


@pytest.mark.parametrize("stacked", [True, False], ids=["all-layers", "a-layer-at-a-time"])
@pytest.mark.parametrize("name", NAMES)
def test_a_verified_winner_is_joined_by_the_next_batched_load_and_drafts_go_on_the_same(name, stacked):
    eager, slotted = tiny_member(name, decode="eager"), tiny_member(name, decode="graphs")
    # A GPU's load: one concatenation and one indexed write, for every layer at once (the store's
    # layers in one allocation, slot_layer.Stack) or a layer at a time; the gathers after a
    # verification likewise.
    slotted.slots.batched, slotted.slots.stacked = True, stacked
    e_states, s_states = verified_and_accepted(eager), verified_and_accepted(slotted)
    assert [s.ids for s in s_states] == [s.ids for s in e_states]
    for state in s_states:  # noted, not joined: the layer's own columns end at the winner's anchor
        for layer in state.cache.layers:
            assert type(layer) is TailedLayer and layer.tail is not None and layer.tail.count > 0
            own, tail = layer.pieces(0)  # [kv heads, n, head dim] each
            assert own.shape[1] + tail.shape[1] == len(state.ids) and tail.shape[1] == layer.tail.count
            assert layer.get_seq_length() == len(state.ids)
    want = [c.text for c in eager.draft_many(e_states, [6] * 4)]
    assert [c.text for c in slotted.draft_many(s_states, [6] * 4)] == want
    # The load joined every tail, each run's layer now a view of that load's concatenation (one for
    # every layer's keys when stacked).
    assert slotted.slots.stack is not None  # the tiny members' layers are alike
    storages = set()
    for i in range(len(s_states[0].cache.layers)):
        layers = [s.cache.layers[i] for s in s_states]
        assert all(x.tail is None for x in layers)
        storages |= {x.keys.untyped_storage().data_ptr() for x in layers}
    assert len(storages) == (1 if stacked else len(s_states[0].cache.layers))
    for e, s in zip(e_states, s_states):
        for le, ls in zip(e.cache.layers, s.cache.layers):
            n = len(s.ids)
            assert ls.keys.shape[-2] == n
            torch.testing.assert_close(ls.keys, le.keys[..., :n, :], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ls.values, le.values[..., :n, :], atol=1e-5, rtol=1e-5)


def test_a_tailed_layer_reads_joined_and_keeps_its_tail_through_a_write():
    torch.manual_seed(0)
    keys, values = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    side = [(torch.randn(3, 2, 8, 4), torch.randn(3, 2, 8, 4))]  # a verification's, 3 runs of 8 nodes
    cache = DynamicCache([(keys, values)])
    defer(cache, 5, Tail(side, 1, 2, 3))  # its first 5 columns, then run 1's nodes 2..4
    layer = cache.layers[0]
    assert type(layer) is TailedLayer and cache.get_seq_length() == 8 and layer.tail is not None
    pieces = layer.pieces(0)
    assert [p.shape[1] for p in pieces] == [5, 3] and torch.equal(pieces[1], side[0][0][1, :, 2:5])
    cache.crop(-2)  # transformers' own crop: reads the keys (joined), writes them, then the values
    assert layer.tail is None and cache.get_seq_length() == 6
    torch.testing.assert_close(layer.keys, torch.cat([keys[..., :5, :], side[0][0][1:2, :, 2:3]], dim=-2))
    torch.testing.assert_close(layer.values, torch.cat([values[..., :5, :], side[0][1][1:2, :, 2:3]], dim=-2))
    # Writing the keys alone (no read first) joins the values' tail, never drops it.
    defer(cache, 6, Tail(side, 2, 0, 2))
    layer.keys = torch.zeros(1, 2, 8, 4)
    assert layer.values.shape[-2] == 8 and torch.equal(layer.values[..., 6:, :], side[0][1][2:3, :, 0:2])
    # A second accept before any load joins the first tail before noting the next.
    defer(cache, 8, Tail(side, 0, 1, 1))
    defer(cache, 9, Tail(side, 0, 5, 2))
    assert cache.get_seq_length() == 11 and torch.equal(layer.values[..., 8:9, :], side[0][1][0:1, :, 1:2])
    # rebase: the layer as a view of a load's concatenation, its tail joined by that copy.
    defer(cache, 11, Tail(side, 0, 0, 1))
    joined = (torch.randn(2, 3, 20, 4), torch.randn(2, 3, 20, 4))  # three layers' [kv heads, layers, N, D]
    layer.rebase(joined, 1, 4, 1)  # the second of them, from column 4
    assert layer.tail is None and cache.get_seq_length() == 12
    (values,) = layer.pieces(1)
    assert torch.equal(values, joined[1][:, 1, 4:16])
    # The next accept, anchored before the span's end: the span shortened, unsliced, then the tail.
    defer(cache, 10, Tail(side, 1, 6, 2))
    assert cache.get_seq_length() == 12 and [p.shape[1] for p in layer.pieces(0)] == [10, 2]
    want = torch.cat([joined[0][None, :, 1, 4:14], side[0][0][1:2, :, 6:8]], dim=-2)
    assert torch.equal(layer.keys, want) and layer.based is None  # joined: memory of its own
    layer.rebase(joined, 1, 4, 2)
    assert layer.keys.untyped_storage().data_ptr() == joined[0].untyped_storage().data_ptr()
    assert isinstance(layer, DynamicLayer) and not layer.is_sliding


@pytest.mark.parametrize("name", NAMES)
def test_a_stacked_load_takes_each_run_as_one_block_of_every_layer(name):
    # After a stacked load every layer of a run is a span of its concatenation at the same columns:
    # the next load takes the run in one view (and one of its tail), not two a layer; a run whose
    # layers part (one read and written alone) is stacked layer by layer, to the same numbers.
    slotted = tiny_member(name, decode="graphs")
    slotted.slots.batched = slotted.slots.stacked = True
    states = verified_and_accepted(slotted)

    def stacked(state, w: int) -> torch.Tensor:  # the run's layers joined, [kv heads, layers, n, head dim]
        return torch.stack([(x.keys if w == 0 else x.values)[0] for x in state.cache.layers], dim=1)

    for state in states:  # noted winners on the prefill's own tensors: no block yet, stacked
        assert torch.equal(torch.cat(run_parts(state.cache.layers, 0), dim=2), stacked(state, 0))
    slotted.draft_many(states, [6] * 4)  # a load: every run's layers one block of it
    for state in states:
        (keys,) = run_parts(state.cache.layers, 0)
        assert keys.untyped_storage().data_ptr() == state.cache.layers[0].keys.untyped_storage().data_ptr()
        assert torch.equal(keys, stacked(state, 0))
    slotted.verify_many(states, [candidates() for _ in states])
    for state in states:
        slotted.accept(state, TEXTS[2])
    for state in states:  # the winner's columns a second view, of the verification's one gather
        blocks = [run_parts(state.cache.layers, w) for w in (0, 1)]
        assert [len(b) for b in blocks] == [2, 2]
        assert all(torch.equal(torch.cat(blocks[w], dim=2), stacked(state, w)) for w in (0, 1))
    layer = states[0].cache.layers[1]
    layer.keys = layer.keys.clone()  # one layer alone: the run is no longer one block
    assert torch.equal(torch.cat(run_parts(states[0].cache.layers, 1), dim=2), stacked(states[0], 1))
    eager = tiny_member(name, decode="eager")
    e_states = verified_and_accepted(eager)
    eager.verify_many(e_states, [candidates() for _ in e_states])
    for state in e_states:
        eager.accept(state, TEXTS[2])
    want = [c.text for c in eager.draft_many(e_states, [6] * 4)]
    assert [c.text for c in slotted.draft_many(states, [6] * 4)] == want


def test_requests_through_the_scheduler_with_batched_loads_equal_their_eager_solo_runs():
    # Runs joining and leaving a batch of three while others' winners wait in their tails.
    eager = [tiny_member(name, decode="eager") for name in NAMES]
    slotted = [tiny_member(name, decode="graphs") for name in NAMES]
    for m in slotted:
        m.slots.batched = True
    config = EnsembleConfig(segment_len=4, max_new_tokens=16)
    names = [m.name for m in eager]
    prompts = [*PROMPTS, "Dear diary,"]
    expected = [solo(eager, names, p, config) for p in prompts]
    got = collected_apart(Scheduler(slotted, batch_size=3), [(p, config, None) for p in prompts], gap=0.1)
    for want, (_, rounds) in zip(expected, got):
        same_rounds(want, rounds)
    assert all(m.slots.counts["verifies"] > 0 and m.slots.counts["drafts"] > 0 for m in slotted)


def test_a_run_no_longer_loaded_is_copied_out_of_the_shared_concatenation():
    # Four runs rebased on one load's concatenation; then only three go on (the fourth's member has
    # left it, or waits under the gate): once IDLE_LOADS loads have passed without it, the fourth's
    # layers get memory of their own, and once the three move on, no layer is a view of the old
    # concatenation (every run's keys) to keep it alive.
    slotted = tiny_member("qwen-merges", decode="graphs")
    slotted.slots.batched = True
    states = verified_and_accepted(slotted)
    slotted.draft_many(states, [6] * 4)

    def storages(runs) -> set[int]:
        layers = [s.cache.layers[0] for s in runs]
        return {t.untyped_storage().data_ptr() for x in layers for t in (x.keys, x.values)}

    first, load = storages(states), slotted.slots.loads.count
    assert len(first) == 2 and all(x.based == load for s in states for x in s.cache.layers)
    before = [(x.keys.clone(), x.values.clone()) for x in states[3].cache.layers]
    three = states[:3]
    for _ in range(IDLE_LOADS - 1):  # verified again and again without it: still a view
        slotted.verify_many(three, [candidates() for _ in three])
    assert all(x.based == load for x in states[3].cache.layers)
    slotted.verify_many(three, [candidates() for _ in three])
    assert all(x.based is None for x in states[3].cache.layers)  # copied out, the same numbers
    assert not storages(states[3:]) & first
    for x, (k, v) in zip(states[3].cache.layers, before):
        assert torch.equal(x.keys, k) and torch.equal(x.values, v)
    # The three moved on at each of those loads (a Stack's load rebases every run it loads, one block
    # each): once the fourth is copied out, nothing keeps the first concatenation alive.
    assert not storages(three) & first and len(storages(three)) == 2
    for state in three:
        slotted.accept(state, TEXTS[1])
    slotted.draft_many(three, [6] * 3)
    assert all(x.based == slotted.slots.loads.count for s in three for x in s.cache.layers)
    assert len(storages(three)) == 2


@pytest.mark.gpu
def test_gpu_requests_through_the_scheduler_on_captured_slots_equal_the_eager_path():
    """On CUDA, fp32: the winners noted and joined by batched loads (a GPU's default) under replays,
    several rounds of runs joining and leaving, the same rounds as the eager path on CUDA."""
    cpus = [tiny_member(name) for name in NAMES]
    models = [m.model.to("cuda") for m in cpus]
    eager = [HFMember(m.name, x, m.tokenizer, device="cuda", decode="eager") for m, x in zip(cpus, models)]
    graphs = [HFMember(m.name, x, m.tokenizer, device="cuda", decode="graphs") for m, x in zip(cpus, models)]
    for m in graphs:
        warm_up(m)
        assert m.slots.batched and m.slots.capture_off is None
    config = EnsembleConfig(segment_len=4, max_new_tokens=16)
    prompts = [*PROMPTS, "Dear diary,"]
    expected = [solo(eager, [m.name for m in eager], p, config) for p in prompts]
    got = collected_apart(Scheduler(graphs, batch_size=3), [(p, config, None) for p in prompts], gap=0.1)
    for want, (_, rounds) in zip(expected, got):
        same_rounds(want, rounds)
    assert all(m.slots.counts["verify_replays"] > 0 and m.slots.loads.count > 0 for m in graphs)
