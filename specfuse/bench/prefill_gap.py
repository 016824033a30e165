"""What a long prompt joining costs the streams under way: `python -m specfuse.bench prefill-gap`.

In one run, on one Scheduler per setting: a running stream plays a few rounds alone, then a newcomer
with a long prompt (--prompt-tokens, 6,000 by default, counted in the first member's tokenizer)
joins; the running stream's rounds (the chunks a client's stream receives) go on until the newcomer
has played its first round. Per setting of --prefill-chunk (0: the prompt read whole before the
next round; else at most that many tokens a member reads between two rounds, each part sized to take
part of a round), taking turns --repeats times: the running stream's usual gap between rounds (the
median before the newcomer came), its longest gap while the newcomer's prompt was read (read whole: the
round it joined; target ≤ 2× the usual gap), its longest gap once the newcomer plays (its last part
and rounds of two runs: on a CPU a round of two takes about two of one, whatever the prefill; target
≤ 2× the same gap when a short prompt joins), and the newcomer's wait for its first round. Timings
on a shared machine are noise: run it alone on the machine.
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
from ..engine import Scheduler, ServerSettings, Ticket
from ..engine.operator import prefill_chunk_for
from ..flags import add_settings
from ..records import Round
from .measure import bench_main, bench_parser, cpu_model, footer

log = logging.getLogger(__name__)

TARGET = 2.0  # the longest gap, at most this many usual gaps (issue 56)
WARM_ROUNDS = 4  # the running stream's rounds alone before the newcomer comes: its usual gap
RUNNING = "Write a long story about a lighthouse keeper, chapter by chapter, with every detail."
PARAGRAPH = (
    "The harbour wakes before the town does: gulls on the breakwater, nets drying on the rails, the "
    "smell of tar and diesel, a radio playing somewhere below deck. "
)


def long_prompt(member: Any, tokens: int) -> str:
    """A question after enough paragraphs that the member's context for it takes about `tokens`."""
    question = "\n\nSummarise the text above in one sentence."
    text = PARAGRAPH
    while len(member.prompt_ids(text * 2 + question)) < tokens:
        text *= 2
    # Whole paragraphs up to the count (one more doubling would pass it).
    step = len(member.prompt_ids(PARAGRAPH))
    while len(member.prompt_ids(text + PARAGRAPH + question)) <= tokens:
        text += PARAGRAPH * max(1, (tokens - len(member.prompt_ids(text + question))) // step)
    return text + question


def one_join(
    scheduler: Scheduler, prompt: str, running: EnsembleConfig, newcomer: EnsembleConfig, stream: str
) -> dict:
    """A running stream, a newcomer joining after WARM_ROUNDS of its rounds: the stream's gaps."""
    ticket = scheduler.submit(stream, running)
    times: list[float] = []
    reading: list[bool] = []  # per round of the stream: the newcomer not yet playing (in line or read)
    first: list[float] = []  # when the newcomer's first round arrived, as its client sees it
    submitted = math.nan
    joining = None
    try:
        for event in ticket.events(timeout=3600):
            if not isinstance(event, Round):
                continue
            times.append(time.perf_counter())
            stats = scheduler.stats()
            reading.append(joining is not None and not first and bool(stats["reading"] + stats["waiting"]))
            if len(times) == WARM_ROUNDS:
                submitted = time.perf_counter()
                joining = scheduler.submit(prompt, newcomer)
                threading.Thread(target=_first_round, args=(joining, first), daemon=True).start()
            if first:
                break
    finally:
        ticket.cancel()
        if joining is not None:
            joining.cancel()
    gaps = list(zip(times, times[1:], reading[1:]))  # (began, ended, newcomer still in line or read)
    before = [b - a for a, b, _ in gaps[: WARM_ROUNDS - 1]]
    after = [(b - a, flag) for a, b, flag in gaps if b > submitted]
    read = [gap for gap, flag in after if flag]  # ended before it played: a part (or none) and a round
    joined = [gap for gap, flag in after if not flag]  # its last part, and rounds of the two runs
    usual = statistics.median(before) if before else math.nan
    # Read whole, the prompt is read in the round the newcomer joins: that gap is the reading's.
    longest_read = max(read) if read else max(joined, default=math.nan)
    return {
        "usual_gap_s": usual,
        "longest_gap_s": max((gap for gap, _ in after), default=math.nan),
        "read_gap_s": longest_read,
        "ratio": longest_read / usual if usual else math.nan,
        "join_gap_s": max(joined, default=math.nan),
        "rounds_while_read": len(read),
        "newcomer_first_round_s": first[0] - submitted if first else math.nan,
        "complete": bool(first),  # False: the running stream ended before the newcomer played
    }


def _first_round(ticket: Ticket, out: list[float]) -> None:
    for event in ticket.events(timeout=3600):
        if isinstance(event, Round):
            out.append(time.perf_counter())
            return


def run_gap(
    members: Sequence[Any],
    *,
    chunks: Sequence[int],
    prompt_tokens: int = 6000,
    segment_len: int = 10,
    repeats: int = 1,
    stream_tokens: int = 4096,
    stream: str = RUNNING,
) -> dict[str, Any]:
    """Each setting of `chunks` in turn, `repeats` times; the JSON-ready report. `stream_tokens`: the
    running stream's budget, enough to outlast the newcomer's prompt read in parts; `stream`: its prompt."""
    prompt = long_prompt(members[0], prompt_tokens)
    running = EnsembleConfig(segment_len=segment_len, max_new_tokens=stream_tokens)
    newcomer = EnsembleConfig(segment_len=segment_len, max_new_tokens=segment_len)
    samples: dict[int, list[dict]] = {c: [] for c in chunks}
    load_before = os.getloadavg()
    for _ in range(repeats):
        for chunk in chunks:  # the settings take turns: drift in the machine's load falls on each
            scheduler = Scheduler(members, batch_size=4, prefill_chunk=chunk)
            try:
                # A short prompt joins first: a warm-up (lazy initialisation), and the join's own cost
                # (on a CPU a round of two runs takes about two rounds of one, whatever the prefill).
                short = one_join(scheduler, "Hi", running, newcomer, stream)
                sample = one_join(scheduler, prompt, running, newcomer, stream)
                sample["short_join_gap_s"] = short["join_gap_s"]
                sample["join_ratio"] = sample["join_gap_s"] / short["join_gap_s"]
                samples[chunk].append(sample)
            finally:
                scheduler.close()
    settings = {}
    for chunk, runs in samples.items():
        keys = (
            "usual_gap_s",
            "longest_gap_s",
            "read_gap_s",
            "ratio",
            "join_gap_s",
            "short_join_gap_s",
            "join_ratio",
            "rounds_while_read",
            "newcomer_first_round_s",
        )
        settings[str(chunk)] = {key: statistics.median(r[key] for r in runs) for key in keys}
        settings[str(chunk)] |= {"complete": sum(r["complete"] for r in runs), "runs": len(runs)}
    return {
        "members": [m.name for m in members],
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "prompt_tokens": len(members[0].prompt_ids(prompt)),
        "segment_len": segment_len,
        "repeats": repeats,
        "settings": settings,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"a {report['prompt_tokens']}-token prompt joins a running stream: {', '.join(report['members'])} "
        f"on {report['cpu']} ({report['cores']} cores), L = {report['segment_len']}, "
        + (f"medians of {report['repeats']} turns" if report["repeats"] > 1 else "one turn"),
        f"{'prefill chunk':<14} {'usual gap s':>11} {'read s':>7} {'× usual':>8} {'join s':>7} "
        f"{'× short':>8} {'target':>7} {'rounds':>7} {'newcomer s':>11}",
    ]
    for chunk, r in report["settings"].items():
        name = "0 (whole)" if chunk == "0" else f"{chunk} tokens"
        ok = "met" if r["ratio"] <= TARGET and r["join_ratio"] <= TARGET else "missed"
        lines.append(
            f"{name:<14} {r['usual_gap_s']:11.3f} {r['read_gap_s']:7.2f} {r['ratio']:8.2f} "
            f"{r['join_gap_s']:7.2f} {r['join_ratio']:8.2f} {ok:>7} {r['rounds_while_read']:7.0f} "
            f"{r['newcomer_first_round_s']:11.2f}"
            + ("" if r["complete"] == r["runs"] else "  (the stream ended before the newcomer played)")
        )
    lines += [
        "",
        "usual gap: the running stream's median gap between rounds alone; read: its longest while the",
        "newcomer's prompt was read (read whole: the round it joined); join: its longest once the newcomer",
        "plays (its last part and rounds of two runs), × short: against a short prompt's join; target:",
        f"both ≤ {TARGET:g}×; rounds: the stream's rounds while the prompt was read",
    ]
    lines += footer(report)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "prefill-gap",
        "The longest gap in a running stream while a long prompt joins, with the prompt read whole and in "
        "chunks (--prefill-chunk), in one run.",
    )
    add_settings(parser, of=ServerSettings, only=("prefill_chunk",))
    parser.add_argument("--prompt-tokens", type=int, default=6000, help="the long prompt (default 6000)")
    parser.add_argument("--repeats", type=int, default=1, help="turns of the settings (default 1)")
    args = parser.parse_args(argv)
    chunk = args.prefill_chunk  # None: the device's cap
    if args.repeats < 1 or args.prompt_tokens < 1 or (chunk is not None and chunk < 1):
        parser.error("--repeats, --prompt-tokens and --prefill-chunk must be ≥ 1 (0, whole, always runs)")
    kwargs = {"prompt_tokens": args.prompt_tokens, "segment_len": args.segment_len, "repeats": args.repeats}
    return bench_main(
        parser,
        args,
        argv,
        lambda members: run_gap(
            members, chunks=(0, prefill_chunk_for(chunk, (m.device for m in members))), **kwargs
        ),
        format_table,
    )


if __name__ == "__main__":
    sys.exit(main())
