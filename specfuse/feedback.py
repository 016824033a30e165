"""The method's arithmetic: row normalization, aggregation, choice, rewards, weight update, model exit.

Pure functions on floats and lists (SPEC.md §3-6), stdlib only. Knows nothing about models or text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .config import AGGREGATIONS
from .errors import ConfigError

Matrix = Sequence[Sequence[float]]


# ---------------------------------------------------------------------------------------------
# §3 Normalize: each verifier's row over the candidates.


def normalize_row(z: Sequence[float], method: str = "zsoftmax") -> list[float]:
    """Normalize one verifier's raw scores z_i· over the candidates.

    - "zsoftmax" (default): softmax of the row's z-scores, (z - mean) / std. Defined for any real
      scores (negative ones included), sums to 1, and invariant to a verifier's scale *and* offset:
      a model that emits logits twice as large, or all shifted by a constant, votes exactly the
      same. A flat row (std 0) gives the uniform row: that verifier cannot tell the candidates apart.
    - "minmax": (z - min) / (max - min), then divided by the row sum; same invariances, but the
      worst candidate always gets 0 from every verifier.
    - "sum": the paper's ŝ_ij = z_ij / Σ_j' z_ij'. Only meaningful when every z_ij > 0 (it inverts
      the ranking for negative rows and explodes near a zero sum), so such rows are refused.
    - "none": raw scores unchanged (not scale-invariant; for experiments).
    """
    values = [float(v) for v in z]
    if not values:
        return []
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"scores must be finite, got {values}")
    n = len(values)
    if method == "none":
        return values
    if method == "sum":
        if any(v <= 0 for v in values):
            raise ConfigError(
                f"normalization 'sum' (the paper's z / Σz) needs positive scores, got "
                f"{[round(v, 3) for v in values]}; use normalization 'zsoftmax' for raw logits"
            )
        total = sum(values)
        return [v / total for v in values]
    low, high = min(values), max(values)
    if high - low <= 1e-12 * max(1.0, abs(high)):
        return [1.0 / n] * n
    if method == "minmax":
        shifted = [(v - low) / (high - low) for v in values]
        total = sum(shifted)
        return [v / total for v in shifted]
    if method == "zsoftmax":
        mean = sum(values) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / n)
        return softmax([(v - mean) / std for v in values])
    raise ConfigError(f"unknown normalization {method!r}")


def contrast(z: Matrix, verifiers: Sequence[str], drafters: Sequence[str]) -> list[list[float]]:
    """Contrastive scores: each z_ij minus the drafter's own score of candidate j, z_(d(j))j, so that
    a verifier rewards a candidate it finds likelier than its author does, not one that is merely
    easy to predict (short, generic). A candidate whose drafter is not verifying (a typed segment)
    keeps its raw score. The drafter's own entry becomes 0."""
    own = {v: i for i, v in enumerate(verifiers)}
    return [
        [float(v) - (float(z[own[d]][j]) if d in own else 0.0) for j, (v, d) in enumerate(zip(row, drafters))]
        for row in z
    ]


def prompt_contrast(z: Sequence[float], z_without: Sequence[float], weight: float) -> list[float]:
    """One verifier's scores less `weight` times its scores of the same candidates with the prompt
    left out (z_ij − λ·z°_ij): how much the prompt itself raises each candidate's likelihood. Text
    that keeps an instruction (a format, a required word, all lowercase) is likely because of the
    prompt; generic text and repetition are likely either way. Context-aware decoding (Shi et al.,
    2023) and instructive decoding (Kim et al., 2023) apply this per token; here it scores segments."""
    if len(z) != len(z_without):
        raise ValueError(f"{len(z)} scores with the prompt but {len(z_without)} without it")
    return [float(a) - weight * float(b) for a, b in zip(z, z_without)]


def normalize(z: Matrix, method: str = "zsoftmax") -> list[list[float]]:
    """Normalize every row of a [verifiers][candidates] matrix."""
    return [normalize_row(row, method) for row in z]


def softmax(x: Sequence[float], temperature: float = 1.0) -> list[float]:
    top = max(x)
    e = [math.exp((v - top) / temperature) for v in x]
    total = sum(e)
    return [v / total for v in e]


# ---------------------------------------------------------------------------------------------
# §4 Aggregate and choose.


def aggregate(
    s: Matrix,
    weights: Sequence[float],
    verifiers: Sequence[str],
    drafters: Sequence[str],
    self_scores: bool = True,
    method: str = "mean",
    outlier_gap: float = 0.25,
) -> list[float]:
    """y_j over the verifiers' normalized scores of candidate j (SPEC.md §4).

    - "mean" (the paper): y_j = Σ_i w_i ŝ_ij, weights renormalized over those who vote on j.
    - "median": the weighted median of the votes: one verifier alone cannot drag a candidate up
      or down, however sure it is.
    - "filtered" (after SweetSpan's filtering of unfaithful scores): votes farther than
      `outlier_gap` from the column's weighted median are dropped, then the weighted mean of the
      rest. Self-preference is the usual outlier: a verifier rating its own candidate far above
      what everyone else gives it.

    With self_scores=False, verifier i's vote on its own candidate is left out, and the remaining
    verifiers' weights are renormalized per column so that no candidate is handicapped. A column
    left with no voter (a lone drafter judging only itself) falls back to all verifiers.
    """
    if method not in AGGREGATIONS:
        raise ConfigError(f"unknown aggregation {method!r}; known: {', '.join(AGGREGATIONS)}")
    y = []
    for j, drafter in enumerate(drafters):
        voters = [i for i, v in enumerate(verifiers) if self_scores or v != drafter]
        voters = voters or list(range(len(verifiers)))
        votes = [s[i][j] for i in voters]
        w = [weights[i] for i in voters]
        if sum(w) <= 0:  # all weight sits on excluded verifiers: count the voters equally
            w = [1.0] * len(voters)
        if method == "median":
            y.append(weighted_median(votes, w))
            continue
        if method == "filtered" and len(votes) >= 3:
            centre = weighted_median(votes, w)
            keep = [t for t, v in enumerate(votes) if abs(v - centre) <= outlier_gap]
            votes, w = [votes[t] for t in keep], [w[t] for t in keep]  # the median's own vote stays
        total = sum(w)
        y.append(sum(wi * v for wi, v in zip(w, votes)) / total)
    return y


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value where the cumulative weight (values sorted) first reaches half the total; with two
    values of equal weight, their mean."""
    pairs = sorted(zip(values, weights))
    half = sum(weights) / 2
    running = 0.0
    for t, (v, w) in enumerate(pairs):
        running += w
        if abs(running - half) <= 1e-12 * max(1.0, half) and t + 1 < len(pairs):
            return (v + pairs[t + 1][0]) / 2
        if running > half:
            return v
    return pairs[-1][0]


def penalize_repeats(y: Sequence[float], repeated: Sequence[float], strength: float) -> list[float]:
    """y_j − λ · (share of candidate j's n-grams already in the answer): a verifier finds text it
    has just read easy to predict, so a likelihood score alone rewards loops."""
    return [v - strength * r for v, r in zip(y, repeated)]


def choose(y: Sequence[float], eligible: Sequence[int] | None = None) -> tuple[int, float]:
    """(index of the best candidate, margin over the runner-up). Ties go to the lowest index,
    i.e. the member listed first in the ensemble: a stated, deterministic rule. Only `eligible`
    indices (default: all) can win or be runner-up."""
    pool = list(range(len(y))) if eligible is None else list(eligible)
    best = max(pool, key=lambda j: (y[j], -j))
    others = [y[j] for j in pool if j != best]
    return best, (y[best] - max(others)) if others else 0.0


# ---------------------------------------------------------------------------------------------
# §5 Online feedback.


def rewards(
    s: Matrix,
    verifiers: Sequence[str],
    drafters: Sequence[str],
    judge_weights: Sequence[float] | None = None,
) -> list[float]:
    """r_j for each candidate's drafter (SPEC.md §5, the paper's Eq. 9).

    r_j = max(1, #{(v, m): v ≠ j's drafter, m ≠ j, ŝ_vj ≥ ŝ_vm}) / #comparisons.

    With `judge_weights` ([verifiers]), each comparison counts with its verifier's weight instead
    of 1 (the floor becomes the smallest judge's weight): members the ensemble trusts less cannot
    vote the trusted ones down as easily.

    Two-member case: with one other verifier and one other candidate, the reward would be the
    floored count over a single comparison, always 1: no signal at all. We then let each drafter's
    own vote count as well (2 comparisons, reward 0.5 or 1), and say so in the README.
    """
    n_c = len(drafters)
    if n_c < 2:
        return [0.0] * n_c
    out = []
    for j, drafter in enumerate(drafters):
        judges = [v for v, name in enumerate(verifiers) if name != drafter]
        if len(judges) < 2:  # degenerate: let the drafter's own row count too
            judges = list(range(len(verifiers)))
        wins = comparisons = 0.0
        for v in judges:
            weight = 1.0 if judge_weights is None else judge_weights[v]
            for m in range(n_c):
                if m != j:
                    comparisons += weight
                    wins += weight * (s[v][j] >= s[v][m])
        floor = 1.0 if judge_weights is None else min(judge_weights[v] for v in judges)
        out.append(max(floor, wins) / comparisons if comparisons else 0.0)
    return out


def learning_rate(alpha: float, n: int, k: int) -> float:
    """η_k = α / (N √k): smaller steps with more members and later rounds (the authors' Eq. 7)."""
    return alpha / (n * math.sqrt(k))


def update_weights(
    weights: Sequence[float], members: Sequence[str], drafters: Sequence[str], r: Sequence[float], eta: float
) -> list[float]:
    """w_i ← w_i · exp(η r_i) for this round's drafters, renormalized over the drafters' mass.

    Members that did not draft (exited) keep their weight: they earned no reward this round, and
    renormalizing over all N would drain them for merely being absent.
    """
    w = list(weights)
    index = {m: i for i, m in enumerate(members)}
    idx = [index[d] for d in drafters]
    mass = sum(w[i] for i in idx)
    grown = {i: w[i] * math.exp(eta * rj) for i, rj in zip(idx, r)}
    total = sum(grown.values())
    if total > 0 and mass > 0:
        for i, value in grown.items():
            w[i] = value * mass / total
    return w


def uniform(n: int) -> list[float]:
    return [1.0 / n] * n


def trust_weights(trust: Sequence[float | None]) -> list[float]:
    """Starting weights from the members' trust (relative say, from evidence), normalized. A member
    without trust (None, or not a finite number ≥ 0) gets the mean of the others' (models/trust.py:
    neither favoured nor held back); uniform when none has any or they sum to nothing."""
    given = [float(t) if t is not None and math.isfinite(t) and t >= 0 else None for t in trust]
    known = [t for t in given if t is not None]
    if not known:
        return uniform(len(trust))
    mean = sum(known) / len(known)
    filled = [mean if t is None else t for t in given]
    total = sum(filled)
    return [t / total for t in filled] if total > 0 else uniform(len(trust))


def prior_weights(surprise: Sequence[float | None], temperature: float) -> list[float]:
    """Training-free starting weights from how well each member reads the prompt (PackLLM-style):
    w_i = softmax(−surprise_i / T), surprise in nats per byte of the prompt's text, so members
    with different tokenizers compare. Uniform when any member cannot tell its surprise."""
    if not surprise or any(v is None or not math.isfinite(v) for v in surprise):
        return uniform(len(surprise))
    return softmax([-float(v) / temperature for v in surprise if v is not None])


# ---------------------------------------------------------------------------------------------
# §6 Model exit (SpecFuse; described in the paper, never released: this is our reconstruction).


@dataclass(frozen=True)
class ExitDecision:
    member: str
    keep_probability: float
    threshold: float


def exit_temperature(q: Sequence[float], base: float) -> float:
    """τ_k = τ_0 · (1 + H), with H ∈ [0, 1] the normalized entropy of softmax(Q / τ_0).

    While the cumulative qualities are still flat (H near 1) the temperature is doubled, which
    flattens the keep-probabilities and holds exits back; once one member clearly trails, H falls
    and τ_k returns toward τ_0.
    """
    if len(q) < 2:
        return base
    p = softmax(q, base)
    entropy = -sum(v * math.log(v) for v in p if v > 0) / math.log(len(p))
    return base * (1.0 + entropy)


def exit_decisions(
    quality: dict[str, float],
    active: Sequence[str],
    k: int,
    threshold: float,
    warmup: int,
    base_temperature: float,
    min_active: int = 1,
) -> list[ExitDecision]:
    """Members of A_k that leave after round k: p_i = softmax(Q / τ_k)_i < δ / |A_k|.

    Q_i is member i's cumulative quality (the sum of its candidates' aggregate scores so far).
    No exit before `warmup` rounds; never the current leader (highest Q, ties to the first);
    never below `min_active` members (at least one): the lowest p_i leave first.
    """
    if k < warmup or len(active) <= max(1, min_active):
        return []
    q = [quality[m] for m in active]
    tau = exit_temperature(q, base_temperature)
    p = softmax(q, tau)
    bar = threshold / len(active)
    leader = max(range(len(active)), key=lambda i: (q[i], -i))
    below = sorted((i for i in range(len(active)) if i != leader and p[i] < bar), key=lambda i: (p[i], i))
    room = len(active) - max(1, min_active)
    return [ExitDecision(active[i], p[i], bar) for i in sorted(below[:room])]
