"""Preparing members: the steps a member goes through before its first round (copying, converting,
loading, warming up, and on a GPU capturing its steps as CUDA graphs), how long each took, and how
long the first time usually takes on this machine.

A member's first load can take most of a minute (its GGUF file assembled and converted, the weights
read, the first calls' lazy set-up), and a person waiting for it sees nothing else happen. This
module names what is happening so that the app's status line and `specfuse-serve`'s log and
`/health` can say it: `step_of` reads a load's progress messages (cache.py's and loading.py's) as
steps, `MemberClock` times each step of one member, `Times` remembers the totals in the cache
folder (measured, never guessed), `Preparation` is what a server says while it prepares, and
`warm_up` pays a member's first-call costs before a person's run does.

Imports no torch: the app asks it for the status line before anything loads.
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specfuse.errors import ModelLoadError

from .cache import MARKER, Progress, cache_root, no_progress
from .catalogue import CATALOGUE, locate_chunks

if TYPE_CHECKING:
    from specfuse.members.protocol import Member

log = logging.getLogger(__name__)

STEPS = ("copying", "converting", "loading", "warming up", "capturing graphs")
TIMES_FILE = "preparation-times.json"  # in the cache folder: what preparing each member took here
KEPT = 5  # measurements kept per member, back end and kind (the usual time is their median)

# Words of the load's progress messages (cache.py, loading.py, names.py) → the step they belong to.
# The first match wins, so the more specific phrases come first.
_STEP_WORDS: tuple[tuple[str, str], ...] = (
    ("capturing graphs", "capturing graphs"),
    ("warming up", "warming up"),
    ("assembling", "copying"),
    ("verifying hash", "copying"),
    ("checking the sha-256", "copying"),
    ("rebuilding", "copying"),
    ("converting", "converting"),
    ("saving safetensors", "converting"),
    ("hashing the cache", "converting"),
    ("tokenizer", "loading"),
    ("loading", "loading"),
    ("reaching", "loading"),
)


def step_of(message: str) -> str | None:
    """The step a progress message belongs to (one of STEPS), or None when it names none ("ready")."""
    text = message.lower()
    return next((step for words, step in _STEP_WORDS if words in text), None)


def cold(name: str, quantize: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether preparing `name` the way `quantize` (already resolved) loads it converts something first:
    a catalogue model for torch without its converted folder, or a GGUF file in several chunks that
    llama.cpp needs assembled. A guess from the cache folder, for the estimate only: what really
    happened is in the steps a MemberClock saw."""
    entry = CATALOGUE.get(name)
    if entry is None:
        return False
    root = cache_root(cache_dir)
    torch_first = not (root / name / MARKER).is_file()
    try:
        assembled = len(locate_chunks(entry)) == 1 or (root / "gguf" / entry.gguf_name).is_file()
    except ModelLoadError:  # not installed: its load says so
        return False
    if quantize == "gguf":
        return not assembled
    return torch_first or (quantize == "gguf-draft" and not assembled)


@dataclass
class MemberClock:
    """One member's preparation, timed step by step: feed it the load's progress (`report`), then
    `step("warming up")`, then `finish()`. Each step's end is logged with its time."""

    name: str
    say: Callable[[str], None] = log.info
    began: float = field(default_factory=time.perf_counter)
    step_now: str | None = None
    step_began: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)  # step → seconds, in the order seen

    def report(self, fraction: float, message: str) -> None:
        step = step_of(message)
        if step is not None:
            self.step(step)

    def step(self, step: str) -> None:
        if step == self.step_now:
            return
        now = time.perf_counter()
        self._end(now)
        self.step_now, self.step_began = step, now
        self.say(f"{self.name}: {step}")

    def _end(self, now: float) -> None:
        if self.step_now is not None:
            took = now - self.step_began
            self.steps[self.step_now] = self.steps.get(self.step_now, 0.0) + took
            self.say(f"{self.name}: {self.step_now} took {took:.1f} s")

    @property
    def cold(self) -> bool:
        """Whether this preparation copied or converted anything (else: everything was cached)."""
        return bool({"copying", "converting"} & {*self.steps, self.step_now})

    def finish(self) -> float:
        """The whole preparation's seconds (the last step ended now), logged."""
        now = time.perf_counter()
        self._end(now)
        self.step_now = None
        total = now - self.began
        parts = ", ".join(f"{s} {t:.1f} s" for s, t in self.steps.items())
        self.say(f"{self.name}: ready in {total:.1f} s ({parts or 'nothing to do'})")
        return total


class Times:
    """What preparing each member took on this machine, remembered in the cache folder.

    Keyed by member and back end ("gemma3-270m · gguf") and kind: "first" (something was copied or
    converted: the first time on this machine) or "cached". A missing or unreadable file is no
    measurement (never an error: the estimate is a courtesy); writing is atomic."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.path = cache_root(cache_dir) / TIMES_FILE
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def key(name: str, backend: str) -> str:
        return f"{name} · {backend}"

    def usual(self, name: str, backend: str, first: bool) -> tuple[float, int] | None:
        """The median seconds of the kept measurements of this kind, and how many; None: none yet."""
        kind = "first" if first else "cached"
        seconds = self._read().get(self.key(name, backend), {}).get(kind, [])
        seconds = [s for s in seconds if isinstance(s, (int, float)) and s >= 0]
        return (float(statistics.median(seconds)), len(seconds)) if seconds else None

    def record(self, name: str, backend: str, first: bool, seconds: float) -> None:
        kind = "first" if first else "cached"
        with self._lock:
            data = self._read()
            entry = data.setdefault(self.key(name, backend), {})
            entry[kind] = [*entry.get(kind, []), round(seconds, 2)][-KEPT:]
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                part = self.path.with_name(f"{TIMES_FILE}.{os.getpid()}.{threading.get_ident()}.part")
                part.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
                os.replace(part, self.path)
            except OSError as e:  # a read-only cache: no memory, nothing else lost
                log.info("could not record preparation times in %s: %s", self.path, e)


def usual_text(usual: tuple[float, int] | None, first: bool) -> str:
    """How long this usually takes here, in words; says so when nothing was measured yet."""
    when = "the first time (converting)" if first else "from the cache"
    if usual is None:
        return f"no measurement yet on this machine of preparing it {when}: this one is being timed"
    seconds, count = usual
    times = "once" if count == 1 else f"{count} times"
    return f"{when} it usually takes about {seconds:.0f} s on this machine (measured {times})"


# ---- warm-up -------------------------------------------------------------------------------------

WARM_PROMPT = "Say hello."


def warm_up(member: Member, tokens: int = 4, progress: Progress = no_progress) -> None:
    """A short draft and a score on a tiny prompt: the first calls' costs (lazy set-up, the first
    pages of the weights, kernels picked) are paid here rather than in a person's first round.
    First, a member that captures its steps as CUDA graphs (members/hf/slots.py) captures them all,
    each said through `progress` ("NAME: capturing graphs k/n"), so that no request waits for one."""
    from specfuse.config import MemberSettings

    state = member.start(WARM_PROMPT, MemberSettings(max_new_tokens=tokens))
    prepare = getattr(member, "prepare_steps", None)
    if prepare is not None:
        prepare(state, progress)
    candidate = member.draft(state, tokens)
    member.score(state, [candidate])


def warmed(name: str, *, progress: Progress = no_progress, **options: Any) -> Member:
    """loading.load_member, then warm_up (a served member is not warmed: its server is)."""
    from .loading import load_member
    from .names import is_server

    member = load_member(name, progress=progress, **options)
    if not is_server(name):
        progress(0.95, f"{name}: warming up")
        warm_up(member, progress=lambda fraction, message: progress(0.95 + 0.04 * fraction, message))
    return member


# ---- what a server says while it prepares --------------------------------------------------------


class Preparation:
    """A process's preparation of `names` as `/health` reports it: the phase ("preparing", "ready",
    "failed"), the member and its step, how far, since when; each member timed (MemberClock, logged
    with `say`) and its time remembered (Times). Feed it the load's progress (`progress`, which finds
    the member in the message), then `ready()` or `failed(error)`."""

    def __init__(
        self,
        names: Sequence[str],
        backend: Callable[[str], str],
        say: Callable[[str], None] = log.info,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.names = list(dict.fromkeys(names))
        self.backend = backend
        self.say = say
        self.times = Times(cache_dir)
        self.cache_dir = cache_dir
        self.began = time.perf_counter()
        self.phase = "preparing"
        self.fraction = 0.0
        self.error: str | None = None
        self.clocks: dict[str, MemberClock] = {}
        self.current: str | None = None
        self.firsts = {n: cold(n, backend(n), cache_dir) for n in self.names}
        self._lock = threading.Lock()

    def _clock(self, name: str) -> MemberClock:
        if self.current is not None and self.current != name:
            self._done(self.current)
        self.current = name
        if name not in self.clocks:
            self.clocks[name] = MemberClock(name, self.say)
        return self.clocks[name]

    def _done(self, name: str) -> None:
        clock = self.clocks.get(name)
        if clock is not None and clock.step_now is not None:  # not finished yet
            self.times.record(name, self.backend(name), clock.cold, clock.finish())

    def progress(self, fraction: float, message: str) -> None:
        with self._lock:
            self.fraction = max(self.fraction, min(max(fraction, 0.0), 1.0))
            named = [n for n in self.names if re.search(rf"(?<![\w.#/-]){re.escape(n)}(?![\w.#/-])", message)]
            name = max(named, key=len) if named else self.current
            if name is not None:
                self._clock(name).report(fraction, message)

    def ready(self) -> None:
        with self._lock:
            if self.current is not None:
                self._done(self.current)
            self.current, self.phase, self.fraction = None, "ready", 1.0
            self.say(f"members ready in {time.perf_counter() - self.began:.1f} s")

    def failed(self, error: BaseException) -> None:
        with self._lock:
            self.phase, self.error = "failed", str(error)

    def snapshot(self) -> dict[str, Any]:
        """What is happening, for /health: phase, member, step, fraction, seconds so far, and how long
        the member's preparation usually takes here (null: not measured yet)."""
        with self._lock:
            clock = self.clocks.get(self.current) if self.current is not None else None
            usual = None
            if self.current is not None:
                first = self.firsts.get(self.current, False)
                measured = self.times.usual(self.current, self.backend(self.current), first)
                usual = None if measured is None else round(measured[0], 1)
            return {
                "phase": self.phase,
                "member": self.current,
                "step": clock.step_now if clock is not None else None,
                "progress": round(self.fraction, 3),
                "elapsed_s": round(time.perf_counter() - self.began, 1),
                "usual_s": usual,
                "members": self.names,
                **({"error": self.error} if self.error is not None else {}),
            }


__all__ = [
    "STEPS",
    "MemberClock",
    "Preparation",
    "Times",
    "cold",
    "step_of",
    "usual_text",
    "warm_up",
    "warmed",
]
