"""Benchmark: the default trio in transformers (bf16), against the same GGUF files in llama.cpp in this
process (`--quantize gguf`), and against both at once (`--quantize gguf-draft`: drafts in llama.cpp,
scores in bf16), all loaded in one process, under the default config.

`python -m specfuse.bench` times one setup with exit off (every member drafts every round); this
one answers the question a user asks: how much faster do my answers come with the default settings
(weak members exit, lone drafts go unverified)? Each prompt runs on every setup back to back, the
order rotating from prompt to prompt, so that a machine's drift falls on all. Prints tokens per
second, first-segment latency and their ratios, measured in one run, with the load average beside.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import EnsembleConfig
from ..engine import Ensemble
from ..errors import SpecfuseError
from ..eval.problems import OPEN_PROMPTS
from ..flags import Parser, add_loading_flags, add_settings
from ..members.split import SplitMember
from .measure import cpu_model

# The app's example prompts and a GSM8K-style problem (greedy, so each run is repeatable).
PROMPTS = (
    *OPEN_PROMPTS[:4],
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
)
# --quantize values: bf16 in transformers, the GGUF file in llama.cpp, drafts in the one and scores in
# the other. The first is the baseline of the ratios.
SETUPS = ("none", "gguf", "gguf-draft")


def run(names: Sequence[str], prompts: Sequence[str], config: EnsembleConfig) -> dict[str, Any]:
    from ..models.placement import load_members, tqdm_progress

    loaded = {
        q: load_members(names, quantize=q, progress=tqdm_progress(f"loading ({q})")) for q in SETUPS[:2]
    }
    # gguf-draft pairs the two setups' own loads (what load_members(quantize="gguf-draft") loads
    # again): the same weights, and the memory of one copy each.
    loaded["gguf-draft"] = [SplitMember(d, v) for d, v in zip(loaded["gguf"], loaded["none"])]
    ensembles = {q: Ensemble(members, config) for q, members in loaded.items()}
    for ensemble in ensembles.values():  # warm-up: first calls allocate and fault pages in
        ensemble.run("Say hello.", EnsembleConfig(max_new_tokens=10))
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {q: [] for q in SETUPS}
    for i, prompt in enumerate(prompts):
        for q in SETUPS[i % len(SETUPS) :] + SETUPS[: i % len(SETUPS)]:
            result = ensembles[q].run(prompt, config)
            runs[q].append(
                {
                    "tokens": result.tokens,
                    "seconds": result.seconds,
                    "first_segment_s": result.first_segment_latency_s,
                    "rounds": result.rounds,
                    "verify_calls": result.verify_calls,
                    "answer": result.answer,
                }
            )
            print(f"  {q:<10} prompt {i + 1}: {result.tokens} tokens in {result.seconds:.2f} s", flush=True)
    totals = {q: _totals(r) for q, r in runs.items()}
    base = totals[SETUPS[0]]
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "models": list(names),
        "config": {"max_new_tokens": config.max_new_tokens, "exit": config.exit, "verify": config.verify},
        "runs": runs,
        "totals": totals,
        "speedup_tokens_per_s": {q: t["tokens_per_s"] / base["tokens_per_s"] for q, t in totals.items()},
        "first_segment_ratio": {
            q: t["first_segment_median_s"] / base["first_segment_median_s"] for q, t in totals.items()
        },
        "same_answers": {
            q: sum(a["answer"] == b["answer"] for a, b in zip(runs[SETUPS[0]], r)) for q, r in runs.items()
        },
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


def _totals(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    tokens, seconds = sum(r["tokens"] for r in runs), sum(r["seconds"] for r in runs)
    rounds = max(1, sum(r["rounds"] for r in runs))
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "first_segment_median_s": statistics.median(r["first_segment_s"] for r in runs),
        "verify_calls_per_round": sum(r["verify_calls"] for r in runs) / rounds,
    }


LABELS = {"none": "bf16 (torch)", "gguf": "gguf (llama.cpp)", "gguf-draft": "gguf-draft"}


def format_report(report: dict[str, Any]) -> str:
    totals, cfg = report["totals"], report["config"]
    setups = list(totals)
    base = totals[setups[0]]
    lines = [
        f"CPU: {report['cpu']} ({report['cores']} cores) | models: {', '.join(report['models'])}",
        f"{len(report['runs'][setups[0]])} prompts, {cfg['max_new_tokens']} tokens, exit "
        f"{'on' if cfg['exit'] else 'off'}, verify {cfg['verify']} (defaults otherwise)",
        f"{'':<26}"
        + "".join(f"{LABELS.get(q, q):>18}" for q in setups)
        + "".join(f"{'× ' + q:>14}" for q in setups[1:]),
    ]
    for key, label in (
        ("tokens_per_s", "tokens/s"),
        ("first_segment_median_s", "first segment, median s"),
        ("verify_calls_per_round", "verify passes a round"),
    ):
        ratios = "".join(
            f"{totals[q][key] / base[key] if base[key] else float('nan'):>14.2f}" for q in setups[1:]
        )
        lines.append(f"{label:<26}" + "".join(f"{totals[q][key]:>18.2f}" for q in setups) + ratios)
    lines.append(
        "tokens: " + " / ".join(str(totals[q]["tokens"]) for q in setups) + " | same answer as "
        f"{setups[0]}: " + ", ".join(f"{q} {report['same_answers'][q]}" for q in setups[1:])
    )
    lines.append(f"load average before {report['load_average_before']}, after {report['load_average_after']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m specfuse.bench backends",
        description="The trio in transformers (bf16) vs in llama.cpp (GGUF) vs drafting in llama.cpp and "
        "scoring in bf16, default config, one run. "
        "Run on an idle machine; needs `make llama-cpp`.",
    )
    add_loading_flags(parser, only=("models",))
    add_settings(parser, only=("max_new_tokens",))
    parser.add_argument("--exit-off", action="store_true", help="every member drafts every round")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = EnsembleConfig(max_new_tokens=args.max_new_tokens, exit=not args.exit_off)
    try:
        report = run(args.models, PROMPTS, config)
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
