"""Print a trace as Markdown: who won which segment, and what one round cost, phase by phase.

Usage: python tools/trace_table.py run.json   (the README's traced example is made with it)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse import load_trace  # noqa: E402


def main(path: str) -> None:
    trace = load_trace(path)
    result = trace.result
    print(f"Prompt: {trace.prompt!r}\n")
    print("| round | drafting | winner | segment | margin | exits |")
    print("|---|---|---|---|---|---|")
    for r in trace.rounds:
        exits = ", ".join(e.member for e in r.exits)
        text = r.winner.text.replace("|", "\\|").replace("\n", "⏎")
        print(f"| {r.k} | {len(r.active)} | {r.winner.member} | `{text}` | {r.margin:.3f} | {exits} |")
    rounds = trace.rounds
    draft = [sum(t.draft_s for t in r.timings) for r in rounds]
    verify = [sum(t.verify_s for t in r.timings) for r in rounds]
    accept = [sum(t.accept_s for t in r.timings) for r in rounds]
    total = [r.seconds for r in rounds]
    print(
        f"\n{result.rounds} rounds, {result.tokens} tokens, stop: {result.stop_reason}; "
        f"wins: {', '.join(f'{m} {n}' for m, n in result.wins)}; "
        f"first segment after {result.first_segment_latency_s:.2f} s; "
        f"calls saved by exit: {result.calls_saved_by_exit}.\n"
    )
    print("| per round (median) | draft | verify | accept | whole round |")
    print("|---|---|---|---|---|")
    med = statistics.median
    print(f"| seconds | {med(draft):.3f} | {med(verify):.3f} | {med(accept):.4f} | {med(total):.3f} |")
    print(
        f"| share | {med(draft) / med(total):.0%} | {med(verify) / med(total):.0%} | "
        f"{med(accept) / med(total):.1%} | 100% |"
    )


if __name__ == "__main__":
    main(sys.argv[1])
