"""Can the members' likelihood tell which of two whole answers keeps IFEval's instructions?

A ceiling for every likelihood-based choice the ensemble makes. On the IFEval development rows (or
those `--rows` names) where exactly one of Qwen alone and SmolLM2 alone (bf16, `--report`) followed every
instruction, each judge below picks one of the two complete answers. On the other rows any judge's
pick is right or wrong alike, so a judge's accuracy is (rows both got right) + (discordant rows where
it picked the right answer), set beside Qwen alone with the exact McNemar test. If no judge picks the
right one of two whole answers clearly more often than a coin, a segment-level choice by the same
scores, which sees less, has little to gain over Qwen alone.

Judges (members in llama.cpp, mean log-probability of the answer's tokens after the prompt):
- each member alone;
- each member with prompt contrast (z − λ·z°, z° the score with the prompt left out), λ = 0.3 and 1;
- the default's rule at the answer level: each judge's row normalized (zsoftmax), the weighted median
  with the catalogue's trust (specfuse.feedback, as the engine does);
- the uniform mean of the three normalized rows.

The singles' reports are in git history, not in the tree (results/README.md):

    git show 7407b66:results/RESULTS-ifeval-dev.json > ifeval-dev.json
    git show 7407b66:results/RESULTS-ifeval-confirm-bf16-singles.json > confirm-bf16-singles.json
    python tools/answer_judges.py --report ifeval-dev.json --json results/eval/ifeval-answer-judges.json
    python tools/answer_judges.py --rows 300:541 --report confirm-bf16-singles.json \
        --json results/eval/ifeval-answer-judges-confirm.json   (the one test on the held-out rows)
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from specfuse import feedback
from specfuse.config import MemberSettings
from specfuse.engine.calls import PROMPT_LEFT_OUT
from specfuse.eval import ifeval
from specfuse.eval.problems import DataError, parse_rows
from specfuse.eval.stats import mcnemar_exact, wilson
from specfuse.models.catalogue import DEFAULT_MEMBERS
from specfuse.models.loading import load_member
from specfuse.records import Candidate

QWEN, SMOL = "single-qwen2.5-coder-0.5b", "single-smollm2-135m"
SETTINGS = MemberSettings(score="logprob", max_new_tokens=16)  # scoring only: no answer budget needed
CONTRASTS = (0.3, 1.0)


def discordant_rows(report: str) -> tuple[int, int, list[dict[str, Any]]]:
    """(both right, rows, the rows where exactly one of the two was right, with both answers)."""
    by: dict[str, dict[str, Any]] = {}
    with open(report) as f:
        outcomes = json.load(f)["outcomes"]
    for o in outcomes:
        if o["system"] in (QWEN, SMOL):
            by.setdefault(o["problem"], {})[o["system"]] = o
    both = sum(1 for p in by.values() if p[QWEN]["correct"] and p[SMOL]["correct"])
    rows = [
        {
            "problem": k,
            "answers": (p[QWEN]["answer"], p[SMOL]["answer"]),
            "right": 0 if p[QWEN]["correct"] else 1,
        }
        for k, p in sorted(by.items())
        if p[QWEN]["correct"] != p[SMOL]["correct"]
    ]
    return both, len(by), rows


def scores(member: Any, prompts: Sequence[str], answers: Sequence[tuple[str, str]]) -> list[list[float]]:
    """Each row's two answers scored by `member` after its prompt (one verify call for all rows)."""
    states = [member.start(p, SETTINGS) for p in prompts]
    cands = [[Candidate(member.name, a, 0, False, 0.0) for a in pair] for pair in answers]
    return [z for z, _ in member.score_many(states, cands)]


def judge_picks(
    z: dict[str, list[list[float]]],
    z_left_out: dict[str, list[list[float]]],
    names: Sequence[str],
    trust: Sequence[float],
) -> dict[str, list[int]]:
    """Each judge's pick per row (0: Qwen's answer, 1: SmolLM2's) from the members' scores of the two
    answers with the prompt (z) and with it left out; ties go to Qwen's, as the engine's go to the
    first candidate."""
    judges: dict[str, list[int]] = {}
    for name in names:
        judges[f"{name} alone"] = [int(b > a) for a, b in z[name]]
        for lam in CONTRASTS:
            contrasted = (feedback.prompt_contrast(s, s0, lam) for s, s0 in zip(z[name], z_left_out[name]))
            judges[f"{name}, prompt contrast {lam}"] = [int(b > a) for a, b in contrasted]
    drafters = ["qwen2.5-coder-0.5b", "smollm2-135m"]
    rules = (("the default's rule (trust, median)", trust, "median"), ("uniform mean", None, "mean"))
    for label, weights, method in rules:
        picks = []
        for r in range(len(z[names[0]])):
            s = feedback.normalize([z[n][r] for n in names], "zsoftmax")
            y = feedback.aggregate(s, weights or feedback.uniform(len(names)), names, drafters, True, method)
            picks.append(int(y[1] > y[0]))
        judges[label] = picks
    return judges


def tally(judges: dict[str, list[int]], right: Sequence[int], both: int, total: int) -> dict[str, Any]:
    """Each judge's accuracy over all `total` rows: the `both` rows both answers got right, plus the
    discordant rows where its pick is the right answer (`right`: 0 Qwen's, 1 SmolLM2's), and its
    McNemar test against always taking Qwen's answer (Qwen alone)."""
    out: dict[str, Any] = {
        "rows": total,
        "both_right": both,
        "discordant": len(right),
        "qwen_alone": both + right.count(0),
        "smollm2_alone": both + right.count(1),
        "judges": {},
    }
    for label, picks in judges.items():
        gained = sum(p == 1 == r for p, r in zip(picks, right))  # SmolLM2's answer, the right one
        lost = sum(p == 1 != r for p, r in zip(picks, right))  # SmolLM2's answer, Qwen's was right
        correct = both + sum(p == r for p, r in zip(picks, right))
        out["judges"][label] = {
            "right_of_discordant": correct - both,
            "correct": correct,
            "ci": list(wilson(correct, total)),
            "picks_smollm2": sum(picks),
            "vs_qwen": {"gained": gained, "lost": lost, "p": mcnemar_exact(gained, lost)},
        }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--report",
        required=True,
        help="singles' answers (bf16); the shipped run is in git history: "
        "git show 7407b66:results/RESULTS-ifeval-dev.json > ifeval-dev.json",
    )
    dev = f"{ifeval.DEV_ROWS.start}:{ifeval.DEV_ROWS.stop}"
    parser.add_argument("--rows", default=dev, help=f"FIRST:END rows of the report (default {dev})")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    try:
        rows_of_report = parse_rows(args.rows)
    except DataError as e:
        parser.error(str(e))

    both, total, rows = discordant_rows(args.report)
    problems = {p.id: p for p in ifeval.load_ifeval(rows=rows_of_report)}
    prompts = [problems[r["problem"]].prompt for r in rows]
    answers = [r["answers"] for r in rows]
    began = time.perf_counter()
    z: dict[str, list[list[float]]] = {}
    z_left_out: dict[str, list[list[float]]] = {}
    members = [load_member(name, quantize="gguf") for name in DEFAULT_MEMBERS]
    for m in members:
        z[m.name] = scores(m, prompts, answers)
        z_left_out[m.name] = scores(m, [PROMPT_LEFT_OUT] * len(rows), answers)
        print(
            f"{m.name}: scored {2 * len(rows)} answers twice ({time.perf_counter() - began:.0f} s)",
            flush=True,
        )

    names = [m.name for m in members]
    trust = feedback.trust_weights([m.trust for m in members])
    out = tally(judge_picks(z, z_left_out, names, trust), [r["right"] for r in rows], both, total)
    out["trust"] = dict(zip(names, trust))
    out["seconds"] = round(time.perf_counter() - began, 1)
    print(f"{len(rows)} of {total} rows discordant; both right on {both}; Qwen alone {out['qwen_alone']}")
    for label, j in out["judges"].items():
        print(
            f"{label:45s} right on {j['right_of_discordant']:2d}/{len(rows)}  -> {j['correct']}/{total}  "
            f"vs Qwen {j['vs_qwen']['gained']}:{j['vs_qwen']['lost']}, p = {j['vs_qwen']['p']:.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
