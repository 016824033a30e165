"""The Member protocol and HFMember: one Hugging Face causal LM's drafting, scoring and KV cache.

A member is shared by all runs; everything per request (token ids, cache, random generator) lives
in the state object that start() returns. Knows nothing about the other members or the weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from transformers import DynamicCache

from . import drafting
from .config import MemberSettings
from .errors import ConfigError, PromptTooLongError
from .prompts import CHAT, PromptFormat
from .records import Candidate
from .scoring import Block, OutputHead, common_prefix_len, pack, sliding_window_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@runtime_checkable
class Member(Protocol):
    """One model in the ensemble. Its state is opaque to the engine: a KV cache, token ids, anything."""

    name: str
    device: str

    def start(self, prompt: str, settings: MemberSettings) -> Any: ...

    def draft(self, state: Any, max_new_tokens: int) -> Candidate: ...

    def score(self, state: Any, candidates: Sequence[Candidate]) -> list[float]: ...

    def accept(self, state: Any, text: str) -> None: ...


@dataclass
class _PackedPass:
    """What the last verify pass left in the cache beyond the committed tokens, for accept()."""

    texts: tuple[str, ...]  # candidate texts, in block order
    starts: tuple[int, ...]  # anchor position of each block
    text_tokens: tuple[tuple[int, ...], ...]  # tokens of each candidate's text (no end marker)
    offsets: tuple[int, ...]  # where each block begins in the packed tokens
    last_hidden: tuple[torch.Tensor, ...]  # [H] hidden state after each candidate's text
    prefix_len: int  # committed length when the pass ran


@dataclass
class HFState:
    """One request's context in one member: the cache holds exactly `ids` (plus a packed pass)."""

    settings: MemberSettings
    prompt_len: int  # tokens of the formatted prompt
    ids: list[int]  # prompt tokens + the answer's canonical tokens
    answer: str
    cache: DynamicCache
    last_hidden: torch.Tensor  # [H]: final hidden state of ids[-1], predicts the next token
    generator: torch.Generator | None
    packed: _PackedPass | None = field(default=None)


class HFMember:
    """A transformers causal LM as an ensemble member (any architecture, any tokenizer)."""

    def __init__(
        self,
        name: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        prompt_format: PromptFormat = CHAT,
        device: str | None = None,
        reuse_verified_kv: bool = True,
    ) -> None:
        if prompt_format.kind == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"{name}: the tokenizer has no chat template; use a completion prompt format")
        self.name = name
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        self.device = device or str(model.get_input_embeddings().weight.device)
        self.base = model.base_model  # the decoder without its output head
        self.head = OutputHead(model)
        self.dtype: torch.dtype = next(model.get_input_embeddings().parameters()).dtype
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.sliding_window = sliding_window_of(config)
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 1_000_000)
        self.stop_token_ids = frozenset(_stop_token_ids(model, tokenizer))
        self.end_marker = tuple(self._end_marker())
        # Accept the chosen candidate by moving its keys and values from the verify pass into place
        # (False: feed its tokens again, as the reference did; kept for the benchmark's comparison).
        self.reuse_verified_kv = reuse_verified_kv

    def __repr__(self) -> str:
        return f"HFMember({self.name!r}, {type(self.model).__name__}, device={self.device!r})"

    # -- tokens ------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return drafting.encode(self.tokenizer, text)

    def prompt_ids(self, prompt: str) -> list[int]:
        """The member's own context for `prompt`: its chat template, or its completion format."""
        return drafting.prompt_ids(self.tokenizer, self.prompt_format, prompt)

    def _end_marker(self) -> list[int]:
        return drafting.end_marker(self.tokenizer, self.prompt_format, self.stop_token_ids)

    def _decode_after(self, ids: Sequence[int], new: Sequence[int]) -> str:
        return drafting.decode_after(self.decode, ids, new)

    def decode(self, ids: Sequence[int]) -> str:
        return drafting.decode(self.tokenizer, ids)

    # -- the Member protocol -------------------------------------------------------------------------

    @torch.inference_mode()
    def start(self, prompt: str, settings: MemberSettings) -> HFState:
        ids = self.prompt_ids(prompt)
        if not ids:
            raise ConfigError(f"{self.name}: the prompt formats to no tokens")
        if len(ids) + settings.max_new_tokens > self.max_positions:
            raise PromptTooLongError(
                f"{self.name}: the prompt takes {len(ids)} tokens and the answer budget "
                f"{settings.max_new_tokens} more, beyond the model's context of {self.max_positions}; "
                "shorten the prompt or lower max_new_tokens"
            )
        generator = None
        if settings.temperature > 0:
            # Sampling happens where the output head is (with a device map, not always self.device).
            generator = torch.Generator(device=self.head.weight.device).manual_seed(settings.seed)
        cache = DynamicCache()
        hidden = self._forward(ids, cache)
        return HFState(settings, len(ids), ids, "", cache, hidden[-1], generator)

    @torch.inference_mode()
    def draft(self, state: HFState, max_new_tokens: int) -> Candidate:
        began = time.perf_counter()
        self._drop_packed(state)
        stops = (*self.prompt_format.stop_strings, *state.settings.stop_strings)

        def tokens() -> Iterator[int]:  # lazy: each token is computed only when the cut asks for it
            hidden = state.last_hidden
            while True:
                token = self._next_token(hidden, state)
                yield token
                hidden = self._forward([token], state.cache)[-1]

        new, text, final = drafting.cut_draft(
            tokens(),
            max_new_tokens,
            decode=self.decode,
            ids=state.ids,
            stop_ids=self.stop_token_ids,
            stops=stops,
        )
        state.cache.crop(len(state.ids) - state.cache.get_seq_length())
        return Candidate(
            member=self.name,
            text=text,
            num_tokens=self._tokens_in(state.ids, new, text),
            final=final,
            seconds=time.perf_counter() - began,
        )

    @torch.inference_mode()
    def score(self, state: HFState, candidates: Sequence[Candidate]) -> list[float]:
        """Raw scores z_i· of all candidates in one forward pass (verify-in-line)."""
        self._drop_packed(state)
        blocks, text_tokens, scored = [], [], []
        for cand in candidates:
            keep, tokens, tail = drafting.scored_tokens(
                self.encode, state.ids, state.prompt_len, state.answer, cand.text, cand.final, self.end_marker
            )
            blocks.append(Block(start=keep - 1, tokens=(state.ids[keep - 1], *tail)))
            text_tokens.append(tuple(tokens))
            scored.append(tail)
        prefix = len(state.ids)
        packed = pack(blocks, prefix, self.dtype, self.device, self.sliding_window)
        out = self.base(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=packed.attention_mask,
            past_key_values=state.cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state[0]  # [Q, H]
        z, last_hidden = [], []
        for offset, tail, text_ids in zip(packed.offsets, scored, text_tokens):
            rows = hidden[offset : offset + len(tail)]  # row t predicts tail[t]
            targets = torch.tensor(tail, device=rows.device)
            if state.settings.score == "logprob":
                values = self.head.token_logprobs(rows, targets)
            else:
                values = self.head.token_logits(rows, targets)
            z.append(float(values.mean()))
            last_hidden.append(hidden[offset + len(text_ids)])
        state.packed = _PackedPass(
            texts=tuple(c.text for c in candidates),
            starts=tuple(b.start for b in blocks),
            text_tokens=tuple(text_tokens),
            offsets=packed.offsets,
            last_hidden=tuple(last_hidden),
            prefix_len=prefix,
        )
        return z

    @torch.inference_mode()
    def accept(self, state: HFState, text: str) -> None:
        """Append the chosen candidate: re-tokenize the answer and keep the longest common prefix.

        When this member has just verified that candidate, its keys and values already sit in the
        cache (same positions, the packed pass restarted them there): they are moved into place
        instead of being computed again.
        """
        answer = state.answer + text
        target = state.ids[: state.prompt_len] + self.encode(answer)
        packed = state.packed
        if self.reuse_verified_kv and packed is not None and text in packed.texts:
            b = packed.texts.index(text)
            start, tokens = packed.starts[b], packed.text_tokens[b]
            if list(target) == state.ids[: start + 1] + list(tokens):
                source = packed.prefix_len + packed.offsets[b] + 1  # skip the anchor
                for layer in state.cache.layers:
                    for name in ("keys", "values"):
                        kv = getattr(layer, name)
                        moved = kv[..., source : source + len(tokens), :].clone()
                        kv[..., start + 1 : start + 1 + len(tokens), :] = moved
                        setattr(layer, name, kv[..., : start + 1 + len(tokens), :])
                state.last_hidden = packed.last_hidden[b] if tokens else state.last_hidden
                state.ids, state.answer, state.packed = target, answer, None
                return
        self._drop_packed(state)
        keep = min(common_prefix_len(state.ids, target), len(target) - 1)
        state.cache.crop(keep - state.cache.get_seq_length())
        if keep < len(target):
            state.last_hidden = self._forward(target[keep:], state.cache)[-1]
        state.ids, state.answer = target, answer

    # -- internals -----------------------------------------------------------------------------------

    def _drop_packed(self, state: HFState) -> None:
        """Forget a packed pass: crop the cache back to the committed tokens."""
        extra = state.cache.get_seq_length() - len(state.ids)
        if extra:
            state.cache.crop(-extra)
        state.packed = None

    def _tokens_in(self, ids: Sequence[int], new: Sequence[int], text: str) -> int:
        return drafting.tokens_in(self.decode, ids, new, text)

    def _forward(self, ids: Sequence[int], cache: DynamicCache) -> torch.Tensor:
        """Run `ids` after the cache; returns the final hidden states [len(ids), H]."""
        input_ids = torch.tensor([list(ids)], device=self.device)
        out = self.base(input_ids=input_ids, past_key_values=cache, use_cache=True)
        return out.last_hidden_state[0]

    def _next_token(self, hidden: torch.Tensor, state: HFState) -> int:
        logits = self.head.logits(hidden)  # [V], float32
        settings = state.settings
        if settings.temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits / settings.temperature, dim=-1)
        if settings.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs >= settings.top_p  # keep the first past p
            sorted_probs[outside] = 0.0
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=state.generator))


def _stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """End-of-sequence and end-of-turn tokens, from the model's own tokenizer and generation config."""
    gen = getattr(model, "generation_config", None)
    return drafting.stop_token_ids(tokenizer, getattr(gen, "eos_token_id", None))
