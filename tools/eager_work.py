"""The work the eager path does on one fixed workload, counted: every torch operation by name and the
Python calls. Three tiny random-weight members (tests/conftest.py), decoding eagerly as on a CPU,
play four prompts through the ensemble's rolling batch, greedy, members in turn (one thread, so that
both counters see everything). Run from two checkouts' roots, the same counts mean the same eager
path, however a noisy machine's timings move (results/bench/serve-xeon-bf16-before-after.txt).

    .venv/bin/python tools/eager_work.py                                  # this checkout
    cd /tmp/old && /repo/.venv/bin/python /repo/tools/eager_work.py      # another (a worktree's root)
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.getcwd())  # the checkout run from, not the one installed

from specfuse.config import EnsembleConfig  # noqa: E402
from specfuse.engine import Ensemble  # noqa: E402
from tests.conftest import TINY_SPECS, tiny_member  # noqa: E402

PROMPTS = ["Once upon a time", "Why is the sky blue?", "x = 1 + 2 * 3", "Hi there, how are you today?"]


class Ops(TorchDispatchMode):
    """Every torch operation, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = Counter[str]()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def main() -> int:
    members = [tiny_member(name) for name in TINY_SPECS]  # decode auto: eager on a CPU
    config = EnsembleConfig(segment_len=4, max_new_tokens=24)
    ops, profile = Ops(), cProfile.Profile()
    with ops:
        profile.enable()
        rounds = list(Ensemble(members, config, parallel="off").stream_many(PROMPTS, batch_size=4))
        profile.disable()
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    print(f"rounds {len(rounds)} torch ops {sum(ops.counts.values())} python calls {calls}")
    print(sorted(ops.counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
