"""The GPU timing benchmark: three random-weight members with real 7–9B shapes, members at once on
CUDA streams against members in turn, beside each member's own `generate`.

    python -m specfuse.bench gpu                      # Qwen2.5-7B, Llama-3.1-8B, Gemma-2-9B shapes, bf16
    python -m specfuse.bench gpu --devices cuda:0,cuda:1,cuda:2   # one member per GPU
    python -m specfuse.bench gpu --shapes tiny --device cpu      # the same code path, in seconds
    python -m specfuse.bench gpu --shapes trio --device cpu      # the default trio's shapes on a CPU
    python -m specfuse.bench gpu --compile            # drafts in a static cache, compiled (CUDA graphs)

Timing does not depend on the weights, so no checkpoint is needed: the models are random-weight
models of the real shapes (shapes.py), whose drafts are printable ASCII text like any other.
Imports only torch, transformers, tokenizers and the engine, so it runs where nothing can be installed.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..config import EnsembleConfig, MemberSettings
from ..engine import Ensemble
from ..errors import SpecfuseError
from ..flags import Parser, add_loading_flags, add_settings
from ..members.process import ProcessMember
from ..prompts import QA_COMPLETION
from .floor import add_floors, bandwidths, cost_line, member_floors
from .gpu_report import format_race, format_table
from .gpu_workers import PROMPT, auto_dtype, build_one, compare_workers, sync
from .measure import (
    alone_summary,
    compare_in_turn,
    draft_alone,
    generate_alone,
    members_alone,
    peak_rss_gb,
    process_mode,
    time_mode,
    write_report,
)
from .shapes import SHAPES, ascii_head, build_model, byte_tokenizer


def build_members(
    shapes: str, devices: Sequence[str], dtype_name: str, compile_decode: bool = False, decode: str = "auto"
) -> list[Any]:
    import torch

    from ..members.hf import HFMember

    dtype = getattr(torch, dtype_name) if dtype_name != "auto" else auto_dtype(devices[0])
    tokenizer = byte_tokenizer()
    members = []
    for i, (name, (arch, values)) in enumerate(SHAPES[shapes].items()):
        device = devices[i % len(devices)]
        model = build_model(arch, values, device, dtype, seed=i)
        ascii_head(model, tokenizer)
        members.append(
            HFMember(
                name,
                model,
                tokenizer,
                prompt_format=QA_COMPLETION,
                device=device,
                compile_decode=compile_decode,
                decode=decode,
            )
        )
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
    return members


def build_process_members(
    shapes: str, devices: Sequence[str], dtype_name: str, compile_decode: bool = False, decode: str = "auto"
) -> list[Any]:
    """The same members as build_members, each built in a worker process of its own, all at once.
    On a CPU the engine gives each process its thread share for every run (workers.MemberWorkers)."""
    import concurrent.futures

    count = len(SHAPES[shapes])
    builds = [
        functools.partial(build_one, shapes, i, devices[i % len(devices)], dtype_name, compile_decode, decode)
        for i in range(count)
    ]
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(ProcessMember, builds))


class _Memory:
    """Peak memory of one phase: per GPU (max_memory_allocated, reset at the start), or RSS on CPU."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.gpus = sorted({d for d in devices if d.startswith("cuda")})

    def start(self) -> None:
        import torch

        for d in self.gpus:
            torch.cuda.reset_peak_memory_stats(d)

    def peak_gb(self) -> float:
        import torch

        if not self.gpus:
            return peak_rss_gb()
        return sum(torch.cuda.max_memory_allocated(d) for d in self.gpus) / 1024**3


def add_process_mode(report: dict[str, Any], workers: Sequence[Any], repeats: int = 3) -> None:
    """Time the ensemble with each member in a process of its own (`processes.ProcessMember`), the
    same members as in `report`'s other modes, and add it as the mode "processes"."""
    import torch

    config = EnsembleConfig(
        segment_len=report["segment_len"],
        max_new_tokens=report["max_new_tokens"],
        exit=False,
        stop_strings=(),
        prior="uniform",
    )
    mode = process_mode(workers, config, report["prompt"], report["single"], repeats)
    gpus = sorted({w.device for w in workers if w.device.startswith("cuda")})
    # Another process's allocations are not this one's to count: the device's memory in use instead.
    used = [torch.cuda.mem_get_info(d) for d in gpus]
    mode["peak_gb"] = sum(total - free for free, total in used) / 1024**3 if gpus else peak_rss_gb()
    compare_in_turn(report["modes"]["off"], mode)
    report["modes"]["processes"] = mode


def run_gpu_bench(
    members: Sequence[Any],
    *,
    prompt: str = PROMPT,
    max_new_tokens: int = 200,
    segment_len: int = 10,
    repeats: int = 3,
    modes: Sequence[str] = ("off", "on"),
) -> dict[str, Any]:
    """Each member alone, then the ensemble in turn ("off") and at once ("on"; exit off), in this
    order, one run. Members that compile their drafts are timed alone by their own drafting (the
    path the ensemble runs), with transformers' generate beside it, and the ensemble in turn once
    more with their drafts eager ("eager"): compiled against eager in one run."""
    import torch

    devices = [m.device for m in members]
    memory = _Memory(devices)
    compiled = [m for m in members if getattr(m, "compiled", None) is not None]
    base = EnsembleConfig(
        segment_len=segment_len, max_new_tokens=max_new_tokens, exit=False, stop_strings=(), prior="uniform"
    )
    _warm_up(members, compiled, base, prompt, max_new_tokens, modes)
    singles = _time_alone(members, compiled, prompt, max_new_tokens, segment_len, repeats, memory)
    bandwidth = bandwidths(members)
    floor_sum = add_floors(singles, member_floors(members, bandwidth))
    for s in singles.values():
        if "bare_step_s" in s:
            s["bare_step_floor_ratio"] = s["bare_step_s"] / s["floor_s_per_token"]
    _progress("alone: " + ", ".join(f"{k} {1000 * v['s_per_token']:.1f} ms/tok" for k, v in singles.items()))

    timed, report = _time_modes(members, compiled, base, prompt, singles, repeats, modes, memory)
    gpu = torch.cuda.get_device_name(devices[0]) if devices[0].startswith("cuda") else "none (CPU)"
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "devices": {m.name: m.device for m in members},
        "dtype": str(members[0].dtype).replace("torch.", ""),
        "parameters": {m.name: m.model.num_parameters() for m in members},
        "prompt": prompt,
        "segment_len": segment_len,
        "max_new_tokens": max_new_tokens,
        "single": singles,
        **alone_summary(singles),
        "bandwidth_bytes_per_s": bandwidth,
        "floor_sum_s_per_token": floor_sum,
        "cost_line": cost_line(singles),  # fixed cost a step, marginal read rate
        "modes": timed,
        "target_overhead_vs_slowest_at_once": 1.3,
        **report,
    }


def _warm_up(
    members: Sequence[Any],
    compiled: Sequence[Any],
    base: EnsembleConfig,
    prompt: str,
    max_new_tokens: int,
    modes: Sequence[str],
) -> None:
    # Warm-up at full length: the first long run on a GPU pays for cudaMalloc as its caches grow (a
    # 200-token generate took 69 ms/token the first time, 25 ms/token the next, on an H100).
    for m in members:
        generate_alone(m, prompt, max_new_tokens)
        if m in compiled:
            draft_alone(m, prompt, max_new_tokens)
        _progress(f"{m.name}: warmed up")
    for parallel in modes:
        # Compiled members: twice, so that every step and block size has compiled at the static
        # cache's final size (the verification passes grow it) before anything is timed.
        for _ in range(2 if compiled else 1):
            Ensemble(members, base, parallel=parallel).run(prompt)
    for m in compiled:
        draft_alone(m, prompt, max_new_tokens)


def _time_alone(
    members: Sequence[Any],
    compiled: Sequence[Any],
    prompt: str,
    max_new_tokens: int,
    segment_len: int,
    repeats: int,
    memory: _Memory,
) -> dict[str, dict[str, Any]]:
    """Each member alone: compiled members by their own drafting, with generate and the bare
    compiled step beside it; the others by generate."""
    alone = draft_alone if compiled else generate_alone
    singles = members_alone(members, prompt, max_new_tokens, segment_len, repeats, memory, alone)
    for m in compiled:
        n, seconds = generate_alone(m, prompt, max_new_tokens)
        singles[m.name]["generate_s_per_token"] = seconds / max(n, 1)
        singles[m.name]["bare_step_s"] = bare_step_s(m, prompt, max_new_tokens)
    return singles


def _time_modes(
    members: Sequence[Any],
    compiled: Sequence[Any],
    base: EnsembleConfig,
    prompt: str,
    singles: dict[str, dict[str, Any]],
    repeats: int,
    modes: Sequence[str],
    memory: _Memory,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The ensemble in each mode, then (compiled members) in turn once more with eager drafts: the
    modes timed, and the report's "compiled" entry where there is one."""
    timed: dict[str, dict[str, Any]] = {}
    for parallel in modes:
        memory.start()
        timed[parallel] = time_mode(members, base, prompt, singles, repeats, parallel)
        timed[parallel]["peak_gb"] = memory.peak_gb()
        _progress(f"mode {parallel}: {1000 * timed[parallel]['s_per_token']:.1f} ms/token")
    if "off" in timed and "on" in timed:
        compare_in_turn(timed["off"], timed["on"])
    report: dict[str, Any] = {}
    if compiled and "off" in timed:
        memory.start()
        with _eager(compiled):
            timed["eager"] = time_mode(members, base, prompt, singles, repeats, "off")
        timed["eager"]["peak_gb"] = memory.peak_gb()
        report["compiled"] = compiled_summary(compiled, timed["off"], timed["eager"])
    return timed, report


def bare_step_s(member: Any, prompt: str, max_new_tokens: int, steps: int = 50) -> float:
    """Seconds a member's decoding step takes with nothing around it: its compiled step (the decoder
    layers' graph) and the output head after it, `steps` times at one position, read back once at the
    end. It reads what a token's floor counts (every weight once), so beside the member's time per
    token in its own drafting it splits a token's cost into the step's own work (on a GPU, its
    kernels) and what the draft loop adds between steps (picking the token, reading it back, the stop
    checks). A GPU run before the head was added timed the graph alone
    (results/bench/gpu-h100-verify.json)."""
    import torch

    decoder = member.compiled
    state = member.start(prompt, MemberSettings(max_new_tokens=max_new_tokens))
    member.draft(state, 2)  # its second token is a compiled step: the static cache holds the prompt
    token, position = state.ids[-1], len(state.ids)
    with torch.inference_mode():
        for _ in range(3):
            member.head.logits(decoder.replay(token, position))
        sync(str(member.device))
        began = time.perf_counter()
        for _ in range(steps):
            member.head.logits(decoder.replay(token, position))
        sync(str(member.device))
    return (time.perf_counter() - began) / steps


def compiled_summary(
    members: Sequence[Any], compiled: dict[str, Any], eager: dict[str, Any]
) -> dict[str, Any]:
    """The ensemble in turn with compiled drafts against eager ones, and how each member's drafts
    decoded (static: compiled; eager: fell back), with the reason a member turned compiling off."""
    import torch

    skips = torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)
    return {
        "speedup_in_turn": eager["s_per_token"] / compiled["s_per_token"],
        "same_answer_as_eager": compiled["answer"] == eager["answer"],
        "drafts": {m.name: dict(m.compiled.counts) for m in members},
        "verified": {m.name: m.compiled.verified for m in members},  # passes run compiled
        "disabled": {m.name: m.compiled.disabled or m.compiled.verify_off for m in members},
        "cudagraph_skips": int(skips),  # inductor's count of graphs it ran without CUDA graphs
    }


@contextlib.contextmanager
def _eager(members: Sequence[Any]) -> Iterator[None]:
    """Members draft eagerly inside (their compiled decoders and KV slots set aside, then put back)."""
    saved = [(m.compiled, m.slots) for m in members]
    for m in members:
        m.compiled = m.slots = None
    try:
        yield
    finally:
        for m, (decoder, slots) in zip(members, saved):
            m.compiled, m.slots = decoder, slots


_BEGAN = time.perf_counter()


def _progress(line: str) -> None:
    """A line on stderr as the benchmark goes, with the seconds since it began (a run cut short
    still shows how far it got, and how long compiling took)."""
    print(f"[{time.perf_counter() - _BEGAN:6.1f} s] {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    devices = [d.strip() for d in (args.devices or args.device).split(",") if d.strip()]
    try:
        _check_devices(args, devices)
        if args.workers:
            race = compare_workers(args.shapes, devices[0], args.dtype, args.max_new_tokens)
            print(format_race(race))
            if args.json:
                args.json.write_text(json.dumps(race, indent=1))
            return 0
        report = _run(args, devices)
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report["command"] = " ".join(
        ["python -m specfuse.bench gpu", *(argv if argv is not None else sys.argv[1:])]
    )
    write_report(report, format_table(report), args.json)
    return 0


def _parser() -> Parser:
    parser = Parser(
        prog="python -m specfuse.bench gpu",
        description="Three random-weight members with real 7-9B shapes: members at once on CUDA streams "
        "against members in turn, beside each member's generate alone.",
    )
    parser.add_argument(
        "--shapes",
        choices=sorted(SHAPES),
        default="real",
        help="real (7-9B), trio (the default trio's configs, for a CPU with many cores) or tiny",
    )
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:K or cpu: every member there")
    parser.add_argument("--devices", default=None, help="one device per member, e.g. cuda:0,cuda:1,cuda:2")
    add_loading_flags(parser, only=("dtype",))
    add_settings(parser, only=("max_new_tokens", "segment_len"), defaults={"max_new_tokens": 200})
    parser.add_argument("--repeats", type=int, default=3, help="first-segment runs per mode (median)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument(
        "--no-processes", action="store_true", help="leave out the mode with one process per member"
    )
    parser.add_argument(
        "--no-threads", action="store_true", help="leave out the mode with members at once in threads"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="members draft in a static KV cache with a torch.compile'd step (CUDA graphs on a GPU)",
    )
    # default eager: this benchmark's figures stay those of eager drafting unless asked (bench serve and
    # tools/gpu_serve_check.sh compare the paths)
    add_loading_flags(parser, only=("decode",), defaults={"decode": "eager"})
    parser.add_argument(
        "--workers",
        action="store_true",
        help="instead: bare decoding of the three members in turn, in threads and in one process each",
    )
    return parser


def _check_devices(args: Any, devices: Sequence[str]) -> None:
    """Refuse GPUs torch does not see; on a CPU, dtype auto is float32."""
    import torch

    if any(d.startswith("cuda") for d in devices):
        if not torch.cuda.is_available():
            raise SpecfuseError(
                f"--device {','.join(devices)}: torch sees no GPU here (torch {torch.__version__}); "
                "install a CUDA build of torch on a GPU machine, or use --shapes tiny --device cpu"
            )
        count = torch.cuda.device_count()
        for d in devices:
            if d != "cuda" and int(d.split(":", 1)[1]) >= count:
                raise SpecfuseError(f"{d}: this machine has {count} GPU(s)")
    elif args.dtype == "auto":
        args.dtype = "float32"


def _run(args: Any, devices: Sequence[str]) -> dict[str, Any]:
    """The members built here, timed alone and in each mode; then, unless --no-processes, built
    again one per worker process and timed as the mode "processes"."""
    import torch

    began = time.perf_counter()
    members = build_members(args.shapes, devices, args.dtype, args.compile, args.decode)
    _progress(f"built {len(members)} members in {time.perf_counter() - began:.1f} s")
    report = run_gpu_bench(
        members,
        max_new_tokens=args.max_new_tokens,
        segment_len=args.segment_len,
        repeats=args.repeats,
        modes=("off",) if args.no_threads else ("off", "on"),
    )
    report["compile_decode"] = args.compile
    report["decode"] = args.decode
    if not args.no_processes:
        del members  # the worker processes build their own copies: free this one's first
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        workers = build_process_members(args.shapes, devices, args.dtype, args.compile, args.decode)
        try:
            add_process_mode(report, workers, repeats=args.repeats)
        finally:
            for w in workers:
                w.close()
    return report


if __name__ == "__main__":
    sys.exit(main())
