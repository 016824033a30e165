"""Prompts read on the KV slots (prefill.on_slots, the "graphs" decode path): in verification steps,
a chain of at most 256 tokens a row a step, captured as CUDA graphs on a GPU. On a CPU the same
steps run uncaptured: each request's state (its cache's keys and values, the hidden state that picks
its first token, the prompt's surprise) equals an eager read's in fp32 on three architectures (gemma3
with a sliding window of 6), for prompts read together and past 256 tokens, after the template's
head or from their first token, whole or in parts (chunked prefill); a store in use reads eagerly
and the same. The captured steps themselves: the `gpu` test at the end, skipped without CUDA."""

from __future__ import annotations

import random

import pytest

from specfuse.config import MemberSettings
from specfuse.members.hf import HFMember, slot_verify
from specfuse.models.preparation import warm_up

from ..conftest import TINY_SPECS, tiny_member
from ..helpers_prefill import SYSTEM, assert_same_state

NAMES = list(TINY_SPECS)  # llama-bytes, qwen-merges, gemma-meta
_words = random.Random(0)
# 354-360 tokens in each tiny tokenizer: read in two steps of the slots (256, then the rest).
LONG = " ".join(
    "".join(_words.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_words.randint(2, 7)))
    for _ in range(70)
)
PROMPTS = [LONG, "Why is the sky blue? Explain it to a child.", "Hi", "x = 1 + 2 * 3"]
SETTINGS = MemberSettings(max_new_tokens=40, measure_prompt=True)


def member_of(name: str, decode: str, headed: bool) -> HFMember:
    """A tiny member; `headed`: its prompts begin with a system turn, read once (prefill.Head)."""
    plain = tiny_member(name, decode=decode)
    if not headed:
        return plain
    return HFMember(name, plain.model, plain.tokenizer, device="cpu", prompt_format=SYSTEM, decode=decode)


def with_slots(name: str, headed: bool) -> HFMember:
    """A member on the slots once they exist: a GPU makes them at start-up, a CPU at the first draft."""
    member = member_of(name, "graphs", headed)
    member.draft(member.start("Say hello.", SETTINGS), 2)
    assert member.slots.layers and member.slots.counts["prefills"] == 0  # the warm prompt: eagerly
    return member


@pytest.mark.parametrize("headed", [False, True], ids=["from-the-first-token", "after-the-head"])
@pytest.mark.parametrize("name", NAMES)
def test_prompts_read_on_the_slots_equal_an_eager_read(name, headed):
    eager, slotted = member_of(name, "eager", headed), with_slots(name, headed)
    assert len(eager.prompt_ids(LONG)) > slot_verify.VERIFY_TOKENS[-1] + 60  # two steps of the slots
    want = eager.start_many(PROMPTS, [SETTINGS] * len(PROMPTS))
    got = slotted.start_many(PROMPTS, [SETTINGS] * len(PROMPTS))
    for g, w in zip(got, want, strict=True):
        assert_same_state(g, w, eager)
    assert want[0].surprise is not None  # the surprise compared too
    store = slotted.slots
    assert store.counts["prefills"] >= 2 and store.counts["busy"] == 0
    assert (slotted._head is not None and len(slotted._head.ids) > 6) == headed  # read after the head, or not
    # The next drafts, from those states, are the eager ones.
    assert [c.text for c in slotted.draft_many(got, [6] * 4)] == [
        c.text for c in eager.draft_many(want, [6] * 4)
    ]


@pytest.mark.parametrize("name", NAMES)
def test_a_prompt_read_in_parts_on_the_slots_equals_one_read_whole(name):
    eager, slotted = member_of(name, "eager", False), with_slots(name, False)
    (want,) = eager.start_many([LONG], [SETTINGS])
    (state,) = slotted.open_many([LONG], [SETTINGS])
    reads = 0
    while not slotted.prefill_many([state], 50)[0]:  # chunked prefill: 50 tokens between two rounds
        reads += 1
    assert reads >= 6 and slotted.slots.counts["prefills"] == reads + 1
    assert_same_state(state, want, eager)


@pytest.mark.parametrize("how", ["in-use", "turned-off"])
def test_a_store_in_use_or_told_not_to_reads_eagerly_and_the_same(how):
    eager, slotted = member_of("gemma-meta", "eager", False), with_slots("gemma-meta", False)
    want = eager.start_many(PROMPTS, [SETTINGS] * len(PROMPTS))
    store = slotted.slots
    store.prefill = how != "turned-off"  # bench serve --slots-off prefill, for an A/B run
    with store._lock:  # another thread holds the slots
        got = slotted.start_many(PROMPTS, [SETTINGS] * len(PROMPTS))
    for g, w in zip(got, want, strict=True):
        assert_same_state(g, w, eager)
    assert store.counts["prefills"] == 0 and (store.counts["busy"] > 0) == (how == "in-use")


# -- on a GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_prompts_read_by_captured_steps_equal_an_eager_read(name):
    """On CUDA, fp32: after start-up's captures, prompts are read by replays, into the states an
    eager read leaves (1e-4)."""
    cpu = tiny_member(name)
    model = cpu.model.to("cuda")
    eager = HFMember(name, model, cpu.tokenizer, device="cuda", decode="eager")
    graphs = HFMember(name, model, cpu.tokenizer, device="cuda", decode="graphs")
    warm_up(graphs)
    want = eager.start_many(PROMPTS, [SETTINGS] * len(PROMPTS))
    got = graphs.start_many(PROMPTS, [SETTINGS] * len(PROMPTS))
    store = graphs.slots
    assert store.capture_off is None and store.counts["prefill_replays"] == store.counts["prefills"] >= 2
    for g, w in zip(got, want, strict=True):
        for mine, theirs in zip(g.cache.layers, w.cache.layers):
            assert (mine.keys - theirs.keys).abs().max() < 1e-4
        assert (g.last_hidden - w.last_hidden).abs().max() < 1e-4
