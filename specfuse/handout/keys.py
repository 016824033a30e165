"""The key map: ONE table of what each key does, read by the app's page (studio.keys turns it into
the page's key script and its "?" overlay), by the offline handout (embedded in its data, read by
player.js) and printed in docs/app.md (a test checks the docs hold it).

A presenter's clicker sends PageDown / PageUp (some also "b" or "." for a black screen), so every
beat is on those too. Keys are KeyboardEvent.key values. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

APP, HANDOUT = "app", "handout"


@dataclass(frozen=True)
class Key:
    keys: tuple[str, ...]  # KeyboardEvent.key values
    action: str  # what the page does (the scripts' name for it)
    does: str  # the key map's line
    where: tuple[str, ...] = (APP, HANDOUT)


DIGITS = tuple(str(d) for d in range(1, 10))

KEYS: tuple[Key, ...] = (
    Key(("ArrowRight", "PageDown"), "next", "Next beat: a round's drafts, then Reveal (a clicker's forward)"),
    Key(("ArrowLeft", "PageUp"), "back", "Back one round (a clicker's back)"),
    Key((" ",), "play", "Play / Pause (only when no button, box or field has the focus)"),
    Key(("Home",), "home", "Round 1"),
    Key(("End",), "end", "The latest round"),
    Key(
        DIGITS, "guess", "While the room guesses: pick guess 1–9 (the arrows move within the guesses)", (APP,)
    ),
    Key(("b", "."), "black", "Black screen; any key brings the page back"),
    Key(("?",), "help", "Show or hide this key map (Esc hides it)"),
    Key(("p", "P"), "presenter", "Presenter view on / off (Esc leaves it)", (APP,)),
    Key(DIGITS[:4], "panel", "In the presenter view, when no guess is open: panel 1–4", (APP,)),
    Key(("c", "C"), "room", "Start a class session: students vote on their phones by its code", (APP,)),
    Key(("v", "V"), "votes", "In a class session: show / hide the room's votes as they come in", (APP,)),
)

NAMES = {"ArrowRight": "→", "ArrowLeft": "←", " ": "Space", "PageDown": "PageDown", "PageUp": "PageUp"}


def shown(key: Key) -> str:
    """The keys as the map prints them ("→ / PageDown", "1–9")."""
    if key.keys[0] == "1" and len(key.keys) > 2:
        return f"1–{key.keys[-1]}"
    return " / ".join(NAMES.get(k, k) for k in key.keys)


def key_actions(where: str) -> dict[str, str]:
    """key → action for one page (the first row naming a key wins: "guess" before "panel")."""
    out: dict[str, str] = {}
    for row in KEYS:
        if where in row.where:
            for k in row.keys:
                out.setdefault(k, row.action)
    return out


def key_rows(where: str) -> list[tuple[str, str]]:
    """(keys, what they do) for one page, in the table's order."""
    return [(shown(row), row.does) for row in KEYS if where in row.where]


def markdown() -> str:
    """The whole table as Markdown, as docs/app.md prints it."""
    lines = ["| keys | what they do | app | handout |", "|---|---|---|---|"]
    for row in KEYS:
        marks = ["✓" if w in row.where else "" for w in (APP, HANDOUT)]
        lines.append(f"| {shown(row)} | {row.does} | {marks[0]} | {marks[1]} |")
    return "\n".join(lines)
