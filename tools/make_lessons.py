"""Make the lessons' traces (specfuse/lessons/traces/<slug>.json), or check the shipped ones.

Each lesson is a real run of the embedded default models with the lesson's prompt and settings
(specfuse/lessons/catalogue.py). A run does not always show what a lesson is about, so for each
lesson this script has a short list of attempts: the lesson's own prompt and settings first, then
the alternatives below. It plays them in order until one shows the phenomenon (the lesson's check,
specfuse.lessons.checks), writes that trace and prints which attempt it kept. When it keeps an
alternative, copy that attempt's prompt, settings and branch into the lesson: `--check` refuses a
trace whose run is not the lesson's.

    python tools/make_lessons.py                 # every lesson (loads the members once)
    python tools/make_lessons.py --only weights-move
    python tools/make_lessons.py --check         # the shipped traces: each opens, shows its lesson,
                                                 # matches its lesson's run; how long each takes to open

Members load as the CLI loads them (specfuse.models.placement.load_members), on the CPU, by default
in transformers (--quantize none: bf16 where the CPU has it), so that a trace does not depend on
whether llama-cpp-python happens to be installed; `--quantize auto` is the CLI's own default.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse.config import EnsembleConfig  # noqa: E402
from specfuse.flags import Parser, add_loading_flags  # noqa: E402
from specfuse.lessons import LESSONS, Lesson, key_round, load_lesson, shows, trace_path  # noqa: E402
from specfuse.models.catalogue import DEFAULT_MEMBERS  # noqa: E402  (the members of every shipped trace)
from specfuse.records import Branch, Round  # noqa: E402
from specfuse.trace import Trace, new_trace_id, save_trace  # noqa: E402

OPEN_TARGET_S = 2.0  # a lesson opens in the app from its trace alone: no model, on a 2-core CPU


@dataclass(frozen=True)
class Attempt:
    prompt: str
    settings: dict[str, Any] = field(default_factory=dict)
    members: tuple[str, ...] = DEFAULT_MEMBERS
    branch: tuple[int, str] | None = None


def own(lesson: Lesson) -> Attempt:
    return Attempt(lesson.prompt, dict(lesson.settings), lesson.members, lesson.branch)


# The alternatives tried after each lesson's own run, in order: prompts and settings likely to show
# the same phenomenon with these small members.
ALTERNATIVES: dict[str, tuple[Attempt, ...]] = {
    "weak-member-exits": (
        Attempt("Give three tips for staying healthy.", {"max_new_tokens": 80}),
        Attempt("Write a short poem about the sea.", {"max_new_tokens": 96}),
    ),
    "weights-move": (
        Attempt("Name three fruits that are red.", {"max_new_tokens": 48, "prior": "uniform", "exit": False}),
        Attempt(
            "Explain why the sky is blue in two sentences.",
            {"max_new_tokens": 64, "prior": "uniform", "exit": False},
        ),
    ),
    "numbers-differ": (
        Attempt(
            "Sara has 4 boxes with 6 pencils in each box. She gives away 5 pencils. How many pencils "
            "are left? Show the calculation in one line.",
            {"max_new_tokens": 64},
        ),
        Attempt("What is 12 times 7?", {"max_new_tokens": 48}),
    ),
    "repeat-penalized": (
        Attempt("Write a short poem about the moon.", {"max_new_tokens": 96}),
        Attempt("Write a short song about rain.", {"max_new_tokens": 96}),
    ),
    "loop-guard-returns": (
        Attempt("Write a short poem about the moon.", {"max_new_tokens": 96, "loop_guard": True}),
        Attempt("Write a short song about rain.", {"max_new_tokens": 96, "loop_guard": True}),
    ),
    "chinese-prompt": (
        Attempt("请用三句话介绍熊猫。", {"max_new_tokens": 64}),
        Attempt("用一句话解释什么是太阳。", {"max_new_tokens": 48}),
    ),
    "typed-wrong-number": (
        Attempt(
            "A train travels 60 km per hour for 3 hours. How far does it travel? "
            "Show the calculation in one line.",
            {"max_new_tokens": 64},
            branch=(2, "200 km"),
        ),
        Attempt(
            "Tom has 5 apples. He buys 3 bags with 4 apples in each bag. How many apples does he "
            "have now? Show the calculation in one line.",
            {"max_new_tokens": 64},
            branch=(2, " 5 + 15 ="),
        ),
    ),
    "paper-vs-ours": (
        Attempt("What is the capital of Canada? Answer in one sentence.", {"max_new_tokens": 48}),
        Attempt("Write a short poem about the sea.", {"max_new_tokens": 96}),
    ),
    "best-member-dominates": (
        Attempt(
            "Tom has 5 apples. He buys 3 bags with 4 apples in each bag. How many apples does he have now?",
            {"max_new_tokens": 96},
        ),
    ),
}


def attempts(lesson: Lesson) -> list[Attempt]:
    return [own(lesson), *ALTERNATIVES.get(lesson.slug, ())]


def play(attempt: Attempt, members: dict[str, Any]) -> Trace:
    """One real run; for a branch, the parent's first k - 1 rounds, then round k forced to the typed
    segment and the rest played on (as the app's branch does)."""
    from specfuse.engine import TYPED, Ensemble

    config = EnsembleConfig(**attempt.settings)
    ensemble = Ensemble([members[name] for name in attempt.members], config)
    if attempt.branch is None:
        rounds = tuple(ensemble.stream(attempt.prompt))
        return Trace(attempt.prompt, ensemble.names, config, rounds)
    k, typed = attempt.branch
    parent = ensemble.stream(attempt.prompt)
    start: list[Round] = list(islice(parent, k - 1))
    parent.close()
    if len(start) < k - 1 or (start and start[-1].stop_reason is not None):
        raise SystemExit(f"the parent run ended before round {k}: no round to branch at")
    rest = ensemble.stream(attempt.prompt, start=start, forced=typed, origin=TYPED)
    rounds = (*start, *rest)
    branch = Branch(new_trace_id(), k, typed, TYPED)
    return Trace(attempt.prompt, ensemble.names, config, rounds, branch=branch)


def make(lesson: Lesson, members: dict[str, Any]) -> bool:
    for i, attempt in enumerate(attempts(lesson)):
        began = time.perf_counter()
        trace = play(attempt, members)
        seconds = time.perf_counter() - began
        missing = shows(lesson.slug, trace)
        which = "the lesson's own run" if i == 0 else f"alternative {i}"
        if missing is not None:
            print(f"{lesson.slug}: {which} ({seconds:.0f} s) does not show it: {missing}", flush=True)
            continue
        save_trace(trace, trace_path(lesson.slug))
        print(
            f"{lesson.slug}: kept {which} ({seconds:.0f} s, {len(trace.rounds)} rounds, key round "
            f"{key_round(lesson.slug, trace)}): {attempt.prompt!r} {attempt.settings} "
            f"branch={attempt.branch}",
            flush=True,
        )
        if i:
            print(f"  copy this prompt, settings and branch into lesson {lesson.slug!r} (catalogue.py)")
        return True
    print(f"{lesson.slug}: no attempt showed it; the shipped trace is unchanged", flush=True)
    return False


def mismatch(lesson: Lesson, trace: Trace) -> str | None:
    """How the trace's run differs from the lesson's (prompt, members, settings, branch), or None."""
    if trace.prompt != lesson.prompt:
        return "its prompt is not the lesson's"
    if trace.members != lesson.members:
        return f"its members {trace.members} are not the lesson's {lesson.members}"
    if trace.config != EnsembleConfig(**lesson.settings):
        return "its settings are not the lesson's"
    branch = (trace.branch.k, trace.branch.text) if trace.branch is not None else None
    if branch != lesson.branch:
        return f"its branch {branch} is not the lesson's {lesson.branch}"
    return None


def check(lessons: Sequence[Lesson]) -> bool:
    ok = True
    for lesson in lessons:
        began = time.perf_counter()
        trace = load_lesson(lesson.slug)
        missing = shows(lesson.slug, trace)
        seconds = time.perf_counter() - began
        problem = missing or mismatch(lesson, trace)
        slow = seconds > OPEN_TARGET_S
        ok = ok and problem is None and not slow
        state = f"FAILS: {problem}" if problem else f"shows it in round {key_round(lesson.slug, trace)}"
        target = f" (over the {OPEN_TARGET_S:.0f} s target)" if slow else ""
        print(f"{lesson.slug:<24} opens in {seconds:.3f} s{target}; {state}")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", metavar="SLUG", help="this lesson only (repeatable)")
    parser.add_argument("--check", action="store_true", help="check the shipped traces; load no model")
    add_loading_flags(parser, only=("device", "dtype", "quantize"), defaults={"quantize": "none"})
    args = parser.parse_args(argv)
    slugs = {lesson.slug for lesson in LESSONS}
    unknown = sorted(set(args.only or ()) - slugs)
    if unknown:
        parser.error(f"unknown lesson {', '.join(unknown)}; known: {', '.join(sorted(slugs))}")
    chosen = [lesson for lesson in LESSONS if not args.only or lesson.slug in args.only]
    if args.check:
        return 0 if check(chosen) else 1
    from specfuse.models.placement import load_members  # brings torch: only when making traces

    names = sorted({name for lesson in chosen for a in attempts(lesson) for name in a.members})
    began = time.perf_counter()
    loaded = load_members(names, device=args.device, dtype=args.dtype, quantize=args.quantize)
    print(f"loaded {', '.join(names)} in {time.perf_counter() - began:.0f} s", flush=True)
    members = {m.name: m for m in loaded}
    made = [make(lesson, members) for lesson in chosen]
    return 0 if all(made) else 1


if __name__ == "__main__":
    raise SystemExit(main())
