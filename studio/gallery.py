"""The lesson gallery: every shipped lesson as a card; opening one replays its recorded run at once,
with no model loaded (an uploaded trace's path), its "look for" notes under the panels and its key
takeaway above them; "Run it live" fills the form from the lesson and runs it on the members (taking
the run shown home: studio.take_home).

Lessons come from specfuse.lessons (a `Shelf`; tests pass their own), each opened at its key
round, or at the round a link to the page asks for (`?lesson=NAME&round=K`, read on load). Knows
nothing about how a run streams: "Run it live" fills the form, then chains Studio's own run handler.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Optional

import gradio as gr

from specfuse import EnsembleConfig, Trace
from specfuse.lessons import LESSONS, Lesson, in_language, key_round, load_lesson

from . import settings, views
from .chat_views import Chat, chat_from_prompt
from .conversation import Conversing
from .explain import Notes
from .handlers import Studio
from .i18n import _, current, localize
from .stepping import Stepper
from .untrusted import esc, md
from .updates import Update, session_of, unchanged


def _no_key_round(slug: str, trace: Trace) -> int | None:
    return None


@dataclass(frozen=True)
class Shelf:
    """The lessons the gallery offers, how to open one's recorded run (a Trace, no model), and the
    round it shows its phenomenon at (None: the last)."""

    lessons: tuple[Lesson, ...]
    load: Callable[[str], Trace]
    key_round: Callable[[str, Trace], int | None] = _no_key_round

    def find(self, slug: str) -> Lesson:
        for one in self.lessons:
            if one.slug == slug:
                return one
        raise KeyError(slug)


def shipped() -> Shelf:
    """The lessons specfuse ships, each opened from its shipped trace at its key round."""
    return Shelf(LESSONS, load_lesson, key_round)


@dataclass
class Gallery:
    """The cards (an Open button per lesson, by slug) and the lesson opened, above the panels."""

    shelf: Shelf
    opens: dict[str, gr.Button]
    box: gr.HTML
    live: gr.Button
    opened: gr.State  # the slug of the lesson opened, or None


def gallery_panel(shelf: Shelf) -> dict[str, gr.Button]:
    """The cards: each lesson's title and summary, and its Open button."""
    opens: dict[str, gr.Button] = {}
    title = "Lessons: open one to watch a recorded run, no model needed"
    with gr.Accordion(title, open=True, elem_id="class-gallery"):
        if not shelf.lessons:
            gr.Markdown("No lessons are installed here.")
        with gr.Row(equal_height=True, elem_classes=["sf-cards"]):
            for one in shelf.lessons:
                with gr.Column(min_width=220, elem_classes=["sf-card"], elem_id=f"class-card-{one.slug}"):
                    card = gr.Markdown(card_text(one))
                    localize(card, functools.partial(card_value, one))
                    opens[one.slug] = gr.Button("Open", size="sm", elem_id=f"class-open-{one.slug}")
    return opens


def card_text(one: Lesson) -> str:
    """A gallery card: the lesson's title and its one line."""
    return f"### {md(one.title)}\n{md(one.summary)}"


def card_value(one: Lesson) -> dict[str, object]:
    return {"value": card_text(in_language(one, current()))}


def lesson_panel(shelf: Shelf, opens: dict[str, gr.Button]) -> Gallery:
    """The lesson opened: its box (prompt, takeaway, what a live run may change) and Run it live."""
    box = gr.HTML(visible=False, elem_id="class-lesson")
    live = gr.Button("Run it live", visible=False, elem_id="class-run-live")
    return Gallery(shelf, opens, box, live, gr.State(None))


def lesson_html(lesson: Lesson, live: bool = False) -> str:
    """The box above the panels: title, prompt, key takeaway, and what a live run may change (in
    the current language; the prompt is the run's own)."""
    lesson, branch = in_language(lesson, current()), ""
    if lesson.branch is not None:
        k, text = lesson.branch
        branch = (
            "<p class='sf-lesson-branch'>"
            + _(
                "Round {k} of this run was typed by a person, not drafted: <code>{text}</code>. To do it "
                "yourself: Run it live, show round {k}, open <i>What if another candidate had won?</i> (the "
                "segment is typed in for you) and press <b>Branch from this round</b>.",
                k=int(k),
                text=esc(text),
            )
            + "</p>"
        )
    head = _("Live run of the lesson") if live else _("Lesson")
    note = lesson.live_note or _("A live run may answer differently from the recorded one.")
    return (
        f"<div class='sf-lesson'><h3>{head}{_(': ')}{esc(lesson.title)}</h3>"
        f"<p class='sf-lesson-prompt'><b>{_('Prompt:')}</b> <bdi>{esc(lesson.prompt)}</bdi></p>"
        f"<p class='sf-takeaway'><b>{_('Key takeaway:')}</b> {esc(lesson.takeaway)}</p>{branch}"
        f"<p class='sf-live-note'><b>{_('Live:') if live else _('Run it live:')}</b> {esc(note)}</p></div>"
    )


# ---- links that open a lesson at a round, for a teacher's slide: /?lesson=NAME&round=K ------------
# The page's address is untrusted text: only a known lesson slug opens anything, only a whole number
# picks a round (out of range: the nearest round), and whatever else the link holds is ignored with a
# note on the status line, escaped there (views.status_markdown), never an error page. The offline
# handout reads the same round from its URL fragment (#round=K, specfuse/handout/player.js).

STEP = {
    "1": True,
    "on": True,
    "true": True,
    "yes": True,
    "0": False,
    "off": False,
    "false": False,
    "no": False,
}
WHOLE = re.compile(r"[0-9]{1,6}")  # a round number as a person types it; 6 digits outnumber any trace
SHOWN = 40  # characters of a link's bad value quoted back in the note


def quoted(value: str) -> str:
    """A link's value as the note quotes it: cut, so a pasted essay does not fill the status line."""
    return f"“{value[:SHOWN]}{'…' if len(value) > SHOWN else ''}”"


@dataclass(frozen=True)
class Link:
    """What a page's query asks for: a known lesson's slug (or None), its round as asked (not yet
    bounded by the lesson's rounds; None: the lesson's key round), and why anything was ignored."""

    lesson: str | None = None
    round: int | None = None
    note: str = ""
    step: bool = False  # &step=1: in step mode, the rounds before `round` revealed, Next plays it


def parse_link(query: Mapping[str, str], slugs: Collection[str]) -> Link:
    """`lesson`, `round` and `step` of the page's query; any other parameter is not ours and left alone."""
    slug, asked = query.get("lesson"), query.get("round")
    step, bad_step = STEP.get((query.get("step") or "0").strip().lower()), ""
    if step is None:
        step, bad_step = (
            False,
            _("The link's step {v} is not 1 or 0: not stepping.", v=quoted(query.get("step") or "")),
        )
    if slug is None:
        note = _("The link's round needs a lesson (?lesson=NAME&round=K).") if asked is not None else ""
        return Link(note=note)
    slug = slug.strip()
    if slug not in slugs:
        known = ", ".join(sorted(slugs)) or _("none here")
        return Link(
            note=_(
                "The link's lesson {slug} is not one of these lessons ({known}).",
                slug=quoted(slug),
                known=known,
            )
        )
    if asked is None or not asked.strip():
        return Link(slug, note=bad_step, step=step)
    if not WHOLE.fullmatch(asked.strip()):
        note = _("The link's round {k} is not a whole number: the key round is shown.", k=quoted(asked))
        return Link(slug, note=" ".join(filter(None, [note, bad_step])), step=step)
    return Link(slug, int(asked.strip()), bad_step, step)


def bounded(k: int, n: int) -> tuple[int, str]:
    """Round k of a run of n rounds: the nearest round there is, and a note when k was not one."""
    if 1 <= k <= n:
        return k, ""
    near = min(max(k, 1), n)
    return near, _(
        "The link's round {k} is not one of the lesson's {n} rounds: round {near} is shown.",
        k=k,
        n=n,
        near=near,
    )


@dataclass
class Classroom:
    """The gallery's handlers: open a lesson, run it live, close it when another run or trace comes."""

    studio: Studio
    gallery: Gallery
    notes: Notes
    stepper: Stepper | None = None  # step mode: opening a lesson ends the session's stepping run
    conversing: Conversing | None = None  # a lesson's run becomes the conversation a follow-up continues

    def open_handler(self, slug: str) -> Callable[..., Update]:
        def open_lesson(
            view_name: str,
            step: bool = False,
            request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
        ) -> Update:
            return self.open(slug, view_name, session_of(request), step=step)

        return open_lesson

    def open(
        self,
        slug: str,
        view_name: str,
        session: str = "",
        step: bool = False,
        at: int | None = None,
        why: str = "",
    ) -> Update:
        """The lesson's recorded run in every panel (no model) at its key round (or round `at`, a
        link's: the nearest there is), its notes beside them; `why`: what of the link was ignored.
        With step mode on (`step`), the recorded run steps from round 1 instead, as a live one (from
        round `at`, a link's, when it names one)."""
        shelf = self.gallery.shelf
        lesson, trace = shelf.find(slug), shelf.load(slug)
        studio, shown = self.studio, self.studio.display
        k = shelf.key_round(slug, trace) or (lesson.branch[0] if lesson.branch is not None else None)
        if at is not None:
            k, off = bounded(at, len(trace.rounds))
            why = " ".join(filter(None, [why, off]))
        note = _("lesson “{title}”, a recorded run", title=in_language(lesson, current()).title) + (
            f". {why}" if why else ""
        )
        update = studio.show_trace(trace, view_name, note, session)
        if k is not None and 1 <= k < len(trace.rounds):
            update |= studio.panels(trace, k, view_name, note)
            update[shown.round] = views.slider_value(trace, k)
        if lesson.branch is not None:
            update[shown.what_if.branch_text] = lesson.branch[1]
        if self.stepper is not None and step:
            update |= self.stepper.replaying(trace, view_name, session, at=k if at is not None else None)
        elif self.stepper is not None:
            self.stepper.drop(session)
            update |= self.stepper.reset()
        if self.conversing is not None:
            update |= self.conversing.shown(chat_from_prompt(trace.prompt, trace))
        return update | self.shown(lesson)

    def open_link(
        self,
        view_name: str,
        step: bool = False,
        request: Optional[gr.Request] = None,  # noqa: UP045 (Gradio looks for this type)
    ) -> Update:
        """The page's load: the lesson its link names at the link's round (parse_link; no link:
        nothing, a bad one: a note on the status line); `&step=1` turns step mode on there."""
        query: Mapping[str, str] = request.query_params if request is not None else {}
        link = parse_link(query, [one.slug for one in self.gallery.shelf.lessons])
        if link.lesson is None:  # the empty panels, status line and conversation in the session's language
            update = self.studio.panels(None, view=view_name)
            update[self.studio.display.status] = views.status_markdown((), link.note)
            if self.conversing is not None:
                update |= self.conversing.shown(Chat())
            return update
        step = step or link.step
        update = self.open(
            link.lesson, view_name, session_of(request), step=step, at=link.round, why=link.note
        )
        if self.stepper is not None and link.step:  # the box checked and the bar shown, as a click does
            update |= {self.stepper.mode: True, self.stepper.bar.bar: gr.Group(visible=True)}
        return update

    def shown(self, lesson: Lesson | None, live: bool = False) -> Update:
        """The lesson's box, notes and Run it live button (without a lesson: all hidden)."""
        g = self.gallery
        if lesson is None:
            box = gr.HTML("", visible=False)
        else:
            box = gr.HTML(lesson_html(lesson, live), visible=True)
        return {
            **self.notes.values(lesson.look_for if lesson is not None else None),
            g.box: box,
            g.live: gr.Button(visible=lesson is not None),
            g.opened: lesson.slug if lesson is not None else None,
        }

    def close(self) -> Update:
        return self.shown(None)

    def fill(self, slug: str | None) -> Update:
        """Run it live, first half: the lesson's prompt, members and settings in the form."""
        if not slug:
            return unchanged()
        lesson = self.gallery.shelf.find(slug)
        studio, c = self.studio, self.studio.controls
        missing = [m for m in lesson.members if m not in studio.choices]
        if missing and not studio.allow_paths:
            raise studio.error(
                _(
                    "This lesson runs on {members}, and {missing} is not installed here. Its recorded run "
                    "needs no model: it is shown already.",
                    members=", ".join(lesson.members),
                    missing=", ".join(missing),
                )
            )
        # The recorded run's settings exactly: the lesson's, over EnsembleConfig's defaults (not the app's).
        form = settings.form_values(EnsembleConfig(**dict(lesson.settings)))
        return {
            c.prompt: lesson.prompt,
            c.models: gr.Dropdown(value=list(lesson.members)),
            **{c.settings[name]: value for name, value in form.items() if name in c.settings},
            **self.shown(lesson, live=True),
        }


# The lesson opened comes to the top of the window, its panels right under it: at 1280×720 the
# gallery above would otherwise leave only the box's first lines in view (issue 53, 1b).
INTO_VIEW = """() => {
  const box = document.querySelector("#class-lesson");
  // offsetParent: null while the box is hidden (a page loaded with no link to a lesson stays put)
  if (!box || !box.offsetParent || document.body.classList.contains("sf-presenter")) return;
  box.scrollIntoView({ block: "start" });
}"""


# After the page's load: marks it done (data-sf-linked): the empty panels and status line it sends for a
# page without a link would otherwise overwrite a lesson opened by a click made before they came (the
# browser tests wait for it before their first click).
LINK_LOADED = "() => { document.documentElement.dataset.sfLinked = '1'; (" + INTO_VIEW + ")(); }"


def wire_gallery(
    studio: Studio,
    gallery: Gallery,
    notes: Notes,
    concurrency_limit: int | None,
    stepper: Stepper,
    conversing: Conversing,
    page: gr.Blocks | None = None,
) -> None:
    """Open (each card, and the `page`'s link on load), Run it live (fill, then Run's own handler:
    stepping when step mode's box is checked, a new conversation), and close on another run or
    trace. Opening a lesson ends the session's stepping run and makes its recorded run the
    conversation, as an upload does."""
    room = Classroom(studio, gallery, notes, stepper, conversing)
    shown, controls = studio.display, studio.controls
    lesson_outputs = [*notes.outputs(), gallery.box, gallery.live, gallery.opened]
    panels = [*shown.by_name().values(), *shown.what_if.round_outputs()]
    opened = [studio.trace, *panels, shown.round, shown.segment, controls.download, shown.plain]
    opened += [*shown.what_if.branch_outputs(), shown.what_if.branch_text, *lesson_outputs]
    opened += [*stepper.bar.outputs(), *conversing.panel.outputs()]
    if page is not None:  # a link's lesson and round (parse_link), as the card opens it
        linked = [*opened, stepper.mode, stepper.bar.bar]
        page.load(
            room.open_link,
            [shown.view, stepper.mode],
            linked,
            api_visibility="private",
            show_progress="hidden",
        ).then(None, js=LINK_LOADED)
    for slug, button in gallery.opens.items():
        button.click(
            room.open_handler(slug),
            [shown.view, stepper.mode],
            opened,
            api_visibility="private",
            show_progress_on=[shown.status],
        ).then(None, js=INTO_VIEW)
    run, inputs, outputs = conversing.event()  # Run's own handler (studio.conversation)
    form = [controls.prompt, controls.models, *controls.settings.values(), *lesson_outputs]
    gallery.live.click(room.fill, [gallery.opened], form, api_visibility="private").success(
        run,
        inputs,
        outputs,
        api_name="run_lesson",  # not "run": the app's own Run keeps its API name
        api_visibility="private",
        show_progress_on=[shown.status],
        concurrency_limit=concurrency_limit,
        concurrency_id="run",
    )
    for event in (controls.run.click, controls.prompt.submit, controls.upload.upload):
        event(room.close, None, lesson_outputs, api_visibility="private", show_progress="hidden")
