"""A prompt is a conversation (issue 44): messages checked by name, rendered by each member's own chat
template or by the documented completion rendering, bounded as a whole (characters, messages), a
plain string still exactly the one user message it always was (the same token ids), and a run of a
conversation played and traced by the engine."""

from __future__ import annotations

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble, Scheduler
from specfuse.errors import ConfigError
from specfuse.limits import MAX_MESSAGES, MAX_PROMPT_CHARS, check_prompt, check_request
from specfuse.members import drafting
from specfuse.prompts import (
    CHAT,
    QA_COMPLETION,
    Message,
    PromptFormat,
    as_prompt,
    conversation,
    last_user_text,
    prompt_chars,
    prompt_text,
)
from specfuse.trace import dump_trace, parse_trace

from ..conftest import TINY, tiny_member
from ..runs import SYSTEM_AND_THREE_TURNS, chat

# Prompts whose ids today's code gave, rendered the way it rendered them (see old_prompt_ids).
PLAIN = [
    "Explain in two sentences why the sky is blue.",
    "a",
    "  spaced  \n\n out ",
    "漢字 and émoji 🙂",
    "<b>x</b>",
]


def old_prompt_ids(tokenizer, fmt: PromptFormat, prompt: str) -> list[int]:
    """How a string prompt became ids before conversations (git show 6025f55:specfuse/members/drafting.py)."""
    if fmt.kind == "chat":
        system = [{"role": "system", "content": fmt.system}] if fmt.system else []
        messages = [*system, {"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])
    return list(tokenizer(fmt.template.replace("{prompt}", prompt), add_special_tokens=True)["input_ids"])


# ---- normalising ------------------------------------------------------------------------------------


def test_a_string_is_one_user_message_and_a_list_of_dicts_a_checked_conversation():
    assert as_prompt("hi") == "hi"  # a string stays what it was: traces and views keep their text
    assert conversation("hi") == (Message("user", "hi"),)
    conv = as_prompt(SYSTEM_AND_THREE_TURNS)
    assert (
        isinstance(conv, tuple)
        and len(conv) == 6
        and conv[0] == Message("system", SYSTEM_AND_THREE_TURNS[0]["content"])
    )
    assert as_prompt(list(conv)) == conv  # Messages are taken as they are
    assert as_prompt([{"role": "user", "content": "x", "name": "ann"}]) == (
        Message("user", "x"),
    )  # other keys ignored
    assert last_user_text(conv) == "Why is that?" and last_user_text("q") == "q"
    assert prompt_chars(conv) == sum(len(m["content"]) for m in SYSTEM_AND_THREE_TURNS)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "the conversation has no messages"),
        (42, "the prompt must be text or a list of {role, content} messages, got int"),
        ({"role": "user", "content": "x"}, "got dict"),
        (
            [{"role": "user", "content": "a"}, "b"],
            r"messages\[1\]: a message is a \{role, content\} object, not str",
        ),
        ([{"role": "user"}], r"messages\[0\]: a message needs a role and a content"),
        (
            [{"role": "tool", "content": "x"}],
            r"messages\[0\]: role 'tool' is not supported; use one of system, user, assistant",
        ),
        ([{"role": "user", "content": 3}], r"messages\[0\]: content must be text, not int"),
        ([{"role": "user", "content": None}], r"messages\[0\]: content must be text, not NoneType"),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "system", "content": "b"},
                {"role": "user", "content": "c"},
            ],
            r"messages\[1\]: a system message may only come first",
        ),
        (
            [
                {"role": "system", "content": "a"},
                {"role": "system", "content": "b"},
                {"role": "user", "content": "c"},
            ],
            r"messages\[1\]: a system message may only come first",
        ),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            r"messages\[1\]: the last message must be the user's",
        ),
        (
            [{"role": "system", "content": "a"}],
            r"messages\[0\]: the last message must be the user's, not the system's",
        ),
    ],
)
def test_each_malformed_conversation_is_refused_naming_the_message(prompt, message):
    with pytest.raises(ConfigError, match=message):
        as_prompt(prompt)


# ---- rendering ---------------------------------------------------------------------------------------


def test_chat_messages_pass_through_and_the_conversations_system_replaces_the_formats():
    fmt = PromptFormat("chat", system="Default system.")
    assert fmt.messages("hi") == [
        {"role": "system", "content": "Default system."},
        {"role": "user", "content": "hi"},
    ]
    turns = SYSTEM_AND_THREE_TURNS[1:]
    assert fmt.messages(as_prompt(turns)) == [{"role": "system", "content": "Default system."}, *turns]
    assert fmt.messages(as_prompt(SYSTEM_AND_THREE_TURNS)) == SYSTEM_AND_THREE_TURNS
    assert CHAT.messages(as_prompt(turns)) == turns


def test_a_base_model_sees_the_documented_completion_rendering():
    conv = as_prompt(chat("Be brief.", "2+2?", "4", "And 3+3?"))
    assert (
        QA_COMPLETION.completion(conv)
        == "Be brief.\n\nQuestion: 2+2?\nAnswer: 4\n\nQuestion: And 3+3?\nAnswer:"
    )
    assert (
        QA_COMPLETION.completion("2+2?")
        == QA_COMPLETION.completion(conversation("2+2?"))
        == "Question: 2+2?\nAnswer:"
    )
    # An answer that begins with whitespace keeps it (no second space); an unanswered question is
    # followed by the blank line alone; the stop strings stay the format's own.
    odd = as_prompt(
        [
            {"role": "user", "content": "a?"},
            {"role": "assistant", "content": " b"},
            {"role": "user", "content": "c?"},
            {"role": "user", "content": "d?"},
        ]
    )
    assert (
        QA_COMPLETION.completion(odd)
        == "Question: a?\nAnswer: b\n\nQuestion: c?\nAnswer:\n\nQuestion: d?\nAnswer:"
    )
    plain = PromptFormat("completion", template="{prompt}")
    assert (
        plain.completion(
            as_prompt(
                [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "y"},
                    {"role": "user", "content": "z"},
                ]
            )
        )
        == "x y\n\nz"
    )


def test_prompt_text_keeps_a_string_and_writes_a_conversation_as_a_transcript():
    assert prompt_text("Hi") == prompt_text(conversation("Hi")) == "Hi"
    conv = as_prompt(chat("Be brief.", "2+2?", "4", "And 3+3?"))
    assert prompt_text(conv) == "System: Be brief.\n\nUser: 2+2?\n\nAssistant: 4\n\nUser: And 3+3?"


@pytest.mark.parametrize("spec", TINY)
def test_a_string_prompt_gives_exactly_the_ids_it_always_did(spec):
    member = tiny_member(spec)
    tok = member.tokenizer
    for fmt in (CHAT, PromptFormat("chat", system="Be kind."), QA_COMPLETION):
        for prompt in PLAIN:
            old = old_prompt_ids(tok, fmt, prompt)
            assert drafting.prompt_ids(tok, fmt, prompt) == old
            assert drafting.prompt_ids(tok, fmt, conversation(prompt)) == old  # one user message
        for text in PLAIN:  # an answer's text, too
            assert drafting.encode(tok, text) == list(tok(text, add_special_tokens=False)["input_ids"])
    assert member.prompt_ids(PLAIN[0]) == old_prompt_ids(tok, CHAT, PLAIN[0])


@pytest.mark.parametrize("spec", TINY)
def test_each_member_renders_the_conversation_with_its_own_template(spec):
    member = tiny_member(spec)
    conv = as_prompt(SYSTEM_AND_THREE_TURNS)
    text = member.tokenizer.apply_chat_template(
        SYSTEM_AND_THREE_TURNS, tokenize=False, add_generation_prompt=True
    )
    assert member.prompt_ids(conv) == list(member.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert member.decode(member.prompt_ids(conv)) == "".join(m["content"] for m in SYSTEM_AND_THREE_TURNS)
    # The question's own tokens are what prior="prompt" measures: the last user turn's.
    inside, spelled = drafting.prompt_span(member.tokenizer, CHAT, conv, member.prompt_ids(conv))
    ids = member.prompt_ids(conv)
    assert member.decode([ids[t] for t in inside]) == "Why is that?" and spelled == len("Why is that?")


# ---- limits ------------------------------------------------------------------------------------------


def test_the_limits_count_the_whole_conversation_and_name_themselves():
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(MAX_MESSAGES + 1)
    ]
    assert check_prompt(turns[: MAX_MESSAGES - 1] + [turns[0]])  # 64 messages pass
    with pytest.raises(
        ConfigError,
        match=rf"the conversation has {MAX_MESSAGES + 1} messages; "
        rf"the limit is {MAX_MESSAGES} \(MAX_MESSAGES\)",
    ):
        check_prompt(turns)
    many = [{"role": "wizard", "content": ""}] * 10_000  # counted before any message is read
    with pytest.raises(ConfigError, match="10,000 messages; the limit is 64"):
        check_request(many, EnsembleConfig())
    half = "x" * (MAX_PROMPT_CHARS // 2)
    long = [{"role": "system", "content": half}, {"role": "user", "content": half + "y"}]
    with pytest.raises(
        ConfigError,
        match=rf"in all its messages, {MAX_PROMPT_CHARS + 1:,} characters; the limit is "
        rf"{MAX_PROMPT_CHARS:,} \(MAX_PROMPT_CHARS\)",
    ):
        check_prompt(long)
    with pytest.raises(ConfigError, match="the last user message is empty"):
        check_prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "  "}])
    with pytest.raises(ConfigError, match=r"messages\[1\] holds a character that is not valid text"):
        check_prompt(
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "\ud800"},
                {"role": "user", "content": "b"},
            ]
        )
    assert check_prompt("plain") == "plain"


def test_a_conversation_over_a_members_context_is_refused_in_tokens_naming_the_member():
    member = tiny_member("llama-bytes")  # 512 positions
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 30} for i in range(5)]
    with pytest.raises(
        ConfigError,
        match=r"llama-bytes: the prompt takes \d+ tokens and the answer budget 64 more, "
        r"beyond the model's context of 512",
    ):
        Ensemble([member], EnsembleConfig(max_new_tokens=64)).run(turns)


def test_a_template_that_refuses_a_conversation_is_a_config_error_naming_the_member():
    member = tiny_member("qwen-merges")
    member.tokenizer.chat_template = (  # as Gemma 2's and Mistral's older templates do
        "{% if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}" + member.tokenizer.chat_template
    )
    assert member.prompt_ids("fine")  # without a system message it renders
    with pytest.raises(
        ConfigError, match="qwen-merges: the chat template refuses this conversation: .*System role"
    ):
        Ensemble([member], EnsembleConfig(max_new_tokens=8)).run(SYSTEM_AND_THREE_TURNS)


# ---- the engine --------------------------------------------------------------------------------------


def test_the_engine_plays_a_conversation_and_its_trace_keeps_the_messages(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=16, temperature=0.0)
    ensemble = Ensemble(tiny_members, config)
    listed = ensemble.run(SYSTEM_AND_THREE_TURNS)
    assert ensemble.run(as_prompt(SYSTEM_AND_THREE_TURNS)).answer == listed.answer  # dicts or Messages
    # The string path through the same engine is the one user message it always was.
    assert (
        ensemble.run("Why is that?").answer
        == ensemble.run([{"role": "user", "content": "Why is that?"}]).answer
    )
    many = dict(ensemble.stream_many([SYSTEM_AND_THREE_TURNS, "Why is that?"]))
    assert set(many) == {0, 1}
    scheduler = Scheduler(tiny_members, config)
    try:
        ticket = scheduler.submit(SYSTEM_AND_THREE_TURNS)
        assert ticket.wait(120) and ticket.state == "done"
        assert ticket.result().answer == listed.answer
        trace = parse_trace(dump_trace(ticket.trace()))  # the messages themselves (trace format 3)
        assert trace.prompt == as_prompt(SYSTEM_AND_THREE_TURNS)
        assert trace.result.answer == listed.answer
        with pytest.raises(ConfigError, match=r"messages\[1\]: role 'tool'"):
            scheduler.submit([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])
    finally:
        scheduler.close()


def test_prompt_contrast_and_the_prompt_prior_take_a_conversation(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=12, prompt_contrast=0.5, prior="prompt")
    result = Ensemble(tiny_members, config).run(SYSTEM_AND_THREE_TURNS)
    assert result.rounds >= 1
