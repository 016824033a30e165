"""What a serving level could reach, beside what it reached (`bench serve`, issue 52): the ceiling
set by the bytes of weights a round reads and the device's read bandwidth, measured ÷ ceiling, and
the model arithmetic the level did; and how each member drafted (its decode path, the CUDA graphs
it captured).

The ceiling of a level of N clients (at most the batch size B in one round): every member reads its
weights once per forward pass, and a round is L drafting steps and one verification pass per
member, whatever the batch; the round yields min(N, B) × L answer tokens. So

    ceiling tok/s = min(N, B) × L × bandwidth / (Σ_members weight bytes × (L + 1)).

The keys and values read (which grow with the batch and the context: 2 % of the weights' bytes for
32 runs of 100 tokens of an 8B model) and the accept passes are left out: the ceiling is a little
high, never low. The arithmetic is the usual estimate, 2 × parameters × tokens through a model: a
round reads L tokens per run for drafting and N_members × (L + 1) per run for verification in each
member. Knows nothing about the server: it reads the members and the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..members.process import on_member
from .floor import bandwidths, member_floors


def measure(members: Sequence[Any]) -> dict[str, Any]:
    """The device's read bandwidth (measured now) and each member's weight bytes, for ceilings(); and
    how each member decoded, with its captured steps' replays timed now (slots.SlotStore.time_replays)."""
    for m in members:
        on_member(m, _time_replays)
    bandwidth = bandwidths(members)
    floors = member_floors(members, bandwidth)
    kind = "cuda" if any(str(m.device).startswith("cuda") for m in members) else "cpu"
    return {
        "bandwidth_bytes_per_s": bandwidth[kind],
        "weight_bytes": {name: f["weight_bytes"] for name, f in floors.items()},
        "decode": decode_paths(members),
    }


def decode_paths(members: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """How each member drafted (members/hf/slots.py): "graphs" (KV slots, steps captured), "slots"
    (KV slots, uncaptured: a CPU, or a capture that failed), "eager", or "other" (not a
    transformers member); with the KV slots' counts and the seconds its captures took. A member in a
    worker process (members/process.py) is read there."""
    return {m.name: on_member(m, decode_path) for m in members}


def decode_path(member: Any) -> dict[str, Any]:
    """decode_paths' entry for one member, read where the member lives (plain data: it may cross a pipe)."""
    store = slot_store(member)
    if store is None:
        return {"path": "eager" if hasattr(member, "slots") and member.slots is None else "other"}
    captured = store.capture and not store.capture_off
    return {
        "path": "graphs" if captured else "slots",
        **store.counts,
        "capture_s": round(store.capture_seconds, 2),
        "capture_off": store.capture_off,
        "options": {option: getattr(store, option) for option in SLOT_OPTIONS},
        "replay_ms": [  # each step captured at MIN_WIDTH: one replay's GPU ms (measure())
            {"kind": k, "rows": r, "tokens": q, "ms": round(ms, 3)}
            for (k, r, q, _), ms in store.replay_ms.items()
        ],
    }


# A round's verification bucket in the GPU check: three members' candidates of L + 1 = 11 tokens, their
# anchor shared (31 tree nodes a row).
ROUND_NODES = 32
# A KV-slot store's switches (members/hf/slots.py), for A/B runs.
SLOT_OPTIONS = ("ahead", "fold", "batched", "fuse", "merge", "prefill", "stacked")


def captures(members: Sequence[Any]) -> tuple[int, float]:
    """How many steps the members' KV slots have captured so far, and the seconds it took."""
    taken = [on_member(m, _captured) for m in members]
    return sum(steps for steps, _ in taken), sum(seconds for _, seconds in taken)


def will_capture(member: Any) -> bool:
    """Whether the member's KV slots capture their steps as CUDA graphs (a GPU's), wherever it lives."""
    return bool(on_member(member, _will_capture))


def slot_store(member: Any) -> Any:
    """A transformers member's KV-slot store (members/hf/slots.SlotStore); None for one that drafts
    eagerly and for other back ends (llama.cpp's `slots` is a count), and for one in a worker process
    (read it there: on_member)."""
    store = getattr(member, "slots", None)
    return store if hasattr(store, "capture") else None


def slots_off(members: Sequence[Any], options: Sequence[str]) -> None:
    """Turn `options` (SLOT_OPTIONS) off in every member's KV slots, to measure what each is worth
    in one run against one with them on (bench serve --slots-off; tools/gpu_serve_check.sh)."""
    for m in members:
        on_member(m, _turn_off, list(options))


# What on_member runs where a member lives (module-level: a worker process gets them by name).


def _time_replays(member: Any) -> None:
    store = slot_store(member)
    if store is not None and store.graphs:  # its steps captured
        store.time_replays()


def _captured(member: Any) -> tuple[int, float]:
    store = slot_store(member)
    return (0, 0.0) if store is None else (store.counts["captures"], store.capture_seconds)


def _will_capture(member: Any) -> bool:
    return bool(getattr(slot_store(member), "capture", False))


def _turn_off(member: Any, options: Sequence[str]) -> None:
    store = slot_store(member)
    for option in options if store is not None else ():
        setattr(store, option, False)


def ceilings(report: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Each level's ceiling tok/s, measured ÷ ceiling and GFLOP/s (see the module's docstring)."""
    config, levels = report["config"], report["levels"]
    segment, batch = int(config["segment_len"]), int(report["batch_size"])
    read = sum(report["weight_bytes"].values())
    flop_per_token = _flop_per_token(report["parameters"], segment)
    out = {}
    for key, level in levels.items():
        rows = min(int(level["clients"]), batch)
        ceiling = rows * segment * report["bandwidth_bytes_per_s"] / (read * (segment + 1))
        out[key] = {
            "ceiling_tokens_per_s": ceiling,
            "of_ceiling": level["tokens_per_s"] / ceiling,
            "gflop_per_s": level["tokens_per_s"] * flop_per_token / 1e9,
        }
    return out


def _flop_per_token(parameters: Mapping[str, float | None], segment: int) -> float:
    """Model FLOP per answer token: each member reads L draft tokens and N_members × (L + 1)
    verified ones per run and round of L answer tokens."""
    count = len(parameters)
    per_round = sum(2 * (p or 0.0) * (segment + count * (segment + 1)) for p in parameters.values())
    return per_round / segment


def lines(report: Mapping[str, Any]) -> list[str]:
    """The printed block: the read bandwidth, each level's tok/s beside its ceiling, the decode paths."""
    if "bandwidth_bytes_per_s" not in report:  # a report from before the ceiling was measured
        return []
    weights, bandwidth = sum(report["weight_bytes"].values()) / 1e9, report["bandwidth_bytes_per_s"] / 1e9
    out = [
        "",
        f"ceiling: {weights:.2f} GB of weights read per pass at {bandwidth:.0f} GB/s "
        f"(measured), L + 1 passes per round (bench/ceiling.py)",
        f"{'clients':>7} {'tok/s':>8} {'ceiling':>9} {'÷ ceiling':>9} {'GFLOP/s':>9}",
    ]
    for key, c in ceilings(report).items():
        level = report["levels"][key]
        out.append(
            f"{level['clients']:>7} {level['tokens_per_s']:8.2f} {c['ceiling_tokens_per_s']:9.1f} "
            f"{100 * c['of_ceiling']:8.1f}% {c['gflop_per_s']:9.1f}"
        )
    paths = report.get("decode", {})
    if paths:
        out.append("decode: " + "; ".join(f"{name} {_path(p)}" for name, p in paths.items()))
    out += replay_lines(report)
    return out


def replay_lines(report: Mapping[str, Any]) -> list[str]:
    """Each member's captured steps, one replay's GPU time alone (timed by measure()), beside its
    weight-read floor: what the step's kernels cost without the host's work around them. Drafts
    by rows; verification at a round's bucket of nodes a row (ROUND_NODES) and at its largest (a
    prompt's read, prefill.on_slots)."""
    out = []
    for name, p in report.get("decode", {}).items():
        replays = p.get("replay_ms") or []
        if not replays:
            continue
        floor = 1e3 * report["weight_bytes"][name] / report["bandwidth_bytes_per_s"]
        buckets = sorted({r["tokens"] for r in replays if r["kind"] == "verify"})
        said = f"replay ms, {name} (floor {floor:.1f}): draft by rows " + _by_rows(replays, "draft", 1)
        for nodes in sorted({ROUND_NODES, *buckets[-1:]} & set(buckets)):
            said += f"; verify ({nodes} nodes a row) " + _by_rows(replays, "verify", nodes)
        out.append(said)
    return out


def _by_rows(replays: Sequence[Mapping[str, Any]], kind: str, tokens: int) -> str:
    chosen = [r for r in replays if (r["kind"], r["tokens"]) == (kind, tokens)]
    return ", ".join(f"{r['rows']}: {r['ms']:.1f}" for r in chosen)


def _path(p: Mapping[str, Any]) -> str:
    if p["path"] not in ("graphs", "slots"):
        return p["path"]
    said = f"{p['path']} ({p['drafts']} drafts, {p['steps']} steps, {p['replays']} replays"
    if "verifies" in p:  # reports from before verification ran on the slots have no such count
        said += f", {p['verifies']} verify passes, {p['verify_replays']} replayed"
    if "prefills" in p:  # nor, from before prompts were read on the slots, this one
        said += f", {p['prefills']} prompt reads, {p['prefill_replays']} replayed"
    if p["path"] == "graphs" or p["captures"]:
        said += f", {p['captures']} captures in {p['capture_s']:.1f} s"
    if p.get("capture_off"):
        said += f"; capture off: {p['capture_off']}"
    # Where steps are captured (a GPU) every option is on unless bench serve --slots-off said otherwise.
    off = [option for option, on in p.get("options", {}).items() if not on and p["path"] == "graphs"]
    listed = ", ".join(off[:-1]) + " and " + off[-1] if len(off) > 1 else "".join(off)
    return said + (f"; {listed} off" if off else "") + ")"


def side_by_side(reports: Mapping[str, Mapping[str, Any]]) -> str:
    """Several runs of one benchmark (by label: "eager", "graphs"), level by level: tok/s, first
    segment median and p95, measured ÷ ceiling, and how many answers equal the first run's to the
    same prompt (bf16 batches part from one another where their kernels differ)."""
    labels = list(reports)
    first = reports[labels[0]]
    answers = {key: dict(zip(level["prompts"], level["answers"])) for key, level in first["levels"].items()}
    out = [
        "side by side: " + ", ".join(labels) + " (÷ ceil: each run's tok/s ÷ its weight-read ceiling)",
        f"{'clients':>7} "
        + " ".join(f"{label + ' tok/s':>13} {'first med/p95':>13} {'÷ ceil':>7}" for label in labels)
        + f" {'same as ' + labels[0]:>16}",
    ]
    for key in first["levels"]:
        row = f"{first['levels'][key]['clients']:>7} "
        same = ""
        for label in labels:
            level = reports[label]["levels"].get(key)
            if level is None:
                row += f"{'-':>13} {'-':>13} {'-':>7} "
                continue
            of = (
                ceilings(reports[label]).get(key, {}).get("of_ceiling")
                if "bandwidth_bytes_per_s" in reports[label]
                else None
            )
            timing = f"{level['first_segment_median_s']:.2f}/{level['first_segment_p95_s']:.2f}"
            row += (
                f"{level['tokens_per_s']:13.2f} {timing:>13} {'-' if of is None else f'{100 * of:.1f}%':>7} "
            )
            if label != labels[0]:
                equal = sum(answers[key].get(p) == a for p, a in zip(level["prompts"], level["answers"]))
                same += f"{equal}/{len(level['answers'])} "
        out.append(row + f"{same.strip():>16}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m specfuse.bench.ceiling LABEL=REPORT.json ...`: the runs side by side."""
    import json
    import sys
    from pathlib import Path

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or any("=" not in a for a in args):
        print(
            "usage: python -m specfuse.bench.ceiling LABEL=REPORT.json [LABEL=REPORT.json ...]",
            file=sys.stderr,
        )
        return 2
    reports = {}
    for arg in args:
        label, path = arg.split("=", 1)
        reports[label] = json.loads(Path(path).read_text())
    print(side_by_side(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "ROUND_NODES",
    "SLOT_OPTIONS",
    "captures",
    "ceilings",
    "decode_paths",
    "lines",
    "main",
    "measure",
    "side_by_side",
    "slot_store",
    "slots_off",
]
