"""Hand-built records for view, report, trace and evaluation tests: one builder for every Round.

Defaults make a consistent round (shapes agree, the text is the answer so far plus the winner), so a
test states only what it is about.
"""

from __future__ import annotations

from collections.abc import Sequence

from specfuse.records import Candidate, ExitEvent, MemberTiming, Round, TokenScores


def hand_round(
    k: int = 1,
    *,
    members: Sequence[str] = ("a", "b"),
    active: Sequence[str] | None = None,
    verifiers: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
    num_tokens: Sequence[int] | None = None,
    final: bool = False,
    chosen: int = 0,
    raw_scores: Sequence[Sequence[float]] | None = None,
    scores: Sequence[Sequence[float]] | None = None,
    aggregate: Sequence[float] | None = None,
    margin: float | None = None,
    weights_before: Sequence[float] | None = None,
    weights_after: Sequence[float] | None = None,
    rewards: Sequence[float] | None = None,
    exits: Sequence[ExitEvent] = (),
    timings: Sequence[MemberTiming] | None = None,
    seconds: float = 0.1,
    elapsed: float | None = None,
    before: str = "",
    text: str | None = None,
    stop_reason: str | None = None,
    eligible: Sequence[bool] = (),
    token_scores: Sequence[Sequence[TokenScores]] = (),
) -> Round:
    """A Round k of `members` (all drafting and verifying unless told), candidate j's text `texts[j]`
    (default "<member><k> "), uniform scores and weights; `before` is the answer before this round."""
    active = tuple(active if active is not None else members)
    verifiers = tuple(verifiers if verifiers is not None else members)
    texts = tuple(texts if texts is not None else (f"{m}{k} " for m in active))
    num_tokens = tuple(num_tokens if num_tokens is not None else (1,) * len(active))
    c, v, n = len(active), len(verifiers), len(members)
    candidates = tuple(
        Candidate(m, t, tokens, final and j == chosen, 0.0)
        for j, (m, t, tokens) in enumerate(zip(active, texts, num_tokens))
    )
    scores = scores if scores is not None else [[1.0 / c] * c for _ in verifiers]
    if aggregate is None:
        aggregate = [sum(row[j] for row in scores) / v for j in range(c)]
    runner_up = max((y for j, y in enumerate(aggregate) if j != chosen), default=aggregate[chosen])
    return Round(
        k=k,
        members=tuple(members),
        active=active,
        verifiers=verifiers,
        candidates=candidates,
        raw_scores=_matrix(raw_scores if raw_scores is not None else [[1.0] * c for _ in verifiers]),
        scores=_matrix(scores),
        aggregate=tuple(aggregate),
        chosen=chosen,
        margin=margin if margin is not None else aggregate[chosen] - runner_up,
        weights_before=tuple(weights_before if weights_before is not None else (1.0 / n,) * n),
        weights_after=tuple(weights_after if weights_after is not None else (1.0 / n,) * n),
        rewards=tuple(rewards if rewards is not None else (0.0,) * c),
        exits=tuple(exits),
        timings=tuple(timings if timings is not None else (MemberTiming(m, 0.0, 0.0, 0.0) for m in members)),
        seconds=seconds,
        elapsed=elapsed if elapsed is not None else seconds * k,
        text=text if text is not None else before + texts[chosen],
        stop_reason=stop_reason,
        eligible=tuple(eligible),
        token_scores=tuple(tuple(row) for row in token_scores),
    )


def hand_run(winners: Sequence[str], *, members: Sequence[str] = ("a", "b"), **kwargs: object) -> list[Round]:
    """Consecutive rounds whose chosen candidates are `winners`; the last one stops ("final")."""
    rounds: list[Round] = []
    answer = ""
    for k, winner in enumerate(winners, start=1):
        last = k == len(winners)
        texts = [winner if m == members[0] else f"{m}{k} " for m in members]
        r = hand_round(
            k,
            members=members,
            texts=texts,
            before=answer,
            final=last,
            stop_reason="final" if last else None,
            **kwargs,
        )  # type: ignore[arg-type]
        answer = r.text
        rounds.append(r)
    return rounds


def _matrix(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(x) for x in row) for row in rows)
