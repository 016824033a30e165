"""The scheduler: owns the loaded members and one rolling batch (batch.Batch), played on a thread of
its own, that requests join at the next round boundary and leave the moment they end, each with its
own stream of records (Queued, Draft, Round, Paused, Finished) on its Ticket (ticket.py).

Chunked prefill (`prefill_chunk`): a newcomer's prompt is first checked against every member's
context (a prompt one cannot hold is refused before any member reads it), then read a part per round
between the rounds of the runs under way (each part sized to take part of a round: parts.py), and
the run joins them once its prompt is read whole.

Step mode (submit(step=True)): a run plays one round per Ticket.next() and, in between, is out of the
batch (the others never wait for it) and holds only its rounds, no member caches: each step it joins
as a newcomer, its members reading the prompt and the answer so far again, as a branch does. At most
`max_paused` such runs at once; one left without a step for `pause_idle_s` ends (PauseExpired).

Knows nothing about HTTP, OpenAI's bodies or the app's panels: the API (specfuse.serve) and the app
call submit(), read a Ticket's events and cancel() it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..config import EnsembleConfig
from ..errors import ConfigError, SpecfuseError
from ..limits import check_request
from ..members import profiling
from ..members.protocol import Member
from ..members.workers import run_concurrently
from ..prompts import Prompt
from ..records import Paused, Queued, Round
from .batch import Batch
from .ensemble import Ensemble
from .operator import JOIN_WAIT_SHARE, ServerSettings, prefill_chunk_for
from .run import TYPED, Run
from .ticket import Event, Ticket

log = logging.getLogger(__name__)


class QueueFull(SpecfuseError):
    """The waiting line is full: the request was refused, try again later."""


class SchedulerClosed(SpecfuseError):
    """The scheduler was shut down before the request could finish."""


class TooManyPaused(SpecfuseError):
    """As many step-mode runs as the server allows are open: a new one was refused."""


class PauseExpired(SpecfuseError):
    """A paused run waited longer than the server's idle limit for its next step, and ended."""


__all__ = [
    "Event",
    "PauseExpired",
    "QueueFull",
    "Scheduler",
    "SchedulerClosed",
    "ServerSettings",
    "Ticket",
    "TooManyPaused",
    "load_in_background",
]


class Scheduler:
    """The loaded members and one rolling batch, played by one thread of its own.

    submit() from any thread; requests are admitted first come, first served, up to `batch_size`
    at once, and up to `queue` more wait in line (one more is refused with QueueFull). Each request
    gets the rounds an Ensemble of its own members would give it alone (exactly in fp32 greedy):
    members are asked once per phase for all the requests they serve. A member that fails ends only
    the requests that use it, with a MemberError naming it. Step mode: the module's docstring.
    """

    def __init__(
        self,
        members: Sequence[Member],
        config: EnsembleConfig | None = None,
        settings: ServerSettings | None = None,
        **given: Any,
    ) -> None:
        """`settings`: the operator's (ServerSettings: batch size, line, join wait, `parallel` for every
        request, step mode's bounds, the prefill chunk), or its fields by name on top of the defaults
        (Scheduler(members, batch_size=2)); checked there, a bad one a ConfigError naming it."""
        settings = dataclasses.replace(settings or ServerSettings(), **given)
        self.settings = settings
        parallel = settings.parallel
        self.ensemble = Ensemble(members, config, parallel=parallel)  # checks members and `parallel`
        self.batch_size = settings.batch_size
        self.queue = settings.queue
        self.join_wait = settings.join_wait
        self.max_paused = settings.max_paused
        self.pause_idle_s = settings.pause_idle_s
        self._freed = 0  # requests that left the batch in the last round
        self._last_round_s = 0.0
        prefill_chunk = prefill_chunk_for(settings.prefill_chunk, (m.device for m in members))
        self.prefill_chunk = prefill_chunk
        self._batch = Batch(self.ensemble.members, run_concurrently(members, parallel), prefill_chunk)
        self._cond = threading.Condition()
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._running: dict[str, Ticket] = {}  # run id → ticket, for runs in the batch
        self._stepping: dict[str, Ticket] = {}  # step mode, until they end: max_paused bounds them
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="specfuse-scheduler", daemon=True)
        self._thread.start()

    @property
    def names(self) -> tuple[str, ...]:
        return self.ensemble.names

    @property
    def config(self) -> EnsembleConfig:
        """The operator's settings: a request's config starts from these."""
        return self.ensemble.config

    def submit(
        self,
        prompt: Prompt,
        config: EnsembleConfig | None = None,
        *,
        members: Sequence[str] | None = None,
        start: Sequence[Round] = (),
        forced: str | None = None,
        origin: str = TYPED,
        step: bool = False,
        logprobs: int | None = None,
        echo: bool = False,
    ) -> Ticket:
        """Queue a request: `members` (default all loaded, in the loaded order) play it with `config`
        (default the operator's); `start`/`forced` branch it as Ensemble.stream does. Refused at once
        (ConfigError) for a bad prompt or member list, QueueFull when the line is full,
        SchedulerClosed after close(). Errors found while starting it end the ticket instead.
        `step`: step mode; the ticket starts paused before round 1 (nothing read yet), and each
        Ticket.next() plays one round. Refused with TooManyPaused beyond `max_paused` of them.
        `logprobs`: every round scored, each verifier's `logprobs` alternatives per token kept (Run's
        logprobs); `echo`: the prompt (a string) is scored, not answered, in one round (Run's echo)."""
        names = self._subset(members)
        config = config or self.config
        check_request(prompt, config, tuple(start), forced, names)  # the engine's own pre-flight
        if echo and (not isinstance(prompt, str) or start or forced is not None or step):
            raise ConfigError("echo scores a text prompt (a string), in a run of its own")
        run = Run(
            prompt, config, names, tuple(start), forced, origin, pause=step, logprobs=logprobs, echo=echo
        )
        ticket = Ticket(self, run)
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the server is shutting down; no new requests")
            if step:
                self._open_paused(ticket)
                return ticket
            if (
                len(self._waiting) >= self.queue
                and len(self._running) + len(self._waiting) >= self.batch_size
            ):
                raise QueueFull(
                    f"{len(self._waiting)} requests are already waiting (the limit is {self.queue}); "
                    "try again later"
                )
            self._waiting.append(ticket)
            self._tell_places()
            self._cond.notify_all()
        return ticket

    def step(self, ticket: Ticket) -> None:
        """Ticket.next(): a paused ticket's next round joins the line (in step mode, a new run that
        resumes from its rounds). A no-op while its round is in line or under way."""
        with self._cond:
            if ticket.ended:
                raise SpecfuseError(
                    f"the run has ended ({ticket.state}); there is no next round to play: start a new run"
                )
            if ticket.state != "paused":
                return
            if self._closed:
                raise SchedulerClosed("the server is shutting down; no more steps")
            ticket.run = ticket.resumed()
            ticket.state = "waiting"
            self._waiting.append(ticket)
            self._tell_places()
            self._cond.notify_all()

    def position(self, ticket: Ticket) -> int | None:
        with self._cond:
            if ticket.ended or ticket.paused:
                return None
            if ticket.state == "running":
                return 0
            try:
                return self._waiting.index(ticket) + 1
            except ValueError:
                return 0  # taken from the line, joining the batch now

    def cancel(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket.ended:
                return
            if ticket in self._waiting:
                self._waiting.remove(ticket)
                self._end(ticket, "cancelled")
                self._tell_places()
                return
            if ticket.paused:  # out of the batch: nothing to wait for
                self._end(ticket, "cancelled")
                return
            ticket.run.cancelled = True  # the loop drops it from the batch within a phase
            self._cond.notify_all()

    def add_members(self, members: Sequence[Member]) -> None:
        """Members loaded later (the app loads a model the first time someone picks it): requests may
        name them from now on. The batch takes them on between rounds; names must be new."""
        with self._cond:
            self.ensemble = Ensemble(
                [*self.ensemble.members, *members], self.config, parallel=self.ensemble.parallel
            )
            self._cond.notify_all()

    def stats(self) -> dict[str, int]:
        """Requests running and waiting now, step-mode runs open ("paused": paused, or playing the
        step asked for, as max_paused counts them), those of the running whose prompts are still read
        (chunked prefill), and the limits (a health check, a status line)."""
        with self._cond:
            return {
                "running": len(self._running),
                "waiting": len(self._waiting),
                "reading": len(self._batch.reading),
                "paused": len(self._stepping),
                "batch_size": self.batch_size,
                "queue": self.queue,
                "max_paused": self.max_paused,
            }

    def close(self, timeout: float | None = 30.0) -> None:
        """Refuse new requests, end every request still waiting, running or paused
        (SchedulerClosed), and stop the thread once the round under way is over."""
        with self._cond:
            self._closed = True
            for ticket in [*self._waiting, *self._running.values()]:
                ticket.run.cancelled = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # -- the loop (its own thread) -------------------------------------------------------------------

    def _subset(self, members: Sequence[str] | None) -> tuple[str, ...]:
        if members is None:
            return self.names
        if isinstance(members, str) or not all(isinstance(m, str) for m in members):
            raise ConfigError("members must be a list of member names")
        unknown = [m for m in members if m not in self.names]
        if unknown:
            raise ConfigError(f"unknown members {', '.join(unknown)}; loaded: {', '.join(self.names)}")
        if not members:
            raise ConfigError(f"members is empty; choose among {', '.join(self.names)}")
        if len(set(members)) != len(members):
            raise ConfigError("members lists a member twice")
        return tuple(members)

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    # A timed wait while runs are paused: the next one's idle limit wakes the loop.
                    with profiling.timed("scheduler", "idle"):
                        while not self._closed and not self._waiting and not self._under_way():
                            self._cond.wait(self._expire())
                    self._expire()
                    self._await_newcomers()
                    if self._closed:
                        break
                    if self._members_changed():  # add_members: between rounds
                        members = self.ensemble.members
                        self._batch.use(members, run_concurrently(members, self.ensemble.parallel))
                try:
                    self._play()
                except Exception as e:  # a bug, not a member: end what is under way, keep serving
                    log.exception("the batch failed")
                    error = SpecfuseError(f"internal error in the batch: {type(e).__name__}: {e}")
                    self._batch.drop()
                    with self._cond:
                        for ticket in list(self._running.values()):
                            self._end(ticket, "failed", error)
        finally:
            self._batch.close()
            with self._cond:
                closed = SchedulerClosed("the server shut down before the request finished")
                for ticket in [*self._waiting, *self._running.values(), *self._stepping.values()]:
                    self._end(ticket, "failed", closed)
                self._waiting.clear()

    def _under_way(self) -> bool:
        return bool(self._batch.live or self._batch.reading)

    def _members_changed(self) -> bool:
        return self.ensemble.members != self._batch.members

    def _await_newcomers(self) -> None:
        """Under the lock, before a round: if requests left the batch in the last one, wait a little
        (join_wait, at most JOIN_WAIT_SHARE of the last round) for as many newcomers as there are
        places freed, so that they join this round rather than the next."""
        freed, self._freed = self._freed, 0
        wanted = min(freed, self.batch_size - len(self._batch.live) - len(self._batch.reading))
        if not self._batch.live or wanted <= 0:
            return
        deadline = time.perf_counter() + min(self.join_wait, JOIN_WAIT_SHARE * self._last_round_s)
        with profiling.timed("scheduler", "join wait"):
            while len(self._waiting) < wanted and not self._closed:
                left = deadline - time.perf_counter()
                if left <= 0:
                    return
                self._cond.wait(left)

    def _take(self, room: int) -> list[Run]:
        """The runs of the tickets that take the batch's free places, first come, first served (none
        once closed, or before the batch takes on new members)."""
        with self._cond:
            if self._closed or self._members_changed():
                return []
            joining = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
            for ticket in joining:
                ticket.state = "running"
                self._running[ticket.id] = ticket
            self._tell_places()
            return [ticket.run for ticket in joining]

    def _tell_places(self) -> None:
        """Under the lock: each waiting ticket whose place in line changed is told it (Queued), while
        it really waits (more are ahead of it than the batch has free places)."""
        room = self.batch_size - len(self._running)
        for place, ticket in enumerate(self._waiting, 1):
            if ticket.place != place and place > room:
                ticket.place = place
                ticket.put(Queued(place))

    def _play(self) -> None:
        """Admit the newcomers, then play one round of the batch and hand each event to its ticket.
        Requests that arrive while newcomers' prompts are read join too (Batch.admit): a burst of
        arrivals (a class pressing Run together) starts in one round, not one request first and the
        rest a round later."""
        began = time.perf_counter()
        for again in (False, True):
            if again and (self._batch.reading or not self._waiting):
                break
            # With chunked prefill, a second time for those that arrived while the newcomers' short
            # prompts were read whole: a burst still starts in one round.
            for run, error in self._batch.admit(self._take, self.batch_size):
                with self._cond:
                    self._end(self._running[run.id], "failed", error)
            # Chunked prefill: one part of the newcomers' prompts, then the round of the runs under
            # way (those read whole now among them), so that no prompt holds the others up for long.
            for run, error in self._batch.read():
                with self._cond:
                    self._end(self._running[run.id], "failed", error)
        for run, event in self._batch.step():
            ticket = self._running[run.id]
            if isinstance(event, SpecfuseError):
                with self._cond:
                    self._end(ticket, "failed", event)
                continue
            last = isinstance(event, Round) and event.stop_reason is not None
            pausing = isinstance(event, Round) and not last and run.pause
            if isinstance(event, Round):
                ticket.rounds.append(event)
            if last:
                ticket.state = "done"  # before its consumer can see the last round
            if pausing:  # likewise: a next() sent the moment the round arrives is not lost
                with self._cond:
                    self._pause(ticket)
            if last:  # the last round and the end under one hold of the lock: whoever has read the
                with self._cond:  # last round finds the run no longer counted as running
                    ticket.put(event)
                    self._end(ticket, "done")
                continue
            ticket.put(event)
            if pausing:
                ticket.put(Paused(run.k))
        live = {run.id for run in (*self._batch.live, *self._batch.reading)}
        with self._cond:
            for key, ticket in list(self._running.items()):
                if key not in live:  # left the batch without an ending of its own: cancelled
                    self._end(ticket, "cancelled")
        self._last_round_s = time.perf_counter() - began

    def _end(self, ticket: Ticket, state: str, error: SpecfuseError | None = None) -> None:
        """Under the lock: the ticket's last state and its stream's end."""
        if ticket.ended:
            return
        if self._running.pop(ticket.id, None) is not None:
            self._freed += 1
        self._stepping.pop(ticket.id, None)
        ticket.end(state, error)

    # -- step mode (under the lock) ------------------------------------------------------------------

    def _open_paused(self, ticket: Ticket) -> None:
        """A step-mode ticket, paused before round 1, if the limit allows one more."""
        if len(self._stepping) >= self.max_paused:
            if not self.max_paused:
                raise TooManyPaused("step mode is off on this server (its limit of paused runs is 0)")
            raise TooManyPaused(
                f"{len(self._stepping)} runs are already paused on this server (the limit is "
                f"{self.max_paused}); finish or stop one"
            )
        self._stepping[ticket.id] = ticket
        self._cond.notify_all()  # the loop's wait now has an idle limit to keep

    def _pause(self, ticket: Ticket) -> None:
        """Its round played: out of the batch (its states are gone), waiting for next()."""
        if self._running.pop(ticket.id, None) is not None:
            self._freed += 1
        ticket.state, ticket.paused_at = "paused", time.monotonic()

    def _expire(self) -> float | None:
        """End the paused runs that waited past the idle limit; the seconds until the next one
        would, or None when none is paused (the loop then waits without a limit)."""
        now, soonest = time.monotonic(), None
        for ticket in list(self._stepping.values()):
            if not ticket.paused:
                continue
            left = ticket.paused_at + self.pause_idle_s - now
            if left <= 0:
                expired = PauseExpired(
                    f"the paused run ended: no step for {self.pause_idle_s:g} s (the server's idle "
                    "limit for paused runs)"
                )
                self._end(ticket, "failed", expired)
            elif soonest is None or left < soonest:
                soonest = left
        return soonest


T = TypeVar("T")


def load_in_background(
    load: Callable[[], T], ready: Callable[[T], None], failed: Callable[[BaseException], None]
) -> None:
    """load() (members: minutes) on a thread of its own, then ready(its result) or failed(the error),
    so that a server listens meanwhile (and says it is loading). A daemon thread: stopping the server
    while the members load does not wait for them."""

    def work() -> None:
        try:
            result = load()
        except BaseException as e:
            failed(e)
        else:
            ready(result)

    threading.Thread(target=work, name="specfuse-load", daemon=True).start()
