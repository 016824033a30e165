"""The evaluation tests' pieces (test_eval, test_paired_runs): a GSM8K-style data file, a scripted
member that answers a number, and the small config the scripted runs use."""

from __future__ import annotations

import json

from specfuse.config import EnsembleConfig

from .scripted import ScriptedMember


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
