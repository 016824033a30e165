"""Can agreement between the members pick the IFEval answer that keeps its instructions?

A judge that needs no likelihood at all: of the three members' whole answers to a prompt (each
member alone, bf16, `git show 7407b66:results/RESULTS-ifeval-dev.json`), take the one most like
the other two (minimum Bayes risk with a text similarity, as in consensus decoding and
LLM-Blender's pairwise ranking). If
consensus picks the answers that follow every instruction no more often than Qwen alone gets them, a
segment-level choice by agreement has nothing to gain either. Ties go to the first member in
MEMBERS (Qwen), as the engine's go to the first candidate.

Reads only the report (no model, a second): prompt-level strict accuracy over the rows, beside Qwen
alone with the exact McNemar test.

    git show 7407b66:results/RESULTS-ifeval-dev.json > ifeval-dev.json   # in git history, not the tree
    python tools/consensus_judge.py --report ifeval-dev.json --json results/eval/ifeval-consensus-judge.json
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Callable, Sequence
from typing import Any

from specfuse.eval.stats import mcnemar_exact, wilson

MEMBERS = ("single-qwen2.5-coder-0.5b", "single-smollm2-135m", "single-gemma3-270m")


def _words(text: str) -> list[str]:
    return text.lower().split()


def word_sequence(a: str, b: str) -> float:
    """difflib's ratio over the two answers' words (order counts)."""
    return difflib.SequenceMatcher(None, _words(a), _words(b), autojunk=False).ratio()


def word_set(a: str, b: str) -> float:
    """Jaccard overlap of the two answers' sets of words."""
    x, y = set(_words(a)), set(_words(b))
    return len(x & y) / max(1, len(x | y))


def word_trigrams(a: str, b: str) -> float:
    """Jaccard overlap of the two answers' word trigrams."""

    def grams(t: str) -> set[tuple[str, ...]]:
        w = _words(t)
        return {tuple(w[i : i + 3]) for i in range(len(w) - 2)}

    x, y = grams(a), grams(b)
    return len(x & y) / max(1, len(x | y))


SIMILARITIES: dict[str, Callable[[str, str], float]] = {
    "word sequence (difflib)": word_sequence,
    "word set (Jaccard)": word_set,
    "word trigrams (Jaccard)": word_trigrams,
}


def consensus_pick(answers: Sequence[str], similarity: Callable[[str, str], float]) -> int:
    """The index of the answer with the highest total similarity to the others (the first on a tie)."""
    totals = [sum(similarity(a, b) for j, b in enumerate(answers) if j != i) for i, a in enumerate(answers)]
    return max(range(len(answers)), key=lambda i: (totals[i], -i))


def judge(outcomes: Sequence[dict[str, Any]], members: Sequence[str] = MEMBERS) -> dict[str, Any]:
    """Each similarity's consensus picks over the rows every member answered, tallied against the
    first member alone (prompt-level strict: `correct`)."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for o in outcomes:
        if o["system"] in members:
            rows.setdefault(o["problem"], {})[o["system"]] = o
    rows = {p: r for p, r in sorted(rows.items()) if len(r) == len(members)}
    first = members[0]
    out: dict[str, Any] = {
        "rows": len(rows),
        "alone": {m: sum(bool(r[m]["correct"]) for r in rows.values()) for m in members},
        "any_right": sum(any(r[m]["correct"] for m in members) for r in rows.values()),
        "judges": {},
    }
    alone = [bool(r[first]["correct"]) for r in rows.values()]
    for label, similarity in SIMILARITIES.items():
        picks = [consensus_pick([r[m]["answer"] or "" for m in members], similarity) for r in rows.values()]
        right = [bool(r[members[i]]["correct"]) for r, i in zip(rows.values(), picks)]
        gained = sum(x and not y for x, y in zip(right, alone))
        lost = sum(y and not x for x, y in zip(right, alone))
        out["judges"][label] = {
            "correct": sum(right),
            "ci": list(wilson(sum(right), len(rows))),
            "picks": {m: picks.count(i) for i, m in enumerate(members)},
            "vs_first": {"gained": gained, "lost": lost, "p": mcnemar_exact(gained, lost)},
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
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    with open(args.report) as f:
        out = judge(json.load(f)["outcomes"])
    alone = ", ".join(f"{m.removeprefix('single-')} {n}" for m, n in out["alone"].items())
    print(f"{out['rows']} rows; alone: {alone}; any of the three right: {out['any_right']}")
    for label, j in out["judges"].items():
        picks = " / ".join(str(n) for n in j["picks"].values())
        print(
            f"consensus by {label:26s} {j['correct']:3d}/{out['rows']}  picks {picks}  "
            f"vs Qwen {j['vs_first']['gained']}:{j['vs_first']['lost']}, p = {j['vs_first']['p']:.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
