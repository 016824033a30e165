"""Batched prefill: HFMember.start_many reads several prompts together and gives each request the
state start() gives it alone; through stream_many and the scheduler, newcomers that start together
get exactly their solo answers (fp32 greedy), and a bad prompt among them fails only its own request."""

from __future__ import annotations

import logging

import pytest

from specfuse.config import EnsembleConfig, MemberSettings
from specfuse.engine import Ensemble, Scheduler
from specfuse.errors import MemberError, PromptTooLongError
from specfuse.members import drafting
from specfuse.members.hf import HFMember, prefill
from specfuse.members.hf.state import HFState

from ..helpers_prefill import SYSTEM, assert_same_state
from ..runs import PROMPTS, collect, same_rounds, solo

# Lengths from a few tokens to a few dozen, and two of the same prompt.
MANY = [*PROMPTS, "hi", "Name three rivers that flow into the Atlantic, longest first.", PROMPTS[0]]
TOO_LONG = "word " * 150  # past the tiny models' 512 positions in every tokenizer, with the budget


class Passes:
    """A member's decoder, recording each forward pass's rows and columns (query tokens per row)."""

    def __init__(self, base):
        self.base, self.rows, self.columns = base, [], []

    def __call__(self, **kwargs):
        rows, columns = kwargs["input_ids"].shape
        self.rows.append(rows)
        self.columns.append(columns)
        return self.base(**kwargs)


def starts_of(member, monkeypatch) -> list[int]:
    """Record how many prompts each start_many call of `member` is given."""
    sizes: list[int] = []
    real = member.start_many

    def spy(prompts, settings):
        sizes.append(len(prompts))
        return real(prompts, settings)

    monkeypatch.setattr(member, "start_many", spy)
    return sizes


@pytest.mark.parametrize("chunk", [None, 5])  # 5: every prompt is read over several passes
@pytest.mark.parametrize("index", [0, 1, 2])  # llama, qwen2, gemma3 (a sliding window of 6)
def test_start_many_gives_each_prompt_the_state_start_gives_it(tiny_members, monkeypatch, index, chunk):
    member = tiny_members[index]
    if chunk is not None:
        monkeypatch.setattr(member, "chunk_tokens", chunk)
    settings = [
        MemberSettings(seed=i, measure_prompt=i % 2 == 0, temperature=0.7 if i == 1 else 0.0)
        for i in range(len(MANY))
    ]
    passes = Passes(member.base)
    monkeypatch.setattr(member, "base", passes)
    many = member.start_many(MANY, settings)
    assert max(passes.rows) > 1  # rows were read together
    if chunk is None:  # in fewer passes than one prompt after another
        assert len(passes.rows) < len(MANY)
    for prompt, s, got in zip(MANY, settings, many):
        assert isinstance(got, HFState)
        assert_same_state(got, member.start(prompt, s), member)
    # and each state goes on as a state from start() does: the same greedy draft
    alone = member.start(MANY[2], settings[2])
    assert member.draft(many[2], 8).text == member.draft(alone, 8).text


def test_a_pass_never_holds_more_than_chunk_tokens_query_tokens(tiny_members, monkeypatch):
    member = tiny_members[0]
    monkeypatch.setattr(member, "chunk_tokens", 12)
    passes = Passes(member.base)
    monkeypatch.setattr(member, "base", passes)
    member.start_many(MANY, [MemberSettings()] * len(MANY))
    assert passes.rows and max(r * c for r, c in zip(passes.rows, passes.columns)) <= 12


def with_system(member, reuse_template: bool) -> HFMember:
    return HFMember(
        member.name, member.model, member.tokenizer, device="cpu", prompt_format=SYSTEM,
        reuse_template=reuse_template,
    )  # fmt: skip


@pytest.mark.parametrize("index", [0, 1, 2])  # llama, qwen2, gemma3 (a sliding window of 6)
def test_the_template_head_is_read_once_and_each_prompt_only_after_it(tiny_members, monkeypatch, index):
    whole, headed = (with_system(tiny_members[index], reuse) for reuse in (False, True))
    head = drafting.template_head(headed.tokenizer, SYSTEM)
    contexts = [headed.prompt_ids(p) for p in MANY]
    assert len(head) > 6 and all(ids[: len(head)] == head for ids in contexts)  # the system turn
    passes = Passes(headed.base)
    monkeypatch.setattr(headed, "base", passes)
    monkeypatch.setattr(headed, "chunk_tokens", 4096)
    settings = [MemberSettings(seed=i, measure_prompt=i % 2 == 0) for i in range(len(MANY))]
    alone = headed.start(MANY[1], settings[1])
    assert passes.columns == [len(head), len(contexts[1]) - len(head)]  # the head once, then the rest
    passes.columns.clear()
    together = headed.start_many(MANY, settings)
    assert sum(passes.columns) < sum(len(ids) - len(head) for ids in contexts)  # rows in one pass, no head
    assert_same_state(alone, whole.start(MANY[1], settings[1]), whole)
    for prompt, s, got in zip(MANY, settings, together):
        assert_same_state(got, whole.start(prompt, s), whole)
    plain = headed.start(MANY[1], settings[1])  # the head is never written to by a request
    assert_same_state(plain, alone, whole)


def test_ensembles_with_and_without_the_template_head_play_the_same_rounds(tiny_members):
    config = EnsembleConfig(segment_len=5, max_new_tokens=20, exit_warmup=2, prior="prompt")
    plays = []
    for reuse in (False, True):
        ensemble = Ensemble([with_system(m, reuse) for m in tiny_members], config)
        plays.append([list(ensemble.stream(p)) for p in MANY[:3]])
    for want, got in zip(*plays):
        same_rounds(want, got)


def test_groups_keep_padding_and_rows_bounded():
    assert prefill.groups([], 512) == []
    assert prefill.groups([40, 42, 38, 41], 512) == [[1, 3, 0, 2]]  # longest first, one pass
    assert prefill.groups([2000, *[50] * 7], 512) == [[0], list(range(1, 8))]  # not 8 × 2000
    for lengths, chunk in (([10] * 10, 4), ([5, 300, 7, 280, 9, 1, 120], 512), ([3] * 6, 1)):
        found = prefill.groups(lengths, chunk)
        assert sorted(i for g in found for i in g) == list(range(len(lengths)))
        for g in found:
            assert len(g) <= chunk
            longest = max(lengths[i] for i in g)
            assert longest * len(g) <= (1 + prefill.PAD_SHARE) * sum(lengths[i] for i in g)


def test_a_bad_prompt_among_good_ones_fails_only_its_own_start(tiny_members, monkeypatch, caplog):
    member = tiny_members[1]
    prompts = [PROMPTS[0], TOO_LONG, PROMPTS[2], "boom", PROMPTS[1]]
    real_ids = member.prompt_ids

    def prompt_ids(prompt):
        if prompt == "boom":
            raise RuntimeError("tokenizer exploded")
        return real_ids(prompt)

    monkeypatch.setattr(member, "prompt_ids", prompt_ids)
    settings = [MemberSettings(max_new_tokens=20)] * len(prompts)
    got = member.start_many(prompts, settings)
    assert isinstance(got[1], PromptTooLongError) and "qwen-merges: the prompt takes" in str(got[1])
    assert isinstance(got[3], MemberError)
    assert str(got[3]) == "qwen-merges: start failed: RuntimeError: tokenizer exploded"
    for i in (0, 2, 4):
        assert_same_state(got[i], member.start(prompts[i], settings[i]), member)
    with pytest.raises(PromptTooLongError):  # start() alone raises as it always did
        member.start(TOO_LONG, settings[0])

    # A pass of several prompts that fails (out of memory, say) reads them one at a time instead.
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(prefill, "forward_rows", broken)
    with caplog.at_level(logging.WARNING, logger="specfuse.members.hf.member"):
        again = member.start_many(prompts, settings)
    assert "prefill of 3 prompts at once failed (out of memory): one at a time" in caplog.text
    assert isinstance(again[1], PromptTooLongError) and isinstance(again[3], MemberError)
    for i in (0, 2, 4):
        assert_same_state(again[i], got[i], member)


def test_stream_many_starts_every_prompt_at_once_and_equals_solo_runs(tiny_members, monkeypatch):
    prompts = MANY[:5]
    config = EnsembleConfig(segment_len=5, max_new_tokens=20, exit_warmup=2, prior="prompt")
    ensemble = Ensemble(tiny_members, config)
    alone = [list(ensemble.stream(p)) for p in prompts]
    for member in tiny_members:
        monkeypatch.setattr(member, "chunk_tokens", 16)  # prefill over several passes of rows
    sizes = {m.name: starts_of(m, monkeypatch) for m in tiny_members}
    together: list[list] = [[] for _ in prompts]
    for i, rnd in ensemble.stream_many(prompts):
        together[i].append(rnd)
    assert all(s == [len(prompts)] for s in sizes.values()), sizes  # one start_many per member
    for want, got in zip(alone, together):
        same_rounds(want, got)
        assert got[0].weights_before == pytest.approx(want[0].weights_before, abs=1e-5)  # the surprise


def test_simultaneous_arrivals_start_together_and_equal_their_solo_runs(tiny_members, monkeypatch):
    names = [m.name for m in tiny_members]
    short = EnsembleConfig(segment_len=5, max_new_tokens=20, exit_warmup=2)
    jobs = [
        (PROMPTS[0], short, None),
        (PROMPTS[1], EnsembleConfig(segment_len=3, max_new_tokens=18, prior="prompt"), names[:2]),
        (TOO_LONG, short, None),  # too long for every member: fails alone
        (PROMPTS[2], EnsembleConfig(segment_len=6, max_new_tokens=24), [names[2], names[0]]),
        (MANY[4], short, names[1:]),
        (MANY[3], short, None),
    ]
    expected = {i: solo(tiny_members, list(m or names), p, c) for i, (p, c, m) in enumerate(jobs) if i != 2}
    sizes = {m.name: starts_of(m, monkeypatch) for m in tiny_members}
    # prompts read whole on admission (chunked prefill opens them with open_many and reads them in
    # parts: tests/engine/test_chunked_prefill.py), so each member's one start_many is what is counted
    scheduler = Scheduler(tiny_members, batch_size=8, prefill_chunk=0)
    try:
        with scheduler._cond:  # every request in line before the loop looks: they join as one group
            tickets = [scheduler.submit(p, c, members=m) for p, c, m in jobs]
        with pytest.raises(PromptTooLongError):
            collect(tickets[2])
        assert tickets[2].state == "failed"
        got = {i: collect(t)[1] for i, t in enumerate(tickets) if i != 2}
    finally:
        scheduler.close()
    # one start_many per member, for all the requests that use it, the bad one among them
    assert sizes == {names[0]: [5], names[1]: [5], names[2]: [5]}, sizes
    for i, want in expected.items():
        assert tickets[i].state == "done"
        same_rounds(want, got[i])
