"""tools/rule_flips.py: replaying a folder of traces under the run's own rule and one part changed."""

from __future__ import annotations

import pytest

from specfuse import Ensemble, EnsembleConfig, Trace, load_trace, save_trace

from ..repo_tools import load_tool
from ..scripted import ScriptedMember

LOOP = "the cat sat on the mat "


@pytest.fixture(scope="module")
def tool():
    return load_tool("rule_flips")


def traces(folder, config: EnsembleConfig, runs: int = 2) -> None:
    """`runs` traces of two scripted members: "a" drafts the same text every round (its 3-grams repeat
    from round 2 on) and both verifiers like it best; "b" drafts fresh words each round."""
    folder.mkdir()
    for n in range(runs):
        members = [
            ScriptedMember("a", [LOOP] * 6, lambda t: 2.0 if t == LOOP else 1.0),
            ScriptedMember(
                "b",
                [f"fresh{k} words{k} here{k} now{k} " for k in range(6)],
                lambda t: 2.0 if t == LOOP else 1.0,
            ),
        ]
        rounds = tuple(Ensemble(members, config).stream("go"))
        save_trace(Trace("go", ("a", "b"), config, rounds), folder / f"run-{n}.json")


def test_the_runs_own_rule_reproduces_every_choice_and_the_penalty_is_seen_deciding(tool, tmp_path):
    config = EnsembleConfig(max_rounds=5, exit=False, verify="always", repeat_penalty=1.0, prior="uniform")
    traces(tmp_path / "runs", config)
    out = tool.replay(tmp_path / "runs")
    assert (out["answers"], out["rounds"], out["scored"]) == (2, 10, 10)
    rules = out["rules"]
    assert rules["the run's own rule"]["differ"] == 0
    # Both verifiers prefer "a" every round (z-softmax 0.88 against 0.12). In round 2 four of its six
    # 3-grams repeat (the two across the join are new): penalty 0.67, "a" still wins. From then on,
    # after a round of "a" all six repeat (penalty 1.0) and "b" wins (rounds 3 and 5); after a round
    # of "b" the two across the join are new again (round 4). Without the penalty "a" wins all five.
    assert [r.winner.member for r in load_trace(tmp_path / "runs" / "run-0.json").rounds] == list("aabab")
    assert rules["without the repeat penalty"] == {"differ": 4, "answers": 2, "picks": {"a": 4}}
    assert "mean instead of median" in rules and "with self-scores" not in rules


def test_a_rule_part_the_run_did_not_use_is_not_offered_as_a_change(tool, tmp_path):
    config = EnsembleConfig(max_rounds=3, exit=False, verify="always", repeat_penalty=0.0, aggregation="mean")
    traces(tmp_path / "runs", config, runs=1)
    rules = tool.replay(tmp_path / "runs")["rules"]
    assert set(rules) == {"the run's own rule", "median instead of mean", "without self-scores"}
    # both verifiers rank the two drafts alike every round, so the median and the mean choose alike
    assert rules["median instead of mean"]["differ"] == 0 and rules["the run's own rule"]["differ"] == 0
    assert rules["without self-scores"]["differ"] == 0  # "b" prefers "a"'s draft too: "a" stays ahead


def test_an_empty_folder_is_refused_by_name(tool, tmp_path):
    (tmp_path / "none").mkdir()
    with pytest.raises(SystemExit, match="none: no trace files"):
        tool.replay(tmp_path / "none")


def test_a_file_that_is_not_a_trace_is_refused_by_name(tool, tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "other.json").write_text('{"outcomes": []}')
    with pytest.raises(SystemExit, match="other.json: not a specfuse trace"):
        tool.replay(folder)
