"""The wing that plays runs: everything between a prompt and its stream of rounds.

    ensemble.py   Ensemble: the library's front door (one prompt, or many in lockstep)
    scheduler.py  Scheduler: one batch on its own thread, requests in line, a Ticket each (the app, the API)
    operator.py   ServerSettings: a scheduler's operator settings (batch, line, step mode), declared once
    ticket.py     Ticket: one request's handle, its stream of records, cancel() and next() (step mode)
    batch.py      Batch: the round loop, the seven steps over every live run
    run.py        Run: one request's state from round to round, and its own part of each step
    gate.py       the gated round's arithmetic: who keeps the gate, whether the others are asked
    calls.py      MemberCalls: the members' part of a step, once per member for all the runs it serves

Everything here speaks in records (specfuse.records); members (specfuse.members) know nothing of it.
"""

from ..limits import check_prompt
from .batch import Batch
from .ensemble import Ensemble
from .operator import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_JOIN_WAIT,
    DEFAULT_MAX_PAUSED,
    DEFAULT_PAUSE_IDLE,
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_QUEUE,
    ServerSettings,
)
from .run import TYPED, Run
from .scheduler import (
    PauseExpired,
    QueueFull,
    Scheduler,
    SchedulerClosed,
    TooManyPaused,
)
from .ticket import Ticket

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_JOIN_WAIT",
    "DEFAULT_MAX_PAUSED",
    "DEFAULT_PAUSE_IDLE",
    "DEFAULT_PREFILL_CHUNK",
    "DEFAULT_QUEUE",
    "TYPED",
    "Batch",
    "Ensemble",
    "PauseExpired",
    "QueueFull",
    "Run",
    "Scheduler",
    "SchedulerClosed",
    "ServerSettings",
    "Ticket",
    "TooManyPaused",
    "check_prompt",
]
