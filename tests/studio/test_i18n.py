"""Two UI languages (issue 53, item 4): ONE catalogue (specfuse/handout/zh.json, English text →
Chinese) for the app's page, the text its handlers build, the lessons, the key map and the handout.

How a text that is not in the catalogue is found:
- the page's fixed text: the built page's every component (label, info, placeholder, a button's or
  a note's text, choices, table headers: studio.i18n.texts) — English words there must be a key;
- the text handlers build: every `_("…")` in studio/*.py, read from the source (tests/i18n_keys);
- and what either leaves out (text built from pieces, a literal never passed to `_`): the page as a
  Chinese session gets it on load, and the panels, status line, step notes and lesson box rendered
  in Chinese for a recorded lesson, are searched for English words (less member names, model text
  and tests/i18n_keys.ALLOWED).
"""

from __future__ import annotations

import re

import pytest

from specfuse.handout.i18n import LANGS, accepted, catalogue, fields, pick, t
from specfuse.lessons import LESSONS, in_language, key_round, load_lesson
from specfuse.models.preparation import STEPS, usual_text

from ..i18n_keys import STOP_REASONS, asked, english_words, key_texts, lesson_texts, trace_words

gr = pytest.importorskip("gradio")

from studio import explain, i18n, step_views, views  # noqa: E402
from studio.gallery import lesson_html  # noqa: E402
from studio.step_views import Tally  # noqa: E402

ZH = "zh"
MEMBERS = {"smollm2-135m", "gemma3-270m"}  # the page's member choices: names, never translated


@pytest.fixture(scope="module")
def demo():
    import app

    return app.build_demo(lambda name, device, progress: None, choices=sorted(MEMBERS))


def prop_texts(prop: str, value) -> list:
    """The texts one property of a component shows: a choice's label, each header, or the value."""
    if prop == "choices":
        return [label for label, _v in value]
    return value if prop == "headers" else [value]


def page_texts(demo):
    """(component, text) of the page's fixed text, outside the components whose text is computed."""
    for component in demo.blocks.values():
        if component in i18n.LOCALIZER.made:
            continue
        for prop, value in i18n.texts(component).items():
            for text in prop_texts(prop, value):
                yield component, str(text)


def test_every_text_the_ui_shows_is_in_the_catalogue_in_every_language(demo):
    wanted = {text for _c, text in page_texts(demo) if english_words(i18n.plain(text), {"English", *MEMBERS})}
    wanted |= {key for _where, key in asked()}
    wanted |= set(lesson_texts()) | set(key_texts()) | set(STOP_REASONS)
    wanted |= {explain.LEAVE, explain.LABEL, "black screen: press any key", *STEPS}
    assert len(wanted) > 300  # the walk found the page (a broken walk finds nothing and passes)
    for lang in LANGS:
        if lang == "en":
            continue
        missing = sorted(k for k in wanted if not catalogue(lang).get(k, "").strip())
        assert not missing, f"{len(missing)} texts lack a {lang} translation: {missing[:20]}"


def test_each_translation_keeps_its_fields_and_drops_the_english():
    for lang in LANGS:
        for key, text in catalogue(lang).items():
            assert text.strip(), key
            assert fields(key) == fields(text), (lang, key, text)
    assert t("**Round {k}**", ZH, k=3) == "**第 3 轮**"
    assert t("not a key", ZH) == "not a key"  # English where the table lacks it, never an error
    with pytest.raises(ValueError, match="unknown UI language"):
        catalogue("xx")


def test_a_session_language_comes_from_the_link_then_the_browser():
    class Request:
        def __init__(self, query, header):
            self.query_params, self.headers = query, {"accept-language": header}

    assert accepted("en-GB;q=0.5, zh-CN, fr;q=0.9") == ["zh-CN", "fr", "en-GB"]
    assert pick(["fr-FR", "zh-TW"]) == "zh" and pick(["fr"]) == "en"
    assert i18n.lang_of(Request({}, "zh-CN,zh;q=0.9,en;q=0.8")) == "zh"
    assert i18n.lang_of(Request({"lang": "en"}, "zh-CN")) == "en"  # the switch wins
    assert i18n.lang_of(Request({"lang": "zh"}, "en-US")) == "zh"
    assert i18n.lang_of(Request({"lang": "<b>"}, "de")) == "en"  # an unknown one is ignored
    assert i18n.lang_of(None) == "en" and i18n.current() == "en"
    with i18n.speaking(ZH):
        assert i18n.current() == ZH and i18n._("Reveal") == "揭晓"


def test_the_page_a_chinese_session_loads_has_no_english(demo):
    update = i18n.LOCALIZER.updates(demo, set(), ZH)
    quoted = set().union(*(trace_words(load_lesson(one.slug)) for one in LESSONS))  # cards quote runs
    assert i18n.LOCALIZER.updates(demo, set(), "en") == {}
    names = {"English", *MEMBERS, *quoted}
    found = []
    for component in i18n.LOCALIZER.components(demo):
        props = {**i18n.texts(component), **update.get(component, {})}
        props.pop("__type__", None)
        for prop, value in props.items():
            for text in prop_texts(prop, value):
                found += [(prop, w, str(text)[:60]) for w in english_words(i18n.plain(str(text)), names)]
    assert not found, found[:20]


def rendered(value) -> str:
    if isinstance(value, str):
        return i18n.plain(value)
    if hasattr(value, "columns"):  # a table: its headers and cells
        return " ".join(map(str, value.columns)) + " " + " ".join(map(str, value.to_numpy().ravel()))
    if hasattr(value, "layout"):  # a figure: its titles, axes and hover text
        layout = value.layout
        parts = [layout.title.text, layout.xaxis.title.text, layout.yaxis.title.text]
        parts += [a.text for a in layout.annotations] + [str(d.hovertemplate) for d in value.data]
        parts += [str(d.name) for d in value.data if d.name]
        return i18n.plain(re.sub(r"%\{[^}]*\}", " ", " ".join(p or "" for p in parts)))
    if hasattr(value, "value"):  # the answer: its labels are member names
        return ""
    return str(value)


@pytest.mark.parametrize("slug", [one.slug for one in LESSONS])
def test_a_lesson_rendered_in_chinese_shows_no_english(slug):
    trace, lesson = load_lesson(slug), next(one for one in LESSONS if one.slug == slug)
    allowed = trace_words(trace) | {"you"}
    k = key_round(slug, trace) or 1
    rnd = trace.rounds[k - 1]
    with i18n.speaking(ZH):
        texts = {name: rendered(v) for name, v in views.round_panels(trace, k, views.NORMALIZED).items()}
        texts["raw"] = rendered(views.heatmap_figure(rnd, False))
        texts["lesson"] = i18n.plain(lesson_html(lesson)) + i18n.plain(lesson_html(lesson, live=True))
        texts["notes"] = " ".join(in_language(lesson, ZH).look_for.values())
        texts["ready"] = step_views.ready_note(trace.members, recorded=len(trace.rounds))
        texts["drafting"] = step_views.drafting_note(k)
        texts["verdict"] = step_views.verdict_note(rnd, rnd.candidates[0].member, Tally(1, 2), over=False)
        texts["ended"] = step_views.ended_note(trace.rounds[-1], Tally(0, 1), i18n._("Stopped by the user."))
        texts["looking"] = step_views.looking_note(1, 2, True) + step_views.looking_note(2, 2, False)
        texts["hidden"] = rendered(step_views.hidden_matrix(k))
        texts["segment"] = views.segment_html(trace.rounds, k - 1)
        texts["keymap"] = explain.keymap_html()
    found = {name: english_words(i18n.plain(text), allowed) for name, text in texts.items()}
    assert not {name: words for name, words in found.items() if words}


def test_the_handout_texts_are_in_the_catalogue_and_embedded():
    from specfuse.handout.html import player_keys, trace_html

    keys = player_keys()
    assert {"round {k} of {n}", "Prompt", "Space"} <= keys  # the scan found the player's and the page's
    missing = sorted(k for k in keys if english_words(k) and k not in catalogue(ZH))
    assert not missing, missing
    page = trace_html(load_lesson("weak-member-exits"), lang=ZH)
    assert '"lang": "zh"' in page or '"lang":"zh"' in page
    assert "第 {k} 轮，共 {n} 轮" in page  # the player's table travels with the page
    with pytest.raises(ValueError, match="unknown UI language"):
        trace_html(load_lesson("weak-member-exits"), lang="xx")


def test_the_status_line_while_members_are_prepared_speaks_chinese():
    from studio.preparing import usual_said

    for said in (usual_text(None, True), usual_text((12.4, 1), False), usual_text((30.0, 3), True)):
        with i18n.speaking(ZH):
            assert not english_words(usual_said(said)), usual_said(said)
        assert usual_said(said) == said  # English: the loader's own sentence


def test_a_round_slide_draws_in_chinese_with_a_cjk_font():
    from specfuse.handout.png import round_png
    from studio.downloads import slide_font

    trace = load_lesson("weak-member-exits")
    font = slide_font(trace, cjk=True)
    if font is None:
        pytest.skip("needs a CJK font (fonts-wqy-zenhei)")
    english, chinese = round_png(trace, 4, font=font), round_png(trace, 4, font=font, lang=ZH)
    assert chinese.startswith(b"\x89PNG") and chinese != english
    with pytest.raises(ValueError, match="unknown UI language"):
        round_png(trace, 4, lang="xx")


def test_the_room_speaks_each_pages_language_and_refuses_in_it():
    """The class session (studio.room_views, studio.room's refusals, studio.ballot's verdicts) in
    Chinese: every phase of a phone's page, the teacher's panel, every refusal, the verdict of every
    lesson round (gated, unscored, narrow and wide ones); the exception's own text stays English."""
    from specfuse.records import Draft
    from studio import room, room_views
    from studio.ballot import Ballot, Beat, choices_of, verdict_of
    from studio.room import RoomError, Rooms

    assert {*room_views.SAY.values(), *room.REFUSED.values()} <= set(catalogue(ZH))
    rooms = Rooms(secret=b"s" * 32)
    session = rooms.open("teacher", 0.0)
    token = rooms.join(session.code, None, "phone", 0.0)[1]
    student = rooms.student(session.code, token)[1]
    texts: dict[str, str] = {}
    # the letters, the code and the link (a URL; its option --host), none of them words to translate
    allowed: set[str] = {"A", "B", "C", "QR", "http", "join", "host"}
    allowed |= set(re.findall(r"[A-Za-z][A-Za-z0-9_]+", f"{session.code[:3]} {session.code[3:]}"))
    now = 0.0
    with i18n.speaking(ZH):
        texts["joined"] = room_views.student_html(session, student)
        for one in LESSONS:
            trace = load_lesson(one.slug)
            allowed |= trace_words(trace)
            for rnd in trace.rounds:
                now += 2.0
                choices = choices_of([Draft(rnd.k, c, 0.0) for c in rnd.candidates])
                session.follow(Beat(rnd.k, Ballot(rnd.k, rnd.k, choices, "问", "答")), now)
                texts[f"{one.slug}-{rnd.k}-drafts"] = room_views.student_html(session, student, "A")
                texts[f"{one.slug}-{rnd.k}-hidden"] = room_views.teacher_html(session, "http://h/join", False)
                texts[f"{one.slug}-{rnd.k}-shown"] = room_views.teacher_html(session, "http://h/join", True)
                rooms.vote(session.code, token, f"{rnd.k}-{rnd.k}", "A", now)
                session.follow(Beat(rnd.k, None, verdict_of(rnd.k, rnd, choices)), now)
                texts[f"{one.slug}-{rnd.k}-verdict"] = room_views.student_html(session, student)
                texts[f"{one.slug}-{rnd.k}-spread"] = room_views.teacher_html(
                    session, "http://127.0.0.1/join", True
                )
        texts["choices"] = " ".join(label for label, _v in room_views.pick_choices(choices_of([])))
        for key in room.REFUSED:
            error = RoomError(key)
            assert english_words(str(error)), key  # the exception (logs, the API) stays English
            texts[f"refused-{key}"] = room_views.refusal(error)
        rooms.close("teacher")
        texts["ended"] = room_views.student_html(session, student)
    found = {name: english_words(i18n.plain(text), allowed) for name, text in texts.items()}
    assert not {name: words for name, words in found.items() if words}
    assert "第 1 轮" in texts["weak-member-exits-1-drafts"] and "QR" not in texts["ended"]


def test_the_failure_browser_speaks_chinese(tmp_path):
    """The failure-case browser over a study (app.py --eval-dir): its fixed text, the note
    (the ceiling's lines included), the table and an opened case, in Chinese."""
    import app
    from specfuse.eval import report as eval_report
    from specfuse.eval.problems import Problem
    from studio import browse, failures

    from ..helpers_eval import outcomes  # a study with a ceiling, its figures known by hand

    problems = [Problem(f"p{i}", "q", "1") for i in range(10)]
    eval_report.write_reports(outcomes(), problems, tmp_path, "RESULTS-c", png=False)
    report = failures.load_eval(tmp_path / "RESULTS-c.json")
    demo = app.build_demo(
        lambda name, device, progress: None, choices=sorted(MEMBERS), eval_dir=report.report
    )
    names = {
        *MEMBERS,
        *re.findall(r"[A-Za-z][A-Za-z0-9_]+", " ".join(report.systems())),
        "RESULTS",
    }
    names |= {"McNemar"}  # a test's name
    update = i18n.LOCALIZER.updates(demo, set(), ZH)
    texts = {}
    for component in demo.blocks.values():
        if str(getattr(component, "elem_id", "")).startswith("failures"):
            props = {**i18n.texts(component), **update.get(component, {})}
            value = props.get("value")
            shown = [str(props.get("label", "")), *(label for label, _v in props.get("choices", []))]
            if hasattr(value, "columns"):  # a table: its headers (its cells are the study's data)
                shown += map(str, value.columns)
            elif isinstance(value, str):
                shown.append(i18n.plain(value))
            texts[component.elem_id] = " ".join(shown)
    assert set(texts) >= {"failures", "failures-note", "failures-filter", "failures-table"}
    assert "上限" in texts["failures-note"] and "神谕" in texts["failures-note"]
    with i18n.speaking(ZH):
        problem = report.problems()[0]
        mine = report.get(report.ensemble(), problem)
        texts["case"] = i18n.plain(browse.case_html(problem, "18", [("x", "y")], True))
        texts["case-none"] = i18n.plain(browse.case_html(problem, None, [("x", "y")], False))
        assert mine is not None
    found = {name: english_words(text, names) for name, text in texts.items()}
    assert not {name: words for name, words in found.items() if words}


def test_the_engines_errors_show_in_the_pages_language_and_stay_english_in_the_exception(tmp_path):
    """An engine error the app shows (studio.untrusted.error, a step run's end) is said by its
    template in Chinese; the exception's text, for logs and the API, is English."""
    from specfuse import ConfigError, EnsembleConfig, SpecfuseError
    from specfuse.limits import check_prompt
    from specfuse.trace import parse_trace
    from studio.untrusted import error

    raised: list[SpecfuseError] = []
    for bad in (
        lambda: check_prompt("   "),
        lambda: check_prompt([{"role": "user", "content": " "}]),
        lambda: check_prompt("x" * 200_000),
        lambda: EnsembleConfig(temperature=1e-7),
        lambda: EnsembleConfig(top_p=2.0),
        lambda: parse_trace(b"x" * 100, max_bytes=10),
        lambda: parse_trace('{"schema": "other"}'),
        lambda: parse_trace('{"schema": "specfuse.trace", "version": 99}'),
    ):
        with pytest.raises((SpecfuseError, ConfigError)) as caught:
            bad()
        raised.append(caught.value)
    for e in raised:
        assert english_words(str(e)), e  # the exception's own text: English
        with i18n.speaking(ZH):
            shown = str(error(e).message)
        assert not english_words(i18n.plain(shown), {"schema", "trace"}), (
            str(e),
            shown,
        )  # a file field, its value
        assert str(error(e).message) != shown  # English pages: the engine's words
    for template in i18n.ENGINE_TEXTS:
        assert catalogue(ZH).get(template), template
