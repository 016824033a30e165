"""bench/ceiling.py: a serving level's weight-read ceiling, measured ÷ ceiling, GFLOP/s, how each
member drafted, and two runs side by side (tools/gpu_serve_check.sh prints them)."""

from __future__ import annotations

import pytest

from specfuse.bench import ceiling
from specfuse.config import MemberSettings
from specfuse.models.preparation import warm_up

from ..conftest import tiny_member


def report(tok_s_1: float, tok_s_8: float, answers: list[str]) -> dict:
    level = {"first_segment_median_s": 0.5, "first_segment_p95_s": 0.75, "prompts": ["a", "b"]}
    return {
        "config": {"segment_len": 10},
        "batch_size": 4,  # 8 clients: 4 runs a round
        "parameters": {"x": 1e9, "y": 2e9},
        "weight_bytes": {"x": 2e9, "y": 4e9},
        "bandwidth_bytes_per_s": 4.4e12,
        "levels": {
            "1": {**level, "clients": 1, "tokens_per_s": tok_s_1, "answers": answers},
            "8": {**level, "clients": 8, "tokens_per_s": tok_s_8, "answers": ["A", "B"]},
        },
    }


def test_the_ceiling_is_the_weights_read_per_round_at_the_bandwidth():
    got = ceiling.ceilings(report(100.0, 400.0, ["A", "B"]))
    # A round reads 6 GB 11 times (10 drafting steps, one verification) for 10 tokens a run.
    one = 10 * 4.4e12 / (6e9 * 11)
    assert got["1"]["ceiling_tokens_per_s"] == pytest.approx(one)
    assert got["8"]["ceiling_tokens_per_s"] == pytest.approx(4 * one)  # the batch size bounds the rows
    assert got["1"]["of_ceiling"] == pytest.approx(100.0 / one)
    # Per round and run: each member reads 10 drafted and 2 × 11 verified tokens, 2 FLOP a parameter.
    assert got["8"]["gflop_per_s"] == pytest.approx(400.0 * 2 * 3e9 * (10 + 22) / 10 / 1e9)


def test_the_printed_block_and_two_runs_side_by_side():
    eager, graphs = report(100.0, 400.0, ["A", "B"]), report(250.0, 900.0, ["A", "C"])
    text = "\n".join(ceiling.lines(eager))
    assert "6.00 GB of weights read per pass at 4400 GB/s" in text
    assert "      1   100.00     666.7     15.0%" in text
    table = ceiling.side_by_side({"eager": eager, "graphs": graphs})
    rows = table.splitlines()
    assert rows[1].split()[:2] == ["clients", "eager"]
    assert rows[2].split() == ["1", "100.00", "0.50/0.75", "15.0%", "250.00", "0.50/0.75", "37.5%", "1/2"]
    assert rows[3].split()[-1] == "2/2"
    assert ceiling.lines({"levels": {}}) == []  # a report from before the ceiling: nothing


def test_each_member_says_how_it_drafted():
    eager, slotted = tiny_member("llama-bytes"), tiny_member("qwen-merges", decode="graphs")
    paths = ceiling.decode_paths([eager, slotted])
    assert paths["llama-bytes"] == {"path": "eager"}
    assert paths["qwen-merges"]["path"] == "slots" and paths["qwen-merges"]["captures"] == 0
    warm_up(slotted)  # a draft and a verification, both on the slots (its prompt read before them)
    slotted.start("Another prompt", MemberSettings())  # read on the slots, which exist now
    said = ceiling._path(ceiling.decode_paths([slotted])["qwen-merges"])
    assert (
        said
        == "slots (1 drafts, 3 steps, 0 replays, 1 verify passes, 0 replayed, 1 prompt reads, 0 replayed)"
    )
    # Captured steps (a GPU) say which options an A/B run turned off (bench serve --slots-off).
    graphs = {**ceiling.decode_paths([slotted])["qwen-merges"], "path": "graphs"}
    said = ceiling._path(graphs)  # ahead, batched, fuse and merge are a GPU's only
    assert said.endswith("0 captures in 0.0 s; ahead, batched, fuse and merge off)")
    assert ceiling._path({**graphs, "options": {"ahead": False, "fold": True}}).endswith("; ahead off)")
    assert ceiling._path({**graphs, "options": {option: True for option in ceiling.SLOT_OPTIONS}}).endswith(
        "s)"
    )
    # Nothing captured, nothing timed: no replay line (on a GPU measure() times each captured step).
    assert ceiling.decode_paths([slotted])["qwen-merges"]["replay_ms"] == []
    assert ceiling.replay_lines({**report(1.0, 1.0, []), "decode": ceiling.decode_paths([slotted])}) == []


def test_each_captured_steps_replay_beside_its_floor():
    """The replays timed by measure(), drafts by rows and verification at a round's bucket of nodes
    and at its largest."""
    replays = [
        {"kind": "draft", "rows": 1, "tokens": 1, "ms": 0.9},
        {"kind": "draft", "rows": 32, "tokens": 1, "ms": 1.25},
        {"kind": "verify", "rows": 1, "tokens": 16, "ms": 0.8},
        {"kind": "verify", "rows": 1, "tokens": 64, "ms": 1.0},
        {"kind": "verify", "rows": 32, "tokens": 64, "ms": 4.0},
    ]
    counts = {"drafts": 1, "steps": 1, "replays": 1, "captures": 5, "capture_s": 0.5}
    decode = {"x": {"path": "graphs", **counts, "replay_ms": replays}, "y": {"path": "eager"}}
    (line,) = ceiling.replay_lines({**report(1.0, 1.0, []), "decode": decode})
    # x's floor: 2 GB at 4.4 TB/s.
    drafts, verify = "draft by rows 1: 0.9, 32: 1.2", "verify (64 nodes a row) 1: 1.0, 32: 4.0"
    assert line == f"replay ms, x (floor 0.5): {drafts}; {verify}"
    assert line in ceiling.lines({**report(1.0, 1.0, []), "decode": decode})
    # With a round's bucket (32 nodes) and a prompt's (256) captured too: both, in that order.
    more = [*replays, *({"kind": "verify", "rows": 1, "tokens": n, "ms": n / 100} for n in (32, 256))]
    (line,) = ceiling.replay_lines(
        {**report(1.0, 1.0, []), "decode": {"x": {**decode["x"], "replay_ms": more}}}
    )
    assert line.endswith("; verify (32 nodes a row) 1: 0.3; verify (256 nodes a row) 1: 2.6")


def test_the_command_line_refuses_what_it_cannot_read(capsys):
    assert ceiling.main(["nothing-to-label"]) == 2
    assert "usage: python -m specfuse.bench.ceiling" in capsys.readouterr().err
