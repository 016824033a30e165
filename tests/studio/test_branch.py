"""A branch that forces the run's own winner (issue 24, item 7): in bf16 on CPU it gave another answer
from a later round while the view said "the answers part at round 2". The view now says where they
really part and, when the choice was the run's own, that numerics made the difference; a branch that
changes nothing says it reproduces the run (tiny models, through the app's API), a conversation's
run included."""

from __future__ import annotations

import dataclasses

from gradio_client import handle_file

from specfuse import EnsembleConfig, Trace, load_trace, save_trace
from specfuse.engine import Ensemble
from specfuse.prompts import as_prompt
from studio import views, what_if_views

from ..conftest import TINY
from ..helpers_app import DOWNLOAD, gradio_client, path_of
from ..runs import chat
from ..scripted import scripted_rounds


def test_the_same_choice_with_another_answer_is_put_down_to_numerics():
    original = scripted_rounds(max_rounds=5).rounds
    k, part = 2, 4  # forced round 2's own winner; the answers part at round 4
    branch = [
        *original[: part - 1],
        *(dataclasses.replace(r, text=r.text + "other ") for r in original[part - 1 :]),
    ]
    markup = what_if_views.branch_html(
        original, branch, k, original[k - 1].winner.member, original[k - 1].winner.text
    )
    assert "the very candidate the run chose in round 2" in markup and "part at round 4" in markup
    assert "numerics, not from the choice" in markup and "bf16" in markup
    # Another choice is the reason itself: no word of numerics.
    other = what_if_views.branch_html(original, branch, k, "you", "typed ")
    assert "numerics" not in other and "part at round 4" in other
    assert what_if_views.parting_round(original, original) is None
    same = what_if_views.branch_html(original, list(original), k, "b", original[k - 1].winner.text)
    assert "reproduces the original answer" in same and "numerics" not in same


def test_forcing_the_runs_own_winner_through_the_app_reproduces_it(served, tmp_path):
    url, _, downloads, _ = served
    client = gradio_client(url, downloads)
    final = client.predict(
        members=TINY, prompt="Hello there", segment_len=4, max_new_tokens=24, device="cpu", api_name="/run"
    )
    trace = load_trace(path_of(final[DOWNLOAD]))
    pick = trace.rounds[1].chosen
    view, download = client.predict(k=2, pick=pick, typed="", device="cpu", api_name="/branch")
    assert "reproduces the original answer" in view, view
    branch = load_trace(path_of(download))
    assert branch.rounds[-1].text == trace.rounds[-1].text and branch.branch.k == 2


def test_a_branch_of_an_uploaded_conversation_trace_feeds_the_members_the_messages(
    served, tmp_path, monkeypatch
):
    """Trace format 3 keeps the messages; the app's branch passes them on (a transcript would give
    the tiny members other ids, and another answer)."""
    url, members, downloads, cache = served
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))  # where the app put the upload (test_app's client)
    messages = chat("Be brief.", "Hello there", "Hi.", "And again?")
    config = EnsembleConfig(segment_len=4, max_new_tokens=24)
    rounds = tuple(Ensemble([members[n] for n in TINY], config).stream(messages))
    path = save_trace(Trace(messages, tuple(TINY), config, rounds), tmp_path / "conversation.json")
    client = gradio_client(url, downloads)
    client.predict(path=handle_file(str(path)), view_name=views.NORMALIZED, api_name="/load_trace")
    client.predict(k=2, view_name=views.NORMALIZED, api_name="/replay")  # round 2's candidates to pick from
    view, download = client.predict(k=2, pick=rounds[1].chosen, typed="", device="cpu", api_name="/branch")
    assert "reproduces the original answer" in view, view
    branch = load_trace(path_of(download))
    assert branch.prompt == as_prompt(messages) and branch.rounds[-1].text == rounds[-1].text


def test_the_status_mentions_loading_only_when_members_were_loaded():
    """'(loading 0.00 s)' showed on every run after the first, when nothing loaded."""
    from specfuse.records import Candidate, Draft

    drafts = [Draft(1, Candidate("a", "x", 1, False, 0.1), 0.2)]
    assert "loading" not in views.arriving_status(drafts, ["a", "b"], waited_s=0.3, loading_s=0.001)
    assert "(loading 2.50 s)" in views.arriving_status(drafts, ["a", "b"], waited_s=3.0, loading_s=2.5)
