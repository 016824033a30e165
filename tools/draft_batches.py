"""Where drafting is cheaper: one member's drafts for 1, 2, 4, 8 and 16 requests at once, in llama.cpp
(the GGUF file's 4-bit blocks) against torch (bf16), both loaded in one process, each batch's
winners accepted as in a round. Prints, per back end and their ratio, the tokens drafted per second
in a round, and the wall time of reading the requests' prompts (start, then a first token:
llama.cpp reads a prompt at its first draft, torch at start): the numbers behind
`--quantize gguf-draft`.

Usage: python tools/draft_batches.py [model ...]   (default: the default trio; needs make llama-cpp)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse.config import MemberSettings  # noqa: E402
from specfuse.eval.problems import OPEN_PROMPTS  # noqa: E402
from specfuse.models.catalogue import DEFAULT_MEMBERS  # noqa: E402
from specfuse.models.placement import load_members  # noqa: E402

BATCHES = (1, 2, 4, 8, 16)
REPEATS = 2


def round_of_drafts(member, states) -> float:
    """Drafted tokens per second in one round: every request drafts up to 10 tokens (fewer where its
    answer ends), then accepts its own draft."""
    began = time.perf_counter()
    drafts = member.draft_many(states, [10] * len(states))
    for state, candidate in zip(states, drafts):
        member.accept(state, candidate.text)
    return sum(c.num_tokens for c in drafts) / (time.perf_counter() - began)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names = sys.argv[1:] or list(DEFAULT_MEMBERS)
    setups = {q: load_members(names, quantize=q) for q in ("gguf", "none")}
    settings = MemberSettings(max_new_tokens=256)
    print(f"load average {os.getloadavg()}")
    for i, name in enumerate(names):
        for n in BATCHES:
            # New prompts at every size: llama.cpp would find earlier ones still in its slots.
            prompts = [f"{OPEN_PROMPTS[r % len(OPEN_PROMPTS)]} ({n}.{r})" for r in range(n)]
            speed, reading = {}, {}
            for q, members in setups.items():
                member = members[i]
                began = time.perf_counter()
                states = member.start_many(prompts, [settings] * n)
                member.draft_many(states, [1] * n)
                reading[q] = time.perf_counter() - began
                round_of_drafts(member, states)  # warm-up
                speed[q] = max(round_of_drafts(member, states) for _ in range(REPEATS))
            print(
                f"{name:<20} {n:>2} requests | tokens/s drafted: llama.cpp {speed['gguf']:6.1f}, "
                f"torch bf16 {speed['none']:6.1f}, ×{speed['gguf'] / speed['none']:.2f} "
                f"| prompts: llama.cpp {reading['gguf'] * 1000:6.0f} ms, torch bf16 "
                f"{reading['none'] * 1000:6.0f} ms, ×{reading['none'] / reading['gguf']:.2f}",
                flush=True,
            )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
