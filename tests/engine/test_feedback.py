"""The method's arithmetic on floats: normalization, aggregation, rewards, weights, exit."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specfuse import feedback
from specfuse.errors import ConfigError

rows = st.lists(st.floats(-50, 50, allow_nan=False), min_size=2, max_size=6)


def test_paper_sum_normalization_reproduces_the_authors_example():
    """The authors' rebuttal: a: [2.3, 2.6, 3.2] → [0.284, 0.321, 0.395]."""
    assert feedback.normalize_row([2.3, 2.6, 3.2], "sum") == pytest.approx([0.284, 0.321, 0.395], abs=1e-3)
    assert feedback.normalize_row([0.6, 0.3, 0.5], "sum") == pytest.approx([0.429, 0.214, 0.357], abs=1e-3)


def test_paper_sum_normalization_refuses_negative_rows():
    with pytest.raises(ConfigError, match="positive scores"):
        feedback.normalize_row([-1.0, 2.0, 0.5], "sum")


@given(rows, st.floats(0.01, 100), st.floats(-100, 100))
@pytest.mark.parametrize("method", ["zsoftmax", "minmax"])
def test_default_normalizations_ignore_a_verifiers_scale_and_offset(method, z, scale, offset):
    base = feedback.normalize_row(z, method)
    moved = feedback.normalize_row([scale * v + offset for v in z], method)
    assert sum(base) == pytest.approx(1.0)
    assert all(v >= 0 for v in base)
    # a flat row may stop being "flat" after float rounding of huge offsets: compare when not flat
    if max(z) - min(z) > 1e-6:
        assert moved == pytest.approx(base, abs=1e-6)


@given(rows)
def test_zsoftmax_keeps_the_ranking_of_negative_scores(z):
    s = feedback.normalize_row(z)
    for a in range(len(z)):
        for b in range(len(z)):
            if z[a] > z[b] + 1e-9:
                assert s[a] >= s[b]


def test_a_flat_row_is_uniform():
    assert feedback.normalize_row([-3.0, -3.0, -3.0]) == pytest.approx([1 / 3] * 3)


def test_aggregate_weights_verifier_rows_and_can_leave_out_self_scores():
    s = [[0.9, 0.1], [0.2, 0.8]]
    verifiers = drafters = ["a", "b"]
    assert feedback.aggregate(s, [0.75, 0.25], verifiers, drafters) == pytest.approx([0.725, 0.275])
    # without self-scores each candidate is judged only by the other member
    assert feedback.aggregate(s, [0.75, 0.25], verifiers, drafters, self_scores=False) == pytest.approx(
        [0.2, 0.1]
    )


def test_choose_breaks_ties_toward_the_first_member_and_reports_the_margin():
    assert feedback.choose([0.3, 0.5, 0.5]) == (1, 0.0)
    assert feedback.choose([0.6, 0.1, 0.3]) == pytest.approx((0, 0.3))
    assert feedback.choose([0.9, 0.1, 0.3], eligible=[1, 2]) == pytest.approx((2, 0.2))


def test_rewards_count_wins_over_other_verifiers_and_are_floored():
    # b's candidate is preferred by both other verifiers; c's never.
    s = [[0.2, 0.5, 0.3], [0.3, 0.6, 0.1], [0.3, 0.6, 0.1]]
    r = feedback.rewards(s, ["a", "b", "c"], ["a", "b", "c"])
    assert r[1] == 1.0  # 4 of 4 comparisons won
    assert r[0] == pytest.approx(2 / 4)  # a beats c twice (verifiers b and c)
    assert r[2] == pytest.approx(1 / 4)  # floored: 0 wins counts as 1


def test_two_member_rewards_use_both_rows_so_they_carry_a_signal():
    s = [[0.7, 0.3], [0.6, 0.4]]  # both verifiers prefer a
    assert feedback.rewards(s, ["a", "b"], ["a", "b"]) == [1.0, 0.5]


def test_learning_rate_shrinks_with_members_and_rounds():
    assert (
        feedback.learning_rate(1.0, 3, 1)
        > feedback.learning_rate(1.0, 3, 4)
        > feedback.learning_rate(1.0, 6, 4)
    )
    assert feedback.learning_rate(1.0, 2, 4) == pytest.approx(0.25)


@given(st.lists(st.floats(0, 1), min_size=3, max_size=3), st.integers(1, 50))
def test_weights_stay_a_distribution_and_move_toward_the_winner(r, k):
    members = ["a", "b", "c"]
    w = feedback.update_weights([0.2, 0.3, 0.5], members, members, r, feedback.learning_rate(1.0, 3, k))
    assert sum(w) == pytest.approx(1.0)
    best, worst = max(range(3), key=r.__getitem__), min(range(3), key=r.__getitem__)
    if r[best] > r[worst] + 1e-9:
        assert w[best] / [0.2, 0.3, 0.5][best] > w[worst] / [0.2, 0.3, 0.5][worst]


def test_a_member_that_did_not_draft_keeps_its_weight():
    w = feedback.update_weights([0.2, 0.3, 0.5], ["a", "b", "c"], ["a", "b"], [1.0, 0.25], 0.5)
    assert w[2] == 0.5 and sum(w) == pytest.approx(1.0) and w[0] > 0.2


def test_no_exit_during_warmup_and_the_leader_never_exits():
    quality = {"a": 5.0, "b": 0.0, "c": 0.0}
    assert (
        feedback.exit_decisions(quality, ["a", "b", "c"], k=2, threshold=0.5, warmup=3, base_temperature=0.25)
        == []
    )
    gone = feedback.exit_decisions(
        quality, ["a", "b", "c"], k=5, threshold=0.5, warmup=3, base_temperature=0.25
    )
    assert {d.member for d in gone} == {"b", "c"}
    assert all(d.keep_probability < d.threshold for d in gone)


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=5), st.floats(0, 1), st.floats(0.01, 2))
def test_exit_never_empties_the_ensemble(qs, delta, tau):
    names = [f"m{i}" for i in range(len(qs))]
    gone = feedback.exit_decisions(
        dict(zip(names, qs)), names, k=10, threshold=delta, warmup=0, base_temperature=tau
    )
    assert len(gone) < len(names)
    leader = max(range(len(qs)), key=lambda i: (qs[i], -i))
    assert names[leader] not in {d.member for d in gone}


def test_exit_temperature_is_higher_while_qualities_are_flat():
    flat = feedback.exit_temperature([1.0, 1.0, 1.0], 0.25)
    spread = feedback.exit_temperature([3.0, 1.0, 0.0], 0.25)
    assert flat == pytest.approx(0.5) and 0.25 <= spread < flat
    assert math.isclose(feedback.exit_temperature([2.0], 0.25), 0.25)


def test_exit_keeps_at_least_min_active_members_and_the_weakest_leaves_first():
    quality = {"a": 5.0, "b": 1.0, "c": 0.0}
    gone = feedback.exit_decisions(quality, ["a", "b", "c"], 9, 0.5, 3, 0.25, min_active=2)
    assert [d.member for d in gone] == ["c"]
    assert feedback.exit_decisions({"a": 5.0, "c": 0.0}, ["a", "c"], 9, 0.5, 3, 0.25, min_active=2) == []


def test_contrastive_scores_are_relative_to_each_drafters_own_score():
    z = [[-1.0, -3.0, -2.0], [-2.0, -1.5, -4.0]]  # verifiers a, b; candidates of a, b and a typed one
    out = feedback.contrast(z, ["a", "b"], ["a", "b", "you"])
    assert out == [[0.0, -1.5, -2.0], [-1.0, 0.0, -4.0]]
    # b's candidate is easy for b (−1.5) but a finds it unlikely: contrast keeps a's verdict against it
    assert feedback.normalize(out)[0][1] < feedback.normalize(out)[0][0]


def test_trust_weights_give_a_member_without_evidence_the_mean_of_the_others():
    assert feedback.trust_weights([0.6, None, 0.2]) == pytest.approx([0.6 / 1.2, 0.4 / 1.2, 0.2 / 1.2])
    assert feedback.trust_weights([None, None]) == [0.5, 0.5]
    assert feedback.trust_weights([0.0, 0.0]) == [0.5, 0.5]
