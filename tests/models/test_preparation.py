"""Preparing members (issue 58): the steps a load goes through, their times remembered here, the
app's loading in the background while the page is read (a Run pressed meanwhile waits for that
same load, never a second one), the status line that says it, and what specfuse-serve's /health says."""

from __future__ import annotations

import threading
import time

import pytest

import app
from specfuse.models import preparation
from specfuse.models.preparation import STEPS, MemberClock, Preparation, Times, step_of, usual_text
from studio import SharedLoader
from studio.preparing import Preparing

from ..scripted import ScriptedMember


def test_the_load_messages_name_their_steps():
    # The messages cache.py, names.py and loading.py send, in the order a cold load sends them.
    said = {
        "gemma3-270m: assembling part 1/3": "copying",
        "gemma3-270m: verifying hash": "copying",
        "gemma3-270m: checking the SHA-256 of 4 cache file(s) (first load since written)": "copying",
        "gemma3-270m: converting GGUF (once; this takes a while)": "converting",
        "gemma3-270m: saving safetensors": "converting",
        "gemma3-270m: hashing the cache": "converting",
        "loading gemma3-270m": "loading",
        "gemma3-270m: loading": "loading",
        "gemma3-270m: loading gemma.gguf into llama.cpp": "loading",
        "qwen: loading the tokenizer (org/qwen)": "loading",
        "gemma3-270m: warming up": "warming up",
        "gemma3-270m: capturing graphs 3/24": "capturing graphs",  # members/hf/slots.py, on a GPU
        "gemma3-270m: capturing graphs failed: steps run uncaptured (CUDA graph capture failed: x)": (
            "capturing graphs"
        ),
        "gemma3-270m: ready on cpu": None,
    }
    assert {m: step_of(m) for m in said} == said
    assert set(said.values()) - {None} == set(STEPS)


def test_a_clock_times_each_step_and_knows_a_first_time_from_a_cached_one():
    lines = []
    clock = MemberClock("m", lines.append)
    clock.report(0.1, "m: assembling part 1/2")
    time.sleep(0.05)
    clock.report(0.3, "m: converting GGUF (once; this takes a while)")
    clock.report(0.8, "m: saving safetensors")  # the same step goes on
    clock.report(0.9, "m: loading")
    clock.step("warming up")
    total = clock.finish()
    assert list(clock.steps) == ["copying", "converting", "loading", "warming up"]
    assert clock.steps["copying"] >= 0.05 and total >= sum(clock.steps.values()) - 1e-6
    assert clock.cold
    assert lines[0] == "m: copying" and lines[1].startswith("m: copying took ")
    assert lines[-1].startswith("m: ready in ") and "converting" in lines[-1]
    cached = MemberClock("m", lines.append)
    cached.report(0.9, "m: loading")
    cached.finish()
    assert not cached.cold


def test_times_are_remembered_in_the_cache_folder_and_a_missing_one_is_said(tmp_path):
    times = Times(tmp_path)
    assert times.usual("m", "none", first=True) is None
    assert "no measurement yet on this machine" in usual_text(None, True)
    for seconds in (30.0, 10.0, 20.0):
        times.record("m", "none", True, seconds)
    times.record("m", "none", False, 4.0)
    again = Times(tmp_path)  # another process reads what this one measured
    assert again.usual("m", "none", first=True) == (20.0, 3)  # the median
    assert again.usual("m", "none", first=False) == (4.0, 1)
    assert again.usual("m", "gguf", first=False) is None  # another back end is another measurement
    text = usual_text(again.usual("m", "none", True), True)
    assert "about 20 s on this machine" in text and "measured 3 times" in text
    for seconds in range(10):
        times.record("m", "none", False, seconds)
    assert Times(tmp_path).usual("m", "none", first=False) == (7.0, preparation.KEPT)  # the latest kept
    (tmp_path / preparation.TIMES_FILE).write_text("not json")
    assert Times(tmp_path).usual("m", "none", first=True) is None  # unreadable: no measurement


def test_a_catalogue_model_without_its_converted_folder_is_a_first_time(tmp_path):
    from specfuse.models.cache import MARKER

    assert preparation.cold("smollm2-135m", "none", tmp_path)
    (tmp_path / "smollm2-135m").mkdir()
    (tmp_path / "smollm2-135m" / MARKER).write_text("{}")
    assert not preparation.cold("smollm2-135m", "none", tmp_path)
    assert not preparation.cold("some/folder", "none", tmp_path)  # nothing of ours to convert


class Gate:
    """A scripted load that reports its steps, then waits until opened: a slow cold load."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.open = threading.Event()
        self.fail = False

    def __call__(self, name, *, progress, **options):
        self.calls.append(name)
        progress(0.1, f"{name}: converting GGUF (once; this takes a while)")
        assert self.open.wait(10)
        progress(0.9, f"{name}: loading")
        if self.fail:
            raise RuntimeError(f"{name}: no such weights")
        return ScriptedMember(name, ["a "], len)


def test_a_run_pressed_while_the_app_prepares_waits_for_that_same_load_and_sees_its_progress():
    gate = Gate()
    loader = SharedLoader(gate)
    thread = loader.prepare(["m1", "m2"], ["cpu", "cpu"])
    seen: list[str] = []
    got = {}
    run = threading.Thread(target=lambda: got.update(m=loader("m1", "cpu", lambda f, m: seen.append(m))))
    run.start()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen and all("converting" in m for m in seen)  # the waiting Run shows the load under way
    assert loader.under_way("m1", "cpu") is not None
    gate.open.set()
    run.join(10)
    thread.join(10)
    assert gate.calls == ["m1", "m2"]  # one load each: the Run's was the background's
    assert got["m"] is loader("m1", "cpu", lambda f, m: None)
    assert got["m"].calls[:3] == [("start", "Say hello."), ("draft", 0), ("score", 0)]  # warmed up
    assert loader.under_way("m1", "cpu") is None and loader.loaded("m2", "cpu")


def test_a_failed_background_load_is_tried_again_by_the_run_that_asks_and_says_why():
    gate = Gate()
    gate.fail = True
    gate.open.set()
    loader = SharedLoader(gate)
    loader.prepare(["m1"], ["cpu"]).join(10)
    assert gate.calls == ["m1"] and not loader.loaded("m1", "cpu")
    with pytest.raises(Exception, match="no such weights"):
        loader("m1", "cpu", lambda f, m: None)
    assert gate.calls == ["m1", "m1"]
    gate.fail = False
    assert loader("m1", "cpu", lambda f, m: None).name == "m1"


def test_without_the_flag_the_app_prepares_its_default_members_and_with_it_nothing(monkeypatch):
    started = []
    monkeypatch.setattr(SharedLoader, "prepare", lambda self, names, places: started.append((names, places)))
    monkeypatch.setattr(app, "build_demo", lambda loader, **kw: None)
    monkeypatch.setattr(app, "serve", lambda demo, then=None, **kw: then and then())  # once the page answers
    monkeypatch.setattr(app, "installed_models", lambda: ["a", "b", "c"])
    monkeypatch.setattr(app, "CATALOGUE", {"a": None, "b": None, "c": None})
    app.main(["--models", "a", "b", "--device", "cpu", "--quantize", "none"])
    assert started == [(["a", "b"], ["cpu", "cpu"])]
    app.main(["--models", "a", "b", "--device", "cpu", "--quantize", "none", "--load-on-run"])
    assert len(started) == 1


def test_the_status_line_names_the_member_its_step_and_how_long_it_usually_takes():
    gate = Gate()
    loader = SharedLoader(gate)

    def load(names, device, progress, begin):  # Studio.load's shape
        members = []
        for name in names:
            begin(name, device)
            members.append(loader(name, device, lambda f, m: progress(f, desc=m)))
        return members

    job = Preparing.start(load, ["m1", "m2"], "cpu", loader.under_way)
    deadline = time.monotonic() + 5
    while "converting" not in (job.status() or "") and time.monotonic() < deadline:
        time.sleep(0.05)
    text = job.status() or ""
    assert "**m1** (1 of 2), **converting**" in text and "then m2" in text
    assert "no measurement yet on this machine" in text  # nothing measured in this test's cache
    gate.open.set()
    assert [m.name for m in job.result()] == ["m1", "m2"]


def test_a_servers_health_says_the_member_and_step_while_it_prepares(tmp_path):
    lines = []
    prep = Preparation(["a", "b"], lambda name: "none", lines.append, tmp_path)
    assert prep.snapshot()["phase"] == "preparing" and prep.snapshot()["member"] is None
    prep.progress(0.1, "a: converting GGUF (once; this takes a while)")
    said = prep.snapshot()
    assert (said["member"], said["step"], said["usual_s"]) == ("a", "converting", None)
    prep.progress(0.5, "b: loading")
    prep.progress(0.9, "b: warming up")
    assert prep.snapshot()["member"] == "b" and prep.snapshot()["step"] == "warming up"
    prep.ready()
    assert prep.snapshot()["phase"] == "ready" and prep.snapshot()["progress"] == 1.0
    assert any(line.startswith("a: converting took ") for line in lines)
    assert any(line.startswith("b: ready in ") for line in lines)
    assert Times(tmp_path).usual("a", "none", first=True) is not None  # remembered for next time
    assert Times(tmp_path).usual("b", "none", first=False) is not None


def test_the_status_line_counts_the_graphs_capture_as_a_step_on_a_gpu_only():
    from studio.preparing import Preparing

    job = Preparing(["a", "b"])
    job.begin("a", "cuda:0")
    job.report(0.95, "a: capturing graphs 3/24")
    assert "**a** (1 of 2), **capturing graphs** (step 5 of 5)" in (job.status() or "")
    job.begin("b", "cpu")
    job.report(0.92, "b: warming up")
    assert "**b** (2 of 2), **warming up** (step 4 of 4)" in (job.status() or "")


def test_the_apps_loader_times_the_capture_as_a_step_in_the_last_tenth_of_its_bar():
    from studio.loading import report_warm

    clock, bar = MemberClock("a", say=lambda line: None), []
    clock.step("warming up")
    report_warm(clock, lambda f, m: bar.append((round(f, 3), m)), 0.5, "a: capturing graphs 12/24")
    assert clock.step_now == "capturing graphs" and "warming up" in clock.steps
    assert bar == [(0.955, "a: capturing graphs 12/24")]
