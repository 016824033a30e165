"""The gated round (config.gate): the arithmetic alone (specfuse/engine/gate.py), the round loop on
scripted members (who drafts, verifies, earns and exits), runs in lockstep, and tiny real models."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from specfuse import EnsembleConfig
from specfuse.engine import Ensemble, Scheduler
from specfuse.engine.gate import decide, gatekeeper
from specfuse.errors import ConfigError
from specfuse.members import drafting
from specfuse.members.drafting import confidence
from specfuse.members.hf.drafting import _token_values
from specfuse.members.llamacpp.decode import token_and_runner_up
from specfuse.records import Confidence, summarize

from ..conftest import tiny_member
from ..repo_tools import load_tool
from ..scripted import ScriptedMember, prefers

SURE, UNSURE = -0.01, -2.0
GATED = {"gate": True, "gate_threshold": -0.1, "initial_weights": (0.5, 0.25, 0.25)}


def trio(sure_a=lambda text: SURE, **drafts):
    return [
        ScriptedMember("a", drafts.get("a", ["good "] * 50), prefers("good "), sure=sure_a),
        ScriptedMember("b", drafts.get("b", ["fine "] * 50), prefers("good "), sure=lambda t: SURE),
        ScriptedMember("c", drafts.get("c", ["junk "] * 50), prefers("good "), sure=lambda t: UNSURE),
    ]


def steps(member, step):
    return [arg for kind, arg in member.calls if kind == step]


# -- the arithmetic ---------------------------------------------------------------------------------


def test_a_segments_confidence_in_each_measure():
    found = confidence([-0.1, -0.5], [-3.0, -1.0])
    assert found == Confidence(-0.3, math.exp(-0.5), 0.5, 2)
    assert found.measure("margin") == 0.5 and found.measure("min_prob") == pytest.approx(0.6065, abs=1e-4)
    assert confidence([], []) is None
    with pytest.raises(ValueError, match="2 log-probabilities but 1"):
        confidence([-1.0, -1.0], [-2.0])


def test_the_kept_tokens_are_the_trimmed_draft_and_a_final_drafts_end_marker():
    values = [(-0.1, -3.0), (-0.2, -3.0), (-0.3, -3.0)]
    assert drafting.kept_values(values, 0, 2, 3, False) == values[:2]  # the third token trimmed away
    assert drafting.kept_values(values, 1, 3, 4, False) == values[:2]  # one taken over, unscored
    # a stop token ended it: two kept text tokens, then the end marker's value
    assert drafting.kept_values(values, 0, 2, 2, True) == values
    assert drafting.kept_values(values[:2], 0, 2, 2, True) == values[:2]  # ended by a stop string


def test_the_gatekeeper_is_the_named_member_while_it_drafts_else_the_heaviest():
    names = ("a", "b", "c")
    assert gatekeeper(names, (0.2, 0.5, 0.3), names, "") == "b"
    assert gatekeeper(names, (0.4, 0.2, 0.4), names, "") == "a"  # ties: the first listed
    assert gatekeeper(names, (0.2, 0.5, 0.3), names, "c") == "c"
    assert gatekeeper(names, (0.2, 0.5, 0.3), ("a", "b"), "c") == "b"  # c exited: the heaviest


def test_the_gate_passes_at_the_threshold_and_never_without_a_confidence():
    found = Confidence(-0.1, 0.5, 1.0, 3)
    assert decide("a", found, "mean_logprob", -0.1).passed
    assert not decide("a", found, "min_prob", 0.6).passed
    sure = decide("a", found, "margin", 0.5)
    assert sure.passed and sure.confidence == 1.0 and "without asking the others" in sure.reason
    blind = decide("a", None, "margin", 0.0)
    assert not blind.passed and blind.confidence is None and "gave no confidence" in blind.reason


def test_the_settings_refuse_a_threshold_outside_its_measures_range():
    with pytest.raises(ConfigError, match=r"gate_threshold must be in \[0, 1\] for gate_measure min_prob"):
        EnsembleConfig(gate_measure="min_prob", gate_threshold=-0.1)
    with pytest.raises(ConfigError, match="gate_measure must be one of"):
        EnsembleConfig(gate_measure="entropy")
    assert not EnsembleConfig().gate  # off by default
    assert EnsembleConfig(gate_measure="margin").gate_bar == 2.0  # empty: the measure's own default
    assert EnsembleConfig(gate_threshold=-0.5).gate_bar == -0.5


def test_the_back_ends_token_values_are_the_log_probability_and_the_runner_ups():
    row = np.array([1.0, 3.0, 2.0, -1.0], dtype=np.float32)
    norm = math.log(sum(math.exp(v) for v in row))
    assert token_and_runner_up(row, 1) == pytest.approx((3.0 - norm, 2.0 - norm))
    assert token_and_runner_up(row, 2) == pytest.approx((2.0 - norm, 3.0 - norm))  # sampled, not the top
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.0, 0.0, 5.0, 0.0]])
    got = _token_values(logits, {0: 1, 1: 2})
    assert got[0] == pytest.approx((3.0 - norm, 2.0 - norm))
    assert got[1][0] - got[1][1] == pytest.approx(5.0)
    assert _token_values(logits, {}) == {}


# -- the round loop on scripted members -------------------------------------------------------------


def test_a_sure_gatekeeper_takes_the_round_alone_with_no_rewards_and_says_why():
    members = trio()
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=4, **GATED)).stream("go"))
    assert rounds[-1].text == "good " * 4
    for r in rounds:
        assert r.gated and r.active == ("a",) and r.verifiers == () and not r.verified
        assert r.rewards == (0.0,) and r.weights_after == r.weights_before and r.exits == ()
        assert (r.gate.member, r.gate.confidence, r.gate.threshold) == ("a", SURE, -0.1)
        assert "a was sure" in r.gate.reason
    a, b, c = members
    assert len(steps(a, "draft")) == 4 and steps(b, "draft") == steps(c, "draft") == []
    assert steps(b, "score") == steps(c, "score") == []
    assert steps(b, "accept") == steps(c, "accept") == []  # not asked, they never read the sure segments
    result = summarize(rounds)
    assert result.draft_calls == 4 and result.verify_calls == 0


def test_an_unsure_gatekeeper_plays_the_full_round_with_its_draft_not_redrafted():
    texts = [f"w{i} " for i in range(50)]
    members = trio(lambda text: SURE if int(text[1:]) % 2 == 0 else UNSURE, a=texts, b=texts[::-1])
    config = EnsembleConfig(max_rounds=4, verify="always", **GATED)
    rounds = list(Ensemble(members, config).stream("go"))
    assert [r.gated for r in rounds] == [True, False, True, False]
    full = rounds[1]
    assert full.gate is not None and not full.gate.passed and full.gate.confidence == UNSURE
    assert full.active == ("a", "b", "c") and full.verifiers == ("a", "b", "c") and full.verified
    assert [c.member for c in full.candidates] == ["a", "b", "c"] and full.candidates[0].text == "w1 "
    assert any(full.rewards) and "the others drafted and verified" in full.gate.reason
    a, b, _ = members
    assert steps(a, "draft") == [0, 1, 2, 3]  # once a round: its draft was reused in the full ones
    assert steps(b, "draft") == [1, 3]


def test_a_named_gatekeeper_and_one_that_gives_no_confidence():
    members = trio(lambda text: None)
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=2, **GATED)).stream("go"))
    assert not any(r.gated for r in rounds) and rounds[0].gate.confidence is None
    assert len(rounds[0].candidates) == 3
    named = EnsembleConfig(max_rounds=2, gate_member="b", **GATED)
    rounds = list(Ensemble(trio(lambda text: None), named).stream("go"))
    assert all(r.gated and r.active == ("b",) for r in rounds) and rounds[-1].text == "fine fine "
    with pytest.raises(ConfigError, match="gate_member 'd' is not a member of this run"):
        next(Ensemble(trio(), EnsembleConfig(gate=True, gate_member="d")).stream("go"))


def test_the_gate_is_off_by_default_and_in_a_branchs_forced_round():
    rounds = list(Ensemble(trio(), EnsembleConfig(max_rounds=2)).stream("go"))
    assert all(r.gate is None for r in rounds) and len(rounds[0].candidates) == 3
    config = EnsembleConfig(max_rounds=3, **GATED)
    first = list(Ensemble(trio(), config).stream("go"))[:1]
    branch = list(Ensemble(trio(), config).stream("go", start=first, forced="typed "))
    assert branch[0].gate is None and branch[0].winner.text == "typed " and branch[1].gated


class Batching(ScriptedMember):
    """Records each draft_many call's size, and is sure only of the prompt "sure"."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def start(self, prompt, settings):
        return super().start(prompt, settings) | {"prompt": prompt}

    def draft_many(self, states, budgets):
        self.batches.append(len(states))
        out = super().draft_many(states, budgets)
        value = [SURE if s["prompt"] == "sure" else UNSURE for s in states]
        return [replace(c, confidence=Confidence(v, 1, 1, 1)) for c, v in zip(out, value)]


def batching_trio():
    return [Batching(name, [f"{name} "] * 50, prefers("a ")) for name in "abc"]


def test_gated_and_full_rounds_of_different_runs_share_a_batch():
    config = EnsembleConfig(max_rounds=3, **GATED)
    members = batching_trio()
    both: dict[int, list] = {0: [], 1: []}
    for i, r in Ensemble(members, config).stream_many(["sure", "unsure"], config):
        both[i].append(r)
    assert [r.gated for r in both[0]] == [True] * 3 and [r.gated for r in both[1]] == [False] * 3
    a, b, _ = members
    assert a.batches == [2, 2, 2]  # the gatekeeper drafts for both runs at once, every round
    assert b.batches == [1, 1, 1]  # the others only for the unsure run, in the second draft phase
    for i, prompt in enumerate(["sure", "unsure"]):
        alone = list(Ensemble(batching_trio(), config).stream(prompt))
        assert [(r.text, r.gated, r.active) for r in alone] == [(r.text, r.gated, r.active) for r in both[i]]


def test_the_scheduler_plays_gated_and_full_rounds_side_by_side():
    config = EnsembleConfig(max_rounds=3, **GATED)
    scheduler = Scheduler(batching_trio(), config, join_wait=0.0)
    try:
        tickets = [scheduler.submit(p) for p in ("sure", "unsure")]
        for t in tickets:
            assert t.wait(30)
        assert [r.gated for r in tickets[0].rounds] == [True] * 3
        assert [r.gated for r in tickets[1].rounds] == [False] * 3
    finally:
        scheduler.close()


# -- tiny real models ------------------------------------------------------------------------------


def test_a_gate_that_always_passes_gives_the_gatekeepers_own_answer_on_tiny_models():
    members = [tiny_member("llama-bytes"), tiny_member("qwen-merges")]
    base = EnsembleConfig(max_new_tokens=30, initial_weights=(0.6, 0.4))
    always = EnsembleConfig(**{**base.to_dict(), "gate": True, "gate_threshold": -100.0})
    rounds = list(Ensemble(members, always).stream("Once upon a time"))
    alone = Ensemble(members[:1], EnsembleConfig(max_new_tokens=30)).run("Once upon a time")
    assert all(r.gated and r.active == (members[0].name,) for r in rounds)
    assert rounds[-1].text == alone.answer
    for r in rounds:
        found = r.winner.confidence
        assert found is not None and found.tokens >= 1 and r.gate.confidence == found.mean_logprob
        assert found.mean_logprob <= 0 and 0 < found.min_prob <= 1 and found.margin >= 0  # greedy: the top
    # a gate that never passes (a mean log-probability of 0 is certainty) is the ungated ensemble
    never = EnsembleConfig(**{**base.to_dict(), "gate": True, "gate_threshold": 0.0})
    gated_off = Ensemble(members, never).run("Once upon a time")
    assert gated_off.answer == Ensemble(members, base).run("Once upon a time").answer
    assert not any(r.gated for r in Ensemble(members, never).stream("Once upon a time"))


def test_members_not_asked_in_gated_rounds_read_what_they_missed_once_when_next_asked():
    keeper, other = tiny_member("llama-bytes"), tiny_member("qwen-merges")
    real_draft, real_accept = keeper.draft_many, other.accept
    drafted, read = [0], []

    def sure_twice_then_unsure(states, budgets):
        drafted[0] += 1
        value = UNSURE if drafted[0] % 3 == 0 else SURE
        return [replace(c, confidence=Confidence(value, 1, 1, 1)) for c in real_draft(states, budgets)]

    def reading(state, text):
        read.append(text)
        real_accept(state, text)

    keeper.draft_many, other.accept = sure_twice_then_unsure, reading
    config = EnsembleConfig(segment_len=4, max_new_tokens=24, exit=False, verify="always",
                            initial_weights=(0.6, 0.4), gate=True, gate_threshold=-0.1)  # fmt: skip
    prompt = "Once upon a time"
    rounds = list(Ensemble([keeper, other], config).stream(prompt))
    assert [r.gated for r in rounds] == [True, True, False, True, True, False]
    # the other read nothing in the gated rounds, then what it missed in one accept before drafting
    assert read == [rounds[1].text, rounds[2].winner.text, rounds[4].text[len(rounds[2].text) :]]
    # its draft after catching up is its draft from the same text read at once on a fresh state
    state = other.start(prompt, config.member_settings(1))
    real_accept(state, rounds[1].text)
    assert rounds[2].candidates[1].member == other.name
    assert rounds[2].candidates[1].text == other.draft(state, 4).text
    assert rounds[2].timings[1].accept_s > 0 and rounds[1].timings[1].accept_s == 0


def test_the_app_marks_a_gated_round_in_the_answer_the_matrix_and_the_status():
    from studio import step_views, views

    rounds = list(Ensemble(trio(), EnsembleConfig(max_rounds=2, **GATED)).stream("go"))
    spans = views.answer_value(rounds)
    assert spans == [("good ", f"a{views.GATED}")] * 2
    figure = views.heatmap_figure(rounds[0])
    assert "gated: a was sure" in figure.layout.title.text
    assert "why the others were not asked: a was sure" in figure.layout.annotations[0].text
    assert "2 of 2 rounds gated" in views.status_markdown(rounds)
    assert "why the others were not asked" in views.segment_html(rounds, 0)
    assert "gated: a was sure" in step_views.verdict_note(rounds[0], None, step_views.Tally(), False)


# -- the sweep (tools/gate_sweep.py) ---------------------------------------------------------------


def test_forward_tokens_count_drafts_verification_and_the_readers_of_a_gated_segment():
    tool = load_tool("gate_sweep")
    gated = list(Ensemble(trio(), EnsembleConfig(max_rounds=4, **GATED)).stream("go"))
    assert tool.forward_tokens(gated) == 4 * 1  # a drafts 1 token a round; b and c, never asked, read none
    texts = [f"w{i} " for i in range(50)]
    members = trio(lambda text: SURE if int(text[1:]) % 2 == 0 else UNSURE, a=texts, b=texts[::-1])
    mixed = list(Ensemble(members, EnsembleConfig(max_rounds=2, verify="always", **GATED)).stream("go"))
    # round 1 gated (a drafts 1); round 2: b and c first read round 1's token, then 3 drafts scored by 3
    assert tool.forward_tokens(mixed) == 1 + 2 * 1 + 3 + 3 * 3
    full = list(Ensemble(trio(), EnsembleConfig(max_rounds=2, verify="always")).stream("go"))
    assert tool.forward_tokens(full) == 2 * (3 + 3 * 3)  # 3 drafts of 1 token, each scored by 3
    assert tool.auc([0.9, 0.8], [0.1, 0.8]) == pytest.approx((2 + 1.5) / 4)
    assert tool.auc([], [0.1]) is None


def test_the_sweep_reports_accuracy_gated_share_cost_and_the_measures_calibration(tmp_path, capsys):
    from specfuse.eval import cli as ev

    from ..helpers_eval import CONFIG, scripted, write_data

    tool = load_tool("gate_sweep")
    members = [scripted("a", 2), scripted("b", 3)]
    for m in members:
        m.sure = lambda text: SURE
    data = write_data(tmp_path / "d.jsonl", 2)  # gold 2 and 3: a right on row 0, b on row 1
    variants = {"probe": {"gate": True, "gate_threshold": 0.0}, "g": {"gate": True}}
    systems = ["single-a", "single-b", "probe", "g"]
    ev.evaluate(members, ev.load_problems(data), tmp_path / "runs", config=CONFIG, systems=systems,
                variants=variants)  # fmt: skip
    assert tool.main([str(tmp_path / "runs"), "--data", str(data), "--out", str(tmp_path / "sweep")]) == 0
    document = json.loads((tmp_path / "sweep.json").read_text())
    rows = {r["system"]: r for r in document["systems"]}
    assert rows["g"]["gated_share"] == 1.0 and rows["probe"]["gated_share"] == 0.0
    assert rows["g"]["correct"] == rows["single-a"]["correct"] == 1  # a keeps the gate: a's answers
    assert rows["g"]["forward_tokens_per_answer"] < rows["probe"]["forward_tokens_per_answer"]
    assert rows["single-a"]["token_ratio_to_best"] == 1.0 and rows["probe"]["best_member"] == "single-a"
    assert document["calibration"]["rounds"] > 0 and "mean_logprob" in document["calibration"]
    assert (tmp_path / "sweep.html").is_file() and "gated_share" in capsys.readouterr().out
    argv = [str(tmp_path / "runs"), "--data", str(data), "--rows", "1:2", "--out", str(tmp_path / "row1")]
    assert tool.main(argv) == 0  # row 1 alone: b right, a wrong
    rows = {r["system"]: r for r in json.loads((tmp_path / "row1.json").read_text())["systems"]}
    assert {r["problems"] for r in rows.values()} == {1} and rows["single-a"]["correct"] == 0
    assert rows["single-b"]["correct"] == 1 and rows["g"]["best_member"] == "single-b"
