"""Links that open a lesson at a round, for a teacher's slide: `/?lesson=NAME&round=K`.

The page's address is untrusted text: only a known lesson slug opens anything, only a whole number
picks a round (out of range: the nearest round), and whatever else the link holds is ignored with a
note on the status line, escaped there (studio.views.status_markdown), never an error page. The
lesson opens as its gallery card does (studio.gallery, on the page's load). The offline handout
reads the same round from its URL fragment (`#round=K`, specfuse/handout/player.js). Pure: no Gradio.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

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


def parse_link(query: Mapping[str, str], slugs: Collection[str]) -> Link:
    """`lesson` and `round` of the page's query; any other parameter is not ours and left alone."""
    slug, asked = query.get("lesson"), query.get("round")
    if slug is None:
        note = "The link's round needs a lesson (?lesson=NAME&round=K)." if asked is not None else ""
        return Link(note=note)
    slug = slug.strip()
    if slug not in slugs:
        known = ", ".join(sorted(slugs)) or "none here"
        return Link(note=f"The link's lesson {quoted(slug)} is not one of these lessons ({known}).")
    if asked is None or not asked.strip():
        return Link(slug)
    if not WHOLE.fullmatch(asked.strip()):
        return Link(
            slug, note=f"The link's round {quoted(asked)} is not a whole number: the key round is shown."
        )
    return Link(slug, int(asked.strip()))


def bounded(k: int, n: int) -> tuple[int, str]:
    """Round k of a run of n rounds: the nearest round there is, and a note when k was not one."""
    if 1 <= k <= n:
        return k, ""
    near = min(max(k, 1), n)
    return near, f"The link's round {k} is not one of the lesson's {n} rounds: round {near} is shown."
