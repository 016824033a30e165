"""What a handout shows of a run: the trace cut down to the fields its panels need, as plain values.

The HTML page embeds this (as JSON) and the PNG draws from it, so both show the same numbers in the
same colours. Every string in it comes from the trace and is untrusted: `embed_json` makes it safe
inside a <script> element, the page's script inserts it as text. Stdlib only.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from ..prompts import last_user_text, prompt_text
from ..records import Round
from ..trace import Trace

FORMAT = 1  # the embedded document's own version, for anyone who reads it back out of a page

# One colour per member, in ensemble order (Plotly's default qualitative palette): the app's colours
# too (studio.views), so a handout's colours match what the audience saw in the app.
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880")
OTHER = "#9E9E9E"  # a segment no member drafted (a branch's typed one, "you")
# The matrix's colour scale (viridis, as the app's heatmap): (position 0..1, colour).
SCALE = (
    (0.0, "#440154"),
    (0.25, "#3B528B"),
    (0.5, "#21918C"),
    (0.75, "#5EC962"),
    (1.0, "#FDE725"),
)
DIGITS = 4  # decimals kept of every score, weight and probability: the page prints at most 3
TITLE_CHARS = 80  # a default title is the prompt's first line, cut to this


# Directional formatting characters (marks, embeddings, overrides, isolates): in trace text a
# right-to-left override makes "gnp.exe" read "exe.png". Wherever trace or model text is shown (the
# page, the PNG, the app) each is shown as what it is, "[U+202E]", so nothing can reorder what
# follows it; player.js holds the same class for the page.
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def shown_controls(text: str) -> str:
    """`text` with every directional formatting character written out as [U+XXXX]."""
    return BIDI_CONTROLS.sub(lambda m: f"[U+{ord(m.group()):04X}]", text)


def member_colors(members: tuple[str, ...] | list[str]) -> dict[str, str]:
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(members)}


def default_title(trace: Trace) -> str:
    """ "SpecFuse run: " and the first non-empty line of the prompt (of a conversation, its last user
    turn), cut to TITLE_CHARS characters."""
    line = next((s.strip() for s in last_user_text(trace.prompt).splitlines() if s.strip()), "")
    if len(line) > TITLE_CHARS:
        line = line[: TITLE_CHARS - 1].rstrip() + "…"
    return f"SpecFuse run: {line}" if line else "SpecFuse run"


def num(x: float) -> float | None:
    """A number for JSON: rounded to DIGITS decimals; None for a value JSON cannot hold."""
    return round(float(x), DIGITS) if math.isfinite(x) else None


def page_data(
    trace: Trace, title: str | None = None, room: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The run as the handout shows it: prompt, members and colours, and per round only what a panel
    draws (no raw scores, token evidence, timings or the repeated whole answer: a round's segment is
    its chosen candidate, the answer up to round k the first k segments). `room`: a class session's
    votes (room_votes), each round's beside its candidates."""
    rounds = trace.rounds
    if not rounds:
        raise ConfigError("the trace has no rounds: a handout needs at least one")
    votes = room_votes(trace, room or ())
    return {
        "format": FORMAT,
        "title": default_title(trace) if title is None else title,
        "prompt": prompt_text(trace.prompt),  # a conversation as its transcript
        "members": list(trace.members),
        "colors": member_colors(trace.members),
        "other": OTHER,
        "scale": [[at, color] for at, color in SCALE],
        # Normalized scores lie in 0..1 and share that scale; normalization "none" leaves raw values,
        # coloured by each round's own range.
        "fixed": trace.config.normalization != "none",
        "normalization": trace.config.normalization,
        "start": [num(w) for w in rounds[0].weights_before],
        "stop": rounds[-1].stop_reason,
        "rounds": [round_data(r, votes.get(r.k)) for r in rounds],
    }


def room_votes(trace: Trace, room: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """A class session's spread (studio.room_page.Desk.spread: per round revealed, {"k": k, "votes":
    {candidate text: votes}}, counts only, no student) as each round of `trace` shows it: per
    candidate its text's votes (a text drafted twice counts once, at its first candidate), how many
    voted and how many guessed the winner. A round whose texts are not the trace's (another run's
    spread) is left out; a malformed spread is a ConfigError."""
    by_k = {r.k: r for r in trace.rounds}
    out: dict[int, dict[str, Any]] = {}
    for entry in room:
        k = entry.get("k") if isinstance(entry, Mapping) else None
        given = entry.get("votes") if isinstance(entry, Mapping) else None
        if not isinstance(k, int) or not isinstance(given, Mapping):
            raise ConfigError("a room's spread is a list of {'k': round, 'votes': {text: count}}")
        if not all(isinstance(t, str) and type(n) is int and n >= 0 for t, n in given.items()):
            raise ConfigError(f"round {k}'s votes must be counts (whole numbers, 0 or more) per text")
        rnd = by_k.get(k)
        texts = [c.text for c in rnd.candidates] if rnd is not None else []
        if rnd is None or not set(given) <= set(texts):
            continue
        first = {text: texts.index(text) for text in set(texts)}
        out[k] = {
            "votes": [given.get(t, 0) if first[t] == j else None for j, t in enumerate(texts)],
            "made": sum(given.values()),
            "right": given.get(rnd.winner.text, 0),
        }
    return out


def round_data(r: Round, room: dict[str, Any] | None = None) -> dict[str, Any]:
    eligible = r.eligible or (True,) * len(r.candidates)  # () in hand-built records means all
    shown: dict[str, Any] = {"room": room} if room is not None else {}
    return shown | {
        "k": r.k,
        "chosen": r.chosen,
        "margin": num(r.margin),
        "verified": r.verified,
        "candidates": [
            {
                "member": c.member,
                "text": c.text,
                "tokens": c.num_tokens,
                "score": num(r.aggregate[j]),
                "eligible": eligible[j],
            }
            for j, c in enumerate(r.candidates)
        ],
        "verifiers": list(r.verifiers),
        "matrix": [[num(s) for s in row] for row in r.scores],
        "weights": [num(w) for w in r.weights_after],
        "exits": [
            {
                "member": e.member,
                "k": e.k,
                "keep": num(e.keep_probability),
                "threshold": num(e.threshold),
            }
            for e in r.exits
        ],
    }


# Inside <script> the HTML parser ends the element at the first "</script" whatever JSON thinks, and
# "<!--" changes how it reads on; JavaScript once took U+2028/U+2029 for line ends; a lone surrogate
# (valid in a JSON string from a trace) cannot be written as UTF-8. As \uXXXX escapes all of them are
# the same characters to JSON.parse and nothing to the HTML parser.
_UNSAFE = re.compile("[<>&\u2028\u2029\ud800-\udfff]")


def embed_json(data: Any) -> str:
    """`data` as JSON text that can stand inside <script type="application/json"> whatever its
    strings hold: none of < > & U+2028 U+2029 or a lone surrogate left unescaped. Other text stays
    as it is (UTF-8 in the file: Chinese takes 3 bytes a character, not the 6 of an escape)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return _UNSAFE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)
