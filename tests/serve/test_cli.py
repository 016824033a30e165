"""`python -m specfuse.serve` as an operator starts it: two tiny checkpoint folders, the CLI's run
settings, a live port; bad flags exit 2 with one line before anything loads."""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
from torch import nn

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble, Scheduler
from specfuse.errors import ConfigError
from specfuse.members.process import ProcessMember
from specfuse.models.placement import load_members
from specfuse.models.quantize import QuantizedLinear
from specfuse.serve.cli import main as serve_main

from ..conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def serve(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "specfuse.serve", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_the_command_serves_the_models_with_the_clis_settings_until_interrupted(tiny_checkpoints):
    port = free_port()
    models = ",".join(tiny_checkpoints)
    process = serve("--models", models, "--port", str(port), "--segment-len", "4", "--max-new-tokens", "12")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline, status = time.monotonic() + 90, 0
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status = httpx.get(url + "/health", timeout=2).status_code
            except httpx.TransportError:
                status = 0
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200, process.stdout.read() if process.poll() is not None else "no answer"
        client = openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list()][0] == "specfuse"
        reply = client.chat.completions.create(model="specfuse", messages=[{"role": "user", "content": "Hi"}])
        members = load_members(tiny_checkpoints)
        want = Ensemble(members).run("Hi", EnsembleConfig(segment_len=4, max_new_tokens=12))
        assert reply.choices[0].message.content == want.answer
        assert reply.usage.completion_tokens == want.tokens
        # start-up's objects were frozen out of the collector's full passes once the members were ready
        metrics = httpx.get(url + "/metrics", timeout=10).text
        frozen = next(line for line in metrics.splitlines() if line.startswith("specfuse_gc_frozen_objects "))
        assert float(frozen.split()[1]) > 100_000
        assert 'python_gc_collections_total{generation="2"}' in metrics
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert f"listening on http://127.0.0.1:{port}/v1" in output and "serving" in output
    assert "long-lived objects kept out of the garbage collector's full passes" in output


def test_bad_flags_exit_2_with_one_line_before_loading():
    for args, message in [
        (["--temperature", "-1"], "temperature must be ≥ 0"),
        (["--batch-size", "0"], "batch_size must be an integer ≥ 1, got 0"),
        (["--join-wait", "-1"], "join_wait must be ≥ 0, got -1.0"),
        (["--join-wait", "nan"], "join_wait must be a finite number, got nan"),
        (["--request-timeout", "0"], "request_timeout_s must be > 0, got 0.0"),
        (["--traces", "0"], "traces must be an integer ≥ 1, got 0"),
        (["--models", "no-such-model"], "no-such-model"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "specfuse.serve", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("specfuse-serve: error:")


class Stop(ConfigError):
    pass


def test_quantize_reaches_the_served_members_and_a_bad_one_exits_2_before_listening(
    tiny_checkpoints, monkeypatch
):
    loaded = []

    def loading_then_stop(names, **options):  # the real load, then the server stops (exit 2)
        loaded.extend(load_members(names, **options))
        raise Stop("stop after loading")

    monkeypatch.setattr("specfuse.models.placement.load_members", loading_then_stop)
    err = io.StringIO()
    args = ["--models", ",".join(tiny_checkpoints), "--port", "0", "--quantize", "int8"]
    assert serve_main(args, stderr=err) == 2 and "stop after loading" in err.getvalue()
    assert len(loaded) == 2
    for member in loaded:
        layers = [m for m in member.model.modules() if isinstance(m, nn.Linear | QuantizedLinear)]
        assert layers and all(type(m) is QuantizedLinear and m.weight.dtype == torch.int8 for m in layers)
    monkeypatch.setattr("uvicorn.Server.run", lambda *a, **k: pytest.fail("listened"))
    err = io.StringIO()
    assert serve_main(["--quantize", "int3"], stderr=err) == 2
    assert "specfuse-serve: error: Unknown quantize 'int3'" in err.getvalue()
    err = io.StringIO()
    assert serve_main(["--quantize", "gguf", "--device", "cuda"], stderr=err) == 2
    assert "--quantize gguf runs on the CPU only" in err.getvalue()


def test_members_load_in_this_process_unless_processes_is_given(tiny_checkpoints, monkeypatch):
    """The server's members are in its own process by default (measured so on a GPU); --processes
    puts each in a worker process of its own, and they answer through the scheduler as here."""
    loaded = []

    def loading_then_stop(names, **options):
        loaded.append(load_members(names, **options))
        raise Stop("stop after loading")

    monkeypatch.setattr("specfuse.models.placement.load_members", loading_then_stop)
    args = ["--models", ",".join(tiny_checkpoints), "--port", "0", "--segment-len", "4"]
    for extra in ((), ("--processes",)):
        assert serve_main([*args, *extra], stderr=io.StringIO()) == 2
    here, there = loaded
    assert not any(isinstance(m, ProcessMember) for m in here)
    assert all(isinstance(m, ProcessMember) and m.alive for m in there)
    config = EnsembleConfig(segment_len=4, max_new_tokens=12)
    scheduler = Scheduler(there, config)
    try:
        ticket = scheduler.submit("Hi")
        assert ticket.wait(timeout=120)
        answer = ticket.result().answer
    finally:
        scheduler.close()
    assert answer == Ensemble(here, config).run("Hi").answer


def test_step_mode_bounds_reach_the_servers_scheduler_and_bad_ones_exit_2(tiny_checkpoints, monkeypatch):
    made = {}

    class Recording(Scheduler):
        def __init__(self, members, config=None, settings=None):
            made.update(dataclasses.asdict(settings))
            raise Stop("stop after the scheduler's options")

    monkeypatch.setattr("specfuse.serve.cli.Scheduler", Recording)
    err = io.StringIO()
    args = ["--models", ",".join(tiny_checkpoints), "--port", "0", "--max-paused", "3", "--pause-idle", "42"]
    args += ["--prefill-chunk", "64"]
    assert serve_main(args, stderr=err) == 2 and "stop after the scheduler's options" in err.getvalue()
    assert (made["max_paused"], made["pause_idle_s"], made["prefill_chunk"]) == (3, 42.0, 64)
    monkeypatch.setattr("uvicorn.Server.run", lambda *a, **k: pytest.fail("listened"))
    for bad, message in [
        (["--max-paused", "-1"], "max_paused must be a non-negative integer, got -1"),
        (["--prefill-chunk", "-1"], "prefill_chunk must be a non-negative integer, got -1"),
        (["--pause-idle", "0"], "pause_idle_s must be > 0, got 0.0"),
        (["--pause-idle", "nan"], "pause_idle_s must be a finite number, got nan"),
    ]:
        err = io.StringIO()
        assert serve_main(bad, stderr=err) == 2
        assert f"specfuse-serve: error: {message}" in err.getvalue()
