"""The memory-bandwidth floor: bytes a decoding step reads, and this machine's read bandwidth."""

from __future__ import annotations

import math

import pytest

from specfuse.bench.floor import cost_line, floor_lines, member_floors, read_bandwidth, weight_bytes


def test_a_decoding_step_reads_every_weight_once_but_only_a_row_of_an_untied_input_embedding(tiny_members):
    for member in tiny_members:
        model = member.model
        everything = sum(p.numel() * p.element_size() for p in model.parameters())
        embedding = model.get_input_embeddings().weight
        tied = model.get_output_embeddings().weight.data_ptr() == embedding.data_ptr()
        expected = everything if tied else everything - embedding.numel() * embedding.element_size()
        assert weight_bytes(model) == expected, member.name


def test_read_bandwidth_is_a_plausible_figure_and_floors_follow_from_it(tiny_members):
    bandwidth = read_bandwidth("cpu", megabytes=64, repeats=2)
    assert math.isfinite(bandwidth) and 1e8 < bandwidth < 1e13  # 0.1 GB/s … 10 TB/s
    floors = member_floors(tiny_members, {"cpu": bandwidth})
    for m in tiny_members:
        assert floors[m.name]["floor_s_per_token"] == weight_bytes(m.model) / bandwidth


def single(nbytes: float, seconds: float, bandwidth: float) -> dict[str, float]:
    return {"weight_bytes": nbytes, "s_per_token": seconds, "floor_s_per_token": nbytes / bandwidth}


def test_the_cost_line_recovers_a_steps_fixed_cost_and_its_marginal_read_rate():
    # Steps that cost 3 ms plus their bytes at 40 GB/s, on a machine that reads 80 GB/s.
    bandwidth = {"cpu": 80e9}
    singles = {f"m{n}": single(n * 1e8, 0.003 + n * 1e8 / 40e9, 80e9) for n in (1, 2.5, 5)}
    line = cost_line(singles)
    assert line is not None and line["members"] == 3
    assert line["fixed_s_per_token"] == pytest.approx(0.003)
    assert line["marginal_bytes_per_s"] == pytest.approx(40e9)
    assert line["closest_floor_ratio"] == pytest.approx(2.0)  # a huge member: its time / floor → 80 / 40
    biggest = single(1e12, 0.003 + 1e12 / 40e9, 80e9)
    assert biggest["s_per_token"] / biggest["floor_s_per_token"] == pytest.approx(2.0, rel=1e-3)
    table = "\n".join(floor_lines({k: {**s, "floor_ratio": 1.0} for k, s in singles.items()}, bandwidth))
    assert "3.0 ms a step + its bytes at 40.0 GB/s" in table and "2.00× its floor" in table
    # GPU members: the CPU's bandwidth is measured beside theirs, and the line is still theirs.
    on_gpu = {f"m{n}": single(n * 1e9, 0.002 + n * 1e9 / 2e12, 3e12) for n in (1, 2, 4)}
    both = {"cpu": 80e9, "cuda": 3e12}
    table = "\n".join(floor_lines({k: {**s, "floor_ratio": 1.0} for k, s in on_gpu.items()}, both))
    assert "2.0 ms a step + its bytes at 2000.0 GB/s" in table and "1.50× its floor" in table


def test_the_cost_line_says_nothing_where_a_line_means_nothing():
    one = {"a": single(1e8, 0.005, 80e9)}
    assert cost_line(one) is None  # one point
    same = {"a": single(1e8, 0.005, 80e9), "b": single(1e8, 0.006, 80e9)}
    assert cost_line(same) is None  # no spread in size
    shrinking = {"a": single(1e8, 0.009, 80e9), "b": single(3e8, 0.004, 80e9)}
    assert cost_line(shrinking) is None  # bigger is faster: not a cost of reading
    growing = {"a": single(1e8, 0.004, 80e9), "b": single(3e8, 0.009, 80e9)}
    assert cost_line(growing) is not None
    two_kinds = {"a": single(1e8, 0.004, 80e9), "b": single(3e8, 0.009, 3e12)}
    assert cost_line(two_kinds) is None  # members on two kinds of device
