"""Branching: continue a run from round k with another candidate, or a typed segment, as winner."""

from __future__ import annotations

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import TYPED, Ensemble
from specfuse.errors import ConfigError

from ..runs import same_rounds

PROMPTS = ["Tell me about the sea", "Once upon a time", "Why is the sky blue? Explain it to a child."]
CONFIG = EnsembleConfig(segment_len=5, max_new_tokens=30, exit_warmup=1)


@pytest.fixture(scope="module")
def run(tiny_members):
    """The first prompt whose run lasts at least three rounds (random weights may end early)."""
    for prompt in PROMPTS:
        rounds = list(Ensemble(tiny_members, CONFIG).stream(prompt))
        if len(rounds) >= 3:
            return prompt, rounds
    raise AssertionError("no prompt ran three rounds")


@pytest.fixture(scope="module")
def original(run):
    return run[1]


@pytest.fixture(scope="module")
def prompt(run):
    return run[0]


def test_branching_with_the_original_winner_reproduces_the_run(tiny_members, original, prompt):
    k = 3
    branch = list(
        Ensemble(tiny_members, CONFIG).stream(
            prompt, start=original[: k - 1], forced=original[k - 1].winner.text
        )
    )
    same_rounds(original[k - 1 :], branch)


def test_branching_with_another_candidate_forces_it_and_keeps_the_past(tiny_members, original, prompt):
    k = 2
    loser = next(j for j in range(len(original[k - 1].candidates)) if j != original[k - 1].chosen)
    text = original[k - 1].candidates[loser].text
    branch = list(Ensemble(tiny_members, CONFIG).stream(prompt, start=original[: k - 1], forced=text))
    first = branch[0]
    assert first.k == k and first.chosen == loser and first.winner.text == text
    assert first.text == original[k - 2].text + text
    assert first.weights_before == original[k - 2].weights_after
    assert [c.text for c in first.candidates] == [c.text for c in original[k - 1].candidates]
    assert branch[-1].text.startswith(original[k - 2].text + text)


def test_a_typed_segment_is_scored_by_every_verifier_and_wins(tiny_members, original, prompt):
    typed = " and the whales sing"
    branch = list(Ensemble(tiny_members, CONFIG).stream(prompt, start=original[:1], forced=typed))
    first = branch[0]
    assert first.candidates[-1].member == TYPED and first.winner.text == typed
    assert all(len(row) == len(first.candidates) for row in first.raw_scores)
    assert len(first.raw_scores) == len(first.verifiers) == 3
    assert first.rewards[-1] == 0.0  # a person earns no weight
    assert first.text == original[0].text + typed


def test_a_branch_refuses_rounds_it_cannot_continue(tiny_members, original, prompt):
    ensemble = Ensemble(tiny_members, CONFIG)
    with pytest.raises(ConfigError, match="ended"):
        list(ensemble.stream(prompt, start=original, forced="x"))
    with pytest.raises(ConfigError, match="not by this ensemble"):
        list(Ensemble(tiny_members[:2], CONFIG).stream(prompt, start=original[:1], forced="x"))
    with pytest.raises(ConfigError, match="rounds 1..k"):
        list(ensemble.stream(prompt, start=original[1:2], forced="x"))
    with pytest.raises(ConfigError, match="empty"):
        list(ensemble.stream(prompt, start=original[:1], forced=""))
