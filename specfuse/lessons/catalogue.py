"""The lessons as data: what each one shows, where to look, and the exact run its trace records.

Every text here describes the shipped trace of its lesson (traces/<slug>.json, made by
tools/make_lessons.py) and nothing more; checks.py tests the phenomenon on that trace, and
tests/classroom/test_lessons.py checks that the rounds and members the texts name are the trace's.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecfuseError
from ..models.catalogue import DEFAULT_MEMBERS

PANELS = ("answer", "candidates", "matrix", "weights", "exits")  # the app's panels a lesson points at
TRIO = DEFAULT_MEMBERS  # the members every shipped trace was made with
LIVE_NOTE = (
    "Run it live replays these settings on the loaded members; its answer may differ from the recorded one."
)


class UnknownLessonError(SpecfuseError, KeyError):
    """A lesson slug that is not in LESSONS; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Lesson:
    slug: str  # file-name safe, e.g. "weak-member-exits"
    title: str
    summary: str  # one line for the gallery card
    look_for: dict[str, str]  # per panel (PANELS): one or two plain sentences
    takeaway: str  # the key takeaway box
    prompt: str
    members: tuple[str, ...]  # catalogue names of the embedded models
    settings: dict[str, Any] = field(default_factory=dict)  # EnsembleConfig keyword arguments
    branch: tuple[int, str] | None = None  # (round, typed segment) for a lesson built on a typed segment
    live_note: str = LIVE_NOTE


TRAIN = (
    "A train travels 60 km per hour for 3 hours. How far does it travel? Show the calculation in one line."
)
APPLES = (
    "Tom has 5 apples. He buys 3 bags with 4 apples in each bag. How many apples does he have now? "
    "Show the calculation in one line."
)
JANET = (
    "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?"
)
SEA = "Write a short poem about the sea."

LESSONS: tuple[Lesson, ...] = (
    Lesson(
        slug="weak-member-exits",
        title="A weak member exits",
        summary="Gemma wins no segment; after round 4 its keep probability falls under the bar and it "
        "stops drafting.",
        look_for={
            # The lesson opens at round 4 (its key round): each note says what that round shows, and
            # how to reach the rounds after it (issue 53, D9).
            "exits": "After round 4 Gemma leaves: its keep probability 0.159 is under the bar δ/|A| = 0.5/3 "
            "= 0.167. One round on, SmolLM2, which won round 1, follows (0.107 under 0.25).",
            "candidates": "Round 4: Gemma drafts and loses again, as in rounds 1 to 3. Move the round slider "
            "on: from round 6 only Qwen drafts.",
            "weights": "Up to round 4 the weights move after every round; slide on: after round 5 they stop "
            "(a lone draft is taken without a verify pass, so no feedback).",
        },
        takeaway="Model exit saves work: a member whose candidates keep losing stops drafting and, by "
        "default, stops verifying too. Here the last five rounds are Qwen alone, with no verify pass at all.",
        prompt="Give three tips for staying healthy.",
        members=TRIO,
        settings={"max_new_tokens": 80},
    ),
    Lesson(
        slug="weights-move",
        title="Weights move after the members disagree",
        summary="From equal weights, the verifiers favour different candidates; after round 2 Gemma, whose "
        "answer the others agreed with, overtakes Qwen.",
        look_for={
            "matrix": "In round 1 each verifier scores its own candidate highest, so the three favourites "
            "differ. In round 2 SmolLM2's verifier prefers Gemma's ' yellow.' (0.69) to its own draft.",
            "weights": "All three start at 1/3 (prior uniform) and Qwen leads after round 1 (0.352). After "
            "round 2, when Gemma's ' yellow.' beats Qwen's ' green.', Gemma leads: 0.350 against 0.339.",
            "candidates": "Round 2 is a real disagreement: ' yellow.' (Gemma), ' yellow. These colors…' "
            "(SmolLM2) and ' green.' (Qwen, a wrong answer).",
        },
        takeaway="A member's reward counts how often the other verifiers ranked its candidate above the "
        "rest, so the weights move toward the member the others agree with, not toward the one that "
        "praises itself. Exit is off here, so all three draft to the end.",
        prompt="Name three primary colors.",
        members=TRIO,
        settings={"max_new_tokens": 48, "prior": "uniform", "exit": False},
    ),
    Lesson(
        slug="numbers-differ",
        title="Two candidates differ on a number: the verifiers decide",
        summary="In round 2 the members propose 5 + 12, 11 and 19; even Qwen's own verifier prefers "
        "SmolLM2's correct step.",
        look_for={
            "candidates": "Round 2: SmolLM2 drafts ' 5 + 12 =', Gemma ' 11', Qwen ' 19'. SmolLM2's wins, "
            "and in round 3 all three write 17, the right answer.",
            "matrix": "Every verifier, Qwen's included, gives SmolLM2's ' 5 + 12 =' its highest score "
            "in round 2 (Qwen's: 0.66, against 0.28 for its own ' 19').",
            "weights": "After round 2 SmolLM2's weight rises from 0.268 to 0.309 and Qwen's falls from "
            "0.603 to 0.570.",
        },
        takeaway="The most trusted member is not always right: here it drafted a wrong sum, and its own "
        "verifier, reading the other drafts, preferred the correct step. Scoring each other's drafts is "
        "how the ensemble corrected its strongest member.",
        prompt=APPLES,
        members=TRIO,
        settings={"max_new_tokens": 64},
    ),
    Lesson(
        slug="repeat-penalized",
        title="A repetition is penalized",
        summary="In round 2 Gemma copies the poem's first line; the verifiers like it best, but the repeat "
        "penalty lets Qwen's new line win.",
        look_for={
            "candidates": "Round 2: Gemma's 'The sea is a vast expanse of blue,' repeats line 1, and 78 % "
            "of its word 3-grams are already in the answer. Its aggregate falls from 0.625 to 0.236 "
            "(0.5 × 0.78 off), below Qwen's 0.317.",
            "matrix": "Gemma's verifier (0.81) and Qwen's (0.63) both score the copied line above Qwen's "
            "new line in round 2: text just read is easy to predict.",
            "answer": "The penalty has a limit: in round 5 Gemma's next copy (' is a vast expanse of "
            "blue,') wins anyway, 0.381 against 0.008, and the poem starts over.",
            "exits": "SmolLM2 exits after round 4 and Gemma after round 6; from round 7 Qwen drafts alone "
            "and repeats the stanza up to the budget.",
        },
        takeaway="Likelihood rewards what a verifier has just read, so repeated text scores well. The "
        "repeat penalty (0.5 × the share of repeated word 3-grams; ours, not the paper's) takes that back, "
        "but a repetition whose lead is larger than the penalty still wins, as in round 5: the loop-guard "
        "lesson shows the option that stops it.",
        prompt=SEA,
        members=TRIO,
        settings={"max_new_tokens": 96},
    ),
    Lesson(
        slug="loop-guard-returns",
        title="The loop guard brings back an exited member",
        summary="The same poem with the loop guard on: when the answer ends in a loop, the exited members "
        "draft again and SmolLM2 leads out of it.",
        look_for={
            "candidates": "In round 8 all three draft again, though SmolLM2 and Gemma had exited after "
            "rounds 4 and 6. Gemma's and Qwen's drafts would start the stanza a third time ('The sea is'), "
            "so they are not eligible.",
            "matrix": "SmolLM2's candidate has the lowest aggregate of the three in round 8 (−0.301) and "
            "wins anyway: it is the only one that does not extend the loop.",
            "answer": "After round 7 the answer ends in a loop: its first stanza, written a second time. In "
            "round 8 SmolLM2 finishes the line and starts a new one, 'In the', instead of a third copy.",
            "exits": "SmolLM2 and Gemma come back for round 8 only; from round 9 Qwen drafts alone again.",
        },
        takeaway="Once the weak members have left, the one drafter has no way out of its own loop. With "
        "loop_guard on, a candidate that would leave the answer ending in a loop cannot win while another "
        "would not, and while the answer ends in one the exited members draft again; round 2 shows the "
        "guard too (Gemma's copy of line 1 is not eligible).",
        prompt=SEA,
        members=TRIO,
        settings={"max_new_tokens": 96, "loop_guard": True},
    ),
    Lesson(
        slug="chinese-prompt",
        title="A prompt one member cannot handle",
        summary="Asked in Chinese, Gemma (a base model) drafts English in round 1; the ensemble keeps "
        "Qwen's Chinese.",
        look_for={
            "candidates": "Round 1: Gemma drafts in English ('1. The first time I saw the'), SmolLM2 a "
            "broken start ('长城：长') and Qwen a Chinese sentence, which wins. In round 2 Gemma follows "
            "the answer in Chinese, while SmolLM2's '美丽的福制' is not a phrase.",
            "matrix": "In round 1 Gemma's verifier still ranks its own English draft first (0.68); Qwen's "
            "verifier, with Qwen's weight of 0.61, decides.",
            "answer": "The answer is Qwen's alone: one sentence about the Great Wall, not the two the "
            "prompt asked for.",
        },
        takeaway="A member that cannot read the prompt's language drafts nothing useful, and its vote "
        "counts only with its weight: with Qwen trusted at 0.61 the Chinese draft wins both rounds, and "
        "the weak members cost drafting time without changing the answer.",
        prompt="请用两句话介绍长城。",
        members=TRIO,
        settings={"max_new_tokens": 64},
    ),
    Lesson(
        slug="typed-wrong-number",
        title="A typed wrong number",
        summary="A branch forces '60 km/h × 4 hours = ' in round 1 (the problem says 3 hours): every member "
        "goes on with 240.",
        look_for={
            "candidates": "Round 1 holds four candidates: the members' three and yours ('you'). Qwen's "
            "'60 km/h × 3 hours = ' differs from yours only in the 3.",
            "matrix": "The verifiers score your segment below Qwen's and SmolLM2's in round 1 (aggregate "
            "0.252, against 0.373 and 0.343); it wins only because the branch forces it.",
            "answer": "In round 2 all three members draft 240 ('240 km/h ×', '240 km/h', '240 km'), which "
            "is 60 × 4, not the right 180. The answer ends '60 km/h × 4 hours = 240 km'.",
        },
        takeaway="The ensemble never goes back: an accepted segment is in every member's context, so a "
        "wrong number typed (or drafted) early is computed with faithfully afterwards. Verification judges "
        "the next segment, not the answer so far.",
        prompt=TRAIN,
        members=TRIO,
        settings={"max_new_tokens": 64},
        branch=(1, "60 km/h × 4 hours = "),
    ),
    Lesson(
        slug="paper-vs-ours",
        title="The paper's rule against ours, on the same round",
        summary="Round 2 of a French prompt: the paper's rule would pick SmolLM2's wrong 'Albania'; the "
        "default picks Qwen's 'Canberra'.",
        look_for={
            "candidates": "Round 2: SmolLM2 drafts ' la capitale de l'Albania.', Gemma ' Sydney.' and Qwen "
            "' Canberra.', which the run's own rule chose.",
            "matrix": "Under the paper's z / Σz of mean logits every row of round 2 is nearly flat (Qwen's: "
            "0.306, 0.346, 0.348), so SmolLM2's vote for its own draft (0.456) tips the weighted mean to it, "
            "0.346 against 0.334 for Canberra. Our z-softmax of log-probs spreads Qwen's row to 0.06, 0.43, "
            "0.51, and the weighted median picks ' Canberra.'.",
            "answer": "The answer is 'La capitale de l'Australie est Canberra.': in round 1 SmolLM2 and "
            "Qwen drafted the same text, and the tie went to SmolLM2, listed first.",
        },
        takeaway="Dividing by the row sum keeps each verifier's offset: mean logits of 11 to 21 leave "
        "every row nearly flat, and the one verifier with a wide spread decides. Normalizing each row's "
        "z-scores (zsoftmax) lets every verifier count with its weight whatever its scale; the what-if "
        "panel re-runs each rule on the recorded scores and weights of any round.",
        prompt="Quelle est la capitale de l'Australie ? Réponds en une phrase.",
        members=TRIO,
        settings={"max_new_tokens": 48},
    ),
    Lesson(
        slug="best-member-dominates",
        title="Why this ensemble rarely beats its best member",
        summary="On a GSM8K problem Qwen wins all 12 rounds; Gemma exits after round 4, SmolLM2 after "
        "round 5, and the answer is Qwen's alone.",
        look_for={
            "answer": "Every segment is Qwen's, so the answer reads as Qwen's own; it is cut at the 96-token "
            "budget before any arithmetic.",
            "weights": "Qwen starts at 0.61 (its trust from the evaluation) and ends at 0.63. With over "
            "half the weight, its own vote is the weighted median in every scored round.",
            "exits": "Gemma leaves after round 4 and SmolLM2 after round 5; rounds 6 to 12 are Qwen alone, "
            "taken without a verify pass.",
            "candidates": "In round 1 SmolLM2's draft copies the question and is not eligible (the echo "
            "guard); in rounds 2 to 5 the others' drafts lose to Qwen's.",
        },
        takeaway="With one member much stronger than the others, it wins nearly every round and the others "
        "leave: the ensemble becomes that member with a little noise. docs/evaluation.md measures the "
        "same: on all 300 GSM8K development problems the default scored 64 of 300 against Qwen alone's "
        "63 of 300 (llama.cpp), and on the held-out IFEval rows 50 of 241 against Qwen alone's 58 of 241, "
        "with 1.6 drafters a round.",
        prompt=JANET,
        members=TRIO,
        settings={"max_new_tokens": 96},
    ),
    Lesson(
        slug="best-member-sure",
        title="The best member was sure: the others were not asked",
        summary="With the gate on, Qwen drafts first; four of its five segments are sure enough to be "
        "taken alone, and only round 2 asks the others.",
        look_for={
            "answer": "Rounds taken on Qwen's word alone are marked gated in the answer; round 2's segment "
            "was decided by all three.",
            "candidates": "Round 3 (shown): one candidate, Qwen's, with a mean log probability of -0.003, "
            "above the gate's -0.1. Step back to round 2: Qwen was unsure (-0.142), so SmolLM2 and Gemma "
            "drafted too and all three verified.",
            "matrix": "Round 3 has no matrix: nobody verified a segment the gatekeeper was sure of. "
            "Round 2's is a full 3×3 matrix.",
            "weights": "The weights move only after round 2, the one full round (Qwen 0.608 to 0.604, Gemma "
            "0.137 to 0.147): a gated round gives no rewards.",
        },
        takeaway="Most of an answer's segments are ones the best member is sure of, and there the weaker "
        "members can only talk it out of a right answer. The gate (off by default) asks the others only "
        "where the gatekeeper is unsure: here one round in five paid for three drafts and a verification.",
        prompt="Name the planets of the solar system in order from the Sun.",
        members=TRIO,
        # Its own threshold: at the default (-1.5, the sweep's) every round of this answer is gated.
        settings={"max_new_tokens": 64, "gate": True, "gate_threshold": -0.1, "exit": False},
    ),
)


def lesson(slug: str) -> Lesson:
    """The lesson named `slug`; UnknownLessonError (a KeyError) naming the known slugs otherwise."""
    for known in LESSONS:
        if known.slug == slug:
            return known
    raise UnknownLessonError(
        f"Unknown lesson {slug!r}; the lessons are: {', '.join(x.slug for x in LESSONS)}."
    )
