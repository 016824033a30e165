"""A member that drafts in one back end and scores in another (members/split.py, `--quantize
gguf-draft`), on tiny random-weight models: each half does only its own job, both follow every
winner, and an ensemble of such members plays exactly as the plain ones when both halves are the
same model. The llama.cpp + bf16 pairing itself is tested on the real model in
tests/members/test_llamacpp.py."""

from __future__ import annotations

import pytest

from specfuse import EnsembleConfig
from specfuse.config import MemberSettings
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError, PromptTooLongError
from specfuse.members.split import SplitMember, SplitState

from ..conftest import TINY_SPECS, tiny_member

GREEDY = MemberSettings(score="logprob", max_new_tokens=40)
PROMPT = "the cat sat on the mat and then"


def test_each_half_does_its_own_job_and_both_follow_the_winner():
    # Two different models under one name: the drafts must be the drafter's, the scores the verifier's.
    split = SplitMember(tiny_member("m", "llama-bytes"), tiny_member("m", "qwen-merges"))
    drafter, verifier = tiny_member("m", "llama-bytes"), tiny_member("m", "qwen-merges")
    ours, d, v = split.start(PROMPT, GREEDY), drafter.start(PROMPT, GREEDY), verifier.start(PROMPT, GREEDY)
    for k in range(4):
        cand = split.draft(ours, 6)
        assert cand.text == drafter.draft(d, 6).text
        other = verifier.draft(verifier.start(PROMPT + f" {k}", GREEDY), 6)  # a foreign candidate
        assert split.score(ours, [cand, other]) == pytest.approx(verifier.score(v, [cand, other]), abs=1e-6)
        winner = other.text if k % 2 else cand.text  # the verifier's own text wins every other round
        for member, state in ((split, ours), (drafter, d), (verifier, v)):
            member.accept(state, winner)
    split.score(ours, [cand])  # the verifier reads the winners when it next scores
    assert ours.drafting.answer == ours.scoring.answer == d.answer == v.answer


def test_an_ensemble_of_split_members_plays_as_the_plain_members():
    names = list(TINY_SPECS)
    plain = Ensemble([tiny_member(n) for n in names])
    split = Ensemble([SplitMember(tiny_member(n), tiny_member(n)) for n in names])
    prompt = "Écris 猫 in code: x_1 ="  # no member ends its answer early here
    # Every round verified; then the defaults, where rounds with one draft go unverified and the
    # verifiers catch up on several winners at once.
    for config in (EnsembleConfig(max_new_tokens=40, segment_len=6, verify="always"), EnsembleConfig()):
        a, b = list(plain.stream(prompt, config)), list(split.stream(prompt, config))
        assert [r.text for r in a] == [r.text for r in b] and len(a) > 2
        for x, y in zip(a, b):
            assert [c.text for c in x.candidates] == [c.text for c in y.candidates]
            assert x.verified == y.verified
            flat = [[z for row in r.raw_scores for z in row] for r in (x, y)]
            assert flat[0] == pytest.approx(flat[1], abs=1e-4)
            assert x.weights_after == pytest.approx(y.weights_after, abs=1e-6)
    assert not all(r.verified for r in b)  # the catching up was exercised


def test_a_request_either_half_refuses_fails_alone_and_names_must_match():
    short = tiny_member("m", "llama-bytes")
    short.max_positions = 100  # the verifier's context is the shorter: only it refuses the long prompt
    split = SplitMember(tiny_member("m", "llama-bytes"), short)
    ok, long = split.start_many([PROMPT, PROMPT * 4], [GREEDY, GREEDY])
    assert isinstance(ok, SplitState) and isinstance(long, PromptTooLongError)
    with pytest.raises(ConfigError, match="one model drafts and verifies"):
        SplitMember(tiny_member("a", "llama-bytes"), tiny_member("b", "llama-bytes"))


def test_the_prompt_prior_is_measured_by_the_verifier_alone():
    split = SplitMember(tiny_member("m", "llama-bytes"), tiny_member("m", "qwen-merges"))
    state = split.start(PROMPT, MemberSettings(measure_prompt=True))
    assert state.drafting.surprise is None  # the drafter did not read the prompt twice
    assert split.prompt_surprise(state) == state.scoring.surprise is not None
