"""The room benchmark's server (`python -m studio.room_drill`, started by `python -m specfuse.bench
room`): the whole app served on a loopback port, with one teacher stepping a shipped lesson (a
recorded run, no model) inside this process, so the benchmark's simulated phones reach the real
/join page over HTTP while the teacher's beats come when the benchmark asks.

Besides the app's own routes it answers four of its own, on 127.0.0.1 only (the benchmark's, never
in the app): POST /drill/open (a class session: its code), POST /drill/step (the next beat: a
round's drafts, or its reveal), GET /drill/tally (the session's students, votes and spreads) and
POST /drill/end. They run on the server's event loop, as the teacher's own events do. It prints
`ready <address>` once the page answers, and stops when its standard input closes.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

import gradio as gr
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from specfuse.lessons import load_lesson

from .layout import build_demo
from .recorded import RecordedTicket, StepRun
from .room_page import Desk, serve_room
from .serving import STATUS_TIMER_GUARD, PageHead
from .stepping import Stepper

TEACHER = "drill-teacher"  # the teacher's page session, as a browser's would be


def desk_of(demo: gr.Blocks) -> Desk:
    """The Desk build_demo wired (the handler of the phones' join event is its bound method)."""
    for fn in demo.fns.values():
        owner = getattr(fn.fn, "__self__", None)
        if isinstance(owner, Desk):
            return owner
    raise LookupError("the app has no class session desk")


class Drill:
    """One teacher stepping `slug`'s recorded run with a class session open."""

    def __init__(self, desk: Desk, slug: str) -> None:
        self.desk, self.trace = desk, load_lesson(slug)

    async def open(self, request: Request) -> JSONResponse:
        stepper: Stepper = self.desk.stepper
        session = self.desk.rooms.open(TEACHER, self.desk.clock())
        stepper.runs[TEACHER] = StepRun(RecordedTicket(self.trace), self.trace.prompt, self.trace.config)
        self.desk.sync(TEACHER)
        return JSONResponse({"code": session.code, "rounds": len(self.trace.rounds)})

    async def step(self, request: Request) -> JSONResponse:
        """The next beat, as step mode's Next then Reveal make it: drafts, then their verdict."""
        run = self.desk.stepper.runs.get(TEACHER)
        if run is None:
            return JSONResponse({"error": "no session"}, status_code=409)
        if run.pending is not None:
            run.rounds.append(run.pending)
            run.pending, run.drafts = None, []
            run.over = len(run.rounds) >= len(self.trace.rounds)
        elif run.over:
            return JSONResponse({"phase": "over"})
        else:
            run.ticket.next()
            async for event in run.ticket.aevents(until_pause=True):
                kind = type(event).__name__
                if kind == "Draft":
                    run.drafts.append(event)  # type: ignore[arg-type]
                elif kind == "Round":
                    run.pending = event  # type: ignore[assignment]
        session = self.desk.sync(TEACHER)
        if session is None:
            return JSONResponse({"error": "the session ended"}, status_code=409)
        beat = session.beat
        if beat.ballot is not None:
            letters = [c.letter for c in beat.ballot.choices]
            return JSONResponse({"phase": "drafts", "key": beat.ballot.key, "letters": letters})
        assert beat.verdict is not None
        return JSONResponse({"phase": "verdict", "key": beat.verdict.key, "winner": beat.verdict.winner})

    async def tally(self, request: Request) -> JSONResponse:
        session = self.desk.rooms.by_teacher.get(TEACHER)
        if session is None:
            return JSONResponse({"students": 0, "counts": {}, "spreads": []})
        spreads = [{"key": s.key, "counts": list(s.counts), "made": s.made} for s in session.spreads]
        return JSONResponse(
            {"students": len(session.students), "counts": dict(session.counts), "spreads": spreads}
        )

    async def end(self, request: Request) -> JSONResponse:
        self.desk.rooms.close(TEACHER)
        self.desk.stepper.runs.pop(TEACHER, None)
        return JSONResponse({"ended": True})

    def routes(self) -> list[Route]:
        return [
            Route("/drill/open", self.open, methods=["POST"]),
            Route("/drill/step", self.step, methods=["POST"]),
            Route("/drill/tally", self.tally, methods=["GET"]),
            Route("/drill/end", self.end, methods=["POST"]),
        ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def no_model(name: str, device: str, progress: Any) -> Any:
    raise RuntimeError("the room benchmark loads no model")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studio.room_drill", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0: a free one")
    parser.add_argument("--lesson", default="weak-member-exits", help="the shipped lesson stepped")
    parser.add_argument("--queue-size", type=int, default=16, help="as app.py's --queue-size")
    args = parser.parse_args(argv)
    demo = build_demo(no_model)
    drill = Drill(desk_of(demo), args.lesson)
    demo.queue(max_size=args.queue_size, default_concurrency_limit=1)
    app, address, _ = demo.launch(
        server_name="127.0.0.1",
        server_port=args.port or free_port(),
        ssr_mode=False,
        prevent_thread_lock=True,
        quiet=True,
        **serve_room(demo),
    )
    app.router.routes[0:0] = drill.routes()
    PageHead(STATUS_TIMER_GUARD, demo).mount(app)
    print(f"ready {address}", flush=True)
    try:
        sys.stdin.read()  # the benchmark closes it to stop this server
    finally:
        demo.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.exit(main())
