"""Batched answers against solo ones, in one back end: `python -m specfuse.bench equality`.

Each prompt is answered alone (Ensemble.stream) and in batches (stream_many: one member call per
phase for all the batch's runs, as the server's scheduler plays them), greedy. For each prompt whose
answers differ it finds the first round where the two runs part, and how: a member drafted other
tokens (its logits moved with what shared its decode calls), members exited differently, or the same
candidates were scored into another choice, with the solo round's margin (how near a tie it was). It
also gives the largest move of a raw score over the rounds the runs share. Greedy fp32 torch is
exact under batching (tested); llama.cpp's and bf16's kernels round by the batch's shape, which this
measures (docs/serve.md, "Honest answers under load").
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from ..config import EnsembleConfig
from ..errors import SpecfuseError
from ..eval.problems import OPEN_PROMPTS, build_prompt, load_problems
from ..records import Round
from .measure import bench_main, bench_parser, cpu_model


def first_difference(solo: Sequence[Round], batched: Sequence[Round]) -> dict[str, Any] | None:
    """Where two runs of one prompt part (None: the same rounds to the end): the round and how."""
    for k, (a, b) in enumerate(zip(solo, batched), 1):
        if a.active != b.active:
            return {"round": k, "where": "exits", "members": sorted(set(a.active) ^ set(b.active))}
        drafted = [x.member for x, y in zip(a.candidates, b.candidates) if x.text != y.text]
        if drafted:
            return {"round": k, "where": "draft", "members": drafted}
        if a.chosen != b.chosen:
            return {"round": k, "where": "choice", "margin": a.margin}
    if len(solo) != len(batched):
        return {"round": min(len(solo), len(batched)) + 1, "where": "length"}
    return None


def score_drift(solo: Sequence[Round], batched: Sequence[Round]) -> float:
    """The largest difference between the raw scores the two runs gave the same candidates, over the
    rounds they share (up to and including the first where they part)."""
    drift = 0.0
    for a, b in zip(solo, batched):
        same = [j for j, (x, y) in enumerate(zip(a.candidates, b.candidates)) if x.text == y.text]
        if a.verifiers == b.verifiers:
            for row_a, row_b in zip(a.raw_scores, b.raw_scores):
                drift = max([drift, *(abs(row_a[j] - row_b[j]) for j in same)])
        if len(same) < len(a.candidates) or a.chosen != b.chosen:
            break
    return drift


def run(members: Sequence[Any], prompts: Sequence[str], config: EnsembleConfig, batch: int) -> dict[str, Any]:
    from ..engine import Ensemble

    ensemble = Ensemble(members, config)
    began = time.perf_counter()
    solo = [list(ensemble.stream(p)) for p in prompts]
    solo_s = time.perf_counter() - began
    batched: list[list[Round]] = [[] for _ in prompts]
    began = time.perf_counter()
    for start in range(0, len(prompts), batch):
        for i, rnd in ensemble.stream_many(prompts[start : start + batch], config):
            batched[start + i].append(rnd)
    batched_s = time.perf_counter() - began
    rows = []
    for prompt, a, b in zip(prompts, solo, batched):
        where = first_difference(a, b)
        rows.append({
            "prompt": prompt[:60],
            "equal": a[-1].text == b[-1].text if a and b else a == b,
            "first_difference": where,
            "rounds": len(a),
            "score_drift": score_drift(a, b),
        })  # fmt: skip
    return {
        "members": [m.name for m in members],
        "dtypes": [str(getattr(m, "dtype", "")) for m in members],
        "cpu": cpu_model(),
        "batch": batch,
        "max_tokens": config.max_new_tokens,
        "solo_s": solo_s,
        "batched_s": batched_s,
        "rows": rows,
        "equal": sum(r["equal"] for r in rows),
    }


def format_report(report: dict[str, Any]) -> str:
    rows = report["rows"]
    lines = [
        f"batched (lockstep, {report['batch']} at a time) against solo: {', '.join(report['members'])} "
        f"({', '.join(dict.fromkeys(report['dtypes']))}) on {report['cpu']}, {report['max_tokens']} tokens",
        f"answers equal: {report['equal']}/{len(rows)}; solo {report['solo_s']:.1f} s, batched "
        f"{report['batched_s']:.1f} s",
        "",
        f"{'equal':<6} {'parts at':>8} {'how':<8} {'detail':<28} {'drift':>6}  prompt",
    ]
    for r in rows:
        d = r["first_difference"] or {}
        detail = ", ".join(d.get("members", [])) or (f"margin {d['margin']:.3f}" if "margin" in d else "")
        where = f"{d['round']}/{r['rounds']}" if d else ""
        lines.append(
            f"{'yes' if r['equal'] else 'no':<6} {where:>8} {d.get('where', ''):<8} {detail:<28} "
            f"{r['score_drift']:6.3f}  {r['prompt']!r}"
        )
    hows: dict[str, int] = {}
    for r in rows:
        if r["first_difference"]:
            hows[r["first_difference"]["where"]] = hows.get(r["first_difference"]["where"], 0) + 1
    if hows:
        lines += ["", "runs that part, by how: " + ", ".join(f"{k} {v}" for k, v in sorted(hows.items()))]
    lines.append(
        f"largest score drift over shared rounds: {max((r['score_drift'] for r in rows), default=0):.4f}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "equality",
        "Each prompt answered alone and in batches (greedy): how often and where they differ.",
        loading=("models", "quantize", "dtype"),
        quantize="gguf",
        settings=(),
    )
    parser.add_argument(
        "--data", default=None, help="GSM8K JSONL: its first --limit questions after the open prompts"
    )
    parser.add_argument("--limit", type=int, default=10, help="GSM8K questions from --data (default 10)")
    parser.add_argument(
        "--batch", type=int, default=8, help="runs in lockstep (default 8, the server's batch)"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="answer budget (default 64)")
    args = parser.parse_args(argv)
    prompts = list(OPEN_PROMPTS)
    try:  # before minutes of loading
        if args.data is not None:
            prompts += [build_prompt(p.question) for p in load_problems(args.data, limit=args.limit)]
    except SpecfuseError as e:
        parser.error(str(e))
    config = EnsembleConfig(max_new_tokens=args.max_tokens)
    return bench_main(
        parser, args, argv, lambda members: run(members, prompts, config, max(1, args.batch)), format_report
    )


if __name__ == "__main__":
    sys.exit(main())
