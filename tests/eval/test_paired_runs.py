"""tools/paired_runs.py: two systems paired across runs folders and committed report JSONs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from specfuse.eval import cli as ev
from specfuse.eval import report as eval_report

from ..helpers_eval import CONFIG, scripted, write_data
from ..repo_tools import load_tool

ROOT = Path(__file__).resolve().parents[2]
HISTORY = "7407b66"  # the last commit whose results/ held the raw IFEval reports


def test_paired_runs_joins_a_report_and_a_runs_folder_per_side_and_refuses_overlaps(tmp_path):
    # tools/paired_runs.py: a side stitched from a committed report (rows 0-1) and a new runs folder
    # (rows 2-3) pairs exactly as one run of all four rows would.
    tool = load_tool("paired_runs")
    members, singles = [scripted("a", 2), scripted("b", 3)], ["single-a", "single-b"]
    data = write_data(tmp_path / "d.jsonl", 4)  # gold 2, 3, 4, 5: a is right on row 0, b on row 1
    early, late = ev.load_problems(data, rows=range(0, 2)), ev.load_problems(data, rows=range(2, 4))
    outcomes = ev.evaluate(members, early, tmp_path / "early", config=CONFIG, systems=singles)
    eval_report.write_reports(outcomes, early, tmp_path / "out", "early", png=False, config=CONFIG)
    ev.evaluate(members, late, tmp_path / "late", config=CONFIG, systems=singles)
    ev.evaluate(members, early + late, tmp_path / "whole", config=CONFIG, systems=singles)
    stitched = f"{tmp_path / 'out' / 'early.json'}:single-a,{tmp_path / 'late'}:single-a"

    result = tool.compare(stitched, f"{tmp_path / 'whole'}:single-b", str(data))
    assert result["problems"] == 4 and (result["only_a"], result["only_b"], result["both_wrong"]) == (1, 1, 2)
    assert result["same_answer"] == 0  # a always says 2, b always 3
    same = tool.compare(stitched, f"{tmp_path / 'whole'}:single-a", str(data))
    assert same["same_answer"] == 4 and same["only_a"] == same["only_b"] == 0 and same["both_right"] == 1
    overlapping = f"{tmp_path / 'out' / 'early.json'}:single-a,{tmp_path / 'whole'}:single-a"
    with pytest.raises(SystemExit, match="repeats 2 problems"):
        tool.compare(overlapping, f"{tmp_path / 'whole'}:single-b", str(data))
    with pytest.raises(SystemExit, match="no outcomes of 'single-c'"):
        tool.compare(f"{tmp_path / 'late'}:single-c", f"{tmp_path / 'whole'}:single-b", str(data))


def test_a_missing_data_file_is_a_usage_error_that_names_it(tmp_path, capsys):
    tool = load_tool("paired_runs")
    with pytest.raises(SystemExit) as stop:
        tool.main(["--data", str(tmp_path / "nowhere.jsonl"), f"{tmp_path}:a", f"{tmp_path}:b"])
    assert stop.value.code == 2 and "nowhere.jsonl" in capsys.readouterr().err


def test_data_ifeval_pairs_two_committed_reports_on_the_packaged_rows(capsys):
    # The default and Qwen alone on IFEval rows 0-299 in llama.cpp, as docs/evaluation.md reports them
    # (62 against 65, 9 : 12); the instruction groups come from the packaged rows too. The reports are
    # in git history (`<commit>:<path>`, results/README.md), read by the tool with `git show`.
    shown = subprocess.run(["git", "cat-file", "-e", f"{HISTORY}^{{commit}}"], cwd=ROOT, capture_output=True)
    if shown.returncode:
        pytest.skip(f"commit {HISTORY} is not in this clone's history (a shallow clone?)")
    tool = load_tool("paired_runs")
    tool.main(
        [
            "--data",
            "ifeval",
            f"{HISTORY}:results/RESULTS-ifeval-gguf-median.json:median",
            f"{HISTORY}:results/RESULTS-ifeval-gguf-qwen.json:single-qwen2.5-coder-0.5b",
        ]
    )
    out = capsys.readouterr().out
    assert out.startswith("300 problems both finished")
    assert "both right 53, only a 9, only b 12, both wrong 226" in out and "detectable_format" in out


def test_a_source_at_a_commit_this_clone_lacks_is_refused_by_name():
    tool = load_tool("paired_runs")
    with pytest.raises(SystemExit, match="0000000:results/x.json is not in this clone's git history"):
        tool.main(["--data", "ifeval", "0000000:results/x.json:a", "0000000:results/y.json:b"])
