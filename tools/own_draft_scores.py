"""How far a llama.cpp member's own draft, scored with the values it drafted it with, lies from the
same text decoded again in a verify pass (the same text under another member's name): the mean
log-prob's difference per candidate (mean, standard deviation, largest) and per token, over a few
rounds of GSM8K prompts, each member's own draft accepted in turn.

Usage: python tools/own_draft_scores.py [--problems 12] [--rounds 4] [members…]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specfuse.config import MemberSettings
from specfuse.eval.problems import load_problems
from specfuse.models.catalogue import DEFAULT_MEMBERS
from specfuse.models.loading import load_member
from specfuse.records import Candidate

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "gsm8k" / "dev.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("members", nargs="*", default=list(DEFAULT_MEMBERS))
    parser.add_argument(
        "--data", default=str(DATA), help="GSM8K JSONL (default ../shared/data/gsm8k/dev.jsonl)"
    )
    parser.add_argument("--problems", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per problem (default 4)")
    args = parser.parse_args()
    questions = [problem.question for problem in load_problems(args.data, args.problems)]
    for name in args.members:
        member = load_member(name, quantize="gguf")
        per_candidate, per_token = [], []
        for question in questions:
            state = member.start(question, MemberSettings(score="logprob", own_draft_scores=True))
            for _ in range(args.rounds):
                own = member.draft(state, 10)
                again = Candidate("someone else", own.text, own.num_tokens, own.final, 0.0)
                ((z, evidence),) = member.score_many([state], [[own, again]])
                per_candidate.append(z[0] - z[1])
                per_token += [a - b for a, b in zip(evidence[0].logprobs, evidence[1].logprobs)]
                member.accept(state, own.text)
        changed = sum(d != 0 for d in per_token) / len(per_token)
        print(
            f"{name:20} {len(per_candidate)} candidates: as drafted − decoded again, mean log-prob "
            f"mean {statistics.mean(per_candidate):+.4f} sd {statistics.pstdev(per_candidate):.4f} "
            f"largest {max(map(abs, per_candidate)):.4f}; {len(per_token)} tokens, {changed:.0%} not equal",
            flush=True,
        )


if __name__ == "__main__":
    main()
