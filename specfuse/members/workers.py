"""How the members' part of a step runs (MemberCalls): once per member for all the requests it
serves, timed, a failure named; and, when members run at the same time, where: one thread per
member, each with its share of the CPU cores or its own CUDA stream.

Why threads: torch releases the GIL inside every kernel, so members whose forward passes overlap
keep the cores busy while the other one is in Python. One worker process per member would add
copying every candidate and score across a pipe and a copy of torch per member, and it decoded no
faster than threads in any run of `python -m specfuse.bench concurrency`.

Why shares: on one CPU, two members each asking for all the cores make the OpenMP teams fight over
them. A member's intra-op threads are set in its own thread, sized by its parameter count.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any, Protocol, TypeVar

from .. import feedback
from ..config import EnsembleConfig
from ..errors import MemberError, SpecfuseError
from ..records import Candidate
from .protocol import Member, Verdict, in_this_process, shares_cpu

log = logging.getLogger(__name__)
T = TypeVar("T")


def cpu_cores() -> int:
    """The intra-op threads this process may use: torch's own count (OMP_NUM_THREADS, set_num_threads),
    without importing torch when no member needs it."""
    try:
        import torch

        return max(1, torch.get_num_threads())
    except ImportError:  # pragma: no cover - members without torch (servers only)
        return max(1, os.cpu_count() or 1)


def thread_shares(sizes: Mapping[str, float], cores: int) -> dict[str, int]:
    """Intra-op threads for each CPU member: proportional to its size, at least one each.

    With fewer cores than members every member gets one thread and the OS interleaves them (on two
    cores: 1.5x faster than taking turns in fp32, where a second thread does not speed a decode step
    up; about even in bf16, where it does).
    Shares never add up to more than max(cores, number of members).
    """
    if not sizes:
        return {}
    if cores <= len(sizes):
        return {name: 1 for name in sizes}
    total = sum(max(s, 0.0) for s in sizes.values()) or float(len(sizes))
    spare = cores - len(sizes)  # one each first, the rest by size (largest remainder)
    exact = {n: spare * (max(s, 0.0) or total / len(sizes)) / total for n, s in sizes.items()}
    shares = {n: 1 + int(x) for n, x in exact.items()}
    left = cores - sum(shares.values())
    for n in sorted(exact, key=lambda k: exact[k] - int(exact[k]), reverse=True)[:left]:
        shares[n] += 1
    return shares


class MemberWorkers:
    """One single-thread executor per member, set up once: a CPU member's thread gets its share of
    the intra-op threads, a CUDA member's thread its own stream. The same member always runs on the
    same thread, so its caches and stream stay where they were made."""

    def __init__(self, members: Sequence[Member]) -> None:
        on_cpu = [m for m in members if shares_cpu(m)]
        cores = cpu_cores()
        self.sizes = {m.name: float(m.parameters or 1.0) for m in on_cpu} if len(on_cpu) > 1 else {}
        self.shares = thread_shares(self.sizes, cores)  # all of them at work
        self.cores = cores
        self.in_processes = [m for m in members if m.name in self.shares and not in_this_process(m)]
        self.busy: set[str] = set()  # CPU members inside a call right now
        self.lock = threading.Lock()
        self.pools = {m.name: ThreadPoolExecutor(1, thread_name_prefix=f"specfuse-{m.name}") for m in members}
        for setup in [self.pools[m.name].submit(_set_up, self, m, self.shares.get(m.name)) for m in members]:
            setup.result()
        if self.shares:
            _keep_process_count(cores)
            log.info("members concurrent on the CPU, intra-op threads %s", self.shares)

    def as_completed(self, call: Callable[[str], T], names: Sequence[str]) -> Iterator[tuple[str, T]]:
        """(name, call(name)) for each member, all started at once, yielded as each finishes. A CPU
        member working alone (the others exited, or are not needed this phase) runs here instead,
        with all the cores rather than its share."""
        if len(names) == 1 and names[0] in self.shares:
            yield names[0], call(names[0])
            return
        with self.lock:
            self.busy |= {n for n in names if n in self.shares}
        futures: dict[Future[T], str] = {self.pools[n].submit(self._working, call, n): n for n in names}
        try:
            for done in as_completed(futures):
                yield futures[done], done.result()
        finally:
            with self.lock:
                self.busy -= set(names)

    def _working(self, call: Callable[[str], T], name: str) -> T:
        """call(name) on the member's thread; when it is done, its cores go to those still working."""
        try:
            rebalance()
            return call(name)
        finally:
            with self.lock:
                self.busy.discard(name)

    def share(self, name: str) -> int:
        """The member's intra-op threads now: a share among the CPU members still at work."""
        with self.lock:
            working = {n: self.sizes[n] for n in self.busy} or {name: 1.0}
        return thread_shares(working, self.cores).get(name, 1)

    def shutdown(self) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=True)
        for member in self.in_processes:  # alone, or in another ensemble, it gets every core again
            with contextlib.suppress(MemberError):  # its process is gone: the run says why already
                member.set_threads(self.cores)


_local = threading.local()  # on a member's worker thread: its workers, its name, its threads now


def rebalance() -> None:
    """Called by a member between forward passes (HFMember: each decoding step): on a CPU shared by
    members at once, take the threads of members that have finished their part of the phase, so
    that the slowest member does not finish alone on one core while the other idles."""
    workers: MemberWorkers | None = getattr(_local, "workers", None)
    if workers is None:
        return
    n = workers.share(_local.name)
    if n != _local.threads:
        import torch

        torch.set_num_threads(n)
        _local.threads = n
        _keep_process_count(workers.cores)


def thread_share() -> int | None:
    """The threads a member not run by torch (llama.cpp) may use now, rebalanced as rebalance() does;
    None off a member's worker thread (working alone: all of its cores)."""
    if getattr(_local, "workers", None) is None:
        return None
    rebalance()
    return int(_local.threads)


# torch.set_num_threads() sets the calling thread's count *and* the process-wide one that a thread
# started later takes at its first parallel op (the app runs each request on a new thread). A share
# set on a member's thread must not become every later thread's count: this thread, which does no
# torch work of its own, sets the process-wide count back.
_RESTORER = ThreadPoolExecutor(1, thread_name_prefix="specfuse-threads")


def _keep_process_count(cores: int) -> None:
    import torch

    _RESTORER.submit(torch.set_num_threads, cores)


def _set_up(workers: MemberWorkers, member: Member, share: int | None) -> None:
    import torch

    if share is not None and not in_this_process(member):  # a member in a worker process
        member.set_threads(share)
    elif share is not None:
        # torch sizes a thread's OpenMP team lazily, from the process-wide count, at the thread's
        # first parallel op. Asking for the count runs that now, so the share set next stays.
        torch.get_num_threads()
        torch.set_num_threads(share)
        _local.workers, _local.name, _local.threads = workers, member.name, share
    elif in_this_process(member) and member.device.startswith("cuda"):
        torch.cuda.set_stream(member_stream(member))  # this thread's current stream


_STREAMS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_STREAMS_LOCK = threading.Lock()


def member_stream(member: Any) -> Any:
    """The member's own CUDA stream, the same for every run. The caching allocator keeps freed blocks
    per stream: a new stream each run would cudaMalloc its caches afresh and strand the old blocks."""
    import torch

    with _STREAMS_LOCK:
        stream = _STREAMS.get(member)
        if stream is None:
            stream = _STREAMS[member] = torch.cuda.Stream(device=member.device)
        return stream


def run_concurrently(members: Sequence[Member], mode: str) -> bool:
    """Whether `parallel=mode` runs these members at the same time. "auto": when they work in several
    places (servers, GPUs, worker processes), or share a CPU with at least two cores to divide.
    Several members in this process on one GPU take turns under "auto": threads with a CUDA stream
    each ("on") were slower than taking turns on an H100 (the GIL); worker processes were 1.64x faster."""
    if mode != "auto" or len(members) < 2:
        return mode == "on" and len(members) > 1
    places = {(m.host, m.device) for m in members}
    return len(places) > 1 or (all(m.device.startswith("cpu") for m in members) and cpu_cores() > 1)


# ---- the members' part of one step of a round ---------------------------------------------------


class Request(Protocol):
    """What MemberCalls needs of one request in progress (the engine's run)."""

    prompt: str
    config: EnsembleConfig
    names: tuple[str, ...]  # the request's own members, in its order (a subset of those loaded)
    states: dict[str, Any]  # each member's state for this request


# prompt_contrast: each member's second context, the same answer after this prompt instead of the
# user's (nothing asked), kept in the run's states under a key no member name can take (the
# Ensemble refuses names that are not printable).
PROMPT_LEFT_OUT = ""


def without_prompt(m: str) -> str:
    return f"{m}\x00without the prompt"


Work = tuple[str, "Request", Any]  # (member name, run, the step's argument for that run)
Done = tuple[tuple[str, int], tuple[T, float]]  # ((member name, id(run)), (result, seconds))


class MemberCalls:
    """The members' part of a step, over every run that needs it: one call per member for all the
    runs it serves (members batch them), members at the same time (workers.py) when asked to,
    timed, and a failure re-raised with the member's name and the step.

    With `isolate`, a failure is not raised: it is kept in `failures` (by id of each run the failed
    call served) and the step goes on for the other members, so that the caller can end only the
    runs that needed the failed member."""

    def __init__(self, members: Sequence[Member], concurrent: bool, *, isolate: bool = False) -> None:
        self.members = {m.name: m for m in members}
        self.workers = MemberWorkers(members) if concurrent else None
        self.isolate = isolate
        self.failures: dict[int, SpecfuseError] = {}  # id(run) -> why it cannot go on (isolate)

    def start(self, runs: Sequence[Request]) -> None:
        """Each run's own members start it, each member once for all the runs it serves (start_many:
        an HFMember reads their prompts together); member i of the run's own list gets
        member_settings(i), so that a run of a subset equals an ensemble of that subset. One run's
        bad prompt (too long for a member's context) fails that run, not the others starting beside
        it; a start_many that raises fails every run it served. A run with prompt_contrast also
        starts each member with the prompt left out (its state under without_prompt(m))."""

        def begin(m: str, group: list[Request], left_out: list[bool]) -> list[tuple[bool, Any]]:
            settings = [r.config.member_settings(r.names.index(m)) for r in group]
            prompts = [PROMPT_LEFT_OUT if out else r.prompt for r, out in zip(group, left_out)]
            return list(zip(left_out, self.members[m].start_many(prompts, settings)))

        work = [(m, r, False) for r in runs for m in r.names]
        work += [(m, r, True) for r in runs if r.config.prompt_contrast for m in r.names]
        for (m, key), ((left_out, state), _) in self._by_member("start", work, begin):
            run = next(r for r in runs if id(r) == key)
            if left_out and isinstance(state, SpecfuseError):  # say why a prompt nobody typed was read
                state = type(state)(
                    f"prompt_contrast: {m} cannot start a context without the prompt: {state}"
                )
            if not isinstance(state, SpecfuseError):
                run.states[without_prompt(m) if left_out else m] = state
            elif self.isolate:
                self.failures.setdefault(key, state)
            else:
                raise state

    def surprise(self, m: str, run: Request) -> float | None:
        """The member's surprise at the prompt (nats per byte), when it can tell (prior weights)."""
        return self.members[m].prompt_surprise(run.states[m])

    def trust(self, m: str) -> float | None:
        return self.members[m].trust

    def draft(self, work: Sequence[Work]) -> Iterator[Done[Candidate]]:
        """Each member's candidates, yielded as each member finishes (the fastest first)."""

        def draft(m: str, group: list[Request], budgets: list[int]) -> list[Candidate]:
            return self.members[m].draft_many([r.states[m] for r in group], budgets)

        return self._by_member("draft", work, draft)

    def verify(self, work: Sequence[Work]) -> dict[tuple[str, int], tuple[Verdict, float]]:
        """Each verifier's raw scores z_i· (and token evidence, from members that keep it)."""

        def verify(m: str, group: list[Request], candidates: list[Sequence[Candidate]]) -> list[Verdict]:
            # Runs with prompt_contrast score their candidates a second time with the prompt left
            # out, in the same call (a member batches both).
            contrasted = [i for i, r in enumerate(group) if r.config.prompt_contrast]
            states = [r.states[m] for r in group] + [group[i].states[without_prompt(m)] for i in contrasted]
            verdicts = self.members[m].score_many(states, [*candidates, *(candidates[i] for i in contrasted)])
            out = verdicts[: len(group)]
            for i, (z_without, _) in zip(contrasted, verdicts[len(group) :]):
                z, evidence = out[i]
                out[i] = (feedback.prompt_contrast(z, z_without, group[i].config.prompt_contrast), evidence)
            return out

        return dict(self._by_member("score", work, verify))

    def accept(self, work: Sequence[Work]) -> dict[tuple[str, int], tuple[None, float]]:
        """Each member appends the text to each request's context; the seconds it took."""

        def accept(m: str, group: list[Request], texts: list[str]) -> list[None]:
            member = self.members[m]
            for r, t in zip(group, texts):
                member.accept(r.states[m], t)
                if r.config.prompt_contrast:
                    member.accept(r.states[without_prompt(m)], t)
            return [None] * len(group)

        return dict(self._by_member("accept", work, accept))

    def _by_member(
        self, step: str, work: Sequence[Work], call: Callable[[str, list[Request], list[Any]], list[T]]
    ) -> Iterator[Done[T]]:
        groups: dict[str, list[tuple[Request, Any]]] = {}
        for m, run, arg in work:
            groups.setdefault(m, []).append((run, arg))

        def timed(m: str) -> list[tuple[T, float]] | SpecfuseError:
            runs = [r for r, _ in groups[m]]
            began = time.perf_counter()
            try:
                try:
                    outs = call(m, runs, [a for _, a in groups[m]])
                except SpecfuseError:
                    raise
                except Exception as e:  # re-raised with the member's name, never swallowed
                    raise MemberError(f"{m}: {step} failed: {type(e).__name__}: {e}") from e
            except SpecfuseError as e:
                if not self.isolate:
                    raise
                return e
            each = (time.perf_counter() - began) / max(1, len(runs))  # a batch's time, shared out
            return [(o, each) for o in outs]

        names = list(groups)
        if self.workers is None:
            finished: Iterator[tuple[str, list[tuple[T, float]] | SpecfuseError]] = (
                (m, timed(m)) for m in names
            )
        else:
            finished = self.workers.as_completed(timed, names)
        for m, outs in finished:
            if isinstance(outs, SpecfuseError):  # isolate: the runs this call served cannot go on
                for run, _ in groups[m]:
                    self.failures.setdefault(id(run), outs)
                continue
            for (run, _), out in zip(groups[m], outs):
                yield (m, id(run)), out

    def shutdown(self) -> None:
        if self.workers is not None:
            self.workers.shutdown()
