"""The round loop end to end: on tiny real models and on scripted members."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import pytest
import torch

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError, MemberError
from specfuse.records import summarize

from ..conftest import ascii_only, tiny_member
from ..scripted import ScriptedMember


def test_a_one_member_ensemble_reproduces_its_greedy_decode():
    member = ascii_only(tiny_member("llama-bytes"))  # one byte per token, ASCII only: ids never change
    config = EnsembleConfig(segment_len=7, max_new_tokens=30)
    result = Ensemble([member], config).run("Once upon a time")
    ids = torch.tensor([member.prompt_ids("Once upon a time")])
    out = member.model.generate(
        ids, max_new_tokens=40, do_sample=False, eos_token_id=sorted(member.stop_token_ids)
    )
    greedy = member.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert result.answer and greedy.startswith(result.answer)
    assert result.tokens >= 30 or result.stop_reason == "final"


def test_the_answer_is_exactly_the_concatenation_of_the_chosen_candidates(tiny_members):
    rounds = list(Ensemble(tiny_members, EnsembleConfig(max_new_tokens=40)).stream("Écris 猫 in code: x_1 ="))
    assert rounds[-1].text == "".join(r.winner.text for r in rounds)
    for r in rounds:
        assert len(r.raw_scores) == len(r.verifiers) and all(
            len(row) == len(r.candidates) for row in r.scores
        )
        assert sum(r.weights_after) == pytest.approx(1.0)
        assert r.aggregate[r.chosen] == max(y for y, ok in zip(r.aggregate, r.eligible) if ok)
    assert rounds[-1].stop_reason in ("final", "budget")
    assert all(r.stop_reason is None for r in rounds[:-1])


def test_same_seed_same_rounds_and_sampling_makes_duplicates_differ():
    twins = [tiny_member("twin-1", "llama-bytes"), tiny_member("twin-2", "llama-bytes")]  # same weights
    config = EnsembleConfig(temperature=0.9, top_p=0.95, seed=3, max_new_tokens=24)

    def drafts(cfg):
        return [tuple(c.text for c in r.candidates) for r in Ensemble(twins, cfg).stream("Tell a story")]

    first = drafts(config)
    assert drafts(config) == first  # the same seed: the same rounds
    assert first[0][0] != first[0][1]  # member i samples with seed + i, so the twins differ
    assert drafts(replace(config, seed=4))[0] != first[0]
    greedy = drafts(replace(config, temperature=0.0))
    assert greedy[0][0] == greedy[0][1]  # while greedy twins draft the same text


def test_identical_members_keep_the_weights_uniform():
    same = lambda text: float(len(text))  # noqa: E731
    members = [ScriptedMember(n, ["one ", "two ", ("three", True)], same) for n in "abc"]
    rounds = list(Ensemble(members).stream("go"))
    assert [r.chosen for r in rounds] == [0, 0, 0]  # ties go to the first member
    for r in rounds:
        assert r.weights_after == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert rounds[-1].text == "one two three" and rounds[-1].stop_reason == "final"


def test_weights_move_toward_the_member_everyone_prefers_and_the_loser_exits():
    prefers_b = lambda text: {"good ": 3.0, "fine ": 2.9}.get(text, 0.0)  # noqa: E731
    members = [
        ScriptedMember("a", ["fine "] * 20, prefers_b),
        ScriptedMember("b", ["good "] * 20, prefers_b),
        ScriptedMember("c", ["junk "] * 20, prefers_b),
    ]
    # The paper's feedback and exit (the repeated texts would otherwise meet the repeat penalty).
    paper_like = dict(repeat_penalty=0.0, weighted_rewards=False, exit_min_active=2, exited_verify=True)
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=10, **paper_like)).stream("go"))
    last = rounds[-1]
    assert last.weights_after[1] > last.weights_after[0] > last.weights_after[2]
    exits = [e for r in rounds for e in r.exits]
    assert exits[0].member == "c" and exits[0].k >= 3  # the worst leaves first, not during the warm-up
    assert "b" not in {e.member for e in exits}  # the leader never leaves
    after_exit = rounds[exits[0].k]  # the round after it left
    assert "c" not in after_exit.active and "c" in after_exit.verifiers  # exited members still verify
    result = summarize(rounds)
    assert result.stop_reason == "rounds" and result.calls_saved_by_exit > 0
    assert dict(result.wins)["b"] == 10


def test_exited_members_stop_verifying_when_asked():
    judge = lambda text: {"good ": 3.0, "fine ": 2.0}.get(text, 0.0)  # noqa: E731
    members = [ScriptedMember(n, [t] * 20, judge) for n, t in zip("abc", ["fine ", "good ", "junk "])]
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=8, exited_verify=False)).stream("go"))
    k = next(e.k for r in rounds for e in r.exits)
    assert all("c" not in r.verifiers for r in rounds[k:])
    calls = [phase for phase, _ in members[2].calls]
    # It drafted and scored rounds 1..k, followed the answer through round k - 1, then nothing.
    assert (calls.count("draft"), calls.count("score"), calls.count("accept")) == (k, k, k - 1)


def test_a_member_that_leaves_for_good_lets_its_state_go_at_once():
    # Its caches (a model's KV cache, in an HF member) are freed when it leaves, not when the run ends.
    class Held(dict):  # a state that can be watched
        pass

    class Watched(ScriptedMember):
        def start(self, prompt, settings):
            state = Held(super().start(prompt, settings))
            self.held.append(weakref.ref(state))
            return state

    judge = lambda text: {"good ": 3.0, "fine ": 2.0}.get(text, 0.0)  # noqa: E731
    members = [Watched(n, [t] * 20, judge) for n, t in zip("abc", ["fine ", "good ", "junk "])]
    for m in members:
        m.held = []
    stream = Ensemble(members, EnsembleConfig(max_rounds=8, exited_verify=False)).stream("go")
    for rnd in stream:
        if rnd.exits:
            break
    gc.collect()
    assert [e.member for e in rnd.exits] == ["c"] and members[2].held[0]() is None
    assert members[0].held[0]() is not None and members[1].held[0]() is not None  # still playing
    stream.close()


def test_feedback_off_keeps_weights_and_exit_off_keeps_everyone():
    judge = lambda text: {"good ": 3.0}.get(text, 0.0)  # noqa: E731
    members = [ScriptedMember(n, [t] * 20, judge) for n, t in zip("abc", ["fine ", "good ", "junk "])]
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=8, feedback=False, exit=False)).stream("go"))
    assert all(r.weights_after == pytest.approx((1 / 3,) * 3) and len(r.active) == 3 for r in rounds)


def test_stop_strings_end_the_answer_before_them_even_across_segments():
    judge = lambda text: 1.0  # noqa: E731
    members = [ScriptedMember("a", ["The end\n", "Question: next"], judge)]
    rounds = list(Ensemble(members, EnsembleConfig(stop_strings=("\nQuestion:",))).stream("go"))
    assert rounds[-1].stop_reason == "stop" and rounds[-1].text == "The end\n"


def test_parallel_drafting_gives_the_same_rounds_as_sequential(tiny_members):
    seq = Ensemble(tiny_members, EnsembleConfig(max_new_tokens=20), parallel="off").run("Hi")
    par = Ensemble(tiny_members, EnsembleConfig(max_new_tokens=20), parallel="on").run("Hi")
    assert seq.answer == par.answer and seq.wins == par.wins


@pytest.mark.parametrize("prompt", ["", "   \n", "x" * 100_001])
def test_bad_prompts_are_refused(tiny_members, prompt):
    with pytest.raises(ConfigError):
        next(Ensemble(tiny_members).stream(prompt))


def test_a_failing_member_is_named():
    class Broken(ScriptedMember):
        def score(self, state, candidates):
            raise RuntimeError("out of memory")

    members = [ScriptedMember("a", ["x "], lambda t: 1.0), Broken("b", ["y "], lambda t: 1.0)]
    with pytest.raises(MemberError, match="b: score failed: RuntimeError: out of memory"):
        list(Ensemble(members).stream("go"))


def test_duplicate_names_and_empty_ensembles_are_refused():
    with pytest.raises(ConfigError, match="unique"):
        Ensemble([ScriptedMember("a", ["x"], len), ScriptedMember("a", ["y"], len)])
    with pytest.raises(ConfigError, match="at least one"):
        Ensemble([])
    for name in ("a\x00without the prompt", "a\nb", " "):  # names key states, label plots, fill traces
        with pytest.raises(ConfigError, match="printable text"):
            Ensemble([ScriptedMember(name, ["x"], len)])


def test_closing_the_stream_stops_the_run_and_the_next_run_works(tiny_members):
    ensemble = Ensemble(tiny_members, EnsembleConfig(max_new_tokens=60))
    stream = ensemble.stream("Hello")
    first = next(stream)
    stream.close()
    assert first.k == 1 and first.stop_reason is None
    assert ensemble.run("Hello").rounds >= 1


def test_the_echo_guard_keeps_a_copy_of_the_prompt_from_winning():
    """Small models open by repeating the question and every verifier scores the copy highest;
    once chosen, the others copy too. The guard makes a pure echo ineligible (SPEC: our addition)."""
    prompt = "Janet's ducks lay 16 eggs per day. How many eggs in a week?"
    loves_copies = lambda text: 5.0 if text in prompt else 1.0  # noqa: E731
    members = [
        ScriptedMember("echo", ["Janet's ducks lay 16 eggs", " per day."], loves_copies),
        ScriptedMember("solver", ["16 × 7 = 112", (" eggs.", True)], loves_copies),
    ]
    guarded = list(Ensemble(members).stream(prompt))
    assert guarded[0].winner.member == "solver" and guarded[0].eligible == (False, True)
    assert guarded[0].aggregate[0] > guarded[0].aggregate[1]  # the copy did score higher
    unguarded = list(Ensemble(members, EnsembleConfig(echo_guard=False, max_rounds=1)).stream(prompt))
    assert unguarded[0].winner.member == "echo"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_verifier_whose_scores_are_not_finite_ends_the_request_by_name(bad):
    """Damaged weights give nan scores: the request ends with a reason naming the member, never a
    bare ValueError from the normalization (the CLI died with a traceback, the app showed "Error")."""
    judge = lambda text: bad if text == "y " else 1.0  # noqa: E731
    members = [ScriptedMember("a", ["x "], lambda t: 1.0), ScriptedMember("b", ["y "], judge)]
    with pytest.raises(
        MemberError, match=rf"^b: its scores are not finite \({bad}, for the candidate of b; 1 of 2\)"
    ):
        list(Ensemble(members).stream("go"))


def test_a_member_whose_logits_are_nan_ends_the_request_by_name():
    damaged = tiny_member("qwen-merges")
    with torch.no_grad():
        damaged.model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")  # one damaged value
    members = [tiny_member("llama-bytes"), damaged]
    with pytest.raises(MemberError, match="^qwen-merges: its logits are not finite \\(nan\\) while drafting"):
        list(Ensemble(members, EnsembleConfig(max_new_tokens=20)).stream("Hi"))
