"""Two systems from two runs folders, paired on the problems both finished: accuracies with Wilson
intervals, the discordant pairs and the exact McNemar p-value (specfuse.eval.stats.paired).

For runs the evaluation cannot put in one report because what differs is not a config setting, e.g.
the same ensemble with bf16 and with int4 weights (`--quantize`, kept in another --runs folder):

    python tools/paired_runs.py --data ../shared/data/gsm8k/dev.jsonl \
        runs/gsm8k-int4:ensemble runs/gsm8k:ensemble

A source is a runs folder or a report JSON (its stored outcomes: runs whose traces are gone); a
side may join several sources with commas, e.g. problems 0–149 from a committed report and 150–299
from a new runs folder: `7407b66:results/RESULTS-gsm8k-gguf-median.json:median,runs/gsm8k-gguf:median`.
A source written `<commit>:<path>` is read from git history (`git show`), where results/ keeps the
raw reports it no longer holds (results/README.md).
On IFEval it also gives each side's instruction-level strict accuracy per instruction group.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from specfuse.errors import SpecfuseError
from specfuse.eval import ifeval
from specfuse.eval.outcomes import load_outcomes
from specfuse.eval.problems import Outcome
from specfuse.eval.stats import paired

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = re.compile(r"[0-9a-f]{7,40}:[^:]+")


def _outcomes(source: str, data: str) -> list[Outcome]:
    """A runs folder's or report's outcomes; `<commit>:<path>` is a report read from git history."""
    if Path(source).exists() or not COMMITTED.fullmatch(source):
        return load_outcomes(source, data)
    try:
        shown = subprocess.run(["git", "show", source], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"{source} is not in this clone's git history: {e}") from e
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / Path(source.partition(":")[2]).name
        report.write_bytes(shown)
        return load_outcomes(report, data)


def outcomes_by_problem(specs: str, data: str) -> dict[str, Outcome]:
    """Each problem's outcome under one side's SOURCE:SYSTEM specs (comma-separated; a problem found
    in two sources is refused: a side must not be stitched from overlapping runs)."""
    merged: dict[str, Outcome] = {}
    for spec in specs.split(","):
        source, _, system = spec.rpartition(":")
        if not source:
            raise SystemExit(f"{spec!r} is not SOURCE:SYSTEM (a runs folder or report JSON)")
        found = {o.problem: o for o in _outcomes(source, data) if o.system == system}
        if not found:
            raise SystemExit(f"no outcomes of {system!r} in {source}")
        if twice := sorted(set(found) & set(merged)):
            raise SystemExit(f"{spec!r} repeats {len(twice)} problems of the same side, e.g. {twice[0]}")
        merged.update(found)
    return merged


def compare(a_specs: str, b_specs: str, data: str) -> dict[str, Any]:
    """The paired figures of side a against side b on the problems both finished, and how many of
    those got the very same answer text (two runs of one config differ only by rounding)."""
    a, b = outcomes_by_problem(a_specs, data), outcomes_by_problem(b_specs, data)
    problems = sorted(set(a) & set(b))
    figures = paired([a[p].correct for p in problems], [b[p].correct for p in problems])
    result = {
        "a": a_specs,
        "b": b_specs,
        **figures,
        "same_answer": sum(a[p].answer == b[p].answer for p in problems),
    }
    if any(o.followed for o in a.values()):  # IFEval: which kinds of instruction each side keeps
        sides = [replace(a[p], system="a") for p in problems] + [replace(b[p], system="b") for p in problems]
        result["by_group"] = ifeval.by_group(sides, ifeval.load_ifeval(data, rows=None))
    return result


def main(argv: Sequence[str] | None = None) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("a", help="SOURCE:SYSTEM[,SOURCE:SYSTEM…], e.g. runs/gsm8k-int4:ensemble")
    parser.add_argument("b", help="SOURCE:SYSTEM[,…], the baseline")
    parser.add_argument(
        "--data", required=True, help="the GSM8K or IFEval JSONL of the runs (ifeval: the packaged rows)"
    )
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.data == "ifeval":  # the packaged file lies in site-packages, where nobody types its path
        args.data = str(ifeval.packaged_data())
    try:
        result = compare(args.a, args.b, args.data)
    except SpecfuseError as e:  # a missing data file or runs folder, a system not in it: say which
        parser.error(str(e))
    ci_a, ci_b = result["ci_a"], result["ci_b"]
    print(f"{result['problems']} problems both finished ({result['same_answer']} with the same answer text)")
    print(f"  {args.a}: {result['accuracy_a']:.3f} [{ci_a[0]:.3f}, {ci_a[1]:.3f}]")
    print(f"  {args.b}: {result['accuracy_b']:.3f} [{ci_b[0]:.3f}, {ci_b[1]:.3f}]")
    print(
        f"  both right {result['both_right']}, only a {result['only_a']}, only b {result['only_b']}, "
        f"both wrong {result['both_wrong']}; difference {result['difference']:+.3f}, "
        f"McNemar p = {result['p_value']:.3f}"
    )
    for row in result.get("by_group", []):
        a, b = (f"{row[side]:.3f}" if row[side] is not None else "–" for side in ("a", "b"))
        print(f"  {row['instruction group']:<20} {row['instruction count']:>4} instructions: a {a}, b {b}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
