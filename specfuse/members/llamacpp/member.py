"""A GGUF model run by llama.cpp in this process (llama-cpp-python), behind `Member`.

transformers dequantizes a GGUF file to bf16 or fp32, so each decoding step reads 4-8x the bytes the
file holds; llama.cpp computes with the file's own 4-bit blocks. Tokens, drafting cuts and scored
tokens go through the same functions as HFMember and RemoteMember (drafting.py), with the model's
own tokenizer from transformers (checked once against llama.cpp's); llama.cpp only turns token ids
into logits, so a model drafts and scores alike in every back end, raw logits included.

One llama.cpp context per member holds a unified KV cache shared by sequences: SLOTS of them keep
recent requests' contexts (a request finds its prefix there, as llama-server's slots do) and the
rest hold candidates during a verify pass, each a copy of the context's cells (shared, not copied
bytes) plus its own tokens, all candidates of all requests in one batch. Drafting runs the requests
in lockstep, one token per request per decode call. The slots, the candidate sequences and the
decode calls are decode.py's, verification verifying.py's (mixins this member inherits); the
library, the model's weights and their description library.py's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...config import MemberSettings
from ...errors import ConfigError, ModelLoadError, PromptTooLongError
from ...prompts import CHAT, Prompt, PromptFormat
from ...records import Candidate
from .. import drafting
from ..drafting import common_prefix_len
from ..protocol import BaseMember, each_request
from ..workers import cpu_cores
from .decode import (
    BATCH_TOKENS,
    SCORE_SEQUENCES,
    Item,
    LlamaState,
    logit_and_logprob,
    pick,
    token_and_runner_up,
)
from .library import LlamaModel, llama_cpp_kernels, llama_cpp_module, model_dtype
from .verifying import LlamaVerifying

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SLOTS = 16  # requests whose contexts stay in the KV cache between calls (the evaluation batches 16)
CONTEXT_TOKENS = 16384  # KV cells shared by all sequences (0.2-0.4 GB per member here, f16)

log = logging.getLogger(__name__)


class LlamaCppMember(LlamaVerifying, BaseMember):
    """A GGUF file's model in llama.cpp, on this machine's CPU, as an ensemble member."""

    def __init__(
        self,
        name: str,
        path: str | Path,
        tokenizer: PreTrainedTokenizerBase,
        *,
        prompt_format: PromptFormat = CHAT,
        generation_eos: Any = None,
        context_tokens: int = CONTEXT_TOKENS,
        slots: int = SLOTS,
        ubatch_tokens: int = BATCH_TOKENS,
        weights: LlamaModel | None = None,
        share_prefixes: bool = True,
    ) -> None:
        """`ubatch_tokens`: llama.cpp's inner batch. Its CPU kernels change with the batch's size (at
        64 tokens here), and with them the rounding: a request's logits then depend on what shares
        its batch. Below 64, batched requests get exactly their solo logits, but slower passes.
        `weights`: another member's loaded model, shared (a model listed twice: see sharing()).
        `share_prefixes`: a verify pass decodes the tokens that candidates begin with alike once, in
        all their sequences (candidate_items); False: every candidate's own, for the comparison."""
        if prompt_format.kind == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"{name}: the tokenizer has no chat template; use a completion prompt format")
        lib = self.lib = llama_cpp_module()
        if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
            # llama.cpp's CPU threads are OpenMP's: passive ones sleep at each of the hundreds of
            # barriers in a token's graph (SmolLM2 alone: 22 ms per token instead of 4.8 here).
            log.warning("%s: OMP_WAIT_POLICY=PASSIVE makes llama.cpp decode about 4x slower; unset it", name)
        self.name = name
        self.path = Path(path)
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        self.generation_eos = generation_eos
        self.stop_token_ids = frozenset(drafting.stop_token_ids(tokenizer, generation_eos))
        self.end_marker = tuple(drafting.end_marker(tokenizer, prompt_format, self.stop_token_ids))
        self.slots = slots
        self.share_prefixes = share_prefixes
        self.threads = cpu_cores()  # all of this process's cores unless a run gives it a share
        # Three members on two cores (`bench serve --profile`, docs/serve.md): on AVX2 kernels, in
        # turns with both cores each served 1.08-1.09x what they did at once on one core each at 8
        # clients (three alternated pairs); on AVX-512 kernels at once was 1.09x at one client and
        # even at eight, so they stay at once there.
        self.cpu_turns = llama_cpp_kernels() != "AVX-512"
        self.weights = weights or LlamaModel(lib, name, self.path)
        self.model = self.weights.pointer
        self._make_context(context_tokens, ubatch_tokens)
        self._read_model()
        self.cached: list[list[int]] = [[] for _ in range(slots)]  # the tokens in each slot's cells
        self.last_used = [0.0] * slots
        self.lock = threading.Lock()  # one call at a time: a llama.cpp context is not thread-safe
        self.generation = 0  # bumped whenever the candidate sequences are emptied
        self._threads_now = self.threads
        self._check_tokenizer()

    def _make_context(self, context_tokens: int, ubatch_tokens: int) -> None:
        """This member's llama.cpp context: one unified KV cache for its slots and a verify pass's
        candidate sequences, and the batch its decode calls fill."""
        lib = self.lib
        params = lib.llama_context_default_params()
        params.n_ctx = context_tokens
        params.n_batch = BATCH_TOKENS
        params.n_ubatch = min(ubatch_tokens, BATCH_TOKENS)
        params.n_seq_max = self.slots + SCORE_SEQUENCES
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = True  # candidates share their context's cells instead of copies
        params.swa_full = True  # sliding-window layers keep every cell, so a prefix can be reused
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise ModelLoadError(
                f"{self.name}: llama.cpp could not make a context of {context_tokens} tokens"
            )
        # A verify pass's token may begin several candidates at once: it then belongs to their sequences.
        self.batch = lib.llama_batch_init(BATCH_TOKENS, 0, SCORE_SEQUENCES)
        # The finalizer holds the weights, so that the model is freed after this context, not before.
        weakref.finalize(self, _free, lib, self.batch, self.ctx, self.weights)
        self.memory = lib.llama_get_memory(self.ctx)

    def _read_model(self) -> None:
        """What the model and its context say of themselves: vocabulary, context, size, kind."""
        lib = self.lib
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.context_tokens = int(lib.llama_n_ctx(self.ctx))
        self.trained_context = int(lib.llama_model_n_ctx_train(self.model))
        self.parameters = float(lib.llama_model_n_params(self.model))
        # Bytes a decoding step reads: every tensor once (the catalogue's models tie their output head
        # to the embedding table, so a step does read all of it; an untied table is overcounted).
        self.bytes_per_token = int(lib.llama_model_size(self.model))
        self.device = "cpu"
        self.dtype = model_dtype(lib, self.model)

    def __repr__(self) -> str:
        return f"LlamaCppMember({self.name!r}, {str(self.path)!r})"

    def sharing(self, name: str) -> LlamaCppMember:
        """Another member called `name` on these weights, with a context of its own: a model listed
        twice, sampled with another seed, costs its weights once."""
        return LlamaCppMember(
            name,
            self.path,
            self.tokenizer,
            prompt_format=self.prompt_format,
            generation_eos=self.generation_eos,
            context_tokens=self.context_tokens,
            slots=self.slots,
            weights=self.weights,
            share_prefixes=self.share_prefixes,
        )

    def encode(self, text: str) -> list[int]:
        return drafting.encode(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        return drafting.decode(self.tokenizer, ids)

    def _check_tokenizer(self) -> None:
        """llama.cpp and the transformers tokenizer must give the same ids, or every score is wrong."""
        text = drafting.PROBE_TEXT.encode()
        buffer = (self.lib.llama_token * (4 * len(text) + 8))()
        n = self.lib.llama_tokenize(self.vocab, text, len(text), buffer, len(buffer), False, True)
        theirs, ours = list(buffer[: max(n, 0)]), self.encode(drafting.PROBE_TEXT)
        if theirs != ours:
            raise ModelLoadError(
                f"{self.name}: llama.cpp tokenizes {self.path.name} differently from its transformers "
                f"tokenizer (first difference at token {common_prefix_len(theirs, ours)})"
            )

    def set_threads(self, threads: int) -> None:
        self.threads = max(1, threads)

    # -- the Member protocol -------------------------------------------------------------------------

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The member's own context for `prompt` (a conversation, or a string: one user message): the
        tokenizer's chat template (transformers reads the GGUF file's own) or its completion format,
        the messages' text never read as control tokens; llama.cpp is given the ids."""
        try:
            return drafting.prompt_ids(self.tokenizer, self.prompt_format, prompt)
        except ConfigError as e:
            raise type(e)(f"{self.name}: {e}") from None

    def start(self, prompt: Prompt, settings: MemberSettings) -> LlamaState:
        state = self._open(prompt, settings)
        if settings.measure_prompt and not settings.raw:
            state.surprise = self._surprise(prompt, state)
        return state

    def open_many(self, prompts: Sequence[Prompt], settings: Sequence[MemberSettings]) -> list[Any]:
        """Requests' states, their prompts' tokens checked, none read (prefill_many reads them)."""
        return each_request(self.name, self._unread, prompts, settings)

    def _unread(self, prompt: Prompt, settings: MemberSettings) -> LlamaState:
        state = self._open(prompt, settings)
        state.reading = prompt  # until prefill_many has read it whole
        return state

    def _open(self, prompt: Prompt, settings: MemberSettings) -> LlamaState:
        ids = drafting.raw_context(self.tokenizer) if settings.raw else self.prompt_ids(prompt)
        if not ids:
            raise ConfigError(f"{self.name}: the prompt formats to no tokens")
        limit = min(self.context_tokens, self.trained_context or self.context_tokens)
        if len(ids) + settings.max_new_tokens + drafting.UTF8_GRACE_TOKENS + 8 > limit:
            raise PromptTooLongError(
                f"{self.name}: the prompt takes {len(ids)} tokens and the answer budget "
                f"{settings.max_new_tokens} more, beyond this member's context of {limit}; "
                "shorten the prompt or lower max_new_tokens"
            )
        return LlamaState(settings, len(ids), ids, "")

    def prompt_surprise(self, state: LlamaState) -> float | None:
        """How surprised this member was by the prompt's own text, in nats per byte (None: not
        measured, or the prompt's tokens cannot be told from the template's)."""
        return state.surprise

    def draft(self, state: LlamaState, max_new_tokens: int) -> Candidate:
        return self.draft_many([state], [max_new_tokens])[0]

    def accept(self, state: LlamaState, text: str) -> None:
        """Append the chosen candidate: re-tokenize the answer; the slot keeps the common prefix."""
        state.answer += text
        state.ids = state.ids[: state.prompt_len] + self.encode(state.answer)
        state.drafted = None  # drafted from the old ids

    def draft_many(self, states: Sequence[LlamaState], budgets: Sequence[int]) -> list[Candidate]:
        """Draft every request in lockstep: one decode call per step for all of them."""
        out: list[Candidate] = []
        with self.lock:
            for begin in range(0, len(states), self.slots):
                end = begin + self.slots
                out += self._draft_group(states[begin:end], budgets[begin:end])
        return out

    def generate_alone(self, prompt: Prompt, max_new_tokens: int) -> tuple[int, float]:
        """(new tokens, seconds) of greedy decoding alone from the prompt, never stopping early: the
        benchmarks' "member alone" (measure.generate_alone), prefill included as there."""
        ids = self.prompt_ids(prompt)
        began = time.perf_counter()
        with self.lock:
            (slot,) = self._claim([LlamaState(MemberSettings(), len(ids), ids, "")])
            start = self._rewind(slot, ids)
            items: list[Item] = [(slot, p, ids[p], p == len(ids) - 1) for p in range(start, len(ids))]
            for _ in range(max_new_tokens):
                for _, row in self._decode(items, "alone"):  # one row: the last item's
                    token = int(row.argmax())
                items = [(slot, len(self.cached[slot]), token, True)]
        return max_new_tokens, time.perf_counter() - began

    def _surprise(self, prompt: Prompt, state: LlamaState) -> float | None:
        """Read the prompt into a slot (the first draft finds it there) with the logits of the
        positions that predict the prompt's own tokens: their mean negative log-likelihood per byte."""
        span = drafting.prompt_span(self.tokenizer, self.prompt_format, prompt, state.ids)
        if span is None:
            return None
        inside, spelled = span
        wanted = {t - 1: state.ids[t] for t in inside}  # position t-1 predicts token t
        nll = 0.0
        with self.lock:
            (slot,) = self._claim([state])
            self._rewind(slot, state.ids[:1])
            items = [(slot, p, state.ids[p], p in wanted) for p in range(len(state.ids))]
            for i, row in self._decode(items, "prompt"):
                nll -= logit_and_logprob(row, wanted[i])[1]
        return nll / max(1, spelled)

    # -- drafting ------------------------------------------------------------------------------------

    def _draft_group(self, states: Sequence[LlamaState], budgets: Sequence[int]) -> list[Candidate]:
        began = time.perf_counter()
        slots = self._claim(states)
        cuts, rngs, items, owner = [], [], [], {}
        picked: list[list[tuple[int, tuple[float, float]]]] = [[] for _ in states]
        sure: list[list[tuple[float, float]]] = [[] for _ in states]  # the gate's: Candidate.confidence
        for r, (state, slot, budget) in enumerate(zip(states, slots, budgets)):
            settings = state.settings
            cuts.append(
                drafting.DraftCut(
                    budget,
                    decode=self.decode,
                    ids=state.ids,
                    stop_ids=self.stop_token_ids,
                    stops=(*self.prompt_format.stop_strings, *settings.stop_strings),
                )
            )
            seed = settings.seed + 7919 * state.drafts
            state.drafts += 1
            rngs.append(np.random.default_rng(seed) if settings.temperature > 0 else None)
            if cuts[-1].wants_more:
                start = self._rewind(slot, state.ids)
                for pos in range(start, len(state.ids)):
                    items.append((slot, pos, state.ids[pos], pos == len(state.ids) - 1))
                owner[slot] = r
        while items:
            following: list[tuple[int, int, int, bool]] = []  # one sequence each: the slots
            for i, row in self._decode(items, "draft"):
                slot = items[i][0]
                r = owner[slot]
                token = pick(row, states[r].settings, rngs[r])
                if states[r].settings.own_draft_scores:
                    picked[r].append((token, logit_and_logprob(row, token)))
                if states[r].settings.measure_confidence:
                    sure[r].append(token_and_runner_up(row, token))
                if cuts[r].push(token):
                    following.append((slot, len(self.cached[slot]), token, True))
            items = following
        seconds = (time.perf_counter() - began) / len(states)
        out = []
        for state, cut, own, values in zip(states, cuts, picked, sure):
            state.drafted = (tuple(t for t, _ in own), tuple(v for _, v in own)) if own else None
            new, text, final = cut.result()
            count = drafting.tokens_in(self.decode, state.ids, new, text)
            kept = drafting.kept_values(values, 0, count, len(new), final)
            confidence = drafting.confidence([a for a, _ in kept], [b for _, b in kept])
            out.append(Candidate(self.name, text, count, final, seconds, confidence=confidence))
        return out


def _free(lib: Any, batch: Any, ctx: Any, weights: LlamaModel) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)


__all__ = [
    "BATCH_TOKENS",
    "CONTEXT_TOKENS",
    "SCORE_SEQUENCES",
    "SLOTS",
    "LlamaCppMember",
    "LlamaState",
]
