"""Members for the app: loaded once and shared across sessions; what this install can offer.

Knows nothing about Gradio, nor how a member loads: specfuse.models.loading decides that (and brings
torch, imported only when a member loads).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specfuse.errors import ConfigError, UnknownModelError
from specfuse.models import catalogue

from .i18n import _

if TYPE_CHECKING:
    from specfuse.members.protocol import Member
    from specfuse.models.loading import MemberLoad
    from specfuse.models.preparation import MemberClock

log = logging.getLogger("specfuse.studio")

DEVICES = ("auto", "cpu", "cuda", "per-gpu")

Loader = Callable[[str, str, Callable[[float, str], None]], "Member"]  # (name, device, progress) → member
DevicePlan = Callable[[int, str], list[str]]  # (members, device setting) → one device each


POLL_S = 0.2  # how often a caller waiting for another's load of its member shows that load's progress


@dataclass
class Load:
    """One (name, device) load under way: its latest progress, for everyone who waits for it.

    `first`: whether it copies or converts something first (models.preparation.cold, decided when it
    began); `usual`: how long that usually takes on this machine, in words (measured, or "no
    measurement yet")."""

    name: str
    device: str
    first: bool = False
    usual: str = ""
    began: float = field(default_factory=time.perf_counter)
    fraction: float = 0.0
    message: str = ""
    done: threading.Event = field(default_factory=threading.Event)


class SharedLoader:
    """Loads each (name, device) once and hands the same member to every session.

    Members are shared, runs are not: every run keeps its own states inside Ensemble.stream().
    How a member loads (who may name what, worker processes) is models.placement.load_members's.
    No lock is held across a load (which may reach a slow server or read a slow disk): a Load per
    (name, device) makes the users who want that member wait for its one load (seeing its
    progress), and no one else. A load is timed step by step and ends with a warm-up
    (models.preparation); `prepare` starts loading members in the background, so that a Run
    pressed meanwhile waits in line for that same load.
    """

    def __init__(
        self,
        load: MemberLoad | None = None,
        *,
        allow_paths: bool = False,
        trusted: Sequence[str] = (),
        dtype: str = "auto",
        quantize: str = "none",
        processes: bool | str = False,
        trust: Mapping[str, float] | None = None,
        decode: str = "auto",
        warm: bool = True,
        cache_dir: str | None = None,
    ) -> None:
        self.load = load  # one member in this process; None: models.loading.load_member
        self.allow_paths = allow_paths
        self.trusted = frozenset(trusted)  # paths, hub ids and server specs the operator named at start
        self.dtype = dtype
        self.quantize = quantize  # every in-process member: "int8"/"int4" weights, "gguf"/"auto" llama.cpp
        self.processes = processes  # True, False or "auto": each model in a worker process of its own
        self.trust = trust  # the operator's trust file (--trust), else each member's catalogue trust
        self.decode = decode  # how transformers members draft (--decode; config.DECODE_MODES)
        self.warm = warm  # a short draft and score after each load (models.preparation.warm_up)
        self.cache_dir = cache_dir  # where the preparation times are remembered (default: the cache's)
        self.planned: list[tuple[str, str]] = []  # what `prepare` loads in the background, in order
        self._members: dict[tuple[str, str], Member] = {}
        self._loading: dict[tuple[str, str], Load] = {}  # one per load under way
        self._lock = threading.Lock()  # guards the two dicts only, never held across a load

    def __call__(self, name: str, device: str, progress: Callable[[float, str], None]) -> Member:
        key = (name, device)
        while True:
            with self._lock:
                if key in self._members:
                    return self._members[key]
                load = self._loading.get(key)
                if load is None:  # nobody loads it: this caller does
                    load = self._loading[key] = Load(name, device)
                    break
            # Someone loads it (another user, or `prepare`): wait for that load, showing its progress.
            # Loaded, the loop returns it; failed, the loop makes this caller try (one at a time).
            while not load.done.wait(POLL_S):
                if load.message:
                    progress(load.fraction, load.message)

        def report(fraction: float, message: str) -> None:
            load.fraction, load.message = fraction, message
            progress(fraction, message)

        try:
            load.first, load.usual = self._expected(name, device)
            member = self._load(name, device, report)
            with self._lock:
                return self._members.setdefault(key, member)
        finally:
            with self._lock:
                if self._loading.get(key) is load:
                    del self._loading[key]
            load.done.set()

    def under_way(self, name: str, device: str) -> Load | None:
        """The load of (name, device) under way, or None (loaded, failed or never asked)."""
        with self._lock:
            return self._loading.get((name, device))

    def loaded(self, name: str, device: str) -> bool:
        with self._lock:
            return (name, device) in self._members

    def prepare(self, names: Sequence[str], devices: Sequence[str]) -> threading.Thread:
        """Load `names` on `devices` (one each) in the background, in order, now: a Run that asks for
        one of them meanwhile waits for this same load. A failure is logged; the Run that asks
        for that member then tries it again and shows why it fails."""
        plan = list(zip(names, devices, strict=True))
        self.planned = plan

        def work() -> None:
            for name, device in plan:
                try:
                    self(name, device, lambda fraction, message: None)
                except Exception as e:  # said again, to the user, by the Run that asks for it
                    log.warning("preparing %s in the background failed: %s", name, e)

        thread = threading.Thread(target=work, name="specfuse-prepare", daemon=True)
        thread.start()
        return thread

    def _backend(self, name: str, device: str) -> str:
        from specfuse.models.names import resolve_quantize

        return resolve_quantize(self.quantize, name, device)

    def _expected(self, name: str, device: str) -> tuple[bool, str]:
        """Whether (name, device)'s load copies or converts first, and how long that usually takes."""
        from specfuse.models.names import is_server
        from specfuse.models.preparation import Times, cold, usual_text

        if is_server(name):  # nothing to copy or convert; a server's time is the server's
            return False, ""
        backend = self._backend(name, device)
        first = cold(name, backend, self.cache_dir)
        return first, usual_text(Times(self.cache_dir).usual(name, backend, first), first)

    def _load(self, name: str, device: str, progress: Callable[[float, str], None]) -> Member:
        from specfuse.models.names import is_server
        from specfuse.models.placement import load_members
        from specfuse.models.preparation import MemberClock, Times, warm_up
        from specfuse.models.trust import apply_trust

        server = is_server(name)
        clock = MemberClock(name, say=log.info if not server else lambda line: None)

        def report(fraction: float, message: str) -> None:
            clock.report(fraction, message)
            progress(0.9 * fraction, message)  # the last tenth is the warm-up's

        (member,) = load_members(
            [name],
            devices=[device],
            # The app's ensembles put two or more members on the device they choose.
            ensemble_devices=[device, device],
            dtype=self.dtype,
            quantize=self.quantize,
            allow_paths=self.allow_paths,
            allow_servers=False,  # server specs: the operator's only (trusted), never typed
            trusted=self.trusted,
            progress=report,
            processes=self.processes,
            load=self.load,
            decode=self.decode,
        )
        if self.trust is not None:
            apply_trust([member], self.trust)
        if self.warm and not server:
            clock.step("warming up")
            progress(0.92, f"{member.name}: warming up")
            # On a GPU the graphs' capture is said step by step ("capturing graphs k/n").
            warm_up(member, progress=lambda done, message: report_warm(clock, progress, done, message))
        seconds = clock.finish()
        if not server:
            Times(self.cache_dir).record(name, self._backend(name, device), clock.cold, seconds)
        progress(1.0, f"{member.name}: ready")
        return member


def report_warm(
    clock: MemberClock, progress: Callable[[float, str], None], fraction: float, message: str
) -> None:
    """A warm-up's progress (the graphs' capture) as a step of the member's clock and the last
    tenth of its load's bar."""
    clock.report(fraction, message)
    progress(0.92 + 0.07 * fraction, message)


def same_device(n: int, device: str) -> list[str]:
    return [device] * n


def installed_models() -> list[str]:
    """The catalogue's models whose packages are installed here (the others cannot load)."""
    return catalogue.installed_models()


def usable_devices() -> list[str]:
    """The device settings that can work on this machine: the GPU ones only where a GPU is visible."""
    from specfuse.models import devices

    return list(DEVICES) if devices.gpu_count() else ["auto", "cpu"]


def served_members(specs: Sequence[str], taken: Sequence[str] = ()) -> dict[str, str]:
    """The operator's name (`#NAME`) of each served member → its spec, checked at start.

    Browser users see only the names: a spec's URL and options stay on the server (issue 24,
    item 4). So each spec needs a #NAME, distinct from the other members offered; ConfigError
    names the spec's server kind and name, never its URL.
    """
    from specfuse.members.remote.member import parse_server_spec  # only with --server

    named: dict[str, str] = {}
    for spec in specs:
        parsed = parse_server_spec(spec)
        if "#" not in spec.partition("?")[0]:
            raise ConfigError(
                f"A served member ({parsed.engine}) needs a name, ENGINE:URL#NAME: browser users see "
                "the name, never the URL."
            )
        if parsed.name in named or parsed.name in taken:
            raise ConfigError(f"Two members are called {parsed.name!r}: give the served one another #NAME.")
        named[parsed.name] = spec
    return named


def check_members(names: Any, choices: Sequence[str], allow_paths: bool) -> list[str]:
    """Two or more distinct members, each from the catalogue unless paths and hub ids are allowed."""
    if isinstance(names, str):
        names = [names]
    names = [str(n).strip() for n in names or [] if str(n).strip()]
    if len(set(names)) < 2:
        raise ConfigError(_("Pick two or more different members: an ensemble of one is that model alone."))
    if len(set(names)) != len(names):
        raise ConfigError(_("Each member may be picked once; got {names}.", names=", ".join(names)))
    unknown = [n for n in names if n not in choices]
    if unknown and not allow_paths:
        raise UnknownModelError(
            _(
                "Unknown model {name}; known: {known}. Start the app with --allow-paths to use local folders "
                "or hub ids.",
                name=repr(unknown[0]),
                known=", ".join(choices),
            )
        )
    return names
