"""An ensemble's members: where each loads (its device, a worker process of its own or here), a
model listed twice loaded once, and the terminal's progress bar over it all.

One member is loading.py's (`load_member`); this module decides where each of an ensemble's names
goes and calls it there: the one ensemble loading path of the CLI, the app, the benchmarks and the
evaluation.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from specfuse.errors import ConfigError
from specfuse.members.process import ProcessMember, wanted
from specfuse.members.workers import cpu_cores

from .cache import Progress
from .devices import check_decode, plan_devices
from .loading import MemberLoad, load_member
from .names import is_server
from .quantize import check_quantize

if TYPE_CHECKING:
    from specfuse.members.protocol import Member

# load_member's defaults: an option left at its default is not passed (a `load` may not take it).
_LOAD_DEFAULTS = {"compile_decode": False, "quantize": "none", "decode": "auto"}


def load_in_process(
    name_or_path: str, *, threads: int | None = None, load: MemberLoad | None = None, **options: Any
) -> ProcessMember:
    """`load(name_or_path, **options)` (load_member by default) in a worker process of its own.

    `threads`: the process's torch intra-op threads (a CPU member's share of the cores); None leaves
    torch's default. `load` and `options` go to another process, so they must pickle.
    """
    build = functools.partial(load or load_member, name_or_path, **options)
    return ProcessMember(build, threads=threads)


def load_each(
    names: Sequence[str],
    devices: Sequence[str],
    load: Callable[[str, str, Progress], Member],
    progress: Progress | None = None,
) -> list[Member]:
    """`load(name, device, progress)` for each name on its device, in order; member i of n reports
    its progress as the i-th n-th part of the whole."""
    members: list[Member] = []
    for i, (name, device) in enumerate(zip(names, devices, strict=True)):

        def step(fraction: float, message: str, i: int = i) -> None:
            if progress is not None:
                progress((i + fraction) / len(names), message)

        members.append(load(name, device, step))
    return members


def load_members(
    names: Sequence[str],
    *,
    device: str = "cpu",
    devices: Sequence[str] | None = None,
    dtype: str = "auto",
    device_map: str | dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    allow_paths: bool = True,
    allow_servers: bool | None = None,
    trusted: Collection[str] = (),
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    processes: bool | str = False,
    ensemble_devices: Sequence[str] | None = None,
    load: MemberLoad | None = None,
    compile_decode: bool = False,
    quantize: str = "none",
    decode: str = "auto",
) -> list[Member]:
    """The members of one ensemble, in the order of `names`: the one loading path of the CLI, the
    app, the benchmarks and the evaluation.

    Where: `devices` (one per name), else plan_devices over the distinct names and `device`; with
    `device_map` accelerate spreads each model over the devices instead. Which names: catalogue names
    always, paths and hub ids with `allow_paths`, server specs with `allow_servers` (default: as
    `allow_paths`), and any name in `trusted` (the operator's own) as if both were allowed.

    `processes` (True/"on", False/"off" or "auto": where processes.processes_pay_off on the devices
    of `ensemble_devices`, default these members'): each model loads in a worker process of its own,
    with an equal share of the cores until a run sets its share; a served member stays here. Worker
    processes start from a fork server that imports the calling script as spawned ones do
    (members/process.py): a script that loads with processes must guard its top level with
    `if __name__ == "__main__":`.

    A model listed twice loads once: each later listing is another member, `name#2`, … on the same
    weights (Member.sharing). A worker process or a server cannot share, so with processes on, or a
    server spec listed twice, that is a ConfigError; under "auto" a repeated model keeps every
    member here. Whether a repeat makes sense (only when sampling) is the caller's decision.

    `load` loads one member here (default load_member; the app passes its own, tests a scripted one).
    `compile_decode` goes to each load (only when True, so that a `load` without it keeps working),
    as does `quantize` (only when not "none") and `decode` (only when not "auto").
    """
    check_quantize(quantize)
    check_decode(decode)
    load_here = load or load_member
    distinct = list(dict.fromkeys(names))
    placed = _placement(names, distinct, devices, device, device_map)
    in_processes = _in_processes(names, distinct, placed, processes, device_map, ensemble_devices)
    sharing = len(ensemble_devices or distinct)
    servers = allow_paths if allow_servers is None else allow_servers

    def one(name: str, place: str, step: Progress) -> Member:
        options: dict[str, Any] = dict(
            device=place,
            dtype=dtype,
            device_map=device_map,
            cache_dir=cache_dir,
            allow_paths=allow_paths or name in trusted,
            allow_servers=servers or name in trusted,
            trust_remote_code=trust_remote_code,
        )
        given = {"compile_decode": compile_decode, "quantize": quantize, "decode": decode}
        options.update({k: v for k, v in given.items() if v != _LOAD_DEFAULTS[k]})
        if not in_processes or is_server(name):
            return load_here(name, progress=step, **options)
        return _load_in_own_process(name, place, step, load_here, sharing, options)

    return _with_repeats(names, dict(zip(distinct, load_each(distinct, placed, one, progress))))


def _placement(
    names: Sequence[str],
    distinct: Sequence[str],
    devices: Sequence[str] | None,
    device: str,
    device_map: str | dict[str, Any] | None,
) -> list[str]:
    """The device of each distinct name: its own in `devices` (one per name), else plan_devices over
    them on `device`; with `device_map`, `device` for each (accelerate spreads each model)."""
    if devices is not None:
        if len(devices) != len(names):
            raise ConfigError(f"{len(devices)} devices for {len(names)} members")
        return [devices[names.index(n)] for n in distinct]
    return plan_devices(len(distinct), device) if device_map is None else [device] * len(distinct)


def _in_processes(
    names: Sequence[str],
    distinct: Sequence[str],
    placed: Sequence[str],
    processes: bool | str,
    device_map: str | dict[str, Any] | None,
    ensemble_devices: Sequence[str] | None,
) -> bool:
    """Whether the members load in worker processes of their own (load_members's `processes`), or
    the ConfigError that says why a model listed twice cannot share its weights."""
    repeated = [n for n in distinct if names.count(n) > 1]
    for name in repeated:
        if is_server(name):
            raise ConfigError(f"{name} is served by an inference server; list it once")
    if processes == "auto" and (device_map is not None or repeated):
        processes = False  # "auto" is for whole members, each listed once
    local = [d for n, d in zip(distinct, placed) if not is_server(n)]
    in_processes = wanted(processes, ensemble_devices or local, cpu_cores())
    if in_processes and repeated:
        raise ConfigError(f"{repeated[0]}: with --processes, list each model once")
    return in_processes


def _load_in_own_process(
    name: str, place: str, step: Progress, load_here: MemberLoad, sharing: int, options: dict[str, Any]
) -> Member:
    """`name` loaded by `load_here` in a worker process; a CPU member's threads are its equal share
    of the cores among `sharing` members."""
    step(0.0, f"loading {name} in a process of its own")
    threads = max(1, cpu_cores() // sharing) if place.startswith("cpu") else None
    member = load_in_process(name, threads=threads, load=load_here, **options)
    step(1.0, f"{name} loaded")
    return member


def _with_repeats(names: Sequence[str], loaded: dict[str, Member]) -> list[Member]:
    """The members in the order of `names`: a name's first listing is its loaded member, each later
    one another member, `name#2`, … on the same weights (Member.sharing)."""
    members: list[Member] = []
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        first = loaded[name]
        members.append(first if seen[name] == 1 else first.sharing(f"{name}#{seen[name]}"))
    return members


# ---- progress on a terminal -----------------------------------------------------------------------


def tqdm_progress(desc: str) -> Progress:
    """A progress callback that drives a tqdm bar on stderr, closed when the fraction reaches 1."""
    from tqdm import tqdm

    bar = tqdm(total=100, desc=desc, file=sys.stderr, bar_format="{percentage:3.0f}%|{bar:20}| {desc}")

    def update(fraction: float, message: str) -> None:
        bar.n = round(100 * min(max(fraction, 0.0), 1.0))
        bar.set_description_str(message, refresh=False)
        bar.refresh()
        if fraction >= 1.0:
            bar.close()

    return update
