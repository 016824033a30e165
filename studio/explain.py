"""How the panels read in class: what each one shows, a lesson's "look for" beside it, and the
presenter view that shows a projector one of them at a time.

`WHAT_THIS_SHOWS` holds one short explanation per panel for a student on their own (correct per
docs/method.md); `Notes` places, right under each panel, a closed "What this shows" accordion and
an empty "look for" note that an opened lesson fills (studio.gallery).

The presenter view, all in the page: its toggle (the button, or the key P when no text field has
the focus; Esc leaves) sets a class on <body> and assets/app.css hides the rest, so the run and the
round shown stay as they are; keys 1–4 pick the panel. Every key of the page (step mode's, the
presenter view's, "?" for the key map, a black screen) comes from the one key map
(specfuse.handout.keys), installed by `wire_keys`. No request leaves the page. Another area that
must stay in the view takes the class `sf-presenter-keep` (elem_classes). Knows nothing about runs.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import gradio as gr

from specfuse.handout.keys import APP, KEYS, key_rows
from specfuse.lessons import PANELS  # the panels a lesson may point at

from .i18n import _, js_texts, localize
from .untrusted import md
from .views import SELECTED

WHAT_THIS_SHOWS: dict[str, str] = {
    "answer": (
        "The answer, built one short segment per round. In every round each member drafts a "
        "continuation, all of them judge all the drafts, and the best one is appended to the answer "
        "for everyone. Each segment is coloured by the member whose candidate won that round (the "
        "legend names them): the answer is exactly the winning segments, joined. Click a segment to "
        "see the candidates it beat."
    ),
    "candidates": (
        "This round's candidates: each member still drafting continued the answer so far by at most "
        "L tokens (the segment length), cut back to a whole word. One row per candidate: who drafted "
        "it, its text, its **score** (the verifiers' votes combined by their weights) and whether it "
        "was **chosen** ✓. A candidate that is not **eligible** cannot win whatever its score (an "
        "empty draft, or one that only copies the prompt). **reward** is what its drafter earned for "
        "the weights. The eligible candidate with the highest score is appended."
    ),
    "matrix": (
        "The verification matrix: every member reads every candidate, as a **verifier**. One row per "
        "verifier, one column per candidate (named by its drafter). A cell says how natural verifier "
        "i finds candidate j after the answer so far: the mean log-probability of the candidate's "
        "tokens in that verifier's own tokenizer (or, with the paper's setting, the mean raw logit). "
        "Brighter is better. The boxed column, ✓, won. A round with one draft, or with drafts that "
        "agreed, is not verified: there is nothing to compare, and the panel says so."
    ),
    "normalization": (
        "Each model scores on its own scale: one model's numbers may all run higher than another's. "
        "So before the votes are combined, each verifier's row is **normalized** over the "
        "candidates. The default, `zsoftmax`, turns a row into z-scores and then a softmax: the row "
        "sums to 1, and only how that verifier ranks the candidates, and by how much, still counts, "
        "not its scale or offset. With two candidates a row keeps only the order (0.12 / 0.88). "
        "*normalized ŝ* shows these numbers; *raw z* the scores before normalizing."
    ),
    "weights": (
        "How much each member's vote counts (its weight w). Weights start from each member's trust "
        "(its accuracy alone on development sets) or equal, and always sum to 1. After each round a "
        "member earns a reward for how often the other verifiers scored its candidate at least as "
        "high as the others, and its weight is multiplied by exp(η·reward) and renormalized; the "
        "step η shrinks as the rounds go on. Round k is judged with the weights learned before it. "
        "✕ marks a member leaving (model exit)."
    ),
    "exits": (
        "Members that left (model exit), after which round, and why. The scores each member's "
        "candidates received are added up over the rounds and turned into a keep-probability p "
        "(a softmax that stays flat while the history is still even, so early rounds hold exits "
        "back). After the warm-up rounds a "
        "member whose p falls below the threshold δ divided by the number of members drafting stops "
        "drafting (and, by default, verifying). The leader never exits and at least one member keeps "
        "drafting. The calls an exited member does not make are the *calls saved* on the status line."
    ),
}


class Notes:
    """Under each panel: a closed "What this shows" accordion and a lesson's "look for" note (hidden
    until a lesson fills it). `place(name)` is called right after the panel is built."""

    def __init__(self) -> None:
        self.look: dict[str, gr.Markdown] = {}

    def place(self, name: str) -> None:
        if name in PANELS:
            self.look[name] = gr.Markdown(
                visible=False, elem_id=f"class-look-{name}", elem_classes=["sf-look"]
            )
        title = "What normalization does" if name == "normalization" else "What this shows"
        with gr.Accordion(title, open=False, elem_id=f"class-explain-{name}"):
            gr.Markdown(WHAT_THIS_SHOWS[name], elem_classes=["sf-explain"])

    def outputs(self) -> list[gr.components.Component]:
        return list(self.look.values())

    def values(self, look_for: Mapping[str, str] | None) -> dict[gr.components.Component, object]:
        """Each note: a lesson's text for its panel, shown; without a lesson (or a text), hidden."""
        look_for = look_for or {}
        return {
            note: gr.Markdown(f"**{_('Look for:')}** {md(_(look_for[name]))}", visible=True)
            if look_for.get(name)
            else gr.Markdown("", visible=False)
            for name, note in self.look.items()
        }


# ---- the presenter view ------------------------------------------------------------------------

PRESENTED = ("candidates", "matrix", "weights", "exits")  # one at a time, picked in the view
LABEL = "Presenter view (P)"
LEAVE = "Leave presenter view (P or Esc)"

# Installed once on page load: window.sfPresenter.toggle(on?) and .show(panel), and the keys.
SCRIPT = f"""() => {{
  if (window.sfPresenter) return;
  {js_texts(LABEL, LEAVE)}  const panels = {list(PRESENTED)!r};
  const body = document.body;
  const on = () => body.classList.contains("sf-presenter");
  body.dataset.sfPanel = panels[0];
  // A short screen (a 1280×720 projector) gets smaller charts: CSS here cannot use @media (Gradio
  // scopes a media query's rules inside the app, where <body> is not).
  const fit = () => {{ body.dataset.sfShort = String(window.innerHeight <= 800); }};
  window.addEventListener("resize", fit);
  fit();
  const label = () => {{
    const button = document.querySelector("#presenter-toggle");
    if (button) button.textContent = on() ? sfT({LEAVE!r}) : sfT({LABEL!r});
  }};
  // The answer scrolls in the view: keep the segment marked (a replayed round), else its end, in sight.
  const follow = () => {{
    const answer = document.querySelector("#answer");
    if (!on() || !answer) return;
    const tokens = [...answer.querySelectorAll(".token")];
    const mark = [...answer.querySelectorAll(".legend-item")].find((b) => b.textContent === {SELECTED!r});
    const target = (mark && tokens.find((t) => t.style.backgroundColor === mark.style.backgroundColor))
      || tokens[tokens.length - 1];
    const below = (e) => e.getBoundingClientRect().bottom;
    if (target) answer.scrollTop += below(target) - below(answer) + answer.clientHeight / 3;
  }};
  // The answer takes the height left under the bars: a step bar's note grows and shrinks, and a
  // 720 px screen has no room to spare (the page never scrolls in the view).
  const room = () => {{
    const answer = document.querySelector("#answer");
    if (!answer) return;
    if (!on()) {{ answer.style.maxHeight = ""; return; }}
    const top = answer.getBoundingClientRect().top + window.scrollY;
    // the lesson's notes for the answer and the panel shown sit under it
    const notes = [...document.querySelectorAll("#class-look-answer, #class-look-" + body.dataset.sfPanel)]
      .reduce((sum, n) => sum + (n.getClientRects().length ? n.getBoundingClientRect().height + 12 : 0), 0);
    answer.style.maxHeight = Math.max(120, window.innerHeight - top - notes - 16) + "px";
    window.scrollTo(0, 0);
  }};
  const bar = document.querySelector("#step-bar");
  if (bar && window.ResizeObserver) new ResizeObserver(() => requestAnimationFrame(room)).observe(bar);
  window.addEventListener("resize", () => requestAnimationFrame(room));
  const answer = document.querySelector("#answer");
  const settle = () => requestAnimationFrame(() => {{ room(); follow(); }});
  if (answer) new MutationObserver(settle).observe(answer, {{
    childList: true, subtree: true, characterData: true, attributes: true, attributeFilter: ["style"],
  }});
  window.sfPresenter = {{
    toggle(force) {{
      body.classList.toggle("sf-presenter", force);
      label();
      window.dispatchEvent(new Event("resize"));  // the charts refit their new width
      setTimeout(() => {{ room(); follow(); }}, 200);  // once the view is laid out
    }},
    show(panel) {{
      if (panels.includes(panel)) body.dataset.sfPanel = panel;
      window.dispatchEvent(new Event("resize"));
      setTimeout(room, 100);
    }},
  }};
}}"""


@dataclass
class Presenter:
    toggle: gr.Button
    panel: gr.Radio


def presenter_bar(beside: Callable[[], object] | None = None) -> tuple[Presenter, object]:
    """The toggle, and (in the view only) which panel it shows; `beside` builds more of the
    classroom's controls in the same row (what it returns comes back with the Presenter)."""
    with gr.Row(elem_id="presenter-bar", elem_classes=["sf-presenter-keep"]):
        toggle = gr.Button(LABEL, size="sm", scale=0, min_width=200, elem_id="presenter-toggle")
        extra = beside() if beside is not None else None
        panel = gr.Radio(
            list(PRESENTED),
            value=PRESENTED[0],
            label="Panel shown (keys 1–4)",
            container=False,
            elem_id="presenter-panel",
        )
    return Presenter(toggle, panel), extra


def wire_presenter(demo: gr.Blocks, presenter: Presenter) -> None:
    """All in the browser: no request for a toggle, a key or a panel picked."""
    demo.load(None, js=SCRIPT)
    presenter.toggle.click(None, js="() => { window.sfPresenter.toggle(); }")
    presenter.panel.change(None, [presenter.panel], None, js="(p) => { window.sfPresenter.show(p); }")


# ---- every key of the page ----------------------------------------------------------------------
# Every key of the page, from the one key map (specfuse.handout.keys, which the handout reads too):
# the script that installs them on page load, and the map that "?" shows.
#
# Step mode's keys press the step bar's buttons (their ids start with `step-`; a disabled or hidden
# one is not pressed) and act only while the bar is shown; the presenter view's call
# window.sfPresenter (above). Where the focus is decides what a key may do:
# - in a field that takes typing, a slider or a list, every key is the field's;
# - on a radio button the arrows are the radio group's (they move the guess), PageDown / PageUp step;
# - Space plays only when no form control has the focus (on a button, box or radio it is theirs).
# A guess is picked by its number (shown before each choice); the guesses are one radio group under
# one `name`, so the arrows and Space work within it as in any form. No request leaves the page.
BUTTONS = {
    "next": ["step-reveal", "step-next"],
    "back": ["step-back"],
    "home": ["step-home"],
    "end": ["step-end"],
    "play": ["step-play"],
    "room": ["room-start"],  # a class session (studio.room_page): shown only while none is open
    "votes": ["room-votes"],
}
ROWS = [{"keys": list(row.keys), "action": row.action} for row in KEYS if APP in row.where]
KEYMAP_ID = "sf-keymap"

KEY_SCRIPT = """() => {
  if (window.sfKeys) return;
  __TEXTS__  const ROWS = __ROWS__;
  const BUTTONS = __BUTTONS__;
  const body = document.body;
  const TYPED = new Set(["text", "search", "email", "url", "tel", "password", "number", "range",
    "date", "time", "datetime-local", "month", "week", "color", "file"]);
  const typing = (el) => {
    if (!el || el === body) return false;
    if (el.isContentEditable || el.tagName === "TEXTAREA" || el.tagName === "SELECT") return true;
    if (el.tagName === "INPUT") return TYPED.has((el.getAttribute("type") || "text").toLowerCase());
    return ["slider", "combobox", "textbox", "listbox", "spinbutton"].includes(el.getAttribute("role"));
  };
  const control = (el) => !!el && el !== body && (typing(el) ||
    ["INPUT", "BUTTON", "SELECT", "TEXTAREA", "SUMMARY", "A"].includes(el.tagName) ||
    ["button", "radio", "checkbox", "switch", "tab", "link", "menuitem"].includes(el.getAttribute("role")));
  const radio = (el) => !!el && (el.type === "radio" || el.getAttribute("role") === "radio");
  const seen = (el) => !!el && el.offsetParent !== null;
  const stepping = () => seen(document.getElementById("step-next"));
  const guesses = () => [...document.querySelectorAll("#step-guess input[type=radio]")].filter(seen);
  const presenting = () => body.classList.contains("sf-presenter");
  // One radio group, one name: the arrows move within it and Space picks, as in any form.
  const group = () => {
    for (const [id, name] of [["step-guess", "sf-guess"], ["presenter-panel", "sf-panel"]]) {
      document.querySelectorAll(`#${id} input[type=radio]`).forEach((r) => {
        if (r.name !== name) r.name = name;
      });
    }
  };
  // Gradio names each radio on its own, and may name it again after it is in the page.
  new MutationObserver(group).observe(body, {
    childList: true, subtree: true, attributes: true, attributeFilter: ["name"],
  });
  group();
  const map = () => document.getElementById(__MAP__);
  const black = document.createElement("div");
  black.id = "sf-black";
  black.setAttribute("aria-label", sfT("black screen: press any key"));
  black.style.cssText = "position:fixed;inset:0;background:#000;z-index:2147483647;display:none";
  body.appendChild(black);
  const applies = {
    next: stepping, back: stepping, home: stepping, end: stepping, play: stepping,
    guess: () => guesses().length > 0,
    panel: presenting,
    black: () => true, help: () => true, presenter: () => true, room: () => true, votes: () => true,
  };
  const act = {
    press(action) {
      for (const id of BUTTONS[action]) {
        const b = document.getElementById(id);
        if (seen(b) && !b.disabled) { b.click(); return; }
      }
    },
    guess(key) {
      const r = guesses()[Number(key) - 1];
      if (r) { r.click(); r.focus(); }
    },
    panel(key) {
      const r = document.querySelectorAll("#presenter-panel input[type=radio]")[Number(key) - 1];
      if (r) r.click();
    },
    black() { black.style.display = "block"; },
    help() { const m = map(); if (m) m.classList.toggle("sf-open"); },
    presenter() { if (window.sfPresenter) window.sfPresenter.toggle(); },
  };
  let swallowed = false;
  document.addEventListener("keydown", (e) => {
    swallowed = false;
    if (black.style.display === "block") {  // any key brings the page back, and does nothing else
      black.style.display = "none";
      e.preventDefault(); e.stopPropagation(); swallowed = true;
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const t = document.activeElement;
    if (e.key === "Escape") {
      const m = map();
      if (m && m.classList.contains("sf-open")) m.classList.remove("sf-open");
      else if (presenting() && window.sfPresenter) window.sfPresenter.toggle(false);
      return;
    }
    if (typing(t)) return;
    if (radio(t) && ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown"].includes(e.key)) return;
    if (e.key === " " && control(t)) return;  // Space is the focused control's: never Play
    const row = ROWS.find((r) => r.keys.includes(e.key) && applies[r.action]());
    if (!row) return;
    e.preventDefault(); e.stopPropagation(); swallowed = true;
    if (e.repeat) return;
    if (BUTTONS[row.action]) act.press(row.action);
    else act[row.action](e.key);
  }, true);
  // A focused button or box acts on Space's keyup: not when the key was ours.
  document.addEventListener("keyup", (e) => {
    if (swallowed && e.key === " ") { e.preventDefault(); e.stopPropagation(); }
  }, true);
  window.sfKeys = { rows: ROWS };
}"""
for _name, _value in (("__ROWS__", ROWS), ("__BUTTONS__", BUTTONS), ("__MAP__", KEYMAP_ID)):
    KEY_SCRIPT = KEY_SCRIPT.replace(_name, json.dumps(_value))
KEY_SCRIPT = KEY_SCRIPT.replace("__TEXTS__", js_texts("black screen: press any key"))


def keymap_html() -> str:
    """The map "?" shows: the app's rows of the one key map, as a table."""
    rows = "".join(
        f"<tr><th scope='row'><kbd>{html.escape(_(keys))}</kbd></th><td>{html.escape(_(does))}</td></tr>"
        for keys, does in key_rows(APP)
    )
    return (
        f"<div role='dialog' aria-label='{html.escape(_('Keyboard keys'))}' class='sf-keymap-box'>"
        f"<table><caption>{html.escape(_('Keys (? shows or hides this map, Esc hides it)'))}</caption>"
        f"<thead><tr><th scope='col'>{_('keys')}</th><th scope='col'>{_('what they do')}</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )


def keymap_panel() -> gr.HTML:
    """The key map, hidden until "?" (assets/app.css shows it over the page)."""
    keymap = gr.HTML(keymap_html(), elem_id=KEYMAP_ID, elem_classes=["sf-presenter-keep"])
    return localize(keymap, lambda: {"value": keymap_html()})


def keys_line() -> str:
    """The step bar's one line about keys."""
    return (
        "Keys: **→** / **PageDown** next · **←** / **PageUp** back · **Space** play · **1–9** guess · "
        "**?** all keys"
    )


def wire_keys(demo: gr.Blocks) -> None:
    demo.load(None, js=KEY_SCRIPT)
