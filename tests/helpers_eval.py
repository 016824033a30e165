"""The evaluation tests' pieces (eval/test_eval, eval/test_paired_runs, the failure browser's): a
GSM8K-style data file, a scripted member that answers a number, the small config the scripted runs
use, a small evaluation run folder, and a study whose ceiling is known by hand (eval/test_ceiling,
studio/test_i18n)."""

from __future__ import annotations

import json
from pathlib import Path

from specfuse.config import EnsembleConfig
from specfuse.eval.problems import Outcome

from .scripted import ScriptedMember, scripted_trace


def write_data(path, n=2):
    rows = [
        {"question": f"Tom has {i} apples and buys 2 more. How many?", "answer": f"{i}+2\n#### {i + 2}"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def scripted(name, answer, score=1.0):
    """A member that answers "The answer is <answer>." in two rounds and scores by text length."""
    return ScriptedMember(name, ["The answer", (f" is {answer}.", True)], lambda text: score + len(text) / 10)


CONFIG = EnsembleConfig(max_new_tokens=12, segment_len=4)


def eval_folder(root: Path) -> Path:
    """A small evaluation run: two problems, the ensemble and one single member, traces and report."""
    runs = root / "runs"
    outcomes = []
    answers = {  # (system, problem) → (answer text, predicted, correct)
        ("ensemble", "p1"): ("The answer is 5.", "5", False),
        ("single-a", "p1"): ("So the answer is 7.", "7", True),
        ("ensemble", "p2"): ("The answer is 9.", "9", True),
        ("single-a", "p2"): ("The answer is 8.", "8", False),
    }
    for (system, problem), (text, predicted, correct) in answers.items():
        (runs / system).mkdir(parents=True, exist_ok=True)
        path = runs / system / f"{problem}.json"
        drafts = {"a": [text], "b": ["other "]} if system == "ensemble" else {"a": [text]}
        if system != "ensemble":
            drafts["b"] = [text]
        scripted_trace(path, drafts, rounds=1)
        gold = "7" if problem == "p1" else "9"
        outcomes.append(
            dict(
                system=system,
                problem=problem,
                predicted=predicted,
                correct=correct,
                gold=gold,
                traces=[str(path)],
            )
        )
    report = {"mix": "test", "failure_cases": {"best_member": "a"}, "outcomes": outcomes}
    (root / "eval-test.json").write_text(json.dumps(report))
    return root


# Ten problems. a is right on 0-5, b on 3-7, c on 8 only: at least one member is right on 0-8
# (oracle 9/10) and all are wrong together on 9 (β 1/10). The best member is a (6/10). The
# ensemble is right on 1-7 and 9: it gains 6, 7 and 9 over a (9 is beyond every member: a
# segment-level ensemble can pass the oracle) and loses 0.
RIGHT = {
    "single-a": {0, 1, 2, 3, 4, 5},
    "single-b": {3, 4, 5, 6, 7},
    "single-c": {8},
    "ensemble": {1, 2, 3, 4, 5, 6, 7, 9},
}


def outcomes() -> list[Outcome]:
    return [
        Outcome(system, f"p{i}", "1" if i in right else "0", i in right, 1.0, 3, 3, (), gold="1")
        for system, right in RIGHT.items()
        for i in range(10)
    ]
