"""specfuse.heap: what a serving process holds for life kept out of the garbage collector's full passes,
and the full passes counted."""

from __future__ import annotations

import gc
import weakref

from specfuse.heap import FullPasses, freeze_survivors


class Node:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_garbage_is_collected_first_and_only_what_is_alive_is_frozen():
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    kept = Node()
    said: list[str] = []
    try:
        frozen = freeze_survivors(said.append)
        assert gone() is None  # a cycle already unreachable is freed, never frozen for good
        assert frozen > 1_000  # (the count falls as frozen objects without a cycle die: nothing is held)
        assert said == [
            f"{frozen:,} long-lived objects kept out of the garbage collector's full passes (gc.freeze)"
        ]
        later = Node()
        walked = gc.get_objects()  # what the collector's passes see now
        assert all(o is not kept for o in walked) and any(o is later for o in walked)
        assert len(walked) < frozen
    finally:
        gc.unfreeze()  # this test process goes on
    assert any(o is kept for o in gc.get_objects())


def test_full_passes_are_counted_and_timed_and_younger_ones_are_not():
    with FullPasses() as passes:
        gc.collect(0)
        gc.collect(1)
        assert (passes.count, passes.ms) == (0, 0.0)
        gc.collect()
        gc.collect(2)
    assert passes.count == 2 and passes.ms > 0
    gc.collect()  # after the block: no longer counted
    assert passes.count == 2
