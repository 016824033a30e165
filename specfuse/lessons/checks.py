"""What each lesson's trace must show, tested on the records alone (no model, no torch).

Each check reads a Trace and returns the round where the lesson's phenomenon shows (its key round),
or one sentence saying what is missing. `shows` (the package's API) turns that into None or the
sentence; `key_round` gives the round, for a view that opens the lesson there.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence

from ..engine import TYPED
from ..errors import ConfigError
from ..prompts import prompt_text
from ..records import Round
from ..rules import RULES, choose_by
from ..segments import repeated_fraction
from ..trace import Trace

Finding = int | str  # the key round, or what is missing
DOMINANT_SHARE = 0.75  # "wins most rounds": at least three rounds in four
PAPER_RULE = next(rule for rule in RULES if rule.name.startswith("paper"))


def _contested(trace: Trace) -> list[Round]:
    """The rounds the verifiers decided: scored, with two candidates or more."""
    return [r for r in trace.rounds if r.verified and len(r.candidates) > 1 and r.verifiers]


def _pool(r: Round) -> list[int]:
    eligible = r.eligible or (True,) * len(r.candidates)
    return [j for j, ok in enumerate(eligible) if ok] or list(range(len(r.candidates)))


def _wins(trace: Trace) -> Counter[str]:
    return Counter(r.winner.member for r in trace.rounds)


def weak_member_exits(trace: Trace) -> Finding:
    """A member leaves with its keep probability under the threshold, had won fewer segments than
    the leader by then, and drafts in none of the rounds after (which exist)."""
    for r in trace.rounds:
        for e in r.exits:
            later = trace.rounds[r.k :]
            so_far = Counter(x.winner.member for x in trace.rounds[: r.k])
            if (
                e.keep_probability < e.threshold
                and later
                and not any(e.member in x.active for x in later)
                and so_far[e.member] < max(so_far.values())
            ):
                return r.k
    return "no member exits (keep probability under the threshold) and stays out for the rounds after"


def _favourite(row: Sequence[float]) -> int:
    """The candidate a verifier's row scores highest (ties to the first, as the choice breaks them)."""
    return max(range(len(row)), key=lambda j: (row[j], -j))


def weights_move(trace: Trace) -> Finding:
    """A round whose verifiers favour different candidates, after which another member leads the
    weights: feedback moved them far enough to change the order at the top."""
    for r in _contested(trace):
        if len({_favourite(row) for row in r.scores}) < 2:
            continue
        if _favourite(r.weights_after) != _favourite(r.weights_before) and len(set(r.weights_before)) > 1:
            return r.k
    return "no scored round where the verifiers favour different candidates and another member takes the lead"


def _numbers(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\d+(?:\.\d+)?", text))


def digits_differ(trace: Trace) -> Finding:
    """A scored round where candidates state different numbers and the verifiers decide against the
    most trusted member: the winner states a number, was drafted by another member, and the most
    trusted member's own verifier scored it above that member's own candidate."""
    for r in _contested(trace):
        numbers = [_numbers(c.text) for c in r.candidates]
        stating = [j for j, n in enumerate(numbers) if n]
        if len({numbers[j] for j in stating}) < 2 or r.chosen not in stating:
            continue
        trusted = max(range(len(r.members)), key=lambda i: (r.weights_before[i], -i))
        name = r.members[trusted]
        own = [j for j, c in enumerate(r.candidates) if c.member == name]
        if not own or name not in r.verifiers or r.winner.member == name:
            continue
        row = r.scores[r.verifiers.index(name)]
        if row[r.chosen] > row[own[0]]:
            return r.k
    return (
        "no scored round where candidates state different numbers and the most trusted member's own "
        "verifier prefers another member's winning candidate to its own"
    )


def repeat_penalized(trace: Trace) -> Finding:
    """A scored round where the candidate with the best score before the repeat penalty is not the
    one chosen: it repeated more of the answer, and the penalty took it down."""
    strength = trace.config.repeat_penalty
    if not strength:
        return "the repeat penalty is off in this trace"
    for r in _contested(trace):
        if r.stop_reason == "stop":  # the winner was cut at a stop string after the choice
            continue
        before = r.text[: len(r.text) - len(r.winner.text)]
        repeated = [repeated_fraction(before, c.text) for c in r.candidates]
        unpenalized = [y + strength * f for y, f in zip(r.aggregate, repeated)]
        best = max(_pool(r), key=lambda j: (unpenalized[j], -j))
        if best != r.chosen and repeated[best] > repeated[r.chosen]:
            return r.k
    return "no scored round where the repeat penalty changed which candidate won"


def loop_guard_returns(trace: Trace) -> Finding:
    """With the loop guard on, a member that had exited drafts again (the answer ended in a loop)."""
    if not trace.config.loop_guard:
        return "the loop guard is off in this trace"
    gone: set[str] = set()
    for r in trace.rounds:
        if gone & set(r.active):
            return r.k
        gone |= {e.member for e in r.exits}
    return "no exited member drafts again"


def _cjk(text: str) -> int:
    return sum(unicodedata.name(ch, "").startswith("CJK UNIFIED") for ch in text)


def other_language(trace: Trace) -> Finding:
    """A Chinese prompt; in a scored round a member drafts no Chinese at all while the chosen
    candidate is Chinese; that member wins no segment, and the answer is mostly Chinese."""
    if not _cjk(prompt_text(trace.prompt)):
        return "the prompt has no Chinese characters"
    if not trace.rounds:
        return "the trace has no rounds"
    answer = trace.rounds[-1].text
    if _cjk(answer) * 2 < len("".join(answer.split())):
        return "the answer is not mostly Chinese"
    wins = _wins(trace)
    for r in _contested(trace):
        strangers = [c.member for c in r.candidates if not _cjk(c.text)]
        if _cjk(r.winner.text) and strangers and not any(wins[m] for m in strangers):
            return r.k
    return "no scored round where a member drafts no Chinese, wins nothing, and a Chinese candidate wins"


def typed_segment(trace: Trace) -> Finding:
    """A branch whose forced segment was typed (origin "you") and states a number that no member's
    candidate of that round states; the verifiers scored it below a member's candidate (the ensemble
    would not have chosen it), and the ensemble played on after it."""
    b = trace.branch
    if b is None or b.origin != TYPED:
        return f'not a branch with a typed segment (origin "{TYPED}")'
    if b.k > len(trace.rounds):
        return f"the trace ends before round {b.k}, the typed one"
    r = trace.rounds[b.k - 1]
    if r.winner.member != TYPED or r.winner.text != b.text:
        return f"round {b.k} does not take the typed segment"
    members = [j for j, c in enumerate(r.candidates) if c.member != TYPED]
    if not r.verified or not members:
        return f"round {b.k} has no members' candidates scored beside the typed one"
    stated = {n for j in members for n in _numbers(r.candidates[j].text)}
    if not set(_numbers(b.text)) - stated:
        return "the typed segment states no number that the members' candidates do not"
    if r.aggregate[r.chosen] >= max(r.aggregate[j] for j in members):
        return f"in round {b.k} the verifiers scored the typed segment at least as high as every member's"
    if len(trace.rounds) <= b.k:
        return "the run stops at the typed segment: nothing shows how the ensemble continues"
    return b.k


def paper_differs(trace: Trace) -> Finding:
    """A scored round where the paper's rule (z / Σz of mean logits, weighted mean), re-run on the
    recorded evidence and weights, picks another candidate than the run's own rule did."""
    for r in _contested(trace):
        try:
            picked = choose_by(r, PAPER_RULE, recorded=trace.config.score)
        except (ConfigError, ValueError):  # the paper's rule refuses the round, or no evidence kept
            continue
        if r.candidates[picked].text != r.winner.text:  # the same text drafted twice is no difference
            return r.k
    return "no scored round where the paper's rule would pick another text"


def one_member_dominates(trace: Trace) -> Finding:
    """One member wins at least three rounds in four and every other member exits; the key round
    is the one after which the last of them left."""
    if not trace.rounds:
        return "the trace has no rounds"
    top, won = _wins(trace).most_common(1)[0]
    if won < DOMINANT_SHARE * len(trace.rounds):
        most = f"{top}, {won} of {len(trace.rounds)}"
        return f"no member wins {DOMINANT_SHARE:.0%} of the rounds (the most: {most})"
    left = {e.member: r.k for r in trace.rounds for e in r.exits}
    staying = [m for m in trace.members if m != top and m not in left]
    if staying:
        return f"{', '.join(staying)} never exit"
    return max(left[m] for m in trace.members if m != top)


MOVED = 0.02  # "weights that moved": the largest and smallest weight differ by this much at least


def ensemble_at_work(trace: Trace) -> Finding:
    """The round that shows the method at once, for a first picture (the README's screenshot): at
    least three candidates, each scored by every member (a full N×N matrix), a segment won (not an
    empty end), judged with weights
    that have moved from where they started, and the answer so far won by more than one member.
    Of such rounds the latest (the weights have moved most); else what no round has."""
    n = len(trace.members)
    full = [
        r
        for r in _contested(trace)
        if len(r.candidates) == len(r.verifiers) == n >= 3 and r.winner.text.strip()
    ]
    if not full:
        return "no round has three candidates or more, each scored by every member (a full matrix)"
    moved = [r for r in full if max(r.weights_before) - min(r.weights_before) >= MOVED]
    if not moved:
        return f"no full round was judged with weights that moved by {MOVED} or more"
    mixed = [r for r in moved if len({x.winner.member for x in trace.rounds[: r.k]}) > 1]
    if not mixed:
        return "in no such round is the answer so far won by more than one member"
    return mixed[-1].k


def best_member_sure(trace: Trace) -> Finding:
    """The gate at work both ways: a round whose gatekeeper was sure (taken alone) right after one
    where it was not (the others asked); the key round is the first such sure one (one step back
    shows the contrast)."""
    unsure = {r.k for r in trace.rounds if r.gate is not None and not r.gate.passed}
    after = [r for r in trace.rounds if r.gated and r.k - 1 in unsure]
    if not after:
        gated = sum(r.gated for r in trace.rounds)
        return f"no sure round follows an unsure one ({gated} sure, {len(unsure)} unsure)"
    return after[0].k


CHECKS: dict[str, Callable[[Trace], Finding]] = {
    "weak-member-exits": weak_member_exits,
    "weights-move": weights_move,
    "numbers-differ": digits_differ,
    "repeat-penalized": repeat_penalized,
    "loop-guard-returns": loop_guard_returns,
    "chinese-prompt": other_language,
    "typed-wrong-number": typed_segment,
    "paper-vs-ours": paper_differs,
    "best-member-dominates": one_member_dominates,
    "best-member-sure": best_member_sure,
}
