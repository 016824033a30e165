"""`python -m specfuse.bench prefill-gap` on tiny models: a long prompt joins a running stream with its
prompt read whole and in chunks, in one run, and the report carries the gaps the docs quote (a timing
script, checked for shape and for the order of events, never for speed)."""

from __future__ import annotations

import pytest

from specfuse.bench.__main__ import SUBCOMMANDS
from specfuse.bench.prefill_gap import format_table, long_prompt, main, run_gap

from ..runs import PROMPTS


def test_the_benchmark_reports_the_running_streams_gaps_read_whole_and_in_chunks(tiny_members):
    report = run_gap(
        tiny_members, chunks=(0, 16), prompt_tokens=250, segment_len=4, stream_tokens=200, stream=PROMPTS[2]
    )
    assert list(report["settings"]) == ["0", "16"] and 150 < report["prompt_tokens"] <= 250
    whole, chunked = report["settings"]["0"], report["settings"]["16"]
    for setting in (whole, chunked):
        assert setting["complete"] == setting["runs"] == 1  # the newcomer played before the stream ended
        assert setting["longest_gap_s"] > 0 and setting["usual_gap_s"] > 0 and setting["ratio"] > 0
        assert 0 < setting["read_gap_s"] <= setting["longest_gap_s"]  # the longest is one or the other
        assert 0 < setting["join_gap_s"] <= setting["longest_gap_s"] and setting["short_join_gap_s"] > 0
        assert setting["join_ratio"] == pytest.approx(setting["join_gap_s"] / setting["short_join_gap_s"])
        assert setting["newcomer_first_round_s"] > 0
    # Read 16 tokens a round, the 150-250-token prompt took the stream's rounds meanwhile; read whole,
    # the newcomer played within a round or two of the stream's.
    assert chunked["rounds_while_read"] >= 8 > whole["rounds_while_read"]
    table = format_table(report)
    assert "0 (whole)" in table and "16 tokens" in table and "both ≤ 2×" in table
    assert SUBCOMMANDS["prefill-gap"] == "specfuse.bench.prefill_gap"


def test_the_long_prompt_takes_about_the_tokens_asked(tiny_members):
    member = tiny_members[1]
    for tokens in (400, 1500):  # a paragraph is some 185 tokens here
        assert 0.6 * tokens <= len(member.prompt_ids(long_prompt(member, tokens))) <= tokens


def test_the_command_refuses_bad_numbers_before_loading(capsys):
    for bad in (["--prefill-chunk", "0"], ["--repeats", "0"], ["--prompt-tokens", "-5"]):
        with pytest.raises(SystemExit) as exit:
            main(bad)
        assert exit.value.code == 2
        assert "must be ≥ 1 (0, whole, always runs)" in capsys.readouterr().err
