"""The app: pure views on hand-built rounds, then its API with gradio_client against a launched server."""

from __future__ import annotations

import asyncio
import dataclasses
import html
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from specfuse import ConfigError, Ensemble, EnsembleConfig, dump_trace, load_trace
from studio import SharedLoader, build_demo, handlers, views, what_if_views

from ..conftest import TINY, tiny_member
from ..helpers_app import (
    ANSWER,
    CANDIDATES,
    COMPARE,
    DOWNLOAD,
    MATRIX,
    PLAIN,
    SLIDER,
    STATUS,
    WEIGHTS,
    XSS_IMG,
    XSS_SCRIPT,
    figure,
    gradio_client,
    path_of,
    round_updates,
    stop_after_two_rounds,
    submit,
    wait_rounds,
)
from ..scripted import ScriptedMember, prefers, scripted_rounds

# Every round's update and every arriving candidate, as this module checks them (the app's default
# draws at most twice a second: tests/studio/test_updates.py).
DRAW_INTERVAL = 0.0

# ---- pure views ---------------------------------------------------------------------------------


def test_answer_spans_cover_the_answer_exactly():
    trace = scripted_rounds()
    spans = views.answer_value(trace.rounds)
    assert "".join(text for text, _ in spans) == trace.rounds[-1].text
    assert {member for _, member in spans} == {"b"}


def test_the_heatmap_has_a_fixed_scale_and_marks_the_chosen_column():
    rnd = scripted_rounds().rounds[0]
    fig = views.heatmap_figure(rnd)
    heat = fig.data[0]
    assert (heat.zmin, heat.zmax) == (0.0, 1.0)
    assert list(heat.y) == list(rnd.verifiers) and heat.x[rnd.chosen].endswith("✓")
    box = fig.layout.shapes[0]
    assert box.x0 < rnd.chosen < box.x1
    raw = views.heatmap_figure(rnd, normalized=False).data[0]
    assert raw.zmin is None and raw.z[0][0] == rnd.raw_scores[0][0]
    assert fig.layout.uirevision == "matrix"


def test_the_weights_chart_has_a_line_per_member_and_a_marker_per_exit():
    trace = scripted_rounds(max_rounds=8)
    fig = views.weights_figure(trace.rounds)
    lines = [t for t in fig.data if t.name != "exit"]
    assert [t.name for t in lines] == ["a", "b", "c"]
    assert list(lines[0].x) == list(range(len(trace.rounds) + 1))
    exits = [t for t in fig.data if t.name == "exit"]
    assert exits and list(exits[0].text) == [e.member for r in trace.rounds for e in r.exits]


def test_empty_views_are_valid_components_values():
    assert views.heatmap_figure(None).data == ()
    assert views.weights_figure([]).data == ()
    assert list(views.candidates_value(None).columns) == views.report.CANDIDATE_COLUMNS
    assert "Run" in views.status_markdown([])


def test_an_event_whose_progress_is_hidden_tracks_it_on_no_component():
    # Gradio's page sets a loading status again on every component it ever tracked, at every status
    # message: hidden progress tracked on its outputs made each of a run's updates pay for 169 of them.
    demo = build_demo(lambda name, device, progress: None, choices=["a", "b"], default_models=["a", "b"])
    config = demo.get_config_file()
    deps = config["dependencies"]
    hidden = [d for d in deps if d["show_progress"] == "hidden"]
    assert len(hidden) > 20 and all(d["show_progress_on"] == [] for d in hidden)
    tracked = {
        i for d in deps for i in (d["outputs"] if d["show_progress_on"] is None else d["show_progress_on"])
    }
    assert len(tracked) * 3 < len(config["components"])
    assert any(d["show_progress"] == "full" and d["show_progress_on"] for d in deps)  # the status line's


def test_model_text_is_escaped_wherever_it_becomes_html():
    members = [ScriptedMember("x", [XSS_SCRIPT] * 3, len), ScriptedMember("y", [XSS_IMG] * 3, len)]
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=2)).stream("go"))
    for markup in (
        views.compare_html([("ensemble", rounds[-1].text), ("<b>x</b> alone", XSS_IMG)]),
        views.segment_html(rounds, 0),
        views.status_markdown(rounds, XSS_SCRIPT),
    ):
        assert "<script" not in markup and "<img" not in markup and "<b>x" not in markup
    assert "&lt;script&gt;" in views.compare_html([("e", XSS_SCRIPT)])
    # Tables and spans carry the text as text: the components render it, never parse it.
    assert views.candidates_value(rounds[0])["text"].tolist() == [XSS_SCRIPT, XSS_IMG]


def test_panels_at_round_k_show_that_round_the_weights_up_to_it_and_the_whole_answer():
    """Replaying round k used to cut the answer back to round k; now the answer stays whole with
    segment k marked (issue 8, item 5)."""
    trace = scripted_rounds(max_rounds=6)
    shown = views.round_panels(trace, 3)
    assert "**Round 3**" in shown["status"]
    assert shown["matrix"].layout.title.text.startswith("round 3")
    assert max(shown["weights"].data[0].x) == 3
    assert shown["summary"]["segments won"].sum() == 3
    spans = shown["answer"].value
    assert "".join(span["token"] for span in spans) == trace.rounds[-1].text
    assert [i for i, span in enumerate(spans) if span["class_or_confidence"] == views.SELECTED] == [2]


def test_member_names_from_a_trace_never_reach_plotly_as_html():
    """Plotly renders <a href> and <b> in labels: an uploaded trace's member names became links
    (issue 8, item 7). Every label, legend and hover text is escaped."""
    evil = ["<a href='https://x.example'>a</a>", "<b>b</b>", "c"]
    members = [ScriptedMember(name, [f"{name} "] * 20, prefers(f"{evil[1]} ")) for name in evil]
    rounds = list(Ensemble(members, EnsembleConfig(max_rounds=5, exit_warmup=1)).stream("go"))
    texts = []
    for fig in (views.heatmap_figure(rounds[0]), views.weights_figure(rounds)):
        for trace in fig.data:
            for key in ("x", "y", "text", "name", "hovertemplate"):
                value = getattr(trace, key, None)
                if value is not None:
                    texts += [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    assert not [t for t in texts if "<a" in t or "<b>" in t]
    assert any("&lt;a href=" in t for t in texts)


def test_the_shared_loader_loads_each_member_once_across_threads():
    calls = []

    def load(name, **kwargs):
        calls.append(name)
        time.sleep(0.05)
        return ScriptedMember(name, ["a "], len)

    loader = SharedLoader(load)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: loader("m", "cpu", lambda f, s: None), range(8)))
    assert calls == ["m"] and all(m is got[0] for m in got)


def test_operator_named_hub_ids_load_without_allowing_user_paths():
    seen = {}

    def load(name, **kwargs):
        seen[name] = kwargs["allow_paths"]
        return ScriptedMember(name, ["a "], len)

    loader = SharedLoader(load, trusted=["org/model"])
    loader("org/model", "cpu", lambda f, s: None)
    loader("smollm2-135m", "cpu", lambda f, s: None)
    assert seen == {"org/model": True, "smollm2-135m": False}


def test_with_processes_the_loader_loads_each_model_once_in_a_process_of_its_own(tiny_checkpoints):
    from specfuse.members.process import ProcessMember

    path = tiny_checkpoints[0]
    loader, said = SharedLoader(trusted=[path], processes=True), []
    member = loader(path, "cpu", lambda f, s: said.append(s))
    try:
        assert isinstance(member, ProcessMember) and member.alive and member.name == path
        assert loader(path, "cpu", lambda f, s: None) is member
        assert said[0] == f"loading {path} in a process of its own"
        answer = Ensemble([member, tiny_member("qwen-merges")], EnsembleConfig(max_new_tokens=8)).run("Hi")
        assert answer.answer
    finally:
        member.close()
    assert not member.alive


@pytest.mark.slow
def test_the_loaders_auto_uses_processes_only_on_a_cpu_with_eight_cores_or_more(
    tiny_checkpoints, monkeypatch
):
    from specfuse.members.hf import HFMember
    from specfuse.members.process import ProcessMember

    path = tiny_checkpoints[1]
    monkeypatch.setattr("specfuse.models.placement.cpu_cores", lambda: 4)
    assert type(SharedLoader(trusted=[path], processes="auto")(path, "cpu", lambda f, s: None)) is HFMember
    monkeypatch.setattr("specfuse.models.placement.cpu_cores", lambda: 8)
    member = SharedLoader(trusted=[path], processes="auto")(path, "cpu", lambda f, s: None)
    try:
        assert type(member) is ProcessMember
    finally:
        member.close()


# ---- the API, against a launched app -------------------------------------------------------------


@pytest.fixture
def client(served, monkeypatch):
    url, _, downloads, cache = served
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    return gradio_client(url, downloads)


def test_a_run_streams_one_update_per_round_with_that_rounds_panels(client):
    job = submit(client, TINY, "Hello there")
    job.result(timeout=60)
    outputs = job.outputs()
    last_round = int(outputs[-1][SLIDER]["value"])
    assert last_round >= 3
    by_round = {int(o[SLIDER]["value"]): o for o in round_updates(outputs)}
    assert set(by_round) >= set(range(1, last_round + 1))
    for k, out in by_round.items():
        assert f"**Round {k}**" in out[STATUS]
        assert len(out[CANDIDATES]["data"]) >= 1
        assert sum(row[-1] == "✓" for row in out[CANDIDATES]["data"]) == 1
        assert figure(out[MATRIX]).layout.title.text.startswith(f"round {k}:")
        assert max(figure(out[WEIGHTS]).data[0].x) == k
    trace = load_trace(path_of(outputs[-1][DOWNLOAD]))
    assert len(trace.rounds) == last_round and trace.members == tuple(TINY)
    assert "".join(span["token"] for span in outputs[-1][ANSWER]["value"]) == trace.rounds[-1].text
    assert outputs[-1][PLAIN] == trace.rounds[-1].text  # the exact answer, for copying


def test_candidates_show_as_they_arrive_before_their_round_is_decided(client):
    job = submit(client, TINY, "Hello there")
    job.result(timeout=60)
    outputs = job.outputs()
    arriving = [o for o in outputs if "candidates in" in o[STATUS]]
    first = arriving[0]
    assert first[STATUS].startswith("**Round 1**") and "1 of 3 candidates in" in first[STATUS]
    assert "first candidate after" in first[STATUS] and "still drafting" in first[STATUS]
    assert len(first[CANDIDATES]["data"]) == 1 and first[CANDIDATES]["data"][0][5] == ""  # no score yet
    assert outputs.index(first) < min(i for i, o in enumerate(outputs) if "candidates in" not in o[STATUS])
    members = {row[0] for o in arriving for row in o[CANDIDATES]["data"]}
    assert members == set(TINY)


def test_two_clients_at_once_each_get_their_own_answer(served, client):
    url, members, downloads, _ = served
    prompts = ["The cat sat", "Numbers: 1, 2,"]
    clients = [gradio_client(url, downloads) for _ in prompts]
    jobs = [submit(c, TINY, p) for c, p in zip(clients, prompts)]
    answers = ["".join(s["token"] for s in job.result(timeout=90)[ANSWER]["value"]) for job in jobs]
    config = EnsembleConfig(segment_len=4, max_new_tokens=24)
    expected = [Ensemble([members[n] for n in TINY], config).run(p).answer for p in prompts]
    assert answers == expected and answers[0] != answers[1]


def test_stop_and_replay_before_any_round_leave_a_message_not_an_error(served):
    url, _, downloads, _ = served
    fresh = gradio_client(url, downloads)  # a session without a trace
    status, download = fresh.predict(api_name="/stop")
    assert "stopped by the user before round 1" in status and path_of(download) is None
    fresh.predict(k=1, view_name=views.RAW, api_name="/replay")  # raised "not enough output values"


def test_replay_shows_a_past_round_from_the_session_trace(client):
    final = client.predict(members=TINY[:2], prompt="Again", max_new_tokens=24, device="cpu", api_name="/run")
    n = int(final[SLIDER]["value"])
    assert n >= 2
    replay = client.predict(k=1, view_name=views.RAW, api_name="/replay")
    assert "**Round 1**" in replay[STATUS] and figure(replay[MATRIX]).layout.title.text.startswith("round 1")
    assert max(figure(replay[WEIGHTS]).data[0].x) == 1


def test_stop_ends_the_run_keeps_what_was_produced_and_the_next_run_works(served, client):
    _, members, _, _ = served
    job = submit(client, ["loop-a", "loop-b"], "go", max_new_tokens=1024)
    assert len(wait_rounds(job, 3)) >= 3
    job.cancel()
    time.sleep(0.5)
    calls = len(members["loop-a"].calls)
    time.sleep(1.0)
    assert len(members["loop-a"].calls) - calls <= 3  # at most the round in flight: draft, score, accept
    assert not job.done() or len(job.outputs()) < 1024
    status, path = client.predict(api_name="/stop")
    kept = load_trace(path_of(path))
    assert "stopped by the user" in status and len(kept.rounds) >= 3
    assert kept.rounds[-1].stop_reason is None  # cut short, not finished
    out = submit(client, TINY[:2], "Again").result(timeout=60)
    assert out[ANSWER]["value"]


def test_stop_alone_ends_the_session_run_and_answers_with_its_last_round(served, client):
    """Stop and the page's /cancel are separate requests, and under load the cancel came seconds
    late: the run's next update then hid "stopped by the user". Stop now ends its session's run
    itself, before it answers. Here no cancel is sent at all."""
    job = submit(client, ["loop-a", "loop-b"], "go", max_new_tokens=1024)
    status, path = stop_after_two_rounds(client, job)
    assert job.done()  # ended by Stop, long before its 1024-token budget
    sent = round_updates(job.outputs())
    kept = load_trace(path_of(path))
    assert "stopped by the user" in status and len(kept.rounds) == int(sent[-1][SLIDER]["value"]) >= 2
    assert "stopped by the user" in job.outputs()[-1][STATUS]  # the run's own last word agrees


def test_in_worker_halt_ends_the_stream_and_closes_the_generator():
    closed = threading.Event()

    def endless():
        try:
            while True:
                time.sleep(0.01)
                yield {"n": 1}
        finally:
            closed.set()

    async def consume() -> int:
        halt, seen = asyncio.Event(), 0
        async for _ in handlers.in_worker(endless(), halt):
            seen += 1
            if seen == 3:
                halt.set()
        return seen

    assert asyncio.run(asyncio.wait_for(consume(), 10)) >= 3  # what was queued before the halt, then the end
    assert closed.wait(5)


@pytest.mark.parametrize(
    ("members", "prompt", "settings", "message"),
    [
        (TINY, "   ", {}, "prompt is empty"),
        (TINY[:1], "Hi", {}, "two or more"),
        ([TINY[0], "nope"], "Hi", {}, "nope"),
        (TINY, "Hi", {"seed": -1}, "less than minimum value 0"),
        (TINY, "Hi", {"top_p": 0.0}, "less than minimum value 0.05"),
        (TINY, "Hi", {"normalization": "sum"}, "needs positive scores"),
        (["broken", TINY[0]], "Hi", {}, "checkpoint is corrupt"),
    ],
)
def test_bad_inputs_get_a_clear_message(client, members, prompt, settings, message):
    with pytest.raises(AppError, match=message):
        submit(client, members, prompt, **settings).result(timeout=60)


def test_bad_inputs_leave_the_app_usable(client):
    with pytest.raises(AppError):
        submit(client, ["broken", TINY[0]], "Hi").result(timeout=60)
    assert submit(client, TINY[:2], "Hi", max_new_tokens=8).result(timeout=60)[ANSWER]["value"]


def test_a_trace_round_trips_through_download_and_upload(client, tmp_path):
    final = submit(client, TINY, "Hello there", max_new_tokens=12).result(timeout=60)
    fresh = gradio_client(client.src, tmp_path)
    loaded = fresh.predict(
        path=handle_file(path_of(final[DOWNLOAD])), view_name=views.NORMALIZED, api_name="/load_trace"
    )
    assert loaded[ANSWER]["value"] == final[ANSWER]["value"]
    assert "replayed from a trace" in loaded[STATUS]
    assert loaded[CANDIDATES] == final[CANDIDATES]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json at all", "not a JSON document"),
        (json.dumps({"schema": "something.else"}), "not a specfuse trace"),
        (json.dumps({"schema": "specfuse.trace", "version": 99}), "version"),
    ],
)
def test_a_malformed_trace_upload_gets_a_clear_message(client, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(AppError, match=message):
        client.predict(path=handle_file(str(path)), view_name=views.NORMALIZED, api_name="/load_trace")


def test_an_oversized_trace_is_refused_before_parsing(client, tmp_path, monkeypatch):
    monkeypatch.setitem(handlers.limits, "trace_bytes", 1000)
    trace = scripted_rounds()
    path = tmp_path / "big.json"
    path.write_text(dump_trace(trace))
    with pytest.raises(AppError, match="the limit is 1,000"):
        client.predict(path=handle_file(str(path)), view_name=views.NORMALIZED, api_name="/load_trace")


def test_candidates_with_html_come_back_as_plain_text(client):
    out = submit(client, ["xss-script", "xss-img"], "go", max_new_tokens=6, compare=True, exit=False).result(
        timeout=60
    )
    texts = {row[1] for row in out[CANDIDATES]["data"]}
    assert texts == {XSS_SCRIPT, XSS_IMG}
    assert out[ANSWER]["value"][0]["token"] == XSS_SCRIPT
    assert "<script" not in out[COMPARE] and "<img" not in out[COMPARE] and "&lt;script&gt;" in out[COMPARE]


def test_compare_shows_each_member_alone_beside_the_ensemble(client, served):
    _, members, _, _ = served
    out = submit(client, TINY[:2], "Side by side", max_new_tokens=12, compare=True).result(timeout=60)
    config = EnsembleConfig(segment_len=4, max_new_tokens=12)
    alone = Ensemble([members[TINY[0]]], config).run("Side by side").answer
    assert "ensemble" in out[COMPARE] and f"{TINY[0]} alone" in out[COMPARE]
    assert html.escape(alone) in out[COMPARE]
    assert load_trace(path_of(out[DOWNLOAD])).members == tuple(TINY[:2])


def test_the_page_is_served_without_run_history(served):
    import httpx

    url = served[0]
    config = httpx.get(url.rstrip("/") + "/config", timeout=10).json()
    assert config["run_history"] is False and "runs" not in config["footer_links"]


# ---- what if another candidate had won? ----------------------------------------------------------


def test_the_rule_table_names_a_choice_per_rule_and_marks_the_recorded_one():
    rnd = scripted_rounds().rounds[0]
    table = what_if_views.rules_value(rnd)
    assert list(table.columns) == what_if_views.RULE_COLUMNS and len(table) >= 5
    assert (table["as recorded"] == what_if_views.CHECK).any()
    assert table["would choose"].str.startswith("— (").any()  # log-probs were not recorded: said so
    assert table["candidate"].str.contains("not recorded").any()


def test_token_evidence_is_escaped_shaded_and_says_when_it_is_missing():
    from specfuse.records import TokenScores

    rnd = scripted_rounds().rounds[0]
    assert "no token-level detail" in views.token_html(rnd, 0, 0)
    detail = TokenScores(("<script>", "alert(1)", "</script>"), (1.0, 3.0, 2.0), (-1.0, -0.1, -0.5))
    rich = dataclasses.replace(
        rnd, token_scores=tuple((detail,) * len(rnd.candidates) for _ in rnd.verifiers)
    )
    markup = views.token_html(rich, 0, 1)
    assert "<script" not in markup and "&lt;script&gt;" in markup
    assert markup.count("class='sf-token'") == 3 and "rgba(99, 110, 250, 0.90)" in markup  # the highest
    assert "log-probability -0.100" in views.token_html(rich, 0, 1, "logprob")


def test_the_branch_view_escapes_both_answers_and_marks_where_they_part():
    original = scripted_rounds(max_rounds=3).rounds
    branch = [original[0], *(dataclasses.replace(r, text=r.text + "<img src=x>") for r in original[1:])]
    markup = what_if_views.branch_html(original, branch, 2, "<i>you</i>", "<img src=x>")
    assert "<img" not in markup and "<i>you" not in markup and "part at round 2" in markup
    assert markup.count('<mark class="sf-parted">') == 2 and "&lt;img src=x&gt;</mark>" in markup


# ---- offer only what works here -------------------------------------------------------------------


def test_a_cpu_only_install_offers_no_gpu_device_and_no_uninstalled_model(monkeypatch):
    from specfuse.models import catalogue, devices
    from studio import loading

    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    assert loading.usable_devices() == ["auto", "cpu"]
    missing = dataclasses.replace(
        catalogue.CATALOGUE["qwen2.5-coder-1.5b"], chunks=lambda: (_ for _ in ()).throw(ImportError("x"))
    )
    monkeypatch.setitem(catalogue.CATALOGUE, "qwen2.5-coder-1.5b", missing)
    assert "qwen2.5-coder-1.5b" not in loading.installed_models()


def test_the_cuda_error_tells_an_app_user_what_to_do(monkeypatch):
    from specfuse.models import devices

    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    studio = handlers.Studio(lambda *a: None, [], False, devices.plan_devices, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as error:
        studio.load(["a", "b"], "cuda", lambda *a, **k: None)
    assert "--device" not in str(error.value) and "under Settings" in str(error.value)


def test_a_branch_won_by_a_typed_segment_summarizes_without_a_member_for_it():
    """A typed segment's drafter "you" is no member: the summary and status crashed on it."""
    members = [ScriptedMember("a", ["fine "] * 9, len), ScriptedMember("b", ["good "] * 9, len)]
    config = EnsembleConfig(max_rounds=4)
    first = list(Ensemble(members, config).stream("go"))
    branch = list(Ensemble(members, config).stream("go", start=first[:1], forced="typed ", origin="you"))
    rounds = [*first[:1], *branch]
    assert rounds[1].winner.member == "you"
    assert views.summary_value(rounds)["segments won"].sum() == len(rounds) - 1
    assert "**Round 4**" in views.status_markdown(rounds)


def test_the_failure_browser_compares_the_best_ensemble_variant_when_no_system_is_called_ensemble(tmp_path):
    """A study may run only named variants (RESULTS-*.json): the browser picks the most accurate one."""
    import json as _json

    from studio import failures

    rows = [
        {"system": s, "problem": p, "predicted": "1", "correct": c, "gold": "1", "traces": []}
        for s, p, c in [
            ("single-q", "p1", True),
            ("single-q", "p2", False),
            ("paper", "p1", False),
            ("paper", "p2", False),
            ("guarded", "p1", False),
            ("guarded", "p2", True),
        ]
    ]
    (tmp_path / "RESULTS-gsm8k.json").write_text(_json.dumps({"outcomes": rows}))
    run = failures.load_eval(tmp_path)
    assert run.ensemble() == "guarded" and run.best_member == "q"
    assert list(failures.problems_table(run, failures.FILTERS[1])["problem"]) == ["p1"]
    assert list(failures.problems_table(run, failures.FILTERS[2])["problem"]) == ["p2"]
    assert run.trace(run.outcomes[0]) is None
    (tmp_path / "runs" / "single-q").mkdir(parents=True)
    (tmp_path / "runs" / "single-q" / "p1.json").write_text("{}")  # found where eval puts it
    assert run.trace(run.outcomes[0]) == tmp_path / "runs" / "single-q" / "p1.json"
    (tmp_path / "RESULTS-gsm8k.json").write_text(_json.dumps({"outcomes": [{"problem": "p1"}]}))
    with pytest.raises(ValueError, match="not an evaluation report"):
        failures.load_eval(tmp_path)
