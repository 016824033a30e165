"""The GPU benchmark's members one at a time and its bare decoding race (`… bench gpu --workers`):
the three members decoding with `generate` in turn, at once in threads, and in one process each.
gpu.py builds its members with build_one and times the ensemble with them."""

from __future__ import annotations

import threading
import time
from typing import Any

from ..prompts import QA_COMPLETION
from .measure import generate_alone, race_in_processes
from .shapes import SHAPES, ascii_head, build_model, byte_tokenizer

PROMPT = "Write a long story about a lighthouse keeper and the ships she guides home through the storm."


def auto_dtype(device: str) -> Any:
    import torch

    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def build_one(
    shapes: str, index: int, device: str, dtype_name: str, compile_decode: bool = False, decode: str = "auto"
) -> Any:
    """Member `index` of `shapes`, alone (what one worker process builds for itself)."""
    import torch

    from ..members.hf import HFMember

    name, (arch, values) = list(SHAPES[shapes].items())[index]
    dtype = getattr(torch, dtype_name) if dtype_name != "auto" else auto_dtype(device)
    tokenizer = byte_tokenizer()
    model = build_model(arch, values, device, dtype, seed=index)
    ascii_head(model, tokenizer)
    return HFMember(
        name,
        model,
        tokenizer,
        prompt_format=QA_COMPLETION,
        device=device,
        compile_decode=compile_decode,
        decode=decode,
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
    sync(device)
    began = time.perf_counter()
    for m in members:
        generate_alone(m, prompt, tokens)
    sync(device)
    in_turn = time.perf_counter() - began

    warm = threading.Barrier(count + 1)

    def alone(m: Any) -> None:
        if device.startswith("cuda"):  # the allocator's cached blocks are per stream: warm this one
            torch.cuda.set_stream(torch.cuda.Stream(device=device))
        generate_alone(m, prompt, tokens)
        sync(device)
        warm.wait()
        warm.wait()
        generate_alone(m, prompt, tokens)
        sync(device)

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
    sync(device)
    ready.put(index)
    go.wait()
    generate_alone(member, prompt, tokens)
    sync(device)
    results.put(index)
