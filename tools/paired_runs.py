"""Two systems from two runs folders, paired on the problems both finished: accuracies with Wilson
intervals, the discordant pairs and the exact McNemar p-value (specfuse.eval.stats.paired).

For runs the evaluation cannot put in one report because what differs is not a config setting, e.g.
the same ensemble with bf16 and with int4 weights (`--quantize`, kept in another --runs folder):

    python tools/paired_runs.py --data ../shared/data/gsm8k/dev.jsonl \
        runs/gsm8k-int4:ensemble runs/gsm8k:ensemble
"""

from __future__ import annotations

import argparse
import json

from specfuse.eval.runs import load_outcomes
from specfuse.eval.stats import paired


def correct_by_problem(spec: str, data: str) -> dict[str, bool]:
    folder, _, system = spec.rpartition(":")
    if not folder:
        raise SystemExit(f"{spec!r} is not FOLDER:SYSTEM")
    found = {o.problem: o.correct for o in load_outcomes(folder, data) if o.system == system}
    if not found:
        raise SystemExit(f"no outcomes of {system!r} in {folder}")
    return found


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("a", help="FOLDER:SYSTEM, e.g. runs/gsm8k-int4:ensemble")
    parser.add_argument("b", help="FOLDER:SYSTEM, the baseline")
    parser.add_argument("--data", required=True, help="the GSM8K or IFEval JSONL the runs were made on")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    a, b = correct_by_problem(args.a, args.data), correct_by_problem(args.b, args.data)
    problems = sorted(set(a) & set(b))
    result = {"a": args.a, "b": args.b, **paired([a[p] for p in problems], [b[p] for p in problems])}
    ci_a, ci_b = result["ci_a"], result["ci_b"]
    print(f"{result['problems']} problems both finished")
    print(f"  {args.a}: {result['accuracy_a']:.3f} [{ci_a[0]:.3f}, {ci_a[1]:.3f}]")
    print(f"  {args.b}: {result['accuracy_b']:.3f} [{ci_b[0]:.3f}, {ci_b[1]:.3f}]")
    print(
        f"  both right {result['both_right']}, only a {result['only_a']}, only b {result['only_b']}, "
        f"both wrong {result['both_wrong']}; difference {result['difference']:+.3f}, "
        f"McNemar p = {result['p_value']:.3f}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
