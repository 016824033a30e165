"""Reference runs and the checks that compare runs: the prompts the comparisons run on, a request run
alone, a ticket's events collected, a member's scores read directly, and what two runs (or one run's
rounds) must agree on. The batched, scheduled, compiled and llama.cpp paths are checked against these."""

from __future__ import annotations

import threading
import time

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.records import Draft, Finished, Round

PROMPTS = ["Once upon a time", "Écris 猫 in code: x_1 =", "Why is the sky blue? Explain it to a child."]


def chat(system: str, *turns: str) -> list[dict[str, str]]:
    """A conversation as OpenAI's messages: the system prompt, then `turns`, the user's and the
    assistant's in turn (the user's first)."""
    said = [{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(turns)]
    return [{"role": "system", "content": system}, *said]


# The conversation tests' prompt: a system prompt and three questions, the first two answered.
SYSTEM_AND_THREE_TURNS = chat(
    "Answer in one short sentence.",
    "What colour is the sky?",
    "Blue, on a clear day.",
    "And at night?",
    "Dark, with stars.",
    "Why is that?",
)


def flat(matrix):
    return [v for row in matrix for v in row]


def same_rounds(a, b, atol=1e-4):
    """Two runs of one prompt agree: same candidates, choices, texts; scores within atol (fp32)."""
    assert [r.k for r in a] == [r.k for r in b]
    for x, y in zip(a, b):
        assert [c.text for c in x.candidates] == [c.text for c in y.candidates]
        assert [c.final for c in x.candidates] == [c.final for c in y.candidates]
        assert x.chosen == y.chosen and x.text == y.text and x.stop_reason == y.stop_reason
        assert flat(x.raw_scores) == pytest.approx(flat(y.raw_scores), abs=atol)
        assert x.weights_after == pytest.approx(y.weights_after, abs=atol)
        assert [e.member for e in x.exits] == [e.member for e in y.exits]


def check_invariants(rounds):
    answer = ""
    for r in rounds:
        answer += r.winner.text
        assert r.text == answer
        assert len(r.raw_scores) == len(r.scores) == len(r.verifiers)
        assert all(len(row) == len(r.candidates) for row in r.scores)
        assert all(sum(row) == pytest.approx(1.0) for row in r.scores)
        assert sum(r.weights_after) == pytest.approx(1.0)
        assert r.aggregate[r.chosen] == max(y for y, ok in zip(r.aggregate, r.eligible) if ok)
        assert all(c.num_tokens <= 10 + 4 for c in r.candidates)
        assert "\ufffd" not in r.winner.text
    assert rounds[-1].stop_reason in ("final", "budget", "stop")


def solo(members, names, prompt, config, **branch):
    chosen = [m for m in members if m.name in names]
    chosen.sort(key=lambda m: names.index(m.name))
    return list(Ensemble(chosen).stream(prompt, config, **branch))


def collect(ticket):
    """A ticket's drafts and rounds, once its stream has ended with Finished("done")."""
    events = list(ticket.events(timeout=120))
    assert events[-1] == Finished("done") and not any(isinstance(e, Finished) for e in events[:-1])
    drafts = [e for e in events if isinstance(e, Draft)]
    return drafts, [e for e in events if isinstance(e, Round)]


def collected_apart(scheduler, jobs, gap: float) -> list[tuple[list, list]]:
    """Each job (prompt, config, members) submitted to `scheduler` by a client thread of its own, the
    i-th `gap`·i seconds after the first (arrivals spread over the first rounds of the others):
    each one's collect(), in order. The scheduler is closed afterwards."""
    got: dict[int, tuple[list, list]] = {}

    def client(i: int) -> None:
        time.sleep(gap * i)
        prompt, config, members = jobs[i]
        got[i] = collect(scheduler.submit(prompt, config, members=members))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        scheduler.close()
    return [got[i] for i in range(len(jobs))]


def streamed_many(ensemble, prompts, batch_size: int) -> list[list]:
    """Each prompt's rounds from one rolling batch of `batch_size` (Ensemble.stream_many), in order."""
    got: dict[int, list] = {}
    for i, rnd in ensemble.stream_many(prompts, batch_size=batch_size):
        got.setdefault(i, []).append(rnd)
    return [got[i] for i in range(len(prompts))]


def scores_by_hand(member, prompt: str, answer: str, candidates, config: EnsembleConfig) -> list[float]:
    settings = config.member_settings(0)
    state = member.start(prompt, settings)
    if answer:
        member.accept(state, answer)
    return member.score(state, candidates)


def rounds_played(scheduler, monkeypatch) -> list[set[str]]:
    """The runs (their ids) that play each round of the scheduler's batch, in order (a test's look
    inside: the Scheduler shows no batch)."""
    played: list[set[str]] = []
    real = scheduler._batch.step

    def step():
        played.append({run.id for run in scheduler._batch.live if not run.cancelled})
        return (yield from real())

    monkeypatch.setattr(scheduler._batch, "step", step)
    return played
