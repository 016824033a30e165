"""Where the time goes: an opt-in tally of timed events, for `python -m specfuse.bench serve --profile`.

The engine, the scheduler and the members report what they do here (`add`, `timed`), keyed by a
short tuple such as ("member", "score", "qwen") or ("llama_decode", "gemma"); while nobody profiles,
each report is one global read and nothing is kept. A tally counts calls, their wall seconds and
what they carried (`items`: runs in a member call, tokens in a forward pass or a decode call), so a
profile says both how long each part took and how big its batches were.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, ...]


@dataclass
class Tally:
    calls: int = 0
    seconds: float = 0.0
    items: int = 0  # what the calls carried in all: runs, tokens, sequences (per key)
    most: int = 0  # the most one call carried


@dataclass
class Profile:
    tallies: dict[Key, Tally] = field(default_factory=dict)
    began: float = field(default_factory=time.perf_counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, key: Key, seconds: float, items: int) -> None:
        with self.lock:
            tally = self.tallies.setdefault(key, Tally())
            tally.calls += 1
            tally.seconds += seconds
            tally.items += items
            tally.most = max(tally.most, items)

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready: the wall seconds profiled, and every tally with its key (a list: member names
        may hold any character)."""
        with self.lock:
            tallies = [
                {"key": list(key), "calls": t.calls, "seconds": t.seconds, "items": t.items, "most": t.most}
                for key, t in sorted(self.tallies.items())
            ]
        return {"wall_s": time.perf_counter() - self.began, "tallies": tallies}


_active: Profile | None = None


def active() -> bool:
    return _active is not None


def add(*key: str, seconds: float, items: int = 0) -> None:
    """Count one call of `key` that took `seconds` and carried `items` (nothing while not profiling)."""
    profile = _active
    if profile is not None:
        profile.add(key, seconds, items)


@contextlib.contextmanager
def timed(*key: str, items: int = 0) -> Iterator[None]:
    """Time the block as one call of `key` (when profiling)."""
    if _active is None:
        yield
        return
    began = time.perf_counter()
    try:
        yield
    finally:
        add(*key, seconds=time.perf_counter() - began, items=items)


def count_forward(module: Any, name: str) -> None:
    """Report each forward pass of a torch module as ("forward", name): its seconds and the tokens
    it read (input_ids' size, padding included), and ("threads", name): torch's intra-op threads.
    Inside a torch.compile'd graph (compiled drafting) the hooks do nothing: dynamo cannot trace them."""
    import torch  # a torch module's hooks: torch is loaded

    compiling = torch.compiler.is_compiling
    began: dict[int, float] = {}

    def before(_module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if not compiling() and _active is not None:
            began[threading.get_ident()] = time.perf_counter()

    def after(_module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if compiling():
            return
        start = began.pop(threading.get_ident(), None)
        if start is None or _active is None:
            return
        ids: Any = kwargs.get("input_ids", args[0] if args else None)
        tokens = int(ids.numel()) if hasattr(ids, "numel") else 0
        add("forward", name, seconds=time.perf_counter() - start, items=tokens)
        add("threads", name, seconds=0.0, items=torch.get_num_threads())

    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after, with_kwargs=True)


@contextlib.contextmanager
def profiling() -> Iterator[Profile]:
    """Collect every report made (from any thread) until the block ends."""
    global _active
    profile = Profile()
    _active = profile
    try:
        yield profile
    finally:
        _active = None


__all__ = ["Profile", "Tally", "active", "add", "count_forward", "profiling", "timed"]
