"""Untrusted text shown as text, served members by name, and a bounded trace-download folder
(issue 24, items 2, 4 and 14), with the real pieces: views, the Servers scrubber, TraceFiles, and the
app's API through gradio_client."""

from __future__ import annotations

import json

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from specfuse import ConfigError, ModelLoadError, load_trace
from studio import downloads, views
from studio.loading import served_members
from studio.untrusted import Servers, md

from ..conftest import TINY
from ..helpers_app import gradio_client, launched
from ..scripted import scripted_rounds, scripted_trace

ATTACKER = "https://attacker.example/"


def test_markdown_text_makes_no_link_image_autolink_or_formula():
    text = f"[x]({ATTACKER}) ![i](http://127.0.0.1:9/b) {ATTACKER} www.attacker.example a@b.c $$x$$ <b>b</b>"
    shown = md(text)
    for live in ("[x](", "![i](", "https://", "www.", "a@b", "$$", "<b>"):
        assert live not in shown
    assert md("- item\n1. two\n> quote").splitlines() == ["&#45; item", "1&#46; two", "&#62; quote"]
    assert md("qwen2.5-coder-0.5b") == "qwen2.5-coder-0.5b"  # a name in the middle of a line is as it was


def test_the_status_line_shows_an_uploaded_traces_text_as_text():
    rounds = scripted_rounds().rounds
    status = views.status_markdown(rounds, f"[click]({ATTACKER}) <img src=x>")
    assert "[click](" not in status and "<img" not in status and "https://" not in status


def test_a_served_members_url_and_options_never_reach_a_message():
    spec = "llama-server:http://bob:hunter2@10.1.2.3:8080#served?tokenizer=/models/x&timeout=5"
    servers = Servers({"served": spec})
    assert servers.spec("served") == spec and servers.spec("other") == "other"
    said = servers.scrub(
        f"{spec}: no answer from http://10.1.2.3:8080/completion (10.1.2.3:8080, bob:hunter2@10.1.2.3:8080)"
    )
    assert "10.1.2.3" not in said and "hunter2" not in said and "tokenizer=" not in said
    assert said.startswith("served: no answer from [the server of served]/completion")


def test_served_members_are_offered_by_the_operators_name_only():
    spec = "llama-server:http://10.1.2.3:8080#served?tokenizer=/models/x"
    assert served_members([spec], taken=["a"]) == {"served": spec}
    with pytest.raises(ConfigError, match="needs a name, ENGINE:URL#NAME") as unnamed:
        served_members(["llama-server:http://10.1.2.3:8080?tokenizer=x"])
    assert "10.1.2.3" not in str(unnamed.value)
    with pytest.raises(ConfigError, match="Two members are called 'a'"):
        served_members(["vllm:http://10.1.2.3:8000#a"], taken=["a"])


def test_members_who_exit_after_the_same_round_get_markers_side_by_side():
    """Two exit markers at nearly the same weight were drawn as one (issue 24, item 10)."""
    import dataclasses

    from specfuse.records import ExitEvent

    rounds = list(scripted_rounds(max_rounds=4).rounds)
    both = tuple(ExitEvent(m, 3, 0.1, 0.2, "left") for m in ("a", "c"))
    rounds[2] = dataclasses.replace(rounds[2], exits=both)
    (marks,) = [t for t in views.weights_figure(rounds).data if t.name == "exit"]
    xs = [x for x, k in zip(marks.x, marks.customdata) if k == 3]
    assert len(xs) == 2 and abs(xs[0] - xs[1]) == pytest.approx(views.EXIT_SPREAD) and sum(xs) / 2 == 3
    assert marks.marker.color[0] != marks.marker.color[1]  # each in its member's colour
    assert "exited after round %{customdata}" in marks.hovertemplate


def test_trace_downloads_replace_the_sessions_last_and_stay_under_the_limit(tmp_path):
    """Every finished run and branch left a file in a new temp folder nothing deleted (item 14)."""
    trace = scripted_rounds(max_rounds=2)
    files = downloads.TraceFiles(limit=3, folder=tmp_path)
    first = files.write(trace, "s1")
    second = files.write(trace, "s1")
    assert not (tmp_path / first.split("/")[-1]).exists() and load_trace(second) == trace
    branch = files.write(trace, "s1", "branch")
    for session in ("s2", "s3", "s4"):
        files.write(trace, session)
    assert len(list(tmp_path.iterdir())) == 3 and len(files.files()) == 3
    assert not any(str(p) in (second, branch) for p in tmp_path.iterdir())  # the oldest went
    files.close()
    assert not tmp_path.exists()


@pytest.fixture(scope="module")
def hostile_app(tmp_path_factory):
    from ..conftest import tiny_member

    members = {name: tiny_member(name) for name in TINY}

    def loader(name, device, progress):
        if name.startswith("llama-server:"):  # the spec, never the name: a 500's HTML page in the message
            raise ModelLoadError(
                f"{name}: the server at http://10.9.8.7:8080 said <a href='{ATTACKER}'>x</a>"
            )
        return members[name]

    cache = tmp_path_factory.mktemp("gradio")
    spec = "llama-server:http://10.9.8.7:8080#served-one?tokenizer=/srv/t&timeout=5"
    build = {"choices": [*TINY, "served-one"], "default_models": TINY[:2], "served": {"served-one": spec}}
    with launched(cache, members, loader, **build) as url:
        yield url, cache


def test_the_api_gets_escaped_messages_with_no_server_url(hostile_app, tmp_path, monkeypatch):
    import httpx

    url, cache = hostile_app
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    config = httpx.get(url.rstrip("/") + "/config", timeout=10).text
    assert "served-one" in config and "10.9.8.7" not in config and "tokenizer=" not in config
    client = gradio_client(url, tmp_path)
    with pytest.raises(AppError) as error:
        client.predict(members=[TINY[0], "served-one"], prompt="Hi", device="cpu", api_name="/run")
    message = str(error.value)
    assert "&lt;a href=" in message and "<a href" not in message and "10.9.8.7" not in message
    good = tmp_path / "good.json"
    scripted_trace(good, {"a": ["x "] * 3, "b": ["y "] * 3})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(good.read_text()), "<b>key</b>": 1}))
    with pytest.raises(AppError, match="&lt;b&gt;key&lt;/b&gt;"):
        client.predict(path=handle_file(str(bad)), view_name=views.NORMALIZED, api_name="/load_trace")
