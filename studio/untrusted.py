"""Text from outside, made safe to show: what a trace, a user, a served model or a server wrote.

Gradio renders the message of gr.Error (and gr.Warning, gr.Info) as HTML and a gr.Markdown's value
as Markdown, so such text could place links, images (requests to any server) or styled boxes in
another user's page. Here: `esc` for HTML, `md` for Markdown, `error` for every message the app
raises, and `Servers` to show the operator's name of a served member instead of its URL. Knows
nothing about runs.
"""

from __future__ import annotations

import html
from collections.abc import Mapping

import gradio as gr

from specfuse.handout.data import shown_controls

from .i18n import said

__all__ = ["Servers", "error", "esc", "md", "shown_controls"]

# Characters Markdown (with GitHub's extensions and Gradio's LaTeX delimiters) acts on anywhere in a
# line. As numeric entities they render as themselves and mean nothing: `[a](b)` is no link,
# `http://x` and `a@b.c` are no autolinks (their `:` and `@` are entities), `$$` starts no formula.
MARKDOWN_SPECIALS = frozenset("\\`*_{}[]()#+!|~:@$<>&\"'")
MARKDOWN_LINE_START = frozenset("-=+.>")  # a list, a heading underline, a quote: only at a line's start


def esc(text: object) -> str:
    """A label for HTML or Plotly (which renders <b>, <a href> and friends in its text): escaped, its
    directional formatting characters written out (a right-to-left override cannot reorder it)."""
    return html.escape(shown_controls(str(text)), quote=True)


def md(text: object) -> str:
    """Plain text inside Markdown: every character Markdown or HTML would act on, as an entity.

    Besides MARKDOWN_SPECIALS: `-`, `=`, `+`, `.` and `>` where only spaces or digits precede them on
    their line (a list, `1.` an ordered one, an underline, a quote), and the `.` of `www.` (an
    autolink).
    """
    out: list[str] = []
    lead, last = True, ""  # only spaces or digits so far on this line; the 3 characters before
    for c in shown_controls(str(text)):
        special = c in MARKDOWN_SPECIALS or (lead and c in MARKDOWN_LINE_START)
        out.append(f"&#{ord(c)};" if special or (c == "." and last.lower() == "www") else c)
        lead = c == "\n" or (lead and c in " \t0123456789")
        last = (last + c)[-3:]
    return "".join(out)


class Servers:
    """The served members the operator offers: their names for everyone, their URLs server-side.

    `names` maps the operator's name (`#NAME` of the spec) to the spec; `scrub` replaces a spec,
    its URL and its host:port in any text shown to a browser user by that name.
    """

    def __init__(self, names: Mapping[str, str] | None = None) -> None:
        self.names = dict(names or {})
        hidden: dict[str, str] = {}
        for name, spec in self.names.items():
            hidden[spec] = name
            for secret in _secrets(spec):
                hidden.setdefault(secret, f"[the server of {name}]")
        self._hidden = sorted(hidden.items(), key=lambda kv: -len(kv[0]))  # a spec before its URL

    def spec(self, name: str) -> str:
        """What the loader loads for a name picked in the app: the spec of a served member."""
        return self.names.get(name, name)

    def scrub(self, text: str) -> str:
        for secret, shown in self._hidden:
            text = text.replace(secret, shown)
        return text


def _secrets(spec: str) -> list[str]:
    """The parts of a spec that say where its server is (with and without credentials)."""
    from urllib.parse import urlsplit

    engine, _, rest = spec.partition(":")
    url = rest.partition("?")[0].partition("#")[0]
    found = [url, url.rstrip("/")]
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        found += [f"{parts.scheme}://{host}", host, f"{engine}@{host}"]  # the last: a default name
        if parts.netloc != host:  # credentials: user:password@host
            found.append(parts.netloc)
    except ValueError:
        pass
    return [s for s in found if len(s) > 3]


def error(message: object, servers: Servers | None = None) -> gr.Error:
    """One gr.Error whose message shows as the text it is (escaped), with no server URL in it, in the
    page's language where it is an engine text the catalogue knows (the exception keeps its English)."""
    text = str(message)
    if servers is not None:
        text = servers.scrub(text)
    return gr.Error(esc(said(text)))
