"""Every key of the page, from the one key map (specfuse.handout.keys, which the handout reads too):
the script that installs them on page load, and the map that "?" shows.

Step mode's keys press the step bar's buttons (their ids start with `step-`; a disabled or hidden
one is not pressed) and act only while the bar is shown; the presenter view's call
window.sfPresenter (studio.explain). Where the focus is decides what a key may do:
- in a field that takes typing, a slider or a list, every key is the field's;
- on a radio button the arrows are the radio group's (they move the guess), PageDown / PageUp step;
- Space plays only when no form control has the focus (on a button, box or radio it is theirs).
A guess is picked by its number (shown before each choice); the guesses are one radio group under
one `name`, so the arrows and Space work within it as in any form. No request leaves the page.
"""

from __future__ import annotations

import html
import json

import gradio as gr

from specfuse.handout.keys import APP, KEYS, key_rows

BUTTONS = {
    "next": ["step-reveal", "step-next"],
    "back": ["step-back"],
    "home": ["step-home"],
    "end": ["step-end"],
    "play": ["step-play"],
}
ROWS = [{"keys": list(row.keys), "action": row.action} for row in KEYS if APP in row.where]
KEYMAP_ID = "sf-keymap"

SCRIPT = """() => {
  if (window.sfKeys) return;
  const ROWS = __ROWS__;
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
  black.setAttribute("aria-label", "black screen: press any key");
  black.style.cssText = "position:fixed;inset:0;background:#000;z-index:2147483647;display:none";
  body.appendChild(black);
  const applies = {
    next: stepping, back: stepping, home: stepping, end: stepping, play: stepping,
    guess: () => guesses().length > 0,
    panel: presenting,
    black: () => true, help: () => true, presenter: () => true,
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
    SCRIPT = SCRIPT.replace(_name, json.dumps(_value))


def keymap_html() -> str:
    """The map "?" shows: the app's rows of the one key map, as a table."""
    rows = "".join(
        f"<tr><th scope='row'><kbd>{html.escape(keys)}</kbd></th><td>{html.escape(does)}</td></tr>"
        for keys, does in key_rows(APP)
    )
    return (
        f"<div role='dialog' aria-label='Keyboard keys' class='sf-keymap-box'>"
        f"<table><caption>Keys (? shows or hides this map, Esc hides it)</caption>"
        f"<thead><tr><th scope='col'>keys</th><th scope='col'>what they do</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )


def keymap_panel() -> gr.HTML:
    """The key map, hidden until "?" (assets/app.css shows it over the page)."""
    return gr.HTML(keymap_html(), elem_id=KEYMAP_ID, elem_classes=["sf-presenter-keep"])


def keys_line() -> str:
    """The step bar's one line about keys."""
    return (
        "Keys: **→** / **PageDown** next · **←** / **PageUp** back · **Space** play · **1–9** guess · "
        "**?** all keys"
    )


def wire_keys(demo: gr.Blocks) -> None:
    demo.load(None, js=SCRIPT)
