"""What the benchmarks measure and how: timed runs, round and phase figures, members alone, modes
(in turn, at once, in processes), peak memory and the report file. Shared by every benchmark.

Knows nothing about which benchmark asks, nor about answer quality.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import EnsembleConfig, MemberSettings
from ..engine import Ensemble
from ..errors import SpecfuseError
from ..flags import Parser, add_loading_flags, add_settings, command_line, parse_models
from ..members.process import take_place, worker_context
from ..members.workers import run_concurrently
from ..records import Round
from .floor import decoder

log = logging.getLogger(__name__)

EARLY, LATE = (2, 11), (31, 40)  # rounds compared by round_time_ratio_late_early (inclusive)


@dataclass(frozen=True)
class TimedRun:
    """One ensemble run as the benchmark saw it: its rounds and the wall clock around stream()."""

    rounds: tuple[Round, ...]
    seconds: float  # from calling stream() (prompt prefill included) to the last round
    first_segment_s: float  # from calling stream() to the first round
    first_candidate_s: float = math.nan  # from calling stream() to the first candidate (Draft)


# -- small measurements --------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's "model name" from /proc/cpuinfo (or platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def peak_rss_gb() -> float:
    """This process's peak resident set size so far, in GB.

    From VmHWM in /proc/self/status: ru_maxrss would do, but Linux carries it across fork and exec,
    so a child started by a big parent reports the parent's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024**2  # kB
    except OSError:
        pass
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * (1 if sys.platform != "darwin" else 1 / 1024) / 1024**2


def timed_stream(ensemble: Ensemble, prompt: str, config: EnsembleConfig) -> TimedRun:
    """Run the ensemble to the end, timing from the call (members' prefill included)."""
    began = time.perf_counter()
    first = first_candidate = math.nan
    rounds: list[Round] = []
    for event in ensemble.events(prompt, config):
        if math.isnan(first_candidate):
            first_candidate = time.perf_counter() - began
        if isinstance(event, Round):
            if not rounds:
                first = time.perf_counter() - began
            rounds.append(event)
    return TimedRun(tuple(rounds), time.perf_counter() - began, first, first_candidate)


def generate_alone(member: Any, prompt: str, max_new_tokens: int) -> tuple[int, float]:
    """(new tokens, seconds) of the member alone: transformers' generate, greedy, with a KV cache.

    The prompt is the member's own context (`member.prompt_ids`), as in the ensemble. The model's
    generation defaults are replaced by a plain config so that no repetition penalty leaks in.
    """
    member = decoder(member)
    if hasattr(member, "generate_alone"):  # a member not run by transformers times its own decoding
        return member.generate_alone(prompt, max_new_tokens)  # type: ignore[no-any-return]
    import torch
    from transformers import GenerationConfig

    ids = torch.tensor([member.prompt_ids(prompt)], device=member.device)
    pad = member.tokenizer.pad_token_id
    eos = sorted(member.stop_token_ids)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,  # same length for every member: no early end-of-sequence
        use_cache=True,
        eos_token_id=eos,
        pad_token_id=pad if pad is not None else eos[0],
    )
    began = time.perf_counter()
    with torch.inference_mode():
        out = member.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config
        )
    return int(out.shape[1] - ids.shape[1]), time.perf_counter() - began


def draft_alone(member: Any, prompt: str, max_new_tokens: int) -> tuple[int, float]:
    """(new tokens, seconds) of an in-process member's own drafting, the engine's path (`draft`:
    greedy, one request, in its static cache where it compiles its decoding): the prompt is read
    first, untimed, so the seconds are decoding alone."""
    state = member.start(prompt, MemberSettings(max_new_tokens=max_new_tokens))
    if str(member.device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(member.device)
    began = time.perf_counter()
    candidate = member.draft(state, max_new_tokens)  # each step reads its token back: synchronized
    return candidate.num_tokens, time.perf_counter() - began


def members_alone(
    members: Sequence[Any],
    prompt: str,
    max_new_tokens: int,
    segment_len: int,
    repeats: int,
    memory: Any = None,
    alone: Callable[[Any, str, int], tuple[int, float]] = generate_alone,
) -> dict[str, dict[str, float]]:
    """Each member alone, one after another: its time per token over `max_new_tokens` and its first
    `segment_len` tokens (median of `repeats`), timed by `alone` (transformers' generate, or
    draft_alone). With `memory` (start() / peak_gb()), each member's peak memory too. What every
    benchmark sets the ensemble beside."""
    singles = {}
    for m in members:
        if memory is not None:
            memory.start()
        n, seconds = alone(m, prompt, max_new_tokens)
        first = statistics.median(alone(m, prompt, segment_len)[1] for _ in range(repeats))
        singles[m.name] = {
            "tokens": n,
            "seconds": seconds,
            "s_per_token": seconds / max(n, 1),
            "tokens_per_s": n / seconds,
            "first_segment_s": first,
        }
        if memory is not None:
            singles[m.name]["peak_gb"] = memory.peak_gb()
    return singles


def alone_summary(singles: dict[str, dict[str, float]]) -> dict[str, float]:
    """The members-alone figures every report carries: their sum, the slowest, the slowest first segment."""
    return {
        "single_sum_s_per_token": sum(s["s_per_token"] for s in singles.values()),
        "slowest_single_s_per_token": max(s["s_per_token"] for s in singles.values()),
        "slowest_single_first_segment_s": max(s["first_segment_s"] for s in singles.values()),
    }


def mean_round_seconds(rounds: Sequence[Round], first: int, last: int) -> float:
    """Mean wall time of rounds first..last (k, inclusive) that exist; nan when none do."""
    picked = [r.seconds for r in rounds if first <= r.k <= last]
    return statistics.fmean(picked) if picked else math.nan


def median_round_seconds(rounds: Sequence[Round], first: int, last: int) -> float:
    picked = [r.seconds for r in rounds if first <= r.k <= last]
    return statistics.median(picked) if picked else math.nan


def late_early_ranges(n_rounds: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The issue's rounds 2–11 and 31–40; for a shorter run, the last ten rounds (or halves) that exist."""
    if n_rounds >= LATE[1]:
        return EARLY, LATE
    if n_rounds >= 2 * EARLY[1] - 1:
        return EARLY, (n_rounds - 9, n_rounds)
    half = max(1, (n_rounds - 1) // 2)  # a short run: its first and second halves, round 1 left out
    return (2, 1 + half), (n_rounds - half + 1, n_rounds)


def phase_shares(rounds: Sequence[Round], concurrent: bool = False) -> dict[str, float]:
    """Each phase's share of the rounds' wall time: drafting, verifying, accepting, and the engine's
    own work (the rest). Members in turn spend a phase's wall time one after another (the sum of
    their times); members at once overlap, so a phase lasts as long as its slowest member. Summing
    member time regardless (as before) gave shares past 1 with members at once (draft 1.96, engine
    -1.41 in one run)."""
    total = sum(r.seconds for r in rounds) or math.nan

    def wall(times: list[float]) -> float:
        return max(times, default=0.0) if concurrent else sum(times)

    draft = sum(wall([t.draft_s for t in r.timings]) for r in rounds)
    verify = sum(wall([t.verify_s for t in r.timings]) for r in rounds)
    accept = sum(wall([t.accept_s for t in r.timings]) for r in rounds)
    return {
        "draft_share": draft / total,
        "verify_share": verify / total,
        "accept_share": accept / total,
        "engine_share": (total - draft - verify - accept) / total,
    }


def accept_ms_per_member(rounds: Sequence[Round], last_k: int | None = None) -> dict[str, float]:
    """Mean accept time per round for each member, in ms (rounds that accepted: not the last)."""
    out: dict[str, list[float]] = {}
    for r in rounds:
        if r.stop_reason is not None or (last_k is not None and r.k > last_k):
            continue
        for t in r.timings:
            out.setdefault(t.member, []).append(t.accept_s * 1000)
    return {m: statistics.fmean(v) for m, v in out.items() if v}


def phase_ms_per_member(rounds: Sequence[Round]) -> dict[str, dict[str, float]]:
    """Mean draft / verify / accept ms per round for each member, beside the rounds it won and the
    tokens it took over from its trimmed drafts (a winner's next draft may begin with them, fed
    without decoding: a cost of its own in the draft's time)."""
    out: dict[str, dict[str, float]] = {}
    for name in rounds[0].members:
        rows = [t for r in rounds for t in r.timings if t.member == name]
        out[name] = {
            phase: 1000 * statistics.fmean(getattr(t, phase) for t in rows)
            for phase in ("draft_s", "verify_s", "accept_s")
        }
        out[name]["wins"] = sum(r.winner.member == name for r in rounds)
        out[name]["tokens_taken_over"] = sum(
            c.reused_tokens for r in rounds for c in r.candidates if c.member == name
        )
    return out


def tokens_of(rounds: Sequence[Round]) -> int:
    return sum(r.winner.num_tokens for r in rounds)


def mode_figures(
    run: TimedRun, firsts: Sequence[TimedRun], singles: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """One ensemble run against its members alone (`singles`: each one's s_per_token and
    first_segment_s): time per token and its ratio to their sum and to the slowest, the first
    candidate and first segment (medians over the one-round runs `firsts`), late/early rounds, and
    the decode steps saved by taking over trimmed tokens."""
    s_per_token = run.seconds / max(tokens_of(run.rounds), 1)
    first_segment = statistics.median(f.first_segment_s for f in firsts)
    early, late = late_early_ranges(len(run.rounds))
    return {
        "tokens": tokens_of(run.rounds),
        "rounds": len(run.rounds),
        "s_per_token": s_per_token,
        "tokens_per_s": 1 / s_per_token,
        "overhead_vs_single_sum": s_per_token / sum(s["s_per_token"] for s in singles.values()),
        "overhead_vs_slowest": s_per_token / max(s["s_per_token"] for s in singles.values()),
        # The members' floors together: every member decodes every token (exit off), so their sum is
        # the least time per token the ensemble could take on this machine (floor.py).
        "floor_ratio": s_per_token / sum(s.get("floor_s_per_token", math.nan) for s in singles.values()),
        "round_time_ratio_late_early": mean_round_seconds(run.rounds, *late)
        / mean_round_seconds(run.rounds, *early),
        "first_candidate_s": statistics.median(f.first_candidate_s for f in firsts),
        "first_segment_s": first_segment,
        "first_segment_ratio": first_segment / max(s["first_segment_s"] for s in singles.values()),
        "drafters_per_round": statistics.fmean(len(r.active) for r in run.rounds),
        "decode_steps_saved": sum(c.reused_tokens for r in run.rounds for c in r.candidates),
        "answer": run.rounds[-1].text,
    }


def time_mode(
    members: Sequence[Any],
    config: EnsembleConfig,
    prompt: str,
    singles: dict[str, Any],
    repeats: int,
    parallel: str = "auto",
) -> dict[str, Any]:
    """One full run and `repeats` one-round runs of the ensemble, against the members alone, with
    where the full run's rounds spent their time (each phase's share, each member's ms a round)."""
    ensemble = Ensemble(members, config, parallel=parallel)
    run = timed_stream(ensemble, prompt, config)
    firsts = [timed_stream(ensemble, prompt, replace(config, max_rounds=1)) for _ in range(repeats)]
    figures = mode_figures(run, firsts, singles)
    figures["phases"] = phase_shares(run.rounds, concurrent=run_concurrently(members, parallel))
    figures["phase_ms_per_member"] = phase_ms_per_member(run.rounds)
    return figures


def process_mode(
    workers: Sequence[Any], config: EnsembleConfig, prompt: str, singles: dict[str, Any], repeats: int
) -> dict[str, Any]:
    """time_mode for members in worker processes of their own (processes.ProcessMember), after a
    full-length warm-up: their processes are fresh, the other modes' members are not."""
    Ensemble(workers, config).run(prompt)  # members in processes run at once under parallel="auto"
    return time_mode(workers, config, prompt, singles, repeats)


def race_in_processes(child: Any, arguments: Sequence[tuple[Any, ...]], timeout: float) -> float:
    """Seconds from a common start to the last of one worker process per argument tuple finishing.

    Each process runs `child(*arguments, ready, results, go)`: it loads and warms up, puts on
    `ready`, waits for `go`, does the timed work and puts on `results`; loading is not timed. The
    processes fork from the members' fork server (torch imported once: half a fresh interpreter's
    start-up CPU), in this process's environment and folder."""
    context = worker_context()
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    here = (dict(os.environ), os.getcwd())
    procs = [
        context.Process(target=_in_place, args=(*here, child, *args, ready, results, go))
        for args in arguments
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=timeout)
    began = time.perf_counter()
    go.set()
    for _ in procs:
        results.get(timeout=timeout)
    seconds = time.perf_counter() - began
    for p in procs:
        p.join()
    return seconds


def _in_place(env: dict[str, str], cwd: str, child: Any, *args: Any) -> None:
    """`child(*args)` in the parent's environment and folder (a forked worker starts in its server's)."""
    take_place(env, cwd)
    child(*args)


def compare_in_turn(turns: dict[str, Any], at_once: dict[str, Any]) -> None:
    """Add to `at_once` its speed-up over members in turn and how far the two answers agree."""
    at_once["speedup_vs_in_turn"] = turns["s_per_token"] / at_once["s_per_token"]
    at_once["same_answer_as_in_turn"] = turns["answer"] == at_once["answer"]
    at_once["common_prefix_chars"] = len(os.path.commonprefix([turns["answer"], at_once["answer"]]))


def write_report(report: dict[str, Any], table: str, path: Path | None) -> None:
    """Print the table; write the report as JSON to `path` when given."""
    print(table)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, allow_nan=True) + "\n")


def load_named(
    models: Sequence[str] | None,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    quantize: str = "none",
    decode: str = "auto",
    processes: bool = False,
) -> list[Any]:
    """The catalogue members a benchmark's --models names (None: the trio), loaded with a progress bar
    (`processes`: each in a worker process of its own)."""
    from ..models.placement import load_members, tqdm_progress

    names = parse_models(models, hub=False)
    return load_members(
        names,
        device=device,
        dtype=dtype,
        progress=tqdm_progress("loading"),
        quantize=quantize,
        decode=decode,
        processes=processes,
    )


def bench_parser(
    name: str,
    description: str,
    *,
    loading: Sequence[str] = ("models", "dtype", "quantize", "device"),
    quantize: str = "none",
    settings: Sequence[str] = ("segment_len",),
    defaults: dict[str, Any] | None = None,
) -> Parser:
    """`python -m specfuse.bench NAME`'s parser with the flags its members load by (catalogue names,
    no download; --quantize none unless said) and the run settings it varies (flags.py declares them)."""
    parser = Parser(prog=f"python -m specfuse.bench {name}", description=description)
    add_loading_flags(
        parser, only=loading, defaults={"models": None, "quantize": quantize} if loading else {}
    )
    add_settings(parser, only=settings, defaults=defaults)
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.txt")
    return parser


def bench_main(
    parser: Parser,
    args: Any,
    argv: Sequence[str] | None,
    measure: Callable[[list[Any]], dict[str, Any]],
    table: Callable[[dict[str, Any]], str],
) -> int:
    """What every benchmark on the catalogue's members does once its flags are checked: load the
    members --models names, measure, and print (and with --out, write) the report, its command last.
    A SpecfuseError (an unknown model, a bad setting) exits 2 with its one line."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quantize = getattr(args, "quantize", "none")
    try:
        members = load_named(
            args.models, device=getattr(args, "device", "cpu"), dtype=args.dtype, quantize=quantize
        )
        report = measure(members)
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report["quantize"] = quantize
    report["command"] = command_line(parser.prog, argv)
    write_outputs(report, table(report), args.out)
    return 0


def footer(report: dict[str, Any]) -> list[str]:
    """A report's last lines: the load average around it, and the command that made it."""
    lines = []
    if "load_before" in report:
        lines.append(f"load average {report['load_before'][0]:.2f} → {report['load_after'][0]:.2f} (1 min)")
    if "command" in report:
        lines.append(f"command: {report['command']}")
    return lines


def write_outputs(report: dict[str, Any], table: str, out: Path | None) -> None:
    """Print the table; with `out`, write OUT.json (the report) and OUT.txt (the table)."""
    write_report(report, table, out.with_suffix(".json") if out else None)
    if out is not None:
        out.with_suffix(".txt").write_text(table + "\n")


# -- memory of each model alone: one child process each -----------------------------------------------


def rss_alone(names: Sequence[str], dtype: str) -> dict[str, float]:
    """Peak RSS (GB) of a fresh process that imports the stack only ("baseline"), and of one that
    loads each model alone and generates 32 tokens with it."""
    out = {}
    for name in ("baseline", *names):
        cmd = [sys.executable, "-m", "specfuse.bench.core", "--rss-child", name, "--dtype", dtype]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
        if done.returncode != 0:
            raise SpecfuseError(f"measuring {name} alone failed: {done.stderr.strip().splitlines()[-1:]}")
        out[name] = float(json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_gb"])
    return out


def rss_child(name: str, dtype: str) -> None:
    from ..models.loading import load_member

    if name != "baseline":
        member = load_member(name, dtype=dtype)
        generate_alone(member, "Say hello.", 32)
    print(json.dumps({"peak_rss_gb": peak_rss_gb()}))


# -- the benchmark ---------------------------------------------------------------------------------------
