"""The app's Run as one request (issue 57, item 2): Run's parameters written once (studio.request's
RunForm: the API's keywords, their order and the request made from them), the one prologue every run
shares (Studio.begin: check, config, check, load, submit), and a ticket's trace as of a round read."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest

import app
from specfuse import EnsembleConfig
from specfuse.config import settings
from specfuse.engine import Scheduler
from studio import handlers
from studio.request import RunForm, RunRequest
from studio.serving import Held, Schedulers

from ..scripted import ScriptedMember, prefers


def test_run_and_the_follow_up_take_every_parameter_by_keyword_in_one_order():
    demo = app.build_demo(lambda name, device, progress: None, choices=["a", "b"], default_models=["a", "b"])
    endpoints = demo.get_api_info()["named_endpoints"]
    run = [p["parameter_name"] for p in endpoints["/run"]["parameters"]]
    ask = [p["parameter_name"] for p in endpoints["/followup"]["parameters"]]
    form = run[2:-5]  # the settings, in the form's order (the conversation's state is no API parameter)
    assert sorted(form) == sorted(s.name for s in settings())
    assert run == ["members", "prompt", *form, "device", "compare", "view_name", "step", "system"]
    assert ask == ["members", "question", *form, "device", "compare", "view_name", "system"]  # never steps
    assert "step=True" in endpoints["/run"]["description"]


def test_the_request_is_made_from_the_values_by_keyword():
    with gr.Blocks():
        widgets = {"segment_len": gr.Number(10), "seed": gr.Number(0)}
        form = RunForm(
            gr.Dropdown(["a", "b"], multiselect=True),
            gr.Textbox(),
            widgets,
            gr.Dropdown(["cpu"], value="cpu"),
            gr.Checkbox(False),
            gr.Radio(["normalized", "raw"], value="normalized"),
            step=gr.Checkbox(False),
            system=gr.Textbox(),
            chat=gr.State(None),
        )
    assert len(form.inputs()) == len(form.parameters()) == 10
    page = SimpleNamespace(session_hash="s1")  # what session_of reads of Gradio's request
    values = [["a", "b"], "Hi", 4, 7, "cpu", True, "raw", True, "Be brief.", None, print, page]
    request = form.request(values)
    assert (request.members, request.prompt, dict(request.settings)) == (
        ["a", "b"],
        "Hi",
        {"segment_len": 4, "seed": 7},
    )
    assert (request.device, request.compare, request.view, request.step) == ("cpu", True, "raw", True)
    assert (request.system, request.progress, request.session) == ("Be brief.", print, "s1")
    assert request.config() == EnsembleConfig(segment_len=4, seed=7)
    with pytest.raises(ValueError):  # a value too many (or too few) is refused, never shifted
        form.request([*values[:3], 5, *values[3:]])


def studio(loader, choices=("a", "b")) -> handlers.Studio:
    from specfuse.models import devices

    # the prologue touches no component with say=False (the status line is the page's)
    return handlers.Studio(loader, list(choices), False, devices.plan_devices, None, None, None)  # type: ignore[arg-type]


def begin(s: handlers.Studio, request: RunRequest, held: Held | None = None):
    """Run the prologue to its end: (ticket, members), or its gr.Error."""
    unloadable = lambda e: f"cannot load them: {e}"  # noqa: E731 (a branch's words)
    prologue = s.begin(request, held or Held(), say=False, unloadable=unloadable)
    try:
        while True:
            next(prologue)
    except StopIteration as done:
        return done.value


def test_the_prologue_checks_before_it_loads_and_words_what_cannot_load():
    asked: list[str] = []

    def failing(name, device, progress):
        asked.append(name)
        raise RuntimeError("no such weights")

    s = studio(failing)
    with pytest.raises(gr.Error) as unknown:  # the members first: a branch's own words for them
        begin(s, RunRequest(["a", "zz"], "Hi", {}, "cpu"))
    assert "cannot load them" in str(unknown.value) and "Unknown model" in str(unknown.value)
    with pytest.raises(gr.Error) as empty:  # then the config and the request: their own words
        begin(s, RunRequest(["a", "b"], "  ", {}, "cpu"))
    assert "is empty" in str(empty.value) and "cannot load" not in str(empty.value)
    with pytest.raises(gr.Error) as setting:
        begin(s, RunRequest(["a", "b"], "Hi", {"segment_len": "ten"}, "cpu"))
    assert "must be a number" in str(setting.value) and "cannot load" not in str(setting.value)
    assert asked == []  # nothing loaded for a request refused
    with pytest.raises(gr.Error) as load:
        begin(s, RunRequest(["a", "b"], "Hi", {}, "cpu"))
    assert "cannot load them" in str(load.value) and "no such weights" in str(load.value)


def test_the_prologue_submits_the_request_to_the_batch_and_holds_its_ticket():
    members = {n: ScriptedMember(n, [f"{n}{n} "] * 9, prefers("aa ")) for n in ("a", "b")}
    s = studio(lambda name, device, progress: members[name])
    s.schedulers = Schedulers()
    try:
        held = Held()
        ticket, loaded = begin(s, RunRequest(["b", "a"], "Go", {"max_rounds": "2"}, "cpu"), held)
        assert held.ticket is ticket and [m.name for m in loaded] == ["b", "a"]
        assert ticket.members == ("b", "a") and ticket.config.max_rounds == 2
        assert ticket.wait(30) and ticket.trace().rounds[-1].text == "aa aa "
    finally:
        s.schedulers.close()


def test_a_tickets_trace_as_of_a_round_leaves_out_the_rounds_played_after_it():
    members = [ScriptedMember(n, [f"{n} "] * 9, prefers("a ")) for n in ("a", "b")]
    scheduler = Scheduler(members)
    try:
        ticket = scheduler.submit("Go", EnsembleConfig(max_rounds=3))
        assert ticket.wait(30)
        assert [r.k for r in ticket.trace().rounds] == [1, 2, 3]
        early = ticket.trace(upto=2)
        assert [r.k for r in early.rounds] == [1, 2] and early.id == ticket.id and early.prompt == "Go"
    finally:
        scheduler.close()
