"""The loop guard: no candidate may extend a loop while another would not, and members that exited
come back to draft while the answer ends in one (scripted members: loops on demand)."""

from __future__ import annotations

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.segments import ends_in_loop
from specfuse.trace import Trace, load_trace, save_trace

from ..scripted import ScriptedMember

LOOP = "The answer is 18. "


@pytest.mark.parametrize(
    ("text", "copies", "looped"),
    [
        (LOOP * 2, 2, True),
        (LOOP * 2, 3, False),
        (LOOP * 3, 3, True),
        (LOOP * 2 + "The ans", 2, True),  # the second copy cut off inside a word still counts
        (LOOP + "The answer is 19. ", 2, False),
        ("Yes. Yes. ", 2, False),  # under 20 characters of words: not a loop
        ("16 + 4 = 20. 16 + 4 = 20. ", 2, False),  # units without a letter are not compared
    ],
)
def test_a_loop_is_a_block_repeated_at_the_end(text, copies, looped):
    assert ends_in_loop(text, copies=copies) is looped


def loves(text: str) -> float:
    """Every verifier prefers the looping sentence, as likelihood-based verifiers do."""
    return 5.0 if text == LOOP else 1.0


def test_a_candidate_that_would_repeat_a_block_cannot_win_while_a_fresh_one_can():
    members = [
        ScriptedMember("looper", [LOOP] * 4, loves),
        ScriptedMember("fresh", ["One. ", "Two apples. ", "Three pears. ", ("Done.", True)], loves),
    ]
    config = EnsembleConfig(loop_guard=True, exit=False, repeat_penalty=0.0, max_rounds=4)
    guarded = list(Ensemble(members, config).stream("go"))
    assert guarded[0].winner.member == "looper"  # one copy is not a loop
    assert guarded[1].eligible == (False, True) and guarded[1].winner.member == "fresh"
    assert guarded[1].aggregate[0] > guarded[1].aggregate[1]  # the loop did score higher
    assert not ends_in_loop(guarded[-1].text, copies=2)
    unguarded = list(
        Ensemble(members, EnsembleConfig(exit=False, repeat_penalty=0.0, max_rounds=4)).stream("go")
    )
    assert [r.winner.member for r in unguarded] == ["looper"] * 4
    assert unguarded[-1].text == LOOP * 4


def test_a_candidate_that_ends_the_answer_stays_eligible_inside_a_loop():
    members = [
        ScriptedMember("looper", [LOOP] * 4, loves),
        ScriptedMember("ender", ["Hm. ", ("", True)], lambda text: 5.0 if text == LOOP else 0.0),
    ]
    config = EnsembleConfig(loop_guard=True, exit=False, repeat_penalty=0.0, max_rounds=3)
    rounds = list(Ensemble(members, config).stream("go"))
    assert rounds[1].eligible == (False, True)  # "" ends the answer: it stops the loop
    assert rounds[1].stop_reason == "final" and rounds[1].text == LOOP


def test_members_that_exited_draft_again_once_the_answer_ends_in_a_loop():
    """A lone member in a loop has no way out; the ones that exited catch up and offer one."""
    members = [
        ScriptedMember("looper", [LOOP] * 12, loves),
        ScriptedMember("fresh", ["Apples. "] * 3 + [f"Then {n} more. " for n in range(9)], loves),
    ]
    config = EnsembleConfig(loop_guard=True, repeat_penalty=0.0, exit_warmup=1, max_rounds=8)
    rounds = list(Ensemble(members, config).stream("go"))
    left = next(e.k for r in rounds for e in r.exits if e.member == "fresh")
    back = next(r for r in rounds if r.k > left and "fresh" in r.active)
    assert ends_in_loop(rounds[back.k - 2].text, copies=2)  # it came back because of a loop
    assert back.winner.member == "fresh" and back.eligible == (False, True)
    assert set(back.verifiers) == {"looper", "fresh"}
    # It first read what it had missed, exactly once, then drafted from there.
    calls = members[1].calls
    drafts = [i for i, (phase, _) in enumerate(calls) if phase == "draft"]
    before = [text for phase, text in calls[: drafts[left]] if phase == "accept"]  # its draft when back
    assert "".join(before) == rounds[back.k - 2].text
    assert before[-1] == rounds[back.k - 2].text[len(rounds[left - 2].text) :] and len(before) == left
    assert not any(ends_in_loop(r.text, copies=3) for r in rounds)
    # Without the guard the loop runs on to the end, the exited member never asked again.
    plain = list(
        Ensemble(members, EnsembleConfig(repeat_penalty=0.0, exit_warmup=1, max_rounds=8)).stream("go")
    )
    assert ends_in_loop(plain[-1].text, copies=3)
    assert all("fresh" not in r.active for r in plain[left:])


def test_a_loop_guard_run_round_trips_as_a_trace_and_a_branch_catches_up_the_whole_answer(tmp_path):
    def members():
        return [
            ScriptedMember("looper", [LOOP] * 12, loves),
            ScriptedMember("fresh", ["Apples. "] * 3 + [f"Then {n} more. " for n in range(9)], loves),
        ]

    config = EnsembleConfig(loop_guard=True, repeat_penalty=0.0, exit_warmup=1, max_rounds=8)
    rounds = list(Ensemble(members(), config).stream("go"))
    path = save_trace(Trace("go", ("looper", "fresh"), config, tuple(rounds)), tmp_path / "t.json")
    loaded = load_trace(path)
    assert loaded.rounds == tuple(rounds)  # rounds where an exited member drafted again are valid
    # Branch after the round that left the answer in a loop: the exited member's state is rebuilt
    # from the prompt alone, so it reads the whole answer before it drafts.
    left = next(e.k for r in rounds for e in r.exits)
    back = next(r for r in rounds if r.k > left and "fresh" in r.active)
    fresh = members()
    branch = list(
        Ensemble([ScriptedMember("looper", [LOOP] * 12, loves), fresh[1]], config).stream(
            "go", start=loaded.rounds[: back.k - 1]
        )
    )
    assert branch[0].k == back.k and branch[0].active == ("looper", "fresh")
    assert fresh[1].calls[:3] == [("start", "go"), ("accept", rounds[back.k - 2].text), ("draft", 1)]
    assert branch[0].winner.member == "fresh"  # the looper's next copy could not win
