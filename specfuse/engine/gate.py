"""The gated round's arithmetic (config.gate): who keeps the gate, and whether the others are asked.

Where the best member is sure of a segment it is usually right, and the weaker members can only talk
it out of it (GaC's thresholded ensembling, SAFE); such a round costs one member's draft instead of
every member's draft and verification. Pure functions (stdlib only): run.py plays the round;
members report how sure their drafts were (records.Confidence, members/drafting.confidence).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..records import Confidence, Gate


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
