"""Verification only where there is something to decide: config verify="contested" (the default: a lone
draft is taken unscored) and verify="disagree" (also drafts that agree): which drafts agree, what an
unscored round records, and that answers stay those of always-verify."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.errors import TraceError
from specfuse.segments import agreement
from specfuse.trace import Trace, dump_trace, load_trace

from ..conftest import tiny_member
from ..scripted import ScriptedMember

DISAGREE = EnsembleConfig(max_new_tokens=40, segment_len=4, verify="disagree", exit=False)


@pytest.mark.parametrize(
    "candidates, agreed",
    [
        ([("a b", False), ("a b", False)], 0),  # the same text
        ([("a b", False), ("a b c", False), ("a b cd", False)], 0),  # the shortest begins every other
        ([("a b c", False), ("a b", False)], 1),
        ([("a.", True), ("a.", True)], 0),  # both end the answer with the same text
        ([("a", True), ("a b", False)], None),  # one would end the answer, the other goes on
        ([("a.", True), ("a.", False)], None),  # same text, different minds about ending
        ([("", False), ("x", False)], None),  # an empty draft agrees with nothing
        ([("  ", False), ("  x", False)], None),  # nor a blank one
        ([("ab", False), ("ac", False)], None),
        ([(" a", False), ("a", False)], None),  # a different space is a different text
        ([("x", False)], None),  # one drafter: nothing to agree on
    ],
)
def test_which_drafts_agree(candidates, agreed):
    assert agreement(candidates) == agreed


def judge(text: str) -> float:
    return float(len(text))


def test_agreeing_drafts_are_taken_without_any_score_call_or_feedback():
    members = [ScriptedMember(n, ["one ", "two ", ("three", True)], judge) for n in "ab"]
    rounds = list(Ensemble(members).stream("Count.", DISAGREE))
    assert [r.text for r in rounds][-1] == "one two three"
    assert all(not r.verified and r.verifiers == () and r.raw_scores == () for r in rounds)
    assert all(r.weights_after == r.weights_before and set(r.rewards) == {0.0} for r in rounds)
    assert not any(kind == "score" for m in members for kind, _ in m.calls)
    assert rounds[-1].stop_reason == "final"
    result = Trace("Count.", ("a", "b"), DISAGREE, tuple(rounds)).result
    assert result.verify_calls == 0 and result.rounds == 3


def test_a_prefix_is_agreed_and_disagreement_is_scored_as_always():
    a = ScriptedMember("a", ["The answer", " is 4", ("2.", True)], judge)
    b = ScriptedMember("b", ["The answer is", " was 5", ("2.", True)], judge)
    rounds = list(Ensemble([a, b]).stream("Q?", DISAGREE))
    assert [r.verified for r in rounds] == [False, True, False]
    assert rounds[0].winner.member == "a" and rounds[0].winner.text == "The answer"
    assert rounds[1].verifiers == ("a", "b") and len(rounds[1].raw_scores) == 2
    assert rounds[1].winner.text == " was 5"  # the longer text, by the scripted judge
    assert sum(kind == "score" for kind, _ in a.calls) == 1


def test_unverified_rounds_round_trip_through_a_trace_and_a_lie_is_refused(tmp_path):
    members = [ScriptedMember(n, ["same ", ("end", True)], judge) for n in "ab"]
    rounds = tuple(Ensemble(members).stream("Q?", DISAGREE))
    trace = Trace("Q?", ("a", "b"), DISAGREE, rounds)
    path = tmp_path / "t.json"
    path.write_text(dump_trace(trace))
    again = load_trace(path)
    assert [r.verified for r in again.rounds] == [False, False] and again.config.verify == "disagree"
    path.write_text(dump_trace(trace).replace('"verifiers": []', '"verifiers": ["a"]', 1))
    with pytest.raises(TraceError):
        load_trace(path)


def test_two_copies_of_one_tiny_model_never_need_a_verify_pass_and_answer_as_always():
    """Real members: the same weights under two names draft the same text every round, so each
    round is taken unscored, and the answer equals the always-verify answer (fp32 greedy)."""
    twins = [tiny_member("llama-bytes"), tiny_member("twin", spec="llama-bytes")]
    always = Ensemble(twins).run("Tell me about rivers.", EnsembleConfig(max_new_tokens=24, segment_len=4))
    rounds = list(Ensemble(twins).stream("Tell me about rivers.", replace(DISAGREE, max_new_tokens=24)))
    assert rounds and not any(r.verified for r in rounds)
    assert rounds[-1].text == always.answer


def test_different_tiny_models_disagree_and_are_scored(tiny_members):
    rounds = list(
        Ensemble(tiny_members[:2]).stream("Tell me about rivers.", replace(DISAGREE, max_new_tokens=12))
    )
    assert rounds and all(r.verified for r in rounds if r.candidates[0].text != r.candidates[1].text)
    assert any(r.verified and r.raw_scores for r in rounds)


def test_a_lone_draft_after_the_others_exit_is_taken_unscored():
    """Once the weak members have exited, one drafter is left: under verify="disagree" its segment
    needs no verify pass (under "always" it is still scored)."""
    strong = ScriptedMember("strong", ["long text here "] * 12 + [("end", True)], judge)
    weak = ScriptedMember("weak", ["x "] * 13, judge)
    config = EnsembleConfig(max_new_tokens=200, segment_len=4, verify="disagree", exit_warmup=1)
    rounds = list(Ensemble([strong, weak]).stream("Q?", config))
    lone = [r for r in rounds if len(r.candidates) == 1]
    assert lone and all(not r.verified and r.winner.member == "strong" for r in lone)
    assert all(r.verified for r in rounds if len(r.candidates) == 2)
    always = list(Ensemble([strong, weak]).stream("Q?", replace(config, verify="always")))
    assert always[-1].text == rounds[-1].text and all(r.verified for r in always)


def test_the_default_skips_exactly_the_lone_drafts_and_chooses_weighs_and_exits_as_always(tiny_members):
    """verify="contested" (the default): a round with one draft is taken unscored, every other round
    is scored, and the run is the always-verify run in all but those verify passes (fp32 greedy,
    three real tiny models with eager exits, so that one drafter is left early)."""
    assert EnsembleConfig().verify == "contested"
    config = EnsembleConfig(max_new_tokens=40, segment_len=4, exit_warmup=1, exit_temperature=0.01)
    prompt = "Write a poem."
    contested = list(Ensemble(tiny_members).stream(prompt, config))
    always = list(Ensemble(tiny_members).stream(prompt, replace(config, verify="always")))
    lone = [r for r in contested if len(r.candidates) == 1]
    assert lone and len(lone) < len(contested)  # both kinds of round happen
    assert all(r.verified == (len(r.candidates) > 1) for r in contested)
    assert all(not r.verifiers and not r.raw_scores for r in lone)
    assert all(r.verified for r in always)
    assert [r.text for r in contested] == [r.text for r in always]
    assert [r.winner.member for r in contested] == [r.winner.member for r in always]
    for mine, theirs in zip(contested, always):  # a round of one draft moves no weight either way
        assert mine.weights_after == pytest.approx(theirs.weights_after)
    assert [r.active for r in contested] == [r.active for r in always]
    verify_calls = sum(len(r.verifiers) for r in contested)
    assert verify_calls == sum(len(r.verifiers) for r in always) - len(lone)


def test_the_app_shows_an_unscored_round_as_such_not_as_an_empty_matrix():
    from studio import views

    members = [ScriptedMember(n, ["same <b>text</b> ", ("end", True)], judge) for n in ("a<i>", "b")]
    rnd = next(iter(Ensemble(members).stream("Q?", DISAGREE)))
    figure = views.heatmap_figure(rnd)
    assert figure.data == () and "not verified: the drafts agreed" in figure.layout.title.text
    assert "a&lt;i&gt;" in figure.layout.title.text  # a member's name is escaped in the label


def test_evaluation_traces_run_with_always_verify_stand_for_the_default(tmp_path):
    """contested chooses as always does, so an evaluation's traces from either are the same run;
    disagree may take a shorter agreed draft, so its traces are another config's."""
    from specfuse.eval.outcomes import EvalError
    from specfuse.eval.problems import Problem
    from specfuse.eval.runs import ensemble_system, run_systems

    members = [ScriptedMember(n, [("The answer is 4.", True)], judge) for n in ("a", "b")]
    problems = [Problem("gsm8k-0000", "2 + 2?", "4")]

    def run(verify: str):
        config = EnsembleConfig(max_new_tokens=16, verify=verify)
        return run_systems(members, [ensemble_system("ensemble", ["a", "b"], config)], problems, tmp_path)

    first = run("always")
    assert run("contested")[0].traces == first[0].traces
    assert sum(call[0] == "start" for call in members[0].calls) == 1  # loaded, not run again
    with pytest.raises(EvalError, match="verify 'always' vs 'disagree'"):
        run("disagree")
