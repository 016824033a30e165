"""The memory-bandwidth floor: bytes a decoding step reads, and this machine's read bandwidth."""

from __future__ import annotations

import math

from specfuse.bench.floor import member_floors, read_bandwidth, weight_bytes


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
