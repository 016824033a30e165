"""Directional formatting characters in trace and model text (issue 53, D6): a right-to-left override
(U+202E) made "gnp.exe" read "exe.png" in the app's chat bubble and could reorder a PNG slide. Each is
written out as [U+202E] wherever such text is shown, and the app's bubbles isolate every text (<bdi>).
The handout page's rendered order is read in chromium by tests/browser/test_handout.py.
"""

from __future__ import annotations

import dataclasses
import html

import pytest

from specfuse import Ensemble, EnsembleConfig, Trace
from specfuse.handout import round_png
from specfuse.handout.data import shown_controls
from specfuse.handout.png import clean
from specfuse.records import Draft
from studio.chat_views import Chat, Turn, bubbles_html, turn_choices
from studio.step_views import guess_choices
from studio.untrusted import esc, md
from studio.views import answer_value, candidates_value

from ..scripted import ScriptedMember, prefers

RLO = "\u202e"
EVIL = f"open {RLO}gnp.exe now"
SHOWN = "open [U+202E]gnp.exe now"


def trace_of(*texts: str, members: tuple[str, ...] = ("a", "b"), prompt: str = "go") -> Trace:
    rounds = Ensemble(
        [ScriptedMember(m, list(texts), prefers("")) for m in members],
        EnsembleConfig(max_rounds=len(texts), exit=False),
    ).stream(prompt)
    return Trace(prompt, members, EnsembleConfig(max_rounds=len(texts)), tuple(rounds))


@pytest.mark.parametrize(
    "control", ["\u061c", "\u200e", "\u200f", "\u202a", "\u202b", "\u202c", "\u202d", RLO, "\u2066", "\u2069"]
)
def test_every_directional_control_is_written_out_and_other_text_kept(control):
    shown = shown_controls(f"a{control}b")
    assert control not in shown and shown == f"a[U+{ord(control):04X}]b"
    hebrew = "שלום עולם"  # right-to-left letters are text, not controls: kept as they are
    assert shown_controls(hebrew) == hebrew


def test_html_and_markdown_text_show_the_override_as_what_it_is():
    assert esc(EVIL) == SHOWN
    assert RLO not in md(EVIL) and "[U+202E]gnp" in html.unescape(md(EVIL))


def test_the_chat_bubbles_isolate_each_text_and_write_out_the_override():
    turn = Turn(EVIL, trace_of(f"{RLO}gnp.exe", " done"))  # (the engine refuses such a member name)
    page = bubbles_html(Chat(f"system {RLO}txt.cba", (turn, Turn(EVIL))))
    assert RLO not in page
    assert f"<bdi>{SHOWN}</bdi>" in page  # the question, isolated, in logical order
    assert "<bdi>system [U+202E]txt.cba</bdi>" in page
    answer = page.split('class="sf-bubble sf-assistant">')[1]
    assert answer.startswith("<bdi>") and "[U+202E]gnp.exe" in answer
    assert "[U+202E]gnp.exe" in turn_choices(Chat("", (turn,)))[0][0]


def test_the_app_s_answer_tables_and_choices_carry_no_override():
    trace = trace_of(f"{RLO}gnp.exe")
    assert all(RLO not in text for text, _ in answer_value(trace.rounds))
    cells = candidates_value(trace.rounds[0]).to_numpy().ravel()
    assert not any(RLO in str(c) for c in cells) and any("[U+202E]gnp.exe" in str(c) for c in cells)

    drafts = [Draft(1, c, 0.1) for c in trace.rounds[0].candidates]
    assert all(RLO not in label and "[U+202E]" in label for label, _ in guess_choices(drafts))


def test_the_png_draws_the_override_written_out_not_applied():
    assert clean(EVIL) == SHOWN
    written = trace_of("[U+202E]gnp.exe", members=("a", "b"), prompt=SHOWN)
    hostile = trace_of(f"{RLO}gnp.exe", members=("a", "b"), prompt=EVIL)
    # the same pixels as the text with the control typed out: Pillow's layout (raqm) got no override
    assert round_png(hostile, 1) == round_png(written, 1)
    plain = dataclasses.replace(written, rounds=trace_of("xxxxxx.exe", prompt=SHOWN).rounds)
    assert round_png(plain, 1) != round_png(written, 1)  # the comparison can tell texts apart
