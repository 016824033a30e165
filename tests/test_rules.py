"""Rule comparison on recorded rounds: each rule re-chooses from the same scores."""

from __future__ import annotations

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.rules import RULES, Rule, choose_by, rule_choices

from .scripted import ScriptedMember


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
