"""A class session ("the room votes"): students join the teacher's stepping run on their phones by a
short code, vote for the candidate they think will win each round, and learn at the reveal whether
they were right; the teacher sees how many joined, the votes as they come in, the class's spread
beside the models' scores and the class's accuracy.

Pure and typed: no Gradio, no model, no clock of its own (each call takes `now`, the tests pass
their own). studio.room_page turns a teacher's StepRun into `Beat`s (studio.ballot: what a beat shows)
and these calls into pages.

What the server keeps, and for how long (docs/app.md's privacy statement): per session, the code,
the teacher's page session, and per student only a random id this server signed (no name, no
address), their vote in the round open and their running score; per round, the counts per
candidate. All of it is dropped when the session ends: the teacher ends it, closes the page, or no
one acts on it for `IDLE_S` (`EMPTY_IDLE_S` while no student has joined); only the counts of the run
on screen stay for the teacher's handout after End, until that page closes (room_page.Desk.spread).

Bounds: `MAX_STUDENTS` per session, `MAX_ROOMS` at once, `MAX_PHONES` in all, one vote per student
per round (a later vote replaces it; `VOTES_PER_S` a second at most), a vote only for a candidate on
the table and only before its reveal, and join codes of `CODE_LEN` characters from 32 (about 10⁹
codes) with wrong codes limited per client and in all (`FAILS_PER_CLIENT`, `FAILS_IN_ALL` per
`FAIL_WINDOW_S`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections import deque
from dataclasses import dataclass, field

from .ballot import Beat, Said, Verdict, english

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # 32 symbols: no 0/O, 1/I to misread on a projector
CODE_LEN = 6
MAX_STUDENTS = 200
MAX_ROOMS = 20
MAX_PHONES = 400  # students in all the server's sessions at once: each phone's page holds one of
# Gradio's worker slots while it follows its room (studio.room_page.serve_room gives that many more)
IDLE_S = 30 * 60.0  # no beat, join or vote for this long: the session ends
EMPTY_IDLE_S = 5 * 60.0  # … or this long with no student joined (a session opened and left holds no place)
FAIL_WINDOW_S = 60.0
FAILS_PER_CLIENT = 20  # wrong codes from one client (address) per window; then even a right one is
# refused (else a right code would still show through); 20: a class behind one school address types some wrong
FAILS_IN_ALL = 300  # wrong codes from everyone per window (many clients guessing together)
VOTES_PER_S = 5  # per student: more in one second are refused (the vote kept is the last accepted)
MAX_CHOICE_CHARS = 8  # a vote names a letter: anything longer is refused before it is looked at
MAX_TOKEN_CHARS = 120
MAX_CLIENTS_KEPT = 10_000  # clients whose failures are remembered (the oldest are forgotten)

WAITING, DRAFTS, VERDICT, ENDED = "waiting", "drafts", "verdict", "ended"

# Every refusal a person reads (the phones' note, the teacher's error): here only, for translation.
# Each is a catalogue key; its fields (LIMITS) are filled where it is said (studio.room_views.refusal).
REFUSED = {
    "ended": "This class session has ended.",
    "closed": "Voting on that round is closed: it has been revealed (or has not begun).",
    "no_such": "There is no such candidate in this round.",
    "too_fast": "Too many votes in one second (at most {n}): your last one counts.",
    "no_id": "This page has no id from this server: open the join link again.",
    "forged": "This page's id was not given by this server: open the join link again.",
    "busy": "This server already holds {n} class sessions: try again later.",
    "guessing": "Too many wrong codes: wait a minute (at most {n} a minute).",
    "no_code": "No class session has that code: check it on the teacher's screen.",
    "full": "This class session is full ({n} students).",
    "phones": "This server follows {n} phones at most, in all its class sessions: try again later.",
    "not_joined": "You have not joined this class session: open the join link again.",
}
LIMITS = {
    "too_fast": VOTES_PER_S,
    "busy": MAX_ROOMS,
    "guessing": FAILS_PER_CLIENT,
    "full": MAX_STUDENTS,
    "phones": MAX_PHONES,
}


class RoomError(ValueError):
    """A refusal (a REFUSED key): its message in English (logs, the API), its key for the page."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.said: Said = (REFUSED[key], (("n", LIMITS[key]),) if key in LIMITS else ())
        super().__init__(english(self.said))


# ---- the session ----------------------------------------------------------------------------------


@dataclass
class Student:
    id: str
    right: int = 0
    made: int = 0
    last: tuple[str, str | None, bool | None] | None = None  # (round key, their pick, right?)
    stamps: deque[float] = field(default_factory=deque)  # their accepted votes' times (the rate)


@dataclass(frozen=True)
class Spread:
    """One revealed round's class answer: votes per choice, and how many were right."""

    key: str
    k: int
    counts: tuple[int, ...]  # per choice of the verdict
    right: int
    made: int
    texts: tuple[str, ...] = ()  # per choice, its text (the handout matches them to its rounds)


@dataclass
class Session:
    code: str
    teacher: str  # the teacher's page session (only that page steps, sees the votes, ends it)
    started: float
    touched: float
    students: dict[str, Student] = field(default_factory=dict)
    beat: Beat = field(default_factory=Beat)
    votes: dict[str, str] = field(default_factory=dict)  # student id → letter, in the open round
    counts: dict[str, int] = field(default_factory=dict)  # letter → votes, in the open round
    spreads: deque[Spread] = field(default_factory=lambda: deque(maxlen=1000))
    right: int = 0  # the class's right votes over the session
    made: int = 0
    version: int = 0  # counts the beats: a student's page updates when it moves
    ended: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def phase(self) -> str:
        if self.ended:
            return ENDED
        if self.beat.ballot is not None:
            return DRAFTS
        return VERDICT if self.beat.verdict is not None else WAITING

    def wake(self) -> None:
        """The students' pages waiting on a beat go on (one set per beat, not per vote)."""
        self.version += 1
        self.changed.set()
        self.changed = asyncio.Event()

    def follow(self, beat: Beat, now: float) -> bool:
        """The teacher's run moved to `beat`: score the open round if `beat` reveals it, open the next
        ballot. True when the room's pages must change. Idempotent: the same beat again does nothing."""
        if beat == self.beat:
            return False
        was = self.beat.ballot
        if was is not None and beat.verdict is not None and beat.verdict.key == was.key:
            self.score(beat.verdict)
        if beat.ballot is None or was is None or beat.ballot.key != was.key:
            self.votes, self.counts = {}, {}
        self.beat, self.touched = beat, now
        self.wake()
        return True

    def score(self, verdict: Verdict) -> None:
        """Each vote of the round revealed: right or not, into the student's and the class's score."""
        letters = [c.letter for c in verdict.choices]
        counts = tuple(self.counts.get(letter, 0) for letter in letters)
        right = self.counts.get(verdict.winner, 0)
        for sid, student in self.students.items():
            pick = self.votes.get(sid)
            won = None if pick is None else pick == verdict.winner
            student.last = (verdict.key, pick, won)
            if won is not None:
                student.right, student.made = student.right + int(won), student.made + 1
        made = sum(counts)
        texts = tuple(c.text for c in verdict.choices)
        self.spreads.append(Spread(verdict.key, verdict.k, counts, right, made, texts))
        self.right, self.made = self.right + right, self.made + made

    def vote(self, student: Student, key: str, letter: str, now: float) -> None:
        """The student's pick for the ballot `key` (their earlier pick in it is replaced)."""
        ballot = self.beat.ballot
        if self.ended:
            raise RoomError("ended")
        if ballot is None or ballot.key != key:
            raise RoomError("closed")
        if not isinstance(letter, str) or letter not in {c.letter for c in ballot.choices}:
            raise RoomError("no_such")
        while student.stamps and now - student.stamps[0] >= 1.0:
            student.stamps.popleft()
        if len(student.stamps) >= VOTES_PER_S:
            raise RoomError("too_fast")
        student.stamps.append(now)
        before = self.votes.get(student.id)
        if before is not None:
            self.counts[before] -= 1
        self.votes[student.id] = letter
        self.counts[letter] = self.counts.get(letter, 0) + 1
        self.touched = now

    def end(self) -> None:
        """Free what it holds; the pages waiting on it hear that it ended."""
        self.ended = True
        self.students.clear()
        self.votes.clear()
        self.counts.clear()
        self.wake()

    @property
    def accuracy_said(self) -> Said:
        """The class's right votes over the session, as the teacher's view says it."""
        if not self.made:
            return "no votes revealed yet", ()
        share = round(100 * self.right / self.made)
        return "{right} of {made} votes right ({share} %)", (
            ("right", self.right),
            ("made", self.made),
            ("share", share),
        )

    @property
    def accuracy(self) -> str:
        return english(self.accuracy_said)


# ---- every session of the server --------------------------------------------------------------------


def normal_code(typed: str) -> str:
    """A code as typed (any case, spaces or dashes): its symbols only, upper case."""
    if not isinstance(typed, str):
        return ""
    return "".join(ch for ch in typed.upper()[:40] if ch.isalnum())


def shown_code(code: str) -> str:
    """The code as the projector shows it: two groups of three."""
    return f"{code[:3]}-{code[3:]}" if len(code) == CODE_LEN else code


class Rooms:
    """The server's class sessions: by code and by teacher, the students' signed ids, the failed joins."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret or secrets.token_bytes(32)  # per process: ids die with the server
        self.by_code: dict[str, Session] = {}
        self.by_teacher: dict[str, Session] = {}
        self.fails: dict[str, deque[float]] = {}
        self.all_fails: deque[float] = deque()

    # -- ids --
    def new_token(self) -> str:
        sid = secrets.token_urlsafe(12)
        return f"{sid}.{self.mac(sid)}"

    def mac(self, sid: str) -> str:
        return hmac.new(self.secret, sid.encode(), hashlib.sha256).hexdigest()[:32]

    def student_id(self, token: object) -> str:
        """The id a token names, if this server signed it; else RoomError."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
            raise RoomError("no_id")
        sid, mac = token.split(".")
        if not sid or not hmac.compare_digest(mac, self.mac(sid)):
            raise RoomError("forged")
        return sid

    # -- sessions --
    def open(self, teacher: str, now: float) -> Session:
        """The teacher's session (a new one, or the one already open for that page)."""
        self.sweep(now)
        if teacher in self.by_teacher:
            return self.by_teacher[teacher]
        if len(self.by_code) >= MAX_ROOMS:
            raise RoomError("busy")
        code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
        while code in self.by_code:
            code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
        session = Session(code, teacher, now, now)
        self.by_code[code] = self.by_teacher[teacher] = session
        return session

    def close(self, teacher: str) -> Session | None:
        session = self.by_teacher.pop(teacher, None)
        if session is not None:
            self.by_code.pop(session.code, None)
            session.end()
        return session

    def of_teacher(self, teacher: str, now: float) -> Session | None:
        self.sweep(now)
        return self.by_teacher.get(teacher)

    def sweep(self, now: float) -> list[Session]:
        """End the sessions idle for IDLE_S (their state freed)."""
        idle = [
            s for s in self.by_code.values() if now - s.touched >= (IDLE_S if s.students else EMPTY_IDLE_S)
        ]
        for s in idle:
            self.close(s.teacher)
        return idle

    # -- students --
    def refused(self, client: str, now: float) -> bool:
        """Whether `client` (or everyone) has had too many wrong codes in the window."""
        for stamps in (self.fails.get(client), self.all_fails):
            while stamps and now - stamps[0] >= FAIL_WINDOW_S:
                stamps.popleft()
        mine = self.fails.get(client)
        return (mine is not None and len(mine) >= FAILS_PER_CLIENT) or len(self.all_fails) >= FAILS_IN_ALL

    def failed(self, client: str, now: float) -> None:
        if client not in self.fails and len(self.fails) >= MAX_CLIENTS_KEPT:
            self.fails.pop(next(iter(self.fails)))
        self.fails.setdefault(client, deque()).append(now)
        self.all_fails.append(now)

    def join(self, typed: str, token: object, client: str, now: float) -> tuple[Session, str]:
        """A student joins (or rejoins, keeping their score) the session of the code typed: the
        session and their token (a new one when they brought none this server signed)."""
        if self.refused(client, now):
            raise RoomError("guessing")
        self.sweep(now)
        code = normal_code(typed)
        session = self.by_code.get(code)
        if session is None:
            self.failed(client, now)
            raise RoomError("no_code")
        try:
            sid = self.student_id(token)
        except RoomError:
            token = self.new_token()
            sid = self.student_id(token)
        if sid not in session.students:
            if len(session.students) >= MAX_STUDENTS:
                raise RoomError("full")
            if sum(len(s.students) for s in self.by_code.values()) >= MAX_PHONES:
                raise RoomError("phones")
            session.students[sid] = Student(sid)
        session.touched = now
        assert isinstance(token, str)
        return session, token

    def student(self, code: str, token: object) -> tuple[Session, Student]:
        """The session and the student a page names (refused: an ended session, a forged id, a
        student who never joined it)."""
        session = self.by_code.get(normal_code(code))
        if session is None or session.ended:
            raise RoomError("ended")
        sid = self.student_id(token)
        student = session.students.get(sid)
        if student is None:
            raise RoomError("not_joined")
        return session, student

    def vote(self, code: str, token: object, key: object, letter: object, now: float) -> Student:
        if not isinstance(letter, str) or len(letter) > MAX_CHOICE_CHARS or not isinstance(key, str):
            raise RoomError("no_such")
        session, student = self.student(code, token)
        session.vote(student, key[:40], letter, now)
        return student
