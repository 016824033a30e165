"""Members in worker processes of their own: the same answers as in this process, errors that say
what happened, and the engine running them at the same time."""

from __future__ import annotations

import functools
import gc
import os
import threading
import time

import pytest

from specfuse import Ensemble, EnsembleConfig, MemberError
from specfuse.errors import PromptTooLongError
from specfuse.members.hf import HFMember
from specfuse.members.process import ProcessMember, ProcessState, on_member, processes_pay_off, wanted
from specfuse.members.workers import MemberWorkers, cpu_cores, run_concurrently, thread_shares
from specfuse.models.placement import load_members

from ..conftest import TINY_SPECS, tiny_member
from ..runs import chat
from ..scripted import ScriptedMember

NAMES = list(TINY_SPECS)[:3]


@pytest.fixture(scope="module")
def in_processes():
    members = [ProcessMember(functools.partial(tiny_member, n), threads=1) for n in NAMES]
    yield members
    for m in members:
        m.close()


@pytest.mark.slow
def test_an_ensemble_of_process_members_gives_the_same_rounds_as_members_here(in_processes):
    config = EnsembleConfig(segment_len=4, max_new_tokens=32)
    here = list(Ensemble([tiny_member(n) for n in NAMES], config).stream("The cat sat"))
    there = list(Ensemble(in_processes, config).stream("The cat sat"))
    assert [m.name for m in in_processes] == NAMES
    assert there[-1].text == here[-1].text and len(there) == len(here) >= 2
    for a, b in zip(there, here):
        assert [c.text for c in a.candidates] == [c.text for c in b.candidates]
        assert a.chosen == b.chosen
        for row_a, row_b in zip(a.raw_scores, b.raw_scores, strict=True):
            assert row_a == pytest.approx(row_b, abs=1e-5)


def test_a_conversation_crosses_the_pipe_and_is_answered_as_here(in_processes):
    conversation = chat("Be brief.", "Hi<|user|>", "Hello.", "And then?")
    config = EnsembleConfig(segment_len=4, max_new_tokens=16)
    here = Ensemble([tiny_member(n) for n in NAMES], config).run(conversation)
    assert Ensemble(in_processes, config).run(conversation).answer == here.answer


def test_process_members_run_at_the_same_time_under_auto(in_processes):
    # `device` is the device; `host` tells the engine each member works in a place of its own.
    assert all(m.device == "cpu" and m.host.startswith("process ") for m in in_processes)
    assert len({m.host for m in in_processes}) == len(in_processes)
    assert run_concurrently(in_processes, "auto") and not run_concurrently(in_processes, "off")
    # HFMember batches and keeps token evidence: the proxy forwards both.
    member = in_processes[0]
    states = [member.start(p, EnsembleConfig().member_settings(0)) for p in ("Hi", "Yo")]
    drafts = member.draft_many(states, [3, 3])
    verdicts = member.score_many(states, [drafts, drafts])
    assert len(verdicts) == 2 and all(len(z) == 2 and len(ev) == 2 for z, ev in verdicts)


def test_batched_runs_through_process_members_match_one_at_a_time(in_processes):
    config = EnsembleConfig(segment_len=4, max_new_tokens=24)
    prompts = ["The cat sat", "Numbers: 1, 2,"]
    ensemble = Ensemble(in_processes, config)
    finals = {i: r.text for i, r in ensemble.stream_many(prompts, config, batch_size=2)}
    assert [finals[0], finals[1]] == [ensemble.run(p).answer for p in prompts]


def test_start_many_crosses_the_pipe_with_each_requests_own_error(in_processes):
    member = in_processes[0]
    settings = EnsembleConfig(max_new_tokens=20).member_settings(0)
    got = member.start_many(["Hi", "word " * 150, "Yo"], [settings] * 3)
    assert isinstance(got[1], PromptTooLongError) and f"{member.name}: the prompt takes" in str(got[1])
    assert isinstance(got[0], ProcessState) and isinstance(got[2], ProcessState)
    assert member.draft(got[2], 4).text == member.draft(member.start("Yo", settings), 4).text
    del got
    gc.collect()
    assert member._call("describe")["name"] == member.name  # a call carries the dropped handles
    assert member._call("held") == 0


def test_a_prompt_opened_and_read_in_parts_crosses_the_pipe(in_processes):
    member = in_processes[0]
    settings = EnsembleConfig(max_new_tokens=20).member_settings(0)
    prompt = "Tell me a story about the sea and a lighthouse."
    opened = member.open_many([prompt, "word " * 150], [settings] * 2)
    assert isinstance(opened[0], ProcessState) and isinstance(opened[1], PromptTooLongError)
    parts = 1
    while member.prefill_many([opened[0]], 5) != [True]:
        parts += 1
    assert parts > 2
    assert member.draft(opened[0], 6).text == member.draft(member.start(prompt, settings), 6).text


def test_states_are_released_in_the_worker_when_collected_here(in_processes):
    member = in_processes[0]
    for _ in range(3):
        Ensemble(in_processes, EnsembleConfig(segment_len=4, max_new_tokens=8)).run("Hi")
    assert member._call("describe")["name"] == member.name  # a call carries the dropped handles
    assert member._call("held") == 0


def where_it_runs(member, label):
    """What on_member's function sees: the member itself (not a handle) and the process it is in."""
    return type(member).__name__, member.name, os.getpid(), label, gc.get_freeze_count()


def test_a_function_runs_on_the_member_where_it_lives_and_a_worker_froze_its_start_up(in_processes):
    there = in_processes[1]
    kind, name, pid, label, frozen = on_member(there, where_it_runs, "asked")
    assert (kind, name, label) == ("HFMember", there.name, "asked")
    assert pid == there._process.pid != os.getpid()
    # The worker kept what its build made out of the collector's full passes (heap.freeze_survivors).
    assert frozen > 10_000
    here = tiny_member(NAMES[1])
    assert on_member(here, where_it_runs, "asked")[:4] == ("HFMember", here.name, os.getpid(), "asked")
    with pytest.raises(TypeError):  # the function's own error, and the worker goes on
        on_member(there, where_it_runs)
    assert on_member(there, getattr, "name") == there.name


def test_an_error_in_the_worker_comes_back_with_its_type_and_the_worker_stays(in_processes):
    member = in_processes[0]
    with pytest.raises(KeyError):
        member._call("draft", 10**9, 4)  # no such state
    assert member._call("describe")["name"] == member.name


def test_a_build_that_fails_says_why_and_leaves_no_process():
    with pytest.raises(KeyError, match="no-such-tiny"):
        ProcessMember(functools.partial(tiny_member, "no-such-tiny"))


def test_a_worker_that_dies_gives_a_member_error_naming_it():
    member = ProcessMember(functools.partial(tiny_member, NAMES[0]), threads=1)
    member._process.kill()
    member._process.join(10)
    with pytest.raises(MemberError, match=f"{NAMES[0]}: its worker process ended"):
        Ensemble([member, tiny_member(NAMES[1])], EnsembleConfig(max_new_tokens=8)).run("Hi")
    member.close()


def hangs_in_draft(name: str):
    """A tiny member whose drafts never return, as a worker hung in a kernel or a deadlock would
    (module-level: the spawned worker process builds it)."""
    member = tiny_member(name)

    def forever(*args, **kwargs):
        threading.Event().wait()

    member.draft = member.draft_many = forever
    return member


def test_a_worker_that_misses_its_deadline_is_stopped_and_its_member_says_why():
    member = ProcessMember(functools.partial(hangs_in_draft, NAMES[0]), threads=1, call_timeout=2.0)
    try:
        began = time.monotonic()
        with pytest.raises(
            MemberError,
            match=rf"^{NAMES[0]}: its worker process did not answer draft_many within its 2 s deadline",
        ):
            Ensemble([member, tiny_member(NAMES[1])], EnsembleConfig(max_new_tokens=8)).run("Hi")
        assert time.monotonic() - began < 2.0 + 10  # the deadline, then ending the process
        assert not member.alive
        with pytest.raises(
            MemberError,
            match=rf"{NAMES[0]}: its worker process was stopped after missing its 2 s deadline "
            "during draft_many; load the member again",
        ):
            member.start("Hi", EnsembleConfig().member_settings(0))
    finally:
        member.close()


def named_by_its_surroundings(key: str):
    """A member (built in the worker) whose name is the worker's `key` variable and working folder."""
    return ScriptedMember(f"{os.environ.get(key)}@{os.getcwd()}", ["x "], len)


def test_a_worker_takes_the_parents_environment_and_folder_as_they_are_when_it_starts(
    in_processes, monkeypatch, tmp_path
):
    # The fork server started with the module's first workers (forked from it, not spawned); a worker
    # forked from it now still sees what the parent set since, as a spawned process would.
    assert type(in_processes[0]._process._popen).__module__ == "multiprocessing.popen_forkserver"
    monkeypatch.setenv("SPECFUSE_PROBE", "set-after-the-server-started")
    monkeypatch.chdir(tmp_path)
    member = ProcessMember(functools.partial(named_by_its_surroundings, "SPECFUSE_PROBE"))
    try:
        assert member.name == f"set-after-the-server-started@{tmp_path}"
    finally:
        member.close()


def test_a_call_deadline_must_be_positive():
    with pytest.raises(ValueError, match="call_timeout must be a positive number of seconds"):
        ProcessMember(functools.partial(tiny_member, NAMES[0]), call_timeout=0)


def test_the_engine_gives_each_cpu_worker_process_its_share_then_every_core_again(in_processes):
    assert [m.parameters for m in in_processes] == [tiny_member(n).model.num_parameters() for n in NAMES]
    cores = cpu_cores()
    workers = MemberWorkers(in_processes)
    try:
        assert workers.shares == thread_shares({m.name: m.parameters for m in in_processes}, cores)
        assert [m.threads_now() for m in in_processes] == [workers.shares[m.name] for m in in_processes]
    finally:
        workers.shutdown()
    assert [m.threads_now() for m in in_processes] == [cores] * len(in_processes)


@pytest.mark.parametrize(
    ("devices", "cores", "expected"),
    [
        (["cpu"] * 3, 2, False),  # two cores: threads measured faster (1.23x vs 1.14x)
        (["cpu"] * 3, 4, False),  # about even (1.02x vs 1.05x): threads load faster
        (["cpu"] * 3, 8, True),  # processes 1.71x, threads 1.25x
        (["cpu"], 16, False),  # one member: nothing runs at the same time
        (["cuda:0"] * 3, 16, True),  # one GPU shared: processes 1.64x, threads 0.91x
        (["cuda:0", "cuda:1"], 16, False),  # a GPU each: threads already run them at once
    ],
)
def test_auto_picks_processes_where_they_measured_faster(devices, cores, expected):
    assert processes_pay_off(devices, cores) is expected
    assert wanted("auto", devices, cores) is expected
    assert wanted("on", devices, cores) and wanted(True, devices, cores)
    assert not wanted("off", devices, cores) and not wanted(False, devices, cores)


def test_an_unknown_processes_setting_says_what_it_takes():
    with pytest.raises(ValueError, match="'auto', 'on' or 'off', not 'sometimes'"):
        wanted("sometimes", ["cpu"], 2)


@pytest.mark.slow
def test_load_members_auto_follows_the_cores(tiny_checkpoints, monkeypatch):
    paths = tiny_checkpoints[:2]
    monkeypatch.setattr("specfuse.models.placement.cpu_cores", lambda: 2)
    assert all(type(m) is HFMember for m in load_members(paths, processes="auto"))
    monkeypatch.setattr("specfuse.models.placement.cpu_cores", lambda: 16)
    assert all(type(m) is HFMember for m in load_members(paths, processes="auto", device_map="auto"))
    members = load_members(paths, processes="auto")
    try:
        assert all(type(m) is ProcessMember for m in members)
        assert [m.threads_now() for m in members] == [8, 8]  # the cores divided until a run sets shares
    finally:
        for m in members:
            m.close()
