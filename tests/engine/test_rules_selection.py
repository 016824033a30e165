"""The selection rules of issue 7: pure functions first, then each switch end to end on tiny models."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specfuse import feedback
from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError
from specfuse.segments import repeated_fraction

from ..scripted import ScriptedMember

# -- pure functions ---------------------------------------------------------------------------------


def test_repeated_fraction_is_zero_for_fresh_text_and_one_for_a_loop():
    sentence = "We need to find how many bolts are needed. "
    assert repeated_fraction(sentence, "The robe takes 2 bolts of blue fiber") == 0.0
    # The second copy still adds the two new 3-grams that straddle the boundary; the third adds none.
    assert repeated_fraction(sentence, sentence) == pytest.approx(8 / 10)  # 10 words, 10 new 3-grams
    assert repeated_fraction(sentence * 2, sentence) == 1.0
    assert repeated_fraction("", "short") == 0.0


def test_repeated_fraction_counts_repeats_inside_the_candidate_too():
    assert repeated_fraction("", "a b c a b c") == pytest.approx(1 / 4)


def test_median_aggregation_ignores_one_extreme_verifier():
    s = [[0.9, 0.05, 0.05], [0.2, 0.5, 0.3], [0.2, 0.45, 0.35]]  # verifier 0 loves candidate 0
    mean = feedback.aggregate(s, [1 / 3] * 3, "abc", "abc", method="mean")
    median = feedback.aggregate(s, [1 / 3] * 3, "abc", "abc", method="median")
    assert max(range(3), key=lambda j: mean[j]) == 0
    assert max(range(3), key=lambda j: median[j]) == 1


def test_filtered_aggregation_drops_votes_far_from_the_median():
    s = [[0.9, 0.05, 0.05], [0.2, 0.5, 0.3], [0.2, 0.45, 0.35]]
    y = feedback.aggregate(s, [1 / 3] * 3, "abc", "abc", method="filtered", outlier_gap=0.25)
    assert y[0] == pytest.approx(0.2)  # 0.9 dropped: |0.9 - 0.2| > 0.25
    assert y[1] == pytest.approx((0.5 + 0.45) / 2)  # 0.05 dropped too: 0.4 below the median 0.45
    assert y[2] == pytest.approx((0.05 + 0.3 + 0.35) / 3)  # all within 0.25 of 0.3: nothing dropped


def test_an_unknown_aggregation_is_refused():
    with pytest.raises(ConfigError, match="unknown aggregation"):
        feedback.aggregate([[1.0]], [1.0], "a", "a", method="mode")


@given(st.lists(st.floats(-10, 10), min_size=1, max_size=6), st.data())
def test_weighted_median_lies_within_the_values(values, data):
    weights = data.draw(st.lists(st.floats(0.01, 5), min_size=len(values), max_size=len(values)))
    m = feedback.weighted_median(values, weights)
    assert min(values) - 1e-9 <= m <= max(values) + 1e-9


def test_weighted_median_follows_the_heavy_vote():
    assert feedback.weighted_median([0.1, 0.9], [0.2, 0.8]) == 0.9
    assert feedback.weighted_median([0.1, 0.9], [1.0, 1.0]) == pytest.approx(0.5)


def test_prior_weights_favour_the_less_surprised_member_and_sum_to_one():
    w = feedback.prior_weights([1.2, 0.9, 1.5], temperature=0.1)
    assert sum(w) == pytest.approx(1.0)
    assert w[1] > w[0] > w[2]
    assert feedback.prior_weights([1.0, None], 0.1) == [0.5, 0.5]  # one cannot tell: uniform
    assert feedback.prior_weights([1.0, 1.0], 0.1) == pytest.approx([0.5, 0.5])


def test_weighted_rewards_let_trusted_judges_count_more():
    s = [[0.7, 0.3, 0.5], [0.2, 0.8, 0.6], [0.1, 0.9, 0.4]]  # verifiers a, b, c
    equal = feedback.rewards(s, "abc", "abc")
    trusted_a = feedback.rewards(s, "abc", "abc", judge_weights=[0.0, 0.9, 0.1])
    # c's candidate: b ranks it above a's (win) but below b's own... weights move the reward.
    assert equal != trusted_a
    assert all(0 < r <= 1 for r in trusted_a)


def test_penalize_repeats_lowers_only_repeating_candidates():
    assert feedback.penalize_repeats([0.5, 0.5], [0.0, 1.0], 0.3) == pytest.approx([0.5, 0.2])


@pytest.mark.parametrize(
    "bad",
    [
        {"aggregation": "mode"},
        {"outlier_gap": 2.0},
        {"repeat_penalty": -1.0},
        {"prior": "oracle"},
        {"prior_temperature": 0.0},
    ],
)
def test_new_settings_are_validated(bad):
    with pytest.raises(ConfigError):
        EnsembleConfig(**bad)


# -- end to end ---------------------------------------------------------------------------------------


def test_the_repeat_penalty_stops_a_scripted_loop():
    """Every verifier prefers the looping candidate; with the penalty the fresh one wins."""
    loop = "the answer is 5. "
    judge = lambda text: 2.0 if text == loop else 1.0  # noqa: E731
    members = [
        ScriptedMember("a", [loop] * 6, judge),
        ScriptedMember("b", [f"step {i}. " for i in range(6)], judge),
    ]
    base = EnsembleConfig(max_rounds=5, exit=False)
    plain = Ensemble(members).run("q", base).answer
    penalized = (
        Ensemble(members).run("q", EnsembleConfig(max_rounds=5, exit=False, repeat_penalty=2.0)).answer
    )
    assert plain.count(loop) == 5
    assert penalized.count(loop) == 1


@pytest.mark.parametrize(
    "switches",
    [
        {"aggregation": "median"},
        {"aggregation": "filtered", "outlier_gap": 0.1},
        {"repeat_penalty": 0.5},
        {"prior": "prompt", "prior_temperature": 0.05},
        {"weighted_rewards": True},
    ],
)
def test_each_rule_runs_end_to_end_on_tiny_models(tiny_members, switches):
    config = EnsembleConfig(segment_len=5, max_new_tokens=20, **switches)
    rounds = list(Ensemble(tiny_members, config).stream("Count to ten: one, two,"))
    assert rounds[-1].text == "".join(r.winner.text for r in rounds)
    assert all(sum(r.weights_after) == pytest.approx(1.0) for r in rounds)
    if switches.get("prior") == "prompt":
        assert rounds[0].weights_before != pytest.approx([1 / 3] * 3)  # the prior moved them


def test_the_prompt_prior_measures_surprise_in_nats_per_byte(tiny_members):
    from specfuse.config import MemberSettings

    member = tiny_members[0]
    state = member.start("Count to ten: one, two, three", MemberSettings(measure_prompt=True))
    surprise = member.prompt_surprise(state)
    # A random-weight model over 256+ byte tokens: about ln(V) nats for each one-byte token.
    assert surprise is not None and 0.5 * math.log(260) < surprise < 2 * math.log(300)
    assert member.prompt_surprise(member.start("Count", MemberSettings())) is None


def test_initial_weights_set_the_first_round_and_must_fit_the_members(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=8, initial_weights=(1, 1, 2))
    first = next(Ensemble(tiny_members, config).stream("Hi"))
    assert first.weights_before == pytest.approx((0.25, 0.25, 0.5))
    with pytest.raises(ConfigError, match="2 values for 3 members"):
        next(Ensemble(tiny_members, EnsembleConfig(initial_weights=(1, 1))).stream("Hi"))
    with pytest.raises(ConfigError, match="non-negative"):
        EnsembleConfig(initial_weights=(1, -1))
    assert EnsembleConfig.from_dict(config.to_dict()) == config
