"""The page in the session's language: which language a request asks for, `_()` for text a handler
builds, and the page's fixed text (labels, buttons, notes) put in that language when it loads.

The catalogue is ONE table, English text → translation (specfuse.handout.i18n; the offline handout
reads the same). A session's language: the page's `?lang=` (the visible switch sets it and reloads),
else the browser's Accept-Language (zh* → Chinese), else English. Every event's request carries both,
so a handler (and every view function it calls) asks `current()` rather than being passed a
language; tests and exports choose one with `speaking(lang)`.

Gradio builds the page once for everyone, so its fixed text is English in the layout; on load
`Localizer` walks the page's components and sends each one its text in the session's language
(label, info, placeholder, a button's or a note's text, choices, table headers), plus whatever a
component registered with `localize` computes (a key map, a gallery). The same walk is what
tests/studio/test_i18n.py checks: every English text it finds must be in the catalogue.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from functools import cache
from typing import Any

import gradio as gr

from specfuse.handout.i18n import ENGLISH, LANGS, accepted, catalogue, pick, t

_FORCED: ContextVar[str | None] = ContextVar("studio_lang", default=None)
SWITCH_ID = "sf-lang"
TEXT_PROPS = ("label", "info", "placeholder")  # every component's plain-text properties
VALUE_TEXT = (gr.Button, gr.Markdown, gr.HTML)  # components whose value is their visible text


def lang_of(request: Any) -> str:
    """A request's language: its page's `?lang=` if supported, else its Accept-Language."""
    if request is None:
        return ENGLISH
    try:
        asked = request.query_params.get("lang")
        header = request.headers.get("accept-language", "")
    except AttributeError:  # a request Gradio made up (an API call without HTTP)
        return ENGLISH
    if asked in LANGS:
        return str(asked)
    return pick(accepted(header or ""))


def current() -> str:
    """The language of the text being built: `speaking`'s, else the running event's request's."""
    forced = _FORCED.get()
    if forced is not None:
        return forced
    from gradio.context import LocalContext  # the event's request, set around every handler call

    return lang_of(LocalContext.request.get(None))


def _(text: str, /, **fields: object) -> str:
    """`text` in the current language, its `{name}` fields filled (escape them first for HTML)."""
    return t(text, current(), **fields)


@contextlib.contextmanager
def speaking(lang: str) -> Iterator[None]:
    """Build text in `lang` (tests; a handout exported in a chosen language)."""
    catalogue(lang)  # an unknown language fails here
    token = _FORCED.set(lang)
    try:
        yield
    finally:
        _FORCED.reset(token)


def plain(value: str) -> str:
    """A note's text without its HTML tags and Markdown marks, for the catalogue test's eyes."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", value, flags=re.S | re.I)
    text = re.sub(r"<[^>]+>", " ", text)
    return html.unescape(re.sub(r"[*`#>|]", " ", text))


def texts(component: Any) -> dict[str, Any]:
    """The fixed text a component shows, by property: label, info, placeholder, its value where the
    value is the text (a button, a note), its choices' labels, a table's headers."""
    out: dict[str, Any] = {}
    for prop in TEXT_PROPS:
        value = getattr(component, prop, None)
        if isinstance(value, str) and value.strip():
            out[prop] = value
    if isinstance(component, VALUE_TEXT) and isinstance(component.value, str) and component.value.strip():
        out["value"] = component.value
    choices = getattr(component, "choices", None)
    if isinstance(choices, list) and choices and all(isinstance(c, tuple) for c in choices):
        out["choices"] = choices
    headers = getattr(component, "headers", None)
    if isinstance(component, gr.Dataframe) and isinstance(headers, list):
        out["headers"] = headers
    return out


def translated(found: dict[str, Any], lang: str) -> dict[str, Any]:
    """The properties of `texts` whose text the catalogue holds, in `lang`."""
    table = catalogue(lang)
    out: dict[str, Any] = {}
    for prop, value in found.items():
        if prop == "choices":
            if any(str(label) in table for label, _v in value):
                out[prop] = [(table.get(str(label), str(label)), v) for label, v in value]
        elif prop == "headers":
            if any(str(h) in table for h in value):
                out[prop] = [table.get(str(h), str(h)) for h in value]
        elif value in table:
            out[prop] = table[value]
    return out


class Localizer:
    """The page's fixed text in the session's language, sent once when the page loads."""

    def __init__(self) -> None:
        self.made: dict[Any, Callable[[], dict[str, Any]]] = {}

    def localize(self, component: Any, make: Callable[[], dict[str, Any]]) -> Any:
        """`component`'s text is computed, not fixed: `make()` gives its properties in `current()`."""
        self.made[component] = make
        return component

    def components(self, demo: gr.Blocks) -> list[Any]:
        """Every component of the page whose text may be translated."""
        return [c for c in demo.blocks.values() if c in self.made or texts(c)]

    def updates(self, demo: gr.Blocks, skip: set[Any], lang: str) -> dict[Any, Any]:
        """{component: update} putting the page's text in `lang` (nothing for English)."""
        if lang == ENGLISH:
            return {}
        out: dict[Any, Any] = {}
        with speaking(lang):
            for component in self.components(demo):
                props = translated(texts(component), lang)
                if component in skip and not isinstance(component, gr.Button):  # another load sets it
                    props.pop("value", None)
                if component in self.made:
                    props.update(self.made[component]())
                if props:
                    out[component] = gr.update(**props)
        return out


LOCALIZER = Localizer()  # the one page's; the page is built once per process
localize = LOCALIZER.localize


def language_switch() -> gr.Radio:
    """The visible switch (English / 中文): choosing reloads the page with `?lang=`."""
    return gr.Radio(
        [(name, code) for code, name in LANGS.items()],
        value=ENGLISH,
        label=" / ".join(LANGS.values()),  # its accessible name, in both languages
        show_label=False,
        container=False,
        elem_id=SWITCH_ID,  # not kept in the presenter view: a 720 px projector has no line to spare
    )


# Keeps the page's other parameters (a lesson's link); the load then speaks the chosen language.
SWITCH_JS = """(code) => {
  const url = new URL(window.location.href);
  url.searchParams.set("lang", code);
  window.location.assign(url.toString());
  return code;
}"""


# The page's own `lang` (the browser's hyphenation, a screen reader's voice, and app.css: Gradio's
# status tracker writes "processing |" and "queue: 1/2 |" in English whatever the locale, so a page
# in Chinese hides that line and leaves the saying to the status line).
# Also marks the page's language load done (data-sf-loaded): its texts, sent for the session's language,
# will not overwrite what a click shows next (the browser tests wait for it before their first click).
PAGE_LANG_JS = """(code) => {
  document.documentElement.lang = code === "zh" ? "zh-CN" : code;
  document.documentElement.dataset.sfLoaded = "1";
  return [];
}"""


def wire_language(demo: gr.Blocks, switch: gr.Radio) -> None:
    """On load: the switch shows the session's language and the page's text is in it. Call last,
    once every component and listener is in the page."""
    loaded = {
        out
        for fn in demo.fns.values()
        if any(event == "load" for _id, event in fn.targets)
        for out in fn.outputs
    }
    targets = [c for c in LOCALIZER.components(demo) if c is not switch]
    wired = set(targets)  # a page routed after this call (the class session's /join) is not this load's

    def load(request: gr.Request) -> dict[Any, Any]:
        lang = lang_of(request)
        update = {c: u for c, u in LOCALIZER.updates(demo, loaded, lang).items() if c in wired}
        update[switch] = gr.update(value=lang)
        return update

    mark_language(demo.load(load, None, [*targets, switch], queue=False, show_progress="hidden"), switch)
    switch.input(None, [switch], None, js=SWITCH_JS)


def mark_language(loaded: Any, holder: Any) -> None:
    """Once `loaded` (a page's load) has put the session's language code in `holder`, the page's
    <html lang> says it."""
    loaded.then(None, [holder], None, js=PAGE_LANG_JS, queue=False, show_progress="hidden")


# Gradio 6 announces a finished event to screen readers as `common.complete`, a key none of its
# locales holds, so a reader heard the key itself (in every language). The others: keys of Gradio's
# English locale its zh-CN one lacks, on components this app shows (a queued event's place, the
# tables' filter, the chat's copy button, the downloads); the rest of Gradio's own English (a
# slider's "number input for", a table's "Table actions", "Fullscreen") is written into its
# components, not keys: no locale reaches it.
GRADIO_KEYS = {
    "common.complete": "Complete",
    "common.progress": "Progress",
    "common.download_all": "Download All",
    "status.queue_position": "In queue: {position} of {size}",
    "dataframe.filter": "Filter",
    "dataframe.clear_filter": "Clear filters",
    "chatbot.copy_message": "Copy message",
    "chatbot.copied_message": "Copied message",
}
GRADIO_LOCALES = {ENGLISH: ("en",), "zh": ("zh", "zh-CN", "zh-TW")}


# Text the engine and the evaluation write in English (an exception's message, the ceiling's lines):
# it stays English there (logs, the CLI, the API) and is said in the page's language where the app
# shows it (`said`). Each is a catalogue key whose {fields} stand for what varies (names, numbers);
# a text none of them matches is shown as it came.
ENGINE_TEXTS = (
    # specfuse.limits and specfuse.config: what a form's input can hit
    "the prompt is empty; type a question or an instruction",
    "the last user message is empty; type a question or an instruction",
    "the prompt has {chars} characters; the limit is {limit} (MAX_PROMPT_CHARS)",
    "the forced segment is empty; type some text or pick a candidate",
    "the run ended within the rounds to branch from; branch at an earlier round",
    "temperature must be 0 (greedy) or at least {low}, got {value}",
    "{name} must be in [{low}, {high}], got {value}",
    "{name} must be in {bounds}, got {value}",  # a setting with an open bound: (0, 1]
    # specfuse.trace: an uploaded file
    "not a JSON document: {error}",
    'not a specfuse trace (expected "schema": "{schema}")',
    "trace version {version} is not supported; this build reads versions {versions}",
    "the trace is {size} bytes; the limit is {limit}",
    # specfuse.engine: a run the engine ended (a step run's status line)
    "the paused run ended: no step for {s} s (the server's idle limit for paused runs)",
    "the run has ended ({state}); there is no next round to play: start a new run",
    # the failure browser's report (studio.failures) and specfuse.eval.ceiling's lines in its note
    "no evaluation report (RESULTS-*.json or eval-*.json) under {folder}",
    "Members alone on the {n} problems all answered: {members}.",
    "Oracle (at least one member right): {oracle} = {share} ({low}–{high}); β (all wrong together): "
    "{wrong} = {beta}, so a selector of whole answers scores at most {most}.",
    "Co-failure {a} & {b}: both wrong on {both} = {share} ({overlap} of the problems either got wrong).",
    "{system} against {best} ({n} problems): right where it was wrong {gained} ({gained_ci}), wrong where "
    "it was right {lost} ({lost_ci}); difference {difference} ({low} to {high}), McNemar p = {p}.",
)


@cache
def _engine_patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    """Each ENGINE_TEXTS template as a pattern: its fields match any text (a field named twice, the
    same text)."""
    out = []
    for template in ENGINE_TEXTS:
        parts, seen = re.split(r"\{(\w+)\}", template), set()
        regex = ""
        for i, part in enumerate(parts):
            if i % 2 == 0:
                regex += re.escape(part)
            else:
                regex += f"(?P={part})" if part in seen else f"(?P<{part}>.+?)"
                seen.add(part)
        out.append((re.compile(regex, re.S), template))
    return tuple(out)


def said(text: str) -> str:
    """An English text of the engine's (ENGINE_TEXTS) in the current language, its fields kept."""
    if current() == ENGLISH:
        return text
    for pattern, template in _engine_patterns():
        found = pattern.fullmatch(text)
        if found:
            return _(template, **found.groupdict())
    return text


def gradio_own() -> gr.I18n:
    """The texts Gradio's own locales lack, for launch(i18n=...): in each of Gradio's locale names."""
    return gr.I18n(
        **{
            locale: {key: t(text, lang) for key, text in GRADIO_KEYS.items()}
            for lang, locales in GRADIO_LOCALES.items()
            for locale in locales
        }
    )


def js_texts(*keys: str) -> str:
    """A page script's `sfT(text)`: `text` in the page's language, for the few texts a script of
    the page writes itself. The language as the server picks it: `?lang=`, else the browser's."""
    tables = {code: {k: catalogue(code)[k] for k in keys if k in catalogue(code)} for code in LANGS}
    return (
        f"const sfTables = {json.dumps(tables, ensure_ascii=False)};\n"
        "  const sfLang = (() => {\n"
        "    const asked = new URLSearchParams(window.location.search).get('lang');\n"
        "    if (asked && asked in sfTables) return asked;\n"
        "    for (const tag of navigator.languages || [navigator.language || '']) {\n"
        "      const code = tag.split('-')[0].toLowerCase();\n"
        "      if (code in sfTables) return code;\n"
        "    }\n"
        "    return 'en';\n"
        "  })();\n"
        "  const sfT = (text) => sfTables[sfLang][text] || text;\n"
    )
