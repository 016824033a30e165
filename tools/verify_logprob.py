"""What a verify pass's log-probabilities cost through the output head, before and after they were
made in one product for all of a pass's candidates (scoring.OutputHead.token_logprobs): per member,
for the candidates of 1 and of 8 requests (3 candidates of 11 scored tokens each), the time of

- "per candidate": one product and one float32 log_softmax over whole vocabulary rows for each
  candidate, the head's post-processing out of place (how verify_many made them before);
- "one pass": all rows at once, in vocabulary slices with a running log-sum-exp (how it does now);
- "body": the member's decoder over the same number of tokens (what the rest of the pass costs),

their ratio, and the largest difference between the two results. Hidden states are the member's own
on real text. One process, each figure the median of REPEATS runs.

Usage: python tools/verify_logprob.py [model ...]   (default: the default trio)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse.eval.problems import OPEN_PROMPTS  # noqa: E402
from specfuse.models.catalogue import DEFAULT_MEMBERS  # noqa: E402
from specfuse.models.placement import load_members  # noqa: E402

CANDIDATES, TOKENS = 3, 11  # per request: a round with three drafters, L = 10 plus the anchor
REQUESTS = (1, 8)
REPEATS = 5


def per_candidate(head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The earlier way: each candidate's rows through the whole head and a whole-row log_softmax."""
    out = []
    for begin in range(0, len(hidden), TOKENS):
        raw = torch.nn.functional.linear(hidden[begin : begin + TOKENS], head.weight, head.bias)
        logits = raw.float() * head.scale / head.divide
        if head.softcap:
            logits = torch.tanh(logits / head.softcap) * head.softcap
        logp = torch.log_softmax(logits, dim=-1)
        out.append(logp.gather(-1, targets[begin : begin + TOKENS, None])[:, 0])
    return torch.cat(out)


def timed(call) -> float:
    call()  # warm-up
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names = sys.argv[1:] or list(DEFAULT_MEMBERS)
    members = load_members(names, dtype="auto")
    print(f"load average {os.getloadavg()[0]:.2f}; torch threads {torch.get_num_threads()}")
    print(f"{'member':<22} {'requests':>8} {'rows':>5} {'per candidate':>13} {'one pass':>9} {'×':>5} "
          f"{'body':>7} {'max |diff|':>10}")  # fmt: skip
    text = " ".join(OPEN_PROMPTS) * 4
    for member in members:
        ids = member.encode(text)[: max(REQUESTS) * CANDIDATES * TOKENS + 1]
        states = member.base(input_ids=torch.tensor([ids[:-1]], device=member.device)).last_hidden_state[0]
        targets_all = torch.tensor(ids[1:], device=member.device)
        for requests in REQUESTS:
            rows = requests * CANDIDATES * TOKENS
            hidden, targets = states[:rows], targets_all[:rows]
            earlier = partial(per_candidate, member.head, hidden, targets)
            sliced = partial(member.head.token_logprobs, hidden, targets)
            before, now = timed(earlier), timed(sliced)
            body_ids = torch.tensor([ids[:rows]], device=member.device)
            body = timed(partial(member.base, input_ids=body_ids))
            diff = float((earlier() - sliced()).abs().max())
            print(f"{member.name:<22} {requests:>8} {rows:>5} {before * 1e3:>10.1f} ms {now * 1e3:>6.1f} ms "
                  f"{before / now:>5.2f} {body * 1e3:>4.0f} ms {diff:>10.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
