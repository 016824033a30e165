"""How often a round calls a member's tokenizer, and what a verification's tokenization costs, one
call a candidate against one call for all (issue 52; members/hf/verifying.py).

A verification tokenizes each candidate after its run's answer (the answer is tokenized again each
time: a token may merge across the seam), and accept() tokenized the answer with the winner again.
Here one member (the real layer counts of Qwen2.5-7B at tiny widths, the GPU check's byte tokenizer,
on the KV slots the GPU's way) plays --rounds rounds of --runs runs (a draft of L = 10 tokens each,
three candidates verified, one accepted); then the tokenizer's calls in one more round are counted
by phase, and the verification's texts as they now stand (each run's answer and its three candidates)
are tokenized both ways, alternated, the median of 9 of each: counts are exact, the timing a ratio
from one run.

    .venv/bin/python tools/tokenizer_calls.py [--runs 32] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slot_launches import SEGMENT, host_members, one_round, started  # noqa: E402

from specfuse.members import templates  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=32, help="runs played at once (default 32)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds played first: the answers' length")
    args = parser.parse_args(argv)
    name = "qwen2.5-7b"
    (member,) = host_members([name])
    states = started(member, args.runs)
    for _ in range(args.rounds):
        one_round(member, states, lambda phase: None)
    tokenizer, calls, phase = member.tokenizer, Counter[str](), [""]
    call = type(tokenizer).__call__

    def counted(self: object, *a: object, **k: object) -> object:
        calls[phase[0]] += 1
        return call(self, *a, **k)

    type(tokenizer).__call__ = counted  # type: ignore[method-assign]
    try:
        one_round(member, states, lambda p: phase.__setitem__(0, p))
    finally:
        type(tokenizer).__call__ = call  # type: ignore[method-assign]
    answer = statistics.median(len(s.answer) for s in states)
    print(
        f"{name}, {args.runs} runs after {args.rounds} rounds (answers of {answer:.0f} characters, median), "
        f"L = {SEGMENT}, torch {torch.__version__}"
    )
    counted_calls = ", ".join(f"{p} {n}" for p, n in sorted(calls.items()))
    print(f"tokenizer calls in one round, by phase: {counted_calls}")
    if not hasattr(templates, "texts_ids"):  # a tree from before it (an A/B): the counts only
        return 0
    texts = [s.answer + t for s in states for t in (" The sky is blue", " The sky is red", " Because")]
    each, once = [], []
    for _ in range(9):
        began = time.perf_counter()
        alone = [templates.text_ids(tokenizer, t) for t in texts]
        each.append(time.perf_counter() - began)
        began = time.perf_counter()
        together = templates.texts_ids(tokenizer, texts)
        once.append(time.perf_counter() - began)
        assert alone == together
    ms_each, ms_once = statistics.median(each) * 1e3, statistics.median(once) * 1e3
    print(
        f"a verification's {len(texts)} texts: one call each {ms_each:.2f} ms, one call for all "
        f"{ms_once:.2f} ms (x {ms_each / ms_once:.2f}), the same ids"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
