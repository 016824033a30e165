"""tools/answer_judges.py: which whole answer each likelihood judge picks, and its tally against Qwen
alone (the real members' run is results/eval/ifeval-answer-judges.json; this checks the arithmetic)."""

from __future__ import annotations

import json

import pytest

from ..repo_tools import load_tool

NAMES = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]


@pytest.fixture(scope="module")
def tool():
    return load_tool("answer_judges")


def test_only_rows_where_exactly_one_answer_is_right_are_judged(tool, tmp_path):
    def outcome(system, problem, correct):
        return {"system": system, "problem": problem, "correct": correct, "answer": f"{system} {problem}"}

    rows = [("p0", True, True), ("p1", True, False), ("p2", False, True), ("p3", False, False)]
    outcomes = [outcome(tool.QWEN, p, q) for p, q, _ in rows] + [outcome(tool.SMOL, p, s) for p, _, s in rows]
    outcomes.append(outcome("ensemble", "p3", True))  # another system's outcome is ignored
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"outcomes": outcomes}))
    both, total, discordant = tool.discordant_rows(str(report))
    assert (both, total) == (1, 4)
    assert [(r["problem"], r["right"]) for r in discordant] == [("p1", 0), ("p2", 1)]
    assert discordant[1]["answers"] == (f"{tool.QWEN} p2", f"{tool.SMOL} p2")


def test_picks_and_tally(tool):
    # Scores of (Qwen's answer, SmolLM2's answer) on three rows: SmolLM2 prefers its own, Qwen its own,
    # Gemma is split. With the prompt left out Qwen finds its own answer on row 0 far likelier still,
    # so the prompt's contrast (λ = 1) turns its pick there to SmolLM2's answer.
    z = {
        "smollm2-135m": [[-2.0, -1.0], [-2.0, -1.0], [-2.0, -1.0]],
        "gemma3-270m": [[-1.0, -2.0], [-2.0, -1.0], [-1.0, -2.0]],
        "qwen2.5-coder-0.5b": [[-1.0, -1.5], [-1.0, -3.0], [-1.0, -1.0]],
    }
    z_left_out = {name: [[-3.0, -3.0]] * 3 for name in NAMES}
    z_left_out["qwen2.5-coder-0.5b"] = [[-0.2, -2.0], [-3.0, -3.0], [-3.0, -3.0]]
    picks = tool.judge_picks(z, z_left_out, NAMES, [0.2, 0.1, 0.7])
    assert picks["smollm2-135m alone"] == [1, 1, 1]
    assert picks["gemma3-270m alone"] == [0, 1, 0]
    assert picks["qwen2.5-coder-0.5b alone"] == [0, 0, 0]  # a tie goes to Qwen's answer
    assert picks["qwen2.5-coder-0.5b, prompt contrast 1.0"] == [1, 0, 0]
    assert picks["the default's rule (trust, median)"] == [0, 0, 0]  # Qwen holds over half the weight
    assert picks["uniform mean"] == [0, 1, 0]  # two candidates: each row gives only its order

    out = tool.tally(picks, [1, 0, 1], both=10, total=20)
    assert (out["qwen_alone"], out["smollm2_alone"], out["discordant"]) == (11, 12, 3)
    smol = out["judges"]["smollm2-135m alone"]
    assert (smol["correct"], smol["right_of_discordant"], smol["picks_smollm2"]) == (12, 2, 3)
    assert smol["vs_qwen"]["gained"] == 2 and smol["vs_qwen"]["lost"] == 1
    assert out["judges"]["the default's rule (trust, median)"]["correct"] == 11
    assert out["judges"]["uniform mean"]["vs_qwen"] == {"gained": 0, "lost": 1, "p": 1.0}
