"""The performance benchmark: per-round cost, verify share, overhead over the members alone, latency, memory.

Knows nothing about answer quality (that is eval.py) and never changes a member's weights or config
beyond the one switch it compares (`reuse_verified_kv`). `python -m specfuse.bench --help`.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import EnsembleConfig
from ..engine import Ensemble, ServerSettings
from ..errors import SpecfuseError
from ..eval.variants import add_set_option
from ..flags import Parser, add_loading_flags, add_settings, parse_models
from ..members.workers import run_concurrently
from .floor import add_floors, bandwidths, cost_line, floor_lines, member_floors
from .measure import (
    TimedRun,
    accept_ms_per_member,
    alone_summary,
    cpu_model,
    generate_alone,
    late_early_ranges,
    mean_round_seconds,
    median_round_seconds,
    members_alone,
    peak_rss_gb,
    phase_ms_per_member,
    phase_shares,
    rss_alone,
    rss_child,
    timed_stream,
    tokens_of,
    write_report,
)

log = logging.getLogger(__name__)

# A prompt that keeps every default member writing well past 400 tokens.
LONG_PROMPT = (
    "Write a numbered list of 100 different animals. For each animal write one full sentence "
    "about where it lives and what it eats. Do not stop before number 100."
)
TARGETS = {  # key → (bound, "le" = the figure must be ≤ the bound)
    "round_time_ratio_late_early": 1.25,
    "verify_share": 0.25,
    "overhead_vs_single_sum": 1.3,
    "first_segment_latency_ratio": 1.5,
}


def run_bench(
    members: Sequence[Any],
    *,
    prompt: str = LONG_PROMPT,
    max_new_tokens: int = 440,
    segment_len: int = 10,
    off_rounds: int = 40,
    repeats: int = 3,
    parallel: str = "auto",
    settings: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Measure everything on `members` (HFMembers) in this process; returns the JSON-ready report.

    Order: warm-up, each member alone (generate), the ensemble with verified keys/values reused,
    the same prompt with reuse off for `off_rounds` rounds, and first-segment latencies (median of
    `repeats`). Exit is off so that all N members draft every round: the per-round cost measured is
    that of the full ensemble. `settings`: EnsembleConfig fields set on top, in every run.
    """
    base = replace(EnsembleConfig(exit=False, stop_strings=()), **(settings or {}))
    config = replace(base, segment_len=segment_len, max_new_tokens=max_new_tokens)
    steps = _Steps(7, progress)

    steps.next("warm-up")
    for m in members:
        generate_alone(m, prompt, 4)
    Ensemble(members, config, parallel=parallel).run(
        prompt, replace(base, segment_len=segment_len, max_rounds=2)
    )

    steps.next("ensemble, reuse on")
    for m in members:
        m.reuse_verified_kv = True
    ensemble = Ensemble(members, config, parallel=parallel)
    main = timed_stream(ensemble, prompt, config)
    tokens = tokens_of(main.rounds)
    log.info("ensemble: %d rounds, %d tokens, %.1f s", len(main.rounds), tokens, main.seconds)

    steps.next("members alone")
    singles = members_alone(members, prompt, tokens, segment_len, repeats)

    steps.next("ensemble, reuse off")
    for m in members:
        m.reuse_verified_kv = False
    try:
        off_config = replace(config, max_rounds=min(off_rounds, len(main.rounds)))
        off = timed_stream(ensemble, prompt, off_config)
    finally:
        for m in members:
            m.reuse_verified_kv = True

    steps.next("first-segment latency")
    one_round = replace(base, segment_len=segment_len, max_rounds=1)
    first_segment = statistics.median(
        timed_stream(ensemble, prompt, one_round).first_segment_s for _ in range(repeats)
    )
    steps.close()
    run = dict(prompt=prompt, segment_len=segment_len, max_new_tokens=max_new_tokens, parallel=parallel)
    return _report(members, run, main, off, singles, first_segment)


def _report(
    members: Sequence[Any],
    run: dict[str, Any],
    main: TimedRun,
    off: TimedRun,
    singles: dict[str, dict[str, Any]],
    first_segment: float,
) -> dict[str, Any]:
    """The report from what run_bench measured (the memory bandwidth is read here, last); `run`: its
    prompt, segment_len, max_new_tokens and parallel, as they were passed."""
    early, late = late_early_ranges(len(main.rounds))
    shares = phase_shares(main.rounds, concurrent=run_concurrently(members, run["parallel"]))
    bandwidth = bandwidths(members)
    floor_sum = add_floors(singles, member_floors(members, bandwidth))
    tokens = tokens_of(main.rounds)
    seconds_per_token = main.seconds / max(tokens, 1)
    alone = alone_summary(singles)
    single_sum, slowest_first = alone["single_sum_s_per_token"], alone["slowest_single_first_segment_s"]
    import torch

    report: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "models": [m.name for m in members],
        "dtypes": {m.name: str(m.dtype).replace("torch.", "") for m in members},
        "prompt": run["prompt"],
        "segment_len": run["segment_len"],
        "max_new_tokens": run["max_new_tokens"],
        "exit": False,
        "parallel": run["parallel"],
        "rounds": len(main.rounds),
        "answer_tokens": tokens,
        "answer_chars": len(main.rounds[-1].text),
        "stop_reason": main.rounds[-1].stop_reason,
        "early_rounds": list(early),
        "late_rounds": list(late),
        "round_s_early": mean_round_seconds(main.rounds, *early),
        "round_s_late": mean_round_seconds(main.rounds, *late),
        "round_time_ratio_late_early": mean_round_seconds(main.rounds, *late)
        / mean_round_seconds(main.rounds, *early),
        "round_time_ratio_late_early_median": median_round_seconds(main.rounds, *late)
        / median_round_seconds(main.rounds, *early),
        **shares,
        "phase_ms_per_member": phase_ms_per_member(main.rounds),
        "round_seconds": [round(r.seconds, 4) for r in main.rounds],
        "round_tokens": [r.winner.num_tokens for r in main.rounds],
        # Tokens drafters took over from their previous, trimmed draft instead of decoding again.
        "decode_steps_saved": sum(c.reused_tokens for r in main.rounds for c in r.candidates),
        "decode_steps": sum(c.num_tokens for r in main.rounds for c in r.candidates),
        "ensemble_seconds": main.seconds,
        "ensemble_s_per_token": seconds_per_token,
        "ensemble_tokens_per_s": tokens / main.seconds,
        "bandwidth_bytes_per_s": bandwidth,
        "floor_sum_s_per_token": floor_sum,  # the members' floors together (they all decode each token)
        "cost_line": cost_line(singles),  # fixed cost a step, marginal read rate
        "ensemble_floor_ratio": seconds_per_token / floor_sum,
        "single": singles,
        "single_sum_s_per_token": single_sum,
        "overhead_vs_single_sum": seconds_per_token / single_sum,
        "first_segment_latency_s": first_segment,
        "first_segment_latency_s_in_long_run": main.first_segment_s,
        "slowest_single_first_segment_s": slowest_first,
        "first_segment_latency_ratio": first_segment / slowest_first,
        "accept_cost": _accept_cost(main, off),
        "peak_rss_gb": peak_rss_gb(),
    }
    return report


def _accept_cost(main: TimedRun, off: TimedRun) -> dict[str, Any]:
    """The accept phase's cost with verified keys/values reused (`main`) against without (`off`),
    over the rounds both ran."""
    compared = len(off.rounds)
    return {
        "rounds_compared": compared,
        "reuse_on_ms": accept_ms_per_member(main.rounds, last_k=compared),
        "reuse_off_ms": accept_ms_per_member(off.rounds),
        "reuse_on_share_of_round": sum(t.accept_s for r in main.rounds[:compared] for t in r.timings)
        / sum(r.seconds for r in main.rounds[:compared]),
        "reuse_off_share_of_round": sum(t.accept_s for r in off.rounds for t in r.timings)
        / sum(r.seconds for r in off.rounds),
        "reuse_off_same_text": off.rounds[-1].text == main.rounds[len(off.rounds) - 1].text,
    }


class _Steps:
    """A tqdm bar on stderr over the benchmark's phases (silent when progress is off)."""

    def __init__(self, total: int, progress: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="bench", file=sys.stderr, disable=not progress)
        self.started = False

    def next(self, what: str) -> None:
        if self.started:
            self.bar.update(1)
        self.started = True
        self.bar.set_description_str(f"bench: {what}")
        log.info("bench: %s", what)

    def close(self) -> None:
        self.bar.update(1)
        self.bar.close()


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def verdicts(report: dict[str, Any]) -> Iterator[tuple[str, float, float, bool]]:
    """(key, measured, target, holds) for each figure the issue sets a target for."""
    for key, bound in TARGETS.items():
        value = float(report[key])
        yield key, value, bound, math.isfinite(value) and value <= bound


def format_table(report: dict[str, Any]) -> str:
    """The results as a plain-text table: targets with PASS/MISS first, then the other figures."""
    lines = [
        f"CPU: {report['cpu_model']} ({report['cpu_count']} cores, {report['torch_threads']} torch threads)",
        f"models: {', '.join(f'{m} ({d})' for m, d in report['dtypes'].items())}"
        + (f", {report['quantize']} weights" if report.get("quantize", "none") != "none" else ""),
        f"answer: {report['answer_tokens']} tokens in {report['rounds']} rounds "
        f"(stop: {report['stop_reason']}), L = {report['segment_len']}, exit off",
        "",
        f"{'figure':34} {'measured':>10} {'target':>8}  verdict",
    ]
    for key, value, bound, holds in verdicts(report):
        lines.append(f"{key:34} {value:10.3f} {'≤ ' + str(bound):>8}  {'PASS' if holds else 'MISS'}")
    e, la = report["early_rounds"], report["late_rounds"]
    acc = report["accept_cost"]
    lines += [
        f"(median-based round ratio: {report['round_time_ratio_late_early_median']:.3f}; "
        f"parallel {report['parallel']})",
        "",
        f"rounds {e[0]}–{e[1]} / {la[0]}–{la[1]}: "
        f"{report['round_s_early']:.3f} s / {report['round_s_late']:.3f} s",
        f"shares of the rounds' wall time: draft {report['draft_share']:.3f} · verify "
        f"{report['verify_share']:.3f} · accept {report['accept_share']:.3f} · "
        f"engine {report['engine_share']:.3f}",
        f"ensemble: {1000 * report['ensemble_s_per_token']:.1f} ms/token "
        f"({report['ensemble_tokens_per_s']:.1f} tok/s); sum of singles "
        f"{1000 * report['single_sum_s_per_token']:.1f} ms/token",
    ]
    for name, s in report["single"].items():
        lines.append(
            f"  {name:24} alone: {1000 * s['s_per_token']:6.1f} ms/token ({s['tokens_per_s']:.1f} tok/s), "
            f"first {report['segment_len']} tokens {s['first_segment_s']:.3f} s"
        )
    if "floor_sum_s_per_token" in report:  # reports written before the floor was measured lack it
        lines += floor_lines(report["single"], report["bandwidth_bytes_per_s"])
        lines.append(
            f"  ensemble {1000 * report['ensemble_s_per_token']:.1f} ms/token | sum of floors "
            f"{1000 * report['floor_sum_s_per_token']:.1f} ms | "
            f"{report['ensemble_floor_ratio']:.2f}× the floor"
        )
    lines += [
        f"decode steps saved by taking over trimmed tokens: {report['decode_steps_saved']} "
        f"(of {report['decode_steps']} drafted tokens kept)",
        f"first segment: ensemble {report['first_segment_latency_s']:.3f} s, slowest single "
        f"{report['slowest_single_first_segment_s']:.3f} s",
        f"accept cost per round (ms, first {acc['rounds_compared']} rounds), reuse on → off:",
    ]
    for name, on in acc["reuse_on_ms"].items():
        lines.append(f"  {name:24} {on:7.2f} → {acc['reuse_off_ms'].get(name, math.nan):7.2f}")
    lines.append(
        f"  share of round time: {acc['reuse_on_share_of_round']:.3f} → {acc['reuse_off_share_of_round']:.3f}"
    )
    rss = report.get("rss_alone_gb")
    mem = f"peak RSS: {report['peak_rss_gb']:.2f} GB"
    if rss:
        mem += (
            f"; alone: {', '.join(f'{k} {v:.2f}' for k, v in rss.items())} GB; sum of models alone "
            f"{report['rss_sum_alone_gb']:.2f} GB "
            f"(one shared baseline: {report['rss_sum_alone_one_baseline_gb']:.2f})"
        )
    lines.append(mem)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.rss_child is not None:
        rss_child(args.rss_child, args.dtype)
        return 0
    try:
        report = _run(args)
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report["quick"] = args.quick
    report["settings"] = dict(args.settings)
    report["quantize"] = args.quantize
    write_report(report, format_table(report), args.json)
    return 0


QUICK = {"max_new_tokens": "440; 160 with --quick"}


def _parser() -> Parser:
    parser = Parser(
        prog="python -m specfuse.bench",
        description="Benchmark the ensemble against its members alone on one prompt (issue 4).",
    )
    add_loading_flags(
        parser, only=("models", "dtype", "quantize"), defaults={"models": None, "quantize": "none"}
    )
    add_settings(
        parser, only=("max_new_tokens", "segment_len"), defaults={"max_new_tokens": None}, shown=QUICK
    )
    add_settings(parser, of=ServerSettings, only=("parallel",))
    parser.add_argument("--quick", action="store_true", help="160 tokens instead of 440: a few minutes")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--prompt", default=LONG_PROMPT, help="the prompt (default: a long numbered list)")
    parser.add_argument("--off-rounds", type=int, default=12, help="rounds of the reuse-off run")
    parser.add_argument("--no-rss", action="store_true", help="skip loading each model alone in a child")
    add_set_option(
        parser,
        "an EnsembleConfig setting on top, in every run (repeatable), e.g. own_draft_scores=true",
    )
    parser.add_argument("--profile", type=Path, default=None, help="write a cProfile of the run here")
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    return parser


def _run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the models, run the benchmark (under cProfile with --profile), then (unless --no-rss or
    quantized) each model's memory alone in a child process."""
    from ..models.placement import load_members, tqdm_progress

    tokens = args.max_new_tokens or (160 if args.quick else 440)
    names = parse_models(args.models, hub=False)
    members = load_members(names, dtype=args.dtype, progress=tqdm_progress("loading"), quantize=args.quantize)
    bench_kwargs = dict(
        prompt=args.prompt,
        max_new_tokens=tokens,
        segment_len=args.segment_len,
        repeats=2 if args.quick else 3,
        off_rounds=args.off_rounds,
        parallel=args.parallel,
        settings=dict(args.settings),
        progress=True,
    )
    if args.profile is not None:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        report = profiler.runcall(run_bench, members, **bench_kwargs)
        profiler.dump_stats(args.profile)
        with open(args.profile.with_suffix(".txt"), "w") as f:
            pstats.Stats(profiler, stream=f).sort_stats("cumulative").print_stats(40)
    else:
        report = run_bench(members, **bench_kwargs)
    if not args.no_rss and args.quantize == "none":  # the children load unquantized models
        alone = rss_alone(names, args.dtype)
        report["rss_alone_gb"] = alone
        report["rss_sum_alone_gb"] = sum(alone[n] for n in names)
        report["rss_sum_alone_one_baseline_gb"] = (
            report["rss_sum_alone_gb"] - (len(names) - 1) * alone["baseline"]
        )
    return report


if __name__ == "__main__":
    sys.exit(main())
