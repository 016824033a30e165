"""What each panel shows, in plain words, and where a lesson's "look for" note sits beside it.

`WHAT_THIS_SHOWS` holds one short explanation per panel for a student on their own (correct per
docs/method.md); `Notes` places, right under each panel, a closed "What this shows" accordion and
an empty "look for" note that an opened lesson fills (studio.gallery). Knows nothing about runs.
"""

from __future__ import annotations

from collections.abc import Mapping

import gradio as gr

from .untrusted import md

PANELS = ("answer", "candidates", "matrix", "weights", "exits")  # the panels a lesson may point at

WHAT_THIS_SHOWS: dict[str, str] = {
    "answer": (
        "The answer, built one short segment per round. In every round each member drafts a "
        "continuation, all of them judge all the drafts, and the best one is appended to the answer "
        "for everyone. Each segment is coloured by the member whose candidate won that round (the "
        "legend names them): the answer is exactly the winning segments, joined. Click a segment to "
        "see the candidates it beat."
    ),
    "candidates": (
        "This round's candidates: each member still drafting continued the answer so far by at most "
        "L tokens (the segment length), cut back to a whole word. One row per candidate: who drafted "
        "it, its text, its **score** (the verifiers' votes combined by their weights) and whether it "
        "was **chosen** ✓. A candidate that is not **eligible** cannot win whatever its score (an "
        "empty draft, or one that only copies the prompt). **reward** is what its drafter earned for "
        "the weights. The eligible candidate with the highest score is appended."
    ),
    "matrix": (
        "The verification matrix: every member reads every candidate, as a **verifier**. One row per "
        "verifier, one column per candidate (named by its drafter). A cell says how natural verifier "
        "i finds candidate j after the answer so far: the mean log-probability of the candidate's "
        "tokens in that verifier's own tokenizer (or, with the paper's setting, the mean raw logit). "
        "Brighter is better. The boxed column, ✓, won. A round with one draft, or with drafts that "
        "agreed, is not verified: there is nothing to compare, and the panel says so."
    ),
    "normalization": (
        "Each model scores on its own scale: one model's numbers may all run higher than another's. "
        "So before the votes are combined, each verifier's row is **normalized** over the "
        "candidates. The default, `zsoftmax`, turns a row into z-scores and then a softmax: the row "
        "sums to 1, and only how that verifier ranks the candidates, and by how much, still counts, "
        "not its scale or offset. With two candidates a row keeps only the order (0.12 / 0.88). "
        "*normalized ŝ* shows these numbers; *raw z* the scores before normalizing."
    ),
    "weights": (
        "How much each member's vote counts (its weight w). Weights start from each member's trust "
        "(its accuracy alone on development sets) or equal, and always sum to 1. After each round a "
        "member earns a reward for how often the other verifiers scored its candidate at least as "
        "high as the others, and its weight is multiplied by exp(η·reward) and renormalized; the "
        "step η shrinks as the rounds go on. Round k is judged with the weights learned before it. "
        "✕ marks a member leaving (model exit)."
    ),
    "exits": (
        "Members that left (model exit), after which round, and why. The scores each member's "
        "candidates received are added up over the rounds and turned into a keep-probability p "
        "(a softmax that stays flat while the history is still even, so early rounds hold exits "
        "back). After the warm-up rounds a "
        "member whose p falls below the threshold δ divided by the number of members drafting stops "
        "drafting (and, by default, verifying). The leader never exits and at least one member keeps "
        "drafting. The calls an exited member does not make are the *calls saved* on the status line."
    ),
}


class Notes:
    """Under each panel: a closed "What this shows" accordion and a lesson's "look for" note (hidden
    until a lesson fills it). `place(name)` is called right after the panel is built."""

    def __init__(self) -> None:
        self.look: dict[str, gr.Markdown] = {}

    def place(self, name: str) -> None:
        if name in PANELS:
            self.look[name] = gr.Markdown(
                visible=False, elem_id=f"class-look-{name}", elem_classes=["sf-look"]
            )
        title = "What normalization does" if name == "normalization" else "What this shows"
        with gr.Accordion(title, open=False, elem_id=f"class-explain-{name}"):
            gr.Markdown(WHAT_THIS_SHOWS[name], elem_classes=["sf-explain"])

    def outputs(self) -> list[gr.components.Component]:
        return list(self.look.values())

    def values(self, look_for: Mapping[str, str] | None) -> dict[gr.components.Component, object]:
        """Each note: a lesson's text for its panel, shown; without a lesson (or a text), hidden."""
        look_for = look_for or {}
        return {
            note: gr.Markdown(f"**Look for:** {md(look_for[name])}", visible=True)
            if look_for.get(name)
            else gr.Markdown("", visible=False)
            for name, note in self.look.items()
        }
