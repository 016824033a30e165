"""Evaluation runs: which systems, where their traces live, batched resumable runs (each problem's
traces graded, and an evaluation read back: specfuse.eval.outcomes).

Every system is an Ensemble (one member = that model alone) run through Ensemble.stream_many; a trace
on disk is loaded instead of re-run. Knows nothing about reports or the command line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import feedback
from ..config import EnsembleConfig
from ..engine import Ensemble
from ..errors import ConfigError, SpecfuseError, TraceError
from ..records import Round
from ..trace import Trace, load_trace, save_trace
from .outcomes import EvalError, outcome_of
from .problems import Outcome, Problem
from .variants import DEFAULT_ENSEMBLES, build_configs

log = logging.getLogger(__name__)

SC_TEMPERATURE, SC_TOP_P = 0.7, 0.95

# -- systems ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class System:
    """One evaluated system: which members, which config per sample, and where its traces live."""

    name: str  # as reported: "single-qwen2.5-coder-0.5b", "ensemble", "paper", "sc3-…", a variant
    members: tuple[str, ...]
    configs: tuple[EnsembleConfig, ...]  # one per sample: K for self-consistency, else 1
    folder: str  # under --runs
    suffixes: tuple[str, ...] = ("",)  # per sample, appended to the problem id in the file name


def safe(name: str) -> str:
    """A member name as a folder-name part (a checkpoint path becomes its last parts, '/' → '_')."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name.strip("/")) or "_"


def mix_name(names: Sequence[str]) -> str:
    return "+".join(safe(n) for n in names)


def single_system(name: str, base: EnsembleConfig) -> System:
    return System(f"single-{name}", (name,), (base,), f"single-{safe(name)}")


def sc_system(name: str, k: int, base: EnsembleConfig) -> System:
    """Self-consistency: K samples of one member (seeds 0..K-1), majority vote."""
    configs = tuple(replace(base, temperature=SC_TEMPERATURE, top_p=SC_TOP_P, seed=s) for s in range(k))
    return System(f"sc{k}-{name}", (name,), configs, f"sc-{safe(name)}", tuple(f"-s{s}" for s in range(k)))


def ensemble_system(name: str, names: Sequence[str], config: EnsembleConfig) -> System:
    return System(name, tuple(names), (config,), f"{name}@{mix_name(names)}")


def plan_systems(
    names: Sequence[str],
    base: EnsembleConfig,
    requested: Sequence[str] | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
    best: str | None = None,
) -> list[System]:
    """The systems to run, in report order. Default: every single, the ensemble and its ablations,
    the named variants, and sc<N>-<best> (needs `best`; left out when it is None). With one member,
    only singles (and explicitly requested sc<K>-<member>)."""
    configs = build_configs(base, variants)
    ensembles = [*DEFAULT_ENSEMBLES, *(variants or {})] if len(names) > 1 else []
    if requested is None:
        wanted = [f"single-{n}" for n in names] + ensembles
        if len(names) > 1 and best is not None:
            wanted.append(f"sc{len(names)}-{best}")
    else:
        wanted = list(dict.fromkeys(requested))
    systems = []
    for system in wanted:
        sc = re.fullmatch(r"sc(\d+)-(.+)", system)
        if system.startswith("single-") and system.removeprefix("single-") in names:
            systems.append(single_system(system.removeprefix("single-"), base))
        elif sc and sc.group(2) in names and int(sc.group(1)) >= 1:
            systems.append(sc_system(sc.group(2), int(sc.group(1)), base))
        elif system in configs and len(names) > 1:
            systems.append(ensemble_system(system, names, configs[system]))
        else:
            valid = [f"single-{n}" for n in names] + [f"sc<K>-{n}" for n in names]
            valid += list(configs) if len(names) > 1 else []
            why = " (ensembles need ≥ 2 --models)" if system in configs else ""
            raise ConfigError(f"unknown system {system!r}{why}; valid: {', '.join(valid)}")
    return systems


def parse_systems(text: str | None) -> list[str] | None:
    return None if text is None else [s.strip() for s in text.split(",") if s.strip()]


# -- running ------------------------------------------------------------------------------------------


def _run_or_load(ensemble: Ensemble, prompt: str, config: EnsembleConfig, path: Path) -> Trace:
    """The trace at `path`, or a fresh run saved there (atomically) when there is none."""
    if path.is_file():
        try:
            return load_trace(path)
        except TraceError as e:
            log.warning("re-running %s: %s", path, e)
    rounds = tuple(ensemble.stream(prompt, config))
    trace = Trace(prompt, ensemble.names, config, rounds)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_trace(trace, path)
    return trace


@dataclass
class _Job:
    system: System
    problem: Problem
    sample: int
    path: Path
    rounds: list[Round] = field(default_factory=list)

    @property
    def config(self) -> EnsembleConfig:
        return self.system.configs[self.sample]

    @property
    def error_path(self) -> Path:
        return self.path.with_name(self.path.name.removesuffix(".json") + ".error.json")


# What can change a lone member's answer: its sampling and budgets. Scoring, feedback and exit settings
# cannot (one candidate always wins), so a single's traces stay valid when the ensemble defaults move.
SOLO_SETTINGS = (
    "segment_len",
    "max_new_tokens",
    "max_rounds",
    "temperature",
    "top_p",
    "seed",
    "stop_strings",
)


# Settings that cannot change a run's choices, weights or exits: how the members share the cores, and
# whether a lone draft (it wins anyway; a round of one candidate moves no weight) is scored.
SAME_CHOICES: dict[str, dict[Any, Any]] = {"verify": {"contested": "always"}}


def _differences(a: EnsembleConfig, b: EnsembleConfig, solo: bool = False) -> list[str]:
    left, right = a.to_dict(), b.to_dict()
    for side in (left, right):
        for key, same in SAME_CHOICES.items():
            side[key] = same.get(side[key], side[key])
    keys = SOLO_SETTINGS if solo else list(left)
    return [f"{k} {left[k]!r} vs {right[k]!r}" for k in keys if left[k] != right[k]]


def _load_existing(job: _Job, start: Sequence[float] | None = None) -> Trace | str | None:
    """The job's trace, or its recorded error message, or None when it still has to run.

    `start`: the starting weights this run would get now (an ensemble under prior="trust"); trust is
    not a config setting, so a trace is also checked against it: new trust, new runs."""
    if job.path.is_file():
        try:
            trace = load_trace(job.path)
        except TraceError as e:
            log.warning("re-running %s: %s", job.path, e)
            return None
        if tuple(trace.members) != job.system.members:
            raise EvalError(
                f"{job.path} holds a run of {', '.join(trace.members)}, not {', '.join(job.system.members)}; "
                "use another --runs folder"
            )
        diff = _differences(trace.config, job.config, solo=len(job.system.members) == 1)
        if diff:
            raise EvalError(
                f"{job.path} was run with another config ({'; '.join(diff)}); use another --runs "
                f"folder or variant name, or delete {job.path.parent}"
            )
        if start is not None and trace.rounds and not _same_weights(trace.rounds[0].weights_before, start):
            was = ", ".join(f"{w:.3f}" for w in trace.rounds[0].weights_before)
            now = ", ".join(f"{w:.3f}" for w in start)
            raise EvalError(
                f"{job.path} started from weights {was}, but the trust in use now gives {now}; use "
                f"another --runs folder or variant name, the --trust file it was run with, or delete "
                f"{job.path.parent}"
            )
        return trace
    if job.error_path.is_file():
        try:
            return str(json.loads(job.error_path.read_text(encoding="utf-8"))["error"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None


def _same_weights(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-9 for x, y in zip(a, b))


def _starting_weights(job: _Job, members: dict[str, Any]) -> list[float] | None:
    """The weights round 1 would start from now, where trust decides them; None elsewhere."""
    config = job.config
    if len(job.system.members) < 2 or config.prior != "trust" or config.initial_weights:
        return None
    return feedback.trust_weights([getattr(members[n], "trust", None) for n in job.system.members])


def _save(job: _Job) -> Trace:
    trace = Trace(job.problem.prompt, job.system.members, job.config, tuple(job.rounds))
    job.path.parent.mkdir(parents=True, exist_ok=True)
    save_trace(trace, job.path)
    return trace


def _save_error(job: _Job, message: str) -> str:
    job.error_path.parent.mkdir(parents=True, exist_ok=True)
    document = {"system": job.system.name, "problem": job.problem.id, "error": message}
    tmp = job.error_path.with_name(job.error_path.name + ".part")
    tmp.write_text(json.dumps(document, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, job.error_path)
    log.warning("%s %s failed: %s", job.system.name, job.problem.id, message)
    return message


def _run_batch(
    ensemble: Ensemble,
    jobs: Sequence[_Job],
    done: dict[Path, Trace | str],
    batch_size: int = 1,
    finished: Callable[[], object] = lambda: None,
) -> None:
    """Run `jobs` through stream_many, `batch_size` at a time as a rolling batch (a finished run's
    place goes to the next job at once); save each trace as soon as its last round arrives.

    A failure inside the batch (a SpecfuseError) re-runs the unfinished jobs one by one, so that only
    the job that fails is recorded as failed.
    """
    for job in jobs:
        job.rounds = []
    prompts, configs = [j.problem.prompt for j in jobs], [j.config for j in jobs]
    try:
        for i, rnd in ensemble.stream_many(prompts, configs, batch_size=batch_size):
            jobs[i].rounds.append(rnd)
            if rnd.stop_reason is not None:
                done[jobs[i].path] = _save(jobs[i])
                finished()
    except SpecfuseError as e:
        if len(jobs) == 1:
            done[jobs[0].path] = _save_error(jobs[0], str(e))
            finished()
            return
        for job in jobs:
            if job.path not in done:
                _run_batch(ensemble, [job], done, 1, finished)
        return
    for job in jobs:
        if job.path not in done:  # the stream ended without a last round for it
            done[job.path] = _save_error(job, "the run ended without a stop reason")


def run_systems(
    members: Sequence[Any],
    systems: Sequence[System],
    problems: Sequence[Problem],
    runs: str | os.PathLike[str],
    *,
    batch_size: int = 1,
    progress: bool = False,
) -> list[Outcome]:
    """Run (or load) every system on every problem; one Outcome per (system, problem), system-major.

    Pending runs of the same member set go through `Ensemble.stream_many` `batch_size` at a time,
    problem-major within each member set; every trace is saved as soon as its run ends.
    """
    from tqdm import tqdm

    if batch_size < 1:
        raise ConfigError(f"--batch-size must be ≥ 1, got {batch_size}")
    by_name = {m.name: m for m in members}
    root = Path(runs)
    jobs = [
        _Job(s, p, i, root / s.folder / f"{p.id}{suffix}.json")
        for p in problems
        for s in systems
        for i, suffix in enumerate(s.suffixes)
    ]
    done: dict[Path, Trace | str] = {}
    pending: dict[tuple[str, ...], list[_Job]] = {}
    for job in jobs:
        existing = _load_existing(job, _starting_weights(job, by_name))
        if existing is None:
            pending.setdefault(job.system.members, []).append(job)
        else:
            done[job.path] = existing
    bar = tqdm(total=sum(map(len, pending.values())), desc="eval", file=sys.stderr, disable=not progress)
    for names, queue in pending.items():
        ensemble = Ensemble([by_name[n] for n in names], queue[0].config)
        bar.set_description_str(f"eval {'+'.join(names)}")
        _run_batch(ensemble, queue, done, batch_size, lambda: bar.update(1))
    bar.close()
    grouped: dict[tuple[str, str], list[tuple[Path, Trace | str]]] = {}
    for job in jobs:
        grouped.setdefault((job.system.folder, job.problem.id), []).append((job.path, done[job.path]))
    return [outcome_of(s.name, p, grouped[s.folder, p.id]) for s in systems for p in problems]


def evaluate(
    members: Sequence[Any],
    problems: Sequence[Problem],
    out_dir: str | os.PathLike[str],
    *,
    config: EnsembleConfig | None = None,
    systems: Sequence[str] | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
    batch_size: int = 1,
    progress: bool = False,
) -> list[Outcome]:
    """Run the requested systems (default: singles, ensemble, ablations, variants, sc<N>-<best>).

    The default self-consistency member is the best single, so the singles run first.
    """
    base = config or EnsembleConfig(max_new_tokens=256)
    names = [m.name for m in members]
    planned = plan_systems(names, base, systems, variants)
    outcomes = run_systems(members, planned, problems, out_dir, batch_size=batch_size, progress=progress)
    if systems is None and len(names) > 1 and not any(p.instructions for p in problems):
        singles = {n: [o for o in outcomes if o.system == f"single-{n}"] for n in names}
        sc = sc_system(best_single(singles, names), len(names), base)
        outcomes += run_systems(members, [sc], problems, out_dir, batch_size=batch_size, progress=progress)
    return outcomes


def best_single(singles: dict[str, list[Outcome]], order: Sequence[str]) -> str:
    """The single member with the highest accuracy (ties: the one listed first)."""
    return max(order, key=lambda n: (sum(o.correct for o in singles[n]), -order.index(n)))
