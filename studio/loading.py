"""Members for the app: loaded once and shared across sessions; what this install can offer.

Knows nothing about Gradio, nor how a member loads: specfuse.models.loading decides that (and brings
torch, imported only when a member loads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from specfuse.errors import ConfigError, UnknownModelError
from specfuse.models import catalogue

if TYPE_CHECKING:
    from specfuse.members.protocol import Member
    from specfuse.models.loading import MemberLoad

DEVICES = ("auto", "cpu", "cuda", "per-gpu")

Loader = Callable[[str, str, Callable[[float, str], None]], "Member"]  # (name, device, progress) → member
DevicePlan = Callable[[int, str], list[str]]  # (members, device setting) → one device each


class SharedLoader:
    """Loads each (name, device) once and hands the same member to every session.

    Members are shared, runs are not: every run keeps its own states inside Ensemble.stream().
    How a member loads (who may name what, worker processes) is models.loading.load_members's.
    No lock is held across a load (which may reach a slow server or read a slow disk): one per
    (name, device) makes the users who want that member wait for its one load, and no one else.
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
    ) -> None:
        self.load = load  # one member in this process; None: models.loading.load_member
        self.allow_paths = allow_paths
        self.trusted = frozenset(trusted)  # paths, hub ids and server specs the operator named at start
        self.dtype = dtype
        self.quantize = quantize  # every in-process member: "int8"/"int4" weights, "gguf"/"auto" llama.cpp
        self.processes = processes  # True, False or "auto": each model in a worker process of its own
        self.trust = trust  # the operator's trust file (--trust), else each member's catalogue trust
        self.decode = decode  # how transformers members draft (--decode; config.DECODE_MODES)
        self._members: dict[tuple[str, str], Member] = {}
        self._loading: dict[tuple[str, str], threading.Lock] = {}  # one per load under way
        self._lock = threading.Lock()  # guards the two dicts only, never held across a load

    def __call__(self, name: str, device: str, progress: Callable[[float, str], None]) -> Member:
        key = (name, device)
        with self._lock:
            if key in self._members:
                return self._members[key]
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:  # the users who want this member wait for its one load
            with self._lock:
                if key in self._members:  # loaded while we waited
                    return self._members[key]
            try:
                member = self._load(name, device, progress)
            finally:
                with self._lock:
                    # A failed load is tried again by the next user who asks (a waiter here tries
                    # at once, on the lock it holds).
                    if self._loading.get(key) is loading:
                        del self._loading[key]
            with self._lock:
                return self._members.setdefault(key, member)

    def _load(self, name: str, device: str, progress: Callable[[float, str], None]) -> Member:
        from specfuse.models.loading import load_members
        from specfuse.models.trust import apply_trust

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
            progress=progress,
            processes=self.processes,
            load=self.load,
            decode=self.decode,
        )
        if self.trust is not None:
            apply_trust([member], self.trust)
        return member


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
    from specfuse.members.remote import parse_server_spec  # brings torch: only with --server

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
        raise ConfigError("Pick two or more different members: an ensemble of one is that model alone.")
    if len(set(names)) != len(names):
        raise ConfigError(f"Each member may be picked once; got {', '.join(names)}.")
    unknown = [n for n in names if n not in choices]
    if unknown and not allow_paths:
        raise UnknownModelError(
            f"Unknown model {unknown[0]!r}; known: {', '.join(choices)}. "
            "Start the app with --allow-paths to use local folders or hub ids."
        )
    return names
