"""The numbers the app and reports show that the Round records lack: per-member tables, status, history.

Pure functions of Rounds into plain values and pandas DataFrames. Knows nothing about Gradio,
Plotly, colours or models, and never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from .records import Draft, Round, summarize

CANDIDATE_COLUMNS = ["member", "text", "tokens", "final", "eligible", "score", "reward", "chosen"]
SUMMARY_COLUMNS = [
    "member",
    "segments won",
    "share of segments",
    "tokens",
    "share of tokens",
    "mean score given",
    "mean score received",
    "mean self score",
    "final weight",
    "exited after round",
]
EXIT_COLUMNS = ["member", "round", "keep probability", "threshold", "reason"]
CHOSEN_MARK = "✓"


@dataclass(frozen=True)
class Status:
    """What the status line shows after a round."""

    round: int  # rounds played so far
    tokens: int  # Σ of the chosen candidates' num_tokens
    seconds: float  # since the run started
    tokens_per_s: float  # tokens / seconds (0.0 before any time has passed)
    first_segment_latency_s: float  # end of round 1, from the start of the run
    calls_made: int  # draft + verify calls made
    calls_saved: int  # draft + verify calls that exited members did not make
    stop_reason: str | None  # None while running; "cancelled" is never reported here


def status(rounds: Sequence[Round]) -> Status:
    """The status numbers after the last of `rounds` (a run in progress or finished)."""
    if not rounds:
        return Status(0, 0, 0.0, 0.0, 0.0, 0, 0, None)
    result = summarize(rounds)
    seconds = rounds[-1].elapsed
    return Status(
        round=rounds[-1].k,
        tokens=result.tokens,
        seconds=seconds,
        tokens_per_s=result.tokens / seconds if seconds > 0 else 0.0,
        first_segment_latency_s=result.first_segment_latency_s,
        calls_made=result.draft_calls + result.verify_calls,
        calls_saved=result.calls_saved_by_exit,
        stop_reason=rounds[-1].stop_reason,
    )


def candidates_table(rnd: Round) -> pd.DataFrame:
    """One row per candidate of one round: drafter, text, tokens, aggregate score y_j, reward, chosen.

    "eligible" is False for a candidate the engine would not choose (an empty draft, a prompt echo,
    the next copy of a loop under the loop guard).
    """
    eligible = rnd.eligible or (True,) * len(rnd.candidates)  # () in hand-built records means all
    rows = [
        {
            "member": c.member,
            "text": c.text,
            "tokens": c.num_tokens,
            "final": c.final,
            "eligible": eligible[j],
            "score": rnd.aggregate[j],
            "reward": rnd.rewards[j],
            "chosen": CHOSEN_MARK if j == rnd.chosen else "",
        }
        for j, c in enumerate(rnd.candidates)
    ]
    return pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)


def arriving_table(drafts: Sequence[Draft]) -> pd.DataFrame:
    """The candidates of a round still being drafted, in the order they arrived: the columns of
    candidates_table, with the verdict (score, reward, chosen) still blank."""
    rows = [
        {"member": d.candidate.member, "text": d.candidate.text, "tokens": d.candidate.num_tokens,
         "final": d.candidate.final, "eligible": True, "score": math.nan, "reward": math.nan, "chosen": ""}
        for d in drafts
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)


def score_matrix(rnd: Round, normalized: bool = True) -> pd.DataFrame:
    """The verification matrix of one round: rows = verifiers (i), columns = candidates' drafters (j)."""
    values = rnd.scores if normalized else rnd.raw_scores
    return pd.DataFrame(
        [list(row) for row in values],
        index=pd.Index(rnd.verifiers, name="verifier"),
        columns=pd.Index([c.member for c in rnd.candidates], name="candidate"),
    )


def weights_history(rounds: Sequence[Round]) -> pd.DataFrame:
    """Long table (round, member, weight): round 0 = the starting weights, round k = after its feedback."""
    if not rounds:
        return pd.DataFrame(columns=["round", "member", "weight"])
    first = rounds[0]
    rows = [{"round": 0, "member": m, "weight": w} for m, w in zip(first.members, first.weights_before)]
    rows += [
        {"round": r.k, "member": m, "weight": w} for r in rounds for m, w in zip(r.members, r.weights_after)
    ]
    return pd.DataFrame(rows, columns=["round", "member", "weight"])


def exit_points(rounds: Sequence[Round]) -> pd.DataFrame:
    """Where each exit sits on the weights chart: (round, member, weight after that round)."""
    rows = [
        {"round": r.k, "member": e.member, "weight": r.weights_after[r.members.index(e.member)]}
        for r in rounds
        for e in r.exits
    ]
    return pd.DataFrame(rows, columns=["round", "member", "weight"])


def exit_table(rounds: Sequence[Round]) -> pd.DataFrame:
    """Every member that left the drafting set: after which round, its keep-probability, and why."""
    rows = [
        {
            "member": e.member,
            "round": e.k,
            "keep probability": e.keep_probability,
            "threshold": e.threshold,
            "reason": e.reason,
        }
        for r in rounds
        for e in r.exits
    ]
    return pd.DataFrame(rows, columns=EXIT_COLUMNS)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def member_summary(rounds: Sequence[Round]) -> pd.DataFrame:
    """One row per member: share of winning segments and of tokens, normalized scores given and received.

    "Given" is the mean ŝ a member as verifier gave the *other* members' candidates; "received" the
    mean ŝ its candidates got from the *other* verifiers; its score of its own candidates is shown
    apart ("self"), so that self-preference is visible. NaN where a member never had the role.
    """
    if not rounds:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    members = rounds[-1].members
    won = dict.fromkeys(members, 0)
    tokens = dict.fromkeys(members, 0)
    given: dict[str, list[float]] = {m: [] for m in members}
    received: dict[str, list[float]] = {m: [] for m in members}
    own: dict[str, list[float]] = {m: [] for m in members}
    exited: dict[str, int | None] = dict.fromkeys(members)
    for r in rounds:
        if r.winner.member in won:  # a typed segment (a branch) is no member's
            won[r.winner.member] += 1
            tokens[r.winner.member] += r.winner.num_tokens
        for i, verifier in enumerate(r.verifiers):
            for j, c in enumerate(r.candidates):
                s = r.scores[i][j]
                if c.member == verifier:
                    own[verifier].append(s)
                else:
                    given[verifier].append(s)
                    received.setdefault(c.member, []).append(s)
        for e in r.exits:
            exited[e.member] = e.k
    total_tokens = sum(tokens.values())
    weights = dict(zip(members, rounds[-1].weights_after))
    rows = [
        {
            "member": m,
            "segments won": won[m],
            "share of segments": won[m] / len(rounds),
            "tokens": tokens[m],
            "share of tokens": tokens[m] / total_tokens if total_tokens else 0.0,
            "mean score given": _mean(given[m]),
            "mean score received": _mean(received[m]),
            "mean self score": _mean(own[m]),
            "final weight": weights[m],
            "exited after round": exited[m],
        }
        for m in members
    ]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def token_shades(tokens: Sequence[str], values: Sequence[float]) -> list[tuple[str, float, float]]:
    """(token, value, shade) per token: shade in 0..1 is the value's place between the candidate's
    lowest (0) and highest (1) token value; 0.5 for all when they are equal."""
    if not values:
        return []
    low, high = min(values), max(values)
    span = high - low
    return [(t, v, (v - low) / span if span > 0 else 0.5) for t, v in zip(tokens, values)]
