"""What a step-mode neighbour costs a running user: `python -m specfuse.bench paused`.

In one run, on one Scheduler: a running user's request (the same prompt and budget each time) alone;
beside a neighbour paused in step mode (it played round 1, then waits: out of the batch, no caches);
and beside a neighbour stepping every --step-every seconds (each step joins the batch as a newcomer:
its members read its prompt and answer so far again, then play one round with the others). The three
take turns --repeats times, so that drift in the machine's load falls on all three alike. Per case:
the running user's tokens/s and mean round time (medians over the repeats), its ratio to alone, the
neighbour's steps and their latency (next() to Paused), with the load average beside them.
Expected: paused ≈ alone (a paused run is in nobody's round); stepping somewhat below, by the share
of rounds that carry a neighbour's prefill and its round.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..config import EnsembleConfig
from ..engine import Scheduler, Ticket
from ..records import Finished, Paused, Round
from .measure import bench_main, bench_parser, cpu_model, footer
from .serve import PROMPTS

log = logging.getLogger(__name__)

CASES = ("alone", "beside a paused run", "beside a run stepping")
STEP_EVERY = 2.0  # seconds between a stepping neighbour's next() calls: a teacher talking through it


def running_user(scheduler: Scheduler, prompt: str, config: EnsembleConfig) -> dict[str, Any]:
    """One free-running request, from submit to its end: its tokens/s and round times."""
    began = time.perf_counter()
    ticket = scheduler.submit(prompt, config)
    rounds = [e for e in ticket.events(timeout=3600) if isinstance(e, Round)]
    wall = time.perf_counter() - began
    tokens = sum(r.winner.num_tokens for r in rounds)
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else math.nan,
        "round_s": statistics.mean(r.seconds for r in rounds) if rounds else math.nan,
        "rounds": len(rounds),
        "answer": rounds[-1].text if rounds else "",
    }


def one_step(ticket: Ticket) -> float:
    """next(), then its events to Paused (or the end): the seconds the step took."""
    began = time.perf_counter()
    ticket.next()
    for event in ticket.events(timeout=3600, until_pause=True):
        if isinstance(event, Paused | Finished):
            break
    return time.perf_counter() - began


class Stepper:
    """A neighbour in step mode that a thread steps every `every` seconds until stopped; a run that
    ends (its budget spent) is replaced by a new one, so that it steps for as long as it is asked."""

    def __init__(self, scheduler: Scheduler, prompt: str, config: EnsembleConfig, every: float) -> None:
        self.scheduler, self.prompt, self.config, self.every = scheduler, prompt, config, every
        self.latencies: list[float] = []
        self.errors: list[str] = []  # reported, never hidden
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._steps, name="bench-stepper", daemon=True)

    def __enter__(self) -> Stepper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(3600)

    def _steps(self) -> None:
        ticket = None
        try:
            while not self.stop.is_set():
                if ticket is None or ticket.ended:
                    ticket = self.scheduler.submit(self.prompt, self.config, step=True)
                self.latencies.append(one_step(ticket))
                self.stop.wait(self.every)
        except Exception as e:
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            if ticket is not None:
                ticket.cancel()


def run_paused(
    members: Sequence[Any],
    *,
    max_tokens: int = 128,
    segment_len: int = 10,
    step_every: float = STEP_EVERY,
    repeats: int = 3,
) -> dict[str, Any]:
    """The three cases on one scheduler, taking turns `repeats` times; the JSON-ready report."""
    config = EnsembleConfig(segment_len=segment_len, max_new_tokens=max_tokens)
    # The neighbour's budget outlasts most of a running user's request (one that ends is replaced).
    neighbour = EnsembleConfig(segment_len=segment_len, max_new_tokens=4 * max_tokens)
    runner_prompt, neighbour_prompt = PROMPTS[0], PROMPTS[1]
    scheduler = Scheduler(members, config, batch_size=4, max_paused=2)
    samples: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    latencies: list[float] = []
    errors: list[str] = []
    load_before = os.getloadavg()
    try:
        running_user(scheduler, runner_prompt, EnsembleConfig(segment_len=segment_len, max_new_tokens=8))
        for _ in range(repeats):
            samples["alone"].append(running_user(scheduler, runner_prompt, config))
            paused = scheduler.submit(neighbour_prompt, neighbour, step=True)
            one_step(paused)  # it has played a round and waits, holding its rounds only
            samples["beside a paused run"].append(running_user(scheduler, runner_prompt, config))
            paused.cancel()
            with Stepper(scheduler, neighbour_prompt, neighbour, step_every) as stepper:
                samples["beside a run stepping"].append(running_user(scheduler, runner_prompt, config))
            latencies += stepper.latencies
            errors += stepper.errors
    finally:
        scheduler.close()
    alone = statistics.median(s["tokens_per_s"] for s in samples["alone"])
    cases = {}
    for case, runs in samples.items():
        tps = statistics.median(s["tokens_per_s"] for s in runs)
        cases[case] = {
            "tokens_per_s": tps,
            "ratio_to_alone": tps / alone if alone else math.nan,
            "round_s": statistics.median(s["round_s"] for s in runs),
            "tokens": [s["tokens"] for s in runs],
            "same_answer_as_alone": sum(s["answer"] == samples["alone"][0]["answer"] for s in runs),
            "runs": len(runs),
        }
    return {
        "members": [m.name for m in members],
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "max_tokens": max_tokens,
        "segment_len": segment_len,
        "step_every_s": step_every,
        "repeats": repeats,
        "cases": cases,
        "neighbour_steps": len(latencies),
        "neighbour_errors": errors,
        "neighbour_step_median_s": statistics.median(latencies) if latencies else math.nan,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"a running user beside a step-mode neighbour: {', '.join(report['members'])} on {report['cpu']} "
        f"({report['cores']} cores), {report['max_tokens']} tokens per request, L = {report['segment_len']}, "
        f"a step every {report['step_every_s']:g} s, "
        + (f"medians of {report['repeats']} turns" if report["repeats"] > 1 else "one turn"),
        f"{'case':<22} {'tok/s':>7} {'× alone':>8} {'round s':>8} {'same':>5}",
    ]
    for case, r in report["cases"].items():
        lines.append(
            f"{case:<22} {r['tokens_per_s']:7.2f} {r['ratio_to_alone']:8.3f} {r['round_s']:8.3f} "
            f"{r['same_answer_as_alone']:>2}/{r['runs']:<2}"
        )
    lines += [
        "",
        f"the stepping neighbour: {report['neighbour_steps']} steps, median "
        f"{report['neighbour_step_median_s']:.2f} s from next() to Paused (a prefill of prompt + answer, "
        "then its round)",
    ]
    if report["neighbour_errors"]:
        lines += [f"the stepping neighbour's errors: {'; '.join(report['neighbour_errors'])}"]
    lines += footer(report)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "paused",
        "A running user's tokens/s alone, beside a paused step-mode run, and beside one stepping every "
        "few seconds, in one run.",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="the running user's budget (default 128)")
    parser.add_argument(
        "--step-every", type=float, default=STEP_EVERY, help=f"seconds between steps (default {STEP_EVERY:g})"
    )
    parser.add_argument("--repeats", type=int, default=3, help="turns of the three cases (default 3)")
    parser.add_argument("--quick", action="store_true", help="one turn, 16 tokens, a step every 0.5 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.max_tokens, args.step_every = 1, 16, 0.5
    if args.repeats < 1 or args.max_tokens < 1 or not args.step_every >= 0:
        parser.error("--repeats and --max-tokens must be at least 1, --step-every at least 0")
    kwargs = {"max_tokens": args.max_tokens, "segment_len": args.segment_len, "step_every": args.step_every}
    return bench_main(
        parser, args, argv, lambda members: run_paused(members, repeats=args.repeats, **kwargs), format_table
    )


if __name__ == "__main__":
    sys.exit(main())
