"""Step mode (issue 43, items 1 and 2): its pure values (what Next does, the guesses' tally, the
notes), then its handlers through gradio_client against a launched app on tiny members: a run paused
before round 1, the drafts before the verdict, Reveal, Back, the end, Stop, the guess and its tally,
two sessions' runs apart, and the scheduler's limits (paused runs at once, the idle limit)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from specfuse import Ensemble, EnsembleConfig, load_trace
from specfuse.records import Candidate, Draft
from studio import step_views
from studio.serving import Schedulers
from studio.step_views import ENDED, FORWARD, NEXT, REVEAL, Tally, due

from ..conftest import TINY, tiny_member
from ..helpers_app import ANSWER, CANDIDATES, MATRIX, SLIDER, STATUS, client_on, figure, launched
from ..scripted import ScriptedMember, prefers, scripted_rounds

# The step bar's guess, note and timer come last in /run's and every /step_* endpoint's outputs (the
# API leaves out states and buttons: the browser tests read the buttons).
GUESS, NOTE = -3, -2
VIEW = "normalized ŝ"
PROMPT = "Why is the sky blue? Explain it to a child."  # the tiny members play on for many rounds

# ---- pure values --------------------------------------------------------------------------------


def test_next_goes_forward_after_back_then_reveals_then_plays_until_the_end():
    assert due(shown=1, revealed=0, drafted=False, over=False) == NEXT  # the slider shows 1 at least
    assert due(1, 0, True, False) == REVEAL  # round 1's drafts are in
    assert due(2, 3, True, False) == FORWARD  # looking back: forward first, the reveal waits
    assert due(3, 3, True, False) == REVEAL
    assert due(3, 3, False, False) == NEXT
    assert due(3, 3, True, True) == REVEAL  # the last round still has its reveal
    assert due(3, 3, False, True) == ENDED
    assert due(1, 3, False, True) == FORWARD  # after the end, Back and forward still replay


def test_the_tally_counts_only_the_rounds_with_a_guess():
    tally = Tally()
    assert str(tally) == "no guesses yet"
    for verdict in (True, None, False, True, True, False):
        tally = tally.add(verdict)
    assert (tally.right, tally.made) == (3, 5) and str(tally) == "3 of 5 guesses right"
    assert str(Tally().add(True)) == "1 of 1 guess right"


def test_a_guess_is_right_for_the_winner_and_for_a_draft_that_agrees_with_it():
    rnd = scripted_rounds().rounds[0]  # a: "fine ", b: "good " (always wins), c: "junk "
    assert rnd.winner.member == "b"
    assert step_views.guess_right(rnd, "b") is True
    assert step_views.guess_right(rnd, "a") is False
    assert step_views.guess_right(rnd, None) is None and step_views.guess_right(rnd, "nobody") is None
    twins = [ScriptedMember(n, ["same "] * 5, len) for n in ("x", "y")]
    agreed = next(Ensemble(twins, EnsembleConfig(max_rounds=1)).stream("go"))
    assert {step_views.guess_right(agreed, m) for m in ("x", "y")} == {True}


def test_the_guess_offers_each_drafter_once_in_the_order_they_arrived_numbered_with_its_draft():
    texts = {"b": " one\ntwo", "a": "x" * 100, "c": " three"}
    drafts = [Draft(1, Candidate(m, texts[m], 1, False, 0.0), 0.1) for m in ("b", "a", "b", "c")]
    choices = step_views.guess_choices(drafts)
    assert [member for _, member in choices] == ["b", "a", "c"]
    assert choices[0][0] == "1. b: “ one⏎two”" and choices[2][0] == "3. c: “ three”"  # its key's number
    assert choices[1][0] == f"2. a: “{'x' * 59}…”"  # one line, cut


def test_the_notes_say_who_won_the_verdict_the_tally_and_the_end_with_names_as_text():
    evil = "<img src=x onerror=alert(1)>[link](http://x.example)"
    members = [ScriptedMember(evil, ["good "] * 5, prefers("good ")), ScriptedMember("z", ["bad "] * 5, len)]
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=2, exit=False)).stream("go"))
    note = step_views.verdict_note(rounds[0], evil, Tally().add(True), over=False)
    assert "won" in note and "✓ Your guess was right." in note and "1 of 1 guess right" in note
    assert "Next" in note and "round 2" in note
    assert "<img" not in note and "](http" not in note  # the name is text, not markup
    wrong = step_views.verdict_note(rounds[1], "z", Tally().add(True).add(False), over=True)
    assert "✗ You guessed z." in wrong and "1 of 2 guesses right" in wrong
    assert "The run has ended after round 2" in wrong and "(stopped: " in wrong
    first = step_views.verdict_note(rounds[0], None, Tally(), over=False)
    assert "No guess this round." in first
    table = first.split("\n\n", 1)[1].splitlines()  # the scores under the verdict, the winner ✓
    assert len(table) == 4 and table[2].endswith("| ✓ |") and "good" in table[2] and "bad" in table[3]
    assert "<img" not in first and "&#124;" not in table[0]
    ended = step_views.ended_note(rounds[0], Tally().add(False), "Stopped by the user.")
    assert ended.startswith("Stopped by the user.") and "0 of 1 guess right" in ended
    assert "looking back" in step_views.looking_note(2, 5, drafted=False)
    assert "round 6's drafts are waiting" in step_views.looking_note(5, 5, drafted=True)
    assert "→ plays round 6" in step_views.looking_note(5, 5, drafted=False)
    assert "the run has ended" in step_views.looking_note(5, 5, drafted=False, over=True)


# ---- the handlers, against a launched app --------------------------------------------------------


def launch(tmp_path_factory, **limits):
    """A module fixture's body: the app on the tiny members and three scripted ones (b always wins),
    with a scheduler of its own (`limits`: max_paused, pause_idle_s)."""
    members = {name: tiny_member(name) for name in TINY}
    members |= {m: ScriptedMember(m, [f"{m}{m} "] * 50, prefers("bb ")) for m in ("a", "b", "c")}
    schedulers = Schedulers(**limits)
    cache = tmp_path_factory.mktemp("gradio")
    with launched(cache, members, concurrency=4, default_models=TINY, schedulers=schedulers) as url:
        yield url, schedulers, cache


@pytest.fixture(scope="module")
def stepping(tmp_path_factory):
    yield from launch(tmp_path_factory)


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """One paused run at once, and 4 s without a step ends it (1.5 s ended a run between two of a
    test's requests on a loaded machine)."""
    yield from launch(tmp_path_factory, max_paused=1, pause_idle_s=4.0)


def client_of(server, monkeypatch) -> Client:
    url, _, cache = server
    return client_on(url, cache, monkeypatch)


def start(client, members=TINY, prompt=PROMPT, **settings):
    values = dict(segment_len=4, max_new_tokens=40, device="cpu") | settings
    return client.predict(members=members, prompt=prompt, **values, step=True, api_name="/run")


def press(client, endpoint: str, shown: int, guess: str | None = None):
    if endpoint == "back":
        return client.predict(shown=shown, view=VIEW, api_name="/step_back")
    return client.predict(shown=shown, view=VIEW, guess=guess, api_name=f"/step_{endpoint}")


def answer(out) -> str:
    return "".join(span["token"] for span in (out[ANSWER] or {}).get("value") or [])


def test_next_shows_the_drafts_and_keeps_the_verdict_until_reveal(stepping, monkeypatch):
    client = client_of(stepping, monkeypatch)
    ready = start(client)
    assert "not been played" in ready[STATUS] and "ready" in ready[NOTE]
    assert stepping[1].paused() == 1  # the run waits before round 1, out of the batch

    drafts = press(client, "next", 1)
    assert "3 drafts are in" in drafts[NOTE] and "Round 1" in drafts[STATUS]
    rows = drafts[CANDIDATES]["data"]
    assert len(rows) == 3 and all(row[-1] == "" and row[5] == "" for row in rows)  # no score, no ✓
    assert "hidden until Reveal" in figure(drafts[MATRIX]).layout.title.text
    assert answer(drafts) == ""  # the answer grows at Reveal, not before
    assert drafts[GUESS]["visible"] and sorted(c[1] for c in drafts[GUESS]["choices"]) == sorted(TINY)

    shown = press(client, "reveal", 1, guess=TINY[0])
    assert answer(shown) and "won" in shown[NOTE] and "of 1 guess right" in shown[NOTE]
    assert sum(row[-1] == "✓" for row in shown[CANDIDATES]["data"]) == 1
    assert figure(shown[MATRIX]).layout.title.text.startswith("round 1:")
    assert not shown[GUESS]["visible"]

    # Next plays round 2's drafts; Next again (what → does) reveals them.
    assert "Round 2" in press(client, "next", 1)[NOTE]
    second = press(client, "next", 1)
    assert "Round 2:" in second[NOTE] and answer(second).startswith(answer(shown))
    assert int(second[SLIDER]["value"]) == 2

    back = press(client, "back", 2)
    assert "**Round 1**" in back[STATUS] and "looking back" in back[NOTE] and int(back[SLIDER]["value"]) == 1
    forward = press(client, "next", 1)  # forward again to the latest, no round played
    assert "**Round 2**" in forward[STATUS] and int(forward[SLIDER]["value"]) == 2
    client.predict(shown=2, api_name="/step_stop")
    assert stepping[1].paused() == 0


def test_the_tally_counts_the_rooms_guesses_over_the_run_and_the_end_is_said(stepping, monkeypatch):
    client = client_of(stepping, monkeypatch)
    start(client, members=["a", "b", "c"], prompt="go", max_new_tokens=3, exit=False)
    notes = []
    for k, guess in enumerate(["b", "a", "b"], 1):
        shown = max(1, k - 1)  # the slider shows the last round revealed
        press(client, "next", shown)
        out = press(client, "reveal", shown, guess=guess)
        notes.append(out[NOTE])
    assert "✓ Your guess was right." in notes[0] and "1 of 1 guess right" in notes[0]
    assert "✗ You guessed a." in notes[1] and "1 of 2 guesses right" in notes[1]
    assert "2 of 3 guesses right" in notes[2] and "The run has ended after round 3" in notes[2]
    assert "run has ended" in press(client, "next", 3)[NOTE]


def test_two_sessions_step_their_own_runs(stepping, monkeypatch):
    first, second = client_of(stepping, monkeypatch), client_of(stepping, monkeypatch)
    start(first, prompt="Once upon a time, in a land far away")
    start(second)
    assert "drafts are in" in press(first, "next", 1)[NOTE]
    press(second, "next", 1)
    one = press(second, "next", 1)  # second reveals round 1 ...
    press(second, "next", 1)  # ... and drafts round 2
    mine = press(first, "reveal", 1)  # first's own round 1, not second's
    assert "Round 1:" in mine[NOTE] and answer(mine) != answer(one)
    for client in (first, second):
        client.predict(shown=1, api_name="/step_stop")


def test_a_normal_run_ends_the_sessions_stepping_run_and_resets_the_bar(stepping, monkeypatch):
    client = client_of(stepping, monkeypatch)
    start(client)
    press(client, "next", 1)
    out = client.predict(
        members=TINY, prompt="Hi", segment_len=4, max_new_tokens=8, device="cpu", api_name="/run"
    )
    assert answer(out)
    assert stepping[1].paused() == 0
    assert "No stepping run" in press(client, "next", 1)[NOTE]


def test_the_servers_limit_on_paused_runs_is_a_message_at_run(strict, monkeypatch):
    first, second = client_of(strict, monkeypatch), client_of(strict, monkeypatch)
    start(first)
    with pytest.raises(AppError, match="already paused on this server"):
        start(second)
    first.predict(shown=1, api_name="/step_stop")
    start(second)  # the place is free again
    second.predict(shown=1, api_name="/step_stop")


def test_a_run_paused_past_the_idle_limit_ends_with_the_engines_message(strict, monkeypatch):
    client = client_of(strict, monkeypatch)
    start(client)
    press(client, "next", 1)
    kept = press(client, "reveal", 1)
    time.sleep(5.5)  # the limit is 4 s
    out = press(client, "next", 1)
    assert "no step for 4 s" in out[STATUS] and "no step for 4 s" in out[NOTE]
    assert "The run has ended after round 1" in out[NOTE] and answer(out) == answer(kept)
    assert strict[1].paused() == 0


# ---- a recorded run steps as a live one (issue 53, D3) --------------------------------------------

LESSON = Path(__file__).resolve().parents[2] / "specfuse" / "lessons" / "traces" / "weak-member-exits.json"


@pytest.mark.slow
def test_a_recorded_trace_steps_like_a_live_run_guesses_and_tally_included(stepping, monkeypatch):
    """Upload a recorded trace, check step mode: Next shows round 1's drafts (the scores hidden), the
    guess offers its drafters, Reveal judges the guess; Back, Home, End and the end of the run, all
    from the trace, no member loaded. Before issue 53 every step button stayed disabled."""
    recorded = load_trace(LESSON)
    client = client_of(stepping, monkeypatch)
    client.predict(path=handle_file(str(LESSON)), view_name=VIEW, api_name="/load_trace")
    ready = client.predict(on=True, view=VIEW, api_name="/step_mode")
    assert "recorded run" in ready[NOTE] and "ready" in ready[NOTE] and answer(ready) == ""

    first = recorded.rounds[0]
    drafts = press(client, "next", 1)
    assert f"{len(first.candidates)} drafts are in" in drafts[NOTE]
    assert "hidden until Reveal" in figure(drafts[MATRIX]).layout.title.text and answer(drafts) == ""
    offered = [member for _, member in drafts[GUESS]["choices"]]
    assert sorted(offered) == sorted(c.member for c in first.candidates)
    labels = [label for label, _ in drafts[GUESS]["choices"]]
    assert [label.split(".")[0] for label in labels] == [str(i) for i in range(1, len(labels) + 1)]
    # the status line times each draft from the round's start, as recorded
    assert "s" in drafts[STATUS] and "Round 1" in drafts[STATUS]

    shown = press(client, "reveal", 1, guess=first.winner.member)
    assert answer(shown) == first.text and "✓ Your guess was right." in shown[NOTE]
    assert "1 of 1 guess right" in shown[NOTE]

    second = recorded.rounds[1]
    loser = next((c.member for c in second.candidates if c.text != second.winner.text), None)
    press(client, "next", 1)
    revealed = press(client, "next", 2, guess=loser)  # → reveals once the drafts are in
    assert answer(revealed) == second.text and int(revealed[SLIDER]["value"]) == 2
    if loser is not None:
        assert "✗ You guessed" in revealed[NOTE] and "1 of 2 guesses right" in revealed[NOTE]

    back = press(client, "back", 2)
    assert int(back[SLIDER]["value"]) == 1 and "looking back" in back[NOTE]
    latest = client.predict(shown=1, view=VIEW, api_name="/step_end")
    assert int(latest[SLIDER]["value"]) == 2
    home = client.predict(shown=2, view=VIEW, api_name="/step_home")
    assert int(home[SLIDER]["value"]) == 1

    shown_k = 1
    for _ in range(4 * len(recorded.rounds)):  # to the end, by Next alone (what → and Play press)
        out = press(client, "next", shown_k)
        shown_k = int(out[SLIDER]["value"] or shown_k)
        if "has ended" in out[NOTE]:
            break
    assert "has ended" in out[NOTE] and answer(out) == recorded.rounds[-1].text
    assert shown_k == len(recorded.rounds)
    assert stepping[1].paused() == 0  # nothing was submitted to the scheduler


def test_checking_step_mode_with_nothing_shown_waits_for_run(stepping, monkeypatch):
    client = client_of(stepping, monkeypatch)
    out = client.predict(on=True, view=VIEW, api_name="/step_mode")
    assert "ready" not in (out[NOTE] or "")
