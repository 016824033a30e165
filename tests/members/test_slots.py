"""Batched drafting on static KV slots (members/hf/slots.py, the "graphs" decode path): on a CPU the
same slot code runs uncaptured, and its greedy answers equal the eager path's in fp32, on three
architectures (gemma3 with its sliding-window layers), with runs joining and leaving between
rounds, batches of several buckets and a trimmed draft's tail taken over; through the scheduler
every app and API run goes through, too. The decode path is chosen once (config.DECODE_MODES) and
a bad choice is a clear error. The CUDA graphs themselves: test_gpu_slots below, skipped here."""

from __future__ import annotations

import pytest
import torch

from specfuse.bench import ceiling
from specfuse.cli import build_parser
from specfuse.config import DECODE_MODES, EnsembleConfig, MemberSettings
from specfuse.engine import Ensemble, Scheduler
from specfuse.errors import ConfigError
from specfuse.members.hf import HFMember, slots
from specfuse.models.loading import load_member
from specfuse.models.placement import load_members

from ..conftest import TINY_SPECS, byte_bpe_tokenizer, tiny_member
from ..runs import PROMPTS, collected_apart, same_rounds, solo, streamed_many

NAMES = list(TINY_SPECS)  # llama-bytes, qwen-merges, gemma-meta
GREEDY = MemberSettings(max_new_tokens=200)
MORE = [*PROMPTS, "Hello there", "x = 1 + 2 * 3", "A long time ago, in a galaxy far away", "Dear diary,"]


@pytest.fixture(scope="module")
def eager_members():
    return [tiny_member(name, decode="eager") for name in NAMES]


@pytest.fixture(scope="module")
def slot_members():
    return [tiny_member(name, decode="graphs") for name in NAMES]


# Which runs draft in each call (indices into MORE), and each run's budget: runs join (3, 4, 5, 6)
# and leave (1, 2) between calls, and the calls take buckets 4, 2, 8 and 1 (a store grown once).
PLAN = [([0, 1, 2], 7), ([0, 3], 10), ([0, 2, 3, 4, 5, 6], 5), ([4], 9), ([3, 5, 6, 0, 4], 8)]


def play(member: HFMember, plan=PLAN, settings=GREEDY) -> list[list[tuple]]:
    """Draft as `plan` says, each run accepting its own draft; every call's candidates."""
    states: dict[int, object] = {}
    out = []
    for runs, budget in plan:
        for r in runs:
            if r not in states:
                states[r] = member.start(MORE[r], settings)
        batch = [states[r] for r in runs]
        cands = member.draft_many(batch, [budget + r % 3 for r in runs])
        out.append([(c.text, c.num_tokens, c.final, c.reused_tokens, c.confidence) for c in cands])
        for state, cand in zip(batch, cands):
            member.accept(state, cand.text)
    return out


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_greedy_drafts_on_slots_equal_the_eager_drafts(index, eager_members, slot_members):
    eager, slotted = eager_members[index], slot_members[index]
    assert eager.slots is None and slotted.slots is not None and not slotted.slots.capture
    drafts = slotted.slots.counts["drafts"]
    want = play(eager)
    got = play(slotted)
    assert got == want
    print(NAMES[index], [[t for t, *_ in call] for call in got])
    assert any(text for call in got for text, *_ in call)  # they drafted something
    store = slotted.slots
    assert store.counts["drafts"] - drafts == len(PLAN)  # every call decoded on the slots
    assert store.rows == 8 and store.counts["replays"] == 0  # the largest bucket; nothing captured


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_greedy_drafts_a_step_ahead_equal_the_eager_drafts_and_their_confidence(index, eager_members):
    # A GPU's way (slots.SlotStore.ahead): each step enqueued from the last one's argmax before the
    # host reads it, here on the CPU. The gate's values too (equal to the slots' own step by step;
    # the eager path's attention rounds them apart in the last bits), and drafts that end at a stop
    # string before their budget (the step run ahead of them is lost, never read).
    drafted = play(tiny_member(NAMES[index], decode="graphs"))
    stop = next(ch for call in drafted for c in call for ch in c[0][1:] if ch.isalnum())  # one it drafts
    settings = MemberSettings(max_new_tokens=200, measure_confidence=True, stop_strings=(stop,))
    slotted, plain = tiny_member(NAMES[index], decode="graphs"), tiny_member(NAMES[index], decode="graphs")
    store = slotted.slots
    store.ahead = store.batched = store.fuse = True  # and the loads batched, the norms fused, as on a GPU
    got = play(slotted, settings=settings)
    assert got == play(plain, settings=settings)
    assert [[c[:4] for c in call] for call in got] == [
        [c[:4] for c in call] for call in play(eager_members[index], settings=settings)
    ]
    assert all(c[4] is not None for call in got for c in call if c[1])  # measured where drafted
    assert any(c[2] for call in got for c in call)  # some ended at a stop string
    # The same drafts, each step counted; ahead of the host, at most one step more a draft.
    extra = store.counts["steps"] - plain.slots.counts["steps"]
    assert 0 <= extra <= store.counts["drafts"] == plain.slots.counts["drafts"] > 0


def test_runs_join_and_leave_the_slots_without_reallocating():
    member = tiny_member("llama-bytes", decode="graphs")
    store = member.slots
    play(member, PLAN[2:3])  # bucket 8 first: the store is made once, at its largest
    pointers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in store.layers]
    play(member, PLAN)
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in store.layers] == pointers
    assert (store.rows, store.capacity) == (8, slots.MIN_WIDTH)


def test_a_trimmed_tail_is_taken_over_on_the_slots_as_eagerly():
    # One run drafting alone: a won greedy draft trimmed to a word boundary gives its next draft the
    # trimmed tokens without decoding them again (reused_tokens), on the slots as in the eager path.
    eager, slotted = tiny_member("qwen-merges", decode="eager"), tiny_member("qwen-merges", decode="graphs")
    plan = [([0], 6), ([0], 6), ([0], 6), ([0], 6), ([0], 6)]
    want, got = play(eager, plan), play(slotted, plan)
    assert got == want
    assert slotted.slots.counts["drafts"] >= len(plan) - sum(1 for call in got if not call[0][0])


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_an_ensemble_on_slots_plays_the_same_rounds_as_eagerly(index, eager_members, slot_members):
    # A rolling batch of two over three prompts (runs join as others end), each member in turn.
    members = [slot_members[i] if i == index else m for i, m in enumerate(eager_members)]
    config = EnsembleConfig(segment_len=5, max_new_tokens=20)
    got = streamed_many(Ensemble(members, config), PROMPTS, batch_size=2)
    for prompt, rounds in zip(PROMPTS, got):
        same_rounds(list(Ensemble(eager_members, config).stream(prompt)), rounds)


def test_requests_through_the_scheduler_on_slots_equal_their_eager_solo_runs(eager_members, slot_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=16)
    names = [m.name for m in eager_members]
    expected = [solo(eager_members, names, p, config) for p in MORE[:5]]
    before = [m.slots.counts["drafts"] for m in slot_members]
    jobs = [(p, config, None) for p in MORE[:5]]
    got = collected_apart(Scheduler(slot_members, batch_size=4), jobs, gap=0.1)
    for want, (_, rounds) in zip(expected, got):
        same_rounds(want, rounds)
    assert all(m.slots.counts["drafts"] > b for m, b in zip(slot_members, before))


def test_a_busy_store_drafts_eagerly_and_the_same():
    eager, slotted = tiny_member("gemma-meta", decode="eager"), tiny_member("gemma-meta", decode="graphs")
    store = slotted.slots
    with store._lock:  # another thread's draft holds the slots
        got = play(slotted, PLAN[:2])
    assert got == play(eager, PLAN[:2])
    assert store.counts["busy"] == 2 and store.counts["drafts"] == 0


def test_sampled_drafts_on_slots_follow_each_runs_seed_as_eagerly():
    # Each run samples with its own generator (its seed), in turn, from the same float32 logits.
    def draft(member: HFMember) -> list[str]:
        runs = [MemberSettings(max_new_tokens=50, temperature=0.9, top_p=0.9, seed=s) for s in (1, 2, 3)]
        states = [member.start(p, s) for p, s in zip(PROMPTS, runs)]
        return [c.text for c in member.draft_many(states, [8, 8, 8])]

    slotted = tiny_member("llama-bytes", decode="graphs")
    got = draft(slotted)
    assert got == draft(tiny_member("llama-bytes")) and len(set(got)) == 3
    assert slotted.slots.counts["drafts"] == 1


def test_gemma2_with_soft_capped_eager_attention_drafts_the_same_on_slots():
    # The GPU check's third architecture (bench/shapes.py: Gemma-2-9B), tiny: eager attention with
    # soft-capped scores and sliding-window layers, through the slots' masks.
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tokenizer = byte_bpe_tokenizer()
    torch.manual_seed(4)
    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
        sliding_window=6, layer_types=["sliding_attention", "full_attention"],
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, attn_implementation="eager",
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    model = Gemma2ForCausalLM(config).float().eval()
    plan = [([0, 1, 2], 7), ([0, 3], 10), ([4], 9)]
    slotted = HFMember("gemma2", model, tokenizer, device="cpu", decode="graphs")
    assert play(slotted, plan) == play(HFMember("gemma2", model, tokenizer, device="cpu"), plan)
    assert slotted.slots.counts["drafts"] == len(plan) and slotted.sliding_window == 6


def test_buckets_and_widths():
    assert [slots.bucket_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65)] == [
        1, 2, 4, 4, 8, 8, 16, 16, 32, 32, 64, 64, 128,
    ]  # fmt: skip
    assert [slots.width_of(n) for n in (1, 256, 512, 513, 1000, 1025)] == [512, 512, 512, 1024, 1024, 2048]


def test_the_decode_path_is_chosen_once_and_checked():
    assert DECODE_MODES == ("auto", "graphs", "eager")
    assert slots.resolved("auto", "cpu") == "eager"  # the CPU's default path is unchanged
    assert slots.resolved("auto", "cuda:1") == "graphs"
    assert slots.resolved("graphs", "cpu") == "graphs" and slots.resolved("eager", "cuda") == "eager"
    with pytest.raises(ConfigError, match="decode must be one of auto, graphs, eager, got 'fast'"):
        slots.resolved("fast", "cpu")
    assert tiny_member("llama-bytes").slots is None  # auto on a CPU: eager
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        slots.SlotStore(tiny_member("llama-bytes"), capture=True)
    with pytest.raises(ConfigError, match="decode must be one of"):
        load_member("smollm2-135m", decode="fast")
    with pytest.raises(ConfigError, match="decode must be one of"):
        load_members(["smollm2-135m"], decode="graphs ")
    args = build_parser().parse_args(["--decode", "graphs", "hi"])
    assert args.decode == "graphs"
    assert build_parser().parse_args(["hi"]).decode == "auto"


def test_a_member_the_slots_cannot_hold_drafts_eagerly_and_the_same():
    # compiled.unsupported's reasons (a model spread over devices, other layer kinds) keep it eager.
    slotted = tiny_member("llama-bytes", decode="graphs")
    slotted.slots = slots.SlotStore(slotted, unsupported="a model spread over several devices")
    assert play(slotted, PLAN[:2]) == play(tiny_member("llama-bytes"), PLAN[:2])
    assert slotted.slots.counts["drafts"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_slots_captured_graphs_equal_eager_drafts(name):
    """On CUDA: the captured steps (one per bucket) give the eager path's greedy drafts in fp32."""
    cpu = tiny_member(name)
    model = cpu.model.to("cuda")
    eager = HFMember(name, model, cpu.tokenizer, device="cuda", decode="eager")
    graphs = HFMember(name, model, cpu.tokenizer, device="cuda", decode="graphs")
    assert graphs.slots is not None and graphs.slots.capture
    assert play(graphs) == play(eager)
    store = graphs.slots
    assert store.capture_off is None, store.capture_off
    assert store.counts["captures"] >= 4 and store.counts["replays"] == store.counts["steps"] > 0
    assert torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.parametrize("option", ceiling.SLOT_OPTIONS)
def test_gpu_each_slot_option_turned_off_drafts_the_same(option):
    """On CUDA: the captured steps with one option off (bench serve --slots-off, an A/B run) give
    the drafts they give with every option on, the default there."""
    cpu = tiny_member("qwen-merges")
    model = cpu.model.to("cuda")
    on, off = (HFMember("qwen-merges", model, cpu.tokenizer, device="cuda", decode="graphs") for _ in "ab")
    assert all(getattr(on.slots, name) for name in ceiling.SLOT_OPTIONS)
    setattr(off.slots, option, False)
    assert play(off) == play(on)
    assert off.slots.counts["replays"] == off.slots.counts["steps"] > 0


@pytest.mark.gpu
def test_gpu_members_at_once_on_their_streams_play_the_rounds_in_turn():
    """On CUDA: three members capturing and replaying their steps at once, each in its thread on a
    CUDA stream of its own (parallel="on"), play the rounds the same members play in turn."""
    members = []
    for name in NAMES:
        cpu = tiny_member(name)
        members.append(HFMember(name, cpu.model.to("cuda"), cpu.tokenizer, device="cuda", decode="graphs"))
    config = EnsembleConfig(segment_len=5, max_new_tokens=20)

    def texts(parallel: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for i, rnd in Ensemble(members, config, parallel=parallel).stream_many(PROMPTS, batch_size=3):
            out.setdefault(i, []).append(rnd.text)
        return out

    assert texts("on") == texts("off")
    assert all(m.slots.capture_off is None and m.slots.counts["replays"] > 0 for m in members)
