"""The room votes, under a class: `python -m specfuse.bench room` (issue 55).

The app runs in a server process of its own (studio.room_drill: the whole app on a free loopback
port, a teacher stepping a shipped lesson's recorded run, no model). For each class size
(--students, e.g. 10 30 60) a class session opens and that many simulated phones join it through the
real /join page, as a browser does: Gradio's queue over HTTP (POST queue/join, the server-sent
stream of queue/data), one session each, the page's own events (join, the stream that follows the
room, the vote). Then the teacher steps --rounds rounds; at each round's drafts every phone votes
after a random delay (some change their vote once), at its reveal the server's spread is checked
against the votes each phone last had accepted. It prints, per class size: join latency, the delay
from the teacher's beat to each phone's update, vote-to-tally latency (median, p95), votes lost
(must be 0), refusals (a phone's note or an HTTP error), the server's memory (RSS) before, with the
class joined and after the session ended, and its CPU seconds; then the ratios between sizes.

Timings on a shared machine are noise: the figures are for a quiet one. The phones here are
coroutines in this process (one HTTP client), the server is its own process (its memory is its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli import Parser

ROOT = Path(__file__).resolve().parents[2]  # the checkout: studio/ beside specfuse/
PHASE = re.compile(r"data-phase='(\w+)'")
BEAT_WAIT_S = 20.0  # a phone that has not seen a beat in this long counts it as missed
CHANGE_SHARE = 0.3  # phones that change their vote once in a round


# ---- the server ---------------------------------------------------------------------------------


class Server:
    """studio.room_drill in a process of its own: its address, its drill routes, its RSS and CPU."""

    def __init__(self, queue_size: int) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        env.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
        command = [sys.executable, "-m", "studio.room_drill", "--queue-size", str(queue_size)]
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError(f"the room's server did not start (it said {line!r})")
        self.address = line.split(" ", 1)[1].strip().rstrip("/")

    def status(self, field_name: str) -> float:
        """A /proc/<pid>/status figure in MB (VmRSS: the memory it holds now)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def rss_mb(self) -> float:
        return self.status("VmRSS")

    def cpu_s(self) -> float:
        """User and system CPU seconds the server has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the server stops when its input closes
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass(frozen=True)
class Page:
    """The /join page's events, found in the app's config by their components' ids."""

    join: int  # the Join button's click: [code, token] → [token, joined, note, …]
    follow: int  # its .then: the stream that follows the room
    vote: int  # the pick's input: [joined, token, ballot, pick] → [note, view]


def page_of(config: dict[str, Any]) -> Page:
    ids = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}
    deps = config["dependencies"]

    def on(elem: str, event: str) -> int:
        return next(
            d["id"] for d in deps if any(ids.get(t[0]) == elem and t[1] == event for t in d["targets"])
        )

    join = on("room-join", "click")
    follow = next(d["id"] for d in deps if d.get("trigger_after") == join)
    return Page(join, follow, on("room-pick", "input"))


# ---- a phone --------------------------------------------------------------------------------------


@dataclass
class Phone:
    """One simulated student: a Gradio session of the /join page, over HTTP."""

    client: Any  # httpx.AsyncClient
    page: Page
    session: str = field(default_factory=lambda: secrets.token_hex(6))
    token: str = ""
    view: Any = ""
    seen: list[tuple[float, str]] = field(default_factory=list)  # (time, phase) per update of the view
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # completed events, by id
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    refusals: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    follow_id: str = ""

    async def push(self, fn: int, data: list[Any], trigger: int | None = None) -> str:
        body = {
            "data": data,
            "fn_index": fn,
            "session_hash": self.session,
            "event_data": None,
            "trigger_id": trigger,
        }
        response = await self.client.post("/gradio_api/queue/join", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
        event: str = response.json()["event_id"]
        return event

    async def result(self, event: str, timeout: float) -> dict[str, Any]:
        """The event's completion (it may come down the stream before its POST has answered)."""
        until = time.perf_counter() + timeout
        while event not in self.results:
            self.arrived.clear()
            if event in self.results:
                break
            left = until - time.perf_counter()
            if left <= 0:
                raise asyncio.TimeoutError
            await asyncio.wait_for(self.arrived.wait(), left)
        return self.results.pop(event)

    async def listen(self) -> None:
        """The session's stream until the server closes it: completions, and each update of the view."""
        import httpx
        from gradio_client.utils import apply_diff

        params = {"session_hash": self.session}
        try:
            async with self.client.stream("GET", "/gradio_api/queue/data", params=params, timeout=None) as r:
                await self.read(r, apply_diff)
        except httpx.TransportError:
            return  # the server went (the benchmark's end): nothing more comes

    async def read(self, r: Any, apply_diff: Any) -> None:
        """The stream's messages, dispatched."""
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            msg = json.loads(line[5:])
            kind, event = msg.get("msg"), msg.get("event_id")
            if kind == "process_generating" and event == self.follow_id:
                view = msg["output"]["data"][0]
                self.view = view if isinstance(view, str) else apply_diff(self.view, view)
                phase = PHASE.search(str(self.view))
                self.seen.append((time.perf_counter(), phase[1] if phase else ""))
                self.changed.set()
            elif kind == "process_completed" and event != self.follow_id:
                out = msg.get("output") or {}
                self.results[event] = {
                    "success": msg.get("success"),
                    "data": out.get("data"),
                    "error": out.get("error"),
                }
                self.arrived.set()
            elif kind == "close_stream":
                return

    async def call(self, fn: int, data: list[Any]) -> dict[str, Any]:
        """One event to its completion, on a stream of its own (none other is open)."""
        event = await self.push(fn, data)
        await self.listen()
        return await self.result(event, 5.0)

    async def join(self, code: str) -> float:
        """Join (a refusal is kept), then the stream that follows the room: the join's latency."""
        began = time.perf_counter()
        result = await self.call(self.page.join, [code, self.token])
        took = time.perf_counter() - began
        data = result.get("data") or []
        note = data[2] if len(data) > 2 else None
        if not result["success"] or not isinstance(data[0], str) or not data[0]:
            self.refusals.append(str(result.get("error") or note))
            return took
        self.token = data[0]
        self.follow_id = await self.push(self.page.follow, [None, self.token, None])
        asyncio.get_running_loop().create_task(self.listen())
        return took

    async def vote(self, letter: str) -> float | None:
        """A vote; its latency until the server has counted it (None: refused, kept in refusals)."""
        began = time.perf_counter()
        try:
            event = await self.push(self.page.vote, [None, self.token, None, letter])
            result = await self.result(event, 10.0)
        except (RuntimeError, asyncio.TimeoutError) as e:
            self.refusals.append(str(e) or type(e).__name__)
            return None
        data = result.get("data") or []
        note = data[0] if data else None
        note = note.get("value") if isinstance(note, dict) else note
        if not result["success"] or note:
            self.refusals.append(str(result.get("error") or note))
            return None
        return time.perf_counter() - began

    async def update_after(self, since: float, phase: str) -> float | None:
        """Seconds from `since` to this phone's first update showing `phase` (None: not in time)."""
        until = time.perf_counter() + BEAT_WAIT_S
        while True:
            self.changed.clear()  # before looking: an update that comes while it looks sets it again
            hit = next((t for t, p in self.seen if t >= since and p == phase), None)
            if hit is not None:
                return hit - since
            left = until - time.perf_counter()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except asyncio.TimeoutError:
                return None


# ---- one class ------------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "median": float("nan"), "p95": float("nan")}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "p95": ordered[round(0.95 * (len(ordered) - 1))],
    }


async def drill(client: Any, path: str, method: str = "POST") -> dict[str, Any]:
    response = await (client.post(path) if method == "POST" else client.get(path))
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


async def one_vote(
    phone: Phone, letters: Sequence[str], rng: random.Random, within: float
) -> tuple[str | None, list[float]]:
    """A phone's votes in one round after random delays: its last accepted letter and the latencies."""
    kept, took = None, []
    picks = [rng.choice(letters)] + ([rng.choice(letters)] if rng.random() < CHANGE_SHARE else [])
    for letter in picks:
        await asyncio.sleep(rng.uniform(0, within))
        latency = await phone.vote(letter)
        if latency is not None:
            kept = letter
            took.append(latency)
    return kept, took


SETTLE_S = 60.0  # the target: memory back within MEMORY_BACK_MB of before, this long after the end
MEMORY_BACK_MB = 50.0


async def run_class(
    server: Server, page: Page, students: int, rounds: int, within: float, seed: int, settle: float = SETTLE_S
) -> dict[str, Any]:
    import httpx

    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=4 * students + 8, max_keepalive_connections=4 * students + 8)
    async with httpx.AsyncClient(base_url=server.address, limits=limits, timeout=30.0) as client:
        cpu0, rss0 = server.cpu_s(), server.rss_mb()
        code = (await drill(client, "/drill/open"))["code"]
        phones = [Phone(client, page) for _ in range(students)]
        joins = await asyncio.gather(*(p.join(code) for p in phones))  # all at once: a class's burst
        joined = [p for p in phones if p.token]
        await asyncio.sleep(0.5)  # every stream's first update in
        rss_joined = server.rss_mb()
        beat_s: list[float] = []
        vote_s: list[float] = []
        missed = lost = counted = kept = 0
        for _ in range(rounds):
            began = time.perf_counter()
            beat = await drill(client, "/drill/step")
            if beat.get("phase") != "drafts":
                break
            seen = await asyncio.gather(*(p.update_after(began, "drafts") for p in joined))
            beat_s += [s for s in seen if s is not None]
            missed += sum(s is None for s in seen)
            votes = await asyncio.gather(*(one_vote(p, beat["letters"], rng, within) for p in joined))
            vote_s += [t for _, took in votes for t in took]
            expected = {letter: sum(1 for last, _ in votes if last == letter) for letter in beat["letters"]}
            kept += sum(expected.values())
            began = time.perf_counter()
            await drill(client, "/drill/step")  # the reveal
            seen = await asyncio.gather(*(p.update_after(began, "verdict") for p in joined))
            beat_s += [s for s in seen if s is not None]
            missed += sum(s is None for s in seen)
            tally = await drill(client, "/drill/tally", "GET")
            counts = dict(zip(beat["letters"], tally["spreads"][-1]["counts"])) if tally["spreads"] else {}
            lost += sum(abs(expected[x] - counts.get(x, 0)) for x in expected)
            counted += sum(counts.values())
        await drill(client, "/drill/end")
        await asyncio.sleep(1.0)  # the streams hear the end and close
        cpu = server.cpu_s() - cpu0
        rss_after = server.rss_mb()
        await asyncio.sleep(settle)  # the session's state freed, the phones' connections timed out
    return {
        "students": students,
        "joined": len(joined),
        "join_s": spread(joins),
        "beat_to_update_s": spread(beat_s),
        "vote_to_tally_s": spread(vote_s),
        "votes_kept": kept,  # each phone's last accepted vote per round, as the phones saw them
        "votes_counted": counted,  # as the server's spreads counted them
        "votes_lost": lost,
        "updates_missed": missed,
        "refusals": sorted({r for p in phones for r in p.refusals}),
        "refused": sum(len(p.refusals) for p in phones),
        "rss_mb": {"before": rss0, "joined": rss_joined, "after": rss_after, "settled": server.rss_mb()},
        "settle_s": settle,
        "cpu_s": cpu,
    }


# ---- the report -----------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float:
    return a / b if b and b == b else float("nan")


def report(rows: Sequence[dict[str, Any]]) -> str:
    ms = lambda s: f"{1000 * s['median']:.0f} / {1000 * s['p95']:.0f}"  # noqa: E731
    lines = [
        "The room votes: simulated phones through /join (timings on a shared machine are noise)",
        "students | joined | join ms med/p95 | beat→update ms med/p95 | vote→tally ms med/p95 | "
        "votes kept/counted | lost | missed | refused | RSS MB before/joined/after/settled | CPU s",
    ]
    for r in rows:
        rss = r["rss_mb"]
        lines.append(
            f"{r['students']} | {r['joined']} | {ms(r['join_s'])} | {ms(r['beat_to_update_s'])} | "
            f"{ms(r['vote_to_tally_s'])} | {r['votes_kept']}/{r['votes_counted']} | {r['votes_lost']} | "
            f"{r['updates_missed']} | {r['refused']} | "
            + "/".join(f"{rss[k]:.0f}" for k in ("before", "joined", "after", "settled"))
            + f" | {r['cpu_s']:.2f}"
        )
    for r in rows:
        back = r["rss_mb"]["settled"] - r["rss_mb"]["before"]
        ok = "met" if back <= MEMORY_BACK_MB else "missed"
        lines.append(
            f"memory {r['settle_s']:.0f} s after the session of {r['students']} ended: {back:+.0f} MB "
            f"against before (target ≤ {MEMORY_BACK_MB:.0f} MB: {ok})"
        )
    for r in rows:
        for refusal in r["refusals"]:
            lines.append(f"refusal at {r['students']}: {refusal}")
    first = rows[0] if rows else None
    for r in rows[1:]:
        assert first is not None
        scale = r["students"] / first["students"]
        p95 = ratio(r["beat_to_update_s"]["p95"], first["beat_to_update_s"]["p95"])
        cpu = ratio(r["cpu_s"], first["cpu_s"])
        lines.append(
            f"ratio {r['students']}/{first['students']} students (×{scale:.1f}): "
            f"beat→update p95 ×{p95:.2f}, server CPU ×{cpu:.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m specfuse.bench room",
        description="Simulated phones join a class session through the app's /join page and vote; "
        "join, beat and vote latencies, votes lost, refusals, the server's memory and CPU.",
    )
    parser.add_argument(
        "--students", type=int, nargs="+", default=[10, 30, 60], help="class sizes (default 10 30 60)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds stepped per class (default 5)")
    parser.add_argument(
        "--within", type=float, default=2.0, help="a phone votes within this many seconds (default 2)"
    )
    parser.add_argument("--queue-size", type=int, default=16, help="the app's --queue-size (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="the votes' random seed (default 0)")
    parser.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help=f"seconds after a session ends before its memory is read again (default {SETTLE_S:g})",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if not args.students or min(args.students) < 1 or args.rounds < 1 or min(args.within, args.settle) < 0:
        parser.error("--students and --rounds must be at least 1, --within and --settle at least 0")
    server = Server(args.queue_size)
    try:
        with urllib.request.urlopen(server.address + "/config") as answer:  # the app's own, loopback
            page = page_of(json.loads(answer.read()))
        rows = [
            asyncio.run(run_class(server, page, n, args.rounds, args.within, args.seed + i, args.settle))
            for i, n in enumerate(args.students)
        ]
    finally:
        server.stop()
    print(report(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r["votes_lost"] == 0 and r["joined"] == r["students"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
