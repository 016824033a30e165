"""Members at the same time: thread shares on one CPU, the auto rule, one thread per member."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.members import workers as workers_module
from specfuse.members.workers import MemberWorkers, rebalance, run_concurrently, thread_shares
from specfuse.records import Draft, Round

from ..scripted import ScriptedMember


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("sizes", "cores", "expected"),
    [
        ({"a": 1.0, "b": 1.0, "c": 1.0}, 2, {"a": 1, "b": 1, "c": 1}),  # fewer cores than members
        ({"a": 1.0, "b": 1.0}, 2, {"a": 1, "b": 1}),
        ({"small": 135.0, "mid": 270.0, "big": 494.0}, 16, {"small": 3, "mid": 5, "big": 8}),
        ({"a": 3.0, "b": 1.0}, 4, {"a": 3, "b": 1}),
        ({"a": 0.0, "b": 0.0}, 6, {"a": 3, "b": 3}),  # sizes unknown: an even split
    ],
)
def test_thread_shares_follow_member_size_and_never_leave_a_member_without_a_thread(sizes, cores, expected):
    shares = thread_shares(sizes, cores)
    assert shares == expected
    assert sum(shares.values()) == max(cores, len(sizes))


def test_each_cpu_member_works_on_its_own_thread_with_its_share_and_the_process_count_is_restored(
    tiny_members, two_threads
):
    big, *rest = sorted(tiny_members, key=lambda m: -m.model.num_parameters())
    workers = MemberWorkers(tiny_members)
    try:
        assert workers.shares == {m.name: 1 for m in tiny_members}  # three members, two cores
        everyone_in = threading.Barrier(3)  # measured while all three are at work

        def where_together(name: str) -> tuple[str, int]:
            everyone_in.wait(timeout=10)
            return _where(name)

        seen = dict(workers.as_completed(where_together, [m.name for m in tiny_members]))
        assert {threads for _, threads in seen.values()} == {1}
        assert len({thread for thread, _ in seen.values()}) == 3
        assert all(thread.startswith(f"specfuse-{name}") for name, (thread, _) in seen.items())
        # Alone (the others exited), a member runs here with every core instead of its share.
        assert list(workers.as_completed(_where, [big.name])) == [
            (big.name, (threading.current_thread().name, 2))
        ]
    finally:
        workers.shutdown()
    # A thread started later (the app's next request) still gets the process's two threads.
    later: list[int] = []
    thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert later == [2] and torch.get_num_threads() == 2


def test_a_member_still_working_takes_over_the_cores_of_those_done(tiny_members, two_threads):
    first, second = tiny_members[:2]
    workers = MemberWorkers([first, second])
    done, started = threading.Event(), threading.Event()

    def work(name: str) -> tuple[int, int]:
        if name == first.name:
            started.wait(timeout=10)  # both at work
            done.set()
            return torch.get_num_threads(), 0
        at_start = torch.get_num_threads()
        started.set()
        done.wait(timeout=10)
        time.sleep(0.05)  # the first member's call has returned and left the working set
        rebalance()  # what HFMember does before each decoding step
        return at_start, torch.get_num_threads()

    try:
        got = dict(workers.as_completed(work, [first.name, second.name]))
        assert got[first.name] == (1, 0)
        assert got[second.name] == (1, 2)  # one core while both worked, both once the other was done
        # The next phase starts with the shares again (the second member had kept two threads).
        both_in = threading.Barrier(2)

        def threads_now(name: str) -> int:
            both_in.wait(timeout=10)
            return torch.get_num_threads()

        assert dict(workers.as_completed(threads_now, [first.name, second.name])) == {
            first.name: 1,
            second.name: 1,
        }
        # The last share set was one thread; a thread started now (the app's next request) still
        # gets the process's two.
        workers_module._RESTORER.submit(lambda: None).result()
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert later == [2]
    finally:
        workers.shutdown()


def _where(name: str) -> tuple[str, int]:
    return threading.current_thread().name, torch.get_num_threads()


def test_auto_runs_members_at_once_on_a_multicore_cpu_only(tiny_members):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert run_concurrently(tiny_members, "auto")
        assert not run_concurrently(tiny_members, "off")
        assert not run_concurrently(tiny_members[:1], "auto") and not run_concurrently(tiny_members[:1], "on")
        torch.set_num_threads(1)
        assert not run_concurrently(tiny_members, "auto")  # one core: nothing to divide
        assert run_concurrently(tiny_members, "on")
    finally:
        torch.set_num_threads(before)
    scripted = [ScriptedMember(n, ["x"], lambda t: 1.0) for n in "ab"]
    for m, device in zip(scripted, ["cuda:0", "cuda:1"]):
        m.device = device
    assert run_concurrently(scripted, "auto")  # several devices
    scripted[1].device = "cuda:0"
    assert not run_concurrently(scripted, "auto")  # one GPU: streams only when asked ("on")
    # Members that all run faster in turns on a CPU (llama.cpp on AVX2 kernels) take turns there.
    on_cpu = [ScriptedMember(n, ["x"], lambda t: 1.0) for n in "ab"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert run_concurrently(on_cpu, "auto")
        on_cpu[0].cpu_turns = True
        assert run_concurrently(on_cpu, "auto")  # one of them only: at once
        on_cpu[1].cpu_turns = True
        assert not run_concurrently(on_cpu, "auto") and run_concurrently(on_cpu, "on")
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("exit", [False, True])
def test_members_at_the_same_time_give_the_rounds_of_members_in_turn(tiny_members, two_threads, exit):
    config = EnsembleConfig(
        max_new_tokens=40, segment_len=5, exit=exit, exit_warmup=1, exit_threshold=1.0, learning_rate=5.0,
    )  # fmt: skip
    prompt = "Why is the sky blue? Explain it to a child."
    turns = list(Ensemble(tiny_members, config, parallel="off").stream(prompt))
    at_once = list(Ensemble(tiny_members, config, parallel="on").stream(prompt))
    assert (len(turns[-1].active) < 3) == exit  # with exit on, members do leave, at the same rounds
    assert [r.text for r in turns] == [r.text for r in at_once]
    assert [r.active for r in turns] == [r.active for r in at_once]
    for a, b in zip(turns, at_once):
        assert [x for row in a.raw_scores for x in row] == pytest.approx(
            [x for row in b.raw_scores for x in row], abs=1e-4
        )


def test_events_yield_each_candidate_as_its_drafter_finishes_fastest_first():
    judge = lambda text: float(len(text))  # noqa: E731
    slow = ScriptedMember("slow", [" slow one", " slow two"], judge, draft_delay=0.4)
    fast = ScriptedMember("fast", [" quick", " quick again"], judge)
    config = EnsembleConfig(max_rounds=2, exit=False, prior="uniform")
    events = list(Ensemble([slow, fast], config, parallel="on").events("go"))
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Draft", "Draft", "Round", "Draft", "Draft", "Round"]
    drafts = [e for e in events if isinstance(e, Draft)]
    assert [d.candidate.member for d in drafts] == ["fast", "slow", "fast", "slow"]  # not ensemble order
    assert drafts[0].elapsed < 0.3 < drafts[1].elapsed  # the fast candidate came before the slow one ended
    rounds = [e for e in events if isinstance(e, Round)]
    for k, rnd in enumerate(rounds, 1):
        arrived = {d.candidate for d in drafts if d.k == k}
        assert arrived == set(rnd.candidates) and all(d.elapsed <= rnd.elapsed for d in drafts if d.k == k)
    assert [r.text for r in Ensemble([slow, fast], config, parallel="on").stream("go")] == [
        r.text for r in rounds
    ]


def test_stream_is_events_without_the_drafts(tiny_members):
    config = EnsembleConfig(max_new_tokens=20, segment_len=5)
    events = list(Ensemble(tiny_members, config, parallel="off").events("Hi there"))
    drafts = [e for e in events if isinstance(e, Draft)]
    rounds = list(Ensemble(tiny_members, config, parallel="off").stream("Hi there"))
    assert [r.text for r in rounds] == [e.text for e in events if isinstance(e, Round)]
    assert len(drafts) == sum(len(r.active) for r in rounds)
    # Members in turn: candidates arrive in ensemble order.
    assert [d.candidate.member for d in drafts[:3]] == [m.name for m in tiny_members]
