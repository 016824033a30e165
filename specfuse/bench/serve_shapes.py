"""The serving benchmark on random-weight members with real shapes: `python -m specfuse.bench serve
--shapes real --device cuda` (Qwen2.5-7B, Llama-3.1-8B and Gemma-2-9B shapes), `--shapes tiny
--device cpu` (the same path in seconds).

The members are the GPU benchmark's (gpu.build_members: shapes.py's configs, random weights built
directly on the device, an in-memory byte-level tokenizer, an output head biased to printable ASCII),
so nothing is read from a hub or a disk: it runs where nothing can be downloaded. Their drafts are
printable text that never ends early (the end-of-sequence token is ruled out), so every answer runs
to its budget: 64 tokens are 64 characters. The default config is bench gpu's: exit off (every
member drafts every round, whatever random scores would make of the exits), no stop strings, uniform
starting weights; `--set` changes any of it. `measured` takes any level's figures with what a GPU
adds to them: its peak memory, and the steps captured at first use inside it.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Sequence
from typing import Any

from ..config import EnsembleConfig
from ..errors import SpecfuseError
from ..heap import FullPasses
from ..members import profiling
from . import ceiling
from .shapes import SHAPES

# bench gpu's run settings (gpu.run_gpu_bench): a round's cost is that of every member drafting.
SHAPES_SETTINGS: dict[str, Any] = {"exit": False, "stop_strings": (), "prior": "uniform"}


def shapes_config(segment_len: int, max_tokens: int) -> EnsembleConfig:
    return EnsembleConfig(segment_len=segment_len, max_new_tokens=max_tokens, **SHAPES_SETTINGS)


def load_shapes(shapes: str, device: str, dtype: str, decode: str = "auto") -> list[Any]:
    """The three members of `shapes`, built on `device` in this process (one rolling batch serves
    them, in turn on one GPU, as the server runs in-process members). dtype auto: bf16 on a GPU that
    has it, float32 on a CPU; `decode`: how they draft (config.DECODE_MODES)."""
    import torch

    from .gpu import build_members

    if shapes not in SHAPES:
        raise SpecfuseError(f"--shapes {shapes}: expected one of {', '.join(sorted(SHAPES))}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecfuseError(
            f"--device {device}: torch sees no GPU here (torch {torch.__version__}); "
            "use --shapes tiny --device cpu for the same path on a CPU"
        )
    return build_members(shapes, [device], dtype, decode=decode)


def on_gpu(members: Sequence[Any]) -> list[str]:
    """The CUDA devices the members are on (none on a CPU)."""
    return sorted({str(m.device) for m in members if str(m.device).startswith("cuda")})


def reset_peak(devices: Sequence[str]) -> None:
    import torch

    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)


def peak_gb(devices: Sequence[str]) -> float | None:
    """GPU memory allocated at most since reset_peak, every device together (None on a CPU)."""
    import torch

    if not devices:
        return None
    return sum(torch.cuda.max_memory_allocated(d) for d in devices) / 1024**3


def machine(members: Sequence[Any]) -> dict[str, Any]:
    """Where the members ran: device, dtype, the GPU's name, and the versions that matter."""
    import torch
    import transformers

    devices = on_gpu(members)
    return {
        "device": str(members[0].device),
        "dtype": str(members[0].dtype).replace("torch.", ""),
        "gpu": torch.cuda.get_device_name(devices[0]) if devices else None,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
        },
    }


def measured(
    members: Sequence[Any], gpus: Sequence[Any], profile: bool, level: Any, *args: Any
) -> dict[str, Any]:
    """`level(*args)`'s figures (a level of bench serve), with its peak GPU memory, where its time
    went (`profile`), the steps first needed in it, captured while it was timed (a GPU's), and the
    garbage collector's full passes in it (each holds every thread of the process)."""
    reset_peak(gpus)
    steps, seconds = ceiling.captures(members)
    with FullPasses() as passes, profiling.profiling() if profile else contextlib.nullcontext() as tally:
        out: dict[str, Any] = level(*args)
    taken = ceiling.captures(members)
    out |= {"captures": taken[0] - steps, "capture_s": taken[1] - seconds, "peak_gpu_gb": peak_gb(gpus)}
    out |= {"gc_full_passes": passes.count, "gc_full_pass_ms": passes.ms}
    return out | ({"profile": tally.snapshot()} if tally is not None else {})
