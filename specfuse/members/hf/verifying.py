"""HFMember's verification (verify-in-line): every request's candidates packed into one forward pass
after its cached prefix, scored off the final hidden states (scoring.py builds the pack and reads
the output head's rows); the pass's keys and values stay in the cache, so that accept() can move
the chosen candidate's into place instead of computing them again.

A mixin of HFMember (member.py), which holds the model, the contexts and their caches: these methods
are its own, read apart. What they use of the member is declared below, for the type checker.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ...errors import PromptTooLongError
from ...records import Candidate, TokenScores
from .. import drafting
from ..protocol import Verdict
from . import slot_verify, tailed, transfer
from .scoring import Block, Layout, chunk_mask, lay_out
from .state import HFState, PackedPass

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from .compiled import CompiledDecoder
    from .scoring import OutputHead
    from .slots import SlotStore


class Verifying:
    """HFMember's score, score_many and verify_many, and the packed pass they leave for accept()."""

    if TYPE_CHECKING:  # HFMember's (member.py)
        name: str
        tokenizer: PreTrainedTokenizerBase
        device: str
        dtype: torch.dtype
        base: torch.nn.Module
        head: OutputHead
        sliding_window: int | None
        max_positions: int
        end_marker: tuple[int, ...]
        chunk_tokens: int
        compiled: CompiledDecoder | None
        slots: SlotStore | None
        pieces: dict[int, str]

        def encode_many(self, texts: Sequence[str]) -> list[list[int]]: ...
        def _stacked_cache(self, states: Sequence[HFState]) -> tuple[DynamicCache, list[int]]: ...

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
        # Every candidate after its request's answer, tokenized in one call (accept() takes the
        # winner's from the packed pass instead of tokenizing it again).
        texts = [s.answer + c.text for s, cands in zip(states, candidates) for c in cands]
        encoded = iter(self.encode_many(texts))
        fulls = [[next(encoded) for _ in cands] for cands in candidates]
        rows = []
        for state, cands, full in zip(states, candidates, fulls):
            self._drop_packed(state)
            rows.append(self._blocks(state, cands, full))
            self._check_fits([b for b, _, _ in rows[-1]])
        blocks = [[b for b, _, _ in row] for row in rows]
        # On the member's KV slots (slot_verify.py, the "graphs" path): each run's hidden states in
        # the packed layout, its keys and values beside its own cache (PackedPass.side).
        slotted = self._verify_on_slots(states, blocks)
        if slotted is None:
            cache, pads = self._stacked_cache(states)
            packed = lay_out(blocks, [len(s.ids) for s in states], self.device)
            hidden_all: torch.Tensor | Sequence[torch.Tensor] = self._packed_pass(cache, packed)  # [B, Q, H]
            all_offsets = packed.offsets
        else:
            hidden_all, all_offsets = slotted.hidden, tuple(_offsets(b) for b in blocks)
        logits, logprobs, tops = self._score_rows(states, rows, all_offsets, hidden_all)
        # in the order of the loops below
        next_logits, next_logprobs, next_top = iter(logits), iter(logprobs), iter(tops)
        results = []
        for r, (state, row) in enumerate(zip(states, rows)):
            hidden = hidden_all[r]
            offsets = all_offsets[r]
            details, last_hidden = [], []
            for offset, (_, tail, text_ids) in zip(offsets, row):
                logit = tuple(islice(next_logits, len(tail)))
                logprob = tuple(islice(next_logprobs, len(tail))) if _needs_logprobs(state) else ()
                top = tuple(islice(next_top, len(tail))) if state.settings.top_logprobs else ()
                pieces = tuple(self._piece(t) for t in tail)
                details.append(TokenScores(pieces, logit, logprob, top))
                last_hidden.append(hidden[offset + len(text_ids)])
            if slotted is None and len(states) > 1:  # keep the pass's keys and values in the request's cache
                self._append_row(state.cache, cache, r, pads[r] + len(state.ids), packed.length)
            state.packed = PackedPass(
                texts=tuple(c.text for c in candidates[r]),
                starts=tuple(b.start for b, _, _ in row),
                text_tokens=tuple(tuple(t) for _, _, t in row),
                offsets=offsets,
                last_hidden=tuple(last_hidden),
                prefix_len=len(state.ids),
                encoded=tuple(map(tuple, fulls[r])),
                side=slotted.beside(r) if slotted is not None else None,
            )
            results.append(details)
        return results

    def _verify_on_slots(
        self, states: Sequence[HFState], blocks: Sequence[Sequence[Block]]
    ) -> slot_verify.Read | None:
        """The pass on the KV slots, where this member has them (a lone request of a member with
        compiled decoding keeps that path); None: verify eagerly."""
        if self.slots is None or (len(states) == 1 and self.compiled is not None):
            return None
        return slot_verify.verify(self.slots, [s.cache for s in states], blocks)

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
        hidden_all: torch.Tensor | Sequence[torch.Tensor],
    ) -> tuple[list[float], list[float], list[tuple[tuple[str, float], ...]]]:
        """The raw logit of every scored token of every request's candidates, in order, the
        log-probabilities of those whose request needs them, and the alternatives (piece,
        log-probability) of those whose request asks for them. All through the output head at
        once: a log-probability needs the full vocabulary row, and the head's weights (Gemma 3's
        262k tokens: 335 MB in bf16) are then read once a pass rather than once a candidate."""
        picked, tokens, wanted, tops = [], [], [], []
        for r, (state, row) in enumerate(zip(states, rows)):
            for offset, (_, tail, _) in zip(offsets[r], row):
                picked.append(hidden_all[r][offset : offset + len(tail)])  # row t predicts tail[t]
                tokens += tail
                wanted += [_needs_logprobs(state)] * len(tail)
                if _needs_logprobs(state):
                    tops += [state.settings.top_logprobs] * len(tail)
        hidden = torch.cat(picked)
        targets = transfer.tensor_on(tokens, hidden.device)
        logits = self.head.token_logits(hidden, targets)
        if not any(wanted):
            return logits.tolist(), [], []
        if not all(wanted):  # the rows that need them, by index: a boolean mask reads its count back first
            keep = transfer.tensor_on([i for i, w in enumerate(wanted) if w], hidden.device)
            hidden, targets = hidden.index_select(0, keep), targets.index_select(0, keep)
        k = max(tops)
        logprobs, top_lp, top_ids = self.head.token_logprobs_top(hidden, targets, k)
        values = torch.cat([logits, logprobs]).tolist()  # one read back for both
        logits_out, logprobs_out = values[: len(tokens)], values[len(tokens) :]
        if not k:
            return logits_out, logprobs_out, []
        alternatives = [
            tuple((self._piece(t), v) for t, v in zip(ids[:n], lps[:n]))
            for n, ids, lps in zip(tops, top_ids.tolist(), top_lp.tolist())
            if n
        ]
        return logits_out, logprobs_out, alternatives

    def _piece(self, token: int) -> str:
        """A token's own text, as the token evidence shows it: decoded once per member (a dozen
        microseconds each, for every scored token of every run in every round)."""
        piece = self.pieces.get(token)
        if piece is None:
            piece = self.pieces[token] = str(self.tokenizer.decode([token]))
        return piece

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
        self, state: HFState, candidates: Sequence[Candidate], fulls: Sequence[Sequence[int]] | None = None
    ) -> list[tuple[Block, list[int], list[int]]]:
        """(packed block, scored tokens, the candidate's own tokens) for each candidate in context
        (`fulls`: the answer and each candidate, tokenized; None: tokenized here)."""
        if fulls is None:
            fulls = self.encode_many([state.answer + c.text for c in candidates])
        out = []
        for cand, full in zip(candidates, fulls):
            keep, tokens, tail = drafting.scored_in(
                full, state.ids, state.prompt_len, cand.final, self.end_marker
            )
            out.append((Block(start=keep - 1, tokens=(state.ids[keep - 1], *tail)), tail, tokens))
        return out

    def _move_verified(self, state: HFState, text: str, target: list[int]) -> bool:
        """accept()'s shortcut: when the last verify pass scored exactly the chosen candidate's tokens
        after the same anchor (`target` is the new committed ids), its keys and values already sit in
        the cache (same positions, the packed pass restarted them there) and are moved into place,
        or beside it (a pass on the KV slots) and are appended, instead of being computed again.
        False: nothing was moved, the caller feeds the tokens."""
        packed = state.packed
        if packed is None or text not in packed.texts:
            return False
        b = packed.texts.index(text)
        start, tokens = packed.starts[b], packed.text_tokens[b]
        if list(target) != state.ids[: start + 1] + list(tokens):
            return False
        source, end = packed.offsets[b] + 1, start + 1 + len(tokens)  # the block's tokens after its anchor
        if packed.side is not None:  # beside the cache: the winner's noted after the anchor, joined later
            side = packed.side
            tail = tailed.Tail(side.kv, side.row, source, len(tokens), side.stacked)
            tailed.defer(state.cache, start + 1, tail)
        else:
            source += packed.prefix_len
            # Copied through a clone only where the two ranges overlap (the first block's, mostly): a
            # kernel less a layer otherwise.
            overlap = source < end
            for layer in state.cache.layers:
                for name in ("keys", "values"):
                    kv = getattr(layer, name)
                    moved = kv[..., source : source + len(tokens), :]
                    kv[..., start + 1 : end, :] = moved.clone() if overlap else moved
                    setattr(layer, name, kv[..., :end, :])
        state.last_hidden = packed.last_hidden[b] if tokens else state.last_hidden
        return True

    def _drop_packed(self, state: HFState) -> None:
        """Forget a packed pass: crop the cache back to the committed tokens."""
        extra = state.cache.get_seq_length() - len(state.ids)
        if extra:
            state.cache.crop(-extra)
        state.packed = None

    @staticmethod
    def _append_row(target: DynamicCache, stacked: DynamicCache, row: int, begin: int, count: int) -> None:
        """Copy row `row`'s keys and values of columns [begin, begin + count) onto `target`."""
        for mine, theirs in zip(target.layers, stacked.layers):
            for name in ("keys", "values"):
                tail = getattr(theirs, name)[row : row + 1, :, begin : begin + count]
                setattr(mine, name, torch.cat([getattr(mine, name), tail], dim=-2))


def _offsets(blocks: Sequence[Block]) -> tuple[int, ...]:
    """Where each block begins when they are packed one after another (scoring.lay_out's offsets)."""
    out, at = [], 0
    for block in blocks:
        out.append(at)
        at += len(block.tokens)
    return tuple(out)


def _needs_logprobs(state: HFState) -> bool:
    """Whether a request needs each scored token's log-probability: it scores by them, or its API
    request asked for them (MemberSettings.logprobs)."""
    return state.settings.score == "logprob" or state.settings.logprobs


__all__ = ["Verifying"]
