"""Token-level rules every member shares, wherever its model runs: the context, the draft's cut, the
stop and end-marker tokens, and which tokens a verifier scores for a candidate.

Pure functions over token ids, a tokenizer and callables: no model, no network. HFMember (hf/),
LlamaCppMember (llamacpp/) and RemoteMember (remote/) all draft and score through them, so a model
behaves the same in-process and behind an inference server; TokenState is the part of a request's
state they all keep alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import MemberSettings
from ..errors import ConfigError
from ..prompts import Prompt, PromptFormat, last_user_text
from ..records import Confidence
from ..segments import REPLACEMENT, cut_at_stop, trim_to_word_boundary
from . import templates

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Text a member's two tokenizers must read alike (a served or llama.cpp model's, and transformers').
PROBE_TEXT = "Hello, world! Numbers 12345, symbols {}[]<>, accents éàü, 漢字 and emoji 🙂.\n  indented"

# A draft that ends inside a multi-byte character may run this many tokens past L to finish it.
UTF8_GRACE_TOKENS = 4

Decode = Callable[[Sequence[int]], str]


@dataclass
class TokenState:
    """One request's context in one member, as every back end keeps it: its settings, its tokens
    and the answer's text so far. A back end's state (HFState, LlamaState, RemoteState) adds what
    its own context needs (a KV cache, a slot, a server's reading), after these fields."""

    settings: MemberSettings
    prompt_len: int  # tokens of the formatted prompt
    ids: list[int]  # prompt tokens + the answer's canonical tokens
    answer: str


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text` (an answer, a candidate) as text: a control token's text in it is never the control
    token (templates.text_ids); any other text gets exactly the tokenizer's ids."""
    return templates.text_ids(tokenizer, text)


def encode_many(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """encode() of each of `texts`, in one call of the tokenizer."""
    return templates.texts_ids(tokenizer, texts)


def decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))


def prompt_ids(tokenizer: PreTrainedTokenizerBase, fmt: PromptFormat, prompt: Prompt) -> list[int]:
    """A member's own context for `prompt` (a conversation, or a string: one user message): its chat
    template, or its completion format. The messages' text is text, never template control
    (templates.py); a string holding no control token's text gets the ids it always had."""
    if fmt.kind == "chat":
        return templates.chat_ids(tokenizer, fmt.messages(prompt))
    return templates.completion_ids(tokenizer, fmt.completion(prompt))


def raw_context(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The context of a text scored as plain text (MemberSettings.raw, the API's echo): the prefix
    token alone, BOS, or EOS for a tokenizer without one (as lm-eval's own models do), so that the
    text's first token is scored too."""
    token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if token is None:
        raise ConfigError("the tokenizer has neither a BOS nor an EOS token to begin a plain text with")
    return [int(token)]


def template_head(tokenizer: PreTrainedTokenizerBase, fmt: PromptFormat) -> list[int]:
    """The tokens every prompt's context begins with: the common beginning of two probes' contexts,
    less its last token, which a prompt's first characters could merge with."""
    a, b = prompt_ids(tokenizer, fmt, "a"), prompt_ids(tokenizer, fmt, "Z 1")
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[: max(0, n - 1)]


def prompt_span(
    tokenizer: PreTrainedTokenizerBase, fmt: PromptFormat, prompt: Prompt, ids: Sequence[int]
) -> tuple[list[int], int] | None:
    """The positions in `ids` (the member's context for `prompt`) of the tokens that spell the last
    user turn's text (the question), and their UTF-8 bytes: what a member's surprise at the prompt is
    measured on (the chat template's own tokens and the earlier turns say nothing about the
    question). None where they cannot be told apart (a message holding a control token's text)."""
    question = last_user_text(prompt)
    if fmt.kind == "chat":
        text, special = templates.chat_text(tokenizer, fmt.messages(prompt)), False
    else:
        text, special = fmt.completion(prompt), True
    where = text.rfind(question)
    if where < 0:
        return None
    enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(ids):
        return None
    offsets = enc["offset_mapping"]
    inside = [
        t for t, (a, b) in enumerate(offsets) if t > 0 and a >= where and b <= where + len(question) and b > a
    ]
    if not inside:
        return None
    return inside, sum(len(text[a:b].encode("utf-8")) for a, b in (offsets[t] for t in inside))


def end_marker(tokenizer: PreTrainedTokenizerBase, fmt: PromptFormat, stop_ids: Iterable[int]) -> list[int]:
    """What a member would emit after a finished answer: its end-of-turn token (chat), or its first
    stop string (completion). Appended to a final candidate when scoring it, so a verifier also
    judges whether the answer should end there."""
    if fmt.kind == "completion" and fmt.stop_strings:  # the format's own text, not a user's
        return templates.plain_ids(tokenizer, fmt.stop_strings[0])
    eos = tokenizer.eos_token_id
    stops = list(stop_ids)
    if eos is None and stops:
        eos = min(stops)
    return [eos] if eos is not None else []


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, generation_eos: Any = None) -> set[int]:
    """End-of-sequence and end-of-turn tokens, from the tokenizer and the generation config's eos.

    Any special token ends a draft too: a chat model that emits a role or turn marker has finished
    its turn (SpecEM: the reference hard-coded stop tokens per model family).
    """
    ids: set[int] = set()
    for source in (generation_eos, tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(t) for t in source)
    ids.update(int(t) for t in tokenizer.all_special_ids)
    for special in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"):
        token = tokenizer.convert_tokens_to_ids(special)
        if isinstance(token, int) and tokenizer.convert_ids_to_tokens(token) == special:
            ids.add(token)
    return ids


def decode_after(decode: Decode, ids: Sequence[int], new: Sequence[int], before: str | None = None) -> str:
    """The text that `new` adds after `ids`, decoded in context.

    Decoding a slice alone can drop a leading space (SentencePiece decoders strip it at the start of
    a text), so the last committed tokens are decoded with it and their text removed (`before`: their
    text, where the caller has it already).
    """
    tail = list(ids[-2:])
    before = decode(tail) if before is None else before
    both = decode(tail + list(new))
    if tail and both.startswith(before) and not before.endswith(REPLACEMENT):
        return both[len(before) :]
    return decode(new)


def tokens_in(decode: Decode, ids: Sequence[int], new: Sequence[int], text: str) -> int:
    """How many of the drafted tokens `new` make up `text` (a prefix of their decode)."""
    count = len(new)
    while count > 0 and len(decode_after(decode, ids, new[:count])) > len(text):
        count -= 1
    return count


class DraftCut:
    """Decide, token by token, where a candidate ends (the rules of SPEC.md §1).

    The draft ends at a stop token or a stop string (final), or after `max_new_tokens`, running up
    to UTF8_GRACE_TOKENS further to finish a multi-byte character; a non-final text is then trimmed
    back to a word boundary. A member feeds tokens one at a time with push() until it says no more,
    so several requests can be drafted in lockstep, each with its own cut.
    """

    def __init__(
        self,
        max_new_tokens: int,
        *,
        decode: Decode,
        ids: Sequence[int],
        stop_ids: frozenset[int] | set[int],
        stops: Sequence[str],
    ) -> None:
        self.decode, self.ids, self.stop_ids, self.stops = decode, ids, stop_ids, stops
        # The committed tokens' text that decode_after sets the draft's after: the same for every
        # token pushed, so decoded once (a decode a token, not two).
        self.before = decode(list(ids[-2:]))
        self.budget = self.limit = max(0, max_new_tokens)
        self.new: list[int] = []
        self.text, self.final = "", False
        self.wants_more = self.limit > 0

    def push(self, token: int) -> bool:
        """Take the next drafted token; whether the draft wants another one after it."""
        if token in self.stop_ids:
            self.final, self.wants_more = True, False
            return False
        self.new.append(token)
        text = decode_after(self.decode, self.ids, self.new, self.before)
        cut = cut_at_stop(text, self.stops)
        if cut is not None:
            self.text, self.final, self.wants_more = text[:cut], True, False
            return False
        self.text = text
        if (
            len(self.new) == self.limit
            and text.endswith(REPLACEMENT)
            and self.limit < self.budget + UTF8_GRACE_TOKENS
        ):
            self.limit += 1  # finish the multi-byte character the last token began
        self.wants_more = len(self.new) < self.limit
        return self.wants_more

    def result(self) -> tuple[list[int], str, bool]:
        """(new tokens, text, final). Past the grace tokens a trailing U+FFFD is an invalid byte the
        model really emitted (random weights do), not a character still arriving: it stays, as the
        valid text U+FFFD."""
        text = self.text if self.final else trim_to_word_boundary(self.text)
        return self.new, text, self.final


def confidence(logprobs: Sequence[float], runner_up: Sequence[float]) -> Confidence | None:
    """A segment's Confidence (the gated round's, engine/gate.py) from each of its tokens'
    log-probability and the log-probability of the likeliest other token there; None for no tokens."""
    if len(logprobs) != len(runner_up):
        raise ValueError(f"{len(logprobs)} log-probabilities but {len(runner_up)} runner-ups")
    if not logprobs:
        return None
    return Confidence(
        mean_logprob=sum(logprobs) / len(logprobs),
        min_prob=math.exp(min(logprobs)),
        margin=min(lp - other for lp, other in zip(logprobs, runner_up)),
        tokens=len(logprobs),
    )


def kept_values(
    values: Sequence[tuple[float, float]], reused: int, kept: int, decoded: int, final: bool
) -> list[tuple[float, float]]:
    """The (log-probability, runner-up's log-probability) of the drafted tokens a candidate keeps:
    `values` holds one per token decoded this draft (the end marker's too, when a stop token ended
    it), after `reused` tokens taken over unscored from the last draft; `kept` of the draft's
    `decoded` tokens (the reused ones included) make up the trimmed text. A final draft's end marker
    counts: the drafter was sure the answer ends there too."""
    out = list(values[: max(0, kept - reused)])
    if final and len(values) > decoded - reused:
        out.append(values[-1])
    return out


def cut_draft(
    tokens: Iterable[int],
    max_new_tokens: int,
    *,
    decode: Decode,
    ids: Sequence[int],
    stop_ids: frozenset[int] | set[int],
    stops: Sequence[str],
) -> tuple[list[int], str, bool]:
    """Read drafted tokens one by one and decide where the candidate ends: (new tokens, text, final).

    `tokens` is consumed lazily (a remote member hands over what its server generated); see DraftCut.
    """
    cut = DraftCut(max_new_tokens, decode=decode, ids=ids, stop_ids=stop_ids, stops=stops)
    for token in tokens:
        if not cut.push(token):
            break
    return cut.result()


def scored_tokens(
    encode: Callable[[str], list[int]],
    ids: Sequence[int],
    prompt_len: int,
    answer: str,
    text: str,
    final: bool,
    marker: Sequence[int],
) -> tuple[int, list[int], list[int]]:
    """What a verifier scores for one candidate, as (keep, text tokens, scored tokens).

    The answer plus the candidate is re-tokenized; the context is `ids[:keep]` (the longest common
    prefix with the committed tokens), the candidate is the rest, and a final candidate also gets
    the verifier's end marker. Each scored token is predicted by the token before it.
    """
    return scored_in(encode(answer + text), ids, prompt_len, final, marker)


def scored_in(
    full: Sequence[int], ids: Sequence[int], prompt_len: int, final: bool, marker: Sequence[int]
) -> tuple[int, list[int], list[int]]:
    """scored_tokens, given the answer plus the candidate already tokenized (`full`)."""
    answer_ids = ids[prompt_len:]
    full = list(full)
    keep = prompt_len + common_prefix_len(full, answer_ids)
    tokens = full[keep - prompt_len :]  # the candidate as this verifier reads it in context
    tail = tokens + (list(marker) if final else [])
    if not tail:  # an empty non-final candidate has nothing to score
        tail = list(marker)[:1] or [ids[-1]]
    return keep, tokens, tail


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
