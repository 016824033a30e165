"""Bounded cost per request: every input a user controls is refused past its limit before any model
work, with a message that names the limit and the value; the settings' ceilings; the trace's size in
bytes; a verifier's context; and memory for the longest allowed inputs, measured in a fresh process."""

from __future__ import annotations

import contextlib
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError, PromptTooLongError, TraceError
from specfuse.limits import (
    MAX_ANSWER_CHARS,
    MAX_NEW_TOKENS,
    MAX_PROMPT_CHARS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MIN_TYPED_CHARS,
    typed_segment_chars,
)
from specfuse.members.hf import HFMember
from specfuse.records import Candidate
from specfuse.trace import MAX_TRACE_BYTES, Trace, dump_trace, load_trace, parse_trace

from ..builders import hand_round
from ..conftest import byte_bpe_tokenizer, tiny_member
from ..scripted import ScriptedMember


def scripted(names: str = "ab") -> list[ScriptedMember]:
    return [ScriptedMember(n, [f"{n} says "], lambda text: float(len(text))) for n in names]


def first_rounds(members, config: EnsembleConfig, k: int = 1) -> list:
    rounds = []
    for r in Ensemble(members, config).stream("go"):
        rounds.append(r)
        if len(rounds) == k:
            break
    return rounds


@pytest.mark.parametrize(("segment_len", "limit"), [(1, MIN_TYPED_CHARS), (10, 400), (64, 2048), (256, 8192)])
def test_the_typed_segment_limit_follows_the_segment_length(segment_len, limit):
    assert typed_segment_chars(EnsembleConfig(segment_len=segment_len)) == limit


def test_a_typed_segment_over_its_limit_is_refused_before_any_member_starts():
    members = scripted()
    config = EnsembleConfig(max_new_tokens=40)
    start = first_rounds(scripted(), config)
    limit = typed_segment_chars(config)
    with pytest.raises(
        ConfigError, match=rf"{limit + 1:,} characters; the limit is {limit:,} at segment length 10"
    ):
        list(Ensemble(members, config).stream("go", start=start, forced="x" * (limit + 1)))
    assert all(m.calls == [] for m in members)  # not even start(): no model work at all
    # At the limit it plays: the typed segment wins round 2.
    rounds = list(Ensemble(members, config).stream("go", start=start, forced="y" * limit))
    assert rounds[0].winner.member == "you" and rounds[0].winner.text == "y" * limit


def test_a_forced_segment_is_limited_without_a_start_and_whoever_wrote_it():
    members = scripted()
    config = EnsembleConfig()
    too_long = "z" * (typed_segment_chars(config) + 1)
    with pytest.raises(ConfigError, match="the forced segment has"):
        list(
            Ensemble(members, config).stream("go", forced=too_long, origin="a")
        )  # "a candidate" from a trace
    assert all(m.calls == [] for m in members)


@pytest.mark.parametrize(
    ("prompt", "forced", "message"),
    [
        (
            "x" * (MAX_PROMPT_CHARS + 1),
            None,
            f"the prompt has {MAX_PROMPT_CHARS + 1:,} characters; the limit",
        ),
        (
            "bad \ud800 text",
            None,
            r"the prompt holds a character that is not valid text \('\\ud800' at character 4",
        ),
        ("go", "bad \udcff", "the forced segment holds a character that is not valid text"),
        ("go", "", "the forced segment is empty"),
    ],
)
def test_bad_prompts_and_segments_are_refused_before_any_member_starts(prompt, forced, message):
    members = scripted()
    with pytest.raises(ConfigError, match=message):
        list(Ensemble(members).stream(prompt, forced=forced))
    assert all(m.calls == [] for m in members)


def test_a_branch_whose_answer_is_too_long_is_refused_before_any_member_starts():
    members = scripted()
    start = [hand_round(1, members=("a", "b"), texts=("x" * (MAX_ANSWER_CHARS + 1), "b"))]
    with pytest.raises(ConfigError, match=f"answer to branch from has {MAX_ANSWER_CHARS + 1:,} characters"):
        list(Ensemble(members).stream("go", start=start, forced="y"))
    assert all(m.calls == [] for m in members)


def test_a_branch_of_other_members_is_refused_before_any_member_starts():
    members = scripted()
    with pytest.raises(ConfigError, match="played by a, c"):
        list(Ensemble(members).stream("go", start=[hand_round(1, members=("a", "c"))], forced="y"))
    assert all(m.calls == [] for m in members)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"max_new_tokens": MAX_NEW_TOKENS + 1},
            f"max_new_tokens is 131,073; the limit is {MAX_NEW_TOKENS:,}",
        ),
        ({"stop_strings": ("x",) * (MAX_STOP_STRINGS + 1)}, "has 17 strings; the limit is 16"),
        ({"stop_strings": ("x" * (MAX_STOP_STRING_CHARS + 1),)}, "a string of 201 characters; the limit"),
    ],
)
def test_settings_past_a_requests_ceilings_are_refused_before_any_member_starts(values, message):
    members = scripted()
    with pytest.raises(ConfigError, match=message):
        list(Ensemble(members, EnsembleConfig(**values)).stream("go"))
    assert all(m.calls == [] for m in members)


def test_settings_at_a_requests_ceilings_are_taken():
    config = EnsembleConfig(
        max_new_tokens=MAX_NEW_TOKENS,
        max_rounds=1,
        stop_strings=("x" * MAX_STOP_STRING_CHARS,) * MAX_STOP_STRINGS,
    )
    assert len(list(Ensemble(scripted(), config).stream("go"))) == 1


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"segment_len": 10**5000}, "got an integer of about 5,001 digits"),  # repr() would raise
        ({"temperature": 10**400}, "temperature must be a finite number, got an integer of about 401"),
        ({"initial_weights": (10**5000, 1)}, "must be a tuple of float, got a tuple too large to show"),
        ({"score": "x" * 10_000}, r"got 'xxxx.*…$"),  # a value from anyone is shown cut short
    ],
)
def test_hostile_setting_values_are_refused_by_name_not_by_a_crash(values, message):
    with pytest.raises(ConfigError, match=message):
        EnsembleConfig(**values)


def small_trace() -> str:
    return dump_trace(Trace("go", ("a", "b"), EnsembleConfig(), (hand_round(1, stop_reason="final"),)))


def test_the_trace_limit_counts_bytes_not_characters(tmp_path):
    text = small_trace().replace('"prompt": "go"', '"prompt": "' + "猫" * 1000 + '"')  # 3 bytes each
    chars, size = len(text), len(text.encode("utf-8"))
    assert parse_trace(text, max_bytes=size).prompt == "猫" * 1000
    with pytest.raises(TraceError, match=f"the trace is {size:,} bytes; the limit is {chars:,}"):
        parse_trace(text, max_bytes=chars)  # under the limit in characters, over it in bytes
    path = tmp_path / "t.json"
    path.write_text(text, encoding="utf-8")
    assert load_trace(path, max_bytes=size).prompt == "猫" * 1000
    with pytest.raises(TraceError, match=f"is {size:,} bytes; the limit is {chars:,}"):
        load_trace(path, max_bytes=chars)


def test_a_trace_over_the_limit_in_characters_is_refused_without_encoding_it():
    with pytest.raises(TraceError, match="10,001 characters, over the limit of 10,000 bytes"):
        parse_trace(" " * 10_001, max_bytes=10_000)


def test_a_candidate_past_a_verifiers_context_is_refused_by_name_before_its_pass():
    member = tiny_member("llama-bytes")  # 512 positions, one token per ASCII byte
    state = member.start("go", EnsembleConfig(max_new_tokens=10).member_settings(0))
    room = member.max_positions - len(state.ids)
    fits = member.score(state, [Candidate("you", "a" * room, 1, False, 0.0)])  # reaches the last position
    assert len(fits) == 1
    with pytest.raises(PromptTooLongError, match=r"llama-bytes: a candidate of \d+ tokens .* context of 512"):
        member.score(state, [Candidate("you", "a" * (room + 1), 1, False, 0.0)])


def test_an_answer_past_a_members_context_is_refused_by_name_when_accepted():
    member = tiny_member("qwen-merges")
    state = member.start("go", EnsembleConfig(max_new_tokens=10).member_settings(0))
    with pytest.raises(PromptTooLongError, match="qwen-merges: the prompt and the answer take"):
        member.accept(state, "z" * 600)  # a branch's answer from a trace: never verified here


# -- memory: the longest allowed inputs keep resident memory within a stated bound (docs/limits.md) --

ROOT = Path(__file__).resolve().parents[2]
LONG_CONTEXT = 40_000  # room for the longest typed segment's worst case: 8,192 characters × 4 tokens
REQUEST_BOUND_MIB = 256  # measured 136 (typed), 160 (then the prompt); unchunked, 8,192 tokens took 491
TRACE_BOUND = 32  # × MAX_TRACE_BYTES: measured 25× (500 MB) for the worst shape at 20 MB


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def probe_requests() -> None:
    """In a fresh process: the growth of peak resident memory over a warmed-up member, after the
    longest typed segment the limits allow and then the longest prompt its context allows."""
    tokenizer = byte_bpe_tokenizer()  # one token per byte: a 4-byte character costs 4 tokens
    torch.manual_seed(1)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=1,  # one 32-wide head: attention over 40,000 tokens is most of the time
            num_key_value_heads=1,
            max_position_embeddings=LONG_CONTEXT,
        )
    ).eval()
    for config in (model.config, model.generation_config):
        config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
        config.bos_token_id = None
    member = HFMember("tiny", model, tokenizer, device="cpu")
    config = EnsembleConfig(segment_len=256, max_new_tokens=256, max_rounds=1, prior="prompt")
    ensemble = Ensemble([member], config)
    list(ensemble.stream("warm up", forced="a short segment"))  # every code path once
    base = peak_rss_mib()
    typed = "\U0001d538" * typed_segment_chars(config)  # the largest L's limit, 4 tokens a character
    rounds = list(ensemble.stream("go", forced=typed))
    assert rounds[0].winner.text == typed
    after_typed = peak_rss_mib() - base
    prompt = "x" * (LONG_CONTEXT - config.max_new_tokens - 8)  # the chat template takes 3 more tokens
    assert len(list(ensemble.stream(prompt))) == 1  # prior="prompt": log-probs of every prompt token
    print(
        json.dumps(
            {
                "typed_tokens": len(member.encode(typed)),
                "prompt_tokens": len(member.prompt_ids(prompt)),
                "typed_mib": after_typed,
                "both_mib": peak_rss_mib() - base,
            }
        )
    )


def probe_trace() -> None:
    """In a fresh process: the growth of peak resident memory while a trace upload at the size
    limit is read, in the shape that costs most per byte (millions of empty containers)."""
    head = '{"schema": "specfuse.trace", "version": 2, "rounds": ['
    text = head + "{}," * ((MAX_TRACE_BYTES - len(head) - 4) // 3) + "{}]}"
    assert len(text.encode("utf-8")) <= MAX_TRACE_BYTES
    base = peak_rss_mib()
    with contextlib.suppress(TraceError):
        parse_trace(text)
    print(json.dumps({"bytes": len(text), "trace_mib": peak_rss_mib() - base}))


def run_probe(name: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", f"from tests.engine.test_limits import {name}; {name}()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in kilobytes on Linux")
def test_the_longest_allowed_typed_segment_and_prompt_stay_within_the_memory_bound():
    """Before chunked verification one typed segment of 8,192 tokens grew a tiny model's process by
    491 MiB, growing with the square of its length (the app: 24 GB for 40,000 characters)."""
    probe = run_probe("probe_requests")
    assert probe["typed_tokens"] == 4 * 8192 and probe["prompt_tokens"] > 39_000
    assert probe["typed_mib"] < REQUEST_BOUND_MIB, probe
    assert probe["both_mib"] < REQUEST_BOUND_MIB, probe


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in kilobytes on Linux")
def test_a_trace_upload_at_the_size_limit_stays_within_the_memory_bound():
    probe = run_probe("probe_trace")
    assert probe["trace_mib"] * 2**20 < TRACE_BOUND * MAX_TRACE_BYTES, probe
