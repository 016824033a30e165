"""The lessons: every one ships a real trace that opens without a model and shows its phenomenon,
its settings and members are real, its texts name only what its trace holds, and every check can
fail (on another lesson's trace, and on its own trace cut before the round that shows it)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specfuse import EnsembleConfig, SpecfuseError, dump_trace, feedback, load_trace, parse_trace, rules
from specfuse.lessons import (
    LESSONS,
    PANELS,
    TRACES,
    Lesson,
    UnknownLessonError,
    key_round,
    lesson,
    load_lesson,
    shows,
)
from specfuse.lessons.checks import CHECKS, ensemble_at_work
from specfuse.models.catalogue import CATALOGUE

from ..repo_tools import load_tool
from ..scripted import ScriptedMember, scripted_rounds

ROOT = Path(__file__).resolve().parents[2]
SLUGS = [x.slug for x in LESSONS]
# How the texts name the members (the catalogue names are long for a gallery card).
SHORT_NAMES = {"SmolLM2": "smollm2-135m", "Gemma": "gemma3-270m", "Qwen": "qwen2.5-coder-0.5b"}


def texts(x: Lesson) -> str:
    return " ".join([x.title, x.summary, x.takeaway, *x.look_for.values()])


def test_there_are_six_lessons_or_more_with_unique_file_safe_slugs_and_a_check_each():
    assert len(LESSONS) >= 6
    assert len(set(SLUGS)) == len(SLUGS)
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", s) for s in SLUGS), SLUGS
    assert set(CHECKS) == set(SLUGS)
    assert sorted(p.stem for p in TRACES.glob("*.json")) == sorted(SLUGS)  # no trace without a lesson


def test_an_unknown_slug_names_the_lessons():
    with pytest.raises(UnknownLessonError) as caught:
        lesson("no-such-lesson")
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, SpecfuseError)
    message = str(caught.value)
    assert "no-such-lesson" in message and all(s in message for s in SLUGS)
    with pytest.raises(UnknownLessonError):
        shows("no-such-lesson", load_lesson(SLUGS[0]))


@pytest.mark.parametrize("slug", SLUGS)
def test_each_lesson_is_a_real_setup_with_texts_for_real_panels(slug):
    x = lesson(slug)
    config = EnsembleConfig(**x.settings)  # a ConfigError would fail here
    assert config.to_dict() == EnsembleConfig.from_dict(config.to_dict()).to_dict()
    assert x.members and set(x.members) <= set(CATALOGUE), x.members
    assert x.look_for and set(x.look_for) <= set(PANELS), x.look_for
    for name, text in {**x.look_for, "summary": x.summary, "takeaway": x.takeaway}.items():
        assert text.strip() and "TODO" not in text, name
    for panel, text in x.look_for.items():  # one or two plain sentences (quoted drafts left out)
        plain = re.sub(r"(?<!\w)'[^']*?'(?!\w)", "…", text)
        assert 1 <= len(re.findall(r"[.!?](?=\s|$)", plain)) <= 2, (panel, text)
    assert "\n" not in x.summary and x.title.strip() and x.prompt.strip()


@pytest.mark.parametrize("slug", SLUGS)
def test_each_shipped_trace_is_its_lessons_run_and_shows_its_phenomenon(slug):
    x, trace = lesson(slug), load_lesson(slug)
    assert shows(slug, trace) is None
    k = key_round(slug, trace)
    assert k is not None and 1 <= k <= len(trace.rounds)
    assert trace.prompt == x.prompt and trace.members == x.members
    assert trace.config == EnsembleConfig(**x.settings)
    assert ((trace.branch.k, trace.branch.text) if trace.branch else None) == x.branch
    assert parse_trace(dump_trace(trace)).rounds == trace.rounds  # it round-trips as any trace does


@pytest.mark.parametrize("slug", SLUGS)
def test_the_texts_name_only_rounds_and_members_the_trace_holds_and_the_key_round(slug):
    x, trace = lesson(slug), load_lesson(slug)
    words = texts(x)
    named = {int(n) for n in re.findall(r"\b[Rr]ounds? (\d+)", words)}
    named |= {int(n) for n in re.findall(r"\b[Rr]ounds \d+ (?:and|to|–) (\d+)", words)}
    assert named and max(named) <= len(trace.rounds), named
    assert key_round(slug, trace) in named, f"the texts never name the key round {key_round(slug, trace)}"
    members = {full for short, full in SHORT_NAMES.items() if short in words}
    assert members <= set(trace.members), members


@pytest.mark.parametrize("slug", SLUGS)
def test_each_check_fails_on_its_trace_cut_before_the_key_round(slug):
    trace = load_lesson(slug)
    k = key_round(slug, trace)
    assert k is not None
    cut = dataclasses.replace(trace, rounds=trace.rounds[: k - 1])
    reason = shows(slug, cut)
    assert isinstance(reason, str) and reason, reason


@pytest.mark.parametrize("slug", SLUGS)
def test_each_check_fails_on_some_other_lessons_trace(slug):
    reasons = {other: shows(slug, load_lesson(other)) for other in SLUGS if other != slug}
    assert any(isinstance(r, str) and r for r in reasons.values()), reasons


def test_the_checks_see_the_detail_they_test():
    """Each check turned on one field: the same trace with that one thing changed fails."""
    exits = load_lesson("weak-member-exits")
    at_the_bar = tuple(
        dataclasses.replace(
            r, exits=tuple(dataclasses.replace(e, keep_probability=e.threshold) for e in r.exits)
        )
        for r in exits.rounds
    )
    assert shows("weak-member-exits", dataclasses.replace(exits, rounds=at_the_bar)) is not None
    no_penalty = load_lesson("repeat-penalized")
    off = dataclasses.replace(no_penalty, config=dataclasses.replace(no_penalty.config, repeat_penalty=0.0))
    assert shows("repeat-penalized", off) == "the repeat penalty is off in this trace"
    typed = load_lesson("typed-wrong-number")
    assert shows("typed-wrong-number", dataclasses.replace(typed, branch=None)) is not None
    guard = load_lesson("loop-guard-returns")
    unguarded = dataclasses.replace(guard, config=dataclasses.replace(guard.config, loop_guard=False))
    assert shows("loop-guard-returns", unguarded) == "the loop guard is off in this trace"


def test_the_best_member_lesson_cites_the_evaluations_own_numbers():
    x = lesson("best-member-dominates")
    assert "docs/evaluation.md" in x.takeaway
    evaluation = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    cited = re.findall(r"\d+ of \d+", x.takeaway)
    assert cited, x.takeaway
    for figure in cited:
        got, total = figure.split(" of ")
        assert figure in evaluation or f"{got}/{total}" in evaluation, figure


def test_loading_every_lesson_imports_no_torch():
    code = (
        "import json, sys\n"
        "from specfuse.lessons import LESSONS, load_lesson, shows\n"
        "missing = {x.slug: shows(x.slug, load_lesson(x.slug)) for x in LESSONS}\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'numpy'))\n"
        "print(json.dumps({'missing': missing, 'heavy': heavy}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(done.stdout)
    assert out["heavy"] == [], out["heavy"]
    assert set(out["missing"]) == set(SLUGS) and not any(out["missing"].values()), out["missing"]


def test_the_tool_checks_the_shipped_traces_and_times_them():
    done = subprocess.run(
        [sys.executable, "tools/make_lessons.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for slug in SLUGS:
        assert re.search(
            rf"^{re.escape(slug)} +opens in \d+\.\d+ s; shows it in round \d+$", done.stdout, re.M
        )


def test_the_tool_refuses_a_trace_that_is_not_its_lessons_run():
    tool = load_tool("make_lessons")
    x, trace = lesson("numbers-differ"), load_lesson("numbers-differ")
    assert tool.mismatch(x, trace) is None
    assert "prompt" in tool.mismatch(x, dataclasses.replace(trace, prompt=trace.prompt + " "))
    other = dataclasses.replace(trace.config, segment_len=trace.config.segment_len + 1)
    assert "settings" in tool.mismatch(x, dataclasses.replace(trace, config=other))


def test_the_tool_branches_as_the_app_does(tmp_path):
    """A branch attempt: the parent's rounds before k, then round k forced to the typed segment,
    scored beside the members' candidates, then played on."""
    tool = load_tool("make_lessons")
    members = {
        "a": ScriptedMember("a", ["One ", "two ", ("three.", True)], lambda t: -len(t)),
        "b": ScriptedMember("b", ["Uno ", "dos ", ("tres.", True)], lambda t: -2.0 * len(t)),
    }
    attempt = tool.Attempt("Count.", {"max_new_tokens": 16}, ("a", "b"), branch=(2, "7 "))
    trace = tool.play(attempt, members)
    assert trace.branch is not None and (trace.branch.k, trace.branch.text, trace.branch.origin) == (
        2,
        "7 ",
        "you",
    )
    forced = trace.rounds[1]
    assert forced.winner.member == "you" and [c.member for c in forced.candidates] == ["a", "b", "you"]
    assert len(trace.rounds) > 2 and trace.rounds[-1].text.startswith(trace.rounds[0].winner.text + "7 ")
    assert parse_trace(dump_trace(trace)).branch == trace.branch


def test_the_readme_screenshot_shows_a_round_of_the_ensemble_at_work():
    """assets/make_screenshot.py shows ensemble_at_work's round of the trace it saves (issue 58): three
    candidates or more, a full matrix, weights that moved, an answer of more than one member."""
    trace = load_trace(ROOT / "assets" / "example-trace.json")
    k = ensemble_at_work(trace)
    assert isinstance(k, int), k
    shown = trace.rounds[k - 1]
    assert shown.verified and len(shown.candidates) >= 3
    assert len(shown.verifiers) == len(shown.candidates) == len(trace.members)  # a full N×N matrix
    assert all(len(row) == len(shown.candidates) for row in shown.scores)
    assert max(shown.weights_before) - min(shown.weights_before) >= 0.02
    assert len({r.winner.member for r in trace.rounds[:k]}) > 1


def test_the_first_picture_is_never_a_lone_draft_nor_a_one_member_answer():
    trace = load_trace(ROOT / "assets" / "example-trace.json")
    k = ensemble_at_work(trace)
    assert isinstance(k, int)
    lone = dataclasses.replace(trace.rounds[k - 1], verified=False, verifiers=(), raw_scores=(), scores=())
    assert ensemble_at_work(dataclasses.replace(trace, rounds=(*trace.rounds[: k - 1], lone))) == k - 1
    assert "full matrix" in str(ensemble_at_work(dataclasses.replace(trace, rounds=(lone,))))
    assert "moved" in str(ensemble_at_work(dataclasses.replace(trace, rounds=(trace.rounds[0],))))  # equal
    # Three scripted members, full matrices and moving weights, but "b" wins every segment.
    assert "more than one member" in str(ensemble_at_work(scripted_rounds()))


# ---- every number a note quotes is its trace's (issue 53, D9) -------------------------------------

NUMBER = re.compile(r"(?<![\d.])[−-]?\d+\.\d{2,}")


def _floats(obj: object, out: set[float]) -> None:
    if isinstance(obj, float):
        out.add(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _floats(item, out)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _floats(getattr(obj, f.name), out)


def _rule_values(rnd) -> set[float]:
    """What each selection rule computes on a recorded round (its normalized matrix and its votes),
    from the same code the what-if panel runs: a note may quote the paper's rule."""
    out: set[float] = set()
    index = {m: i for i, m in enumerate(rnd.members)}
    weights = [rnd.weights_before[index[v]] for v in rnd.verifiers]
    drafters = [c.member for c in rnd.candidates]
    for rule in rules.RULES:
        try:  # a rule that cannot judge this round (no evidence, scores its normalization refuses)
            scores = feedback.normalize(rules.raw_scores(rnd, rule.score)[0], rule.normalization)
            y = feedback.aggregate(scores, weights, rnd.verifiers, drafters, True, rule.aggregation)
        except (ValueError, SpecfuseError):
            continue
        _floats([list(r) for r in scores], out)
        _floats(list(y), out)
    return out


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda one: one.slug)
def test_every_number_a_lesson_note_quotes_is_in_its_trace(lesson):
    trace = load_lesson(lesson.slug)
    values: set[float] = set()
    _floats(trace.rounds, values)
    _floats(dataclasses.astuple(trace.config), values)
    for rnd in trace.rounds:
        if rnd.verified:
            values |= _rule_values(rnd)
    texts = [*lesson.look_for.values(), lesson.takeaway]
    missing = []
    for text in texts:
        for quoted in NUMBER.findall(text):
            plain = quoted.replace("−", "-")
            digits = len(plain.split(".")[1])
            if not any(f"{abs(v):.{digits}f}" == plain.lstrip("-") for v in values):
                missing.append(quoted)
    assert not missing, f"{lesson.slug} quotes numbers its trace does not hold: {missing}"
