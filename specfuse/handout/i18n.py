"""The UI's languages: ONE catalogue, English text → its translation, read by the app (studio.i18n),
the offline handout (embedded as JSON in the page, read by player.js) and the lessons' texts.

The English text is the key: code says what it shows in English and asks `t(text, lang)` for it in
the session's language. A key may hold `{name}` fields, filled after the lookup, so a translation can
put them in its own order. A language's table is `<lang>.json` beside this module (English needs
none); tests/studio/test_i18n.py checks that every key the UI shows is in every table and that each
translation keeps its key's fields. Stdlib only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from importlib import resources

ENGLISH = "en"
LANGS: dict[str, str] = {"en": "English", "zh": "中文"}  # code → its own name (the switch's choices)
PACKAGE = "specfuse.handout"
_FIELD = re.compile(r"\{(\w+)\}")


@cache
def catalogue(lang: str) -> dict[str, str]:
    """English text → the text in `lang` (empty for English). An unknown language is an error."""
    if lang not in LANGS:
        raise ValueError(f"unknown UI language {lang!r}: choose one of {', '.join(LANGS)}")
    if lang == ENGLISH:
        return {}
    text = resources.files(PACKAGE).joinpath(f"{lang}.json").read_text(encoding="utf-8")
    table = json.loads(text)
    if not isinstance(table, dict):
        raise ValueError(f"{lang}.json must hold one object: English text → translation")
    return table


def t(text: str, lang: str = ENGLISH, /, **fields: object) -> str:
    """`text` in `lang` (itself where the table lacks it: English, never an error), its `{name}`
    fields filled with `fields`. A field's value is put in as it is: escape it first where the text
    becomes HTML."""
    out = catalogue(lang).get(text, text) if lang != ENGLISH else text
    if fields:
        out = _FIELD.sub(lambda m: str(fields[m[1]]) if m[1] in fields else m[0], out)
    return out


def fields(text: str) -> set[str]:
    """The `{name}` fields a text holds (a translation must hold the same)."""
    return set(_FIELD.findall(text))


def pick(preferences: Iterable[str]) -> str:
    """The first supported language in an ordered list of language tags ("zh-CN", "en-GB", "fr"),
    by primary subtag; English when none is supported."""
    for tag in preferences:
        primary = tag.strip().split("-")[0].split("_")[0].lower()
        if primary in LANGS:
            return primary
    return ENGLISH


def accepted(header: str) -> list[str]:
    """An Accept-Language header's tags, most wanted first ("zh-CN,zh;q=0.9,en;q=0.8")."""
    ranked: list[tuple[float, int, str]] = []
    for i, part in enumerate(header.split(",")):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        if tag:
            ranked.append((-q, i, tag))
    return [tag for _, _, tag in sorted(ranked)]
