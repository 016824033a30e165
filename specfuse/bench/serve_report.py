"""The serving benchmark's report as text (`python -m specfuse.bench serve`): the header line, a row
per level of clients, where batched answers part from solo ones, the targets at 8, each level's
profile, the GPU's ceiling, the kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..config import EnsembleConfig
from . import ceiling
from .profile_report import format_profile

PER_CLIENT = 4  # requests each client sends in turn (serve's default; the table's for older reports)
MIN_REQUESTS = 8  # the baseline's requests: each example prompt twice


def changed_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a report's `config` that differ from EnsembleConfig's defaults, the answer
    budget aside (the table shows the tokens per request)."""
    defaults = EnsembleConfig().to_dict()
    return {k: v for k, v in config.items() if k != "max_new_tokens" and defaults.get(k, v) != v}


def _requests_shown(report: dict[str, Any]) -> str:
    counts = [r["requests"] for r in report["levels"].values()]
    if len(set(counts)) == 1:  # a fixed list (--requests, and reports from before --per-client)
        return f"{counts[0]} requests per level"
    least = report.get("min_requests") or MIN_REQUESTS
    return f"{report.get('per_client', PER_CLIENT)} requests per client (at least {least})"


def _shown(value: Any) -> str:
    return "|".join(map(str, value)) if isinstance(value, list | tuple) else str(value)  # as --set takes it


def listed(settings: dict[str, Any]) -> str:
    """Settings as the report prints them: `key=value, …`."""
    return ", ".join(f"{k}={_shown(v)}" for k, v in settings.items())


def _where(report: dict[str, Any]) -> str:
    """The machine of the header line: the GPU and dtype where the members ran on one, else the CPU."""
    shapes = report.get("shapes")
    made = f"; random weights, {shapes} shapes" if shapes else ""
    if report.get("gpu"):
        return f"{report['gpu']} ({report['device']}, {report['dtype']}{made})"
    dtype = f", {report['dtype']}" if "dtype" in report else ""
    return f"{report['cpu']} ({report['cores']} cores{dtype}{made})"


def parted_at(solo: str, batched: str, encode: Callable[[str], Sequence[int]] | None = None) -> int | None:
    """Where a batched answer parts from the same prompt's solo answer: the index of the first token
    (in `encode`'s tokens; characters without it) that differs, None where the two are equal. In
    bf16 a batch's kernels round differently from one row's, so a near tie can go the other way."""
    if solo == batched:
        return None
    a, b = (encode(solo), encode(batched)) if encode is not None else (solo, batched)
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def parting_lines(report: dict[str, Any]) -> list[str]:
    """Per level, its answers against the solo ones: how many equal, and where the others part."""
    unit = f"{report['parted_in']} tokens" if report.get("parted_in") else "characters"
    lines = []
    for r in report["levels"].values():
        if "parted_at" not in r:  # reports from before it was measured
            continue
        parted = [p for p in r["parted_at"] if p is not None]
        equal = len(r["parted_at"]) - len(parted)
        where = f"; the others part at {unit} {', '.join(map(str, sorted(parted)))}" if parted else ""
        lines.append(f"  {r['clients']:>3} clients: {equal} of {len(r['parted_at'])} equal{where}")
    return ["", "batched answers against the solo answer to the same prompt:", *lines] if lines else []


def capture_lines(report: dict[str, Any]) -> list[str]:
    """The KV slots' steps first needed inside a timed level, captured there (none: nothing said)."""
    caught = [r for r in report["levels"].values() if r.get("captures")]
    said = [f"{r['clients']} clients: {r['captures']} in {r['capture_s']:.1f} s" for r in caught]
    return ["", "steps captured at first use inside a timed level: " + "; ".join(said)] if said else []


def gc_lines(report: dict[str, Any]) -> list[str]:
    """The garbage collector's full passes in each level (each holds every thread, a round's too),
    and how many objects start-up left out of them (heap.freeze_survivors)."""
    levels = [r for r in report["levels"].values() if "gc_full_passes" in r]  # reports from before: none
    if not levels:
        return []
    counts = [
        f"{r['clients']} clients: {r['gc_full_passes']} ({r['gc_full_pass_ms']:.0f} ms)" for r in levels
    ]
    frozen = report.get("gc_frozen", 0)
    kept = f"{frozen:,} objects frozen at start-up" if frozen else "nothing frozen (--no-freeze)"
    return ["", f"full garbage collections, {kept}: {'; '.join(counts)}"]


def _row(r: dict[str, Any]) -> str:
    load = f"{r['load_before'][0]:.2f} → {r['load_after'][0]:.2f}"
    peak = r.get("peak_gpu_gb")
    return (
        f"{r['clients']:>7} {r['tokens_per_s']:7.2f} {r['aggregate_speedup']:6.2f} "
        f"{r['first_segment_median_s']:9.2f} {r['first_segment_p95_s']:9.2f} "
        f"{r['p95_first_segment_ratio']:8.2f} {r['total_median_s']:9.2f} {r['total_p95_s']:9.2f} "
        f"{r['same_answers_as_one_at_a_time']:>2}/{r['requests']:<2} {len(r['errors']):>6}  {load}"
        + (f"  {peak:11.1f}" if peak is not None else "")
        + (f"  cut short: {r['requests']} of {r['requests_planned']} sent" if r.get("cut_short") else "")
        + (f"  gated rounds {r['gated_share']:.0%} of {r['rounds']}" if r.get("gated_share") else "")
    )


def against_lines(report: dict[str, Any]) -> list[str]:
    """`--against`: each level under the other settings (measured right after the default's, on the
    same server), the same columns, then each level's tokens/s over the default's."""
    against = report.get("against")
    if not against:
        return []
    settings = listed(against["settings"])
    ratios = ", ".join(
        f"{r['clients']} clients ×{r['speedup_over_default']:.2f}" for r in against["levels"].values()
    )
    return [
        f"under {settings} (sent with each request; each level right after the one above):",
        *[_row(r) for r in against["levels"].values()],
        f"tokens/s under {settings} over the default's, level by level: {ratios}",
    ]


def format_table(report: dict[str, Any]) -> str:
    levels = report["levels"]
    quantize = report.get("quantize", "none")  # reports from before --quantize: unquantized
    settings = changed_settings(report.get("config", {}))
    gpu = any(r.get("peak_gpu_gb") is not None for r in levels.values())
    lines = [
        f"serving {', '.join(report['members'])} on {_where(report)}"
        + ("" if quantize == "none" else f", {quantize} weights")
        + f", batch size {report['batch_size']}, {report['max_tokens']} tokens per request, "
        + _requests_shown(report)
        + (f", join wait {report['join_wait']} s" if "join_wait" in report else "")
        + (f", members at once: {report['parallel']}" if report.get("parallel", "auto") != "auto" else "")
        + (", each member in a worker process of its own" if report.get("processes") else "")
        + (f"; settings: {listed(settings)}" if settings else ""),
        f"{'clients':>7} {'tok/s':>7} {'×1':>6} {'first med':>9} {'first p95':>9} {'p95/solo':>8} "
        f"{'total med':>9} {'total p95':>9} {'same':>5} {'errors':>6}  load avg before → after"
        + ("  peak GPU GB" if gpu else ""),
    ]
    lines += [_row(r) for r in levels.values()]
    lines += against_lines(report)
    if report.get("skipped"):
        lines.append(f"skipped (the deadline had passed): {', '.join(map(str, report['skipped']))} clients")
    lines += parting_lines(report)
    lines += capture_lines(report)
    lines += gc_lines(report)
    eight = levels.get("8")
    if eight is not None:
        speedup, ratio = eight["aggregate_speedup"], eight["p95_first_segment_ratio"]
        lines += [
            "",
            "targets (8 clients against one at a time):",
            f"  aggregate tokens/s ×{speedup:.2f} ≥ 3  {'PASS' if speedup >= 3 else 'MISS'}",
            f"  p95 first segment {ratio:.2f}× the solo median ≤ 3  {'PASS' if ratio <= 3 else 'MISS'}",
        ]
    for r in levels.values():
        if "profile" in r:
            lines += ["", format_profile(r, report.get("parameters", {}))]
    lines += ceiling.lines(report)
    if report.get("environment"):
        lines += ["", "kernels: " + " ".join(f"{k}={v}" for k, v in report["environment"].items())]
    if "versions" in report:
        lines += ["", "versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items())]
    if "command" in report:
        lines += ["", f"command: {report['command']}"]
    return "\n".join(lines)
