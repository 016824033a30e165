"""The quality evaluation: singles, ensembles and their variants, self-consistency, on GSM8K or on
open-ended prompts, resumable from traces, with paired statistics and a results page.

Knows nothing about how members draft or score: every system is an Ensemble (one member = that
model alone) run through `Ensemble.stream_many`, and every figure is recomputed from the saved
traces, so an interrupted run resumes where it stopped. `python -m specfuse.eval --help`:

    python -m specfuse.eval gsm8k --data dev.jsonl --limit 50 --systems ensemble,paper \\
        --variant lr2:learning_rate=2 --batch-size 8 --out bench --name RESULTS-gsm8k
    python -m specfuse.eval open-ended --systems ensemble,paper --out bench
    python -m specfuse.eval throughput --data dev.jsonl --problems 8 --batch-size 8

Trace layout under --runs (default runs/gsm8k): `single-<member>/<problem id>.json` (shared by
every mix), `<system>@<member+member+…>/<problem id>.json` for ensembles and named variants (they
depend on the mix), and `sc-<member>/<problem id>-s<seed>.json` for self-consistency samples
(sc<K>-<member> votes over seeds 0..K-1). A trace on disk is loaded, never re-run; one made with
another config is an error (use another --runs or variant name). A run that fails (e.g. 'sum'
normalization meeting a negative raw score) leaves `<problem id>.error.json` and counts as wrong.

For views over an evaluation (the app's failure-case browser):
- `load_outcomes(path, data=None) -> list[Outcome]`: from a report JSON written by write_reports
  (gold included), or from a --runs folder (gold read from `data`, a GSM8K JSONL, when given).
  An Outcome has system, problem, gold, predicted, correct, answer, error and its trace paths
  (`traces`; replay one with `specfuse.trace.load_trace`).
- `systems_of(outcomes) -> list[str]`, and `disagreements(outcomes, a, b)`: the problems only a got
  right and those only b got right, as (outcome of a, outcome of b) pairs.
- Statistics are in `specfuse.stats` (wilson, paired, mcnemar_exact, ends_in_loop, distinct_n);
  tables, charts and the Markdown page in `specfuse.eval_report`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .config import EnsembleConfig
from .engine import Ensemble
from .errors import ConfigError, SpecfuseError, TraceError
from .records import Round
from .stats import wilson
from .trace import Trace, load_trace, save_trace
from .variants import BUILTIN, DEFAULT_ENSEMBLES, build_configs, load_variants, parse_variant

log = logging.getLogger(__name__)

__all__ = ["wilson"]  # re-exported: older callers import it from here

INSTRUCTION = 'Solve the problem step by step. End your reply with "The answer is N." where N is a number.'
SC_TEMPERATURE, SC_TOP_P = 0.7, 0.95
_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?"
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*[:=]?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)


class DataError(SpecfuseError):
    """A data file that is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    id: str  # "gsm8k-0007": the 0-based line number in the data file
    question: str
    gold: str | None  # the final number after "#### ", normalized; None for an open-ended prompt
    raw: bool = False  # the question is the whole prompt (open-ended): no answer-format instruction

    @property
    def prompt(self) -> str:
        return self.question if self.raw else build_prompt(self.question)


@dataclass(frozen=True)
class Outcome:
    """One system's answer to one problem, as recomputed from its trace(s)."""

    system: str
    problem: str
    predicted: str | None
    correct: bool
    seconds: float  # Σ over the traces (K samples for self-consistency)
    rounds: int
    draft_calls: int
    traces: tuple[str, ...]
    gold: str | None = None
    answer: str = ""  # the reply (self-consistency: the first sample that gave the voted answer)
    error: str | None = None  # why the run failed (then predicted is None and correct False)


# -- data and answers --------------------------------------------------------------------------------


def load_problems(path: str | os.PathLike[str], limit: int | None = None) -> list[Problem]:
    """The first `limit` problems of a GSM8K JSONL file (question, answer ending in "#### N")."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no data file at {str(path)!r}; give the GSM8K JSONL with --data")
    problems = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                question, answer = row["question"], row["answer"]
                if not isinstance(question, str) or not isinstance(answer, str) or "####" not in answer:
                    raise ValueError("expected text fields, the answer ending in '#### N'")
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{path.name}:{number}: malformed line ({type(e).__name__}: {e})") from e
            gold = normalize_number(answer.rsplit("####", 1)[1])
            if gold is None:
                raise DataError(f"{path.name}:{number}: no number after '####'")
            problems.append(Problem(f"gsm8k-{number - 1:04d}", question, gold))
            if limit is not None and len(problems) >= limit:
                break
    if not problems:
        raise DataError(f"{path.name} holds no problems")
    return problems


def build_prompt(question: str) -> str:
    """The same prompt for every system: the question, then the answer-format instruction."""
    return f"{question.strip()}\n\n{INSTRUCTION}"


def normalize_number(text: str) -> str | None:
    """'$1,234.50' → '1234.5', '18.00' → '18', '-3' → '-3'; None when there is no number."""
    found = _ANY_NUMBER.search(text)
    if found is None:
        return None
    raw = re.sub(r"[\s$,]", "", found.group(0))
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return str(int(value)) if value == int(value) else f"{value:g}"


def extract_answer(text: str) -> str | None:
    """The final number of a reply: the last one after "answer is", else the last number at all."""
    stated = _ANSWER_IS.findall(text)
    if stated:
        return normalize_number(stated[-1])
    numbers = _ANY_NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-missing answer; ties go to the one given first (lowest seed)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


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


def _differences(a: EnsembleConfig, b: EnsembleConfig) -> list[str]:
    left, right = a.to_dict(), b.to_dict()
    return [f"{k} {left[k]!r} vs {right[k]!r}" for k in left if k != "parallel" and left[k] != right[k]]


def _load_existing(job: _Job) -> Trace | str | None:
    """The job's trace, or its recorded error message, or None when it still has to run."""
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
        diff = _differences(trace.config, job.config)
        if diff:
            raise EvalError(
                f"{job.path} was run with another config ({'; '.join(diff)}); use another --runs "
                f"folder or variant name, or delete {job.path.parent}"
            )
        return trace
    if job.error_path.is_file():
        try:
            return str(json.loads(job.error_path.read_text(encoding="utf-8"))["error"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None


class EvalError(SpecfuseError):
    """Traces on disk that do not match the requested systems."""


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


def _run_batch(ensemble: Ensemble, jobs: Sequence[_Job], done: dict[int, Trace | str]) -> None:
    """Run `jobs` together through stream_many; save each trace as soon as its last round arrives.

    A failure inside the batch (a SpecfuseError) re-runs the unfinished jobs one by one, so that only
    the job that fails is recorded as failed.
    """
    for job in jobs:
        job.rounds = []
    try:
        for i, rnd in ensemble.stream_many([j.problem.prompt for j in jobs], [j.config for j in jobs]):
            jobs[i].rounds.append(rnd)
            if rnd.stop_reason is not None:
                done[id(jobs[i])] = _save(jobs[i])
    except SpecfuseError as e:
        if len(jobs) == 1:
            done[id(jobs[0])] = _save_error(jobs[0], str(e))
            return
        for job in jobs:
            if id(job) not in done:
                _run_batch(ensemble, [job], done)
        return
    for job in jobs:
        if id(job) not in done:  # the stream ended without a last round for it
            done[id(job)] = _save_error(job, "the run ended without a stop reason")


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
    problem-major, so that an interrupted evaluation leaves whole problems behind.
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
    done: dict[int, Trace | str] = {}
    pending: dict[tuple[str, ...], list[_Job]] = {}
    for job in jobs:
        existing = _load_existing(job)
        if existing is None:
            pending.setdefault(job.system.members, []).append(job)
        else:
            done[id(job)] = existing
    bar = tqdm(total=sum(map(len, pending.values())), desc="eval", file=sys.stderr, disable=not progress)
    for names, queue in pending.items():
        ensemble = Ensemble([by_name[n] for n in names], queue[0].config)
        for start in range(0, len(queue), batch_size):
            batch = queue[start : start + batch_size]
            bar.set_description_str(f"eval {batch[0].system.name} {batch[0].problem.id}")
            _run_batch(ensemble, batch, done)
            bar.update(len(batch))
    bar.close()
    grouped: dict[tuple[int, str], list[tuple[Path, Trace | str]]] = {}
    for job in jobs:
        grouped.setdefault((id(job.system), job.problem.id), []).append((job.path, done[id(job)]))
    return [_outcome(s.name, p, grouped[id(s), p.id]) for s in systems for p in problems]


def _outcome(system: str, problem: Problem, runs: Sequence[tuple[Path, Trace | str]]) -> Outcome:
    traces = [(p, t) for p, t in runs if isinstance(t, Trace)]
    errors = [t for _, t in runs if isinstance(t, str)]
    results = [t.result for _, t in traces]
    answers = [extract_answer(r.answer) for r in results]
    predicted = (answers[0] if len(answers) == 1 else majority(answers)) if not errors else None
    answer = next(
        (r.answer for r, a in zip(results, answers) if a == predicted), results[0].answer if results else ""
    )
    return Outcome(
        system=system,
        problem=problem.id,
        predicted=predicted,
        correct=predicted is not None and predicted == problem.gold,
        seconds=sum(r.seconds for r in results),
        rounds=sum(r.rounds for r in results),
        draft_calls=sum(r.draft_calls for r in results),
        traces=tuple(str(p) for p, _ in traces),
        gold=problem.gold,
        answer=answer,
        error="; ".join(errors) or None,
    )


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
    if systems is None and len(names) > 1:
        singles = {n: [o for o in outcomes if o.system == f"single-{n}"] for n in names}
        sc = sc_system(best_single(singles, names), len(names), base)
        outcomes += run_systems(members, [sc], problems, out_dir, batch_size=batch_size, progress=progress)
    return outcomes


def best_single(singles: dict[str, list[Outcome]], order: Sequence[str]) -> str:
    """The single member with the highest accuracy (ties: the one listed first)."""
    return max(order, key=lambda n: (sum(o.correct for o in singles[n]), -order.index(n)))


# -- reading an evaluation back (for views) -----------------------------------------------------------


def load_outcomes(path: str | os.PathLike[str], data: str | os.PathLike[str] | None = None) -> list[Outcome]:
    """Outcomes from a report JSON (write_reports) or from a --runs folder of traces.

    From a folder, systems are named by their folders (`ensemble@a+b` → `ensemble` when only one
    mix is present; `sc-<m>` with K samples → `sc<K>-<m>`), and gold comes from `data` (a GSM8K
    JSONL) when given; without it gold is None and no outcome counts as correct.
    """
    path = Path(path)
    if path.is_file():
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            fields_ = set(Outcome.__dataclass_fields__)
            return [
                Outcome(**{**{k: v for k, v in row.items() if k in fields_}, "traces": tuple(row["traces"])})
                for row in document["outcomes"]
            ]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EvalError(f"{path.name} is not an evaluation report: {e}") from e
    if not path.is_dir():
        raise EvalError(f"no report or runs folder at {str(path)!r}")
    gold = {p.id: p.gold for p in load_problems(data)} if data is not None else {}
    folders = sorted(d for d in path.iterdir() if d.is_dir())
    mixes = Counter(d.name.split("@", 1)[0] for d in folders)
    outcomes = []
    for folder in folders:
        runs: dict[str, list[tuple[Path, Trace | str]]] = {}
        for file in sorted(folder.glob("*.json")):
            stem = file.name.removesuffix(".json")
            error = stem.endswith(".error")
            pid = re.sub(r"-s\d+$", "", stem.removesuffix(".error"))
            if error:
                try:
                    runs.setdefault(pid, []).append((file, str(json.loads(file.read_text())["error"])))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            else:
                try:
                    runs.setdefault(pid, []).append((file, load_trace(file)))
                except TraceError as e:
                    log.warning("skipping %s: %s", file, e)
        base = folder.name.split("@", 1)[0]
        for pid, found in runs.items():
            system = base if mixes[base] == 1 else folder.name
            if folder.name.startswith("sc-"):
                system = f"sc{len(found)}-{folder.name.removeprefix('sc-')}"
            problem = Problem(pid, "", gold.get(pid))
            outcomes.append(_outcome(system, problem, found))
    return outcomes


def systems_of(outcomes: Iterable[Outcome]) -> list[str]:
    return list(dict.fromkeys(o.system for o in outcomes))


def disagreements(outcomes: Sequence[Outcome], a: str, b: str) -> dict[str, list[tuple[Outcome, Outcome]]]:
    """Problems where exactly one of systems a and b is right: {"only_a": [...], "only_b": [...]}."""
    mine = {o.problem: o for o in outcomes if o.system == a}
    theirs = {o.problem: o for o in outcomes if o.system == b}
    shared = [p for p in mine if p in theirs]
    return {
        "only_a": [(mine[p], theirs[p]) for p in shared if mine[p].correct and not theirs[p].correct],
        "only_b": [(mine[p], theirs[p]) for p in shared if theirs[p].correct and not mine[p].correct],
    }


# -- open-ended prompts and throughput ----------------------------------------------------------------

# The app's example prompts (app.py's EXAMPLES; copied so that the evaluation never imports Gradio).
OPEN_PROMPTS = (
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "用一句话介绍长城。",
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for learning a new language, one sentence each.",
)


def open_problems(path: str | os.PathLike[str] | None = None) -> list[Problem]:
    """Open-ended prompts (no gold): one per non-empty line of `path`, or OPEN_PROMPTS."""
    if path is None:
        prompts = list(OPEN_PROMPTS)
    else:
        try:
            prompts = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read prompts from {str(path)!r}: {e}") from e
        prompts = [p for p in prompts if p]
        if not prompts:
            raise DataError(f"{Path(path).name} holds no prompts")
    return [Problem(f"open-{i:02d}", p, None, raw=True) for i, p in enumerate(prompts)]


def throughput(
    members: Sequence[Any], problems: Sequence[Problem], config: EnsembleConfig, batch_size: int
) -> dict[str, Any]:
    """The same problems one at a time (stream) and batched (stream_many), side by side: problems
    per hour for both, their ratio, the load average around each half, and whether answers agree."""
    ensemble = Ensemble(members, config)
    prompts = [p.prompt for p in problems]
    report: dict[str, Any] = {"members": [m.name for m in members], "problems": len(problems)}
    report["batch_size"] = batch_size
    report["load_before"] = os.getloadavg()
    began = time.perf_counter()
    alone = [ensemble.run(p).answer for p in prompts]
    report["stream_s"] = time.perf_counter() - began
    report["load_between"] = os.getloadavg()
    began = time.perf_counter()
    texts = [""] * len(prompts)
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        for i, rnd in ensemble.stream_many(chunk, config):
            texts[start + i] = rnd.text
    report["batched_s"] = time.perf_counter() - began
    report["load_after"] = os.getloadavg()
    n = len(prompts)
    report["stream_per_hour"] = 3600 * n / report["stream_s"] if report["stream_s"] else math.inf
    report["batched_per_hour"] = 3600 * n / report["batched_s"] if report["batched_s"] else math.inf
    report["ratio"] = report["batched_per_hour"] / report["stream_per_hour"]
    report["same_answers"] = sum(a == b for a, b in zip(alone, texts))
    return report


def format_throughput(report: dict[str, Any]) -> str:
    def load(key: str) -> str:
        return " ".join(f"{v:.2f}" for v in report[key])

    return "\n".join(
        [
            f"members: {', '.join(report['members'])}; problems: {report['problems']}; "
            f"batch size: {report['batch_size']}",
            f"one at a time (stream):   {report['stream_per_hour']:10.1f} problems/hour "
            f"({report['stream_s']:.1f} s)   load avg before: {load('load_before')}",
            f"batched (stream_many):    {report['batched_per_hour']:10.1f} problems/hour "
            f"({report['batched_s']:.1f} s)   load avg between: {load('load_between')}",
            f"ratio batched / stream:   {report['ratio']:10.2f}                        "
            f"load avg after: {load('load_after')}",
            f"identical answers: {report['same_answers']} of {report['problems']}",
        ]
    )


# -- command line -------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfuse.eval",
        description="Evaluate singles, ensembles, their variants and self-consistency (issues 4 and 7).",
    )
    tasks = parser.add_subparsers(dest="task", required=True, metavar="{gsm8k,open-ended,throughput}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--models", nargs="+", default=None, help="catalogue names (default: the trio)")
    common.add_argument("--max-new-tokens", type=int, default=256, help="answer budget (default 256)")
    common.add_argument("--segment-len", type=int, default=10, help="L (default 10)")
    common.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 (default auto)")
    common.add_argument("--batch-size", type=int, default=1, help="prompts run at once (stream_many)")
    common.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    study = argparse.ArgumentParser(add_help=False)
    systems_help = ", ".join(f"{k} ({h})" for k, (_, h) in BUILTIN.items())
    study.add_argument(
        "--systems",
        default=None,
        help="comma-separated systems to run: single-<member>, sc<K>-<member>, a variant, or a "
        f"built-in: {systems_help}. Default: singles, ensemble, ablations, variants, sc<N>-<best>",
    )
    study.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:key=value,…",
        help="a named ensemble config (keys: EnsembleConfig fields; repeatable), e.g. "
        "lr2:learning_rate=2,exit=false",
    )
    study.add_argument("--variants", type=Path, default=None, help="JSON or TOML file {name: {key: value}}")
    study.add_argument("--out", type=Path, default=Path("bench"), help="report folder (default bench/)")
    study.add_argument("--title", default=None, help="the results page's title")
    study.add_argument("--cases", type=int, default=6, help="failure-case traces to copy per list")
    study.add_argument("--no-png", action="store_true", help="skip the PNG chart (needs kaleido)")

    gsm = tasks.add_parser("gsm8k", parents=[common, study], help="GSM8K accuracy with paired statistics")
    gsm.add_argument("--data", type=Path, required=True, help="GSM8K JSONL (question, answer)")
    gsm.add_argument("--limit", type=int, default=None, help="the first N problems only")
    gsm.add_argument("--runs", type=Path, default=Path("runs/gsm8k"), help="trace root (default runs/gsm8k)")
    gsm.add_argument("--name", default="RESULTS-gsm8k", help="report file stem (default RESULTS-gsm8k)")
    gsm.add_argument("--json", type=Path, default=None, help="also write the full report here")

    open_ = tasks.add_parser("open-ended", parents=[common, study], help="loops and distinct-n, no gold")
    open_.add_argument(
        "--prompts", type=Path, default=None, help="one prompt per line (default: app examples)"
    )
    open_.add_argument("--runs", type=Path, default=Path("runs/open"), help="trace root (default runs/open)")
    open_.add_argument("--name", default="RESULTS-open", help="report file stem (default RESULTS-open)")

    speed = tasks.add_parser("throughput", parents=[common], help="stream vs stream_many, problems/hour")
    speed.add_argument("--data", type=Path, default=None, help="GSM8K JSONL (default: the app's prompts)")
    speed.add_argument("--problems", type=int, default=8, help="how many problems (default 8)")
    speed.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser


def _variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    variants = load_variants(args.variants) if args.variants is not None else {}
    for spec in args.variant:
        name, settings = parse_variant(spec)
        if name in variants:
            raise ConfigError(f"variant {name!r} is defined twice")
        variants[name] = settings
    return variants


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(raw)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        if getattr(args, "limit", None) is not None and args.limit < 1:
            raise DataError(f"--limit must be ≥ 1, got {args.limit}")
        if args.batch_size < 1:
            raise ConfigError(f"--batch-size must be ≥ 1, got {args.batch_size}")
        config = EnsembleConfig(max_new_tokens=args.max_new_tokens, segment_len=args.segment_len)
        variants = _variants(args) if args.task != "throughput" else {}
        if args.task == "gsm8k":
            problems = load_problems(args.data, args.limit)
        elif args.task == "open-ended":
            problems = open_problems(args.prompts)
        elif args.data is not None:
            problems = load_problems(args.data, args.problems)
        else:
            problems = open_problems()[: args.problems]
        from .bench import parse_models

        names = parse_models(args.models)
        systems = parse_systems(getattr(args, "systems", None))
        # Check the requested systems before loading any model.
        plan_systems(names, config, systems, variants, best=names[0])
        members = _load(names, args.dtype)
        if args.task == "throughput":
            report = throughput(members, problems, config, args.batch_size)
            print(format_throughput(report))
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(report, indent=1) + "\n")
            return 0
        from . import eval_report

        outcomes = evaluate(
            members, problems, args.runs, config=config, systems=systems, variants=variants,
            batch_size=args.batch_size, progress=True,
        )  # fmt: skip
        command = "python -m specfuse.eval " + " ".join(shlex.quote(a) for a in raw)
        title = args.title or (
            f"GSM8K dev, {len(problems)} problems: {mix_name(names)}"
            if args.task == "gsm8k"
            else f"Open-ended prompts: {mix_name(names)}"
        )
        document = eval_report.write_reports(
            outcomes, problems, args.out, args.name, png=not args.no_png, title=title, command=command,
            config=config, variants=variants, cases=args.cases,
        )  # fmt: skip
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(eval_report.console_summary(document))
    if getattr(args, "json", None) is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return 0


def _load(names: Sequence[str], dtype: str) -> list[Any]:
    from .catalogue import load_member, tqdm_progress

    return [load_member(n, dtype=dtype, progress=tqdm_progress(f"loading {n}")) for n in names]


if __name__ == "__main__":
    sys.exit(main())
