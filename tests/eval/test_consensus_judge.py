"""tools/consensus_judge.py: which whole answer agreement picks, and its tally against the first
member alone (the real figures are results/eval/ifeval-consensus-judge.json; this checks the arithmetic)."""

from __future__ import annotations

import pytest

from ..repo_tools import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("consensus_judge")


def test_similarities(tool):
    assert tool.word_sequence("The sea is blue", "the sea is blue") == 1.0
    assert tool.word_set("a b c", "c b a") == 1.0 and tool.word_sequence("a b c", "c b a") < 1.0
    assert tool.word_set("a b", "c d") == 0.0
    assert tool.word_trigrams("a b c d", "a b c e") == pytest.approx(1 / 3)  # {abc} of {abc, bcd, bce}
    assert tool.word_trigrams("a b", "a b") == 0.0  # no trigram to share


def test_the_answer_most_like_the_others_is_picked_and_ties_go_to_the_first(tool):
    answers = ["the sea is wide", "the sea is wide and blue", "a blue dog barked"]
    assert tool.consensus_pick(answers, tool.word_set) == 1  # as like 0 as 0 is like it, and like 2 too
    assert tool.consensus_pick(answers[:2] + ["a dog barked"], tool.word_set) == 0  # a tie: the first
    assert tool.consensus_pick(["x y", "x y", "x y"], tool.word_set) == 0


def test_the_tally_against_the_first_member(tool):
    def outcome(system, problem, answer, correct):
        return {"system": system, "problem": problem, "answer": answer, "correct": correct}

    a, b, c = ("first", "second", "third")
    outcomes = [
        # p0: b and c agree, b is right where a (the first) is wrong: a gain.
        outcome(a, "p0", "x y z", False),
        outcome(b, "p0", "one two three", True),
        outcome(c, "p0", "one two three four", False),
        # p1: a and c agree, a is right: no change.
        outcome(a, "p1", "red green", True),
        outcome(b, "p1", "blue", False),
        outcome(c, "p1", "red green", False),
        # p2: b and c agree, a alone was right: a loss.
        outcome(a, "p2", "cat", True),
        outcome(b, "p2", "dog bird", False),
        outcome(c, "p2", "dog bird", True),
        outcome(a, "p3", "only one member answered", True),  # left out: not every member answered
        outcome("ensemble", "p0", "x y z", True),  # another system: ignored
    ]
    out = tool.judge(outcomes, members=(a, b, c))
    assert out["rows"] == 3 and out["alone"] == {a: 2, b: 1, c: 1} and out["any_right"] == 3
    j = out["judges"]["word set (Jaccard)"]
    assert j["picks"] == {a: 1, b: 2, c: 0}
    assert j["correct"] == 2 and (j["vs_first"]["gained"], j["vs_first"]["lost"]) == (1, 1)
    assert j["vs_first"]["p"] == pytest.approx(1.0)
