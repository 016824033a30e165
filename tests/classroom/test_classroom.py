"""The classroom's values (issue 43): empty charts that say so, what each panel shows, a lesson's
notes and box (escaped), the form filled from a lesson's settings, and the extra downloads."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from specfuse import EnsembleConfig
from specfuse.lessons import Lesson
from studio import downloads, explain, settings, views
from studio.downloads import TraceFiles
from studio.explain import PRESENTED, SCRIPT
from studio.gallery import Shelf, lesson_html, shipped
from studio.untrusted import esc

from ..scripted import scripted_rounds


def annotations(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_a_lone_draft_matrix_says_there_is_nothing_to_verify_instead_of_bare_axes():
    """A round with one draft showed empty axes (−1..4 by 0..6) under its title: it read as broken."""
    rnd = scripted_rounds().rounds[0]
    lone = dataclasses.replace(rnd, candidates=rnd.candidates[:1], chosen=0, verified=False)
    fig = views.heatmap_figure(lone)
    assert fig.data == ()
    assert annotations(fig) == ["one draft this round: nothing to verify"]
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False
    assert "a lone draft" in fig.layout.title.text
    agreed = views.heatmap_figure(dataclasses.replace(rnd, verified=False))
    assert annotations(agreed) == ["the drafts agreed: nothing to verify"]
    assert annotations(views.heatmap_figure(None)) == ["no round yet"]
    assert annotations(views.weights_figure([])) == ["no round yet"]
    # A verified round draws its matrix, with no such note.
    assert annotations(views.heatmap_figure(rnd)) == [] and len(views.heatmap_figure(rnd).data) == 1


def test_every_panel_says_what_it_shows_in_plain_words():
    assert set(explain.WHAT_THIS_SHOWS) == {*explain.PANELS, "normalization"}
    assert set(PRESENTED) <= set(explain.PANELS)
    for text in explain.WHAT_THIS_SHOWS.values():
        assert 200 < len(text) < 900 and "<" not in text
    words = explain.WHAT_THIS_SHOWS
    assert "sums to 1" in words["normalization"] and "scale" in words["normalization"]
    assert "verifier" in words["matrix"] and "not verified" in words["matrix"]
    assert "leader never exits" in words["exits"] and "δ" in words["exits"]


def hostile_lesson(**changes) -> Lesson:
    """A lesson whose every text would be markup if it were not escaped."""
    fields = {
        "slug": "demo",
        "title": "Two <b>members</b>",
        "summary": "A summary",
        "look_for": {"matrix": "the [link](http://x.example) box"},
        "takeaway": "<script>alert(1)</script> matters",
        "prompt": "Why <img src=x>?",
        "members": ("a", "b"),
        "settings": {"segment_len": 4},
        "branch": (2, "typed <i>text</i>"),
        "live_note": "",
    }
    return Lesson(**(fields | changes))


def test_a_lessons_box_and_notes_show_its_text_as_text():
    box = lesson_html(hostile_lesson())
    assert "<script" not in box and "<img" not in box and "<b>members" not in box and "<i>text" not in box
    assert "&lt;script&gt;alert(1)&lt;/script&gt; matters" in box
    assert "Key takeaway" in box and "Round 2 of this run was typed" in box
    assert "may answer differently" in box  # no live note of its own: the general one
    assert "Live run" in lesson_html(hostile_lesson(), live=True)


def test_look_for_notes_show_a_lessons_text_under_its_panels_and_hide_the_others():
    import gradio as gr

    with gr.Blocks():
        notes = explain.Notes()
        for name in (*explain.PANELS, "normalization"):
            notes.place(name)
    assert set(notes.look) == set(explain.PANELS)  # normalization has its explanation, no note
    shown = notes.values(hostile_lesson().look_for)
    matrix = shown[notes.look["matrix"]]
    assert matrix.visible is True and matrix.value.startswith("**Look for:**")
    assert "[link](" not in matrix.value and "http://" not in matrix.value  # no link in Markdown
    assert all(shown[notes.look[n]].visible is False for n in explain.PANELS if n != "matrix")
    assert all(v.visible is False for v in notes.values(None).values())


@pytest.mark.parametrize(
    "config",
    [
        EnsembleConfig(),
        EnsembleConfig(segment_len=4, max_rounds=7, stop_strings=("END", "Q:"), temperature=0.7),
        EnsembleConfig(normalization="sum", score="logit", exit=False, initial_weights=(1.0, 2.0)),
    ],
)
def test_the_form_filled_from_a_lessons_settings_reads_back_as_those_settings(config):
    assert settings.config_from_form(settings.form_values(config)) == config


def test_a_shelf_finds_its_lessons_by_slug():
    shelf = Shelf((hostile_lesson(),), lambda slug: scripted_rounds())
    assert shelf.find("demo").title.startswith("Two")
    with pytest.raises(KeyError):
        shelf.find("nope")


def test_handouts_and_round_pngs_are_kept_like_traces_one_per_session_and_kind(tmp_path):
    files = TraceFiles(limit=3, folder=tmp_path)
    first = files.write_file("<!DOCTYPE html>", "s1", "handout", "html")
    png = files.write_file(b"\x89PNG\r\n", "s1", "round2", "png")
    second = files.write_file("<!DOCTYPE html><p>", "s1", "handout", "html")
    assert first.endswith(".html") and png.endswith(".png")
    assert not (tmp_path / first.rsplit("/", 1)[1]).exists()  # the session's previous handout went
    assert Path(second).read_text(encoding="utf-8") == "<!DOCTYPE html><p>"
    assert Path(png).read_bytes() == b"\x89PNG\r\n"
    trace = scripted_rounds()
    assert files.write(trace, "s1").endswith(".json")  # a trace, the same way as before


def test_the_presenter_script_makes_no_request():
    for word in ("fetch(", "XMLHttpRequest", "http://", "https://", "import(", "src="):
        assert word not in SCRIPT


def test_every_shipped_lesson_opens_in_its_panels_quickly_with_no_model():
    """The gallery's target: a lesson opens in ≤ 2 s on this CPU with no model (here its values,
    server-side, measured alone: 0.13-0.45 s; the bound below is for a loaded machine)."""
    shelf = shipped()
    assert len(shelf.lessons) >= 5
    for one in shelf.lessons:
        began = time.perf_counter()
        trace = shelf.load(one.slug)
        k = shelf.key_round(one.slug, trace)
        shown = views.round_panels(trace, k, views.NORMALIZED, one.title)
        for figure in (shown["matrix"], shown["weights"]):
            figure.to_json()
        # No model is loaded (that takes tens of seconds). Alone each lesson opens in 0.13-0.45 s
        # here; in a fresh clone's suite, beside the other worker and its chromium, one (not the first)
        # took 2.3 s, so the bound catches a model load, not the gallery's speed.
        assert time.perf_counter() - began < 10.0, one.slug
        assert k is not None and 1 <= k <= len(trace.rounds)
        assert set(one.look_for) <= set(explain.PANELS), one.slug
        assert one.takeaway and one.summary and one.live_note
        assert esc(one.takeaway) in lesson_html(one)
        # Run it live fills the form with the recorded run's settings, and the form reads them back.
        assert EnsembleConfig(**one.settings) == trace.config
        assert settings.config_from_form(settings.form_values(trace.config)) == trace.config


def test_a_round_slide_gets_a_font_that_draws_its_text_where_the_system_has_one(tmp_path, monkeypatch):
    latin, cjk = tmp_path / "latin.ttf", tmp_path / "cjk.ttc"
    monkeypatch.setattr(downloads, "FONTS", (str(tmp_path / "missing.ttf"), str(latin)))
    monkeypatch.setattr(downloads, "CJK_FONTS", (str(cjk),))
    trace = scripted_rounds()
    chinese = dataclasses.replace(trace, prompt="用一句话介绍长城。")
    assert downloads.slide_font(trace) is None and downloads.slide_font(chinese) is None  # none here
    latin.write_bytes(b"")
    cjk.write_bytes(b"")
    assert downloads.slide_font(trace) == str(latin)
    assert downloads.slide_font(chinese) == str(cjk)
