"""The operator's side of the app: what app.py starts with (its flags, a Space's arguments) and the
settings that belong to where members run, not to one run (`--parallel`)."""

from __future__ import annotations

import time

import pytest

import app
from specfuse.engine import DEFAULT_BATCH_SIZE
from studio.serving import DEFAULT_CONCURRENCY, Schedulers

from ..helpers_app import client_on, launched
from ..scripted import ScriptedMember


def test_a_space_reads_its_start_arguments_from_spaces_config(monkeypatch):
    monkeypatch.delenv("SPECFUSE_APP_ARGS", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert app.space_arguments() is None
    monkeypatch.setenv("SPACE_ID", "someone/specfuse-studio")
    args = app.space_arguments()
    assert args[:2] == ["--host", "0.0.0.0"] and "--models" in args and "--allow-paths" not in args
    monkeypatch.setenv("SPECFUSE_APP_ARGS", "--port 9000")
    assert app.space_arguments() == ["--port", "9000"]


def test_the_space_arguments_parse_and_keep_the_batching(monkeypatch):
    """A Space serves its visitors through the one rolling batch, as a plain `python app.py` does: its
    arguments lower neither the runs at once nor the batch below the defaults."""
    monkeypatch.delenv("SPECFUSE_APP_ARGS", raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/specfuse-studio")
    monkeypatch.setattr(app.sys, "argv", ["app.py"])
    args = app.parse_args(app.build_parser())
    assert args.host == "0.0.0.0" and len(args.models) == 3
    assert args.concurrency >= DEFAULT_CONCURRENCY and args.batch_size >= DEFAULT_BATCH_SIZE > 1
    assert args.queue_size >= 16


class Clocked(ScriptedMember):
    """A scripted member that keeps when each of its drafts began and ended."""

    def __init__(self, name: str) -> None:
        super().__init__(name, [" tick tock"] * 20, len, draft_delay=0.3)
        self.spans: list[tuple[float, float]] = []

    def draft(self, state, max_new_tokens):
        began = time.monotonic()
        candidate = super().draft(state, max_new_tokens)
        self.spans.append((began, time.monotonic()))
        return candidate


@pytest.mark.parametrize("parallel", ["off", "on"])
def test_the_operators_parallel_decides_whether_the_apps_members_draft_at_once(
    parallel, tmp_path, monkeypatch
):
    """`parallel` is where members run, so the operator's (app.py --parallel), and the app's runs follow
    it; the settings form no longer offers a choice that the app's batch never read."""
    members = {m.name: m for m in (Clocked("clock-a"), Clocked("clock-b"))}
    build = {"default_models": list(members), "schedulers": Schedulers(parallel=parallel)}
    with launched(tmp_path, members, **build) as url:
        client = client_on(url, tmp_path, monkeypatch, tmp_path)
        with pytest.raises(TypeError):  # the form has no such field any more
            client.submit(members=list(members), prompt="Go", parallel="on", api_name="/run")
        client.submit(
            members=list(members), prompt="Go", max_new_tokens=6, device="cpu", api_name="/run"
        ).result(timeout=60)
    (a_began, a_ended), (b_began, b_ended) = members["clock-a"].spans[0], members["clock-b"].spans[0]
    overlap = min(a_ended, b_ended) - max(a_began, b_began)
    assert overlap > 0.15 if parallel == "on" else overlap <= 0


def test_step_mode_bounds_reach_the_apps_schedulers_and_bad_ones_exit_2(monkeypatch):
    built = {}
    monkeypatch.setattr(app, "build_demo", lambda loader, **kw: built.update(kw))
    monkeypatch.setattr(app, "serve", lambda demo, **kw: None)
    app.main(["--max-paused", "3", "--pause-idle", "42", "--prefill-chunk", "0", "--load-on-run"])
    scheduler = built["schedulers"].of([ScriptedMember("one", ["a "], len)])
    try:
        assert (scheduler.max_paused, scheduler.pause_idle_s, scheduler.prefill_chunk) == (3, 42.0, 0)
        assert scheduler.stats()["max_paused"] == 3
    finally:
        scheduler.close()
    for bad in (["--max-paused", "-1"], ["--pause-idle", "0"], ["--prefill-chunk", "-4"]):
        with pytest.raises(SystemExit) as exit:
            app.main(bad)
        assert exit.value.code == 2
