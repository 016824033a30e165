"""The plain records one run produces: Candidate, ExitEvent, MemberTiming, Round and Result (and
a served request's stream: Queued, Draft, Paused, Finished).

Stdlib only: frozen dataclasses of str, int, float, bool and tuples, so that every view (app, CLI,
trace file, benchmarks, evaluation) can consume them without torch. Knows nothing about models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Why a run ended. A Round carries one of the engine's (final: a drafter's end of turn; budget:
# max_new_tokens; stop: a stop string; rounds: max_rounds; empty: every draft came back empty);
# a Result adds "cancelled" when the consumer closed the stream before the engine stopped.
ROUND_STOP_REASONS = ("final", "budget", "stop", "rounds", "empty")
STOP_REASONS = (*ROUND_STOP_REASONS, "cancelled")
# The drafter named by a text given to be scored (the API's echo): the one candidate of a round
# nobody drafted, scored by every member.
ECHO = "echo"


@dataclass(frozen=True)
class Confidence:
    """How sure a drafter was of its own candidate, from the values it drafted it with (no extra
    pass): over the tokens it decoded and kept (a final draft: its end marker too). Higher is surer
    for all three; config.GATE_MEASURES names them, the gated round (specfuse/engine/gate.py) reads one."""

    mean_logprob: float  # mean log-probability of those tokens
    min_prob: float  # probability of the least likely of them
    margin: float  # least margin, in nats, of a token's log-probability over the runner-up's there
    tokens: int  # how many tokens these values cover

    def measure(self, name: str) -> float:
        return float(getattr(self, name))


@dataclass(frozen=True)
class Candidate:
    member: str  # who drafted it (the paper's j)
    text: str  # the segment exactly as it would be appended to the answer
    num_tokens: int  # length in the drafter's own tokenizer
    final: bool  # ended at the drafter's end-of-turn token or a stop string
    seconds: float  # wall time of this draft
    reused_tokens: int = 0  # tokens taken over from this drafter's previous, trimmed draft (not decoded)
    confidence: Confidence | None = None  # None: its back end does not tell (a served model)


@dataclass(frozen=True)
class Gate:
    """A round under the gate (config.gate): the gatekeeper drafted first, and its confidence in its
    segment was held against the threshold. Passed: the segment was taken alone (a gated round: the
    others neither drafted nor verified, and nobody earned a reward or exited); else the full round
    ran, the gatekeeper's draft among the candidates."""

    member: str  # the gatekeeper
    measure: str  # one of config.GATE_MEASURES
    confidence: float | None  # its segment's value of `measure`; None when its back end gives none
    threshold: float
    passed: bool
    reason: str  # one sentence: why the others were (not) asked


@dataclass(frozen=True)
class Draft:
    """A candidate as it arrives, before its round is decided (Ensemble.events): what a person
    watches while the slower members are still drafting. The Round that follows carries it too."""

    k: int  # the round it belongs to
    candidate: Candidate
    elapsed: float  # seconds since the run started, the prompt's prefill included


@dataclass(frozen=True)
class Queued:
    """A request waiting for a place in the scheduler's batch: `place` 1 joins next. Sent each time
    the place changes, only while the request really waits (more are ahead than the batch has room)."""

    place: int


@dataclass(frozen=True)
class Paused:
    """A step-mode request (the scheduler's submit(step=True)) waits after round `k` for its
    ticket's next(); it holds no member caches meanwhile, only its rounds."""

    k: int  # the round after which it waits


@dataclass(frozen=True)
class Finished:
    """A request's stream ends: "done" after its last round (stop_reason set), or "cancelled". A
    request that fails ends with its error raised instead."""

    state: str


@dataclass(frozen=True)
class TokenScores:
    """One verifier's token-level evidence on one candidate: the values behind z_ij.

    `tokens` is the candidate as *this verifier* tokenized it in context (decoded piece by piece),
    followed by the verifier's end marker when the candidate is final; z_ij is the mean of
    `logits` (score "logit") or of `logprobs` (score "logprob") over them.
    """

    tokens: tuple[str, ...]
    logits: tuple[float, ...]  # raw logit of each token
    logprobs: tuple[float, ...]  # log-probability of each token (same length)
    # Asked for by a request that wants log-probabilities with alternatives (top_logprobs): at each
    # token's position, this verifier's k likeliest tokens as (decoded piece, log-probability),
    # likeliest first; () when not asked.
    top: tuple[tuple[tuple[str, float], ...], ...] = ()

    def mean(self, score: str) -> float:
        """z_ij: the mean of the per-token values the score mode names ("logit" or "logprob")."""
        values = self.logprobs if score == "logprob" else self.logits
        return sum(values) / len(values)


@dataclass(frozen=True)
class Branch:
    """Where a branched run leaves its parent: round k was forced to `text` instead of the parent's
    winner; rounds < k are the parent's."""

    parent: str  # the parent trace's id
    k: int  # the round that was forced
    text: str  # the forced segment
    origin: str  # the member whose candidate was forced, or "you" for a typed segment


@dataclass(frozen=True)
class ExitEvent:
    member: str  # who left the drafting set
    k: int  # the round after which it left
    keep_probability: float  # p_i = softmax(Q / τ_k)_i when it left
    threshold: float  # δ / |A_k|, the bar p_i fell under
    reason: str  # one human sentence, shown in the app and the CLI


@dataclass(frozen=True)
class MemberTiming:
    member: str
    draft_s: float  # 0.0 when it did not draft this round
    verify_s: float  # 0.0 when it did not verify this round
    accept_s: float  # appending the chosen candidate (and what it had missed, Batch._catch_up) to its state


@dataclass(frozen=True)
class Round:
    k: int  # round number, from 1
    members: tuple[str, ...]  # all N members, in ensemble order; weights align with this
    active: tuple[str, ...]  # A_k: members that drafted this round, in ensemble order
    verifiers: tuple[str, ...]  # members that scored this round (rows of the matrices)
    candidates: tuple[Candidate, ...]  # [len(active)], same order as active
    raw_scores: tuple[tuple[float, ...], ...]  # [verifiers][candidates]: z_ij
    scores: tuple[tuple[float, ...], ...]  # same shape, each row normalized: ŝ_ij
    aggregate: tuple[float, ...]  # [candidates]: y_j, the votes ŝ_ij combined by weight (config.aggregation)
    chosen: int  # index into candidates: argmax y_j, ties to the lowest index
    margin: float  # y_chosen minus the runner-up's y (0.0 with one candidate)
    weights_before: tuple[float, ...]  # [members]: the w_i this round was judged with
    weights_after: tuple[float, ...]  # [members]: after this round's feedback
    rewards: tuple[float, ...]  # [candidates]: r_j of each drafter this round (0.0 with feedback off)
    exits: tuple[ExitEvent, ...]  # members that left the drafting set after this round
    timings: tuple[MemberTiming, ...]  # [members]: per-member, per-phase wall time
    seconds: float  # wall time of the whole round
    elapsed: float  # seconds since the run started, at the end of this round
    text: str  # the whole answer after this round
    stop_reason: str | None  # None while running, else one of ROUND_STOP_REASONS
    eligible: tuple[bool, ...] = ()  # [candidates]: could be chosen (empty drafts and prompt echoes
    # cannot); () in hand-built records means all
    token_scores: tuple[tuple[TokenScores, ...], ...] = ()  # [verifiers][candidates]; () when not kept
    # False: a lone draft (config verify="contested", the default) or drafts that agreed ("disagree")
    # was taken without scoring, so this round has no verifiers, no matrices and no feedback
    verified: bool = True
    gate: Gate | None = None  # the gate's decision, in a round played under it (config.gate)

    @property
    def gated(self) -> bool:
        """The gatekeeper was sure: its segment was taken without asking the others."""
        return self.gate is not None and self.gate.passed

    @property
    def winner(self) -> Candidate:
        return self.candidates[self.chosen]

    @property
    def next_drafters(self) -> tuple[str, ...]:
        """Who drafts the round after this one: its drafters, less those who exited after it."""
        gone = {e.member for e in self.exits}
        return tuple(m for m in self.active if m not in gone)


@dataclass(frozen=True)
class Result:
    answer: str
    stop_reason: str  # one of STOP_REASONS
    rounds: int
    tokens: int  # Σ of the chosen candidates' num_tokens
    draft_calls: int  # Σ_k |A_k|
    verify_calls: int  # Σ_k |verifiers_k|
    calls_saved_by_exit: int  # draft + verify calls that exited members did not make
    first_segment_latency_s: float  # from the start of the run to the end of round 1
    seconds: float  # whole run
    wins: tuple[tuple[str, int], ...]  # (member, segments won), in ensemble order


def summarize(rounds: Sequence[Round]) -> Result:
    """The Result of a run, computed from its rounds (the last one carries the stop reason)."""
    if not rounds:
        raise ValueError("a run has at least one round")
    last = rounds[-1]
    n = len(last.members)
    wins = {m: 0 for m in last.members}
    for r in rounds:
        if r.winner.member in wins:  # a typed segment (a branch) is no member's win
            wins[r.winner.member] += 1
    return Result(
        answer=last.text,
        stop_reason=last.stop_reason or "cancelled",  # the consumer stopped the stream
        rounds=len(rounds),
        tokens=sum(r.winner.num_tokens for r in rounds),
        draft_calls=sum(len(r.active) for r in rounds),
        verify_calls=sum(len(r.verifiers) for r in rounds),
        calls_saved_by_exit=sum(2 * n - len(r.active) - len(r.verifiers) for r in rounds),
        first_segment_latency_s=rounds[0].elapsed,
        seconds=last.elapsed,
        wins=tuple(wins.items()),
    )


def answer_spans(rounds: Sequence[Round]) -> list[tuple[str, str]]:
    """The answer as (text, member) spans: one per round, the chosen candidate and its drafter."""
    return [(r.winner.text, r.winner.member) for r in rounds]
