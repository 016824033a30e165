"""Members for the app: loaded once and shared across sessions; what this install can offer.

Knows nothing about Gradio, nor how a member loads: specfuse.models.loading decides that (and brings
torch, imported only when a member loads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from specfuse.models import catalogue

if TYPE_CHECKING:
    from specfuse.members.protocol import Member
    from specfuse.models.loading import MemberLoad

DEVICES = ("auto", "cpu", "cuda", "per-gpu")


class SharedLoader:
    """Loads each (name, device) once, under a lock, and hands the same member to every session.

    Members are shared, runs are not: every run keeps its own states inside Ensemble.stream().
    How a member loads (who may name what, worker processes) is models.loading.load_members's.
    """

    def __init__(
        self,
        load: MemberLoad | None = None,
        *,
        allow_paths: bool = False,
        trusted: Sequence[str] = (),
        dtype: str = "auto",
        processes: bool | str = False,
    ) -> None:
        self.load = load  # one member in this process; None: models.loading.load_member
        self.allow_paths = allow_paths
        self.trusted = frozenset(trusted)  # paths, hub ids and server specs the operator named at start
        self.dtype = dtype
        self.processes = processes  # True, False or "auto": each model in a worker process of its own
        self._members: dict[tuple[str, str], Member] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, device: str, progress: Callable[[float, str], None]) -> Member:
        with self._lock:
            key = (name, device)
            if key not in self._members:
                from specfuse.models.loading import load_members

                (self._members[key],) = load_members(
                    [name],
                    devices=[device],
                    # The app's ensembles put two or more members on the device they choose.
                    ensemble_devices=[device, device],
                    dtype=self.dtype,
                    allow_paths=self.allow_paths,
                    allow_servers=False,  # server specs: the operator's only (trusted), never typed
                    trusted=self.trusted,
                    progress=progress,
                    processes=self.processes,
                    load=self.load,
                )
            return self._members[key]


def same_device(n: int, device: str) -> list[str]:
    return [device] * n


def installed_models() -> list[str]:
    """The catalogue's models whose packages are installed here (the others cannot load)."""
    return catalogue.installed_models()


def usable_devices() -> list[str]:
    """The device settings that can work on this machine: the GPU ones only where a GPU is visible."""
    from specfuse.models import devices

    return list(DEVICES) if devices.gpu_count() else ["auto", "cpu"]
