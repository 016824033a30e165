"""Benchmark: the default trio in transformers (bf16, today's CPU default) against the same GGUF files
in llama.cpp in this process (`--quantize gguf`), both loaded in one process, under the default config.

`python -m specfuse.bench` times one setup with exit off (every member drafts every round); this
one answers the question a user asks: how much faster do my answers come with the default settings
(weak members exit, lone drafts go unverified)? Each prompt runs on both setups back to back, the
order alternating from prompt to prompt, so that a machine's drift falls on both. Prints tokens per
second, first-segment latency and their ratios, measured in one run, with the load average beside.
"""

from __future__ import annotations

import argparse
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
from ..models.catalogue import DEFAULT_MEMBERS
from .measure import cpu_model

# The app's example prompts and a GSM8K-style problem (greedy, so each run is repeatable).
PROMPTS = (
    *OPEN_PROMPTS[:4],
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
)
SETUPS = ("none", "gguf")  # --quantize values: bf16 in transformers, the GGUF file in llama.cpp


def run(names: Sequence[str], prompts: Sequence[str], config: EnsembleConfig) -> dict[str, Any]:
    from ..models.loading import load_members, tqdm_progress

    ensembles = {
        q: Ensemble(load_members(names, quantize=q, progress=tqdm_progress(f"loading ({q})")), config)
        for q in SETUPS
    }
    for ensemble in ensembles.values():  # warm-up: first calls allocate and fault pages in
        ensemble.run("Say hello.", EnsembleConfig(max_new_tokens=10))
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {q: [] for q in SETUPS}
    for i, prompt in enumerate(prompts):
        for q in SETUPS if i % 2 == 0 else reversed(SETUPS):
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
            print(f"  {q:<5} prompt {i + 1}: {result.tokens} tokens in {result.seconds:.2f} s", flush=True)
    totals = {q: _totals(r) for q, r in runs.items()}
    base, fast = totals["none"], totals["gguf"]
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "models": list(names),
        "config": {"max_new_tokens": config.max_new_tokens, "exit": config.exit, "verify": config.verify},
        "runs": runs,
        "totals": totals,
        "speedup_tokens_per_s": fast["tokens_per_s"] / base["tokens_per_s"],
        "first_segment_ratio": fast["first_segment_median_s"] / base["first_segment_median_s"],
        "same_answers": sum(a["answer"] == b["answer"] for a, b in zip(runs["none"], runs["gguf"])),
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


def format_report(report: dict[str, Any]) -> str:
    a, b = report["totals"]["none"], report["totals"]["gguf"]
    cfg = report["config"]
    lines = [
        f"CPU: {report['cpu']} ({report['cores']} cores) | models: {', '.join(report['models'])}",
        f"{len(report['runs']['none'])} prompts, {cfg['max_new_tokens']} tokens, exit "
        f"{'on' if cfg['exit'] else 'off'}, verify {cfg['verify']} (defaults otherwise)",
        f"{'':<26}{'bf16 (torch)':>14}{'gguf (llama.cpp)':>18}{'ratio':>8}",
    ]
    for key, label in (
        ("tokens_per_s", "tokens/s"),
        ("first_segment_median_s", "first segment, median s"),
        ("verify_calls_per_round", "verify passes a round"),
    ):
        ratio = b[key] / a[key] if a[key] else float("nan")
        lines.append(f"{label:<26}{a[key]:>14.2f}{b[key]:>18.2f}{ratio:>8.2f}")
    lines.append(f"tokens: {a['tokens']} / {b['tokens']} | same answer on {report['same_answers']} prompts")
    lines.append(f"load average before {report['load_average_before']}, after {report['load_average_after']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfuse.bench backends",
        description="The trio in transformers (bf16) vs in llama.cpp (GGUF), default config, one run. "
        "Run on an idle machine; needs `make llama-cpp`.",
    )
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MEMBERS), help="catalogue names")
    parser.add_argument("--max-new-tokens", type=int, default=256)
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
