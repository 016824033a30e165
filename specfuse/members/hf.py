"""HFMember: one Hugging Face causal LM in this process, its drafting, scoring and KV cache.

A member is shared by all runs; everything per request (token ids, cache, random generator) lives
in the state object that start() returns. Knows nothing about the other members or the weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ..config import MemberSettings
from ..errors import ConfigError, MemberError, PromptTooLongError, SpecfuseError
from ..prompts import CHAT, PromptFormat
from ..records import Candidate, TokenScores
from . import compiled, drafting, prefill, workers
from .protocol import BaseMember, Verdict
from .scoring import (
    CHUNK_TOKENS,
    Block,
    Layout,
    OutputHead,
    chunk_mask,
    common_prefix_len,
    float_mask,
    lay_out,
    sliding_window_of,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


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
    surprise: float | None = None  # nats per byte of the prompt's own text (settings.measure_prompt)
    # Greedy drafts trimmed back to a word boundary: (the ids the draft continued, its kept tokens,
    # the tokens trimmed away). If the kept text wins, the next greedy draft begins with exactly the
    # trimmed tokens, so they are taken over instead of decoded again.
    trimmed: tuple[tuple[int, ...], tuple[int, ...]] | None = None


class HFMember(BaseMember):
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
        # The say this member starts with under prior="trust" (the catalogue's or a trust file's, from
        # evidence); None: unknown, and it starts with the mean of the others' (feedback.trust_weights).
        self.trust = trust
        # Drafts of one request decode in a static cache with a compiled step (compiled.py; opt in).
        self.compiled = compiled.CompiledDecoder(self) if compile_decode else None

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

    def start(self, prompt: str, settings: MemberSettings) -> HFState:
        (state,) = self.start_many([prompt], [settings])
        if isinstance(state, SpecfuseError):
            raise state
        return state

    @torch.inference_mode()
    def start_many(
        self, prompts: Sequence[str], settings: Sequence[MemberSettings]
    ) -> list[HFState | SpecfuseError]:
        """Start several requests, their prompts read together (prefill.py: right-padded rows, one
        forward pass per chunk for a group of similar lengths); each request gets the state start()
        gives it alone. A prompt that cannot start (empty, too long) is that request's error only."""
        out: list[HFState | SpecfuseError] = []
        for prompt, s in zip(prompts, settings):
            try:
                out.append(self._begin(prompt, s))
            except Exception as e:
                out.append(self._failed(e))
        ready = [(i, state) for i, state in enumerate(out) if isinstance(state, HFState)]
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

    def _begin(self, prompt: str, settings: MemberSettings) -> HFState:
        """A request's state before its prompt is read: the prompt's tokens, checked, and its generator."""
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
        return HFState(settings, len(ids), ids, "", DynamicCache(), torch.empty(0), generator)

    def _prefill(self, states: Sequence[HFState], prompts: Sequence[str]) -> None:
        """Read the prompts of `states` (one group) into their caches: alone as start() always did,
        or together, then each row split into its own cache."""
        head = self._template_head(states)
        skip = len(head.ids) if head is not None else 0
        if len(states) == 1:
            # A fresh cache, also after a failed batch.
            states[0].cache = head.cache() if head is not None else DynamicCache()
            hiddens = [self.hidden_states(states[0].ids[skip:], states[0].cache)]
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
            state.last_hidden = hidden[-1].clone()  # not a view that keeps the batch's states alive
            if state.settings.measure_prompt:
                state.surprise = self._surprise(prompt, state.ids, hidden)

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

    def draft(self, state: HFState, max_new_tokens: int) -> Candidate:
        return self.draft_many([state], [max_new_tokens])[0]

    @torch.inference_mode()
    @compiled.drafting
    def draft_many(self, states: Sequence[HFState], budgets: Sequence[int]) -> list[Candidate]:
        """Draft for several requests at once: one forward pass per token for all of them.

        Each request continues its own context (a batch row of the stacked caches, left-padded);
        a row that has finished feeds a placeholder until the last one is done.
        """
        began = time.perf_counter()
        for state in states:
            self._drop_packed(state)
        rows = len(states)
        cache, pads = self._stacked_cache(states)
        cuts = [
            drafting.DraftCut(
                budget,
                decode=self.decode,
                ids=state.ids,
                stop_ids=self.stop_token_ids,
                stops=(*self.prompt_format.stop_strings, *state.settings.stop_strings),
            )
            for state, budget in zip(states, budgets)
        ]
        hidden = torch.stack([s.last_hidden for s in states])  # [B, H]
        step = reused = 0
        if rows == 1 and cuts[0].wants_more:  # batch rows would need a ragged catch-up pass
            taken = self._take_over_trimmed(states[0], cuts[0].limit)
            for token in taken:
                cuts[0].push(token)
            if taken:
                step = reused = len(taken)
                hidden = compiled.take_over(self, taken, len(states[0].ids), states[0].cache)
        while any(c.wants_more for c in cuts):
            logits = self.head.logits(hidden)  # [B, V] float32
            if bool(logits.isnan().any()):  # argmax would pick token 0 and go on, silently
                raise MemberError(
                    f"{self.name}: its logits are not finite (nan) while drafting; its weights are "
                    "damaged (a model file that changed on disk?), so this request ends"
                )
            feed = [self.tokenizer.pad_token_id or 0] * rows  # placeholders for finished rows
            for b, (state, cut) in enumerate(zip(states, cuts)):
                if cut.wants_more:
                    token = self._pick(logits[b], state)
                    if cut.push(token):
                        feed[b] = token
            if not any(c.wants_more for c in cuts):
                break
            positions = [len(s.ids) + step for s in states]
            hidden = self._step(feed, positions, pads, cache)
            step += 1
        if rows == 1:  # drafted straight into the request's own cache: forget the draft's keys
            states[0].cache.crop(len(states[0].ids) - states[0].cache.get_seq_length())
        seconds = (time.perf_counter() - began) / rows
        out = []
        for state, cut in zip(states, cuts):
            new, text, final = cut.result()
            count = self._tokens_in(state.ids, new, text)
            state.trimmed = None
            if self.reuse_trimmed and state.settings.temperature <= 0 and count < len(new):
                state.trimmed = (tuple(state.ids) + tuple(new[:count]), tuple(new[count:]))
            out.append(Candidate(self.name, text, count, final, seconds, reused))
        return out

    def _take_over_trimmed(self, state: HFState, limit: int) -> tuple[int, ...]:
        """The tokens the last greedy draft trimmed away, when its kept text is now the answer's end:
        greedy decoding from the same context would produce exactly them again."""
        trimmed, state.trimmed = state.trimmed, None
        if trimmed is None or tuple(state.ids) != trimmed[0]:
            return ()
        return trimmed[1][:limit]

    def score(self, state: HFState, candidates: Sequence[Candidate]) -> list[float]:
        """Raw scores z_i· of all candidates in one forward pass (verify-in-line)."""
        ((z, _),) = self.score_many([state], [candidates])
        return z

    def score_many(
        self, states: Sequence[HFState], candidates: Sequence[Sequence[Candidate]]
    ) -> list[Verdict]:
        """Every request's raw scores, all requests in one forward pass, with the token evidence."""
        out = []
        for state, details in zip(states, self.verify_many(states, candidates)):
            out.append(([d.mean(state.settings.score) for d in details], tuple(details)))
        return out

    @torch.inference_mode()
    def verify_many(
        self, states: Sequence[HFState], candidates: Sequence[Sequence[Candidate]]
    ) -> list[list[TokenScores]]:
        """Score every request's candidates, all requests in one forward pass (verify-in-line).

        Returns, per request and candidate, the tokens as this verifier reads them in context and
        each one's raw logit (and log-probability when the request scores by log-probability, the
        only case that needs full vocabulary rows); z_ij is their mean.
        """
        rows = []
        for state, cands in zip(states, candidates):
            self._drop_packed(state)
            rows.append(self._blocks(state, cands))
            self._check_fits([b for b, _, _ in rows[-1]])
        cache, pads = self._stacked_cache(states)
        packed = lay_out([[b for b, _, _ in row] for row in rows], [len(s.ids) for s in states], self.device)
        hidden_all = self._packed_pass(cache, packed)  # [B, Q, H]; its keys and values stay in `cache`
        logits, logprobs = self._score_rows(states, rows, packed.offsets, hidden_all)
        next_logits, next_logprobs = iter(logits), iter(logprobs)  # in the order of the loops below
        results = []
        for r, (state, row) in enumerate(zip(states, rows)):
            hidden = hidden_all[r]
            offsets = packed.offsets[r]
            details, last_hidden = [], []
            for offset, (_, tail, text_ids) in zip(offsets, row):
                logit = tuple(islice(next_logits, len(tail)))
                logprob = tuple(islice(next_logprobs, len(tail))) if state.settings.score == "logprob" else ()
                pieces = tuple(str(self.tokenizer.decode([t])) for t in tail)
                details.append(TokenScores(pieces, logit, logprob))
                last_hidden.append(hidden[offset + len(text_ids)])
            if len(states) > 1:  # keep the pass's keys and values in the request's own cache
                self._append_row(state.cache, cache, r, pads[r] + len(state.ids), packed.length)
            state.packed = _PackedPass(
                texts=tuple(c.text for c in candidates[r]),
                starts=tuple(b.start for b, _, _ in row),
                text_tokens=tuple(tuple(t) for _, _, t in row),
                offsets=offsets,
                last_hidden=tuple(last_hidden),
                prefix_len=len(state.ids),
            )
            results.append(details)
        return results

    def _packed_pass(self, cache: DynamicCache, packed: Layout) -> torch.Tensor:
        """Hidden states of the packed tokens after `cache`, which keeps their keys and values."""
        decoder = self.compiled if packed.input_ids.shape[0] == 1 else None  # a lone request's: compiled
        if decoder is not None and (hidden := decoder.verify(cache, packed)) is not None:
            return hidden
        parts = []  # each chunk's hidden states; its keys and values stay in the cache for the next
        for begin in range(0, packed.length, self.chunk_tokens):
            end = min(begin + self.chunk_tokens, packed.length)
            out = self.base(
                input_ids=packed.input_ids[:, begin:end],
                position_ids=packed.position_ids[:, begin:end],
                attention_mask=chunk_mask(packed, begin, end, self.dtype, self.sliding_window),
                past_key_values=cache,
                use_cache=True,
            )
            parts.append(out.last_hidden_state)
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def _score_rows(
        self,
        states: Sequence[HFState],
        rows: Sequence[Sequence[tuple[Block, list[int], list[int]]]],
        offsets: Sequence[Sequence[int]],
        hidden_all: torch.Tensor,
    ) -> tuple[list[float], list[float]]:
        """The raw logit of every scored token of every request's candidates, in order, and the
        log-probabilities of those whose request scores by them. All through the output head at
        once: a log-probability needs the full vocabulary row, and the head's weights (Gemma 3's
        262k tokens: 335 MB in bf16) are then read once a pass rather than once a candidate."""
        picked, tokens, wanted = [], [], []
        for r, (state, row) in enumerate(zip(states, rows)):
            for offset, (_, tail, _) in zip(offsets[r], row):
                picked.append(hidden_all[r, offset : offset + len(tail)])  # row t predicts tail[t]
                tokens += tail
                wanted += [state.settings.score == "logprob"] * len(tail)
        hidden = torch.cat(picked)
        targets = torch.tensor(tokens, device=hidden.device)
        logits = self.head.token_logits(hidden, targets).tolist()
        if not any(wanted):
            return logits, []
        keep = torch.tensor(wanted, device=hidden.device)
        return logits, self.head.token_logprobs(hidden[keep], targets[keep]).tolist()

    def _check_fits(self, blocks: Sequence[Block]) -> None:
        """Refuse, before the pass, a candidate that would run past the model's context (a long typed
        segment; an answer whose tokens in this tokenizer outgrew the budget counted in another's)."""
        for block in blocks:
            reach = block.start + len(block.tokens)
            if reach > self.max_positions:
                raise PromptTooLongError(
                    f"{self.name}: a candidate of {len(block.tokens) - 1} tokens after {block.start + 1} "
                    f"in context would reach position {reach}, beyond the model's context of "
                    f"{self.max_positions}; shorten the typed segment or the prompt, or lower max_new_tokens"
                )

    def _blocks(
        self, state: HFState, candidates: Sequence[Candidate]
    ) -> list[tuple[Block, list[int], list[int]]]:
        """(packed block, scored tokens, the candidate's own tokens) for each candidate in context."""
        out = []
        for cand in candidates:
            keep, tokens, tail = drafting.scored_tokens(
                self.encode, state.ids, state.prompt_len, state.answer, cand.text, cand.final, self.end_marker
            )
            out.append((Block(start=keep - 1, tokens=(state.ids[keep - 1], *tail)), tail, tokens))
        return out

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

    # -- internals -----------------------------------------------------------------------------------

    def _drop_packed(self, state: HFState) -> None:
        """Forget a packed pass: crop the cache back to the committed tokens."""
        extra = state.cache.get_seq_length() - len(state.ids)
        if extra:
            state.cache.crop(-extra)
        state.packed = None

    def _tokens_in(self, ids: Sequence[int], new: Sequence[int], text: str) -> int:
        """How many of the drafted tokens `new` make up `text` (a prefix of their decode)."""
        return drafting.tokens_in(self.decode, ids, new, text)

    def hidden_states(self, ids: Sequence[int], cache: DynamicCache) -> torch.Tensor:
        """Run `ids` after the cache, chunk_tokens at a time (memory linear in a long prompt's
        length); returns the final hidden states [len(ids), H]."""
        parts = []
        for begin in range(0, len(ids), self.chunk_tokens):
            input_ids = torch.tensor([list(ids[begin : begin + self.chunk_tokens])], device=self.device)
            out = self.base(input_ids=input_ids, past_key_values=cache, use_cache=True)
            parts.append(out.last_hidden_state[0])
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _pick(self, logits: torch.Tensor, state: HFState) -> int:
        """The next token from a [V] float32 row of logits: greedy, or sampled with the request's
        own generator (temperature, top-p)."""
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

    def _step(
        self, tokens: Sequence[int], positions: Sequence[int], pads: Sequence[int], cache: DynamicCache
    ) -> torch.Tensor:
        """One decoding step for every row: [B] tokens at their own positions → hidden [B, H]."""
        workers.rebalance()  # members at once on a CPU: take over the cores of those already done
        if len(tokens) == 1:
            if (
                self.compiled is not None
                and (hidden := self.compiled.step(tokens[0], positions[0], cache)) is not None
            ):
                return hidden
            return self.hidden_states(tokens, cache)[-1][None]
        width = cache.get_seq_length() + 1
        column = torch.arange(width, device=self.device)
        pad = torch.tensor(pads, device=self.device)[:, None]
        allowed = column[None, :] >= pad  # [B, K]: the left padding stays invisible
        full = float_mask(allowed[:, None, None, :], self.dtype)  # [B, 1, 1, K]
        mask: torch.Tensor | dict[str, torch.Tensor] = full
        if self.sliding_window is not None:
            near = column[None, :] > width - 1 - self.sliding_window
            mask = {
                "full_attention": full,
                "sliding_attention": float_mask((allowed & near)[:, None, None, :], self.dtype),
            }
        out = self.base(
            input_ids=torch.tensor([[t] for t in tokens], device=self.device),
            position_ids=torch.tensor([[p] for p in positions], device=self.device),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        return out.last_hidden_state[:, -1]

    @staticmethod
    def _append_row(target: DynamicCache, stacked: DynamicCache, row: int, begin: int, count: int) -> None:
        """Copy row `row`'s keys and values of columns [begin, begin + count) onto `target`."""
        for mine, theirs in zip(target.layers, stacked.layers):
            for name in ("keys", "values"):
                tail = getattr(theirs, name)[row : row + 1, :, begin : begin + count]
                setattr(mine, name, torch.cat([getattr(mine, name), tail], dim=-2))

    def _surprise(self, prompt: str, ids: Sequence[int], hidden: torch.Tensor) -> float | None:
        """Mean negative log-likelihood per byte of the tokens that spell the prompt itself."""
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
