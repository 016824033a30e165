"""The presenter view, for a projector: the answer in large type, the round, and ONE chosen panel.

All in the page: the toggle (its button, or the key P when no text field has the focus; Esc leaves)
sets a class on <body> and assets/app.css hides the rest, so the run and the round shown stay as
they are. Keys 1–4 pick the panel in the view. No request leaves the page. Knows nothing about runs.

Another area that must stay in the view takes the class `sf-presenter-keep` (elem_classes).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .views import SELECTED

PANELS = ("candidates", "matrix", "weights", "exits")  # one at a time, picked in the view
LABEL = "Presenter view (P)"
LEAVE = "Leave presenter view (P or Esc)"

# Installed once on page load: window.sfPresenter.toggle(on?) and .show(panel), and the keys.
SCRIPT = f"""() => {{
  if (window.sfPresenter) return;
  const panels = {list(PANELS)!r};
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
    if (button) button.textContent = on() ? {LEAVE!r} : {LABEL!r};
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
  const answer = document.querySelector("#answer");
  if (answer) new MutationObserver(() => requestAnimationFrame(follow)).observe(answer, {{
    childList: true, subtree: true, characterData: true, attributes: true, attributeFilter: ["style"],
  }});
  window.sfPresenter = {{
    toggle(force) {{
      body.classList.toggle("sf-presenter", force);
      label();
      window.dispatchEvent(new Event("resize"));  // the charts refit their new width
      setTimeout(follow, 200);  // once the view is laid out
    }},
    show(panel) {{
      if (panels.includes(panel)) body.dataset.sfPanel = panel;
      window.dispatchEvent(new Event("resize"));
    }},
  }};
  const typing = (t) => !!t && (t.isContentEditable || ["TEXTAREA", "SELECT"].includes(t.tagName) ||
    (t.tagName === "INPUT" && !["radio", "checkbox", "range", "button", "submit"].includes(t.type)));
  document.addEventListener("keydown", (e) => {{
    if (e.ctrlKey || e.metaKey || e.altKey || e.repeat || typing(e.target)) return;
    if (e.key === "p" || e.key === "P") {{
      window.sfPresenter.toggle();
      e.preventDefault();
    }} else if (e.key === "Escape" && on()) {{
      window.sfPresenter.toggle(false);
    }} else if (on() && e.key >= "1" && e.key <= String(panels.length)) {{
      const choice = document.querySelectorAll("#presenter-panel input[type=radio]")[Number(e.key) - 1];
      if (choice) choice.click();
      e.preventDefault();
    }}
  }});
}}"""


@dataclass
class Presenter:
    toggle: gr.Button
    panel: gr.Radio


def presenter_bar() -> Presenter:
    """The toggle, and (in the view only) which panel it shows."""
    with gr.Row(elem_id="presenter-bar", elem_classes=["sf-presenter-keep"]):
        toggle = gr.Button(LABEL, size="sm", scale=0, min_width=200, elem_id="presenter-toggle")
        panel = gr.Radio(
            list(PANELS),
            value=PANELS[0],
            label="Panel shown (keys 1–4)",
            container=False,
            elem_id="presenter-panel",
        )
    return Presenter(toggle, panel)


def wire_presenter(demo: gr.Blocks, presenter: Presenter) -> None:
    """All in the browser: no request for a toggle, a key or a panel picked."""
    demo.load(None, js=SCRIPT)
    presenter.toggle.click(None, js="() => { window.sfPresenter.toggle(); }")
    presenter.panel.change(None, [presenter.panel], None, js="(p) => { window.sfPresenter.show(p); }")
