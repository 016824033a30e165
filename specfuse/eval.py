"""The quality evaluation on GSM8K: singles, the ensemble and its ablations, and self-consistency.

Knows nothing about how members draft or score: every system is an Ensemble (one member = that
model alone) run through stream(), and every figure is recomputed from the saved traces, so an
interrupted run resumes where it stopped. `python -m specfuse.eval gsm8k --help`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shutil
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .config import EnsembleConfig
from .engine import Ensemble
from .errors import SpecfuseError, TraceError
from .records import Result
from .trace import Trace, load_trace, save_trace

log = logging.getLogger(__name__)

INSTRUCTION = 'Solve the problem step by step. End your reply with "The answer is N." where N is a number.'
SC_TEMPERATURE, SC_TOP_P = 0.7, 0.95
ENSEMBLE_SYSTEMS: dict[
    str, dict[str, Any]
] = {  # system name → the switches that differ from the full ensemble
    "ensemble": {},
    "ensemble-no-feedback": {"feedback": False},
    "ensemble-no-exit": {"exit": False},
}
_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?"
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*[:=]?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)


class DataError(SpecfuseError):
    """A data file that is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    id: str  # "gsm8k-0007": the 0-based line number in the data file
    question: str
    gold: str  # the final number after "#### ", normalized


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


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default); (0, 1) when total is 0."""
    if total <= 0:
        return 0.0, 1.0
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-missing answer; ties go to the one given first (lowest seed)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


# -- running systems ----------------------------------------------------------------------------------


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


def _outcome(system: str, problem: Problem, traces: Sequence[tuple[Path, Trace]]) -> Outcome:
    results: list[Result] = [t.result for _, t in traces]
    answers = [extract_answer(r.answer) for r in results]
    predicted = answers[0] if len(answers) == 1 else majority(answers)
    return Outcome(
        system=system,
        problem=problem.id,
        predicted=predicted,
        correct=predicted is not None and predicted == problem.gold,
        seconds=sum(r.seconds for r in results),
        rounds=sum(r.rounds for r in results),
        draft_calls=sum(r.draft_calls for r in results),
        traces=tuple(str(p) for p, _ in traces),
    )


def evaluate(
    members: Sequence[Any],
    problems: Sequence[Problem],
    out_dir: str | os.PathLike[str],
    *,
    config: EnsembleConfig | None = None,
    progress: bool = False,
) -> list[Outcome]:
    """Run every system on every problem (or load its trace), and return one Outcome each.

    Systems: each member alone; the ensemble; the ensemble without feedback; without exit; and
    self-consistency of the best single member (K = N samples, majority vote). Traces are saved as
    `out_dir/<system>/<problem id>.json` (`…-s<seed>.json` for the samples).
    """
    from tqdm import tqdm

    base = config or EnsembleConfig(max_new_tokens=256)
    out = Path(out_dir)
    names = [m.name for m in members]
    k = len(members)
    jobs = len(problems) * (len(members) + len(ENSEMBLE_SYSTEMS) * (k > 1) + k * (k > 1))
    bar = tqdm(total=jobs, desc="eval", file=sys.stderr, disable=not progress, unit="run")
    outcomes: list[Outcome] = []

    def run(system: str, ensemble: Ensemble, cfg: EnsembleConfig, p: Problem, suffix: str = "") -> Any:
        path = out / system / f"{p.id}{suffix}.json"
        bar.set_description_str(f"eval {system} {p.id}")
        trace = _run_or_load(ensemble, build_prompt(p.question), cfg, path)
        bar.update(1)
        return path, trace

    singles = {}
    for m in members:
        system = f"single-{m.name}"
        ensemble = Ensemble([m], base)
        singles[m.name] = [_outcome(system, p, [run(system, ensemble, base, p)]) for p in problems]
        outcomes += singles[m.name]
    if k > 1:
        # Problem by problem from here on, so that an interrupted run leaves whole problems: rerun
        # with --limit set to the problems done and every trace loads.
        ensemble = Ensemble(members, base)
        best = best_single(singles, names)
        alone = Ensemble([members[names.index(best)]], base)
        sc_system = f"sc{k}-{best}"
        per_system: dict[str, list[Outcome]] = {s: [] for s in [*ENSEMBLE_SYSTEMS, sc_system]}
        for p in problems:
            for system, switches in ENSEMBLE_SYSTEMS.items():
                cfg = replace(base, **switches)
                per_system[system].append(_outcome(system, p, [run(system, ensemble, cfg, p)]))
            samples = []
            for seed in range(k):
                cfg = replace(base, temperature=SC_TEMPERATURE, top_p=SC_TOP_P, seed=seed)
                samples.append(run(sc_system, alone, cfg, p, f"-s{seed}"))
            per_system[sc_system].append(_outcome(sc_system, p, samples))
        for rows in per_system.values():
            outcomes += rows
    bar.close()
    return outcomes


def best_single(singles: dict[str, list[Outcome]], order: Sequence[str]) -> str:
    """The single member with the highest accuracy (ties: the one listed first)."""
    return max(order, key=lambda n: (sum(o.correct for o in singles[n]), -order.index(n)))


# -- reporting ----------------------------------------------------------------------------------------


def summary_rows(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """One row per system: accuracy with its Wilson 95 % interval, models drafting per round, time."""
    rows = []
    for system in dict.fromkeys(o.system for o in outcomes):
        mine = [o for o in outcomes if o.system == system]
        n, correct = len(mine), sum(o.correct for o in mine)
        low, high = wilson(correct, n)
        rounds = sum(o.rounds for o in mine)
        rows.append(
            {
                "system": system,
                "problems": n,
                "correct": correct,
                "accuracy": correct / n,
                "ci_low": low,
                "ci_high": high,
                "models_drafting_per_round": sum(o.draft_calls for o in mine) / rounds if rounds else 0.0,
                "seconds_per_problem": sum(o.seconds for o in mine) / n,
            }
        )
    return rows


def failure_cases(outcomes: Sequence[Outcome], ensemble: str = "ensemble") -> dict[str, Any]:
    """Problems where the ensemble was wrong and its best member right, and the reverse."""
    singles: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.system.startswith("single-"):
            singles.setdefault(o.system.removeprefix("single-"), []).append(o)
    mine = {o.problem: o for o in outcomes if o.system == ensemble}
    if not singles or not mine:
        return {"best_member": None, "ensemble_wrong_best_right": [], "ensemble_right_best_wrong": []}
    best = best_single(singles, list(singles))
    theirs = {o.problem: o for o in singles[best]}

    def case(pid: str) -> dict[str, Any]:
        return {
            "problem": pid,
            "ensemble_answer": mine[pid].predicted,
            "best_answer": theirs[pid].predicted,
            "ensemble_trace": mine[pid].traces[0],
            "best_trace": theirs[pid].traces[0],
        }

    shared = [p for p in mine if p in theirs]
    return {
        "best_member": best,
        "ensemble_wrong_best_right": [case(p) for p in shared if not mine[p].correct and theirs[p].correct],
        "ensemble_right_best_wrong": [case(p) for p in shared if mine[p].correct and not theirs[p].correct],
    }


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a GitHub Markdown table, floats to 3 decimals (no tabulate dependency)."""
    if not rows:
        return ""
    keys = list(rows[0])

    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_reports(
    outcomes: Sequence[Outcome], problems: Sequence[Problem], report_dir: Path, mix: str, png: bool = True
) -> dict[str, Any]:
    """Table (CSV, Markdown), chart (HTML, PNG when kaleido can), outcomes and failure cases (JSON)."""
    import pandas as pd

    report_dir.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(summary_rows(outcomes))
    stem = report_dir / f"eval-{mix}"  # model names hold dots: never with_suffix on this stem
    table.to_csv(_with(stem, ".csv"), index=False)
    _with(stem, ".md").write_text(markdown_table(table.to_dict(orient="records")))
    cases = failure_cases(outcomes)
    gold = {p.id: p.gold for p in problems}
    document = {
        "mix": mix,
        "problems": len(problems),
        "summary": table.to_dict(orient="records"),
        "failure_cases": cases,
        "outcomes": [{**o.__dict__, "gold": gold[o.problem]} for o in outcomes],
    }
    _with(stem, ".json").write_text(json.dumps(document, indent=1) + "\n")
    document["chart"] = _chart(table, stem, mix, len(problems), png)
    return document


def _with(stem: Path, suffix: str) -> Path:
    return stem.with_name(stem.name + suffix)


def _chart(table: Any, stem: Path, mix: str, n: int, png: bool) -> dict[str, str | None]:
    import plotly.graph_objects as go

    figure = go.Figure(
        go.Bar(
            x=table["system"],
            y=table["accuracy"],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": table["ci_high"] - table["accuracy"],
                "arrayminus": table["accuracy"] - table["ci_low"],
            },
            text=[f"{a:.0%}" for a in table["accuracy"]],
        )
    )
    figure.update_layout(
        title=f"GSM8K dev, {n} problems: {mix} (95 % Wilson intervals)",
        yaxis={"title": "accuracy", "range": [0, 1]},
        xaxis={"title": "system"},
        width=900,
        height=500,
    )
    html = _with(stem, ".html")
    figure.write_html(html, include_plotlyjs="cdn")
    done: dict[str, str | None] = {"html": str(html), "png": None, "png_error": None}
    if png:
        try:
            figure.write_image(_with(stem, ".png"))
            done["png"] = str(_with(stem, ".png"))
        except Exception as e:  # kaleido missing or no Chrome: the HTML still stands
            done["png_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("PNG export failed (%s); the HTML chart is at %s", done["png_error"], html)
    return done


def copy_cases(cases: dict[str, Any], dest: Path, limit: int = 6) -> int:
    """Copy up to `limit` traces of each failure list under `dest` (for the repository and the app)."""
    copied = 0
    for kind in ("ensemble_wrong_best_right", "ensemble_right_best_wrong"):
        for case in cases[kind][:limit]:
            for key in ("ensemble_trace", "best_trace"):
                source = Path(case[key])
                target = dest / kind / f"{source.parent.name}-{source.name}"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                case[key.replace("trace", "copy")] = str(target)
                copied += 1
    return copied


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfuse.eval",
        description="Evaluate singles, the ensemble, its ablations and self-consistency (issue 4).",
    )
    parser.add_argument("task", choices=["gsm8k"], help="the benchmark (only gsm8k for now)")
    parser.add_argument("--data", type=Path, required=True, help="GSM8K JSONL (question, answer)")
    parser.add_argument("--limit", type=int, default=None, help="the first N problems only")
    parser.add_argument("--models", nargs="+", default=None, help="catalogue names (default: the trio)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="answer budget (default 256)")
    parser.add_argument("--segment-len", type=int, default=10, help="L (default 10)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 (default auto)")
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="trace root (default runs/)")
    parser.add_argument("--out", type=Path, default=Path("bench"), help="report folder (default bench/)")
    parser.add_argument("--json", type=Path, default=None, help="also write the full report here")
    parser.add_argument("--cases", type=int, default=6, help="failure-case traces to copy per list")
    parser.add_argument("--no-png", action="store_true", help="skip the PNG chart (needs kaleido)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        if args.limit is not None and args.limit < 1:
            raise DataError(f"--limit must be ≥ 1, got {args.limit}")
        problems = load_problems(args.data, args.limit)
        from .bench import parse_models
        from .catalogue import load_member, tqdm_progress

        names = parse_models(args.models)
        config = EnsembleConfig(max_new_tokens=args.max_new_tokens, segment_len=args.segment_len)
        members = [load_member(n, dtype=args.dtype, progress=tqdm_progress(f"loading {n}")) for n in names]
        mix = "+".join(names)
        outcomes = evaluate(members, problems, args.runs / f"eval-{mix}", config=config, progress=True)
        document = write_reports(outcomes, problems, args.out, mix, png=not args.no_png)
        copy_cases(document["failure_cases"], args.out / f"cases-{mix}", args.cases)
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import pandas as pd

    print(pd.DataFrame(document["summary"]).to_string(index=False, float_format="%.3f"))
    cases = document["failure_cases"]
    for kind, label in (
        ("ensemble_wrong_best_right", f"ensemble wrong, best member ({cases['best_member']}) right"),
        ("ensemble_right_best_wrong", f"ensemble right, best member ({cases['best_member']}) wrong"),
    ):
        print(f"\n{label}: {len(cases[kind])}")
        for c in cases[kind]:
            print(
                f"  {c['problem']}: ensemble {c['ensemble_answer']} vs {c['best_answer']}"
                f"  {c['ensemble_trace']}"
            )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
