"""The garbage collector's full passes in the middle of rounds, with start-up's objects frozen and not
(issue 52; specfuse/heap.py).

A full pass walks every object the collector tracks and holds every thread meanwhile, a round's too.
Here three members with the real layer counts of the GPU check's shapes (Qwen2.5-7B, Llama-3.1-8B,
Gemma-2-9B; tiny widths, a vocabulary of 512, bfloat16, on the KV slots the GPU's way) play rounds of
--runs runs each (a draft of L = 10 tokens for every run, three candidates verified, one accepted), in
four phases of --rounds rounds in one process, alternated because a machine drifts through a sitting:
as they are, after heap.freeze_survivors (as specfuse-serve does once its members are ready), unfrozen
again, frozen again. Per phase: the objects the collector walks, the full passes, their milliseconds,
the longest. With --app, Gradio and the app's modules are imported first, as app.py has them.

    .venv/bin/python tools/gc_passes.py [--runs 32] [--rounds 8] [--app]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slot_launches import host_members, one_round, started  # noqa: E402

from specfuse.heap import FullPasses, freeze_survivors  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=32, help="runs each member plays at once (default 32)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds a phase (default 8)")
    parser.add_argument("--app", action="store_true", help="import Gradio and the app's modules first")
    args = parser.parse_args(argv)
    if args.app:
        import studio  # noqa: F401  (Gradio with it)
    members = host_members()
    states = []
    for member in members:
        states.append(started(member, args.runs))
        one_round(member, states[-1], lambda phase: None)
    print(
        f"the garbage collector's full passes in {args.rounds} rounds of {len(members)} members "
        f"at {args.runs} runs each (torch {torch.__version__}, Python {sys.version.split()[0]}"
        + (", Gradio and the app imported)" if args.app else ")")
    )
    print(f"{'phase':<10} {'walked':>8} {'frozen':>8} {'wall s':>7} {'passes':>6} {'ms':>7} {'longest':>8}")
    for phase in ("as is", "frozen", "as is", "frozen"):
        if phase == "frozen":
            freeze_survivors(lambda line: None)
        else:
            gc.unfreeze()
        walked, frozen = len(gc.get_objects()), gc.get_freeze_count()
        began = time.perf_counter()
        with FullPasses() as passes:
            for _ in range(args.rounds):
                for member, runs in zip(members, states):
                    one_round(member, runs, lambda phase: None)
        wall = time.perf_counter() - began
        longest = max(passes.each, default=0.0)
        figures = f"{wall:>7.1f} {passes.count:>6} {passes.ms:>7.1f} {longest:>8.1f}"
        print(f"{phase:<10} {walked:>8} {frozen:>8} {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
