"""A level's profile (specfuse.members.profiling's tallies, from `bench serve --profile`) as text: where the
wall time went by phase, each member call and how many runs it served, the torch forward passes and
llama_decode calls with the tokens and sequences each carried, the threads in use, and the model
arithmetic the level reached (2 × parameters × tokens through a model, the usual estimate).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# engine/batch.py's phases, in the order a round meets them
PHASES = ("open", "prefill", "start", "catch up", "draft", "verify", "choose", "accept")


Tallies = dict[tuple[str, ...], Mapping[str, Any]]


def tallies(profile: Mapping[str, Any]) -> Tallies:
    """A snapshot's tallies (specfuse.members.profiling) by their keys."""
    return {tuple(t["key"]): t for t in profile["tallies"]}


def _split(found: Tallies, kind: str) -> Tallies:
    return {k[1:]: t for k, t in found.items() if k[0] == kind}


def gflops(profile: Mapping[str, Any], parameters: Mapping[str, float | None]) -> float:
    """GFLOP done by the members' models: 2 × parameters × tokens each read (torch forward passes and
    llama_decode calls)."""
    found = tallies(profile)
    tokens = {k[0]: t["items"] for k, t in _split(found, "forward").items()}
    for (m, _), t in _split(found, "llama_decode").items():
        tokens[m] = tokens.get(m, 0) + t["items"]
    return sum(2 * (parameters.get(m) or 0.0) * n for m, n in tokens.items()) / 1e9


def format_profile(level: Mapping[str, Any], parameters: Mapping[str, float | None]) -> str:
    wall = level["profile"]["wall_s"]
    p = tallies(level["profile"])
    phases = _split(p, "phase")
    rounds = phases.get(("draft",), {"calls": 0})["calls"]
    lines = [
        f"where the time went at {level['clients']} clients: {wall:.1f} s wall, {rounds} batch rounds, "
        f"{level['tokens_per_s']:.2f} tokens/s",
        f"  {'phase':<22} {'s':>8} {'share':>6} {'runs/call':>9}",
    ]
    named = 0.0
    rows = [(("phase", *k), t) for k, t in sorted(phases.items(), key=lambda kv: PHASES.index(kv[0][0]))]
    rows += sorted((("scheduler", *k), t) for k, t in _split(p, "scheduler").items() if k != ("idle",))
    for key, t in rows:
        named += t["seconds"]
        per = f"{t['items'] / t['calls']:9.1f}" if key[0] == "phase" and t["calls"] else f"{'':>9}"
        lines.append(f"  {' '.join(key[1:]):<22} {t['seconds']:8.1f} {t['seconds'] / wall:6.1%} {per}")
    idle = p.get(("scheduler", "idle"), {"seconds": 0.0})["seconds"]
    lines.append(f"  {'idle (no run)':<22} {idle:8.1f} {idle / wall:6.1%}")
    other = wall - named - idle
    lines.append(f"  {'other (loop, streams)':<22} {other:8.1f} {other / wall:6.1%}")
    calls = _split(p, "member")
    if calls:
        lines += ["", f"  {'member call':<30} {'calls':>6} {'s':>8} {'runs/call':>9} {'most':>5}"]
        for (step, m), t in sorted(calls.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            lines.append(
                f"  {m + ' ' + step:<30} {t['calls']:6d} {t['seconds']:8.1f} "
                f"{t['items'] / t['calls']:9.1f} {t['most']:5d}"
            )
    threads = {k[0]: t for k, t in _split(p, "threads").items()}

    def thread_text(m: str) -> str:
        t = threads.get(m)
        return f"{t['items'] / t['calls']:7.1f}" if t and t["calls"] else f"{'':>7}"

    forwards = _split(p, "forward")
    if forwards:
        lines += ["", f"  {'torch forward':<22} {'passes':>7} {'s':>8} {'tokens/pass':>11} {'threads':>7}"]
        for (m,), t in sorted(forwards.items()):
            tokens = t["items"] / t["calls"]
            lines.append(f"  {m:<22} {t['calls']:7d} {t['seconds']:8.1f} {tokens:11.1f} {thread_text(m)}")
    decodes = _split(p, "llama_decode")
    if decodes:
        lines += [
            "",
            f"  {'llama_decode':<30} {'calls':>7} {'s':>8} {'tokens/call':>11} {'seqs/call':>9} "
            f"{'rows s':>7} {'rows':>7} {'threads':>7}",
        ]
        for (m, what), t in sorted(decodes.items()):
            seqs = p.get(("llama_sequences", m, what), {"items": 0})["items"]
            rows_t = p.get(("llama_rows", m, what), {"seconds": 0.0, "items": 0})
            lines.append(
                f"  {m + ' ' + what:<30} {t['calls']:7d} {t['seconds']:8.1f} {t['items'] / t['calls']:11.1f} "
                f"{seqs / t['calls']:9.1f} {rows_t['seconds']:7.1f} {rows_t['items']:7d} {thread_text(m)}"
            )
    done = gflops(level["profile"], parameters)
    if done:
        lines += [
            "",
            f"  model arithmetic: {done:.0f} GFLOP (2 × parameters × tokens read), {done / wall:.1f} GFLOP/s",
        ]
    return "\n".join(lines)


__all__ = ["format_profile", "gflops"]
