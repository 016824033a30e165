"""verify="always" against verify="disagree" on the default trio, one problem at a time, the two
modes alternating per problem (so that a drifting load favours neither): tokens/s, verify passes,
rounds unscored. Run: python tools/bench_verify.py [--problems 6] [--max-new-tokens 128]."""

from __future__ import annotations

import json
import os
import time

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.eval.problems import load_problems
from specfuse.flags import Parser, add_settings
from specfuse.models.catalogue import DEFAULT_MEMBERS
from specfuse.models.placement import load_members


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("--data", default="../shared/data/gsm8k/dev.jsonl")
    parser.add_argument("--problems", type=int, default=6)
    add_settings(parser, only=("max_new_tokens",), defaults={"max_new_tokens": 128})
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    ensemble = Ensemble(load_members(list(DEFAULT_MEMBERS)))
    problems = load_problems(args.data, args.problems)
    ensemble.run(problems[0].prompt, EnsembleConfig(max_new_tokens=8))  # warm-up
    totals = {
        mode: {"tokens": 0, "seconds": 0.0, "rounds": 0, "verify_calls": 0, "unscored": 0}
        for mode in ("always", "disagree")
    }
    loads = [os.getloadavg()]
    for i, problem in enumerate(problems):
        for mode in ("always", "disagree") if i % 2 == 0 else ("disagree", "always"):
            config = EnsembleConfig(max_new_tokens=args.max_new_tokens, verify=mode)
            began = time.perf_counter()
            rounds = list(ensemble.stream(problem.prompt, config))
            seconds = time.perf_counter() - began
            t = totals[mode]
            t["seconds"] += seconds
            t["tokens"] += sum(r.winner.num_tokens for r in rounds)
            t["rounds"] += len(rounds)
            t["verify_calls"] += sum(len(r.verifiers) for r in rounds)
            t["unscored"] += sum(not r.verified for r in rounds)
        loads.append(os.getloadavg())
    for mode, t in totals.items():
        t["tokens_per_s"] = t["tokens"] / t["seconds"]
        print(
            f"{mode:9s} {t['tokens_per_s']:6.2f} tokens/s  verify passes {t['verify_calls']:4d} "
            f"({t['verify_calls'] / t['rounds']:.2f} a round)  "
            f"rounds unscored {t['unscored']} of {t['rounds']}"
        )
    ratio = totals["disagree"]["tokens_per_s"] / totals["always"]["tokens_per_s"]
    print(
        f"disagree / always tokens/s: {ratio:.2f}; load average before and after each problem: "
        + "; ".join(" ".join(f"{v:.2f}" for v in load) for load in loads)
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "totals": totals,
                    "ratio": ratio,
                    "load_averages": loads,
                    "problems": args.problems,
                    "max_new_tokens": args.max_new_tokens,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
