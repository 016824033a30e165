"""stream_many: several prompts in lockstep give each prompt the rounds it gets alone."""

from __future__ import annotations

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble

from ..runs import PROMPTS, same_rounds, streamed_many


def test_stream_many_matches_one_at_a_time_on_three_architectures(tiny_members):
    config = EnsembleConfig(segment_len=6, max_new_tokens=30, exit_warmup=2)
    ensemble = Ensemble(tiny_members, config)
    alone = [list(ensemble.stream(p)) for p in PROMPTS]
    together: list[list] = [[] for _ in PROMPTS]
    order = []
    for i, rnd in ensemble.stream_many(PROMPTS):
        together[i].append(rnd)
        order.append(i)
    for a, b in zip(alone, together):
        same_rounds(a, b)
    assert order[:3] == [0, 1, 2]  # lockstep: round 1 of every prompt before any round 2


def test_each_prompt_may_run_its_own_config_in_one_batch(tiny_members):
    variants = [
        EnsembleConfig(segment_len=5, max_new_tokens=20),
        EnsembleConfig(segment_len=5, max_new_tokens=20, score="logprob", aggregation="median"),
        EnsembleConfig(segment_len=5, max_new_tokens=20, repeat_penalty=1.0, feedback=False),
    ]
    ensemble = Ensemble(tiny_members)
    together: list[list] = [[] for _ in variants]
    for i, rnd in ensemble.stream_many([PROMPTS[0]] * 3, variants):
        together[i].append(rnd)
    for cfg, got in zip(variants, together):
        same_rounds(list(ensemble.stream(PROMPTS[0], cfg)), got)


def test_a_finished_prompt_drops_out_and_the_others_go_on(tiny_members):
    configs = [
        EnsembleConfig(segment_len=4, max_new_tokens=4),
        EnsembleConfig(segment_len=4, max_new_tokens=24),
    ]
    seen = [0, 0]
    for i, _ in Ensemble(tiny_members).stream_many(PROMPTS[:2], configs):
        seen[i] += 1
    assert seen[0] == 1 and seen[1] > 1


def test_one_config_per_prompt_or_a_clear_error(tiny_members):
    with pytest.raises(Exception, match="2 prompts but 1 configs"):
        list(Ensemble(tiny_members).stream_many(PROMPTS[:2], [EnsembleConfig()]))


def test_token_scores_are_the_evidence_behind_each_raw_score(tiny_members):
    rounds = list(Ensemble(tiny_members, EnsembleConfig(max_new_tokens=12, score="logit")).stream(PROMPTS[1]))
    for r in rounds:
        assert len(r.token_scores) == len(r.verifiers)
        for row, z_row in zip(r.token_scores, r.raw_scores):
            assert len(row) == len(r.candidates)
            for detail, z in zip(row, z_row):
                assert len(detail.tokens) == len(detail.logits) >= 1
                assert detail.logprobs == ()  # logit scoring never pays for full vocabulary rows
                assert z == pytest.approx(sum(detail.logits) / len(detail.logits), abs=1e-5)
    logprob = list(
        Ensemble(tiny_members, EnsembleConfig(max_new_tokens=12, score="logprob")).stream(PROMPTS[1])
    )
    detail = logprob[0].token_scores[0][0]
    assert len(detail.logprobs) == len(detail.logits) and all(v <= 0 for v in detail.logprobs)


def test_a_rolling_batch_gives_the_same_answers(tiny_members):
    config = EnsembleConfig(segment_len=5, max_new_tokens=20)
    ensemble = Ensemble(tiny_members, config)
    for prompt, rounds in zip(PROMPTS, streamed_many(ensemble, PROMPTS, batch_size=2)):
        same_rounds(list(ensemble.stream(prompt)), rounds)
