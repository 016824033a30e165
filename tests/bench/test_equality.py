"""`python -m specfuse.bench equality`: where two runs of one prompt part, on real runs of tiny members
(fp32 greedy: batched equals solo exactly) and on those runs' rounds changed one thing at a time."""

from __future__ import annotations

from dataclasses import replace

from specfuse import EnsembleConfig
from specfuse.bench.equality import first_difference, format_report, run, score_drift


def test_batched_fp32_runs_equal_solo_ones_and_the_report_says_so(tiny_members):
    prompts = ["Hello there", "Two plus two", "A short poem", "Why is the sky blue"]
    report = run(tiny_members, prompts, EnsembleConfig(segment_len=4, max_new_tokens=12, exit=False), batch=3)
    assert report["equal"] == 4 and all(r["first_difference"] is None for r in report["rows"])
    # The same choices everywhere; a score may move in fp32's last bits with the batch's padding.
    assert all(r["score_drift"] < 1e-4 for r in report["rows"])
    text = format_report(report)
    assert "answers equal: 4/4" in text and "runs that part" not in text


def test_where_two_runs_part_a_draft_a_choice_an_exit_or_their_length(tiny_members):
    from specfuse.engine import Ensemble

    config = EnsembleConfig(segment_len=4, max_new_tokens=24, exit=False, verify="always")
    ensemble = Ensemble(tiny_members, config)
    runs = (
        list(ensemble.stream(p)) for p in ("Tell me about rivers", "Hello there", "A b c", "Why", "Count")
    )
    rounds = next(r for r in runs if len(r) >= 3 and len(r[1].candidates) >= 2)
    assert first_difference(rounds, rounds) is None and score_drift(rounds, rounds) == 0.0
    second = rounds[1]
    other = replace(second.candidates[1], text=second.candidates[1].text + " else")
    drafted = [rounds[0], replace(second, candidates=(second.candidates[0], other, *second.candidates[2:]))]
    assert first_difference(rounds, drafted) == {"round": 2, "where": "draft", "members": [other.member]}
    chosen = [rounds[0], replace(second, chosen=1 - second.chosen if second.chosen < 2 else 0)]
    assert first_difference(rounds, chosen) == {"round": 2, "where": "choice", "margin": second.margin}
    exited = [rounds[0], replace(second, active=second.active[:1])]
    assert first_difference(rounds, exited)["where"] == "exits"
    assert first_difference(rounds, rounds[:2]) == {"round": 3, "where": "length"}
    # A moved score counts over the shared rounds: up to and including the first that parts.
    row = tuple(z + 0.25 for z in second.raw_scores[0])
    moved = [rounds[0], replace(second, raw_scores=(row, *second.raw_scores[1:]))]
    assert score_drift(rounds, moved) == 0.25
