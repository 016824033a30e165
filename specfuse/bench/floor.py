"""The memory-bandwidth floor: the fastest a member could decode on this machine, as a figure.

Decoding one token reads every weight once, so a member's time per token cannot fall below
(bytes of weights read per token) / (the memory's read bandwidth). Each benchmark prints every
member's decode time beside its floor and their ratio, and the ensemble's time per token beside the
sum of its members' floors, so that "how far from the hardware" is a number, not a feeling.

The floor assumes a step costs nothing but its reads. `cost_line` measures how far that holds on
this machine: a straight line through the members' own (bytes read, time per token) gives a step's
fixed cost and the rate at which its time grows with the bytes it reads. Where that rate is below
the read bandwidth (the kernels are bound by arithmetic, not by memory) no member of that back end
can come closer to its floor than bandwidth / rate, however large it is.

Knows nothing about the ensemble: it measures a device's read bandwidth and a model's bytes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..members.process import on_member

BANDWIDTH_MB = 512  # large enough to leave every cache far behind, small enough for any test box


def read_bandwidth(device: str = "cpu", megabytes: int = BANDWIDTH_MB, repeats: int = 5) -> float:
    """Bytes per second this device reads: the best of `repeats` sums over a `megabytes` tensor (a
    sum reads each byte once and writes nothing, which is what decoding does to its weights)."""
    import torch

    data = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up (page faults, kernel start)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        data.sum().item()
        best = min(best, time.perf_counter() - began)
    return data.numel() * data.element_size() / best


def weight_bytes(model: Any) -> int:
    """Bytes of weights one decoding step reads: every parameter once, except an input embedding
    that is not also the output head (a step gathers one of its rows, not the whole table).

    A quantized weight (models/quantize.py) counts its codes (int8, or int4 two to a byte) and its
    scales: the bytes it really holds, not its layer's bytes in the model's dtype."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == embedding.data_ptr()
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen or (p is embedding and not tied):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size() + (p.scale_bytes() if hasattr(p, "scale_bytes") else 0)
    return total


def decoder(member: Any) -> Any:
    """What does `member`'s decoding: itself, or a SplitMember's (gguf-draft) drafter."""
    return getattr(member, "drafter", member)


def bytes_per_token(member: Any) -> int:
    """The weight bytes one decoding step of `member` reads (read where it lives: on_member)."""
    decodes = decoder(member)
    return decodes.bytes_per_token if hasattr(decodes, "bytes_per_token") else weight_bytes(decodes.model)


def member_floors(members: Sequence[Any], bandwidth: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """Each member's bytes per token and floor in seconds per token, on its own device's bandwidth."""
    out = {}
    for m in members:
        kind = "cuda" if str(m.device).startswith("cuda") else "cpu"
        nbytes = on_member(m, bytes_per_token)
        out[m.name] = {"weight_bytes": nbytes, "floor_s_per_token": nbytes / bandwidth[kind]}
    return out


def bandwidths(members: Sequence[Any]) -> dict[str, float]:
    """The read bandwidth of every kind of device the members sit on (bytes per second)."""
    kinds = {"cuda" if str(m.device).startswith("cuda") else "cpu" for m in members}
    out = {"cpu": read_bandwidth("cpu")}
    if "cuda" in kinds:
        device = next(str(m.device) for m in members if str(m.device).startswith("cuda"))
        out["cuda"] = read_bandwidth(device)
    return out


def add_floors(singles: dict[str, dict[str, float]], floors: Mapping[str, Mapping[str, float]]) -> float:
    """Put each member's floor and `floor_ratio` (its time per token alone / its floor) into
    `singles`; return the sum of the members' floors (what the ensemble's time is set beside)."""
    for name, single in singles.items():
        single.update(floors[name])
        single["floor_ratio"] = single["s_per_token"] / floors[name]["floor_s_per_token"]
    return sum(f["floor_s_per_token"] for f in floors.values())


def cost_line(singles: Mapping[str, Mapping[str, float]]) -> dict[str, float] | None:
    """The least-squares line s_per_token = fixed + weight_bytes / rate through the members alone.

    `fixed_s_per_token`: what a step costs besides its reads (graph, thread barriers, the loop around
    it); `marginal_bytes_per_s`: the rate at which a step's time grows with its bytes; and
    `closest_floor_ratio`: bandwidth / rate, the nearest to its floor a member of this back end gets
    however large it is (≤ 1 where the kernels keep up with memory). None where the line says
    nothing: fewer than two members of distinct sizes, members on several kinds of device, or time
    that does not grow with size. Three points make a rough line: read it as an order of magnitude.
    Each member's bandwidth is the one its floor was taken at (bytes / floor): the machine's CPU
    bandwidth is measured beside GPU members too, and is not theirs.
    """
    reads = [s["weight_bytes"] / s["floor_s_per_token"] for s in singles.values()]
    if not reads or max(reads) > min(reads) * (1 + 1e-9):
        return None
    points = [(s["weight_bytes"], s["s_per_token"]) for s in singles.values()]
    if len({b for b, _ in points}) < 2:
        return None
    mean_b = sum(b for b, _ in points) / len(points)
    mean_t = sum(t for _, t in points) / len(points)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / sum((b - mean_b) ** 2 for b, _ in points)
    if slope <= 0:
        return None
    read = reads[0]
    return {
        "members": len(points),
        "fixed_s_per_token": mean_t - slope * mean_b,
        "marginal_bytes_per_s": 1 / slope,
        "closest_floor_ratio": read * slope,
    }


def floor_lines(singles: Mapping[str, Mapping[str, float]], bandwidth: Mapping[str, float]) -> list[str]:
    """The floor table of a benchmark's printout: bandwidth, one line per member, the cost line."""
    lines = ["read bandwidth: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in bandwidth.items())]
    for name, s in singles.items():
        lines.append(
            f"  {name:<22} {1000 * s['s_per_token']:8.1f} ms/token alone | floor "
            f"{1000 * s['floor_s_per_token']:6.1f} ms ({s['weight_bytes'] / 1e9:.2f} GB) | "
            f"{s['floor_ratio']:.2f}× the floor"
        )
    line = cost_line(singles)
    if line is not None:
        lines.append(
            f"  cost line through the {line['members']} members: {1000 * line['fixed_s_per_token']:.1f} ms a "
            f"step + its bytes at {line['marginal_bytes_per_s'] / 1e9:.1f} GB/s: no member of this back "
            f"end gets nearer than {line['closest_floor_ratio']:.2f}× its floor here"
        )
    return lines


def modes_floor_lines(report: Mapping[str, Any]) -> list[str]:
    """floor_lines, then each mode's time per token against the sum of the members' floors (a
    benchmark with several modes); nothing for a report written before the floor was measured."""
    if "floor_sum_s_per_token" not in report:
        return []
    ratios = ", ".join(f"{name} {m['floor_ratio']:.2f}" for name, m in report["modes"].items())
    return [
        *floor_lines(report["single"], report["bandwidth_bytes_per_s"]),
        f"  ensemble × the sum of floors ({1000 * report['floor_sum_s_per_token']:.1f} ms): {ratios}",
    ]


__all__ = [
    "add_floors",
    "bandwidths",
    "cost_line",
    "decoder",
    "floor_lines",
    "member_floors",
    "modes_floor_lines",
    "read_bandwidth",
    "weight_bytes",
]
