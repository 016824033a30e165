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
import functools
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..config import EnsembleConfig
from ..errors import SpecfuseError
from ..heap import FullPasses
from ..members import profiling
from ..members.process import ProcessMember, on_member
from . import ceiling
from .shapes import SHAPES

# bench gpu's run settings (gpu.run_gpu_bench): a round's cost is that of every member drafting.
SHAPES_SETTINGS: dict[str, Any] = {"exit": False, "stop_strings": (), "prior": "uniform"}


def shapes_config(segment_len: int, max_tokens: int) -> EnsembleConfig:
    return EnsembleConfig(segment_len=segment_len, max_new_tokens=max_tokens, **SHAPES_SETTINGS)


def load_shapes(
    shapes: str, device: str, dtype: str, decode: str = "auto", processes: bool = False
) -> list[Any]:
    """The three members of `shapes`, built on `device` in this process (one rolling batch serves
    them, in turn on one GPU, as the server runs in-process members), or each in a worker process of
    its own (`processes`: at once). dtype auto: bf16 on a GPU that has it, float32 on a CPU;
    `decode`: how they draft (config.DECODE_MODES)."""
    import torch

    from .gpu import build_members, build_process_members

    if shapes not in SHAPES:
        raise SpecfuseError(f"--shapes {shapes}: expected one of {', '.join(sorted(SHAPES))}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecfuseError(
            f"--device {device}: torch sees no GPU here (torch {torch.__version__}); "
            "use --shapes tiny --device cpu for the same path on a CPU"
        )
    build = build_process_members if processes else build_members
    return build(shapes, [device], dtype, decode=decode)


def capture_steps(members: Sequence[Any], say: Callable[[str], None]) -> None:
    """Capture every step before the first request where members capture them, as the server and
    the app do at start-up (models.preparation.warm_up), each member said in one line."""
    from ..models.preparation import warm_up

    for member in members:
        if ceiling.will_capture(member):
            said: list[str] = []
            began = time.perf_counter()
            warm_up(member, progress=functools.partial(_note, said))
            say(f"{said[-1] if said else member.name} ({time.perf_counter() - began:.1f} s)")


def _note(said: list[str], fraction: float, message: str) -> None:
    said.append(message)


def on_gpu(members: Sequence[Any]) -> list[str]:
    """The CUDA devices the members are on (none on a CPU)."""
    return sorted({str(m.device) for m in members if str(m.device).startswith("cuda")})


def reset_peak(members: Sequence[Any]) -> None:
    for m in _memory_holders(members):
        on_member(m, _reset_peak)


def peak_gb(members: Sequence[Any]) -> float | None:
    """GPU memory allocated at most since reset_peak, every device together (None on a CPU): this
    process's, and each worker process's (members/process.py) on its own device."""
    holders = _memory_holders(members)
    return sum(on_member(m, _peak_gb) for m in holders) if holders else None


def _memory_holders(members: Sequence[Any]) -> list[Any]:
    """One member for each process that holds GPU memory: each in a worker of its own, and one of
    those in this process (its counters are the process's, every device)."""
    workers = [m for m in members if isinstance(m, ProcessMember) and str(m.device).startswith("cuda")]
    here = [m for m in members if not isinstance(m, ProcessMember) and str(m.device).startswith("cuda")]
    return workers + here[:1]


def _reset_peak(member: Any) -> None:
    import torch

    for d in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(d)


def _peak_gb(member: Any) -> float:
    import torch

    return sum(torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())) / 1024**3


def machine(members: Sequence[Any]) -> dict[str, Any]:
    """Where the members ran: device, dtype, the GPU's name, and the versions that matter."""
    import torch
    import transformers

    devices = on_gpu(members)
    return {
        "device": str(members[0].device),
        "dtype": on_member(members[0], dtype_of),
        "gpu": torch.cuda.get_device_name(devices[0]) if devices else None,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
        },
    }


def dtype_of(member: Any) -> str:
    return str(member.dtype).replace("torch.", "")


def encoder(member: Any) -> Callable[[str], Sequence[int]] | None:
    """The member's tokenizer as a function (a worker process's member encodes there), None if it has none."""
    if not on_member(member, _encodes):
        return None
    return functools.partial(on_member, member, _encode)


def _encodes(member: Any) -> bool:
    return callable(getattr(member, "encode", None))


def _encode(member: Any, text: str) -> Sequence[int]:
    return list(member.encode(text))


def measured(members: Sequence[Any], profile: bool, level: Any, *args: Any) -> dict[str, Any]:
    """`level(*args)`'s figures (a level of bench serve), with its peak GPU memory, where its time
    went (`profile`), the steps first needed in it, captured while it was timed (a GPU's), and the
    garbage collector's full passes in it (each holds every thread of the process)."""
    reset_peak(members)
    steps, seconds = ceiling.captures(members)
    with FullPasses() as passes, profiling.profiling() if profile else contextlib.nullcontext() as tally:
        out: dict[str, Any] = level(*args)
    taken = ceiling.captures(members)
    out |= {"captures": taken[0] - steps, "capture_s": taken[1] - seconds, "peak_gpu_gb": peak_gb(members)}
    out |= {"gc_full_passes": passes.count, "gc_full_pass_ms": passes.ms}
    return out | ({"profile": tally.snapshot()} if tally is not None else {})
