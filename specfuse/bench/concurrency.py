"""Members in turn against members at the same time, in one run: `python -m specfuse.bench concurrency`.

For each of exit off / on, the ensemble runs the same prompt with parallel="off" (members take
turns, each with every core) and parallel="on" (one thread per member with its share of the cores,
workers.py), beside each member's own `generate` alone. It also times the members' bare decoding
three ways (in turn, threads, one process per member) to show which kind of worker pays on this
machine. Ratios are measured in the same run; the load average is printed beside them.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import EnsembleConfig
from ..engine import Ensemble
from ..errors import SpecfuseError
from ..flags import Parser, add_loading_flags, add_settings, parse_models
from ..members.workers import thread_shares
from .core import LONG_PROMPT
from .floor import add_floors, bandwidths, cost_line, member_floors, modes_floor_lines
from .measure import (
    alone_summary,
    compare_in_turn,
    cpu_model,
    generate_alone,
    members_alone,
    process_mode,
    race_in_processes,
    time_mode,
    write_report,
)

log = logging.getLogger(__name__)

TARGETS = {  # issue 12, CPU, default trio, exit off, members at the same time
    "overhead_vs_single_sum": 1.0,
    "first_segment_ratio": 1.5,
    "round_time_ratio_late_early": 1.1,
}


def run_concurrency(
    members: Sequence[Any],
    *,
    prompt: str = LONG_PROMPT,
    max_new_tokens: int = 300,
    segment_len: int = 10,
    repeats: int = 3,
) -> dict[str, Any]:
    """Every mode on the same prompt; returns the JSON-ready report (see format_table)."""
    import torch

    base = EnsembleConfig(segment_len=segment_len, max_new_tokens=max_new_tokens, stop_strings=())
    load_before = os.getloadavg()
    for m in members:  # warm-up: first calls allocate and pick kernels
        generate_alone(m, prompt, 4)
    for parallel in ("off", "on"):
        Ensemble(members, replace(base, max_rounds=2), parallel=parallel).run(prompt)

    singles = members_alone(members, prompt, max_new_tokens, segment_len, repeats)
    bandwidth = bandwidths(members)
    floor_sum = add_floors(singles, member_floors(members, bandwidth))

    modes: dict[str, dict[str, Any]] = {}
    for exit_ in (False, True):
        for parallel in ("off", "on"):
            config = replace(base, exit=exit_)
            figures = time_mode(members, config, prompt, singles, repeats, parallel)
            modes[f"exit {'on' if exit_ else 'off'}, parallel {parallel}"] = {
                "exit": exit_,
                "parallel": parallel,
                **figures,
            }
    for state in ("off", "on"):
        compare_in_turn(modes[f"exit {state}, parallel off"], modes[f"exit {state}, parallel on"])
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "models": [m.name for m in members],
        "dtypes": {m.name: str(m.dtype).replace("torch.", "") for m in members},
        "thread_shares": thread_shares(
            {m.name: float(m.parameters or 1.0) for m in members}, torch.get_num_threads()
        ),
        "prompt": prompt,
        "segment_len": segment_len,
        "max_new_tokens": max_new_tokens,
        "single": singles,
        **alone_summary(singles),
        "bandwidth_bytes_per_s": bandwidth,
        "floor_sum_s_per_token": floor_sum,
        "cost_line": cost_line(singles),  # fixed cost a step, marginal read rate
        "modes": modes,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


def time_in_processes(
    report: dict[str, Any], names: Sequence[str], dtype: str, repeats: int
) -> dict[str, Any]:
    """Exit off, each member in a worker process of its own with its thread share (no handing on of
    cores between processes), against the same members alone; compared with members in turn."""
    from ..models.placement import load_in_process

    shares = report["thread_shares"]
    workers = [load_in_process(n, dtype=dtype, threads=shares[n]) for n in names]
    try:
        config = EnsembleConfig(
            segment_len=report["segment_len"],
            max_new_tokens=report["max_new_tokens"],
            stop_strings=(),
            exit=False,
        )
        mode = {"exit": False, "parallel": "processes"}
        mode |= process_mode(workers, config, report["prompt"], report["single"], repeats)
    finally:
        for w in workers:
            w.close()
    compare_in_turn(report["modes"]["exit off, parallel off"], mode)
    return mode


# -- bare decoding: in turn, threads, processes --------------------------------------------------------


def compare_workers(
    names: Sequence[str], dtype: str, tokens: int, prompt: str = LONG_PROMPT
) -> dict[str, Any]:
    """Seconds for every member to decode `tokens` greedily with `generate`: one after another with all
    the cores, at once in threads, and at once in one process per member (each with its thread share)."""
    import torch

    from ..models.placement import load_members

    members = load_members(names, dtype=dtype)
    shares = thread_shares({m.name: float(m.parameters or 1.0) for m in members}, torch.get_num_threads())
    for m in members:
        generate_alone(m, prompt, 4)
    began = time.perf_counter()
    for m in members:
        generate_alone(m, prompt, tokens)
    in_turn = time.perf_counter() - began

    def alone(m: Any) -> None:
        torch.get_num_threads()  # see workers._set_up: settle this thread's count, then set its share
        torch.set_num_threads(shares[m.name])
        generate_alone(m, prompt, tokens)

    cores = torch.get_num_threads()
    threads = [threading.Thread(target=alone, args=(m,)) for m in members]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    in_threads = time.perf_counter() - began
    torch.set_num_threads(cores)
    del members

    in_processes = race_in_processes(
        _decode_child, [(n, dtype, shares[n], prompt, tokens) for n in names], timeout=600
    )
    return {
        "tokens": tokens,
        "dtype": dtype,
        "thread_shares": shares,
        "in_turn_s": in_turn,
        "threads_s": in_threads,
        "processes_s": in_processes,
        "threads_speedup": in_turn / in_threads,
        "processes_speedup": in_turn / in_processes,
    }


def _decode_child(
    name: str, dtype: str, share: int, prompt: str, tokens: int, ready: Any, results: Any, go: Any
) -> None:
    import torch

    from ..models.loading import load_member

    torch.set_num_threads(share)
    member = load_member(name, dtype=dtype)
    generate_alone(member, prompt, 4)
    ready.put(name)
    go.wait()
    generate_alone(member, prompt, tokens)
    results.put(name)


# -- report --------------------------------------------------------------------------------------------


def format_table(report: dict[str, Any]) -> str:
    before, after = report["load_average_before"][0], report["load_average_after"][0]
    lines = [
        f"CPU: {report['cpu_model']} ({report['cpu_count']} cores, {report['torch_threads']} torch threads), "
        f"load average {before:.2f} before, {after:.2f} after",
        f"models: {', '.join(f'{m} ({d})' for m, d in report['dtypes'].items())}; "
        f"thread shares at once: {report['thread_shares']}",
        f"{report['max_new_tokens']} tokens, L = {report['segment_len']}",
        "",
    ]
    for name, s in report["single"].items():
        lines.append(
            f"  {name:24} alone: {1000 * s['s_per_token']:6.1f} ms/token, "
            f"first {report['segment_len']} tokens {s['first_segment_s']:.3f} s"
        )
    lines += modes_floor_lines(report)
    lines += [
        f"  sum of members alone {1000 * report['single_sum_s_per_token']:.1f} ms/token, slowest "
        f"{1000 * report['slowest_single_s_per_token']:.1f}",
        "",
        f"{'mode':26} {'ms/tok':>7} {'×sum':>6} {'×slowest':>8} {'late/early':>10} {'1st cand':>8} "
        f"{'1st seg':>7} {'×slowest':>8} {'drafters':>8} {'speedup':>7}",
    ]
    for name, m in report["modes"].items():
        speedup = f"{m['speedup_vs_in_turn']:.2f}×" if "speedup_vs_in_turn" in m else ""
        lines.append(
            f"{name:26} {1000 * m['s_per_token']:7.1f} {m['overhead_vs_single_sum']:6.2f} "
            f"{m['overhead_vs_slowest']:8.2f} {m['round_time_ratio_late_early']:10.2f} "
            f"{m['first_candidate_s']:8.2f} {m['first_segment_s']:7.2f} {m['first_segment_ratio']:8.2f} "
            f"{m['drafters_per_round']:8.2f} {speedup:>7}"
        )
    saved = ", ".join(f"{m.get('decode_steps_saved', 'n/a')}" for m in report["modes"].values())
    lines.append(f"decode steps saved by taking over trimmed tokens, per mode: {saved}")
    on = report["modes"]["exit off, parallel on"]
    lines += ["", "targets (exit off, members at the same time):"]
    for key, bound in TARGETS.items():
        value = on[key]
        verdict = "PASS" if math.isfinite(value) and value <= bound else "MISS"
        lines.append(f"  {key:30} {value:6.3f} ≤ {bound}  {verdict}")
    for name, m in report["modes"].items():
        if "same_answer_as_in_turn" in m:
            turns = report["modes"][
                name.replace("parallel on", "parallel off").replace("processes", "parallel off")
            ]["answer"]
            lines.append(
                f"{name}: same answer as in turn: {m['same_answer_as_in_turn']} (the first "
                f"{m['common_prefix_chars']} of {len(turns)} characters agree; one thread per member "
                "sums in another order than two, so a near tie can go the other way)"
            )
    w = report.get("workers")
    if w:
        lines += [
            "",
            f"bare decoding, {w['tokens']} tokens each ({w['dtype']}): in turn {w['in_turn_s']:.2f} s, "
            f"threads {w['threads_s']:.2f} s ({w['threads_speedup']:.2f}×), "
            f"processes {w['processes_s']:.2f} s ({w['processes_speedup']:.2f}×)",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m specfuse.bench concurrency",
        description="Members in turn against members at the same time (threads with core shares), "
        "exit off and on, beside each member alone; and threads against processes for bare decoding.",
    )
    add_loading_flags(parser, only=("models", "dtype"), defaults={"models": None})
    add_settings(parser, only=("max_new_tokens", "segment_len"), defaults={"max_new_tokens": 300})
    parser.add_argument("--repeats", type=int, default=3, help="first-segment runs per mode (median)")
    parser.add_argument("--prompt", default=LONG_PROMPT, help="the prompt (default: a long numbered list)")
    parser.add_argument("--no-workers", action="store_true", help="skip the threads-vs-processes timing")
    parser.add_argument(
        "--no-processes", action="store_true", help="skip the ensemble with one worker process per member"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..models.placement import load_members, tqdm_progress

    try:
        names = parse_models(args.models, hub=False)
        members = load_members(names, dtype=args.dtype, progress=tqdm_progress("loading"))
        report = run_concurrency(
            members,
            prompt=args.prompt,
            max_new_tokens=args.max_new_tokens,
            segment_len=args.segment_len,
            repeats=args.repeats,
        )
        if not args.no_processes:
            report["modes"]["exit off, processes"] = time_in_processes(
                report, names, args.dtype, args.repeats
            )
        if not args.no_workers:
            del members
            report["workers"] = compare_workers(names, args.dtype, min(60, args.max_new_tokens), args.prompt)
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report["command"] = " ".join(["python -m specfuse.bench concurrency", *(argv or sys.argv[1:])])
    write_report(report, format_table(report), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
