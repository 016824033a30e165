"""ServerSettings: the operator's settings of a Scheduler (batch, line, join wait, where members run,
step mode's bounds, chunked prefill), declared once with setting() as EnsembleConfig's are.

The Scheduler checks them by constructing this (config.check_fields); specfuse.flags turns each field
into the same flag for the API server, the app and the benchmarks that start a scheduler. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from ..config import PARALLEL_HELP, PARALLEL_MODES, check_fields, setting

# Runs under way at once. On two cores with the default trio (docs/serve.md, `python -m specfuse.bench
# serve`), 8 clients gave 3.07x the one-at-a-time tokens/s and 16 gave 3.91x, but a bigger batch
# makes every round, and each newcomer's first segment, longer: 8 keeps runs interactive.
DEFAULT_BATCH_SIZE = 8
DEFAULT_QUEUE = 64  # requests waiting for a place in the batch; one more is refused (QueueFull)
# When requests leave the batch, the next round waits up to this long (and at most JOIN_WAIT_SHARE of
# the last round's time) for newcomers to take their places. A client that sends its next request as
# soon as its last one ends (a script, lm-eval's num_concurrent) lands 20-110 ms after the round would
# have begun, and would otherwise wait out a whole round (1-3 s on two cores) before its first one.
DEFAULT_JOIN_WAIT = 0.25
JOIN_WAIT_SHARE = 0.1
# Step mode. A paused run holds its rounds only (kilobytes), but each step re-reads its prompt and
# answer: the bound keeps a class's worth of them and the idle limit frees those a closed page left.
DEFAULT_MAX_PAUSED = 16
DEFAULT_PAUSE_IDLE = 600.0  # seconds a paused run may wait for its next step
# Chunked prefill: the most tokens of newcomers' prompts each member reads between two rounds of the
# runs under way. Read whole, a 6,000-token prompt stopped every stream here for 73.6 s (issue 56).
# While runs stream each part is sized to take part of a round (engine/parts.py), so this is a cap:
# the size of a part when nobody streams, and of a newcomer's wait behind one. 0: read whole.
DEFAULT_PREFILL_CHUNK = 256
# ... and where a member is on a GPU, which reads thousands of tokens in a round's time: capped at 256
# tokens a round, the newcomers of tools/gpu_serve_check.sh (prompts of 40-300 tokens) were let in more
# slowly than the runs under way ended, a burst of 32 took 44 s to start and the median first segment
# at 16 clients was 17.7 s (H200, issue 52). Unset (None), the cap is the device's.
GPU_PREFILL_CHUNK = 8192


@dataclass(frozen=True)
class ServerSettings:
    """How one scheduler serves everyone's runs; the operator's, never a request's (the API refuses
    these names in a request's `specfuse` object)."""

    batch_size: int = setting(DEFAULT_BATCH_SIZE, "runs played together in one rolling batch", low=1)
    queue: int = setting(DEFAULT_QUEUE, "requests waiting beyond those; one more is refused (429)", low=0)
    join_wait: float = setting(
        DEFAULT_JOIN_WAIT,
        "seconds the next round may wait for new requests when some have just ended (at most a tenth "
        "of a round; 0: never)",
        low=0.0,
    )
    parallel: str = setting("auto", PARALLEL_HELP, choices=PARALLEL_MODES)
    max_paused: int = setting(
        DEFAULT_MAX_PAUSED,
        "runs stepped through one round at a time, paused in between (each holds its rounds only, no "
        "model caches), at once; one more is refused (0: no step mode)",
        low=0,
    )
    pause_idle_s: float = setting(
        DEFAULT_PAUSE_IDLE, "seconds a paused run may wait for its next step", above=0.0
    )
    prefill_chunk: int | None = setting(
        None,
        "most tokens of newcomers' prompts each member reads between two rounds, each part sized "
        "to take part of a round (chunked prefill: docs/serve.md); 0: read whole while every stream "
        f"waits; none: {DEFAULT_PREFILL_CHUNK} on a CPU, {GPU_PREFILL_CHUNK} where a member is on a GPU",
        low=0,
    )

    def __post_init__(self) -> None:
        check_fields(self)  # a bad value is a ConfigError naming the setting and its range


SERVER_SETTINGS = tuple(f.name for f in fields(ServerSettings))


def prefill_chunk_for(chunk: int | None, devices: Iterable[str]) -> int:
    """The chunked prefill's cap: the operator's `chunk`, or unset, the default for members on `devices`."""
    if chunk is not None:
        return chunk
    on_gpu = any(str(device).startswith("cuda") for device in devices)
    return GPU_PREFILL_CHUNK if on_gpu else DEFAULT_PREFILL_CHUNK
