"""Rule comparison on recorded rounds: each rule re-chooses from the same scores."""

from __future__ import annotations

import dataclasses

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.rules import RULES, Rule, choose_by, raw_scores, rule_choices

from ..scripted import ScriptedMember


def test_the_default_rule_agrees_with_what_the_engine_chose(tiny_members):
    for r in Ensemble(tiny_members, EnsembleConfig(max_new_tokens=20)).stream("Say hi"):
        assert choose_by(r, Rule("default")) == r.chosen


def test_rules_that_need_missing_evidence_say_so(tiny_members):
    r = next(Ensemble(tiny_members, EnsembleConfig(max_new_tokens=8, score="logit")).stream("Say hi"))
    by_name = {c.rule: c for c in rule_choices(r)}
    assert by_name["mean log-prob"].chosen is None and "not recorded" in by_name["mean log-prob"].note
    assert len(by_name) == len(RULES)
    logprob = next(Ensemble(tiny_members, EnsembleConfig(max_new_tokens=8, score="logprob")).stream("Say hi"))
    assert {c.rule: c for c in rule_choices(logprob)}["mean log-prob"].chosen == logprob.chosen


def test_the_paper_rule_refuses_negative_scores_and_self_scores_change_the_winner():
    # a and b each love their own candidate; c slightly prefers b's. Raw scores are negative.
    scores = {"a": {"A": -1.0, "B": -3.0}, "b": {"A": -3.0, "B": -1.0}, "c": {"A": -2.0, "B": -1.9}}
    members = [
        ScriptedMember("a", [("A", True)], lambda t: scores["a"][t]),
        ScriptedMember("b", [("B", True)], lambda t: scores["b"][t]),
        ScriptedMember("c", [("B", True)], lambda t: scores["c"][t]),  # c drafts the same text as b
    ]
    r = next(Ensemble(members, EnsembleConfig(exit=False, initial_weights=(0.6, 0.2, 0.2))).stream("q"))
    by_name = {c.rule: c for c in rule_choices(r)}
    assert by_name["paper: z / Σz of mean logits"].chosen is None
    assert by_name["z-softmax, weighted mean"].member == "a"  # a's weight carries its own candidate
    assert by_name["without self-scores"].member == "b"  # without it, b and c back "B"


def test_the_paper_rule_judges_mean_logits_rebuilt_from_the_token_evidence_and_says_so(tiny_members):
    """The row "paper: z / Σz of mean logits" judged the recorded mean log-probs (the default score)
    and refused every round ("needs positive scores, got [-0.799, …]") although the round held the
    token logits (issue 24, item 6)."""
    rnd = next(Ensemble(tiny_members, EnsembleConfig(max_new_tokens=8, exit=False)).stream("Say hi"))
    assert rnd.token_scores and all(d.logprobs and d.logits for row in rnd.token_scores for d in row)
    logits = [[d.mean("logit") + 30.0 for d in row] for row in rnd.token_scores]  # real models' ~24
    shifted = tuple(
        tuple(dataclasses.replace(d, logits=tuple(v + 30.0 for v in d.logits)) for d in row)
        for row in rnd.token_scores
    )
    positive = dataclasses.replace(rnd, token_scores=shifted)
    assert all(v < 0 for row in positive.raw_scores for v in row)  # the recorded mean log-probs
    paper = {c.rule: c for c in rule_choices(positive, recorded="logprob")}["paper: z / Σz of mean logits"]
    assert paper.chosen is not None and paper.scores == "mean logits (from the token evidence)"
    # The same choice as on a round that recorded those mean logits as its z_ij.
    as_logits = dataclasses.replace(positive, raw_scores=tuple(tuple(row) for row in logits))
    assert paper.chosen == choose_by(as_logits, Rule("z / Σz", normalization="sum"), recorded="logit")
    assert flat(raw_scores(positive, "logit", "logprob")[0]) == pytest.approx(flat(logits))
    # Rules on the recorded scores say which kind they are.
    by_name = {c.rule: c for c in rule_choices(positive, recorded="logprob")}
    assert by_name["z-softmax, weighted mean"].scores == "recorded mean log-probs"
    assert by_name["mean log-prob"].scores == "recorded mean log-probs"
    assert by_name["mean log-prob"].chosen == by_name["z-softmax, weighted mean"].chosen == rnd.chosen


def test_a_run_recorded_in_logits_is_judged_on_its_recorded_logits_by_the_paper_rule(tiny_members):
    rnd = next(Ensemble(tiny_members, EnsembleConfig(max_new_tokens=8, score="logit")).stream("Say hi"))
    rebuilt, label = raw_scores(rnd, "logit", "logit")
    assert label == "recorded mean logits" and rebuilt == [list(row) for row in rnd.raw_scores]
    assert flat(raw_scores(rnd, "logit", "logprob")[0]) == pytest.approx(flat(rebuilt))  # the same means
    without = dataclasses.replace(rnd, token_scores=())
    with pytest.raises(ValueError, match="mean log-probs were not recorded"):
        raw_scores(without, "logprob", "logit")


def flat(matrix):
    return [v for row in matrix for v in row]


def test_rounds_taken_unscored_are_judged_without_scores_and_never_crash():
    """The app's what-if table reads every round: a lone draft (the default verify="contested") is
    every rule's choice; drafts that agreed (verify="disagree") have no scores to judge."""

    def longest(text: str) -> float:
        return float(len(text))

    strong = ScriptedMember("strong", ["long text here "] * 12 + [("end", True)], longest)
    weak = ScriptedMember("weak", ["x "] * 13, longest)
    config = EnsembleConfig(max_new_tokens=200, segment_len=4, exit_warmup=1)
    rounds = list(Ensemble([strong, weak]).stream("Q?", config))
    lone = next(r for r in rounds if not r.verified)
    choices = rule_choices(lone)
    assert len(choices) == len(RULES) and {(c.chosen, c.member) for c in choices} == {(0, "strong")}
    twins = [ScriptedMember(n, ["same ", ("end", True)], lambda t: 1.0) for n in ("a", "b")]
    agreed = next(iter(Ensemble(twins).stream("Q?", EnsembleConfig(verify="disagree"))))
    assert not agreed.verified and len(agreed.candidates) == 2
    assert all(c.chosen is None and "drafts agreed" in c.note for c in rule_choices(agreed))
