"""Interleaved A/B of one member's per-token drafting cost: HFMember.draft vs transformers' generate
vs a bare base() + head loop, in ms per token, three repeats alternated so that noise hits all three.

Usage: python tools/draft_vs_generate.py [model]   (default smollm2-135m)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse.config import MemberSettings  # noqa: E402
from specfuse.models.loading import load_member  # noqa: E402

PROMPT = "Write a long story about a dragon."
TOKENS = 40


def ours(member) -> float:
    state = member.start(PROMPT, MemberSettings(max_new_tokens=TOKENS))
    began = time.perf_counter()
    cand = member.draft(state, TOKENS)
    return (time.perf_counter() - began) / max(1, cand.num_tokens)


def generate(member, ids: torch.Tensor) -> float:
    """Includes generate's prefill, so it slightly favours the other two."""
    began = time.perf_counter()
    member.model.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)
    return (time.perf_counter() - began) / TOKENS


@torch.inference_mode()
def bare(member, ids: torch.Tensor) -> float:
    cache = DynamicCache()
    hidden = member.base(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state[0, -1]
    began = time.perf_counter()
    for _ in range(TOKENS):
        token = torch.tensor([[int(member.head.logits(hidden).argmax())]])
        hidden = member.base(input_ids=token, past_key_values=cache, use_cache=True).last_hidden_state[0, -1]
    return (time.perf_counter() - began) / TOKENS


def main() -> None:
    member = load_member(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m")
    ids = torch.tensor([member.prompt_ids(PROMPT)])
    for _ in range(3):
        a, b, c = ours(member), generate(member, ids), bare(member, ids)
        print(f"draft {a * 1000:.1f} ms/token | generate {b * 1000:.1f} | bare {c * 1000:.1f}", flush=True)


if __name__ == "__main__":
    main()
