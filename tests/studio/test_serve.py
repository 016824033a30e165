"""The app through the batching scheduler (issue 20, item 2), with gradio_client against a launched
server: the runs of several sessions in one batch, each its own; a place in line; Stop ends only its
own run; Compare and Branch through the same batch; and the OpenAI-compatible API mounted beside the
page (item 3), one scheduler for browser and API users."""

from __future__ import annotations

import html
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
from gradio_client import Client
from torch import nn

import app
from specfuse import Ensemble, EnsembleConfig, load_trace
from specfuse.models.quantize import QuantizedLinear
from specfuse.serve.api import create_app
from studio.serving import STATUS_TIMER_GUARD, Schedulers

from ..conftest import TINY_SPECS, free_port, tiny_member
from ..helpers_app import (
    ANSWER,
    COMPARE,
    DOWNLOAD,
    SLIDER,
    STATUS,
    client_on,
    launched,
    path_of,
    round_updates,
    submit,
)
from ..scripted import ScriptedMember, looping

TINY = list(TINY_SPECS)
CONFIG = EnsembleConfig(segment_len=4, max_new_tokens=24)  # helpers_app.submit's settings


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    members = {name: tiny_member(name) for name in TINY}
    members |= looping(draft_delay=0.05)
    schedulers = Schedulers(batch_size=2)  # two runs play at once: a third waits in line
    api = create_app(schedulers.of([members[n] for n in TINY]))  # the app's own scheduler
    build = {"default_models": TINY[:2], "schedulers": schedulers}
    cache = tmp_path_factory.mktemp("gradio")
    with launched(cache, members, concurrency=4, api=api, **build) as url:
        yield url, members, schedulers, tmp_path_factory.mktemp("downloads"), cache


def client_of(many, monkeypatch) -> Client:
    url, _, _, downloads, cache = many
    return client_on(url, cache, monkeypatch, downloads)


def answer_of(output) -> str:
    return "".join(span["token"] for span in output[ANSWER]["value"])


def solo(members, names, prompt, config=CONFIG) -> str:
    return Ensemble([members[n] for n in names], config).run(prompt).answer


def wait_for(condition, seconds=90.0) -> None:  # generous: a loaded machine, not a timing test
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_one_scheduler_holds_the_members_runs_share_and_a_namesake_gets_another():
    a, b = ScriptedMember("a", ["x "], len), ScriptedMember("b", ["y "], len)
    schedulers = Schedulers(batch_size=2)
    try:
        first = schedulers.of([a])
        assert schedulers.of([a, b]) is first and first.names == ("a", "b")  # b joined it
        other_a = ScriptedMember("a", ["z "], len)  # the same name on another device
        second = schedulers.of([other_a, b])
        assert second is not first and schedulers.of([b]) is first
        assert schedulers.stats() == {"running": 0, "waiting": 0}
    finally:
        schedulers.close()


def test_a_third_run_waits_in_line_and_stop_ends_only_its_own_run(many, monkeypatch):
    _, members, schedulers, _, _ = many
    a, b, c = (client_of(many, monkeypatch) for _ in range(3))
    loops = {"max_new_tokens": 1024}
    job_a = submit(a, ["loop-a", "loop-b"], "go", **loops)
    job_b = submit(b, ["loop-b", "loop-a"], "go", **loops)
    wait_for(lambda: len(round_updates(job_a.outputs())) >= 2 and len(round_updates(job_b.outputs())) >= 2)
    job_c = submit(c, TINY, "The cat sat")
    wait_for(lambda: any("place 1 in line" in (o[STATUS] or "") for o in job_c.outputs()))
    assert not round_updates(job_c.outputs())  # the batch is full: C waits, and says so

    status, path = a.predict(api_name="/stop")  # A's Stop: A ends, B plays on, C takes A's place
    assert "stopped by the user" in status and load_trace(path_of(path)).members == ("loop-a", "loop-b")
    wait_for(job_a.done)
    final_c = job_c.result(timeout=60)
    assert answer_of(final_c) == solo(members, TINY, "The cat sat")  # its own run, exactly
    assert not job_b.done()  # another session's Stop left B running
    rounds_b = len(round_updates(job_b.outputs()))
    status, _ = b.predict(api_name="/stop")
    assert "stopped by the user" in status  # B's own Stop ended B (its stream may still be draining)
    wait_for(job_b.done)
    assert rounds_b > len(round_updates(job_a.outputs()))  # B went on after A's Stop
    wait_for(lambda: schedulers.stats() == {"running": 0, "waiting": 0}, 10)


def test_compare_and_branch_go_through_the_batch(many, monkeypatch):
    _, members, schedulers, _, _ = many
    client = client_of(many, monkeypatch)
    final = submit(client, TINY[:2], "Numbers: 1, 2,", compare=True).result(timeout=90)
    for name in TINY[:2]:
        assert f"{name} alone" in final[COMPARE]
        assert html.escape(solo(members, [name], "Numbers: 1, 2,")) in final[COMPARE]
    trace = load_trace(path_of(final[DOWNLOAD]))
    assert answer_of(final) == solo(members, TINY[:2], "Numbers: 1, 2,")
    # Branch at the round the panels show (the last: the pick's choices are its candidates).
    last = trace.rounds[-1]
    view, download = client.predict(k=last.k, pick=last.chosen, typed="", device="cpu", api_name="/branch")
    branch = load_trace(path_of(download))
    assert branch.rounds[-1].text == trace.rounds[-1].text and "reproduces the original answer" in view
    assert len(schedulers.all) == 1  # every run of these members in one batch


def test_the_api_mounted_beside_the_page_shares_its_batch(many, monkeypatch):
    url, members, schedulers, _, _ = many
    url = url.rstrip("/")
    assert "SpecFuse Studio" in httpx.get(url + "/").text  # the page is still there
    # A browser's page load gets the guard first in <head>, before Gradio's scripts; the rest is as sent.
    page = httpx.get(url + "/", headers={"accept": "text/html,application/xhtml+xml"})
    head = page.text.split("<head>", 1)[1]
    assert head.startswith(STATUS_TIMER_GUARD) and head.index('<script type="module"') > len(
        STATUS_TIMER_GUARD
    )
    assert int(page.headers["content-length"]) == len(page.content) and "SpecFuse Studio" in page.text
    join = httpx.get(url + "/join", headers={"accept": "text/html"}).text  # the phones' page too
    assert join.split("<head>", 1)[1].startswith(STATUS_TIMER_GUARD)
    assert STATUS_TIMER_GUARD not in httpx.get(url + "/config", headers={"accept": "text/html"}).text
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and health["batch_size"] == 2
    api = openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=120)
    assert {m.id for m in api.models.list().data} >= {"specfuse", *TINY}
    browser = client_of(many, monkeypatch)
    job = submit(browser, TINY, "Hello there")  # a browser run and an API request at once
    reply = api.chat.completions.create(
        model="specfuse",
        messages=[{"role": "user", "content": "The cat sat"}],
        max_tokens=24,
        extra_body={"specfuse": {"segment_len": 4, "members": TINY}},
    )
    config = EnsembleConfig(segment_len=4, max_new_tokens=24)
    assert reply.choices[0].message.content == solo(members, TINY, "The cat sat", config)
    assert answer_of(job.result(timeout=60)) == solo(members, TINY, "Hello there")
    assert int(job.outputs()[-1][SLIDER]["value"]) >= 1
    assert httpx.get(url + "/v1/nope").status_code == 404  # the API's own answer, in OpenAI's shape
    assert "error" in httpx.get(url + "/v1/nope").json()


def test_bad_numbers_of_runs_are_refused_at_start():
    for flag in ("--concurrency", "--batch-size"):
        with pytest.raises(SystemExit) as exit:
            app.main([flag, "0"])
        assert exit.value.code == 2


def test_quantize_reaches_every_member_the_app_loads_and_keeps_them_on_the_cpu(tiny_checkpoints, monkeypatch):
    built = {}
    monkeypatch.setattr(app, "build_demo", lambda loader, **kw: built.update(kw, loader=loader))
    monkeypatch.setattr(app, "serve", lambda demo, **kw: None)
    app.main(["--models", tiny_checkpoints[0], "--allow-paths", "--no-processes", "--quantize", "int8"])
    assert built["device"] == "cpu" and built["devices"] == ["cpu"]  # no GPU choice to fail on
    loader = built["loader"]
    for path in tiny_checkpoints:  # the one named at start and one a user picks later
        model = loader(path, "cpu", lambda f, s: None).model
        layers = [m for m in model.modules() if isinstance(m, nn.Linear | QuantizedLinear)]
        assert layers and all(type(m) is QuantizedLinear for m in layers)
        assert {m.weight.dtype for m in layers} == {torch.int8}


def test_a_bad_or_off_cpu_quantize_is_refused_at_start(monkeypatch, capsys):
    monkeypatch.setattr(app, "build_demo", lambda *a, **k: pytest.fail("built the app"))
    for args, message in [
        (["--quantize", "int3"], "Unknown quantize 'int3'"),
        (["--quantize", "int4", "--device", "cuda"], "--quantize int4 runs on the CPU only"),
    ]:
        with pytest.raises(SystemExit) as exit:
            app.main(args)
        assert exit.value.code == 2 and message in capsys.readouterr().err


def test_the_app_freezes_what_start_up_made_once_its_page_answers():
    """`python app.py`: once the page answers, start-up's objects (the libraries, the page) are kept out
    of the garbage collector's full passes, which would otherwise walk them mid-round (specfuse.heap)."""
    root = Path(app.__file__).resolve().parent
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "app.py", "--load-on-run", "--port", str(port)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = ""
        for line in process.stderr:  # the app's own lines go to stderr
            if "long-lived objects kept out of the garbage collector's full passes" in line:
                said = line
                break
        assert said, "the app ended without freezing"
        assert int(said.split()[0].replace(",", "")) > 300_000  # torch's, Gradio's and the app's objects
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200  # and the page answers
    finally:
        process.terminate()
        process.communicate(timeout=60)


def _scripted_demo():
    return app.build_demo(lambda name, device, progress: None, choices=["a", "b"], default_models=["a", "b"])


def test_a_page_that_answers_after_gradios_own_probe_gives_up_is_still_launched(monkeypatch, tmp_path):
    # Gradio stops at the first answer later than 3 s from its new server (a busy machine: the CI's
    # llama.cpp trio once); its probe is made to give up, the server and the app's own probe are real.
    import gradio.networking

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    monkeypatch.setattr(gradio.networking, "url_ok", lambda url: False)
    demo = _scripted_demo()
    try:
        _, address, share = app.serve(demo, port=free_port(), prevent_thread_lock=True)
        assert share is None
        assert httpx.get(address, timeout=30).status_code == 200
    finally:
        demo.close()


def test_an_address_that_does_not_answer_is_named_with_its_likely_cause_and_closed(monkeypatch, tmp_path):
    import gradio.networking

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    monkeypatch.setattr(gradio.networking, "url_ok", lambda url: False)
    monkeypatch.setattr(app, "PATIENCE_S", 0.0)  # no time to answer: the message, and the port freed
    demo, port = _scripted_demo(), free_port()
    with pytest.raises(app.SpecfuseError, match="did not answer within 0 s: is a proxy set"):
        app.serve(demo, port=port, prevent_thread_lock=True)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
