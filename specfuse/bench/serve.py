"""Many clients at once through the live API: `python -m specfuse.bench serve`.

1, 4, 8 and 16 concurrent clients send requests (the app's example prompts, in turn, so every level
asks the same mix) as streamed chat completions to a server on loopback (specfuse.serve: one
Scheduler, one rolling batch); one client is the one-at-a-time baseline. Each client sends
--per-client requests, one after another, so that a level keeps its clients busy for most of its
time: with a fixed list shorter than that, the batch drains through much of the level (answers end
at different lengths) and the figure is no longer that of N clients at once. Per level: aggregate
tokens/s, each request's time to first segment (its first streamed chunk with text) and total time,
median and p95, in one run, with the load average beside them.

The server's default config is the benchmark's (--segment-len, the answer budget) with any `--set
KEY=VALUE` on top (eval/variants.py); the table's header says which settings differ, and --quantize.

`--shapes real --device cuda` serves bench gpu's random-weight members with the real shapes of
Qwen2.5-7B, Llama-3.1-8B and Gemma-2-9B instead (serve_shapes.py: nothing downloaded); on a GPU the
warm-up runs a whole answer alone and a batch of every client at once, and each level records its
peak GPU memory. `--deadline` bounds a run: no request is sent after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import EnsembleConfig
from ..engine.operator import ServerSettings
from ..errors import SpecfuseError
from ..eval.problems import OPEN_PROMPTS
from ..eval.variants import add_set_option
from ..flags import Parser, add_loading_flags, add_settings, command_line
from ..heap import freeze_survivors
from ..members.process import ProcessMember
from . import ceiling
from .measure import cpu_model, load_named, write_outputs
from .serve_report import MIN_REQUESTS, PER_CLIENT, format_table, listed, parted_at
from .serve_shapes import capture_steps, encoder, load_shapes, machine, measured, on_gpu, shapes_config
from .shapes import SHAPES

log = logging.getLogger(__name__)

# The app's example prompts (studio/panels.py EXAMPLES): the evaluation's first four open-ended
# prompts, a fixed list, so that the figures do not move when the app's examples do.
PROMPTS = OPEN_PROMPTS[:4]
LEVELS = (1, 4, 8, 16)
# What picks the CPU kernels: how an AVX2-only CPU's runs are reproduced on one with AVX-512 (docs/serve.md)
KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "LLAMA_CPP_LIB_PATH", "OMP_NUM_THREADS")
TARGETS = {"aggregate_speedup_at_8": 3.0, "p95_first_segment_ratio_at_8": 3.0}  # ≥ 3, ≤ 3


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between the closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def one_request(
    url: str, prompt: str, max_tokens: int, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One streamed chat completion; the times a client sees, from sending to each chunk. `settings`:
    run settings of this request alone (the API's `specfuse` object) over the server's defaults."""
    import httpx

    body: dict[str, Any] = {
        "model": "specfuse",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if settings:
        body["specfuse"] = settings
    began = time.perf_counter()
    first = math.nan
    text, tokens, rounds, gated = "", 0, 0, 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=3600) as response:
        if response.status_code != 200:
            raise SpecfuseError(f"the server answered {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise SpecfuseError(f"the stream ended with an error: {chunk['error']['message']}")
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content") or ""
                if piece and math.isnan(first):
                    first = time.perf_counter() - began
                text += piece
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("specfuse"):  # with the finish_reason chunk: the gate's share of the rounds
                rounds, gated = (chunk["specfuse"].get(k, 0) for k in ("rounds", "gated_rounds"))
    return {"prompt": prompt, "first_segment_s": first, "total_s": time.perf_counter() - began,
            "tokens": tokens, "text": text, "rounds": rounds, "gated_rounds": gated}  # fmt: skip


def run_level(
    url: str,
    clients: int,
    requests: Sequence[str],
    max_tokens: int,
    stop_at: float | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`clients` threads take the requests from one line, each sending its next when its last ends;
    none sends another once perf_counter() passes `stop_at` (the requests under way finish).
    `settings`: each request's own run settings (one_request)."""
    todo: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
    for item in enumerate(requests):
        todo.put(item)
    done: dict[int, dict[str, Any]] = {}
    errors: list[str] = []

    def client() -> None:
        while stop_at is None or time.perf_counter() < stop_at:
            try:
                i, prompt = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done[i] = one_request(url, prompt, max_tokens, settings)
            except Exception as e:  # reported, never hidden
                errors.append(f"{type(e).__name__}: {e}")

    load_before = os.getloadavg()
    began = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    runs = [done[i] for i in sorted(done)]
    firsts = [r["first_segment_s"] for r in runs if not math.isnan(r["first_segment_s"])]
    totals = [r["total_s"] for r in runs]
    tokens = sum(r["tokens"] for r in runs)
    rounds = sum(r.get("rounds", 0) for r in runs)
    sent = len(runs) + len(errors)
    return {
        "clients": clients,
        "requests": sent,
        "cut_short": sent < len(requests),  # the deadline came first: `requests` were sent of these
        "requests_planned": len(requests),
        "errors": errors,
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else math.nan,
        "rounds": rounds,
        # config gate: the share of rounds a sure gatekeeper played alone (0 with the gate off)
        "gated_share": sum(r.get("gated_rounds", 0) for r in runs) / rounds if rounds else 0.0,
        "first_segment_median_s": statistics.median(firsts) if firsts else math.nan,
        "first_segment_p95_s": percentile(firsts, 0.95),
        "total_median_s": statistics.median(totals) if totals else math.nan,
        "total_p95_s": percentile(totals, 0.95),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "prompts": [r["prompt"] for r in runs],
        "answers": [r["text"] for r in runs],
    }


def run_serve(
    members: Sequence[Any],
    *,
    levels: Sequence[int] = LEVELS,
    per_client: int = PER_CLIENT,
    requests: int | None = None,
    max_tokens: int = 64,
    config: EnsembleConfig | None = None,
    batch_size: int | None = None,
    join_wait: float | None = None,
    min_requests: int = MIN_REQUESTS,
    stop_at: float | None = None,
    profile: bool = False,
    parallel: str = "auto",
    against: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every level against one live server over `members`; returns the JSON-ready report. Each
    level sends `per_client` requests per client (at least `min_requests`), or `requests` if given.
    Past `stop_at` (a perf_counter() time) no request is sent: the level under way ends with its
    requests in flight, and the levels after it are skipped (listed in the report's "skipped").
    `profile`: each level also says where its time went (profile_report.py). `against`: settings sent
    with each request to run every level again right after, on the same server (compare_to_default)."""
    from ..engine import DEFAULT_JOIN_WAIT, Scheduler
    from ..serve.api import create_app

    def count(clients: int) -> int:
        return requests if requests is not None else max(clients * per_client, min_requests)

    size = batch_size or max(levels)
    wait = DEFAULT_JOIN_WAIT if join_wait is None else join_wait
    queue = max(levels) + count(max(levels))
    scheduler = Scheduler(members, config, batch_size=size, queue=queue, join_wait=wait, parallel=parallel)
    results: dict[str, dict[str, Any]] = {}
    contrast: dict[str, dict[str, Any]] = {}  # the levels again, under `against`
    skipped: list[int] = []
    try:
        with running(create_app(scheduler)) as url:
            warm_up(url, scheduler.config, max(levels), max_tokens, full=bool(on_gpu(members)))
            _say("warmed up")
            for c in levels:
                if stop_at is not None and time.perf_counter() >= stop_at:
                    skipped.append(c)
                    continue
                mix = [PROMPTS[i % len(PROMPTS)] for i in range(count(c))]
                results[str(c)] = measured(members, profile, run_level, url, c, mix, max_tokens, stop_at)
                _progress(results[str(c)])
                if against:
                    contrast[str(c)] = run_level(url, c, mix, max_tokens, stop_at, settings=against)
                    _progress(contrast[str(c)], "under " + listed(against))
    finally:
        scheduler.close()
    if not results:
        raise SpecfuseError("the deadline passed before the first level began")
    encode = encoder(members[0])  # its tokens count where batched answers part from solo ones
    compare_to_solo(results, encode)
    compare_to_default(contrast, results, encode)
    return {
        "members": [m.name for m in members],
        "parted_in": members[0].name if encode is not None else None,
        "parameters": {m.name: m.parameters for m in members},
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        **machine(members),
        "batch_size": size,
        "per_client": per_client if requests is None else None,
        "min_requests": min_requests if requests is None else None,
        "join_wait": wait,
        "parallel": parallel,
        "processes": any(isinstance(m, ProcessMember) for m in members),
        "max_tokens": max_tokens,
        "config": scheduler.config.to_dict(),
        "levels": results,
        "skipped": skipped,
        **({"against": {"settings": against, "levels": contrast}} if against else {}),
    }


def warm_up(url: str, config: EnsembleConfig, clients: int, max_tokens: int, full: bool) -> None:
    """First calls allocate and pick kernels. On a CPU one short request; on a GPU (full) one
    request of the whole budget alone, then `clients` at once for two segments: the first long run
    pays for cudaMalloc as its caches grow (docs/gpu.md), and a batch of every size the levels reach."""
    if not full:
        one_request(url, PROMPTS[0], 8)
        return
    one_request(url, PROMPTS[0], max_tokens)
    burst = [PROMPTS[i % len(PROMPTS)] for i in range(clients)]
    errors = run_level(url, clients, burst, min(max_tokens, 2 * config.segment_len))["errors"]
    if errors:  # a batch of them fails (out of memory?): say so now, not once per level
        raise SpecfuseError(f"the warm-up of {clients} clients at once failed: {errors[0]}")


def compare_to_solo(
    results: dict[str, dict[str, Any]], encode: Callable[[str], Sequence[int]] | None = None
) -> None:
    """Each level against the first (one at a time): tokens/s, p95 first segment against the solo
    median, answers equal to the solo answer to the same prompt, and where each other answer parts
    from it (`parted_at`: the first differing token in `encode`'s tokens, None: equal)."""
    solo = next(iter(results.values()))
    solo_answer = dict(zip(solo["prompts"], solo["answers"]))
    for r in results.values():
        r["aggregate_speedup"] = (
            r["tokens_per_s"] / solo["tokens_per_s"] if solo["tokens_per_s"] else math.nan
        )
        r["p95_first_segment_ratio"] = r["first_segment_p95_s"] / solo["first_segment_median_s"]
        r["same_answers_as_one_at_a_time"] = sum(
            solo_answer.get(p) == a for p, a in zip(r["prompts"], r["answers"])
        )
        pairs = [(solo_answer[p], a) for p, a in zip(r["prompts"], r["answers"]) if p in solo_answer]
        r["parted_at"] = [parted_at(alone, batched, encode) for alone, batched in pairs]


def compare_to_default(
    contrast: dict[str, dict[str, Any]],
    results: dict[str, dict[str, Any]],
    encode: Callable[[str], Sequence[int]] | None = None,
) -> None:
    """`--against`'s levels: each against its own first level (compare_to_solo), and its tokens/s
    over the same level's under the default settings (`speedup_over_default`)."""
    if not contrast:
        return
    compare_to_solo(contrast, encode)
    for level, r in contrast.items():
        base = results[level]["tokens_per_s"]
        r["speedup_over_default"] = r["tokens_per_s"] / base if base else math.nan


_BEGAN = time.perf_counter()


def _say(line: str) -> None:
    """A line on stderr as the benchmark goes, with the seconds since the import (how far it got)."""
    print(f"[{time.perf_counter() - _BEGAN:6.1f} s] {line}", file=sys.stderr, flush=True)


def _progress(level: dict[str, Any], under: str = "") -> None:
    _say(
        f"{level['clients']} clients{' ' + under if under else ''}: "
        f"{level['requests']} requests in {level['wall_s']:.1f} s, "
        f"{level['tokens_per_s']:.2f} tokens/s, first segment p95 {level['first_segment_p95_s']:.2f} s, "
        f"{len(level['errors'])} errors" + (" (cut short by the deadline)" if level["cut_short"] else "")
    )


def _parser() -> Parser:
    parser = Parser(
        prog="python -m specfuse.bench serve",
        description="1, 4, 8 and 16 concurrent clients through the live API against one at a time.",
    )
    add = parser.add_argument
    loading = {"models": None, "quantize": "none", "processes": False}
    add_loading_flags(
        parser, only=("models", "dtype", "quantize", "device", "decode", "processes"), defaults=loading
    )
    add(
        "--shapes",
        choices=sorted(SHAPES),
        default=None,
        help="instead of --models: bench gpu's random-weight members, real (Qwen2.5-7B, Llama-3.1-8B, "
        "Gemma-2-9B shapes), trio, tiny or layers (the real layer counts at tiny widths: the host's work "
        "on a CPU); nothing is downloaded",
    )
    add("--levels", default=",".join(map(str, LEVELS)), help="client counts (first: baseline)")
    add(
        "--per-client",
        type=int,
        default=PER_CLIENT,
        help=f"requests each client sends in turn (default {PER_CLIENT}; at least --min-requests a level)",
    )
    add("--min-requests", type=int, default=MIN_REQUESTS, help=f"fewest a level (default {MIN_REQUESTS})")
    add("--requests", type=int, default=None, help="instead: the same number of requests at every level")
    add("--max-tokens", type=int, default=64, help="answer budget per request (default 64)")
    add_settings(parser, only=("segment_len",))
    add_set_option(
        parser,
        "a run setting of the server's default config, KEY an EnsembleConfig field, e.g. "
        "verify=disagree, stop_strings=a|b (repeatable; applied after --segment-len)",
    )
    add_set_option(
        parser,
        "measure every level twice in this run, right after the first time with these run settings "
        "sent in each request, e.g. gate=true (repeatable); the report gives each level's ratio",
        flag="--against",
        dest="against",
    )
    operator = {"batch_size": None, "join_wait": None}  # None: the largest level; the server's own
    shown = {"batch_size": "the largest level", "join_wait": "the server's own"}
    add_settings(
        parser,
        of=ServerSettings,
        only=("batch_size", "join_wait", "parallel"),
        defaults=operator,
        shown=shown,
    )
    profile_help = (
        "also where each level's time went: phases, member calls, forward passes, llama_decode calls"
    )
    add("--profile", action="store_true", help=f"{profile_help}, threads, GFLOP/s (docs/serve.md)")
    add(
        "--deadline",
        type=float,
        default=None,
        help="seconds from the start: no request is sent after it (the ones under way finish, later "
        "levels are skipped and the report says so)",
    )
    add("--quick", action="store_true", help="levels 1,4,8, 8 requests of 32 tokens each")
    off = ", ".join(ceiling.SLOT_OPTIONS)
    add("--slots-off", nargs="+", default=[], choices=ceiling.SLOT_OPTIONS, metavar="OPTION",
        help=f"turn off {off} in the KV slots (--decode graphs), to measure each (docs/gpu.md)")  # fmt: skip
    add(
        "--no-freeze",
        action="store_true",
        help="leave what start-up made in the garbage collector's full passes (specfuse-serve freezes it)",
    )
    add("--out", type=Path, default=None, help="write OUT.json and OUT.txt")
    return parser


def _members(args: Any, max_tokens: int) -> tuple[list[Any], EnsembleConfig]:
    """The members (catalogue models, or --shapes built here) and the server's default config."""
    if args.shapes is None:
        base = EnsembleConfig(segment_len=args.segment_len, max_new_tokens=max_tokens)
    else:
        base = shapes_config(args.segment_len, max_tokens)
    config = replace(base, **dict(args.settings))  # checked before loading: bad settings fail at once
    replace(config, **dict(args.against))  # --against's likewise
    if args.shapes is not None:
        if args.models or args.quantize != "none":
            raise SpecfuseError("--shapes builds its own members: leave out --models and --quantize")
        return load_shapes(args.shapes, args.device, args.dtype, args.decode, args.processes), config
    named = load_named(
        args.models,
        device=args.device,
        dtype=args.dtype,
        quantize=args.quantize,
        decode=args.decode,
        processes=args.processes,
    )
    return named, config


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    began = time.perf_counter()
    levels = [int(c) for c in args.levels.split(",") if c]
    requests, max_tokens = args.requests, args.max_tokens
    if args.per_client < 1 or args.min_requests < 1 or (requests is not None and requests < 1):
        parser.error("--per-client, --min-requests and --requests must be at least 1")
    if args.quick:
        levels, requests, max_tokens = [1, 4, 8], 8, 32
    try:
        members, config = _members(args, max_tokens)
        ceiling.slots_off(members, args.slots_off)
        capture_steps(members, _say)
        _say(f"{len(members)} members ready in {time.perf_counter() - began:.1f} s")
        frozen = 0 if args.no_freeze else freeze_survivors(_say)  # as specfuse-serve does once they are
        report = run_serve(
            members, levels=levels, per_client=args.per_client, requests=requests,
            max_tokens=max_tokens, config=config, batch_size=args.batch_size, join_wait=args.join_wait,
            min_requests=args.min_requests,
            stop_at=None if args.deadline is None else began + args.deadline, profile=args.profile,
            parallel=args.parallel, against=dict(args.against) or None,
        )  # fmt: skip
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report["quantize"], report["gc_frozen"] = args.quantize, frozen
    report["environment"] = {k: os.environ[k] for k in KERNEL_SETTINGS if k in os.environ}
    report["shapes"] = args.shapes
    report.update(ceiling.measure(members))  # the bandwidth, after the levels: their figures are unaffected
    report["deadline_s"] = args.deadline
    report["seconds"] = time.perf_counter() - began
    report["command"] = command_line(parser.prog, argv)
    table = format_table(report)
    write_outputs(report, table, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())


@contextlib.contextmanager
def running(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The app served by uvicorn on a thread of this process, for as long as the block lasts; yields
    its base URL (port 0: a free port). For tests and benchmarks that need a live server."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="specfuse-uvicorn", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise SpecfuseError(f"the server did not start on {host}:{sock.getsockname()[1]}")
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
