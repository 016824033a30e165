"""The app's numbers: per-member summary, candidates, exits, weights history, status; no model needed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specfuse import ExitEvent, MemberTiming, Round, load_trace
from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.report import (
    CANDIDATE_COLUMNS,
    CHOSEN_MARK,
    SUMMARY_COLUMNS,
    candidates_table,
    exit_points,
    exit_table,
    member_summary,
    score_matrix,
    status,
    weights_history,
)

from .. import builders
from ..scripted import ScriptedMember

EXAMPLE_TRACE = Path(__file__).resolve().parents[2] / "assets" / "example-trace.json"


def hand_round(k: int, chosen: int, *, exits: tuple[ExitEvent, ...] = (), tokens=(2, 3)) -> Round:
    """Two members a, b; b verifies a's candidate 0.2 and its own 0.8; a gives 0.6 / 0.4."""
    return builders.hand_round(
        k,
        num_tokens=tokens,
        chosen=chosen,
        raw_scores=((6.0, 4.0), (2.0, 8.0)),
        scores=((0.6, 0.4), (0.2, 0.8)),
        aggregate=(0.4, 0.6),
        margin=0.2,
        weights_before=(0.5, 0.5),
        weights_after=(0.4, 0.6),
        rewards=(0.0, 1.0),
        exits=exits,
        timings=(MemberTiming("a", 0.1, 0.1, 0.0), MemberTiming("b", 0.1, 0.1, 0.0)),
        seconds=0.5,
    )


def test_member_summary_counts_wins_tokens_and_scores_given_and_received():
    rounds = [hand_round(1, 1), hand_round(2, 1), hand_round(3, 0)]
    table = member_summary(rounds).set_index("member")
    assert list(member_summary(rounds).columns) == SUMMARY_COLUMNS
    assert table.loc["b", "segments won"] == 2 and table.loc["a", "segments won"] == 1
    assert table.loc["b", "share of segments"] == pytest.approx(2 / 3)
    assert table.loc["b", "tokens"] == 6 and table.loc["a", "tokens"] == 2
    assert table.loc["b", "share of tokens"] == pytest.approx(6 / 8)
    # a gives b 0.4, b gives a 0.2; their own candidates get 0.6 and 0.8.
    assert table.loc["a", "mean score given"] == pytest.approx(0.4)
    assert table.loc["a", "mean score received"] == pytest.approx(0.2)
    assert table.loc["b", "mean self score"] == pytest.approx(0.8)
    assert table.loc["b", "final weight"] == pytest.approx(0.6)


def test_a_member_that_never_verified_has_no_score_given():
    rnd = hand_round(1, 0)
    rnd = Round(**{**rnd.__dict__, "verifiers": ("a",), "raw_scores": ((6.0, 4.0),), "scores": ((0.6, 0.4),)})
    table = member_summary([rnd]).set_index("member")
    assert math.isnan(table.loc["b", "mean score given"])
    assert table.loc["b", "mean score received"] == pytest.approx(0.4)


def test_candidates_table_marks_exactly_the_chosen_candidate():
    table = candidates_table(hand_round(1, 1))
    assert list(table.columns) == CANDIDATE_COLUMNS
    assert list(table["chosen"]) == ["", CHOSEN_MARK]
    assert list(table["score"]) == [0.4, 0.6] and list(table["text"]) == ["a1 ", "b1 "]
    assert list(table["eligible"]) == [True, True]  # () in a hand-built record means all


def test_candidates_table_shows_which_candidates_could_not_win():
    rnd = Round(**{**hand_round(1, 1).__dict__, "eligible": (False, True)})
    assert list(candidates_table(rnd)["eligible"]) == [False, True]


def test_score_matrix_is_verifier_by_candidate_raw_or_normalized():
    rnd = hand_round(1, 1)
    assert score_matrix(rnd).loc["b", "a"] == 0.2
    assert score_matrix(rnd, normalized=False).loc["b", "b"] == 8.0


def test_weights_history_starts_at_round_zero_and_exits_sit_on_their_line():
    leave = ExitEvent("a", 2, 0.1, 0.25, "kept losing")
    rounds = [hand_round(1, 1), hand_round(2, 1, exits=(leave,))]
    history = weights_history(rounds)
    assert list(history["round"]) == [0, 0, 1, 1, 2, 2]
    assert history[history["round"] == 0]["weight"].tolist() == [0.5, 0.5]
    points = exit_points(rounds)
    assert points.to_dict("records") == [{"round": 2, "member": "a", "weight": 0.4}]
    assert exit_table(rounds).to_dict("records")[0]["reason"] == "kept losing"


def test_status_reports_tokens_per_second_and_first_segment_latency():
    s = status([hand_round(1, 1), hand_round(2, 0)])
    assert (s.round, s.tokens) == (2, 5)
    assert s.tokens_per_s == pytest.approx(5 / 1.0) and s.first_segment_latency_s == pytest.approx(0.5)
    assert s.stop_reason is None and status([]).round == 0


def test_calls_saved_by_exit_reach_the_status_line():
    judge = lambda text: {"good ": 3.0, "fine ": 2.0}.get(text, 0.0)  # noqa: E731
    members = [ScriptedMember(n, [t] * 20, judge) for n, t in zip("abc", ["fine ", "good ", "junk "])]
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=10, exit_warmup=2)).stream("go"))
    s = status(rounds)
    assert len(exit_table(rounds)) >= 1 and s.calls_saved > 0
    assert s.calls_made + s.calls_saved == 10 * 2 * 3


# -- on a recorded trace -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded():
    return load_trace(EXAMPLE_TRACE)


def test_the_recorded_trace_summary_is_consistent(recorded):
    rounds = recorded.rounds
    table = member_summary(rounds)
    assert list(table["member"]) == list(recorded.members)
    assert table["segments won"].sum() == len(rounds)
    assert table["share of segments"].sum() == pytest.approx(1.0)
    assert table["share of tokens"].sum() == pytest.approx(1.0)
    assert table["tokens"].sum() == status(rounds).tokens
    assert table["final weight"].sum() == pytest.approx(1.0)


def test_every_recorded_round_has_one_chosen_candidate_and_a_full_matrix(recorded):
    for rnd in recorded.rounds:
        table = candidates_table(rnd)
        assert (table["chosen"] == CHOSEN_MARK).sum() == 1
        assert table.loc[rnd.chosen, "member"] == rnd.winner.member
        assert score_matrix(rnd).shape == (len(rnd.verifiers), len(rnd.candidates))
    history = weights_history(recorded.rounds)
    assert len(history) == (len(recorded.rounds) + 1) * len(recorded.members)
