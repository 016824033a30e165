"""HFMember on tiny models: drafting limits, UTF-8, stop strings, the cache's common-prefix rule."""

from __future__ import annotations

import pytest
import torch

from specfuse.config import MemberSettings
from specfuse.errors import ConfigError, PromptTooLongError
from specfuse.members.hf import HFMember
from specfuse.members.protocol import Member
from specfuse.prompts import PromptFormat

from ..conftest import TINY_SPECS, ascii_only, tiny_member


def member_named(members, name):
    return next(m for m in members if m.name == name)


def test_hf_member_implements_the_protocol(tiny_members):
    assert all(isinstance(m, Member) for m in tiny_members)


@pytest.mark.parametrize("spec", list(TINY_SPECS))
@pytest.mark.parametrize("limit", [1, 3, 10])
def test_a_draft_stays_within_l_tokens_plus_utf8_grace(tiny_members, spec, limit):
    member = member_named(tiny_members, spec)
    state = member.start("Say something.", MemberSettings())
    cached = state.cache.get_seq_length()
    cand = member.draft(state, limit)
    assert cand.num_tokens <= limit + 4
    assert state.cache.get_seq_length() == cached  # the draft's keys are not left in the cache
    surrogates = [ch for ch in cand.text if 0xD800 <= ord(ch) <= 0xDFFF]
    assert not surrogates  # always text that encodes as UTF-8 (no half-decoded bytes)


def test_greedy_draft_is_the_models_own_greedy_continuation(tiny_members):
    member = member_named(tiny_members, "llama-bytes")  # one byte per token: no re-tokenization
    state = member.start("Once upon a time", MemberSettings())
    cand = member.draft(state, 12)
    ids = torch.tensor([member.prompt_ids("Once upon a time")])
    out = member.model.generate(
        ids, max_new_tokens=12, do_sample=False, eos_token_id=sorted(member.stop_token_ids)
    )
    greedy = member.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert cand.text and greedy.startswith(cand.text)


def test_accept_keeps_the_longest_common_prefix_and_feeds_only_the_rest(tiny_members):
    member = member_named(tiny_members, "qwen-merges")
    state = member.start("Hi", MemberSettings())
    member.accept(state, "He said th")
    before = list(state.ids)
    member.accept(state, "e end")  # "Ġ" "th" + "e" re-tokenize as "Ġthe": two tokens replaced
    assert state.ids == state.ids[: state.prompt_len] + member.encode("He said the end")
    assert state.cache.get_seq_length() == len(state.ids)
    common = next(i for i, (a, b) in enumerate(zip(before, state.ids)) if a != b)
    assert common == len(before) - 2
    fresh = member.start("Hi", MemberSettings())
    member.accept(fresh, "He said the end")
    assert torch.allclose(state.last_hidden, fresh.last_hidden, atol=1e-5)


def test_same_seed_same_sampled_draft_and_another_seed_differs(tiny_members):
    member = member_named(tiny_members, "gemma-meta")
    drafts = [
        member.draft(member.start("Sing", MemberSettings(temperature=1.0, top_p=0.9, seed=s)), 10).text
        for s in (7, 7, 8)
    ]
    assert drafts[0] == drafts[1]
    assert drafts[0] != drafts[2]


def test_stop_string_ends_the_draft_as_final():
    member = tiny_member("llama-bytes")
    state = member.start("x", MemberSettings())
    free = member.draft(state, 10).text
    stop = free[2:4] if len(free) >= 4 else free
    cand = member.draft(member.start("x", MemberSettings(stop_strings=(stop,))), 10)
    assert cand.final and stop not in cand.text and free.startswith(cand.text)


def test_completion_format_stop_strings_and_end_marker():
    fmt = PromptFormat("completion", template="Q: {prompt}\nA:", stop_strings=("\nQ:",))
    member = tiny_member("gemma-meta", prompt_format=fmt)
    assert member.end_marker == tuple(member.encode("\nQ:"))
    assert member.prompt_ids("hi") == list(member.tokenizer("Q: hi\nA:")["input_ids"])


def test_chat_format_needs_a_chat_template():
    member = tiny_member("llama-bytes")
    member.tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="no chat template"):
        HFMember("bare", member.model, member.tokenizer)


def test_a_prompt_beyond_the_context_is_refused(tiny_members):
    member = member_named(tiny_members, "llama-bytes")
    with pytest.raises(PromptTooLongError, match="context of 512"):
        member.start("word " * 200, MemberSettings(max_new_tokens=64))


def test_taking_over_trimmed_tokens_leaves_answers_unchanged_and_saves_decode_steps():
    """A greedy draft trimmed back to a word boundary already decoded the start of its next draft;
    when its text wins, those tokens are taken over instead of decoded again (issue 12)."""
    from specfuse.config import EnsembleConfig
    from specfuse.engine import Ensemble

    def run(reuse):
        members = []
        for name in ("llama-bytes", "qwen-merges"):
            member = ascii_only(tiny_member(name))  # printable ASCII: words to trim, exact re-tokenization
            members.append(HFMember(name, member.model, member.tokenizer, device="cpu", reuse_trimmed=reuse))
        config = EnsembleConfig(segment_len=6, max_new_tokens=40)
        return [list(Ensemble(members, config).stream(p)) for p in PROMPTS]

    PROMPTS = ["Once upon a time there was", "The quick brown fox jumps over the lazy dog and"]
    with_reuse, without = run(True), run(False)
    saved = 0
    for a, b in zip(with_reuse, without):
        assert [r.text for r in a] == [r.text for r in b]
        assert [[c.text for c in r.candidates] for r in a] == [[c.text for c in r.candidates] for r in b]
        saved += sum(c.reused_tokens for r in a for c in r.candidates)
        assert all(c.reused_tokens == 0 for r in b for c in r.candidates)
    assert saved > 0


def test_each_back_end_says_how_a_member_shares_its_weights(tiny_members):
    """A model listed twice is one load (models/loading asks the member's own sharing(), no ladder of
    back-end types): the in-process member hands out its model with contexts of its own; a member
    that cannot share says so by name."""
    from ..scripted import ScriptedMember

    first = member_named(tiny_members, "llama-bytes")
    second = first.sharing("llama-bytes#2")
    assert isinstance(second, HFMember) and second is not first
    assert second.name == "llama-bytes#2" and second.model is first.model and second.device == first.device
    one, two = first.start("Once upon a time", MemberSettings()), second.start("Hi", MemberSettings())
    assert one.cache is not two.cache and one.ids != two.ids  # each keeps its own request's context
    with pytest.raises(ConfigError, match="scripted cannot share its weights with a second member"):
        ScriptedMember("scripted", [], judge=len).sharing("scripted#2")
