"""The part sizer of chunked prefill (engine/parts.py): times in, token counts out, no model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specfuse.engine.parts import FIRST_PART, GROWTH, LEAST, PART_OF_A_ROUND, UNNOTICED_S, PartSizer


def test_before_any_timing_a_part_is_small_and_with_nobody_streaming_it_is_the_most():
    sizer = PartSizer(256)
    assert sizer.size(streaming=True) == FIRST_PART
    assert sizer.size(streaming=False) == 256
    assert PartSizer(7).size(streaming=True) == 7  # never over the operator's cap


def test_a_part_that_took_three_rounds_is_cut_to_fit_and_a_quick_one_grows_at_most_twofold():
    sizer = PartSizer(1024)
    sizer.round_took(2.0)
    sizer.part_took(96, 6.0)  # 16 tokens a second, late in a long prompt on two cores
    assert sizer.size(streaming=True) == int(96 * PART_OF_A_ROUND * 2.0 / 6.0) == 16
    sizer.part_took(24, 0.1)  # much quicker than a round: grows, but no more than GROWTH times
    assert sizer.size(streaming=True) == int(24 * GROWTH)


def test_a_part_is_never_under_the_least_nor_over_the_cap():
    sizer = PartSizer(64)
    sizer.round_took(0.01)
    sizer.part_took(64, 100.0)
    assert sizer.size(streaming=True) == LEAST
    small = PartSizer(4)
    small.round_took(0.01)
    small.part_took(4, 100.0)
    assert small.size(streaming=True) == 4  # a cap under LEAST is the operator's to set


def test_with_rounds_of_milliseconds_a_part_may_take_a_quarter_second():
    sizer = PartSizer(256)
    sizer.round_took(0.02)  # tiny models (or a GPU): the first part is the cap, nothing to spare
    assert sizer.size(streaming=True) == 256
    sizer.part_took(256, 0.5)  # 512 tokens a second: cut to what a quarter second reads
    assert sizer.size(streaming=True) == 128
    sizer.part_took(128, 0.01)
    assert sizer.size(streaming=True) == 256  # grows back (by at most GROWTH) to the cap
    slow = PartSizer(256)
    slow.round_took(3.0)  # two cores and the trio: the first part stays small until one is timed
    assert slow.size(streaming=True) == FIRST_PART


def test_without_a_round_timed_or_with_no_time_the_size_stays():
    sizer = PartSizer(256)
    sizer.part_took(32, 5.0)  # nobody streamed yet: no round to fit into
    assert sizer.size(streaming=True) == FIRST_PART
    sizer.round_took(1.0)
    sizer.part_took(32, 0.0)
    assert sizer.size(streaming=True) == FIRST_PART


@given(
    most=st.integers(1, 8192),
    rounds=st.lists(st.floats(1e-4, 100), min_size=1, max_size=20),
    rates=st.lists(st.floats(1.0, 1e6), min_size=1, max_size=20),
)
def test_at_a_steady_rate_a_part_takes_at_most_its_share_of_a_round(most, rounds, rates):
    """Whatever came before, once the rate holds for two parts the next fits its share of the round,
    or a quarter second (unless LEAST or the cap says otherwise): the property the streams' gap rests on."""
    sizer = PartSizer(most)
    for round_s, rate in zip(rounds, rates):
        sizer.round_took(round_s)
        tokens = sizer.size(streaming=True)
        sizer.part_took(tokens, tokens / rate)
    round_s, rate = list(zip(rounds, rates))[-1]  # the last round timed, the last rate
    for _ in range(2):
        tokens = sizer.size(streaming=True)
        sizer.part_took(tokens, tokens / rate)
    tokens = sizer.size(streaming=True)
    assert 1 <= tokens <= most
    if tokens > min(LEAST, most):
        assert tokens / rate <= max(PART_OF_A_ROUND * round_s, UNNOTICED_S) * (1 + 1e-9)
