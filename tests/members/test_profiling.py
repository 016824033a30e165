"""specfuse.profiling and `bench serve --profile`'s report: nothing is kept while nobody profiles; a
Scheduler's batch of real (tiny, random-weight) members reports its phases, member calls and forward
passes, and the report's figures are those tallies."""

from __future__ import annotations

import json
import threading

import pytest

from specfuse import EnsembleConfig
from specfuse.bench.profile_report import format_profile, gflops, tallies
from specfuse.engine import Scheduler
from specfuse.members import profiling

from ..conftest import tiny_member


def test_reports_are_dropped_while_nobody_profiles_and_kept_from_every_thread_while_one_does():
    profiling.add("x", seconds=1.0, items=3)
    assert not profiling.active()
    with profiling.profiling() as profile:
        assert profiling.active()
        profiling.add("x", seconds=1.0, items=3)
        worker = threading.Thread(target=lambda: profiling.add("x", seconds=0.5, items=5))
        worker.start()
        worker.join()
        with profiling.timed("block", items=2):
            pass
    profiling.add("x", seconds=9.0, items=9)  # after the block: not counted
    snapshot = profile.snapshot()
    found = tallies(snapshot)
    assert found[("x",)] == {"key": ["x"], "calls": 2, "seconds": 1.5, "items": 8, "most": 5}
    assert found[("block",)]["calls"] == 1 and found[("block",)]["items"] == 2
    assert snapshot["wall_s"] > 0 and json.loads(json.dumps(snapshot)) == snapshot
    assert not profiling.active()


@pytest.fixture(scope="module")
def two_members():
    return [tiny_member("llama-a", "llama-bytes"), tiny_member("qwen-b", "qwen-merges")]


def test_a_batch_of_runs_reports_its_phases_member_calls_and_forward_passes(two_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=12, verify="always", exit=False)
    scheduler = Scheduler(two_members, config, batch_size=4, parallel="off")
    try:
        with profiling.profiling() as profile:
            tickets = [scheduler.submit(f"prompt {i}") for i in range(3)]
            assert all(t.wait(120) for t in tickets)
    finally:
        scheduler.close()
    snapshot = profile.snapshot()
    p = {"/".join(key): t for key, t in tallies(snapshot).items()}
    rounds = max(len(t.rounds) for t in tickets)
    assert p["phase/draft"]["calls"] >= rounds
    assert p["phase/verify"]["calls"] >= rounds
    # Each member was asked once per phase for all the runs it served: up to three runs a call.
    for name in ("llama-a", "qwen-b"):
        draft = p[f"member/draft/{name}"]
        assert draft["most"] == 3 and draft["items"] >= 3
        forward = p[f"forward/{name}"]
        assert forward["calls"] >= draft["calls"] and forward["items"] >= forward["calls"]
        assert p[f"threads/{name}"]["most"] >= 1
    level = {"clients": 3, "tokens_per_s": 1.0, "profile": snapshot}
    parameters = {m.name: m.parameters for m in two_members}
    text = format_profile(level, parameters)
    assert "where the time went at 3 clients" in text and "torch forward" in text
    assert "llama-a draft" in text and "qwen-b score" in text
    tokens = sum(p[f"forward/{m}"]["items"] * 2 * parameters[m] for m in parameters)
    assert gflops(snapshot, parameters) == pytest.approx(tokens / 1e9)
    assert f"{gflops(snapshot, parameters):.0f} GFLOP" in text
