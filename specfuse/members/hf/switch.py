"""A change made for the KV slots' own passes only (a model's attention in its config, its norms'
forwards, its modelling module's rotary function), held while any pass is inside.

Two members on one model's weights (HFMember.sharing), or two models of one family, may each be
inside a pass at once, in two threads; the change is made when the first pass enters and undone
when the last one leaves, each target counted by identity (configs and modules may compare equal
without being the same one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Switch:
    """`on(target, how)` when the first pass on `target` enters (what it returns is kept), `off(target,
    kept)` when the last one leaves; a pass entering while others are inside changes nothing."""

    def __init__(self, on: Callable[[Any, Any], Any], off: Callable[[Any, Any], None]) -> None:
        self._on, self._off = on, off
        self._lock = threading.Lock()
        self._held: list[list[Any]] = []  # [target, passes inside, what on() returned]

    @contextmanager
    def inside(self, target: Any, how: Any = None) -> Iterator[None]:
        with self._lock:
            held = next((entry for entry in self._held if entry[0] is target), None)
            if held is None:
                held = [target, 0, self._on(target, how)]
                self._held.append(held)
            held[1] += 1
        try:
            yield
        finally:
            with self._lock:
                held[1] -= 1
                if not held[1]:
                    self._held[:] = [entry for entry in self._held if entry is not held]
                    self._off(target, held[2])


__all__ = ["Switch"]
