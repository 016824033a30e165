"""The command line: streaming, the trace it writes, and exit status 2 with a reason on bad input."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from specfuse import load_trace
from specfuse.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_streams_the_answer_and_writes_its_trace(tiny_checkpoints, tmp_path):
    trace = tmp_path / "run.json"
    code, out, err = run_cli(
        "--models", ",".join(tiny_checkpoints), "--max-new-tokens", "24", "--trace", str(trace), "Hello there"
    )
    assert code == 0, err
    saved = load_trace(trace)
    assert out == saved.result.answer + "\n"
    assert f"round {len(saved.rounds):>3}" in err and "stop: " in err
    assert saved.members == tuple(tiny_checkpoints)


def test_the_same_model_twice_shares_its_weights_when_sampling(tiny_checkpoints, tmp_path):
    path = tiny_checkpoints[0]
    code, out, err = run_cli(
        "--models", f"{path},{path}", "--temperature", "0.8", "--max-new-tokens", "12", "Hi"
    )
    assert code == 0, err


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--models", "a,b", ""], "prompt is empty"),
        (["--models", "no-such-model,smollm2-135m", "hi"], "Unknown model 'no-such-model'"),
        (["--models", "smollm2-135m,smollm2-135m", "hi"], "identical candidates"),
        (["--segment-len", "0", "hi"], "segment_len must be an integer in 1..256"),
        (["--segment-len", "300", "hi"], "segment_len must be an integer in 1..256"),
        (["--temperature", "-1", "hi"], "temperature must be ≥ 0"),
        (["--top-p", "0", "hi"], "top_p must be in (0, 1]"),
        (["--models", "owner/not-here", "hi"], "owner/not-here"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, reason, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = run_cli(*argv)
    assert code == 2
    assert reason in err
    assert err.strip().count("\n") == 0 or "loading" in err  # one line of reason (after any progress)


def test_a_prompt_longer_than_a_members_context_exits_2(tiny_checkpoints):
    code, _, err = run_cli("--models", tiny_checkpoints[0], "--quiet", "word " * 400)
    assert code == 2 and "beyond the model's context of 512" in err


def test_help_documents_every_flag():
    text = build_parser().format_help()
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert flag in text


def test_readme_shows_the_current_help():
    result = subprocess.run(
        [sys.executable, "tools/readme_help.py"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_python_dash_m_runs_the_cli():
    result = subprocess.run(
        [sys.executable, "-m", "specfuse", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0 and "usage: specfuse" in result.stdout
