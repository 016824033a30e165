"""Ticket: one request's handle on the Scheduler (scheduler.py), as its caller sees it: its stream of
records (Queued, Draft, Round, Paused, Finished), its state, cancel(), and next() in step mode.

The scheduler's thread writes to a ticket (put, end) and the caller reads it, from any thread or an
asyncio loop. Knows nothing about the batch: what it asks of the scheduler is Owner's three calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Protocol, cast

from ..config import EnsembleConfig
from ..errors import SpecfuseError
from ..prompts import Prompt
from ..records import Draft, Finished, Paused, Queued, Result, Round, summarize
from ..trace import Trace
from .run import Run

Event = Queued | Draft | Round | Paused | Finished


class Owner(Protocol):
    """What a ticket asks of its scheduler."""

    def position(self, ticket: Ticket) -> int | None: ...

    def cancel(self, ticket: Ticket) -> None: ...

    def step(self, ticket: Ticket) -> None: ...


class Ticket:
    """One request's handle: its events (its place in line while it waits, then Draft and Round
    round after round, then Finished), its state, and cancel(). Safe to read from any thread.

    events() and aevents() consume one stream: use one reader at a time. Without until_pause, one
    reader reads it to its end. In step mode (submit(step=True)), a reader with until_pause=True
    stops after each Paused, and the next reader goes on from there (an app's handler per step).
    """

    def __init__(self, owner: Owner, run: Run) -> None:
        self.id = run.id  # also the id of its trace
        self.run = run  # the run of its current round: a new one each step in step mode
        self.start = tuple(run.start)  # a branch's rounds before its own
        self.submitted = time.perf_counter()
        # waiting → running → done | failed | cancelled; step mode: paused → waiting → running →
        # paused … (each next()), until done | failed | cancelled
        self.state = "paused" if run.pause else "waiting"
        self.error: SpecfuseError | None = None
        self.rounds: list[Round] = []
        self.place: int | None = None  # the scheduler's: the last place in line it was told (Queued)
        self.paused_at = time.monotonic()  # the scheduler's: when it last paused (its idle limit)
        self._owner = owner
        self._queue: queue.SimpleQueue[Event | SpecfuseError] = queue.SimpleQueue()
        self._wakers: list[Callable[[], None]] = []
        self._ended = threading.Event()

    @property
    def prompt(self) -> Prompt:
        return self.run.prompt

    @property
    def config(self) -> EnsembleConfig:
        return self.run.config

    @property
    def members(self) -> tuple[str, ...]:
        return self.run.names

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    @property
    def stepping(self) -> bool:
        """Submitted in step mode: it plays one round per next()."""
        return self.run.pause

    @property
    def paused(self) -> bool:
        """Step mode, between rounds: out of the batch, holding no member caches, waiting for next()."""
        return self.state == "paused"

    def position(self) -> int | None:
        """1 for the next request to join the batch, 2 behind it, …; 0 while running; None while
        paused and once ended."""
        return self._owner.position(self)

    def cancel(self) -> None:
        """End the request: a waiting one leaves the line, a running one the batch (within a phase
        of the round under way), a paused one at once. Idempotent; a no-op once it has ended."""
        self._owner.cancel(self)

    def next(self) -> None:
        """Step mode: play exactly one more round. The stream then gets that round's Drafts, its
        Round and Paused(k), or Finished if the round ended the run. While a round is under way or
        in line this is a no-op; on an ended ticket it raises SpecfuseError. The scheduler may refuse
        it with SchedulerClosed once it is shutting down."""
        self._owner.step(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request has ended; False if `timeout` seconds passed first."""
        return self._ended.wait(timeout)

    def events(
        self, timeout: float | None = None, *, until_pause: bool = False
    ) -> Generator[Event, None, None]:
        """Each event as it happens; the stream ends with Finished, or raises the error that ended
        the request. `timeout`: the longest wait for one event (queue.Empty after it). Closing the
        iterator early cancels the request, except, with `until_pause`, once it has yielded Paused:
        then it ends there and the request waits for next() (a later reader goes on)."""
        return cast(Generator[Event, None, None], self._read(timeout, until_pause, quiet=None))

    def paced_events(self, quiet: float, *, until_pause: bool = False) -> Generator[Event | None, None, None]:
        """events(), with a None after each `quiet` seconds in which nothing happened: a reader that
        held an update back (a view drawing at most so often) is woken to draw it; 0: never."""
        return self._read(None, until_pause, quiet=quiet if quiet > 0 else None)

    def _read(
        self, timeout: float | None, until_pause: bool, quiet: float | None
    ) -> Generator[Event | None, None, None]:
        paused = False
        try:
            while True:
                try:
                    item = self._queue.get(timeout=timeout if quiet is None else quiet)
                except queue.Empty:
                    if quiet is None:
                        raise
                    yield None
                    continue
                if isinstance(item, SpecfuseError):
                    raise item
                paused = until_pause and isinstance(item, Paused)  # before the yield: a close there
                yield item
                if paused or isinstance(item, Finished):
                    return
        finally:
            if not paused:
                self.cancel()

    async def aevents(self, *, until_pause: bool = False) -> AsyncGenerator[Event, None]:
        """events() for an asyncio consumer, never blocking its loop. Closing it early cancels, as
        events() does (with `until_pause`, not once it has yielded Paused)."""
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is listening
                loop.call_soon_threadsafe(arrived.set)

        self._wakers.append(wake)
        paused = False
        try:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    await arrived.wait()
                    arrived.clear()
                    continue
                if isinstance(item, SpecfuseError):
                    raise item
                paused = until_pause and isinstance(item, Paused)
                yield item
                if paused or isinstance(item, Finished):
                    return
        finally:
            self._wakers.remove(wake)
            if not paused:
                self.cancel()

    def result(self) -> Result:
        """The rounds so far as a Result (stop_reason "cancelled" when it was cut short)."""
        return summarize(self.rounds)

    def trace(self, upto: int | None = None) -> Trace:
        """The run so far as a trace; `upto`: its rounds up to round k only (a reader behind the
        scheduler, which may have played on, shows the run as of the round it has read)."""
        rounds = tuple(r for r in self.rounds if upto is None or r.k <= upto)
        return Trace(self.prompt, self.members, self.config, rounds, id=self.id)

    # -- the scheduler's side ------------------------------------------------------------------------

    def resumed(self) -> Run:
        """Step mode: the run that plays its next round. Before round 1, the run as submitted (an
        ordinary start); after, a new one under the same id that resumes from its rounds (and a
        branch's), as a branch does: its members read the prompt and the answer so far again."""
        if not self.rounds:
            return self.run
        run = self.run
        return Run(
            run.prompt,
            run.config,
            run.names,
            (*self.start, *self.rounds),
            None,  # a branch's forced segment was its first round's
            run.origin,
            id=self.id,
            pause=True,
            played_s=self.rounds[-1].elapsed,
        )

    def put(self, item: Event | SpecfuseError) -> None:
        """The scheduler's: hand the stream one event (or the error that ends it)."""
        self._queue.put(item)
        for wake in list(self._wakers):
            wake()

    def end(self, state: str, error: SpecfuseError | None = None) -> None:
        """The scheduler's, under its lock: the last state, and the stream's end."""
        self.state, self.error = state, error
        self._ended.set()
        self.put(error if error is not None else Finished(state))
