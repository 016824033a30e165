"""Which parts of a run's rule decide its rounds at all? Replay every scored round of a folder of traces.

For each trace folder (an evaluation's `runs/<task>/<system>@<mix>/`), every round that was scored with
two or more candidates is judged again from its recorded scores and weights (specfuse.rules: no model
runs) by the run's own rule, rebuilt from the trace's config, and by that rule with one part changed.
A part that changes few rounds' choices cannot be what makes the run differ from another. The run's
own rule must reproduce the recorded choices, and the tool counts where it does not (a part of a
config the rules module does not replay, such as contrastive scores, would show there).

Each round is replayed alone: a changed choice would have changed the rounds after it, which a replay
cannot know, so this counts the points where a part decides, not what it would do to the answers.

    python tools/rule_flips.py runs/ifeval-gguf/loopguard@smollm2-135m+gemma3-270m+qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse import load_trace  # noqa: E402
from specfuse.config import EnsembleConfig  # noqa: E402
from specfuse.errors import SpecfuseError  # noqa: E402
from specfuse.rules import RECORDED, Rule, choose_by  # noqa: E402


def own_rule(config: EnsembleConfig) -> Rule:
    """The selection rule a run chose by, from its config."""
    return Rule(
        "the run's own rule",
        score=RECORDED,
        normalization=config.normalization,
        aggregation=config.aggregation,
        self_scores=config.self_scores,
        repeat_penalty=config.repeat_penalty,
    )


def variations(rule: Rule) -> list[Rule]:
    """The run's rule with one part changed at a time."""
    other = "mean" if rule.aggregation != "mean" else "median"
    changes = [
        ("without the repeat penalty", {"repeat_penalty": 0.0}),
        (f"{other} instead of {rule.aggregation}", {"aggregation": other}),
        (
            "without self-scores" if rule.self_scores else "with self-scores",
            {"self_scores": not rule.self_scores},
        ),
    ]
    return [
        dataclasses.replace(rule, name=name, **change)
        for name, change in changes
        if any(getattr(rule, k) != v for k, v in change.items())
    ]


def replay(folder: Path) -> dict[str, Any]:
    """Counts over the folder's traces: scored rounds with ≥ 2 candidates, and for each rule the rounds
    (and answers) where it picks another candidate than the run did, and whose candidate it picks."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise SystemExit(f"{folder}: no trace files (*.json)")
    out: dict[str, Any] = {
        "folder": str(folder),
        "answers": len(files),
        "rounds": 0,
        "scored": 0,
        "rules": {},
    }
    for path in files:
        try:
            trace = load_trace(path)
        except SpecfuseError as e:  # a malformed or foreign JSON file: name it, and stop
            raise SystemExit(f"{path}: {e}") from None
        base = own_rule(trace.config)
        rules = [base, *variations(base)]
        changed_answer: set[str] = set()
        for rnd in trace.rounds:
            out["rounds"] += 1
            if not rnd.verified or len(rnd.candidates) < 2:
                continue
            out["scored"] += 1
            for rule in rules:
                tally = out["rules"].setdefault(rule.name, {"differ": 0, "answers": 0, "picks": {}})
                chosen = choose_by(rnd, rule, recorded=trace.config.score)
                if chosen != rnd.chosen:
                    tally["differ"] += 1
                    member = rnd.candidates[chosen].member
                    tally["picks"][member] = tally["picks"].get(member, 0) + 1
                    if rule.name not in changed_answer:
                        changed_answer.add(rule.name)
                        tally["answers"] += 1
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", type=Path, help="trace folders, one system each")
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args(argv)
    results = [replay(folder) for folder in args.folders]
    for r in results:
        print(
            f"{r['folder']}: {r['answers']} answers, {r['rounds']} rounds, "
            f"{r['scored']} scored with ≥ 2 candidates"
        )
        for name, t in r["rules"].items():
            picks = ", ".join(f"{m} {n}" for m, n in sorted(t["picks"].items())) or "-"
            share = t["differ"] / r["scored"] if r["scored"] else 0.0
            print(
                f"  {name:40s} differs on {t['differ']:4d} ({share:6.1%}) "
                f"in {t['answers']:3d} answers; picks {picks}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
