"""A member in a worker process of its own: its own interpreter, so its own GIL.

Why: at batch 1 a decoding step of a Hugging Face model is mostly Python launching kernels. Members
in threads of one process take turns holding the GIL, so on one GPU they decoded no faster at once
than in turn (`python -m specfuse.bench gpu`, H100: threads 1.26×, one process per member 2.18× for
bare decoding). A `ProcessMember` builds its member inside a worker process and forwards the Member
calls over a pipe; the engine runs such members at the same time under `parallel="auto"`.

Workers are forked from a fork server that has imported torch once (multiprocessing's "forkserver",
Linux's default from Python 3.14), not spawned: a tiny member's worker costs 4.3–4.6 CPU-s instead of
8.6 (a fresh interpreter importing torch each time). The server imports torch and nothing that touches
CUDA, so a worker may use a GPU; each worker takes the parent's environment as it is at its start, as a
spawned one would, and its working folder. Where there is no fork server (Windows), workers are spawned.

The pipe carries our own objects between our own processes (multiprocessing pickles them): prompts,
settings, candidates and scores, never a file or anything a user uploads.

Every call has a deadline: a worker that misses it (hung in a kernel, a deadlock, a swap storm) is
ended, the call raises a MemberError naming the member and the method, and the member stays
unusable with a message that says why, rather than freezing every run that uses it.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import pickle
import signal
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import MemberSettings
from ..errors import MemberError, SpecfuseError
from ..heap import freeze_survivors
from ..prompts import Prompt
from ..records import Candidate
from .protocol import BaseMember, Member, Verdict

# From this many cores up, members sharing a CPU decode faster in processes than in threads.
# `python -m specfuse.bench gpu --shapes trio --device cpu` (the default trio's shapes, bf16, exit
# off) on a Xeon, speed-up over members in turn, processes / threads: 4 cores 1.05x / 1.02x, 8 cores
# 1.71x / 1.25x, 16 cores 1.54x / 1.10x; the real trio on 2 cores (bench_concurrency) 1.14x / 1.23x.
MIN_CPU_CORES = 8

# A call's deadline. Generous: a first draft includes the prompt's prefill, which for a 7-9B member
# on a CPU and a long prompt takes minutes; anything slower is a worker that no longer answers.
DEFAULT_CALL_TIMEOUT_S = 600.0


def processes_pay_off(devices: Sequence[str], cores: int) -> bool:
    """Whether members on `devices` (one entry per member) run faster each in a worker process of
    its own than in threads of this one: when several share a GPU (three 7-9B members on one H100:
    1.64x faster than in turn, threads 0.91x) or a CPU with MIN_CPU_CORES cores or more."""
    shared = [device for device, count in Counter(devices).items() if count > 1]
    return any(d.startswith("cuda") or (d.startswith("cpu") and cores >= MIN_CPU_CORES) for d in shared)


def wanted(mode: bool | str, devices: Sequence[str], cores: int) -> bool:
    """`processes` as the CLI, the app and load_members take it: True/"on", False/"off" or "auto"
    (processes_pay_off for these devices)."""
    if mode in (True, "on"):
        return True
    if mode in (False, "off"):
        return False
    if mode == "auto":
        return processes_pay_off(devices, cores)
    raise ValueError(f"processes must be 'auto', 'on' or 'off', not {mode!r}")


@dataclass(frozen=True, eq=False)
class ProcessState:
    """A request's state in the worker process: a handle; the state itself (its caches) stays there."""

    id: int


class ProcessMember(BaseMember):
    """A member built by `build()` in a process of its own, used like any other member.

    `build` must be picklable (a module-level function or a functools.partial of one): it goes to a
    process forked from the fork server (module docstring), never from this one, whose CUDA a forked
    child could not use. `threads` sets the process's torch
    intra-op threads (a CPU member's share of the cores); None leaves torch's default.
    `call_timeout`: each call's deadline in seconds; a worker that misses it is ended.
    """

    def __init__(
        self,
        build: Callable[[], Any],
        *,
        threads: int | None = None,
        start_timeout: float = 1800,
        call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        if not call_timeout > 0:
            raise ValueError(f"call_timeout must be a positive number of seconds, not {call_timeout!r}")
        self.call_timeout = call_timeout
        self._stopped: str | None = None  # why the worker was ended, once it was
        context = worker_context()
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, build, threads, dict(os.environ), os.getcwd()), daemon=True
        )
        self._process.start()
        child.close()
        self._lock = threading.Lock()
        self._dropped: deque[int] = deque()  # handles collected here, sent with the next call
        try:
            if not self._conn.poll(start_timeout):
                raise MemberError(
                    f"a member's worker process did not finish building in {start_timeout:.0f} s"
                )
            status, info = self._conn.recv()  # what the process built, or why it could not
        except (EOFError, OSError) as e:
            _close(self._conn, self._process)
            raise MemberError(
                f"a member's worker process ended while building (exit code {self._process.exitcode})"
            ) from e
        except MemberError:
            _close(self._conn, self._process)
            raise
        if status == "error":
            _close(self._conn, self._process)
            raise info
        self.name = info["name"]
        self.device = info["device"]  # the device its weights are on, in that process
        self.host = f"process {self._process.pid}"  # the engine runs members in other places at once
        self.trust = info["trust"]
        self.parameters = info["parameters"]
        self.captures = info["captures"]  # whether its steps are captured as CUDA graphs (slots.py)
        self._closer = weakref.finalize(self, _close, self._conn, self._process)

    # ---- the Member protocol ------------------------------------------------------------------------

    def start(self, prompt: Prompt, settings: MemberSettings) -> ProcessState:
        state = ProcessState(self._call("start", prompt, settings))
        weakref.finalize(state, self._dropped.append, state.id)
        return state

    def start_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        """The worker's start_many in one call: a handle for each request that started, the error of
        each that did not."""
        return self._started("start_many", prompts, settings)

    def open_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        return self._started("open_many", prompts, settings)

    def prefill_many(self, states: Sequence[ProcessState], budget: int) -> list[bool]:
        return self._call("prefill_many", [s.id for s in states], budget)

    def _started(self, how: str, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        out: list[Any] = []
        for started in self._call(how, list(prompts), list(settings)):
            if isinstance(started, BaseException):  # a SpecfuseError, unless it could not cross
                error = started if isinstance(started, SpecfuseError) else None
                out.append(error or MemberError(f"{self.name}: start failed: {started}"))
                continue
            state = ProcessState(started)
            weakref.finalize(state, self._dropped.append, state.id)
            out.append(state)
        return out

    def draft(self, state: ProcessState, max_new_tokens: int) -> Candidate:
        return self._call("draft", state.id, max_new_tokens)

    def score(self, state: ProcessState, candidates: Sequence[Candidate]) -> list[float]:
        return self._call("score", state.id, list(candidates))

    def accept(self, state: ProcessState, text: str) -> None:
        self._call("accept", state.id, text)

    def draft_many(self, states: Sequence[ProcessState], budgets: Sequence[int]) -> list[Candidate]:
        return self._call("draft_many", [s.id for s in states], list(budgets))

    def score_many(
        self, states: Sequence[ProcessState], candidates: Sequence[Sequence[Candidate]]
    ) -> list[Verdict]:
        return self._call("score_many", [s.id for s in states], [list(c) for c in candidates])

    def prompt_surprise(self, state: ProcessState) -> float | None:
        return self._call("prompt_surprise", state.id)

    def prepare_steps(self, state: ProcessState, progress: Callable[[float, str], None]) -> None:
        """The worker's member captures its steps (HFMember.prepare_steps), said here as one step:
        its progress stays in the worker process (a pipe carries replies, not progress). A member
        that captures nothing (a CPU's, llama.cpp's) says nothing."""
        if not self.captures:
            return
        progress(0.0, f"{self.name}: capturing graphs (in its worker process)")
        said = self._call("prepare_steps", state.id)
        if said:
            progress(1.0, f"{self.name}: {said}")  # its last word: "capturing graphs n/n", or a failure

    def set_threads(self, threads: int) -> None:
        """The worker process's torch intra-op threads: its share of a CPU it shares with others
        (workers.MemberWorkers sets it for each run)."""
        self._call("threads", threads)

    def threads_now(self) -> int:
        """The worker process's torch intra-op threads now."""
        return self._call("threads_now")

    # ---- the pipe ---------------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:  # held at most call_timeout: the worker answers by then or is ended
            if self._stopped is not None:
                raise MemberError(f"{self.name}: {self._stopped}; load the member again")
            dropped = [self._dropped.popleft() for _ in range(len(self._dropped))]  # atomic pops
            try:
                self._conn.send((method, args, dropped))
                if not self._conn.poll(self.call_timeout):
                    self._stop(method)
                    raise MemberError(
                        f"{self.name}: its worker process did not answer {method} within its "
                        f"{self.call_timeout:g} s deadline, so it was stopped"
                    )
                status, value = self._conn.recv()
            except (EOFError, OSError) as e:
                code = self._process.exitcode
                raise MemberError(
                    f"{self.name}: its worker process ended (exit code {code}) during {method}"
                ) from e
        if status == "error":
            raise value
        return value

    def _stop(self, method: str) -> None:
        """End a worker that missed its deadline: its answer, if it ever came, would be to a call
        no one waits for, and the pipe would be out of step."""
        self._stopped = (
            f"its worker process was stopped after missing its {self.call_timeout:g} s deadline "
            f"during {method}"
        )
        self._process.terminate()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)

    def apply(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(member, *args)` in the worker process, on the member it built: for benchmarks and tools
        that read a member's insides (its KV slots' counts, its weights' bytes; `on_member`). `fn` must
        be a module-level function (the pipe sends it by name) and its result must pickle."""
        return self._call("apply", fn, *args)

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def close(self) -> None:
        """End the worker process (also done when this object is collected or Python exits)."""
        self._closer()


def on_member(member: Member, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(member, *args)` where the member lives: in its worker process for a ProcessMember (`fn` a
    module-level function), here for any other."""
    if isinstance(member, ProcessMember):
        return member.apply(fn, *args)
    return fn(member, *args)


def _close(conn: Any, process: Any) -> None:
    with contextlib.suppress(OSError, ValueError):  # already gone, or already closed
        conn.send(("close", (), []))
    process.join(10)
    if process.is_alive():
        process.terminate()
        process.join(5)
    conn.close()


# ---- the worker process ----------------------------------------------------------------------------


def worker_context() -> Any:
    """The multiprocessing context workers start from: the fork server with torch imported, else spawn.
    A child started from it takes the environment and folder the fork server had at its start: pass
    the parent's own along (as `_serve` and the benchmarks' races do)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch"])  # read when the server starts: the first worker's
    return context


def take_place(env: dict[str, str], cwd: str) -> None:
    """In a worker: the parent's environment and folder as they were at its start, not the fork
    server's at the server's start."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)


def _serve(conn: Any, build: Callable[[], Any], threads: int | None, env: dict[str, str], cwd: str) -> None:
    """Build the member, then answer calls until told to close or the parent goes away."""
    take_place(env, cwd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    if threads is not None:
        _set_threads(threads)
    try:
        member = build()
    except BaseException as e:  # reported to the parent, which raises it
        conn.send(("error", _portable(e)))
        return
    # The worker serves until it is closed: what its start-up made (torch's and the model's objects) is
    # kept out of the garbage collector's full passes, which would hold its every call (heap.py).
    freeze_survivors(lambda line: None)
    states: dict[int, Any] = {}
    handlers = _handlers(member, states)
    conn.send(("ok", handlers["describe"]()))
    while True:
        try:
            method, args, dropped = conn.recv()
        except (EOFError, OSError):
            return
        for handle in dropped:
            states.pop(handle, None)
        if method == "close":
            return
        try:
            reply: tuple[str, Any] = ("ok", handlers[method](*args))
        except BaseException as e:
            reply = ("error", _portable(e))
        try:  # pickled whole before anything is written: a failure leaves the pipe clean
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            conn.send(("error", RuntimeError(f"{method}: its result cannot be sent back: {e}")))


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _threads_now() -> int:
    import torch

    return torch.get_num_threads()


def _handlers(member: Member, states: dict[int, Any]) -> dict[str, Callable[..., Any]]:
    counter = itertools.count()

    def start(prompt: Prompt, settings: MemberSettings) -> int:
        handle = next(counter)
        states[handle] = member.start(prompt, settings)
        return handle

    def start_many(prompts: list[Prompt], settings: list[MemberSettings], how: str = "start_many") -> list:
        out: list[Any] = []
        for started in getattr(member, how)(prompts, settings):
            if isinstance(started, BaseException):  # that request's error, sent back as it is
                out.append(_portable(started))
                continue
            handle = next(counter)
            states[handle] = started
            out.append(handle)
        return out

    def threads(n: int) -> None:
        _set_threads(n)
        member.set_threads(n)  # a member not run by torch (llama.cpp) keeps its own count

    def describe() -> dict[str, Any]:
        return {
            "name": member.name,
            "device": member.device,
            "trust": member.trust,
            "parameters": member.parameters,
            "captures": bool(getattr(getattr(member, "slots", None), "capture", False)),
        }

    out: dict[str, Callable[..., Any]] = {
        "describe": describe,
        "start": start,
        "start_many": start_many,
        "open_many": lambda prompts, settings: start_many(prompts, settings, "open_many"),
        "prefill_many": lambda handles, budget: member.prefill_many([states[h] for h in handles], budget),
        "draft": lambda h, n: member.draft(states[h], n),
        "score": lambda h, candidates: list(member.score(states[h], candidates)),
        "accept": lambda h, text: member.accept(states[h], text),
        "draft_many": lambda handles, budgets: member.draft_many([states[h] for h in handles], budgets),
        "score_many": lambda handles, cands: member.score_many([states[h] for h in handles], cands),
        "prompt_surprise": lambda h: member.prompt_surprise(states[h]),
        "prepare_steps": lambda h: _prepare_steps(member, states[h]),
        "threads": threads,
        "threads_now": _threads_now,
        "apply": lambda fn, *args: fn(member, *args),
        "held": lambda: len(states),  # states not yet released (for tests and leak checks)
    }
    return out


def _prepare_steps(member: Member, state: Any) -> str | None:
    """A member's start-up capture in its worker (where it has one), and its last word on it."""
    prepare = getattr(member, "prepare_steps", None)
    if prepare is None:
        return None
    said: list[str] = []
    prepare(state, lambda fraction, message: said.append(message.partition(": ")[2]))
    return said[-1] if said else None


def _portable(error: BaseException) -> BaseException:
    """The error itself when it survives the pipe, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


__all__ = ["MIN_CPU_CORES", "ProcessMember", "ProcessState", "on_member", "processes_pay_off", "wanted"]
