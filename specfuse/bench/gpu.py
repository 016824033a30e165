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
import math
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..cli import Parser
from ..config import EnsembleConfig, MemberSettings
from ..engine import Ensemble
from ..errors import SpecfuseError
from ..members.process import ProcessMember
from ..prompts import QA_COMPLETION
from .floor import add_floors, bandwidths, cost_line, member_floors, modes_floor_lines
from .measure import (
    alone_summary,
    compare_in_turn,
    draft_alone,
    generate_alone,
    members_alone,
    peak_rss_gb,
    process_mode,
    race_in_processes,
    time_mode,
    write_report,
)
from .shapes import SHAPES, ascii_head, build_model, byte_tokenizer

PROMPT = "Write a long story about a lighthouse keeper and the ships she guides home through the storm."


def build_members(
    shapes: str, devices: Sequence[str], dtype_name: str, compile_decode: bool = False
) -> list[Any]:
    import torch

    from ..members.hf import HFMember

    dtype = getattr(torch, dtype_name) if dtype_name != "auto" else _auto_dtype(devices[0])
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
            )
        )
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
    return members


def build_process_members(
    shapes: str, devices: Sequence[str], dtype_name: str, compile_decode: bool = False
) -> list[Any]:
    """The same members as build_members, each built in a worker process of its own, all at once.
    On a CPU the engine gives each process its thread share for every run (workers.MemberWorkers)."""
    import concurrent.futures

    count = len(SHAPES[shapes])
    builds = [
        functools.partial(build_one, shapes, i, devices[i % len(devices)], dtype_name, compile_decode)
        for i in range(count)
    ]
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(ProcessMember, builds))


def _auto_dtype(device: str) -> Any:
    import torch

    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


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

    alone = draft_alone if compiled else generate_alone
    singles = members_alone(members, prompt, max_new_tokens, segment_len, repeats, memory, alone)
    for m in compiled:
        n, seconds = generate_alone(m, prompt, max_new_tokens)
        singles[m.name]["generate_s_per_token"] = seconds / max(n, 1)
        singles[m.name]["bare_step_s"] = bare_step_s(m, prompt, max_new_tokens)
    bandwidth = bandwidths(members)
    floor_sum = add_floors(singles, member_floors(members, bandwidth))
    for s in singles.values():
        if "bare_step_s" in s:
            s["bare_step_floor_ratio"] = s["bare_step_s"] / s["floor_s_per_token"]
    _progress("alone: " + ", ".join(f"{k} {1000 * v['s_per_token']:.1f} ms/tok" for k, v in singles.items()))

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


def bare_step_s(member: Any, prompt: str, max_new_tokens: int, steps: int = 50) -> float:
    """Seconds a member's decoding step takes with nothing around it: its compiled step (the decoder
    layers' graph) and the output head after it, `steps` times at one position, read back once at the
    end. It reads what a token's floor counts (every weight once), so beside the member's time per
    token in its own drafting it splits a token's cost into the step's own work (on a GPU, its
    kernels) and what the draft loop adds between steps (picking the token, reading it back, the stop
    checks). A GPU run before the head was added timed the graph alone (results/gpu-h100-verify.json)."""
    import torch

    decoder = member.compiled
    state = member.start(prompt, MemberSettings(max_new_tokens=max_new_tokens))
    member.draft(state, 2)  # its second token is a compiled step: the static cache holds the prompt
    token, position = state.ids[-1], len(state.ids)
    with torch.inference_mode():
        for _ in range(3):
            member.head.logits(decoder.replay(token, position))
        _sync(str(member.device))
        began = time.perf_counter()
        for _ in range(steps):
            member.head.logits(decoder.replay(token, position))
        _sync(str(member.device))
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
    """Members draft eagerly inside (their compiled decoders set aside, then put back)."""
    saved = [m.compiled for m in members]
    for m in members:
        m.compiled = None
    try:
        yield
    finally:
        for m, decoder in zip(members, saved):
            m.compiled = decoder


_BEGAN = time.perf_counter()


def _progress(line: str) -> None:
    """A line on stderr as the benchmark goes, with the seconds since it began (a run cut short
    still shows how far it got, and how long compiling took)."""
    print(f"[{time.perf_counter() - _BEGAN:6.1f} s] {line}", file=sys.stderr, flush=True)


# -- bare decoding: in turn, threads, processes --------------------------------------------------------


def build_one(shapes: str, index: int, device: str, dtype_name: str, compile_decode: bool = False) -> Any:
    """Member `index` of `shapes`, alone (what one worker process builds for itself)."""
    import torch

    from ..members.hf import HFMember

    name, (arch, values) = list(SHAPES[shapes].items())[index]
    dtype = getattr(torch, dtype_name) if dtype_name != "auto" else _auto_dtype(device)
    tokenizer = byte_tokenizer()
    model = build_model(arch, values, device, dtype, seed=index)
    ascii_head(model, tokenizer)
    return HFMember(
        name, model, tokenizer, prompt_format=QA_COMPLETION, device=device, compile_decode=compile_decode
    )


def compare_workers(
    shapes: str, device: str, dtype_name: str, tokens: int, prompt: str = PROMPT
) -> dict[str, Any]:
    """Seconds for the three members to decode `tokens` each with `generate`: one after another, at
    once in threads (each on its own CUDA stream), and at once in one process per member.

    Why processes: at batch 1 a decoding step of a Hugging Face model is mostly Python launching
    kernels, and threads take turns holding the GIL; a process per member has its own.
    """
    import torch

    count = len(SHAPES[shapes])
    members = [build_one(shapes, i, device, dtype_name) for i in range(count)]
    for m in members:  # each timing follows a full-length warm-up in the same place (see run_gpu_bench)
        generate_alone(m, prompt, tokens)
    _sync(device)
    began = time.perf_counter()
    for m in members:
        generate_alone(m, prompt, tokens)
    _sync(device)
    in_turn = time.perf_counter() - began

    warm = threading.Barrier(count + 1)

    def alone(m: Any) -> None:
        if device.startswith("cuda"):  # the allocator's cached blocks are per stream: warm this one
            torch.cuda.set_stream(torch.cuda.Stream(device=device))
        generate_alone(m, prompt, tokens)
        _sync(device)
        warm.wait()
        warm.wait()
        generate_alone(m, prompt, tokens)
        _sync(device)

    threads = [threading.Thread(target=alone, args=(m,)) for m in members]
    for t in threads:
        t.start()
    warm.wait()
    began = time.perf_counter()
    warm.wait()
    for t in threads:
        t.join()
    in_threads = time.perf_counter() - began
    del members, threads
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the processes build their own copies

    in_processes = race_in_processes(
        _decode_child, [(shapes, i, device, dtype_name, prompt, tokens) for i in range(count)], timeout=900
    )
    return {
        "tokens": tokens,
        "in_turn_s": in_turn,
        "threads_s": in_threads,
        "processes_s": in_processes,
        "threads_speedup": in_turn / in_threads,
        "processes_speedup": in_turn / in_processes,
    }


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _decode_child(
    shapes: str,
    index: int,
    device: str,
    dtype_name: str,
    prompt: str,
    tokens: int,
    ready: Any,
    results: Any,
    go: Any,
) -> None:
    member = build_one(shapes, index, device, dtype_name)
    generate_alone(member, prompt, tokens)
    _sync(device)
    ready.put(index)
    go.wait()
    generate_alone(member, prompt, tokens)
    _sync(device)
    results.put(index)


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"GPU: {report['gpu']}, torch {report['torch']}, {report['dtype']}, L = {report['segment_len']}, "
        f"{report['max_new_tokens']} tokens, exit off"
        + (", drafts compiled (static cache)" if report.get("compile_decode") else ""),
        f"command: {report.get('command', '')}",
        "",
    ]
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
    if "compiled" in report:
        lines.append("  (alone: each member's own compiled drafting, the ensemble's path; generate: eager)")
    lines += modes_floor_lines(report)
    lines += [
        "",
        f"{'members':14} {'ms/tok':>8} {'tok/s':>7} {'×sum':>6} {'×slowest':>8} {'1st cand':>8} "
        f"{'1st seg':>7} {'×slowest':>8} {'peak GB':>7}",
    ]
    for parallel, m in report["modes"].items():
        label = {"off": "in turn", "on": "at once", "processes": "processes", "eager": "in turn, eager"}[
            parallel
        ]
        lines.append(
            f"{label:14} {1000 * m['s_per_token']:8.1f} "
            f"{m['tokens_per_s']:7.2f} {m['overhead_vs_single_sum']:6.2f} {m['overhead_vs_slowest']:8.2f} "
            f"{m['first_candidate_s']:8.3f} {m['first_segment_s']:7.3f} {m['first_segment_ratio']:8.2f} "
            f"{m['peak_gb']:7.1f}"
        )
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
    bound = report["target_overhead_vs_slowest_at_once"]
    on_gpu = not report["gpu"].startswith("none")
    lines.append("")
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
    if "compiled" in report:
        c = report["compiled"]
        lines.append(
            f"compiled drafts: {c['speedup_in_turn']:.2f}× eager drafts' speed in turn; same answer: "
            f"{c['same_answer_as_eager']}; drafts {c['drafts']}; verification passes "
            f"{c.get('verified', {})}; off: {c['disabled']}; "
            f"graphs skipped: {c['cudagraph_skips']}"
        )
    if "processes" in report["modes"] and on_gpu:
        lines.append("  (processes: peak GB is the GPU memory in use after the run, every process together)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
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
    parser.add_argument(
        "--dtype", default="auto", help="auto (bf16 on a GPU that has it), bfloat16, float16, float32"
    )
    parser.add_argument("--max-new-tokens", type=int, default=200, help="answer budget (default 200)")
    parser.add_argument("--segment-len", type=int, default=10, help="L (default 10)")
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
    parser.add_argument(
        "--workers",
        action="store_true",
        help="instead: bare decoding of the three members in turn, in threads and in one process each",
    )
    args = parser.parse_args(argv)
    import torch

    devices = [d.strip() for d in (args.devices or args.device).split(",") if d.strip()]
    try:
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
        if args.workers:
            race = compare_workers(args.shapes, devices[0], args.dtype, args.max_new_tokens)
            print(
                f"{race['tokens']} tokens each: in turn {race['in_turn_s']:.2f} s, "
                f"threads {race['threads_s']:.2f} s "
                f"({race['threads_speedup']:.2f}×), processes {race['processes_s']:.2f} s "
                f"({race['processes_speedup']:.2f}×)"
            )
            if args.json:
                args.json.write_text(json.dumps(race, indent=1))
            return 0
        began = time.perf_counter()
        members = build_members(args.shapes, devices, args.dtype, args.compile)
        _progress(f"built {len(members)} members in {time.perf_counter() - began:.1f} s")
        report = run_gpu_bench(
            members,
            max_new_tokens=args.max_new_tokens,
            segment_len=args.segment_len,
            repeats=args.repeats,
            modes=("off",) if args.no_threads else ("off", "on"),
        )
        report["compile_decode"] = args.compile
        if not args.no_processes:
            del members  # the worker processes build their own copies: free this one's first
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            workers = build_process_members(args.shapes, devices, args.dtype, args.compile)
            try:
                add_process_mode(report, workers, repeats=args.repeats)
            finally:
                for w in workers:
                    w.close()
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report["command"] = " ".join(
        ["python -m specfuse.bench gpu", *(argv if argv is not None else sys.argv[1:])]
    )
    write_report(report, format_table(report), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
