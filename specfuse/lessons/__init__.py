"""Lessons: ready scenarios, each a recorded run of the embedded models that shows one phenomenon.

The package's map. `LESSONS` (catalogue.py) says what each lesson is about and what to look for;
`load_lesson(slug)` reads its shipped trace (traces/<slug>.json) without any model or torch;
`shows(slug, trace)` tests, on the records alone, that a trace shows the lesson's phenomenon
(checks.py), and `key_round` names the round where it does. `tools/make_lessons.py` makes the traces.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..handout.i18n import t
from ..trace import Trace, load_trace
from .catalogue import LESSONS, PANELS, Lesson, UnknownLessonError, lesson
from .checks import CHECKS

TRACES = Path(__file__).resolve().parent / "traces"


def trace_path(slug: str) -> Path:
    """Where lesson `slug`'s trace is shipped (an unknown slug: UnknownLessonError)."""
    return TRACES / f"{lesson(slug).slug}.json"


def load_lesson(slug: str) -> Trace:
    """The shipped trace of lesson `slug`: read and validated, no model loaded (TraceError when the
    file is missing or damaged)."""
    return load_trace(trace_path(slug))


def shows(slug: str, trace: Trace) -> str | None:
    """None when `trace` shows lesson `slug`'s phenomenon; else one sentence saying what is missing."""
    found = CHECKS[lesson(slug).slug](trace)
    return found if isinstance(found, str) else None


def key_round(slug: str, trace: Trace) -> int | None:
    """The round where `trace` shows lesson `slug`'s phenomenon (the one to open it at), or None."""
    found = CHECKS[lesson(slug).slug](trace)
    return found if isinstance(found, int) else None


def in_language(one: Lesson, lang: str) -> Lesson:
    """The lesson's texts (title, summary, notes, takeaway, live note) in UI language `lang`, from
    the one catalogue (specfuse.handout.i18n). The prompt is the recorded run's and stays as it is."""
    return replace(
        one,
        title=t(one.title, lang),
        summary=t(one.summary, lang),
        look_for={panel: t(text, lang) for panel, text in one.look_for.items()},
        takeaway=t(one.takeaway, lang),
        live_note=t(one.live_note, lang),
    )


__all__ = [
    "LESSONS",
    "PANELS",
    "TRACES",
    "Lesson",
    "UnknownLessonError",
    "in_language",
    "key_round",
    "lesson",
    "load_lesson",
    "shows",
    "trace_path",
]
