"""The ceiling of an ensemble on one set: what its members could gain together at most, and where
the ensemble gained and lost against its best member.

- per member: accuracy alone (Wilson interval);
- the oracle: the share of problems at least one member got right; β, the co-failure rate: the share
  all got wrong together. On the problems every member answered oracle = 1 − β, and any selector
  that picks one member's answer scores at most that (a segment-level ensemble can write an answer
  no member wrote, so it may pass it: then it found something new, which the table shows);
- pairwise co-failure: for each pair of members, the share both got wrong (and, of the problems
  either got wrong, the share both did: how much their failures overlap);
- discordance with the best member: per ensemble system, the problems it got right and the best
  member wrong, and the reverse, each share with a Wilson interval, their difference with a paired
  (Wald) interval, and the exact McNemar p.

Pure functions on Outcome lists (stdlib only, with .stats); knows nothing about models or files.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .stats import mcnemar_exact, wilson

if TYPE_CHECKING:
    from .problems import Outcome

SINGLE = "single-"
_SELF_CONSISTENCY = re.compile(r"sc\d+-")


def _is_ensemble(system: str) -> bool:
    return not system.startswith(SINGLE) and not _SELF_CONSISTENCY.match(system)


def paired_difference_interval(only_a: int, only_b: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % interval of a paired difference of proportions (only_a − only_b) / n: the Wald
    interval of McNemar's setting, se = √(b + c − (b − c)² / n) / n; (−1, 1) when n is 0."""
    if n <= 0:
        return -1.0, 1.0
    d = (only_a - only_b) / n
    se = math.sqrt(max(0.0, only_a + only_b - (only_a - only_b) ** 2 / n)) / n
    return max(-1.0, d - z * se), min(1.0, d + z * se)


def ceiling(outcomes: Sequence[Outcome]) -> dict[str, Any] | None:
    """The ceiling figures of a graded study (the module's docstring); None with fewer than two
    members that ran alone (nothing to combine). Figures are on the problems every member answered;
    each ensemble's discordance is on the problems it and the best member both answered."""
    by: dict[str, dict[str, bool]] = {}
    for o in outcomes:
        by.setdefault(o.system, {})[o.problem] = bool(o.correct)
    members = [s for s in by if s.startswith(SINGLE)]
    if len(members) < 2:
        return None
    shared = sorted(set.intersection(*(set(by[m]) for m in members)))
    n = len(shared)
    right = {m: [by[m][p] for p in shared] for m in members}
    rows = []
    for m in members:
        k = sum(right[m])
        low, high = wilson(k, n)
        rows.append({"member": m.removeprefix(SINGLE), "correct": k, "accuracy": k / n if n else 0.0})
        rows[-1] |= {"ci_low": low, "ci_high": high}
    reached = sum(any(right[m][i] for m in members) for i in range(n))
    all_wrong = n - reached
    best = max(members, key=lambda m: (sum(right[m]), -members.index(m)))
    pairs = _pairs(members, right, n)
    discordance = _discordance(by, best)
    o_low, o_high = wilson(reached, n)
    b_low, b_high = wilson(all_wrong, n)
    return {
        "problems": n,
        "members": rows,
        "best_member": best.removeprefix(SINGLE),
        "oracle": reached / n if n else 0.0,
        "oracle_correct": reached,
        "oracle_low": o_low,
        "oracle_high": o_high,
        "beta": all_wrong / n if n else 0.0,
        "all_wrong": all_wrong,
        "beta_low": b_low,
        "beta_high": b_high,
        "pairs": pairs,
        "discordance": discordance,
    }


def _pairs(members: Sequence[str], right: dict[str, list[bool]], n: int) -> list[dict[str, Any]]:
    """Each pair of members: how often both were wrong, and the overlap of their failures."""
    pairs = []
    for a, b in itertools.combinations(members, 2):
        both = sum(not x and not y for x, y in zip(right[a], right[b]))
        either = sum(not x or not y for x, y in zip(right[a], right[b]))
        low, high = wilson(both, n)
        pairs.append(
            {
                "a": a.removeprefix(SINGLE),
                "b": b.removeprefix(SINGLE),
                "both_wrong": both,
                "co_failure": both / n if n else 0.0,
                "ci_low": low,
                "ci_high": high,
                "overlap": both / either if either else 0.0,  # of the problems either got wrong
            }
        )
    return pairs


def _discordance(by: dict[str, dict[str, bool]], best: str) -> list[dict[str, Any]]:
    """Each ensemble system against the best member, on the problems both answered."""
    rows = []
    for system in (s for s in by if _is_ensemble(s)):
        common = [p for p in by[system] if p in by[best]]
        size = len(common)
        gained = sum(by[system][p] and not by[best][p] for p in common)
        lost = sum(not by[system][p] and by[best][p] for p in common)
        correct = sum(by[system][p] for p in common)
        g_low, g_high = wilson(gained, size)
        l_low, l_high = wilson(lost, size)
        d_low, d_high = paired_difference_interval(gained, lost, size)
        rows.append(
            {
                "system": system,
                "best_member": best.removeprefix(SINGLE),
                "problems": size,
                "accuracy": correct / size if size else 0.0,
                "gained": gained,  # right where the best member was wrong
                "gained_low": g_low,
                "gained_high": g_high,
                "lost": lost,  # wrong where the best member was right
                "lost_low": l_low,
                "lost_high": l_high,
                "difference": (gained - lost) / size if size else 0.0,
                "difference_low": d_low,
                "difference_high": d_high,
                "p_value": mcnemar_exact(gained, lost),
            }
        )
    return rows


def ceiling_lines(found: dict[str, Any]) -> list[str]:
    """The ceiling in a few plain sentences (a console, the app's failure browser)."""
    n = found["problems"]
    members = ", ".join(
        f"{r['member']} {r['correct']}/{n} ({r['accuracy']:.1%}, {r['ci_low']:.1%}–{r['ci_high']:.1%})"
        for r in found["members"]
    )
    lines = [
        f"Members alone on the {n} problems all answered: {members}.",
        f"Oracle (at least one member right): {found['oracle_correct']}/{n} = {found['oracle']:.1%} "
        f"({found['oracle_low']:.1%}–{found['oracle_high']:.1%}); β (all wrong together): "
        f"{found['all_wrong']}/{n} = {found['beta']:.1%}, so a selector of whole answers scores at most "
        f"{1 - found['beta']:.1%}.",
    ]
    lines += [
        f"Co-failure {p['a']} & {p['b']}: both wrong on {p['both_wrong']}/{n} = {p['co_failure']:.1%} "
        f"({p['overlap']:.0%} of the problems either got wrong)."
        for p in found["pairs"]
    ]
    lines += [
        f"{d['system']} against {d['best_member']} ({d['problems']} problems): right where it was wrong "
        f"{d['gained']} ({d['gained_low']:.1%}–{d['gained_high']:.1%}), wrong where it was right "
        f"{d['lost']} ({d['lost_low']:.1%}–{d['lost_high']:.1%}); difference {d['difference']:+.1%} "
        f"({d['difference_low']:+.1%} to {d['difference_high']:+.1%}), McNemar p = {d['p_value']:.3g}."
        for d in found["discordance"]
    ]
    return lines
