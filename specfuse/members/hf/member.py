"""HFMember: one Hugging Face causal LM in this process, its drafting, scoring and KV cache.

A member is shared by all runs; everything per request (token ids, cache, random generator) lives
in the state object that start() returns (HFState, state.py). Knows nothing about the other
members or the weights. This module holds the model and the contexts: loading a member, reading
prompts into their caches (start, start_many), committing the chosen text (accept) and the forward
passes they share; its drafting (drafting.py) and its verification (verifying.py) are mixins
HFMember inherits, each in a module of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ...config import MemberSettings
from ...errors import ConfigError, MemberError, PromptTooLongError, SpecfuseError
from ...prompts import CHAT, Prompt, PromptFormat
from .. import drafting, profiling
from ..drafting import common_prefix_len
from ..protocol import BaseMember
from . import compiled, prefill, slot_verify, slots
from .drafting import Drafting
from .scoring import CHUNK_TOKENS, OutputHead, sliding_window_of
from .state import HFState, Reading
from .verifying import Verifying

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


class HFMember(Drafting, Verifying, BaseMember):
    """A transformers causal LM as an ensemble member (any architecture, any tokenizer), in this process."""

    def __init__(
        self,
        name: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        prompt_format: PromptFormat = CHAT,
        device: str | None = None,
        reuse_verified_kv: bool = True,
        reuse_trimmed: bool = True,
        reuse_template: bool = True,
        trust: float | None = None,
        compile_decode: bool = False,
        decode: str = "auto",
    ) -> None:
        if prompt_format.kind == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"{name}: the tokenizer has no chat template; use a completion prompt format")
        self.name = name
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        self.device = device or str(model.get_input_embeddings().weight.device)
        self.parameters = float(model.num_parameters())  # the size workers divide a CPU's cores by
        self.base = model.base_model  # the decoder without its output head
        profiling.count_forward(self.base, name)
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
        # Take over the tokens a won-but-trimmed greedy draft decoded past its word boundary, instead
        # of decoding them again (False: redraft them, for the benchmark's comparison and the tests).
        self.reuse_trimmed = reuse_trimmed
        # Start each prompt's cache from the keys and values of the template's head, read once
        # (prefill.Head; False: read every prompt whole, for the benchmark's comparison and the tests).
        self.reuse_template = reuse_template
        self._head: prefill.Head | None = None
        # Query tokens per forward pass in verification and prefill (scoring.CHUNK_TOKENS: memory
        # linear in a long candidate's or prompt's length); tests lower it to chunk short texts.
        self.chunk_tokens = CHUNK_TOKENS
        self.pieces: dict[int, str] = {}  # each token's own text (Verifying._piece): at most the vocabulary
        # The say this member starts with under prior="trust" (the catalogue's or a trust file's, from
        # evidence); None: unknown, and it starts with the mean of the others' (feedback.trust_weights).
        self.trust = trust
        # Drafts of one request decode in a static cache with a compiled step (compiled.py; opt in).
        self.compiled = compiled.CompiledDecoder(self) if compile_decode else None
        # Drafts of every batch decode on static KV slots, captured as CUDA graphs on a GPU
        # (slots.py; decode "auto": on a GPU only), else eagerly in a stacked cache.
        self.decode_mode = decode
        self.slots: slots.SlotStore | None = None
        if slots.resolved(decode, self.device) == "graphs":
            unsupported = compiled.unsupported(self)
            self.slots = slots.SlotStore(self, unsupported=unsupported, verifier=slot_verify.step)

    def __repr__(self) -> str:
        return f"HFMember({self.name!r}, {type(self.model).__name__}, device={self.device!r})"

    def sharing(self, name: str) -> HFMember:
        """Another member called `name` on this model's weights, with caches of its own: a model
        listed twice, sampled with another seed, costs its memory once."""
        return HFMember(
            name,
            self.model,
            self.tokenizer,
            prompt_format=self.prompt_format,
            device=self.device,
            compile_decode=self.compiled is not None,
            decode=self.decode_mode,
        )

    # -- tokens ------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return drafting.encode(self.tokenizer, text)

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return drafting.encode_many(self.tokenizer, texts)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The member's own context for `prompt` (a conversation, or a string: one user message): its
        chat template, or its completion format; the messages' text never read as control tokens."""
        try:
            return drafting.prompt_ids(self.tokenizer, self.prompt_format, prompt)
        except ConfigError as e:
            raise type(e)(f"{self.name}: {e}") from None

    def _end_marker(self) -> list[int]:
        return drafting.end_marker(self.tokenizer, self.prompt_format, self.stop_token_ids)

    def _decode_after(self, ids: Sequence[int], new: Sequence[int]) -> str:
        return drafting.decode_after(self.decode, ids, new)

    def decode(self, ids: Sequence[int]) -> str:
        return drafting.decode(self.tokenizer, ids)

    # -- the Member protocol -------------------------------------------------------------------------

    def start(self, prompt: Prompt, settings: MemberSettings) -> HFState:
        (state,) = self.start_many([prompt], [settings])
        if isinstance(state, SpecfuseError):
            raise state
        return state

    @torch.inference_mode()
    def start_many(
        self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]
    ) -> list[HFState | SpecfuseError]:
        """Start several requests, their prompts read together (prefill.py: right-padded rows, one
        forward pass per chunk for a group of similar lengths); each request gets the state start()
        gives it alone. A prompt that cannot start (empty, too long) is that request's error only."""
        out = self.open_many(prompts, settings)
        ready = [(i, state) for i, state in enumerate(out) if isinstance(state, HFState)]
        return self._read_whole(out, ready, prompts)

    def open_many(
        self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]
    ) -> list[HFState | SpecfuseError]:
        """Requests' states, their prompts' tokens checked (empty, too long), nothing read yet."""
        out: list[HFState | SpecfuseError] = []
        for prompt, s in zip(prompts, settings):
            try:
                out.append(self._begin(prompt, s))
            except Exception as e:
                out.append(self._failed(e))
        return out

    @torch.inference_mode()
    def prefill_many(self, states: Sequence[HFState], budget: int) -> list[bool]:
        """Read at most `budget` more prompt tokens in all, the first request's first: a prompt read
        whole in this call goes with the others so read (together, as start_many reads them), the
        rest a part each, after the part already in its cache."""
        left, whole, prompts = budget, [], []
        for state in states:
            if state.reading is None or left <= 0:
                continue
            need = len(state.ids) - state.reading.done
            take = min(need, left)
            left -= take
            if state.reading.done == 0 and take == need:
                whole.append(state)
                prompts.append(state.reading.prompt)
            else:
                self._read_part(state, take)
        out: list[HFState | SpecfuseError] = list(whole)
        errors = [
            e for e in self._read_whole(out, list(enumerate(whole)), prompts) if isinstance(e, SpecfuseError)
        ]
        if errors:
            raise errors[0]
        return [state.reading is None for state in states]

    def _read_part(self, state: HFState, take: int) -> None:
        """Read the prompt's next `take` tokens into the request's cache (the first part after the
        template's head, when the prompt begins with it: read once for every request)."""
        reading = state.reading
        assert reading is not None
        measure = state.settings.measure_prompt
        if reading.done == 0:
            head = self._template_head([state])
            state.cache = self._fresh_cache(head)
            if head is not None:
                reading.done = len(head.ids)
                reading.hidden += [head.hidden] if measure else []
        end = min(len(state.ids), reading.done + take)
        (hidden,) = self._read_after([state.cache], [state.ids[reading.done : end]])
        reading.done = end
        reading.hidden += [hidden] if measure else []
        if end < len(state.ids):
            return
        state.last_hidden = hidden[-1].clone()
        if measure:
            state.surprise = self._surprise(reading.prompt, state.ids, torch.cat(reading.hidden))
        state.reading = None

    def _read_whole(
        self,
        out: list[HFState | SpecfuseError],
        ready: Sequence[tuple[int, HFState]],
        prompts: Sequence[Prompt],
    ) -> list[HFState | SpecfuseError]:
        """Read the `ready` states' prompts whole (out[i] is state i's; a failure replaces it there)."""
        for group in prefill.groups([len(state.ids) for _, state in ready], self.chunk_tokens):
            rows = [ready[g] for g in group]
            try:
                self._prefill([state for _, state in rows], [prompts[i] for i, _ in rows])
            except Exception as e:
                if len(rows) == 1:
                    out[rows[0][0]] = self._failed(e)
                    continue
                # A batch that failed (out of memory?): each prompt alone, so that one fails alone.
                log.warning(
                    "%s: prefill of %d prompts at once failed (%s): one at a time", self.name, len(rows), e
                )
                for i, state in rows:
                    try:
                        self._prefill([state], [prompts[i]])
                    except Exception as alone:
                        out[i] = self._failed(alone)
        return out

    def _failed(self, error: Exception) -> SpecfuseError:
        """A request's error from start: ours as it is, anything else named as a failed call is."""
        if isinstance(error, SpecfuseError):
            return error
        named = MemberError(f"{self.name}: start failed: {type(error).__name__}: {error}")
        named.__cause__ = error
        return named

    def _begin(self, prompt: Prompt, settings: MemberSettings) -> HFState:
        """A request's state before its prompt is read: the prompt's tokens, checked, and its generator."""
        ids = drafting.raw_context(self.tokenizer) if settings.raw else self.prompt_ids(prompt)
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
        state = HFState(settings, len(ids), ids, "", DynamicCache(), torch.empty(0), generator)
        state.reading = Reading(prompt)
        return state

    def _prefill(self, states: Sequence[HFState], prompts: Sequence[Prompt]) -> None:
        """Read the prompts of `states` (one group) into their caches: alone as start() always did,
        or together, then each row split into its own cache."""
        head = self._template_head(states)
        skip = len(head.ids) if head is not None else 0
        if len(states) == 1 or self._prompt_slots() is not None:
            # Fresh caches, also after a failed batch; on the slots, read together there.
            for state in states:
                state.cache = self._fresh_cache(head)
            hiddens = self._read_after([s.cache for s in states], [s.ids[skip:] for s in states])
        else:
            pad = self.tokenizer.pad_token_id or 0
            cache, batch = prefill.forward_rows(
                self.base, [s.ids[skip:] for s in states], self.chunk_tokens, self.device, pad, head
            )
            lengths = [len(s.ids) for s in states]
            for state, own in zip(states, prefill.split(cache, lengths)):
                state.cache = own
            hiddens = [batch[b, : n - skip] for b, n in enumerate(lengths)]
        if head is not None:
            hiddens = [torch.cat([head.hidden, hidden]) for hidden in hiddens]
        for state, prompt, hidden in zip(states, prompts, hiddens):
            state.reading = None
            state.last_hidden = hidden[-1].clone()  # not a view that keeps the batch's states alive
            if state.settings.measure_prompt and not state.settings.raw:
                state.surprise = self._surprise(prompt, state.ids, hidden)

    def _fresh_cache(self, head: prefill.Head | None) -> DynamicCache:
        """A cache to read a prompt into: the template's head, or nothing (on the slots, its layers
        shaped like theirs, so that the prompt is read there from its first token)."""
        if head is not None:
            return head.cache()
        store = self._prompt_slots()
        empty = prefill.empty(store) if store is not None else None
        return empty if empty is not None else DynamicCache()

    def _prompt_slots(self) -> slots.SlotStore | None:
        """The KV slots prompts are read on, once they exist (a GPU's are made at start-up,
        prepare_steps, after the warm-up's own prompt is read eagerly; a CPU's at the first draft);
        None: read eagerly."""
        store = self.slots
        return store if store is not None and store.prefill and store.layers else None

    def _read_after(
        self, caches: Sequence[DynamicCache], rows: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        """Each row's tokens read after its cache: on the KV slots where this member drafts there
        (prefill.on_slots: in verification steps, captured on a GPU), else eagerly one by one; their
        final hidden states."""
        store = self._prompt_slots()
        if store is not None:
            return prefill.on_slots(store, caches, rows, self.hidden_states)
        return [self.hidden_states(row, cache) for row, cache in zip(rows, caches)]

    def _template_head(self, states: Sequence[HFState]) -> prefill.Head | None:
        """The template's head (read the first time it is asked for), if every context begins with it."""
        if self.reuse_template and self._head is None:
            ids = drafting.template_head(self.tokenizer, self.prompt_format)
            self._head = prefill.read_head(ids, self.hidden_states)
        head = self._head
        return head if head is not None and all(head.covers(s.ids) for s in states) else None

    def prompt_surprise(self, state: HFState) -> float | None:
        """How surprised this member was by the prompt's own text, in nats per byte (None: not
        measured). Bytes, not tokens, so that members with different tokenizers compare."""
        return state.surprise

    @torch.inference_mode()
    def accept(self, state: HFState, text: str) -> None:
        """Append the chosen candidate: re-tokenize the answer and keep the longest common prefix.

        When this member has just verified that candidate, its keys and values already sit in the
        cache (same positions, the packed pass restarted them there): they are moved into place
        instead of being computed again (verifying.py).
        """
        answer = state.answer + text
        packed = state.packed  # the verification tokenized the answer with each candidate: not again
        if packed is not None and text in packed.texts:
            encoded = list(packed.encoded[packed.texts.index(text)])
        else:
            encoded = self.encode(answer)
        target = state.ids[: state.prompt_len] + encoded
        if self.reuse_verified_kv and self._move_verified(state, text, target):
            state.ids, state.answer, state.packed = target, answer, None
            return
        self._drop_packed(state)
        if len(target) > self.max_positions:  # a branch's answer from a trace is never verified here
            raise PromptTooLongError(
                f"{self.name}: the prompt and the answer take {len(target)} tokens, beyond the model's "
                f"context of {self.max_positions}; branch at an earlier round or shorten the prompt"
            )
        keep = min(common_prefix_len(state.ids, target), len(target) - 1)
        state.cache.crop(keep - state.cache.get_seq_length())
        if keep < len(target):
            state.last_hidden = self.hidden_states(target[keep:], state.cache)[-1]
        state.ids, state.answer = target, answer

    def prepare_steps(self, state: HFState, progress: Callable[[float, str], None]) -> None:
        """Capture every step of the KV slots now, where they are captured as CUDA graphs (a GPU),
        each said through `progress` (models.preparation.warm_up; `state`: a started request whose
        cache the store is shaped after). Elsewhere nothing: steps run uncaptured as they come."""
        store = self.slots
        if store is not None and store.capture and not store.capture_off and not store.disabled:
            store.prepare(state.cache, progress)

    # -- internals -----------------------------------------------------------------------------------

    def hidden_states(self, ids: Sequence[int], cache: DynamicCache) -> torch.Tensor:
        """Run `ids` after the cache, chunk_tokens at a time (memory linear in a long prompt's
        length); returns the final hidden states [len(ids), H]."""
        parts = []
        for begin in range(0, len(ids), self.chunk_tokens):
            input_ids = torch.tensor([list(ids[begin : begin + self.chunk_tokens])], device=self.device)
            out = self.base(input_ids=input_ids, past_key_values=cache, use_cache=True)
            parts.append(out.last_hidden_state[0])
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _stacked_cache(self, states: Sequence[HFState]) -> tuple[DynamicCache, list[int]]:
        """One cache for a batch of requests: each row left-padded to the longest (the pads are
        masked out). A single request uses its own cache as it is."""
        if len(states) == 1:
            return states[0].cache, [0]
        longest = max(len(s.ids) for s in states)
        pads = [longest - len(s.ids) for s in states]
        data = []
        for layer in range(len(states[0].cache.layers)):
            pair = []
            for name in ("keys", "values"):
                parts = [getattr(s.cache.layers[layer], name) for s in states]  # [1, Hkv, T_b, D]
                pair.append(
                    torch.cat(
                        [torch.nn.functional.pad(t, (0, 0, pad, 0)) for t, pad in zip(parts, pads)], dim=0
                    )
                )
            data.append((pair[0], pair[1]))
        return DynamicCache(data), pads

    def _surprise(self, prompt: Prompt, ids: Sequence[int], hidden: torch.Tensor) -> float | None:
        """Mean negative log-likelihood per byte of the tokens that spell the question (the last user
        turn) itself."""
        span = drafting.prompt_span(self.tokenizer, self.prompt_format, prompt, ids)
        if span is None:
            return None
        inside, spelled = span
        rows = hidden[[t - 1 for t in inside]]  # row t-1 predicts token t
        targets = torch.tensor([ids[t] for t in inside], device=rows.device)
        nll = -float(self.head.token_logprobs(rows, targets).sum())
        return nll / max(1, spelled)


def _stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """End-of-sequence and end-of-turn tokens, from the tokenizer and the model's generation config."""
    gen = getattr(model, "generation_config", None)
    return drafting.stop_token_ids(tokenizer, getattr(gen, "eos_token_id", None))


__all__ = ["HFMember", "HFState"]
