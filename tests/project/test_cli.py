"""The command line: streaming, the trace it writes, and exit status 2 with a reason on bad input."""

from __future__ import annotations

import dataclasses
import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from specfuse import ConfigError, EnsembleConfig, load_trace
from specfuse.cli import _load, build_parser, main
from specfuse.members.hf import compiled as compiled_decoding

from ..helpers_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]


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


def test_members_in_processes_of_their_own_give_the_same_answer(tiny_checkpoints, tmp_path):
    models = ",".join(tiny_checkpoints)
    answers = []
    for extra in ((), ("--processes",)):
        trace = tmp_path / f"run{len(answers)}.json"
        code, out, err = run_cli(
            "--models", models, "--max-new-tokens", "16", *extra, "--trace", str(trace), "Hi"
        )
        assert code == 0, err
        answers.append(out)
        assert load_trace(trace).members == tuple(tiny_checkpoints)
    assert answers[0] == answers[1] and answers[0].strip()


def test_compile_drafts_in_a_static_cache_and_gives_the_eager_answer(tiny_checkpoints, monkeypatch):
    # --compile's way through the command line; "aot_eager" compiles the same graphs as inductor without
    # its C++ (tests/members/test_compiled_decoding.py runs inductor itself).
    monkeypatch.setattr(compiled_decoding, "DEFAULT_BACKEND", "aot_eager")
    models = ",".join(tiny_checkpoints)
    base = ("--models", models, "--max-new-tokens", "16", "--dtype", "float32", "--no-processes")
    args = build_parser().parse_args([*base, "--compile", "Hi"])
    members = _load(tiny_checkpoints, args, io.StringIO())
    assert all(m.compiled is not None for m in members)  # each drafts in its static cache
    code, eager, err = run_cli(*base, "Hi")
    assert code == 0, err
    code, compiled, err = run_cli(*base, "--compile", "Hi")
    assert code == 0, err
    assert compiled == eager and eager.strip()  # fp32 greedy: the same answer
    code, _, err = run_cli("--models", models, "--compile", "--quantize", "gguf", "Hi")
    assert code == 2 and "--compile compiles transformers' own decoding" in err


def test_processes_refuse_a_model_listed_twice(tiny_checkpoints):
    path = tiny_checkpoints[0]
    code, _, err = run_cli("--models", f"{path},{path}", "--temperature", "0.8", "--processes", "Hi")
    assert code == 2 and "with --processes, list each model once" in err


def test_the_same_model_twice_shares_its_weights_when_sampling(tiny_checkpoints, tmp_path):
    path, trace = tiny_checkpoints[0], tmp_path / "twice.json"
    code, out, err = run_cli(
        "--models",
        f"{path},{path}",
        "--temperature",
        "0.8",
        "--max-new-tokens",
        "12",
        "--trace",
        str(trace),
        "Hi",
    )
    assert code == 0, err
    first = load_trace(trace).rounds[0]
    assert first.members == (path, f"{path}#2")
    assert first.candidates[0].text != first.candidates[1].text  # seeds seed and seed + 1 differ
    args = build_parser().parse_args(["--models", f"{path},{path}", "--quiet", "Hi"])
    members = _load([path, path], args, io.StringIO())
    assert members[1].model is members[0].model  # loaded once


def test_one_member_runs_with_a_note_that_it_is_plain_decoding(tiny_checkpoints):
    code, out, err = run_cli("--models", tiny_checkpoints[0], "--max-new-tokens", "8", "Hi")
    assert code == 0 and out.strip()
    assert "one member" in err and "plain decoding" in err
    code, _, err = run_cli("--models", tiny_checkpoints[0], "--max-new-tokens", "8", "--quiet", "Hi")
    assert code == 0 and err == ""


@pytest.mark.parametrize("where", ["missing-folder/run.json", "a-folder"])
def test_an_unwritable_trace_path_exits_2_before_loading(tmp_path, monkeypatch, where):
    """The answer used to be computed first and then lost to a FileNotFoundError traceback."""
    (tmp_path / "a-folder").mkdir()
    monkeypatch.setattr("specfuse.cli._load", lambda *a: pytest.fail("loaded models for a doomed run"))
    code, out, err = run_cli("--models", "a,b", "--trace", str(tmp_path / where), "hi")
    assert code == 2 and out == ""
    assert err.startswith("specfuse: error: --trace") and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["", "\n0"], ["--segment-len", "x\ny"], ["--\u2028"]])
def test_a_rejected_argument_is_quoted_on_the_reason_line_whatever_it_holds(argv, capsys):
    """Hypothesis found it: argparse quoted an argument's line break as is, spreading its reason over
    two lines, the second without "specfuse: error:"."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*argv, "Hi"])
    reason = capsys.readouterr().err.strip().split("\n")[-1]
    assert e.value.code == 2 and reason.startswith("specfuse: error: ") and reason.isprintable()


def test_invalid_utf8_on_stdin_exits_2_before_loading(monkeypatch):
    """`specfuse -` with Latin-1 bytes once died with a TypeError after every model had loaded."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("café\n".encode("latin-1"))))
    monkeypatch.setattr("specfuse.cli._load", lambda *a: pytest.fail("loaded models for a doomed run"))
    code, _, err = run_cli("--models", "a,b", "-")
    assert code == 2 and "standard input is not valid UTF-8 (byte 3" in err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("café ✓".encode())))
    from specfuse.cli import read_prompt

    assert read_prompt("-") == "café ✓"
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        read_prompt("caf\udce9")  # undecodable argv bytes, as Python hands them over


def test_a_loading_error_starts_on_its_own_line_after_the_progress_bar(tiny_checkpoints, tmp_path, capsys):
    """The bar was left open, so the error was printed at the end of its line."""
    (tmp_path / "empty").mkdir()  # a folder passes the name check; it fails while loading
    code = main(["--models", f"{tiny_checkpoints[0]},{tmp_path}/empty", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and "%|" in err  # the bar was drawn
    lines = err.split("\n")
    assert any(line.startswith("specfuse: error: ") for line in lines), err


@pytest.mark.parametrize("trace", ["", "~no-such-user-xyz/t.json", "/proc/t.json"])
def test_a_trace_path_that_cannot_be_written_is_refused_before_loading(trace, monkeypatch):
    """Issue 24, item 10: '~nosuchuser' was a traceback, /proc passed the check as root and failed
    after the whole answer, and an empty path ran and silently wrote nothing."""
    monkeypatch.setattr("specfuse.cli._load", lambda *a: pytest.fail("loaded models for a doomed run"))
    code, out, err = run_cli("--models", "smollm2-135m,gemma3-270m", "--trace", trace, "hi")
    assert code == 2 and out == ""
    assert err.startswith("specfuse: error: --trace") and err.count("\n") == 1, err


def test_the_trace_check_leaves_no_file_behind_and_an_existing_one_unchanged(tmp_path):
    from specfuse.cli import check_writable

    check_writable(str(tmp_path / "new.json"))
    assert not (tmp_path / "new.json").exists()
    (tmp_path / "old.json").write_text("keep")
    check_writable(str(tmp_path / "old.json"))
    assert (tmp_path / "old.json").read_text() == "keep"


def test_an_unknown_model_is_refused_before_the_note_and_the_bar(monkeypatch):
    """`--models nonexistent` printed the one-member note and a loading bar before its error, and
    the known-models list named a catalogue model that is not installed."""
    code, out, err = run_cli("--models", "nonexistent", "hi")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("specfuse: error: Unknown model 'nonexistent'; installed: smollm2-135m")
    assert "not installed here: qwen2.5-coder-1.5b" in err and "%|" not in err


def test_a_warning_logged_while_loading_prints_above_the_bar_not_on_its_line(tiny_checkpoints, monkeypatch):
    from specfuse.models import placement

    load_members = placement.load_members

    def warn_then_load(names, **options):
        options["progress"](0.5, "half way")
        logging.getLogger("specfuse.models.cache").warning("rebuilding a damaged file")
        return load_members(names, **options)

    monkeypatch.setattr(placement, "load_members", warn_then_load)
    code, _, err = run_cli("--models", ",".join(tiny_checkpoints), "--max-new-tokens", "4", "hi")
    assert code == 0
    line = next(line for line in err.split("\n") if "rebuilding a damaged file" in line)
    # What follows the bar's last carriage return is the log line itself, from its first character.
    assert line.rsplit("\r", 1)[-1].startswith("WARNING"), repr(line)


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


def test_help_documents_every_setting():
    """argparse prints every flag it has; what can go missing is a setting without a flag."""
    text = " ".join(build_parser().format_help().split())
    dests = {a.dest for a in build_parser()._actions}
    for field in dataclasses.fields(EnsembleConfig):
        assert field.name in dests and " ".join(field.metadata["help"].split()) in text, field.name


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


def test_verify_cache_hashes_every_cached_model_and_exits_1_on_damage(tmp_path):
    """--verify-cache: what a load cannot see (bytes changed with their timestamps kept) is found by
    hashing everything on request; models never cached are listed as absent, not as damage."""
    code, out, _ = run_cli("--verify-cache", "--cache-dir", str(tmp_path))
    assert code == 0 and out.count("absent") == out.count("\n") >= 3
    (tmp_path / "smollm2-135m").mkdir()
    (tmp_path / "smollm2-135m" / "specfuse-cache.json").write_text("{not json")
    code, out, _ = run_cli("--verify-cache", "--cache-dir", str(tmp_path))
    assert code == 1
    assert any(line.startswith("smollm2-135m") and "not JSON" in line for line in out.splitlines()), out
