"""trace_html: one run as ONE self-contained HTML file that plays offline, from file://, with no server.

The page is a template (page.html) with the stylesheet (player.css) and the player (player.js)
written into it, and the run's data (data.page_data) embedded as JSON in a
<script type="application/json"> element. It names no address and loads nothing: no external
script, style, font or image, and a Content-Security-Policy that forbids every load but inline code
and data: images, so nothing could load even if something slipped in. Text from the trace is
untrusted: escaped for the script element here (data.embed_json) and for HTML where this module
writes it (the title, the no-script fallback); the player inserts every string as text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from .. import __version__
from ..prompts import prompt_text
from ..trace import Trace
from .data import embed_json, page_data
from .i18n import ENGLISH, LANGS, catalogue
from .keys import HANDOUT, key_actions, key_rows

# Nothing may load: only the page's own inline script and style run, images only as data: URLs.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
PACKAGE = "specfuse.handout"  # where page.html, player.css and player.js are shipped
_FIELD = re.compile(r"\{\{(\w+)\}\}")


@cache
def asset(name: str) -> str:
    """A file shipped beside this module (page.html, player.css, player.js), as text."""
    return resources.files(PACKAGE).joinpath(name).read_text(encoding="utf-8")


def _text(value: str) -> str:
    """Trace text for HTML: escaped, and a lone surrogate (valid in a JSON string, not in UTF-8)
    replaced, so the page can always be written as UTF-8."""
    return html.escape(value.encode("utf-8", "replace").decode("utf-8"), quote=True)


def _noscript(trace: Trace) -> str:
    """Without JavaScript the page still gives the prompt and the final answer, as escaped text."""
    answer = trace.rounds[-1].text
    return (
        "<p>This page steps through the run with JavaScript, which is off. The prompt and the final "
        f"answer:</p><h2>Prompt</h2><pre>{_text(prompt_text(trace.prompt))}</pre>"
        f"<h2>Answer</h2><pre>{_text(answer)}</pre>"
    )


# The texts the player asks for: T("…") in player.js and data-t… attributes in page.html.
_ASKED = re.compile(r'\bT\(\s*"((?:[^"\\]|\\.)*)"|data-t(?:-title|-label)?="([^"]*)"')


def player_keys() -> set[str]:
    """Every English text the handout's page and player show through the catalogue."""
    found = {a or b for a, b in _ASKED.findall(asset("player.js") + asset("page.html"))}
    rows = {text for row in key_rows(HANDOUT) for text in row}
    return {k for k in found | rows if k} | {"SpecFuse run", "stop", "empty", "final", "budget", "rounds"}


def player_texts() -> dict[str, dict[str, str]]:
    """The player's texts in every language but English (the page switches offline)."""
    keys = player_keys()
    return {
        code: {k: v for k, v in catalogue(code).items() if k in keys} for code in LANGS if code != ENGLISH
    }


def trace_html(
    trace: Trace,
    *,
    title: str | None = None,
    lang: str = ENGLISH,
    room: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The run as one HTML page to take home: open it from disk in any browser, offline.

    It shows the prompt; the answer built up round by round, each segment in the colour of the
    member that won it (with a legend); Next / Back / Play / Pause with a pace of 1 to 10 s a round,
    and the keys of specfuse.handout.keys (→ or PageDown next, ← or PageUp back, Space play / pause,
    Home, End, b or . a black screen, ? the key map); the
    counter "round k of n"; the round's candidates (member, text, tokens, normalized score, the
    winner); the normalized verification matrix (verifiers × candidates, coloured, values printed);
    the weights over the rounds as a line chart with the round marked; and the exits so far (member,
    round, keep probability, threshold). `file.html#5` opens at round 5.

    `title` (default: "SpecFuse run: " and the prompt's first line) heads the page. Only what the
    panels need is kept (no raw scores, token evidence or timings): 60 rounds of 8 members with
    long segments stay well under 3 MB. Every string from the trace is shown as text. Raises
    ConfigError for a trace without rounds.

    `lang` (a code of specfuse.handout.i18n.LANGS) is the page's language when it opens; its switch
    shows it in the others, all embedded (the player's texts only).

    `room`: a class session's spread (data.room_votes: per round, votes per candidate text): each
    round's panel then shows the class's votes beside the models' scores, and how many guessed right.
    """
    catalogue(lang)  # an unknown language fails before any work
    data = page_data(trace, title, room)
    data["lang"], data["languages"], data["texts"] = lang, LANGS, player_texts()
    data["keys"], data["keyRows"] = key_actions(HANDOUT), key_rows(HANDOUT)  # the app's one key map
    parts = {
        "csp": CSP,
        "version": __version__,
        "title": _text(data["title"]),
        "css": asset("player.css"),
        "noscript": _noscript(trace),
        "data": embed_json(data),
        "js": asset("player.js"),
    }
    # One pass: text put in is never read again as a placeholder, whatever it holds.
    return _FIELD.sub(lambda m: parts[m[1]], asset("page.html"))
