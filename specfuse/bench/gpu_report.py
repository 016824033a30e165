"""The GPU benchmark's printed report (gpu.py measures): each member alone, the modes' table, the
phase figures, the targets with PASS/MISS, compiled drafts against eager ones; the `--workers` line."""

from __future__ import annotations

import math
from typing import Any

from .floor import modes_floor_lines

MODE_LABELS = {"off": "in turn", "on": "at once", "processes": "processes", "eager": "in turn, eager"}


def format_table(report: dict[str, Any]) -> str:
    lines = _header_lines(report) + _single_lines(report)
    if "compiled" in report:
        lines.append("  (alone: each member's own compiled drafting, the ensemble's path; generate: eager)")
    lines += modes_floor_lines(report)
    lines += _modes_lines(report) + _phase_lines(report) + _target_lines(report)
    if "compiled" in report:
        c = report["compiled"]
        lines.append(
            f"compiled drafts: {c['speedup_in_turn']:.2f}× eager drafts' speed in turn; same answer: "
            f"{c['same_answer_as_eager']}; drafts {c['drafts']}; verification passes "
            f"{c.get('verified', {})}; off: {c['disabled']}; "
            f"graphs skipped: {c['cudagraph_skips']}"
        )
    if "processes" in report["modes"] and not report["gpu"].startswith("none"):
        lines.append("  (processes: peak GB is the GPU memory in use after the run, every process together)")
    return "\n".join(lines)


def format_race(race: dict[str, Any]) -> str:
    """The line `--workers` prints: bare decoding in turn, in threads, in one process per member."""
    return (
        f"{race['tokens']} tokens each: in turn {race['in_turn_s']:.2f} s, "
        f"threads {race['threads_s']:.2f} s "
        f"({race['threads_speedup']:.2f}×), processes {race['processes_s']:.2f} s "
        f"({race['processes_speedup']:.2f}×)"
    )


def _header_lines(report: dict[str, Any]) -> list[str]:
    return [
        f"GPU: {report['gpu']}, torch {report['torch']}, {report['dtype']}, L = {report['segment_len']}, "
        f"{report['max_new_tokens']} tokens, exit off"
        + (", drafts compiled (static cache)" if report.get("compile_decode") else ""),
        f"command: {report.get('command', '')}",
        "",
    ]


def _single_lines(report: dict[str, Any]) -> list[str]:
    """One line per member alone: its time per token, first segment, peak memory, and (compiled
    members) generate's time and the bare compiled step's beside it."""
    lines = []
    for name, s in report["single"].items():
        lines.append(
            f"  {name:14} on {report['devices'][name]:7} {report['parameters'][name] / 1e9:5.2f} B params "
            f"alone: {1000 * s['s_per_token']:7.1f} ms/token ({s['tokens_per_s']:.1f} tok/s), first "
            f"{report['segment_len']} tokens {s['first_segment_s']:.3f} s, peak {s['peak_gb']:.1f} GB"
            + (
                f"; generate {1000 * s['generate_s_per_token']:.1f} ms/token"
                if "generate_s_per_token" in s
                else ""
            )
            + (
                f"; the compiled step and head alone {1000 * s['bare_step_s']:.1f} ms "
                f"({s['bare_step_floor_ratio']:.2f}× the floor)"
                if "bare_step_floor_ratio" in s
                else ""
            )
        )
    return lines


def _modes_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"{'members':14} {'ms/tok':>8} {'tok/s':>7} {'×sum':>6} {'×slowest':>8} {'1st cand':>8} "
        f"{'1st seg':>7} {'×slowest':>8} {'peak GB':>7}",
    ]
    for parallel, m in report["modes"].items():
        label = MODE_LABELS[parallel]
        lines.append(
            f"{label:14} {1000 * m['s_per_token']:8.1f} "
            f"{m['tokens_per_s']:7.2f} {m['overhead_vs_single_sum']:6.2f} {m['overhead_vs_slowest']:8.2f} "
            f"{m['first_candidate_s']:8.3f} {m['first_segment_s']:7.3f} {m['first_segment_ratio']:8.2f} "
            f"{m['peak_gb']:7.1f}"
        )
    return lines


def _phase_lines(report: dict[str, Any]) -> list[str]:
    """Each mode's shares of a round's wall time, and each member's draft / verify per round."""
    lines = []
    for parallel, m in report["modes"].items():
        if "phases" in m:
            shares = " · ".join(f"{k.removesuffix('_share')} {v:.2f}" for k, v in m["phases"].items())
            lines.append(f"  {parallel}: shares of a round's wall time: {shares}")
        if "wins" in next(iter(m.get("phase_ms_per_member", {}).values()), {}):
            each = "; ".join(
                f"{name} {p['draft_s']:.0f} / {p['verify_s']:.0f} ms, won {p['wins']:.0f}, "
                f"took over {p['tokens_taken_over']:.0f}"
                for name, p in m["phase_ms_per_member"].items()
            )
            lines.append(
                f"  {parallel}: a round's draft / verify per member, rounds won, tokens taken over: {each}"
            )
    return lines


def _target_lines(report: dict[str, Any]) -> list[str]:
    """The modes at once against in turn, and the target (time per token against the slowest member)."""
    bound = report["target_overhead_vs_slowest_at_once"]
    on_gpu = not report["gpu"].startswith("none")
    lines = [""]
    for parallel in ("on", "processes"):
        m = report["modes"].get(parallel)
        if m is None:
            continue
        streams = ", CUDA streams" if on_gpu else ""
        label = f"at once (threads{streams})" if parallel == "on" else "at once (one process per member)"
        verdict = (
            "PASS"
            if math.isfinite(m["overhead_vs_slowest"]) and m["overhead_vs_slowest"] <= bound
            else "MISS"
        )
        lines += [
            f"{label}: {m['speedup_vs_in_turn']:.2f}× in turn's speed; "
            f"same answer: {m['same_answer_as_in_turn']} ({m['common_prefix_chars']} characters in common)",
            f"  target: time per token ≤ {bound} × the slowest member alone: "
            f"{m['overhead_vs_slowest']:.2f}  {verdict}",
        ]
    return lines
