"""Where members run when they work at the same time: one thread per member, each with its share of
the CPU cores or its own CUDA stream (the engine's MemberCalls, engine/calls.py, asks them here).

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
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any, TypeVar

from ..errors import MemberError
from .protocol import Member, in_this_process, shares_cpu

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
    each ("on") were slower than taking turns on an H100 (the GIL); worker processes were 1.64x faster.
    Members that all say they run faster in turns on a CPU (cpu_turns) take turns there."""
    if mode != "auto" or len(members) < 2:
        return mode == "on" and len(members) > 1
    places = {(m.host, m.device) for m in members}
    if len(places) > 1:
        return True
    on_cpu = all(m.device.startswith("cpu") for m in members)
    return on_cpu and cpu_cores() > 1 and not all(m.cpu_turns for m in members)
