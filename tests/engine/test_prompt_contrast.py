"""prompt_contrast: each verifier's score of a candidate less λ times its score of the same candidate
with the prompt left out (feedback.prompt_contrast), the second context kept and fed by MemberCalls."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specfuse import feedback
from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.engine.calls import PROMPT_LEFT_OUT
from specfuse.errors import ConfigError

from ..conftest import tiny_member
from ..runs import same_rounds, scores_by_hand

PROMPT = "Why is the sky blue? Explain it to a child."
CONTRAST = EnsembleConfig(max_new_tokens=24, segment_len=4, verify="always", exit=False, prompt_contrast=0.3)


def test_scores_less_a_share_of_the_scores_without_the_prompt():
    assert feedback.prompt_contrast([-1.0, -2.0], [-3.0, -0.5], 0.3) == pytest.approx([-0.1, -1.85])
    assert feedback.prompt_contrast([-1.0, -2.0], [-3.0, -0.5], 0.0) == [-1.0, -2.0]
    with pytest.raises(ValueError, match="2 scores with the prompt but 1 without"):
        feedback.prompt_contrast([-1.0, -2.0], [-3.0], 0.3)


@pytest.mark.parametrize("weight", [-0.1, 1.5])
def test_the_weight_is_bounded(weight):
    with pytest.raises(ConfigError, match="prompt_contrast"):
        EnsembleConfig(prompt_contrast=weight)


@pytest.fixture(scope="module")
def trio():
    return [tiny_member(name) for name in ("llama-bytes", "qwen-merges", "gemma-meta")]


def test_every_round_is_scored_against_the_answer_without_the_prompt(trio):
    rounds = list(Ensemble(trio).stream(PROMPT, CONTRAST))
    assert len(rounds) >= 3
    before = ""
    for rnd in rounds:
        for row, verifier in zip(rnd.raw_scores, rnd.verifiers):
            member = next(m for m in trio if m.name == verifier)
            with_prompt = scores_by_hand(member, PROMPT, before, rnd.candidates, CONTRAST)
            without = scores_by_hand(member, PROMPT_LEFT_OUT, before, rnd.candidates, CONTRAST)
            assert list(row) == pytest.approx([z - 0.3 * z0 for z, z0 in zip(with_prompt, without)], abs=1e-4)
            assert list(row) != pytest.approx(with_prompt, abs=1e-3)  # the second context does count
        before = rnd.text


def test_off_by_default_and_runs_side_by_side_equal_each_alone(trio):
    plain = EnsembleConfig(max_new_tokens=24, segment_len=4, verify="always", exit=False)
    assert EnsembleConfig().prompt_contrast == 0.0
    ensemble = Ensemble(trio)
    alone = [list(ensemble.stream(PROMPT, c)) for c in (CONTRAST, plain)]
    together: list[list] = [[], []]
    for i, rnd in ensemble.stream_many([PROMPT, PROMPT], [CONTRAST, plain]):
        together[i].append(rnd)
    for mine, theirs in zip(together, alone):
        same_rounds(mine, theirs)
    first = alone[1][0]
    member = trio[0]
    assert list(first.raw_scores[0]) == pytest.approx(
        scores_by_hand(member, PROMPT, "", first.candidates, plain), abs=1e-4
    )


def test_a_branch_reads_the_answer_so_far_into_the_context_without_the_prompt_too(trio):
    ensemble = Ensemble(trio)
    whole = list(ensemble.stream(PROMPT, CONTRAST))
    assert len(whole) > 3
    same_rounds(list(ensemble.stream(PROMPT, CONTRAST, start=whole[:2])), whole[2:])


def test_a_member_that_cannot_read_an_empty_prompt_fails_the_run_naming_prompt_contrast():
    from specfuse.prompts import PromptFormat

    bare = tiny_member("bare", "llama-bytes", prompt_format=PromptFormat("completion", template="{prompt}"))
    other = tiny_member("qwen-merges")
    ensemble = Ensemble([bare, other])
    assert list(ensemble.stream(PROMPT, replace(CONTRAST, prompt_contrast=0.0)))  # plain runs still go
    with pytest.raises(ConfigError, match="prompt_contrast: bare cannot start a context without the prompt"):
        list(ensemble.stream(PROMPT, CONTRAST))
