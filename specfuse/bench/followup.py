"""A follow-up turn's first segment against the first turn's: `python -m specfuse.bench followup`.

Through the engine (Ensemble), on the same members, a few conversations played as a chat client
plays them: turn 1 a new question (each conversation its own, from the evaluation's open prompts, so
that no member has it cached), each later turn the conversation so far with the ensemble's whole
answer as the assistant's turn and a follow-up as the user's (--turns, default 2). Each turn is
timed by a run that stops after round 1, right after the turn before ended: its first-segment
latency is every member's prefill of its context (the chat template over every message), then round
1 (drafts, verification, the chosen segment appended); then the whole run gives the answer. A member
that keeps recent contexts (llama.cpp's slots) finds the turn before in them, as it would in a live
chat; transformers members read every turn whole, after the template's head. Per turn: the medians,
the median of each conversation's ratio to its turn 1, and where the time goes: the first segment
less round 1's own time (the members' prefill), and the context's tokens. The issue's target: turn 2
within 1.5× of turn 1 (docs/serve.md, "Follow-up turns"). The load average is printed beside them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import EnsembleConfig
from ..engine import Ensemble
from ..errors import SpecfuseError
from ..eval.problems import OPEN_PROMPTS
from ..prompts import Prompt, as_prompt, prompt_chars
from .measure import bench_main, bench_parser, cpu_model, footer

log = logging.getLogger(__name__)

# The user's later turns, in order (then again from the first): a rephrasing, a check, one more.
FOLLOW_UPS = (
    "Now say that again in one short sentence, for a ten-year-old.",
    "Are you sure? Check your answer step by step.",
    "Give one more example.",
)
TARGET = 1.5  # the issue's: a follow-up's first segment within 1.5× of the first turn's


def tokens(member: Any, prompt: Prompt) -> int | None:
    ids = getattr(member, "prompt_ids", None)
    return len(ids(prompt)) if ids is not None else None


@dataclass(frozen=True)
class Turn:
    prompt: Prompt
    first_segment_s: float  # from the run's start to the end of round 1
    round1_s: float  # round 1's own wall time: the rest is the members' prefill (and the setup)


def play(ensemble: Ensemble, question: str, turns: int) -> list[Turn]:
    """One conversation as a chat client plays it. Each turn: a run that stops after round 1
    (timed, right after the turn before ended, as a follow-up comes), then the whole run, whose
    answer becomes the assistant's turn before the next follow-up (a member that keeps recent
    contexts holds that whole turn, as in a live chat)."""
    out: list[Turn] = []
    messages = [{"role": "user", "content": question}]
    prompt: Prompt = question
    first_only = dataclasses.replace(ensemble.config, max_rounds=1)
    for t in range(turns):
        (first, *_) = ensemble.stream(prompt, first_only)
        out.append(Turn(prompt, first.elapsed, first.seconds))
        if t == turns - 1:
            break
        answer = ensemble.run(prompt).answer
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": FOLLOW_UPS[t % len(FOLLOW_UPS)]},
        ]
        prompt = as_prompt(messages)
    return out


def run_followup(
    members: Sequence[Any],
    *,
    questions: Sequence[str] = OPEN_PROMPTS,
    turns: int = 2,
    answer_tokens: int = 128,
    segment_len: int = 10,
    repeats: int = 6,
) -> dict[str, Any]:
    """`repeats` conversations of `turns` turns, each on the next of `questions` (a new question is
    never in a member's cache; a repeated one would be, where a member keeps recent contexts)."""
    if turns < 2:
        raise SpecfuseError("a follow-up needs at least two turns")
    config = EnsembleConfig(segment_len=segment_len, max_new_tokens=answer_tokens, temperature=0.0)
    ensemble = Ensemble(members, config)
    load_before = os.getloadavg()
    ensemble.run("Say hello.", dataclasses.replace(config, max_new_tokens=segment_len))  # warm-up
    played = [play(ensemble, questions[r % len(questions)], turns) for r in range(repeats)]
    rows: list[dict[str, Any]] = []
    for t in range(turns):
        here = [conversation[t] for conversation in played]
        rows.append(
            {
                "turn": t + 1,
                "first_segment_s": statistics.median(x.first_segment_s for x in here),
                "first_segment_runs_s": [x.first_segment_s for x in here],
                "ratio_to_turn_1": statistics.median(
                    c[t].first_segment_s / c[0].first_segment_s for c in played
                ),
                "prefill_s": statistics.median(x.first_segment_s - x.round1_s for x in here),
                "round1_s": statistics.median(x.round1_s for x in here),
                "prompt_tokens": {
                    m.name: statistics.median(tokens(m, x.prompt) or 0 for x in here) for m in members
                },
                "prompt_chars": statistics.median(prompt_chars(x.prompt) for x in here),
            }
        )
    return {
        "members": [m.name for m in members],
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "niceness": os.nice(0),
        "parallel": ensemble.parallel,
        "segment_len": segment_len,
        "answer_tokens": answer_tokens,
        "repeats": repeats,
        "questions": [questions[r % len(questions)] for r in range(repeats)],
        "follow_ups": list(FOLLOW_UPS[: turns - 1]),
        "turns": rows,
        "ratio": rows[1]["ratio_to_turn_1"],  # the figure: turn 2 against turn 1
        "target": TARGET,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def format_table(report: dict[str, Any]) -> str:
    names = report["members"]
    lines = [
        f"a follow-up turn's first segment: {', '.join(names)} on {report['cpu']} ({report['cores']} cores, "
        f"nice {report['niceness']}, parallel {report['parallel']}), L = {report['segment_len']}, each "
        f"answer {report['answer_tokens']} tokens at most, "
        + (f"medians of {report['repeats']} conversations" if report["repeats"] > 1 else "one conversation"),
        f"{'turn':>4} {'chars':>6} {'prompt tokens':>17} {'first segment s':>15} {'× turn 1':>8} "
        f"{'prefill s':>9} {'round 1 s':>9}",
    ]
    for r in report["turns"]:
        toks = "/".join(f"{r['prompt_tokens'][n]:g}" for n in names)
        lines.append(
            f"{r['turn']:>4} {r['prompt_chars']:>6g} {toks:>17} {r['first_segment_s']:15.3f} "
            f"{r['ratio_to_turn_1']:8.2f} {r['prefill_s']:9.3f} {r['round1_s']:9.3f}"
        )
    lines += [
        "",
        f"turn 2 / turn 1: {report['ratio']:.2f}× (target ≤ {report['target']:g}×)",
        "medians over the conversations; × turn 1: the median of each conversation's own ratio; prefill: "
        "the first segment less round 1 (the members reading their contexts, and the run's setup)",
    ]
    lines += footer(report)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "followup", "A follow-up turn's first segment against the first turn's, through the engine."
    )
    parser.add_argument("--answer-tokens", type=int, default=128, help="each answer's budget (default 128)")
    parser.add_argument("--turns", type=int, default=2, help="turns of the conversation (default 2)")
    parser.add_argument(
        "--questions",
        nargs="+",
        default=list(OPEN_PROMPTS),
        help="each conversation's first turn, in turn (default: the evaluation's open prompts)",
    )
    parser.add_argument("--repeats", type=int, default=6, help="conversations played (default 6)")
    parser.add_argument("--quick", action="store_true", help="one conversation, 32-token answers")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.answer_tokens = 1, 32
    if args.repeats < 1 or args.answer_tokens < 1 or args.turns < 2:
        parser.error("--repeats and --answer-tokens must be at least 1, --turns at least 2")
    kwargs = {"questions": args.questions, "turns": args.turns, "answer_tokens": args.answer_tokens}
    return bench_main(
        parser,
        args,
        argv,
        lambda members: run_followup(members, segment_len=args.segment_len, repeats=args.repeats, **kwargs),
        format_table,
    )


if __name__ == "__main__":
    sys.exit(main())
