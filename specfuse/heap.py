"""What a serving process holds for life, kept out of the garbage collector's full passes (issue 52).

A full collection walks every object the collector tracks. With torch, transformers and three members
loaded that is about 425,000 objects (Gradio adds about 90,000), 150-260 ms on a 2-core Xeon, and it
lands wherever allocations happen to trip it: in the middle of a round, about once in 24 member-rounds
at 32 runs (tools/gc_passes.py). The libraries are almost all of it (375,000 before any member loads).
Once a server's start-up is over, `freeze_survivors` moves everything alive into the collector's
permanent generation (`gc.freeze`, as vLLM does after its start-up), so a full pass walks only what
came since.

Where: at a process's start-up only, once nothing short-lived is alive (specfuse-serve once its members
are warmed up, the app just after its page answers, bench serve once its members are built, a member's
worker process once its member is built: members/process.py). A frozen
object is never collected as part of a cycle, so freezing a run in flight could keep its KV cache for
good; `gc.collect()` first, so that only what is still reachable is frozen. Nothing frozen is unfrozen: the
app keeps every member it loads (studio.loading.SharedLoader), and members loaded after the freeze are
walked as before (about 30,000 objects for three).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def freeze_survivors(say: Callable[[str], None] = log.info) -> int:
    """Collect, then keep everything still alive out of the collector's passes; how many objects
    are kept so (all frozen so far), said through `say`."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    say(f"{frozen:,} long-lived objects kept out of the garbage collector's full passes (gc.freeze)")
    return frozen


class FullPasses:
    """The collector's full passes (generation 2) while entered: each one's milliseconds. A full pass
    holds the GIL, so every thread of the process (a round's too) waits for it."""

    def __init__(self) -> None:
        self.each: list[float] = []
        self._began = 0.0

    @property
    def count(self) -> int:
        return len(self.each)

    @property
    def ms(self) -> float:
        return sum(self.each)

    def _seen(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.each.append((time.perf_counter() - self._began) * 1e3)

    def __enter__(self) -> FullPasses:
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._seen)
