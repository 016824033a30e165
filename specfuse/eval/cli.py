"""The quality evaluation: singles, ensembles and their variants, self-consistency, on GSM8K or on
open-ended prompts, resumable from traces, with paired statistics and a results page.

Knows nothing about how members draft or score: every system is an Ensemble (one member = that
model alone) run through `Ensemble.stream_many`, and every figure is recomputed from the saved
traces, so an interrupted run resumes where it stopped. `python -m specfuse.eval --help`:

    python -m specfuse.eval gsm8k --data dev.jsonl --limit 50 --systems ensemble,paper \\
        --variant lr2:learning_rate=2 --batch-size 8 --out results/eval --name gsm8k-lr2
    python -m specfuse.eval open-ended --systems ensemble,paper
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

The code behind this command line: `specfuse.eval.problems` (data, answers, Outcome),
`specfuse.eval.runs` (systems, batched resumable runs), `specfuse.eval.outcomes` (grading,
load_outcomes), `specfuse.eval.variants` (built-in systems and --variant parsing),
`specfuse.eval.stats` (wilson, paired, mcnemar_exact, ends_in_loop, distinct_n),
`specfuse.eval.report` (tables, charts, failure cases) and `specfuse.eval.page` (the Markdown page,
the terminal's summary). This module re-exports
their main names and holds the throughput benchmark and the CLI.
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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import EnsembleConfig
from ..engine import Ensemble
from ..errors import ConfigError, SpecfuseError
from ..flags import Parser, add_loading_flags, add_settings, parse_models
from ..models import trust as trust_file
from .ifeval import load_ifeval
from .outcomes import EvalError, disagreements, load_outcomes, systems_of
from .problems import (
    INSTRUCTION,
    OPEN_PROMPTS,
    DataError,
    Outcome,
    Problem,
    build_prompt,
    extract_answer,
    load_problems,
    majority,
    normalize_number,
    open_problems,
    parse_rows,
)
from .runs import (
    System,
    _run_or_load,
    best_single,
    evaluate,
    mix_name,
    parse_systems,
    plan_systems,
    run_systems,
)
from .stats import wilson
from .variants import BUILTIN, load_variants, parse_variant

log = logging.getLogger(__name__)

__all__ = [  # the evaluation's API in one place; the code: problems, runs, outcomes, stats, report, page
    "INSTRUCTION", "OPEN_PROMPTS", "DataError", "EvalError", "Outcome", "Problem", "System", "_run_or_load",
    "best_single", "build_prompt", "disagreements", "evaluate", "extract_answer", "load_outcomes",
    "load_problems", "majority", "normalize_number", "open_problems", "plan_systems", "run_systems",
    "systems_of", "wilson", "Ensemble",
]  # fmt: skip


# -- throughput -----------------------------------------------------------------------------------------


def throughput(
    members: Sequence[Any],
    problems: Sequence[Problem],
    config: EnsembleConfig,
    batch_size: int,
    repeats: int = 1,
) -> dict[str, Any]:
    """The same problems one at a time (stream) and batched (stream_many), side by side: problems
    per hour for both, their ratio, the load average around each pass, and whether answers agree.

    A short warm-up run goes first; with `repeats` > 1 the passes alternate (stream, batched,
    batched, stream, …) so that a load that drifts during the run favours neither. Not a test: the
    figures depend on the machine and its load.
    """
    ensemble = Ensemble(members, config)
    prompts = [p.prompt for p in problems]
    warm = replace(config, max_new_tokens=min(8, config.max_new_tokens))
    for _ in ensemble.stream_many(prompts[:batch_size], warm):  # lazy initialisation, allocator
        pass

    def one_at_a_time() -> list[str]:
        return [ensemble.run(p).answer for p in prompts]

    def batched() -> list[str]:
        texts = [""] * len(prompts)
        for start in range(0, len(prompts), batch_size):
            for i, rnd in ensemble.stream_many(prompts[start : start + batch_size], config):
                texts[start + i] = rnd.text
        return texts

    seconds = {"stream": 0.0, "batched": 0.0}
    answers: dict[str, list[str]] = {}
    loads = [os.getloadavg()]
    for r in range(repeats):
        for kind in ("stream", "batched") if r % 2 == 0 else ("batched", "stream"):
            began = time.perf_counter()
            answers[kind] = one_at_a_time() if kind == "stream" else batched()
            seconds[kind] += time.perf_counter() - began
            loads.append(os.getloadavg())
    n = len(prompts) * repeats
    per_hour = {k: 3600 * n / s if s else math.inf for k, s in seconds.items()}
    return {
        "members": [m.name for m in members],
        "problems": len(prompts),
        "batch_size": batch_size,
        "repeats": repeats,
        "stream_s": seconds["stream"],
        "batched_s": seconds["batched"],
        "stream_per_hour": per_hour["stream"],
        "batched_per_hour": per_hour["batched"],
        "ratio": per_hour["batched"] / per_hour["stream"],
        "load_averages": loads,  # os.getloadavg() before the first pass and after each pass
        "same_answers": sum(a == b for a, b in zip(answers["stream"], answers["batched"])),
    }


def format_throughput(report: dict[str, Any]) -> str:
    loads = "; ".join(" ".join(f"{v:.2f}" for v in load) for load in report["load_averages"])
    return "\n".join(
        [
            f"members: {', '.join(report['members'])}; problems: {report['problems']} × {report['repeats']}; "
            f"batch size: {report['batch_size']}",
            f"one at a time (stream):  {report['stream_per_hour']:10.1f} problems/hour "
            f"({report['stream_s']:.1f} s)",
            f"batched (stream_many):   {report['batched_per_hour']:10.1f} problems/hour "
            f"({report['batched_s']:.1f} s)",
            f"ratio batched / stream:  {report['ratio']:10.2f}",
            f"load average (1, 5, 15 min) before and after each pass: {loads} (cores: {os.cpu_count()})",
            f"identical answers: {report['same_answers']} of {report['problems']}",
        ]
    )


# -- command line -------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m specfuse.eval",
        description="Evaluate singles, ensembles, their variants and self-consistency (issues 4 and 7).",
    )
    tasks = parser.add_subparsers(
        dest="task", required=True, metavar="{gsm8k,ifeval,open-ended,trust,throughput}"
    )
    common, study = _common_flags(), _study_flags()
    _add_studies(tasks, common, study)
    _add_trust_and_throughput(tasks, common)
    return parser


def _common_flags() -> Parser:
    """Every task's flags but trust's: the members, the decoding and the batch."""
    common = Parser(add_help=False)
    add_loading_flags(
        common, only=("models", "dtype", "quantize", "trust"), defaults={"models": None, "quantize": "none"}
    )
    add_settings(common, only=("max_new_tokens", "segment_len"))
    common.add_argument(
        "--batch-size", type=int, default=8, help="prompts under way at once (stream_many; default 8)"
    )
    common.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    return common


def _study_flags() -> Parser:
    """The flags of a study (gsm8k, ifeval, open-ended): its systems, variants and report."""
    study = Parser(add_help=False)
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
    study.add_argument(
        "--out",
        type=Path,
        default=Path("out/eval"),
        help="report folder (default out/eval/; results/README.md names what ships)",
    )
    study.add_argument("--title", default=None, help="the results page's title")
    study.add_argument("--cases", type=int, default=6, help="failure-case traces to copy per list")
    study.add_argument("--no-png", action="store_true", help="skip the PNG chart (needs kaleido)")
    return study


def _add_studies(tasks: argparse._SubParsersAction[Parser], common: Parser, study: Parser) -> None:
    """The gsm8k, ifeval and open-ended tasks."""
    gsm = tasks.add_parser("gsm8k", parents=[common, study], help="GSM8K accuracy with paired statistics")
    gsm.add_argument("--data", type=Path, required=True, help="GSM8K JSONL (question, answer)")
    gsm.add_argument("--limit", type=int, default=None, help="the first N problems only (of --rows)")
    gsm.add_argument(
        "--rows",
        default=None,
        help="FIRST:END lines of the file, 0-based, END excluded (default: all); a problem's id is its "
        "line, so runs of different rows pair up",
    )
    gsm.add_argument("--runs", type=Path, default=Path("runs/gsm8k"), help="trace root (default runs/gsm8k)")
    gsm.add_argument("--name", default="gsm8k", help="report file stem (default gsm8k)")
    gsm.add_argument("--json", type=Path, default=None, help="also write the full report here")

    ife = tasks.add_parser(
        "ifeval", parents=[common, study], help="IFEval instruction following, Google's rule-based checker"
    )
    ife.add_argument(
        "--data", type=Path, default=None, help="JSONL in IFEval's format (default: the packaged 541 rows)"
    )
    ife.add_argument(
        "--rows",
        default="0:300",
        help="FIRST:END rows of the file, 0-based (default 0:300, the development rows; 300:541 are kept "
        "for confirmation: choose nothing on them)",
    )
    ife.add_argument(
        "--runs", type=Path, default=Path("runs/ifeval"), help="trace root (default runs/ifeval)"
    )
    ife.add_argument("--name", default="ifeval", help="report file stem (default ifeval)")
    ife.add_argument("--json", type=Path, default=None, help="also write the full report here")

    open_ = tasks.add_parser("open-ended", parents=[common, study], help="loops and distinct-n, no gold")
    open_.add_argument(
        "--prompts", type=Path, default=None, help="one prompt per line (default: app examples)"
    )
    open_.add_argument("--runs", type=Path, default=Path("runs/open"), help="trace root (default runs/open)")
    open_.add_argument("--name", default="open", help="report file stem (default open)")


def _add_trust_and_throughput(tasks: argparse._SubParsersAction[Parser], common: Parser) -> None:
    """The trust task (from reports, no members) and the throughput task."""
    trust = tasks.add_parser(
        "trust", help="members' starting trust from their accuracy alone in evaluation reports"
    )
    trust.add_argument("reports", nargs="+", type=Path, help="report JSON files (their single-<member> rows)")
    trust.add_argument(
        "--out", type=Path, required=True, help="the trust file to write (--trust FILE reads it)"
    )

    speed = tasks.add_parser("throughput", parents=[common], help="stream vs stream_many, problems/hour")
    speed.add_argument("--data", type=Path, default=None, help="GSM8K JSONL (default: the app's prompts)")
    speed.add_argument("--problems", type=int, default=8, help="how many problems (default 8)")
    speed.add_argument("--repeats", type=int, default=1, help="alternating passes of each kind (default 1)")
    speed.add_argument("--json", type=Path, default=None, help="also write the figures here")


def _variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    variants = load_variants(args.variants) if args.variants is not None else {}
    for spec in args.variant:
        name, settings = parse_variant(spec)
        if name in variants:
            raise ConfigError(f"variant {name!r} is defined twice")
        variants[name] = settings
    return variants


def _rows_note(rows: str | None) -> str:
    return f" (rows {rows})" if rows else ""


def _problems(args: argparse.Namespace) -> list[Problem]:
    """The task's problems: GSM8K or IFEval rows, open-ended prompts, or the throughput's set."""
    if args.task == "gsm8k":
        rows = parse_rows(args.rows) if args.rows is not None else None
        return load_problems(args.data, args.limit, rows)
    if args.task == "ifeval":
        return load_ifeval(args.data, parse_rows(args.rows))
    if args.task == "open-ended":
        return open_problems(args.prompts)
    if args.data is not None:
        return load_problems(args.data, args.problems)
    return open_problems()[: args.problems]


def _title(args: argparse.Namespace, problems: Sequence[Problem], names: Sequence[str]) -> str:
    if args.title:
        return str(args.title)
    if args.task == "gsm8k":
        return f"GSM8K dev, {len(problems)} problems{_rows_note(args.rows)}: {mix_name(names)}"
    if args.task == "ifeval":
        return f"IFEval rows {args.rows}: {mix_name(names)}"
    return f"Open-ended prompts: {mix_name(names)}"


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(raw)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.task == "trust":
        return _trust(
            args.reports, args.out, "python -m specfuse.eval " + " ".join(shlex.quote(a) for a in raw)
        )
    try:
        if getattr(args, "limit", None) is not None and args.limit < 1:
            raise DataError(f"--limit must be ≥ 1, got {args.limit}")
        if args.batch_size < 1:
            raise ConfigError(f"--batch-size must be ≥ 1, got {args.batch_size}")
        config = EnsembleConfig(max_new_tokens=args.max_new_tokens, segment_len=args.segment_len)
        variants = _variants(args) if args.task != "throughput" else {}
        problems = _problems(args)
        names = parse_models(args.models, hub=False)
        systems = parse_systems(getattr(args, "systems", None))
        if args.task == "ifeval" and any(re.fullmatch(r"sc\d+-.+", s) for s in systems or ()):
            raise ConfigError("self-consistency votes over answers; IFEval has no answer to vote on")
        # Check the requested systems before loading any model.
        plan_systems(names, config, systems, variants, best=names[0])
        trust = trust_file.load_trust(args.trust) if args.trust is not None else None
        # quantize only when asked: tests stand in for _load(names, dtype)
        members = _load(names, args.dtype, **({} if args.quantize == "none" else {"quantize": args.quantize}))
        if trust is not None:
            trust_file.apply_trust(members, trust)
        if args.task == "throughput":
            report = throughput(members, problems, config, args.batch_size, max(1, args.repeats))
            print(format_throughput(report))
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(report, indent=1) + "\n")
            return 0
        from . import report as eval_report
        from .page import console_summary

        outcomes = evaluate(
            members, problems, args.runs, config=config, systems=systems, variants=variants,
            batch_size=args.batch_size, progress=True,
        )  # fmt: skip
        command = "python -m specfuse.eval " + " ".join(shlex.quote(a) for a in raw)
        document = eval_report.write_reports(
            outcomes, problems, args.out, args.name, png=not args.no_png, command=command,
            title=_title(args, problems, names), config=config, variants=variants, cases=args.cases,
        )  # fmt: skip
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(console_summary(document))
    if getattr(args, "json", None) is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return 0


def evidence_from(reports: Sequence[Path]) -> list[trust_file.Evidence]:
    """Each single-<member> system's record per task (the problems' id prefix), over all `reports`;
    a problem met in several reports counts once (the first)."""
    seen: dict[tuple[str, str], dict[str, bool]] = {}
    sources: dict[tuple[str, str], list[str]] = {}
    for path in reports:
        for o in load_outcomes(path):
            if not o.system.startswith("single-"):
                continue
            key = (o.system.removeprefix("single-"), o.problem.split("-", 1)[0])
            seen.setdefault(key, {}).setdefault(o.problem, o.correct)
            if path.name not in sources.setdefault(key, []):
                sources[key].append(path.name)
    return [
        trust_file.Evidence(member, task, sum(marks.values()), len(marks), "+".join(sources[member, task]))
        for (member, task), marks in seen.items()
    ]


def _trust(reports: Sequence[Path], out: Path, command: str) -> int:
    try:
        evidence = evidence_from(reports)
        if not evidence:
            raise EvalError("the reports hold no single-<member> systems: run the members alone first")
        trust_file.write_trust(out, evidence, command)
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for row in evidence:
        print(f"{row.member:28s} {row.task:8s} {row.correct:4d} / {row.problems:4d}  ({row.source})")
    for member, value in trust_file.compute(evidence).items():
        print(f"trust {member:28s} {value:.3f}")
    print(f"wrote {out}")
    return 0


def _load(names: Sequence[str], dtype: str, quantize: str = "none") -> list[Any]:
    from ..models.placement import load_members, tqdm_progress

    return load_members(names, dtype=dtype, progress=tqdm_progress("loading"), quantize=quantize)


if __name__ == "__main__":
    sys.exit(main())
