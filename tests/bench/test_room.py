"""`python -m specfuse.bench room`, tiny: the app served in a process of its own, three phones join
through the real /join page over HTTP, vote (some change their vote) on two rounds of a recorded
lesson; the report has its shape, and every vote a phone had accepted is the server's count (a timing
script, checked for shape and counts, never for speed). The queue is 1 event long: a class's burst
of joins, streams and votes must still never read "Queue is full"."""

from __future__ import annotations

import json

import pytest

from specfuse.bench.__main__ import SUBCOMMANDS
from specfuse.bench.room import main, page_of, ratio, report


def test_three_phones_join_vote_and_every_vote_is_counted(tmp_path, capsys):
    out = tmp_path / "room.json"
    args = ["--students", "3", "2", "--rounds", "2", "--within", "0.2", "--queue-size", "1"]
    args += ["--settle", "0.5"]
    code = main([*args, "--json", str(out)])
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert code == 0, printed
    assert [r["students"] for r in rows] == [3, 2]
    for r in rows:
        assert r["joined"] == r["students"] and r["refused"] == 0 and r["refusals"] == []
        assert r["votes_lost"] == 0 and r["updates_missed"] == 0
        # every phone votes each round; its last accepted vote is the one the spread counts
        assert r["votes_kept"] == r["votes_counted"] == 2 * r["students"]
        assert r["vote_to_tally_s"]["n"] >= r["votes_kept"]
        assert r["beat_to_update_s"]["n"] == 2 * 2 * r["students"]  # drafts and reveal, per phone
        assert r["join_s"]["n"] == r["students"] and r["join_s"]["median"] > 0
        assert set(r["rss_mb"]) == {"before", "joined", "after", "settled"} and r["rss_mb"]["before"] > 0
        assert r["settle_s"] == 0.5
        assert r["cpu_s"] > 0
    lines = printed.splitlines()
    assert lines[0].startswith("The room votes") and "noise" in lines[0]
    assert lines[1].startswith("students | joined | join ms")
    assert lines[2].startswith("3 | 3 | ") and " | 6/6 | 0 | 0 | 0 | " in lines[2]
    assert lines[3].startswith("2 | 2 | ") and " | 4/4 | 0 | 0 | 0 | " in lines[3]
    assert lines[4].startswith("memory 0 s after the session of 3 ended: ")
    assert "(target ≤ 50 MB: " in lines[4]
    assert lines[5].startswith("memory 0 s after the session of 2 ended: ")
    assert lines[6].startswith("ratio 2/3 students (×0.7): beat→update p95 ×")
    assert SUBCOMMANDS["room"] == "specfuse.bench.room"


def test_the_report_names_each_refusal_and_survives_empty_figures():
    nan = {"n": 0, "median": float("nan"), "p95": float("nan")}
    row = {
        "students": 2,
        "joined": 1,
        "join_s": nan,
        "beat_to_update_s": nan,
        "vote_to_tally_s": nan,
        "votes_kept": 0,
        "votes_counted": 0,
        "votes_lost": 0,
        "updates_missed": 0,
        "refusals": ["This class session is full (200 students)."],
        "refused": 1,
        "rss_mb": {"before": 1.0, "joined": 2.0, "after": 1.0, "settled": 1.0},
        "settle_s": 60.0,
        "cpu_s": 0.0,
    }
    text = report([row, {**row, "students": 4}])
    assert "refusal at 2: This class session is full (200 students)." in text
    assert "ratio 4/2 students (×2.0): beat→update p95 ×nan, server CPU ×nan" in text
    assert "memory 60 s after the session of 2 ended: +0 MB against before (target ≤ 50 MB: met)" in text
    assert ratio(1.0, 0.0) != ratio(1.0, 0.0)  # nan, not a ZeroDivisionError


def test_the_page_events_are_found_by_their_components():
    config = {
        "components": [
            {"id": 1, "props": {"elem_id": "room-join"}},
            {"id": 2, "props": {"elem_id": "room-pick"}},
        ],
        "dependencies": [
            {"id": 7, "targets": [[1, "click"]]},
            {"id": 8, "targets": [], "trigger_after": 7},
            {"id": 9, "targets": [[2, "input"]]},
        ],
    }
    page = page_of(config)
    assert (page.join, page.follow, page.vote) == (7, 8, 9)


def test_the_command_refuses_bad_numbers_before_serving():
    for bad in (["--students", "0"], ["--rounds", "0"], ["--within", "-1"]):
        with pytest.raises(SystemExit) as exit:
            main(bad)
        assert exit.value.code == 2
