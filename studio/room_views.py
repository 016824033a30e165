"""The class session's pages as values: the student's view of a beat, the teacher's room panel, the
join QR code, and every user-visible sentence of the feature (`SAY`, one place, for the catalogue
of translations).

Pure: reads studio.room's Session and returns HTML strings, in the language of the page asking
(studio.i18n's `_`: a phone's own, not the teacher's; the room's sentences and refusals are kept as
templates and said here). Every text that comes from a run (a candidate, a member's name) or from a
person goes through html.escape.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import segno

from .ballot import Choice, Said, Verdict
from .i18n import _
from .room import DRAFTS, ENDED, VERDICT, RoomError, Session, Student, shown_code
from .text_views import gate_reason

# Every sentence the class session shows (the teacher's panel and the student's page): here only.
SAY = {
    "start": "Start a class session (C)",
    "end": "End the class session",
    "show_votes": "Show the votes as they come in (V)",
    "join_title": "Join the class",
    "code_label": "The code on the teacher's screen",
    "join": "Join",
    "pick_label": "Which candidate will the models choose?",
    "joined": "You are in. Wait for the teacher's next round.",
    "waiting": "Wait for the teacher's next round.",
    "drafts": "Round {k}: which candidate will the models choose? Tap one (or press its number); "
    "you can change it until the reveal.",
    "picked": "Your pick: {letter}.",
    "no_pick": "No pick yet.",
    "won": "Round {k}: {letter} won (drafted by {members}).",
    "right": "✓ You were right.",
    "wrong": "✗ You picked {letter}.",
    "none": "You did not vote this round.",
    "score": "Your score: {right} of {made} right.",
    "no_score": "Your score: no votes counted yet.",
    "ended": "This class session has ended. Thank you!",
    "teacher_joined": "{n} joined",
    "hidden": "Votes hidden ({v} of {n} voted): V shows them.",
    "voted": "{v} of {n} voted",
    "no_ballot": "Votes open when a round's drafts are in.",
    "accuracy": "The class: {accuracy}.",
    "link_local": "This link works on this computer only: serve the app on the network (--host) and "
    "open this page by the computer's network address.",
    "join_at": "Join at",
    "question": "The question: {text}",
    "so_far": "The answer so far: {text}",
    "spread": "Round {k}: the class's votes beside the models' scores.",
    "heads": "choice|candidate|drafted by|the class|the models",
    "hide_votes": "Hide the votes (V)",
    "qr_alt": "QR code of the join link",
}
SO_FAR = 280  # characters of the answer so far on a phone (its end: what the candidates continue)

CLIP = 90  # characters of a candidate in the teacher's table (the phones show it whole)


def phrase(key: str, **fields: object) -> str:
    """SAY[key] in the page's language, its fields filled."""
    return _(SAY[key], **fields)


def said(sentence: Said, gate: object = None) -> str:
    """A sentence the room keeps as a template (a verdict, the class's accuracy), in the page's language."""
    template, fields = sentence
    filled = dict(fields)
    if gate is not None and "reason" in filled:
        filled["reason"] = gate_reason(gate)  # type: ignore[arg-type]
    return _(template, **filled)


def refusal(error: RoomError) -> str:
    """A refusal as the page's reader reads it (the exception's own text stays English)."""
    return said(error.said)


def verdict_line(verdict: Verdict) -> str:
    return said(verdict.said, verdict.gate)


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def clip(text: str, chars: int = CLIP) -> str:
    flat = text.replace("\r\n", "\n").replace("\n", "⏎")
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def text_cell(text: str) -> str:
    """A candidate in the teacher's table: one line, cut by the style sheet (whole in its title)."""
    return f"<span class='sf-room-text' title='{esc(text)}'>{esc(clip(text))}</span>"


def qr_data_uri(link: str) -> str:
    """The join link's QR code as an SVG data URI (segno; drawn dark on light with a quiet zone)."""
    return str(segno.make_qr(link, error="m").svg_data_uri(scale=8, border=2))


def pick_choices(choices: Sequence[Choice]) -> list[tuple[str, str]]:
    """The student's radio: each choice by its letter and whole text (no member: text only)."""
    return [(f"{c.letter}. {c.text.strip() or _('(empty)')}", c.letter) for c in choices]


def score_line(student: Student) -> str:
    if not student.made:
        return phrase("no_score")
    return phrase("score", right=student.right, made=student.made)


def won_line(verdict: Verdict) -> str:
    winner = next(c for c in verdict.choices if c.letter == verdict.winner)
    return phrase("won", k=verdict.k, letter=verdict.winner, members=", ".join(winner.members))


def student_html(session: Session, student: Student | None, pick: str | None = None) -> str:
    """The student's page for the beat the room is at: what to do, their result, their score.
    Before a reveal it holds nothing of the verdict (the session's beat keeps it only once revealed)."""
    phase = session.phase
    lines: list[tuple[str, str]] = []  # (class, text)
    if phase == ENDED:
        lines.append(("sf-room-big", phrase("ended")))
    elif phase == DRAFTS:
        ballot = session.beat.ballot
        assert ballot is not None
        lines.append(("sf-room-big", phrase("drafts", k=ballot.k)))
        if ballot.prompt:
            lines.append(("sf-room-context", phrase("question", text=clip(ballot.prompt, SO_FAR))))
        if ballot.answer:
            tail = ballot.answer if len(ballot.answer) <= SO_FAR else "…" + ballot.answer[-SO_FAR:]
            lines.append(("sf-room-context", phrase("so_far", text=tail)))
        lines.append(("sf-room-pick", phrase("picked", letter=pick) if pick else phrase("no_pick")))
    elif phase == VERDICT:
        verdict = session.beat.verdict
        assert verdict is not None
        lines.append(("sf-room-big", won_line(verdict)))
        last = student.last if student is not None else None
        if last is not None and last[0] == verdict.key:
            which = "none" if last[2] is None else "right" if last[2] else "wrong"
            lines.append(("sf-room-result", phrase(which, letter=last[1])))
        else:
            lines.append(("sf-room-result", phrase("none")))
        lines.append(("", verdict_line(verdict)))
        lines.append(("", phrase("waiting") if not verdict.last else ""))
    else:
        lines.append(("sf-room-big", phrase("joined")))
    if student is not None:
        lines.append(("sf-room-score", score_line(student)))
    body = "".join(f"<p class='{cls}'>{esc(text)}</p>" for cls, text in lines if text)
    return f"<div id='room-student-view' data-phase='{phase}'>{body}</div>"


def bar(count: int, total: int) -> str:
    share = 0 if not total else round(100 * count / total)
    return (
        f"<span class='sf-room-track'><span class='sf-room-bar' style='width:{share}%'></span></span>"
        f" <span class='sf-room-count'>{count} ({share} %)</span>"
    )


def join_html(session: Session, link: str, big: bool) -> str:
    """The join block: the QR code (large before the first round, small after), the code, the link."""
    local = any(h in link for h in ("//127.", "//localhost", "//[::1]", "//0.0.0.0"))
    warn = f"<p class='sf-room-warn'>{esc(phrase('link_local'))}</p>" if local else ""
    size = "sf-room-qr-big" if big else "sf-room-qr-small"
    return (
        f"<div class='sf-room-join'><img class='{size}' src='{esc(qr_data_uri(link))}' "
        f"alt='{esc(phrase('qr_alt'))}'><div><p class='sf-room-code' id='room-code'>"
        f"{esc(shown_code(session.code))}</p><p>{esc(phrase('join_at'))} "
        f"<a id='room-link' href='{esc(link)}' target='_blank' rel='noopener'>{esc(link)}</a></p>"
        f"{warn}</div></div>"
    )


def teacher_html(session: Session, link: str, show_votes: bool) -> str:
    """The teacher's room panel: on the left the join block and how many joined; on the right the
    votes (or how many, hidden), at a reveal the class's spread beside the models' scores, and the
    class's accuracy."""
    n = len(session.students)
    beat = session.beat
    left = join_html(session, link, big=beat.ballot is None and beat.verdict is None)
    left += f"<p class='sf-room-joined' id='room-joined'>{esc(phrase('teacher_joined', n=n))}</p>"
    if beat.ballot is not None:
        voted = sum(session.counts.values())
        if show_votes:
            rows = "".join(
                f"<tr><th scope='row'>{esc(c.letter)}</th><td>{text_cell(c.text)}</td>"
                f"<td class='sf-room-votes'>{bar(session.counts.get(c.letter, 0), voted)}</td></tr>"
                for c in beat.ballot.choices
            )
            right = (
                f"<table id='room-tally'><caption>{esc(phrase('voted', v=voted, n=n))}</caption>"
                f"<tbody>{rows}</tbody></table>"
            )
        else:
            right = f"<p id='room-tally'>{esc(phrase('hidden', v=voted, n=n))}</p>"
    elif beat.verdict is not None:
        right = spread_html(session, beat.verdict)
    else:
        right = f"<p id='room-tally'>{esc(phrase('no_ballot'))}</p>"
    right += f"<p id='room-accuracy'>{esc(phrase('accuracy', accuracy=said(session.accuracy_said)))}</p>"
    return (
        f"<div id='room-teacher-view'><div class='sf-room-left'>{left}</div>"
        f"<div class='sf-room-right'>{right}</div></div>"
    )


def spread_html(session: Session, verdict: Verdict) -> str:
    """At a reveal: per choice, the class's votes beside the models' aggregate score; the winner ✓."""
    spread = next((s for s in reversed(session.spreads) if s.key == verdict.key), None)
    counts = spread.counts if spread is not None else tuple(0 for _ in verdict.choices)
    total = sum(counts)
    rows = []
    for c, count, score in zip(verdict.choices, counts, verdict.scores):
        mark = "✓" if c.letter == verdict.winner else ""
        model = "—" if score is None else f"{score:.2f}"
        rows.append(
            f"<tr><th scope='row'>{esc(c.letter)} {mark}</th><td>{text_cell(c.text)}</td>"
            f"<td>{esc(', '.join(c.members))}</td><td class='sf-room-votes'>{bar(count, total)}</td>"
            f"<td>{esc(model)}</td></tr>"
        )
    head = "<tr>" + "".join(f"<th scope='col'>{esc(h)}</th>" for h in phrase("heads").split("|")) + "</tr>"
    caption = f"{phrase('spread', k=verdict.k)} {verdict_line(verdict)}"
    return (
        f"<table id='room-tally' class='sf-room-spread'><caption>{esc(caption)}</caption>"
        f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
    )
