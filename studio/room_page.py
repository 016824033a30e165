"""The class session in the app: the teacher's room panel (start and end a session, the join code,
link and QR code, the votes shown or hidden, the spread at each reveal) on the main page, and the
student's page, a route of the same app (/join, phone-sized), that follows the teacher's step.

The room follows the teacher's stepping run (studio.stepping's StepRun, live or recorded): after each
step event, and on the teacher's panel's one-second timer, `Desk.sync` turns where that run is into a
studio.room Beat. Each student's page holds one streaming event that wakes when the beat moves (one
wake per beat for the whole room, not a poll per student); a timer restarts it if it drops. Before a
reveal the beat holds the drafts' texts only: the round's verdict stays in the teacher's StepRun.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from specfuse.prompts import last_user_text

from .ballot import Ballot, Beat, choices_of, verdict_of
from .i18n import current, mark_language
from .recorded import StepRun
from .room import MAX_PHONES, RoomError, Rooms, Session, Student
from .room_views import SAY, phrase, pick_choices, refusal, student_html, teacher_html
from .stepping import Stepper
from .untrusted import error
from .updates import Update, session_of, unchanged

TEACHER_TICK_S = 1.0  # the teacher's panel: joins and votes as they come in, and the beat if missed
WATCHDOG_S = 4.0  # a student's page restarts its stream this often at most, if it dropped
STREAM_S = 600.0  # one stream's life; the watchdog starts the next
WAKE_S = 20.0  # a stream checks that its session still stands this often, beat or not
PATH = "join"
GRADIO_SLOTS = 40  # launch()'s default max_threads: the events Gradio runs at once


def beat_of(run: StepRun | None, serial: int, before: Beat) -> Beat:
    """Where a stepping run is, as the room may see it: the drafts of the round played and not yet
    revealed (text only), and the latest round revealed with its verdict, lettered as its ballot was
    (`before`: the beat the room is at)."""
    if run is None:
        return Beat(serial)
    verdict = None
    if run.rounds:
        last, ended = run.rounds[-1], run.over and run.pending is None
        key = f"{serial}-{last.k}"
        if before.verdict is not None and before.verdict.key == key and before.verdict.last == ended:
            verdict = before.verdict  # not made again at every tick
        else:
            ballot = before.ballot if before.ballot is not None and before.ballot.key == key else None
            verdict = verdict_of(serial, last, ballot.choices if ballot else None, last=ended)
    ballot = None
    if run.pending is not None:
        answer = run.rounds[-1].text if run.rounds else ""
        ballot = Ballot(serial, run.pending.k, choices_of(run.drafts), last_user_text(run.prompt), answer)
    return Beat(serial, ballot, verdict)


@dataclass
class RoomPanel:
    panel: gr.Group
    start: gr.Button
    end: gr.Button
    votes: gr.Button
    shown: gr.State
    view: gr.HTML
    timer: gr.Timer

    def outputs(self) -> list[Any]:
        return [self.panel, self.start, self.end, self.votes, self.view, self.timer]


def room_button() -> gr.Button:
    """Start a class session: in the presenter bar's row (kept in the presenter view, so C works there)."""
    return gr.Button(SAY["start"], size="sm", scale=0, min_width=220, elem_id="room-start")


def room_panel(start: object) -> RoomPanel:
    """The teacher's panel, shown while a session is open (`start`: room_button's button)."""
    assert isinstance(start, gr.Button)
    with gr.Group(visible=False, elem_id="room-panel", elem_classes=["sf-presenter-keep"]) as panel:
        view = gr.HTML("", elem_id="room-teacher", padding=False)
        with gr.Row():
            votes = gr.Button(SAY["show_votes"], size="sm", elem_id="room-votes")
            end = gr.Button(SAY["end"], size="sm", variant="stop", elem_id="room-end")
    timer = gr.Timer(TEACHER_TICK_S, active=False)
    return RoomPanel(panel, start, end, votes, gr.State(False), view, timer)


@dataclass
class Desk:
    """The class sessions over one app's stepping runs."""

    stepper: Stepper
    rooms: Rooms = field(default_factory=Rooms)
    clock: Callable[[], float] = time.monotonic
    serials: dict[str, tuple[int, StepRun | None]] = field(default_factory=dict)  # by teacher
    kept: dict[str, list[dict[str, Any]]] = field(
        default_factory=dict
    )  # by teacher: an ended session's spread

    def sync(self, teacher: str) -> Session | None:
        """The teacher's session, moved to where the teacher's run is."""
        session = self.rooms.of_teacher(teacher, self.clock())
        if session is None:
            return None
        run = self.stepper.runs.get(teacher)
        serial, seen = self.serials.get(teacher, (0, None))
        if run is not seen:  # Run again, another lesson: the room's rounds start over
            serial, seen = serial + 1, run
            self.serials[teacher] = (serial, seen)
        session.follow(beat_of(run, serial, session.beat), self.clock())
        return session

    def spread(self, teacher: str) -> list[dict[str, Any]]:
        """The class's votes per round of the teacher's run on screen, for the handout
        (specfuse.handout.data.room_votes): counts per candidate text, nothing of any student. After
        the session ended, its last run's, until the teacher's page closes or opens another."""
        session = self.rooms.by_teacher.get(teacher)
        if session is None:
            return self.kept.get(teacher, [])
        serial = self.serials.get(teacher, (0, None))[0]
        return [
            {"k": s.k, "votes": dict(zip(s.texts, s.counts))}
            for s in session.spreads
            if s.key.startswith(f"{serial}-")
        ]

    # ---- the teacher --------------------------------------------------------------------------

    def link(self, request: gr.Request, session: Session) -> str:
        headers = request.headers
        host = headers.get("x-forwarded-host") or headers.get("host") or "127.0.0.1:7860"
        scheme = headers.get("x-forwarded-proto") or "http"
        return f"{scheme}://{host}/{PATH}?code={session.code}"

    def panel(self, session: Session | None, shown: bool, request: gr.Request) -> Update:
        p = self.ui
        if session is None:
            return {
                p.panel: gr.Group(visible=False),
                p.start: gr.Button(visible=True),
                p.view: "",
                p.timer: gr.Timer(active=False),
            }
        return {
            p.panel: gr.Group(visible=True),
            p.start: gr.Button(visible=False),
            p.view: teacher_html(session, self.link(request, session), shown),
            p.votes: gr.Button(phrase("hide_votes") if shown else phrase("show_votes")),
            p.timer: gr.Timer(TEACHER_TICK_S, active=True),
        }

    async def start(self, shown: bool, request: gr.Request) -> Update:
        teacher = session_of(request)
        try:
            self.rooms.open(teacher, self.clock())
        except RoomError as e:
            raise error(refusal(e)) from e
        self.serials.pop(teacher, None)
        self.kept.pop(teacher, None)
        return self.panel(self.sync(teacher), shown, request)

    async def end(self, shown: bool, request: gr.Request) -> Update:
        teacher = session_of(request)
        self.kept[teacher] = self.spread(teacher)  # the handout may still show the class's votes
        self.rooms.close(teacher)
        return self.panel(None, shown, request)

    async def tick(self, shown: bool, request: gr.Request) -> Update:
        return self.panel(self.sync(session_of(request)), shown, request)

    async def toggle_votes(self, shown: bool, request: gr.Request) -> Update:
        shown = not shown
        return {**self.panel(self.sync(session_of(request)), shown, request), self.ui.shown: shown}

    async def stepped(self, request: gr.Request) -> None:
        """After each step event: the room hears the beat at once (not at the next tick)."""
        self.sync(session_of(request))

    async def unload(self, request: gr.Request) -> None:
        teacher = session_of(request)
        self.rooms.close(teacher)
        self.serials.pop(teacher, None)
        self.kept.pop(teacher, None)

    # ---- the student -----------------------------------------------------------------------------

    def client(self, request: gr.Request) -> str:
        """Whom failed joins count against: the first forwarded address behind a proxy (a Space),
        else the peer's. A forged header only moves a guesser to the server-wide limit."""
        forwarded = (request.headers.get("x-forwarded-for") or "").split(",")[0].strip()
        host = getattr(request, "client", None)
        return (forwarded or str(getattr(host, "host", "") or "?"))[:64]

    async def join(self, typed: str, token: str, request: gr.Request) -> Update:
        """Join by the code typed (or the link's): the token kept in the browser, the page at the beat."""
        s = self.student_ui
        if not (typed or "").strip():
            return {s.note: ""}
        try:
            session, token = self.rooms.join(typed, token, self.client(request), self.clock())
        except RoomError as e:
            return {s.note: refusal(e), s.code: gr.Textbox(visible=True), s.join: gr.Button(visible=True)}
        return {
            s.token: token,
            s.joined: session.code,
            s.note: "",
            s.code: gr.Textbox(visible=False),
            s.join: gr.Button(visible=False),
            s.timer: gr.Timer(WATCHDOG_S, active=True),
        }

    def seen(self, session: Session, student: Student, ballot_shown: str) -> Update:
        s, beat = self.student_ui, session.beat
        update: Update = {s.view: student_html(session, student, session.votes.get(student.id))}
        if beat.ballot is not None and beat.ballot.key != ballot_shown:
            update[s.pick] = gr.Radio(pick_choices(beat.ballot.choices), value=None, visible=True)
            update[s.ballot] = beat.ballot.key
        elif beat.ballot is None:
            update[s.pick] = gr.Radio(visible=False)
            update[s.ballot] = ""
        return update

    async def follow(self, code: str, token: str, ballot_shown: str) -> AsyncIterator[Update]:
        """The student's page, again at each beat (a stream: it waits on the room, it does not poll)."""
        s = self.student_ui
        try:
            session, student = self.rooms.student(code, token)
        except RoomError as e:
            # (a stream that yields nothing would empty its outputs: the join's note among them)
            yield (
                {s.note: refusal(e), s.pick: gr.Radio(visible=False), s.timer: gr.Timer(active=False)}
                if code
                else unchanged()
            )
            return
        until, version = self.clock() + STREAM_S, -1
        while self.clock() < until:
            if session.version != version:
                version = session.version
                update = self.seen(session, student, ballot_shown)
                ballot_shown = update.get(s.ballot, ballot_shown)
                if session.ended:
                    yield update | {s.pick: gr.Radio(visible=False), s.timer: gr.Timer(active=False)}
                    return
                yield update
            changed = session.changed
            try:
                await asyncio.wait_for(changed.wait(), WAKE_S)
            except asyncio.TimeoutError:
                self.rooms.sweep(self.clock())  # an idle session ends (and wakes this stream)

    async def vote(self, code: str, token: str, ballot: str, letter: str | None) -> Update:
        s = self.student_ui
        try:
            student = self.rooms.vote(code, token, ballot, letter or "", self.clock())
        except RoomError as e:
            return {s.note: refusal(e)}
        session, _ = self.rooms.student(code, token)
        return {s.note: "", s.view: student_html(session, student, letter)}

    # the components, once built
    ui: RoomPanel = field(init=False)
    student_ui: StudentPage = field(init=False)


@dataclass
class StudentPage:
    code: gr.Textbox
    join: gr.Button
    note: gr.Markdown
    view: gr.HTML
    pick: gr.Radio
    token: gr.BrowserState
    joined: gr.State
    ballot: gr.State
    timer: gr.Timer
    title: gr.Markdown
    lang: gr.Textbox  # hidden: the phone's language code, for the page's <html lang>

    def texts(self) -> Update:
        """The page's fixed text in the phone's language (its own Accept-Language or ?lang=, not the
        teacher's): the main page's load (studio.i18n.wire_language) does not reach this route."""
        return {
            self.title: f"## {phrase('join_title')}",
            self.code: gr.Textbox(label=phrase("code_label")),
            self.join: gr.Button(phrase("join")),
            self.pick: gr.Radio(label=phrase("pick_label")),
            self.lang: current(),
        }


def student_page() -> StudentPage:
    """The phone's page: the code (filled from the link), the room's view, the pick."""
    title = gr.Markdown(f"## {SAY['join_title']}", elem_id="room-title")
    code = gr.Textbox(label=SAY["code_label"], max_lines=1, max_length=20, elem_id="room-code-input")
    join = gr.Button(SAY["join"], variant="primary", elem_id="room-join")
    note = gr.Markdown("", elem_id="room-note")
    view = gr.HTML("", elem_id="room-student", padding=False)
    pick = gr.Radio([], label=SAY["pick_label"], visible=False, elem_id="room-pick")
    token = gr.BrowserState("", storage_key="specfuse-room-id")
    timer = gr.Timer(WATCHDOG_S, active=False)
    lang = gr.Textbox(visible=False)
    return StudentPage(code, join, note, view, pick, token, gr.State(""), gr.State(""), timer, title, lang)


# The link's code into the box on load; the keys 1–9 pick a candidate (a tap does too).
FROM_LINK = "(c, t) => [new URLSearchParams(window.location.search).get('code') || c, t]"
PICK_KEYS = """() => {
  if (window.sfRoomKeys) return;
  window.sfRoomKeys = true;
  document.addEventListener("keydown", (e) => {
    const t = document.activeElement;
    const typing = t && ["INPUT", "TEXTAREA"].includes(t.tagName) && t.type !== "radio";
    if (e.ctrlKey || e.metaKey || e.altKey || typing) return;
    if (!/^[1-9]$/.test(e.key)) return;
    const r = [...document.querySelectorAll("#room-pick input[type=radio]")][Number(e.key) - 1];
    if (r) { e.preventDefault(); r.click(); }
  }, true);
}"""


def wire_student(desk: Desk, demo: gr.Blocks, page: StudentPage) -> None:
    """The student's page's events: join (on load from the link, by the button, by Enter), the stream
    that follows the room, its watchdog, and the vote. Nothing here can step or see another's vote."""
    desk.student_ui = page
    quiet: dict[str, Any] = {"show_progress": "hidden", "api_visibility": "private"}
    joined = [page.token, page.joined, page.note, page.code, page.join, page.timer]
    shown = [page.view, page.pick, page.ballot, page.note, page.timer]
    follow: dict[str, Any] = {"concurrency_limit": None, "trigger_mode": "once", **quiet}
    stream = [page.joined, page.token, page.ballot]
    for trigger, js in ((demo.load, FROM_LINK), (page.join.click, None), (page.code.submit, None)):
        trigger(desk.join, [page.code, page.token], joined, js=js, concurrency_limit=None, **quiet).then(
            desk.follow, stream, shown, **follow
        )
    page.timer.tick(desk.follow, stream, shown, **follow)
    page.pick.input(
        desk.vote,
        [page.joined, page.token, page.ballot, page.pick],
        [page.note, page.view],
        **quiet,
        concurrency_limit=None,
        trigger_mode="always_last",
        # The pick as sent: Gradio's radio would refuse a value outside its choices in a sentence
        # that repeats the value (a 1 MB vote came back 1 MB long); the room refuses it in a line.
        preprocess=False,
    )
    demo.load(None, js=PICK_KEYS)
    texts = [page.title, page.code, page.join, page.pick, page.lang]
    loaded = demo.load(page.texts, None, texts, queue=False, show_progress="hidden", api_visibility="private")
    mark_language(loaded, page.lang)


def student_route(desk: Desk, demo: gr.Blocks) -> None:
    """The phones' page, a route of the app (called after its Blocks is built)."""
    with demo.route("Join", f"/{PATH}", show_in_navbar=False):
        wire_student(desk, demo, student_page())


def wire_room(desk: Desk, demo: gr.Blocks, panel: RoomPanel, step_events: list[Any]) -> Desk:
    """The teacher's panel's events, and the room's sync after each of step mode's events."""
    desk.ui = panel
    quiet: dict[str, Any] = {"show_progress": "hidden", "concurrency_limit": None}
    outputs = panel.outputs()
    panel.start.click(desk.start, [panel.shown], outputs, api_name="room_start", **quiet)
    panel.end.click(desk.end, [panel.shown], outputs, api_name="room_end", **quiet)
    panel.votes.click(
        desk.toggle_votes, [panel.shown], [*outputs, panel.shown], api_visibility="private", **quiet
    )
    panel.timer.tick(
        desk.tick, [panel.shown], outputs, api_visibility="private", trigger_mode="once", **quiet
    )
    for event in step_events:
        event.then(desk.stepped, None, None, api_visibility="private", **quiet)
    demo.unload(desk.unload)
    return desk


def serve_room(demo: gr.Blocks) -> dict[str, Any]:
    """The queue a class needs; call it between demo.queue() and launch(), which takes what it
    returns. Two limits of Gradio's queue would refuse or stall a class:

    - it runs at most `max_threads` events at once (40 by default), and each phone's page holds one
      (its stream, waiting on the room): the 41st phone, and every event behind it, would wait for a
      slot. So launch gets one slot more per phone the server takes (room.MAX_PHONES).
    - it refuses every new event ("Queue is full") while `max_size` events wait, counting the
      students' joins, streams and votes (no concurrency limit: they start at the queue's next
      turn) with the runs that wait for a worker. A class joining at once puts dozens in at the same
      moment, so students would read "Queue is full". The bound now counts only the events with a
      concurrency limit (the runs --queue-size is about); the students' events always go in."""
    queue = vars(demo)["_queue"]  # Gradio's Queue: Gradio 6.31 has no public handle on it
    bound, queue.max_size = queue.max_size, None
    push = queue.push

    def waiting() -> int:
        return sum(
            len(q.queue)
            for q in queue.event_queue_per_concurrency_id.values()
            if q.concurrency_limit is not None
        )

    def limited(body: Any) -> bool:
        fn = demo.fns.get(body.fn_index) if isinstance(body.fn_index, int) else None
        if fn is None:
            return True  # the queue's own checks answer it
        limit = queue.default_concurrency_limit if fn.concurrency_limit == "default" else fn.concurrency_limit
        return limit is not None

    async def bounded(body: Any, request: Any, username: str | None) -> Any:
        if bound is not None and limited(body) and (n := waiting()) >= bound:
            return False, f"Queue is full. Max size is {bound} and size is {n}.", "queue_full"
        return await push(body, request, username)

    queue.push = bounded  # type: ignore[method-assign]
    return {"max_threads": GRADIO_SLOTS + MAX_PHONES}
