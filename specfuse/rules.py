"""Rule comparison: which candidate each selection rule would have chosen on one round's scores.

Pure: it reads a recorded Round (raw scores, weights, token-level evidence) and re-runs only the
choice, never a model, so the app can show the effect of a rule without running anything again.
Knows nothing about members or tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import feedback
from .errors import ConfigError
from .records import Round
from .segments import repeated_fraction


@dataclass(frozen=True)
class Rule:
    name: str
    score: str = "logit"  # which raw scores: the recorded ones ("logit"), or mean log-probs
    normalization: str = "zsoftmax"
    aggregation: str = "mean"
    self_scores: bool = True
    repeat_penalty: float = 0.0


RULES = (
    Rule("paper: z / Σz of mean logits", normalization="sum"),
    Rule("z-softmax, weighted mean"),
    Rule("min-max, weighted mean", normalization="minmax"),
    Rule("mean log-prob", score="logprob"),
    Rule("without self-scores", self_scores=False),
    Rule("weighted median", aggregation="median"),
    Rule("filtered (SweetSpan-style)", aggregation="filtered"),
    Rule("repeat penalty 0.5", repeat_penalty=0.5),
)


@dataclass(frozen=True)
class RuleChoice:
    rule: str
    chosen: int | None  # candidate index, None when the rule cannot judge this round
    member: str | None  # the chosen candidate's drafter
    note: str  # why it could not judge, or "" (the recorded choice is marked by the view)


def rule_choices(rnd: Round, rules: tuple[Rule, ...] = RULES) -> list[RuleChoice]:
    """What each rule picks among the round's eligible candidates, with the weights it was judged with."""
    out = []
    for rule in rules:
        try:
            chosen = choose_by(rnd, rule)
        except (ConfigError, ValueError) as e:
            out.append(RuleChoice(rule.name, None, None, str(e).split(";")[0]))
            continue
        out.append(RuleChoice(rule.name, chosen, rnd.candidates[chosen].member, ""))
    return out


def choose_by(rnd: Round, rule: Rule) -> int:
    raw = [list(row) for row in rnd.raw_scores]
    if rule.score == "logprob":
        if not rnd.token_scores or any(not d.logprobs for row in rnd.token_scores for d in row):
            raise ValueError("log-probabilities were not recorded for this round (run with score logprob)")
        raw = [[d.mean("logprob") for d in row] for row in rnd.token_scores]
    scores = feedback.normalize(raw, rule.normalization)
    index = {m: i for i, m in enumerate(rnd.members)}
    weights = [rnd.weights_before[index[v]] for v in rnd.verifiers]
    drafters = [c.member for c in rnd.candidates]
    y = feedback.aggregate(scores, weights, rnd.verifiers, drafters, rule.self_scores, rule.aggregation)
    if rule.repeat_penalty:
        before = rnd.text[: len(rnd.text) - len(rnd.winner.text)]
        y = feedback.penalize_repeats(
            y, [repeated_fraction(before, c.text) for c in rnd.candidates], rule.repeat_penalty
        )
    eligible = rnd.eligible or (True,) * len(rnd.candidates)
    pool = [j for j, ok in enumerate(eligible) if ok] or list(range(len(rnd.candidates)))
    return feedback.choose(y, pool)[0]
