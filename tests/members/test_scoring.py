"""Verify-in-line: packed scores equal separate passes; the output head matches the model's own."""

from __future__ import annotations

import pytest
import torch

from specfuse.config import MemberSettings
from specfuse.members.drafting import common_prefix_len
from specfuse.members.hf import scoring
from specfuse.members.hf.scoring import (
    LOGPROB_ROWS,
    VOCAB_SLICE,
    Block,
    OutputHead,
    chunk_mask,
    lay_out,
    pack,
    vocab_slice,
)
from specfuse.records import Candidate

from ..conftest import TINY_SPECS, tiny_member

PROMPT = "Write one line about the sea."
ANSWER = "The sea is"  # accepted before scoring, so candidates build on a real answer
TEXTS = [
    (" blue and deep", False),
    ("n't quiet", False),  # merges with the answer's last word in some tokenizers
    (" 大海很深。", True),  # CJK, final: the verifier's end marker is scored as well
    (" the theme", False),
]


def cand(text: str, final: bool) -> Candidate:
    return Candidate("x", text, 1, final, 0.0)


def separate_score(member, answer: str, text: str, final: bool, mode: str) -> float:
    """Score one candidate with a plain full forward pass from scratch, no cache, no packing."""
    prompt_ids = member.prompt_ids(PROMPT)
    answer_ids = member.encode(answer)
    full = member.encode(answer + text)
    keep = len(prompt_ids) + common_prefix_len(full, answer_ids)
    ids = prompt_ids + full + (list(member.end_marker) if final else [])
    with torch.no_grad():
        logits = member.model(input_ids=torch.tensor([ids])).logits[0].float()  # [T, V]
    rows = logits[keep - 1 : len(ids) - 1]
    if mode == "logprob":
        rows = torch.log_softmax(rows, dim=-1)
    targets = torch.tensor(ids[keep:])
    return float(rows.gather(-1, targets[:, None]).mean())


@pytest.mark.parametrize("spec", list(TINY_SPECS))
@pytest.mark.parametrize("mode", ["logit", "logprob"])
def test_packed_scores_equal_separate_passes(tiny_members, spec, mode):
    member = next(m for m in tiny_members if m.name == spec)
    state = member.start(PROMPT, MemberSettings(score=mode))
    member.accept(state, ANSWER)
    packed = member.score(state, [cand(t, f) for t, f in TEXTS])
    separate = [separate_score(member, ANSWER, t, f, mode) for t, f in TEXTS]
    assert packed == pytest.approx(separate, abs=1e-4)


@pytest.mark.parametrize("spec", list(TINY_SPECS))
def test_scores_after_cached_rounds_equal_a_fresh_state(tiny_members, spec):
    member = next(m for m in tiny_members if m.name == spec)
    settings = MemberSettings()
    cached = member.start(PROMPT, settings)
    answer = ""
    for segment in ["The", " sea", " is", " wide,", " 很", "深", " and old"]:
        member.score(cached, [cand(segment, False), cand(" x", False)])  # leaves a packed pass behind
        member.accept(cached, segment)  # reuses the packed keys and values
        answer += segment
    fresh = member.start(PROMPT, settings)
    member.accept(fresh, answer)
    assert cached.ids == fresh.ids
    texts = [cand(t, f) for t, f in TEXTS]
    assert member.score(cached, texts) == pytest.approx(member.score(fresh, texts), abs=1e-4)


@pytest.mark.parametrize("spec", list(TINY_SPECS))
def test_output_head_matches_the_models_logits(tiny_members, spec):
    member = next(m for m in tiny_members if m.name == spec)
    ids = torch.tensor([member.encode("hello there, sea")])
    with torch.no_grad():
        logits = member.model(input_ids=ids).logits[0].float()
        hidden = member.base(input_ids=ids).last_hidden_state[0]
    head = OutputHead(member.model)
    assert torch.allclose(head.logits(hidden), logits, atol=1e-4)
    targets = ids[0]
    assert torch.allclose(
        head.token_logits(hidden, targets), logits.gather(-1, targets[:, None])[:, 0], atol=1e-4
    )


def test_pack_masks_other_blocks_and_restarts_positions():
    packed = pack([Block(4, (1, 2, 3)), Block(2, (7, 8))], prefix_len=5, dtype=torch.float32, device="cpu")
    assert packed.position_ids.tolist() == [[4, 5, 6, 2, 3]]
    assert packed.offsets == (0, 3)
    visible = (packed.attention_mask[0, 0] == 0).int().tolist()  # [Q, P + Q]
    assert visible[0] == [1, 1, 1, 1, 0, 1, 0, 0, 0, 0]  # anchor: cache < 4, itself
    assert visible[2] == [1, 1, 1, 1, 0, 1, 1, 1, 0, 0]  # last token of block 0
    assert visible[3] == [1, 1, 0, 0, 0, 0, 0, 0, 1, 0]  # block 1 sees cache < 2 only
    assert visible[4] == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    assert all(any(row) for row in visible)  # never a fully masked row


def test_pack_sliding_window_hides_far_keys():
    packed = pack([Block(9, (1, 2))], prefix_len=10, dtype=torch.float32, device="cpu", sliding_window=3)
    sliding = (packed.attention_mask["sliding_attention"][0, 0] == 0).int().tolist()
    full = (packed.attention_mask["full_attention"][0, 0] == 0).int().tolist()
    assert sum(full[1]) == 9 + 2  # cache 0..8, the anchor, itself
    assert sliding[1] == [0] * 8 + [1, 0, 1, 1]  # position 10 sees 8 (cache), 9 (anchor), 10


def test_float_mask_uses_the_models_dtype():
    packed = pack([Block(0, (1,))], prefix_len=1, dtype=torch.bfloat16, device="cpu")
    assert packed.attention_mask.dtype == torch.bfloat16
    assert float(packed.attention_mask.min()) == float(torch.finfo(torch.bfloat16).min)


# -- chunked verification and prefill: memory linear in a long candidate's length, the same scores --

LONG = " ".join(["the sea is wide and the sea is old"] * 6)  # about 200 tokens in every tokenizer


def details_of(member, states, candidates):
    return [[(d.tokens, d.logits, d.logprobs) for d in row] for row in member.verify_many(states, candidates)]


def assert_same_details(chunked, whole):
    for row_c, row_w in zip(chunked, whole, strict=True):
        for (pieces_c, logits_c, logp_c), (pieces_w, logits_w, logp_w) in zip(row_c, row_w, strict=True):
            assert pieces_c == pieces_w
            assert logits_c == pytest.approx(logits_w, abs=1e-5)
            assert logp_c == pytest.approx(logp_w, abs=1e-5)


@pytest.mark.parametrize("spec", list(TINY_SPECS))  # llama, qwen2, gemma3 (sliding window)
@pytest.mark.parametrize("mode", ["logit", "logprob"])
def test_chunked_scores_equal_one_pass_in_fp32(spec, mode):
    whole, chunked = tiny_member(spec), tiny_member(spec)  # the same weights (seeded by spec)
    chunked.chunk_tokens = 7  # every block is cut, some anchors begin a chunk
    cands = [cand(t, f) for t, f in TEXTS] + [cand(" " + LONG, False), cand(LONG + ".", True)]
    settings = MemberSettings(score=mode)
    states = {}
    for name, member in (("whole", whole), ("chunked", chunked)):
        state = member.start(PROMPT, settings)
        member.accept(state, ANSWER)
        states[name] = state
    assert_same_details(
        details_of(chunked, [states["chunked"]], [cands]), details_of(whole, [states["whole"]], [cands])
    )
    assert chunked.score(states["chunked"], cands) == pytest.approx(
        whole.score(states["whole"], cands), abs=1e-5
    )


@pytest.mark.parametrize("spec", ["llama-bytes", "gemma-meta"])
def test_chunked_scores_equal_one_pass_for_a_batch_of_requests(spec):
    """Rows of different lengths (left-padded caches) and different candidates, chunked alike."""
    whole, chunked = tiny_member(spec), tiny_member(spec)
    chunked.chunk_tokens = 5
    rows = [[cand(" blue", False), cand(" " + LONG[:90], False)], [cand(LONG[:60], True)]]

    def states(member):
        out = [member.start(PROMPT, MemberSettings(score="logprob")), member.start("Hi", MemberSettings())]
        member.accept(out[0], ANSWER)
        return out

    assert_same_details(details_of(chunked, states(chunked), rows), details_of(whole, states(whole), rows))


@pytest.mark.parametrize("spec", list(TINY_SPECS))
def test_a_chunked_pass_leaves_the_same_cache_and_accepts_the_same_way(spec):
    whole, chunked = tiny_member(spec), tiny_member(spec)
    chunked.chunk_tokens = 4
    finals = []
    for member in (whole, chunked):
        state = member.start(LONG, MemberSettings())  # the prefill is chunked too
        member.score(state, [cand(" x", False), cand(" " + LONG[:80], False)])
        member.accept(state, " " + LONG[:80])  # moves the verified keys and values into place
        member.accept(state, " and more")
        finals.append((state, member.draft(state, 8).text))
    (a, text_a), (b, text_b) = finals
    assert a.ids == b.ids and text_a == text_b
    assert torch.allclose(a.last_hidden, b.last_hidden, atol=1e-5)
    for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
        assert torch.allclose(la.keys, lb.keys, atol=1e-5) and torch.allclose(la.values, lb.values, atol=1e-5)


def test_chunked_prefill_measures_the_same_prompt_surprise():
    whole, chunked = tiny_member("qwen-merges"), tiny_member("qwen-merges")
    chunked.chunk_tokens = 3
    settings = MemberSettings(measure_prompt=True)
    assert chunked.start(LONG, settings).surprise == pytest.approx(
        whole.start(LONG, settings).surprise, abs=1e-6
    )


@pytest.mark.parametrize("spec", ["llama-bytes", "gemma-meta"])  # gemma: soft-capped logits
@pytest.mark.parametrize(("rows", "vocab"), [(LOGPROB_ROWS, VOCAB_SLICE), (16, 37), (1000, 1)])
def test_log_probabilities_made_in_pieces_equal_the_models_own_softmax(monkeypatch, spec, rows, vocab):
    member = tiny_member(spec)
    monkeypatch.setattr(scoring, "LOGPROB_ROWS", rows)
    monkeypatch.setattr(scoring, "VOCAB_SLICE", vocab)  # 37: slices that do not divide the vocabulary
    ids = torch.tensor([member.encode(LONG)])
    assert ids.shape[1] > 16
    with torch.no_grad():
        hidden = member.base(input_ids=ids).last_hidden_state[0]
        logits = member.model(input_ids=ids).logits[0].float()  # the model's own head, soft-capping
        whole = torch.log_softmax(logits, dim=-1).gather(-1, ids[0][:, None])[:, 0]
        assert torch.allclose(member.head.token_logprobs(hidden, ids[0]), whole, atol=1e-5)
        assert member.head.token_logprobs(hidden[:0], ids[0][:0]).shape == (0,)


def test_log_probabilities_are_made_without_reading_back_from_the_device_per_slice(monkeypatch):
    # On a GPU each read back (an .item(), a bool() of a tensor, a nonzero()) waits for every kernel
    # before it: the slices pick their targets' logits on the device instead.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    member = tiny_member("llama-bytes")
    monkeypatch.setattr(scoring, "VOCAB_SLICE", 37)
    ids = torch.tensor(member.encode(LONG))
    hidden = torch.randn(len(ids), member.model.config.hidden_size)
    with torch.no_grad(), Ops() as ops:
        member.head.token_logprobs_top(hidden, ids, 3)
    assert ops.names.count("mm.default") + ops.names.count("addmm.default") > 2  # several slices
    assert not [n for n in ops.names if "local_scalar" in n or "nonzero" in n or "is_nonzero" in n]


def test_a_gpu_takes_the_vocabulary_in_far_fewer_slices():
    assert vocab_slice("cpu", 1) == vocab_slice("cpu", LOGPROB_ROWS) == VOCAB_SLICE
    assert vocab_slice("cuda", LOGPROB_ROWS) >= 262_144  # Gemma 2's and 3's vocabularies: one slice
    assert vocab_slice("cuda", 10**9) == VOCAB_SLICE


def test_log_probabilities_in_slices_keep_a_heads_bias(monkeypatch):
    member = tiny_member("llama-bytes")
    model = member.model
    torch.manual_seed(0)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    model.lm_head = head  # untied, with a bias: the model's forward adds it, so must the slices
    monkeypatch.setattr(scoring, "VOCAB_SLICE", 37)
    ids = torch.tensor([member.encode(LONG)])
    with torch.no_grad():
        hidden = member.base(input_ids=ids).last_hidden_state[0]
        whole = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        want = whole.gather(-1, ids[0][:, None])[:, 0]
        assert torch.allclose(OutputHead(model).token_logprobs(hidden, ids[0]), want, atol=1e-5)


def test_a_chunks_mask_is_the_whole_masks_rows_cut_at_its_last_key():
    blocks = [Block(4, (1, 2, 3)), Block(2, (7, 8)), Block(5, (9, 9, 9, 9))]
    whole = pack(blocks, prefix_len=6, dtype=torch.float32, device="cpu", sliding_window=3).attention_mask
    layout = lay_out([blocks], [6], "cpu")
    for begin, end in [(0, 4), (4, 8), (8, 9), (2, 9)]:
        part = chunk_mask(layout, begin, end, torch.float32, sliding_window=3)
        for kind in ("full_attention", "sliding_attention"):
            assert torch.equal(part[kind], whole[kind][:, :, begin:end, : 6 + end])
