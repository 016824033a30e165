"""Members for the app: loaded once and shared across sessions; what this install can offer.

Knows nothing about Gradio. Imports specfuse.models.catalogue (and with it torch) only when asked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specfuse.members.hf import Member

DEVICES = ("auto", "cpu", "cuda", "per-gpu")


class SharedLoader:
    """Loads each (name, device) once, under a lock, and hands the same member to every session.

    Members are shared, runs are not: every run keeps its own states inside Ensemble.stream().
    """

    def __init__(
        self,
        load: Callable[..., Member] | None = None,
        *,
        allow_paths: bool = False,
        trusted: Sequence[str] = (),
        dtype: str = "auto",
        processes: bool | str = False,
    ) -> None:
        self.load = (
            load  # None: specfuse.models.catalogue.load_member, imported on first use (it brings torch)
        )
        self.allow_paths = allow_paths
        self.trusted = frozenset(trusted)  # paths or hub ids the operator named on the command line
        self.dtype = dtype
        self.processes = processes  # True, False or "auto": each model in a worker process of its own
        self._members: dict[tuple[str, str], Member] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, device: str, progress: Callable[[float, str], None]) -> Member:
        with self._lock:
            key = (name, device)
            if key not in self._members:
                if self.load is None:
                    from specfuse.models.catalogue import load_member

                    self.load = load_member
                options: dict[str, Any] = dict(
                    device=device,
                    dtype=self.dtype,
                    allow_paths=self.allow_paths or name in self.trusted,
                    allow_servers=name in self.trusted,  # server specs: the operator's only, never typed
                )
                from specfuse.members.process import ProcessMember, wanted
                from specfuse.members.remote import is_server_spec
                from specfuse.members.workers import cpu_cores

                # The app's ensembles put several members on the device they choose.
                in_process = wanted(self.processes, [device, device], cpu_cores())
                if in_process and not is_server_spec(name):
                    progress(0.0, f"loading {name} in a process of its own")
                    self._members[key] = ProcessMember.from_catalogue(name, **options)
                    progress(1.0, f"{name} loaded")
                else:
                    self._members[key] = self.load(name, progress=progress, **options)
            return self._members[key]


def same_device(n: int, device: str) -> list[str]:
    return [device] * n


def installed_models() -> list[str]:
    """The catalogue's models whose packages are installed here (the others cannot load)."""
    from specfuse.errors import ModelLoadError
    from specfuse.models.catalogue import CATALOGUE, _locate_chunks  # the catalogue's installed-check

    names = []
    for name, entry in CATALOGUE.items():
        try:
            _locate_chunks(entry)
        except ModelLoadError:
            continue
        names.append(name)
    return names


def usable_devices() -> list[str]:
    """The device settings that can work on this machine: the GPU ones only where a GPU is visible."""
    from specfuse.models.catalogue import _gpu_count

    return list(DEVICES) if _gpu_count() else ["auto", "cpu"]
