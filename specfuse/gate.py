"""The gated round's arithmetic (config.gate): a drafter's confidence in its segment, who keeps the
gate, and whether the others are asked.

Where the best member is sure of a segment it is usually right, and the weaker members can only talk
it out of it (GaC's thresholded ensembling, SAFE); such a round costs one member's draft instead of
every member's draft and verification. Pure functions (stdlib only): the engine (engine/run.py)
plays the round; members report the values their drafts were decoded with (records.Confidence).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .records import Confidence, Gate


def confidence(logprobs: Sequence[float], runner_up: Sequence[float]) -> Confidence | None:
    """A segment's Confidence from each of its tokens' log-probability and the log-probability of the
    most likely other token at that place (the runner-up); None for no tokens."""
    if len(logprobs) != len(runner_up):
        raise ValueError(f"{len(logprobs)} log-probabilities but {len(runner_up)} runner-ups")
    if not logprobs:
        return None
    return Confidence(
        mean_logprob=sum(logprobs) / len(logprobs),
        min_prob=math.exp(min(logprobs)),
        margin=min(lp - other for lp, other in zip(logprobs, runner_up)),
        tokens=len(logprobs),
    )


def gatekeeper(names: Sequence[str], weights: Sequence[float], active: Sequence[str], named: str) -> str:
    """The member that drafts first: `named` while it drafts (is active), else the highest-weight
    active member (weights in `names`' order; ties to the first listed)."""
    if named and named in active:
        return named
    index = {m: i for i, m in enumerate(names)}
    return max(active, key=lambda m: (weights[index[m]], -index[m]))


def decide(member: str, found: Confidence | None, measure: str, threshold: float) -> Gate:
    """Whether the gatekeeper's segment is taken alone: its `measure` at least `threshold`. A draft
    without a confidence (a back end that gives none) never passes: the full round decides."""
    if found is None:
        return Gate(member, measure, None, threshold, False, f"{member} gave no confidence for its draft, "
                    "so the others were asked")  # fmt: skip
    value = found.measure(measure)
    if value >= threshold:
        why = (
            f"{member} was sure: {measure} {value:.3f} ≥ {threshold:g} over {found.tokens} tokens, so its "
            "segment was taken without asking the others"
        )
        return Gate(member, measure, value, threshold, True, why)
    why = f"{member} was unsure ({measure} {value:.3f} < {threshold:g}), so the others drafted and verified"
    return Gate(member, measure, value, threshold, False, why)
