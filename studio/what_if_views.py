"""What if another candidate had won? Pure views of one round's alternatives: which candidate each
selection rule would have chosen, the evidence dropdowns' choices, and a branch's answer beside the
run's, marked from where they part. Every piece of model text that reaches HTML is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from specfuse import Round, report, rules

from .i18n import _
from .untrusted import esc

RULE_COLUMNS = ["rule", "judged on", "would choose", "candidate", "as recorded"]


def rules_value(rnd: Round | None, score: str | None = None) -> pd.DataFrame:
    """Which candidate each selection rule would have chosen on this round, and on which scores.

    `score` is the kind of z_ij the run recorded (its config's score): a rule defined on the other
    kind (the paper's on mean logits) is judged on that kind, rebuilt from the token evidence.
    """
    if rnd is None:
        return pd.DataFrame(columns=[_(c) for c in RULE_COLUMNS])
    rows = [
        {
            "rule": c.rule,
            "judged on": c.scores,
            "would choose": c.member if c.member is not None else _("— (cannot judge)"),
            "candidate": rnd.candidates[c.chosen].text if c.chosen is not None else f"({c.note})",
            "as recorded": CHECK if c.chosen == rnd.chosen else "",
        }
        for c in rules.rule_choices(rnd, recorded=score)
    ]
    return pd.DataFrame(rows, columns=RULE_COLUMNS).rename(columns=_)


CHECK = report.CHOSEN_MARK


def pair_choices(rnd: Round | None) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(verifier choices, candidate choices) for the evidence dropdowns: labels with their indices."""
    if rnd is None:
        return [], []
    verifiers = [(v, i) for i, v in enumerate(rnd.verifiers)]
    candidates = [
        (f"{j + 1}. {c.member}{' ✓' if j == rnd.chosen else ''}: {c.text[:40]!r}", j)
        for j, c in enumerate(rnd.candidates)
    ]
    return verifiers, candidates


def parting_round(original: Sequence[Round], branch: Sequence[Round]) -> int | None:
    """The first round whose answer differs between the two runs; None while they agree."""
    for a, b in zip(original, branch):
        if a.text != b.text:
            return a.k
    if len(original) != len(branch) and branch and branch[-1].stop_reason is not None:
        return min(len(original), len(branch)) + 1  # one run ended, the other went on
    return None


NUMERICS = (
    "The branch forced the very candidate the run chose in round {k}, yet the answers part at round "
    "{part}: the difference comes from numerics, not from the choice. A branch recomputes the shared "
    "answer in one pass where the run built it step by step, and the two round differently (most in "
    "bf16, the app's default on CPU): a later close choice can tip."
)


def branch_html(original: Sequence[Round], branch: Sequence[Round], k: int, origin: str, forced: str) -> str:
    """The original and the branched answer side by side; each one's part from where they part is marked.

    `branch` holds the branch's rounds so far (the original's rounds before k, then its own). When
    the forced text is the one the run chose and the answers still differ, says that numerics, not
    the choice, made the difference. Every piece is escaped.
    """
    part = parting_round(original, branch)
    shared = original[part - 2].text if part is not None and part > 1 else ""
    if part is None:
        shared = branch[-1].text if branch else ""

    def column(title: str, text: str) -> str:
        own = text[len(shared) :] if text.startswith(shared) else text
        kept = text[: len(text) - len(own)]
        return (
            f'<div class="sf-compare-col"><h4>{esc(title)}</h4><pre class="sf-answer">{esc(kept)}'
            f'<mark class="sf-parted">{esc(own)}</mark></pre></div>'
        )

    done = bool(branch) and branch[-1].stop_reason is not None
    same = k <= len(original) and forced == original[k - 1].winner.text
    if part is None and done:
        head = (
            f"The branch reproduces the original answer: forcing <b>{esc(origin)}</b>'s segment in "
            f"round {k} changed nothing."
        )
    elif part is None:
        head = f"So far the branch (round {len(branch)}) follows the original."
    elif same and part > k:
        head = esc(NUMERICS.format(k=k, part=part))
    else:
        head = (
            f"The answers part at round {part} (marked): the branch forced a segment from "
            f"<b>{esc(origin)}</b> in round {k}."
        )
    texts = (original[-1].text if original else "", branch[-1].text if branch else "")
    return (
        f"<p class='sf-branch-note'>{head}</p><div class='sf-compare'>"
        f"{column('original', texts[0])}{column(f'branch from round {k}', texts[1])}</div>"
    )
