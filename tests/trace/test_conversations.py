"""A trace records the conversation its run saw (issue 44, trace format 3): `messages` ({role, content})
when the prompt is a conversation, `prompt` when it is a string, the other null. A conversation trace
round-trips to an equal Trace whose prompt is the Conversation; older traces load as string prompts;
a malformed `messages` is named; a branch or a step from a conversation trace feeds the members the
messages, never a transcript of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfuse import EnsembleConfig, Trace, TraceError, dump_trace, load_trace, parse_trace
from specfuse.engine import Ensemble, Scheduler
from specfuse.prompts import Message, as_prompt, prompt_text
from specfuse.records import Finished, Round
from specfuse.trace import VERSION

from ..scripted import ScriptedMember, prefers

DATA = Path(__file__).resolve().parents[1] / "data"
SHIPPED = Path(__file__).resolve().parents[2] / "specfuse" / "lessons" / "traces"
MESSAGES = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "Blue, <b>on</b> a clear day.<|eos|>"},
    {"role": "user", "content": "And at night? 夜"},
]
CONFIG = EnsembleConfig(segment_len=4, max_new_tokens=16, temperature=0.0)


def scripted() -> list[ScriptedMember]:
    return [ScriptedMember(n, [f"{n} "] * 5 + [(f"{n}.", True)], prefers("b ")) for n in ("a", "b", "c")]


def conversation_trace(members=None, config: EnsembleConfig = CONFIG) -> Trace:
    members = members or scripted()
    rounds = tuple(Ensemble(members, config).stream(MESSAGES))
    return Trace(MESSAGES, tuple(m.name for m in members), config, rounds)


def test_a_conversation_trace_round_trips_with_its_messages(tmp_path):
    trace = conversation_trace()
    assert trace.prompt == as_prompt(MESSAGES) and isinstance(trace.prompt[0], Message)  # kept checked
    doc = json.loads(dump_trace(trace))
    assert doc["version"] == VERSION == 3
    assert doc["prompt"] is None and doc["messages"] == MESSAGES
    back = parse_trace(dump_trace(trace))
    assert back == trace and back.prompt == as_prompt(MESSAGES) and back.id == trace.id
    # a string prompt keeps "prompt", with "messages" null; a lone user message stays a conversation
    plain = Trace("Hi", trace.members, CONFIG, trace.rounds)
    assert json.loads(dump_trace(plain))["messages"] is None and parse_trace(dump_trace(plain)) == plain
    lone = Trace([{"role": "user", "content": "Hi"}], trace.members, CONFIG, trace.rounds)
    assert parse_trace(dump_trace(lone)).prompt == (Message("user", "Hi"),)


def test_older_traces_load_as_string_prompts_and_are_written_as_version_3():
    older = [
        p for p in sorted(SHIPPED.glob("*.json")) if json.loads(p.read_text(encoding="utf-8"))["version"] < 3
    ]
    for path in [DATA / "trace-v1.json", *older[:2]]:  # (a lesson made since is written as version 3)
        old = json.loads(path.read_text(encoding="utf-8"))
        assert old["version"] in (1, 2) and "messages" not in old
        trace = load_trace(path)
        assert trace.prompt == old["prompt"]
        again = json.loads(dump_trace(trace))
        assert again["version"] == 3 and again["prompt"] == old["prompt"] and again["messages"] is None
        assert parse_trace(dump_trace(trace)) == trace


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(prompt="also"), r"either prompt \(a string\) or messages .*not both"),
        (lambda d: d.update(messages=None), "got neither"),
        (lambda d: d.pop("messages"), "trace: missing 'messages'"),
        (lambda d: d.update(messages=[]), "trace.messages: the conversation has no messages"),
        (lambda d: d["messages"][1].update(role="tool"), r"trace.messages\[1\].role: Input should be"),
        (lambda d: d["messages"][1].update(content=3), r"trace.messages\[1\].content: expected str, got int"),
        (lambda d: d["messages"][1].update(name="x"), r"trace.messages\[1\]: unknown keys \['name'\]"),
        (lambda d: d["messages"].append(MESSAGES[2]), r"trace.messages\[4\]: the last message must be"),
        (lambda d: d["messages"].append(MESSAGES[0]), r"trace.messages\[4\]: a system message may only"),
        (lambda d: d.update(messages="hello"), "trace.messages: expected a list, got str"),
    ],
)
def test_malformed_messages_are_named(edit, message):
    doc = json.loads(dump_trace(conversation_trace()))
    edit(doc)
    with pytest.raises(TraceError, match=message):
        parse_trace(json.dumps(doc))


def test_a_branch_from_a_conversation_trace_feeds_the_members_the_messages():
    trace = parse_trace(dump_trace(conversation_trace()))
    members = scripted()
    k = 3
    forced = trace.rounds[k - 1].candidates[0].text
    rounds = list(Ensemble(members, CONFIG).stream(trace.prompt, start=trace.rounds[: k - 1], forced=forced))
    starts = [prompt for m in members for call, prompt in m.calls if call == "start"]
    assert starts == [as_prompt(MESSAGES)] * 3  # the messages, not prompt_text's transcript
    assert rounds[0].winner.text == forced


def test_forcing_the_winner_of_a_conversation_trace_reproduces_it_and_the_branch_keeps_the_messages(
    tiny_members,
):
    """fp32 greedy on three tiny architectures: a branch fed a transcript would read other ids and
    (with these weights) draft another answer; fed the messages it reproduces the run exactly."""
    trace = parse_trace(dump_trace(conversation_trace(tiny_members)))
    k = 2
    scheduler = Scheduler(tiny_members, CONFIG)
    try:
        ticket = scheduler.submit(
            trace.prompt, trace.config, start=trace.rounds[: k - 1], forced=trace.rounds[k - 1].winner.text
        )
        events = list(ticket.events(timeout=120))
        assert isinstance(events[-1], Finished) and events[-1].state == "done"
        branched = [*trace.rounds[: k - 1], *(e for e in events if isinstance(e, Round))]
        assert [r.text for r in branched] == [r.text for r in trace.rounds]
        assert ticket.trace().prompt == as_prompt(MESSAGES)
        transcript = Ensemble(tiny_members, CONFIG).run(prompt_text(trace.prompt)).answer
        assert transcript != trace.result.answer  # the test can tell the two apart
    finally:
        scheduler.close()


def test_a_step_mode_run_of_a_conversation_traces_its_messages(tiny_members):
    scheduler = Scheduler(tiny_members, CONFIG)
    try:
        ticket = scheduler.submit(MESSAGES, CONFIG, step=True)
        while not ticket.ended:
            ticket.next()
            list(ticket.events(timeout=120, until_pause=True))
        assert ticket.state == "done"
        trace = parse_trace(dump_trace(ticket.trace()))
        assert trace.prompt == as_prompt(MESSAGES)
        assert trace.result.answer == Ensemble(tiny_members, CONFIG).run(MESSAGES).answer
    finally:
        scheduler.close()


def test_a_handout_of_a_conversation_shows_its_transcript_and_titles_it_by_the_last_question():
    from specfuse.handout import trace_html
    from specfuse.handout.data import default_title, page_data

    trace = conversation_trace()
    assert default_title(trace) == "SpecFuse run: And at night? 夜"
    assert page_data(trace)["prompt"] == prompt_text(trace.prompt)
    assert page_data(trace)["prompt"].startswith("System: Answer in one short sentence.\n\nUser: What")
    assert "&lt;b&gt;on&lt;/b&gt; a clear day." in trace_html(trace)  # the noscript transcript, escaped
