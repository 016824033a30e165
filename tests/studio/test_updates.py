"""Pacing (studio/updates.py): a run's updates drawn at most once per interval, what came between held
and drawn together, the newest value of each component kept; a clock given, no app, no model. Then
the app's default on a run whose rounds come faster than that: fewer updates than rounds, the last
holding the whole run."""

from __future__ import annotations

from specfuse import load_trace
from studio.updates import PANEL_INTERVAL_S, Pacing

from ..conftest import TINY
from ..helpers_app import ANSWER, DOWNLOAD, PLAIN, SLIDER, client_on, path_of, round_updates, submit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_updates_sooner_than_the_interval_are_held_then_drawn_together_newest_last():
    clock = Clock()
    made: list[str] = []

    def make(name: str, **values: str):
        def update():
            made.append(name)
            return dict(values)

        return update

    pacing = Pacing(0.5, clock)
    assert pacing.offer("round", make("round 1", answer="a", status="Round 1")) == {
        "answer": "a",
        "status": "Round 1",
    }
    clock.now += 0.1
    assert pacing.offer("draft", make("draft 2", candidates="c2", status="2 in")) is None
    assert pacing.offer("round", make("round 2", answer="ab", status="Round 2")) is None
    assert pacing.offer("round", make("round 3", answer="abc", status="Round 3")) is None
    assert pacing.offer("draft", make("draft 4", candidates="c4", status="4 in")) is None
    assert pacing.due() is None  # 0.1 s since the last drawing
    clock.now += 0.4
    # Round 2's charts are never built; drawn in the order the kinds last came: round 3, then draft 4.
    assert pacing.due() == {"answer": "abc", "status": "4 in", "candidates": "c4"}
    assert made == ["round 1", "round 3", "draft 4"]
    assert pacing.due() is None and pacing.flush() is None  # nothing held


def test_a_last_round_or_the_end_draws_at_once():
    clock = Clock()
    pacing = Pacing(0.5, clock)
    assert pacing.offer("draft", lambda: {"status": "1 in"}) is not None
    assert pacing.offer("draft", lambda: {"status": "2 in"}) is None
    assert pacing.offer("round", lambda: {"status": "done"}, now=True) == {"status": "done"}
    assert pacing.offer("status", lambda: {"status": "waiting"}) is None
    assert pacing.flush() == {"status": "waiting"}


def test_no_interval_draws_every_update():
    pacing = Pacing(0.0, Clock())
    assert [pacing.offer("round", lambda k=k: {"k": k}) for k in range(3)] == [{"k": 0}, {"k": 1}, {"k": 2}]


def test_the_app_draws_a_quick_runs_rounds_together_and_its_last_update_holds_it_all(served, monkeypatch):
    url, _, downloads, cache = served
    client = client_on(url, cache, monkeypatch, downloads)
    job = submit(client, TINY, "Numbers: 1, 2,", max_new_tokens=96)  # tiny members: rounds of milliseconds
    final = job.result(timeout=120)
    outputs = job.outputs()
    trace = load_trace(path_of(final[DOWNLOAD]))
    shown = [int(o[SLIDER]["value"]) for o in round_updates(outputs)]
    assert PANEL_INTERVAL_S > 0 and len(trace.rounds) >= 12
    assert len(shown) < len(trace.rounds) and shown == sorted(set(shown)) and shown[-1] == len(trace.rounds)
    assert final[PLAIN] == trace.rounds[-1].text
    assert "".join(span["token"] for span in final[ANSWER]["value"]) == trace.rounds[-1].text
