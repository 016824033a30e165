"""Rule comparison: which candidate each selection rule would have chosen on one round's scores.

Pure: it reads a recorded Round (raw scores, weights, token-level evidence) and re-runs only the
choice, never a model, so the app can show the effect of a rule without running anything again.
Each rule judges the scores it is defined on: the run's own recorded z_ij, or mean logits or mean
log-probs rebuilt from the token-level evidence when the run recorded the other kind; each choice
says which it used. Knows nothing about members or tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import feedback
from .errors import ConfigError
from .records import Round
from .segments import repeated_fraction

RECORDED = "recorded"  # a rule's score: whatever z_ij the run recorded (its config's score)
SCORE_NAMES = {"logit": "mean logits", "logprob": "mean log-probs"}


@dataclass(frozen=True)
class Rule:
    name: str
    score: str = RECORDED  # which raw scores: the run's recorded z_ij, or "logit" / "logprob" means
    normalization: str = "zsoftmax"
    aggregation: str = "mean"
    self_scores: bool = True
    repeat_penalty: float = 0.0


RULES = (
    Rule("paper: z / Σz of mean logits", score="logit", normalization="sum"),
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
    scores: str = ""  # the raw scores it judged, e.g. "mean logits (from the token evidence)"


def rule_choices(
    rnd: Round, rules: tuple[Rule, ...] = RULES, *, recorded: str | None = None
) -> list[RuleChoice]:
    """What each rule picks among the round's eligible candidates, with the weights it was judged with.

    `recorded` is the score kind the run recorded as z_ij (its config's `score`); None when unknown,
    and then a rule that names a kind always rebuilds it from the token-level evidence.
    """
    if not rnd.verified:  # taken unscored (config verify): a lone draft is every rule's choice
        if len(rnd.candidates) == 1:
            lone = rnd.candidates[0].member
            return [RuleChoice(r.name, 0, lone, "", "no scores: a lone draft") for r in rules]
        return [RuleChoice(r.name, None, None, "not verified: the drafts agreed", "no scores") for r in rules]
    out = []
    for rule in rules:
        try:
            raw, used = raw_scores(rnd, rule.score, recorded)
        except ValueError as e:
            out.append(RuleChoice(rule.name, None, None, str(e), _label(rule.score, recorded, False)))
            continue
        try:
            chosen = _choose(rnd, rule, raw)
        except (ConfigError, ValueError) as e:
            out.append(RuleChoice(rule.name, None, None, str(e).split(";")[0], used))
            continue
        out.append(RuleChoice(rule.name, chosen, rnd.candidates[chosen].member, "", used))
    return out


def _label(score: str, recorded: str | None, rebuilt: bool) -> str:
    if score == RECORDED:
        return f"recorded {SCORE_NAMES[recorded]}" if recorded in SCORE_NAMES else "recorded scores"
    return f"{SCORE_NAMES[score]} (from the token evidence)" if rebuilt else f"recorded {SCORE_NAMES[score]}"


def raw_scores(rnd: Round, score: str, recorded: str | None = None) -> tuple[list[list[float]], str]:
    """The [verifiers][candidates] z_ij a rule judges, and what they are.

    The recorded matrix when it is of that kind; else each verifier's mean over its token-level
    evidence (the same mean the engine takes). ValueError when the round holds neither.
    """
    if score in (RECORDED, recorded):
        return [list(row) for row in rnd.raw_scores], _label(score, recorded, False)
    if score not in SCORE_NAMES:
        raise ValueError(f"unknown score {score!r}; known: {RECORDED}, {', '.join(SCORE_NAMES)}")
    values = "logprobs" if score == "logprob" else "logits"
    if not rnd.token_scores or any(not getattr(d, values) for row in rnd.token_scores for d in row):
        how = "run with score logprob" if score == "logprob" else "older traces and served members lack them"
        raise ValueError(f"{SCORE_NAMES[score]} were not recorded for this round ({how})")
    return [[d.mean(score) for d in row] for row in rnd.token_scores], _label(score, recorded, True)


def choose_by(rnd: Round, rule: Rule, *, recorded: str | None = None) -> int:
    """The candidate `rule` picks on this round (ValueError or ConfigError when it cannot judge)."""
    return _choose(rnd, rule, raw_scores(rnd, rule.score, recorded)[0])


def _choose(rnd: Round, rule: Rule, raw: list[list[float]]) -> int:
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
