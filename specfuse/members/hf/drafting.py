"""HFMember's drafting: a draft for several requests at once, one forward pass per token for all of
them, each row continuing its own context (a stacked, left-padded cache), greedy or sampled.

A mixin of HFMember (member.py), which holds the model, the contexts and their caches: these methods
are its own, read apart. What they use of the member is declared below, for the type checker.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ...errors import MemberError
from ...prompts import PromptFormat
from ...records import Candidate
from .. import drafting, workers
from . import compiled, transfer
from .compiled import drafting as compiled_drafting  # `compiled` is the member's decoder here
from .scoring import float_mask
from .state import HFState

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from .compiled import CompiledDecoder
    from .scoring import OutputHead
    from .slots import SlotStore


class Drafting:
    """HFMember's draft and draft_many, and the decoding steps under them."""

    if TYPE_CHECKING:  # HFMember's (member.py, verifying.py)
        name: str
        model: PreTrainedModel
        tokenizer: PreTrainedTokenizerBase
        prompt_format: PromptFormat
        device: str
        dtype: torch.dtype
        base: torch.nn.Module
        head: OutputHead
        sliding_window: int | None
        stop_token_ids: frozenset[int]
        reuse_trimmed: bool
        compiled: CompiledDecoder | None
        slots: SlotStore | None

        def decode(self, ids: Sequence[int]) -> str: ...
        def hidden_states(self, ids: Sequence[int], cache: DynamicCache) -> torch.Tensor: ...
        def _stacked_cache(self, states: Sequence[HFState]) -> tuple[DynamicCache, list[int]]: ...
        def _drop_packed(self, state: HFState) -> None: ...

    def draft(self, state: HFState, max_new_tokens: int) -> Candidate:
        return self.draft_many([state], [max_new_tokens])[0]

    @torch.inference_mode()
    @compiled_drafting
    def draft_many(self, states: Sequence[HFState], budgets: Sequence[int]) -> list[Candidate]:
        """Draft for several requests at once: one forward pass per token for all of them.

        Each request continues its own context: in the member's KV slots (slots.py, the "graphs"
        decode path), else in a batch row of the stacked caches, left-padded; a row that has
        finished feeds a placeholder until the last one is done.
        """
        began = time.perf_counter()
        for state in states:
            self._drop_packed(state)
        rows = len(states)
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
        sure: list[list[tuple[float, float]]] = [[] for _ in states]  # the gate's: Candidate.confidence
        measure = any(s.settings.measure_confidence for s in states)
        if rows == 1 and cuts[0].wants_more:  # batch rows would need a ragged catch-up pass
            taken = self._take_over_trimmed(states[0], cuts[0].limit)
            for token in taken:
                cuts[0].push(token)
            if taken:
                step = reused = len(taken)
                hidden = compiled.take_over(self, taken, len(states[0].ids), states[0].cache)
        slotted = self._in_slots(states, cuts)
        try:
            self._decode(states, cuts, self.head.logits(hidden), step, slotted, sure if measure else None)
        finally:
            if slotted and self.slots is not None:
                self.slots.end()
        if rows == 1:  # drafted straight into the request's own cache: forget the draft's keys
            states[0].cache.crop(len(states[0].ids) - states[0].cache.get_seq_length())
        seconds = (time.perf_counter() - began) / rows
        out = []
        for state, cut, values in zip(states, cuts, sure):
            new, text, final = cut.result()
            count = self._tokens_in(state.ids, new, text)
            state.trimmed = None
            if self.reuse_trimmed and state.settings.temperature <= 0 and count < len(new):
                state.trimmed = (tuple(state.ids) + tuple(new[:count]), tuple(new[count:]))
            kept = drafting.kept_values(values, reused, count, len(new), final)
            confidence = drafting.confidence([a for a, _ in kept], [b for _, b in kept])
            out.append(Candidate(self.name, text, count, final, seconds, reused, confidence))
        return out

    def _in_slots(self, states: Sequence[HFState], cuts: Sequence[drafting.DraftCut]) -> bool:
        """Whether this draft decodes in the member's KV slots (the "graphs" path; a lone request of
        a member with compiled decoding keeps that path); True: the slots are taken (end() them)."""
        if self.slots is None or (len(states) == 1 and self.compiled is not None):
            return False
        if not any(c.wants_more for c in cuts):
            return False
        steps = max(c.budget for c in cuts) + drafting.UTF8_GRACE_TOKENS
        return self.slots.begin([s.cache for s in states], steps)

    def _decode(
        self,
        states: Sequence[HFState],
        cuts: Sequence[drafting.DraftCut],
        logits: torch.Tensor,
        step: int,
        slotted: bool,
        sure: list[list[tuple[float, float]]] | None = None,
    ) -> None:
        """The decoding loop: pick each row's next token from `logits` [B, V], step all rows, until
        every cut is done. `step`: tokens already fed after the committed ones (taken over); `sure`,
        when given, gets each picked token's log-probability and its runner-up's per row."""
        rows = len(states)
        store = self.slots if slotted else None
        if store is not None and store.ahead and all(s.settings.temperature <= 0 for s in states):
            self._decode_ahead(store, states, cuts, logits, step, sure)
            return
        cache, pads = (None, [0] * rows) if slotted else self._stacked_cache(states)
        while any(c.wants_more for c in cuts):
            values = _step_values(logits, logits.argmax(-1), False).tolist()  # one read back a step
            if any(nan for _, nan in values):  # argmax would pick token 0 and go on, silently
                raise self._not_finite(slotted)
            greedy = [int(token) for token, _ in values]
            feed = [self.tokenizer.pad_token_id or 0] * rows  # placeholders for finished rows
            picked: dict[int, int] = {}
            for b, (state, cut) in enumerate(zip(states, cuts)):
                if cut.wants_more:
                    token = greedy[b] if state.settings.temperature <= 0 else self._pick(logits[b], state)
                    picked[b] = token
                    if cut.push(token):
                        feed[b] = token
            if sure is not None:
                for b, pair in _token_values(logits, picked).items():
                    sure[b].append(pair)
            if not any(c.wants_more for c in cuts):
                break
            positions = [len(s.ids) + step for s in states]
            if slotted and self.slots is not None:
                workers.rebalance()
                logits = self.slots.step(feed, positions)
            else:
                assert cache is not None
                logits = self.head.logits(self._step(feed, positions, pads, cache))
            step += 1

    def _decode_ahead(
        self,
        store: SlotStore,
        states: Sequence[HFState],
        cuts: Sequence[drafting.DraftCut],
        logits: torch.Tensor,
        step: int,
        sure: list[list[tuple[float, float]]] | None,
    ) -> None:
        """_decode's loop for greedy drafts on the slots, a step ahead of the host: each step is
        enqueued from the last one's argmax on the device, before the host reads that argmax (and
        the nan check, and the gate's values) and cuts the drafts; on a GPU the next step runs
        meanwhile. Rows whose draft has ended go on feeding their own argmax, unseen, where
        _decode feeds a placeholder: each row sees only its own columns, so the tokens are the
        same. A step is run ahead only while some draft may want it (one that ends early at a stop
        token or string costs a step nobody reads)."""
        rows, n = store.shape.rows, len(states)
        inputs = torch.zeros(2, rows, dtype=torch.long)  # padding rows: token 0 at position 0
        inputs[1, :n] = torch.tensor([len(s.ids) + step for s in states])
        inputs = transfer.to_device(inputs, logits.device)  # not waiting for the step before it
        advance = (torch.arange(rows, device=logits.device) < n).long()

        def enqueue(picks: torch.Tensor) -> torch.Tensor:
            """The next step, fed each row's pick at its next position; its logits (not yet read)."""
            inputs[0, :n] = picks
            out = store.step_on(inputs)
            inputs[1] += advance
            return out

        ahead: torch.Tensor | None = None
        while True:
            picks = logits[:n].argmax(-1)
            read = transfer.read_later(_step_values(logits[:n], picks, sure is not None))
            if any(c.wants_more and len(c.new) + 1 < c.limit for c in cuts):
                ahead = enqueue(picks)
            values = read()
            if any(row[1] for row, cut in zip(values, cuts) if cut.wants_more):
                raise self._not_finite(True)
            for b, (row, cut) in enumerate(zip(values, cuts)):
                if cut.wants_more:
                    cut.push(int(row[0]))
                    if sure is not None:
                        sure[b].append((row[2], row[3]))
            if not any(c.wants_more for c in cuts):
                return
            if ahead is None:  # a grace token for a multi-byte character: one step more, now
                ahead = enqueue(picks)
            workers.rebalance()
            logits, ahead = ahead, None

    def _not_finite(self, slotted: bool) -> MemberError:
        """The error of a draft whose logits hold a nan (argmax would pick token 0 and go on)."""
        suspect = "its weights are damaged (a model file that changed on disk?)"
        if self.compiled is not None:  # or torch.compile's code is wrong (cpu.held_to_avx2)
            suspect += " or its compiled decoding is wrong (load it without compile_decode to tell)"
        if slotted:
            suspect += " or its KV-slot step is wrong (load it with decode='eager' to tell)"
        return MemberError(
            f"{self.name}: its logits are not finite (nan) while drafting; {suspect}, so this request ends"
        )

    def _take_over_trimmed(self, state: HFState, limit: int) -> tuple[int, ...]:
        """The tokens the last greedy draft trimmed away, when its kept text is now the answer's end:
        greedy decoding from the same context would produce exactly them again."""
        trimmed, state.trimmed = state.trimmed, None
        if trimmed is None or tuple(state.ids) != trimmed[0]:
            return ()
        return trimmed[1][:limit]

    def _tokens_in(self, ids: Sequence[int], new: Sequence[int], text: str) -> int:
        """How many of the drafted tokens `new` make up `text` (a prefix of their decode)."""
        return drafting.tokens_in(self.decode, ids, new, text)

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


def _step_values(logits: torch.Tensor, picks: torch.Tensor, measure: bool) -> torch.Tensor:
    """A step's values for the host, on the device, [rows, 2 or 4] float64: each row's greedy
    token, whether its logits hold a nan, and with `measure` the gate's pair (_token_values: the
    greedy token's log-probability and the likeliest other's, the top two)."""
    columns = [picks.double(), logits.isnan().any(-1).double()]
    if measure:
        top = torch.topk(torch.log_softmax(logits.float(), dim=-1), 2, dim=-1).values
        columns += [top[:, 0].double(), top[:, 1].double()]
    return torch.stack(columns, dim=1)


__all__ = ["Drafting"]


def _token_values(logits: torch.Tensor, picked: dict[int, int]) -> dict[int, tuple[float, float]]:
    """Per batch row b that picked a token: its log-probability and the most likely other token's
    (the gate's confidence), for all rows in one pass and one copy to the host."""
    if not picked:
        return {}
    rows = list(picked)
    logp = torch.log_softmax(logits[rows].float(), dim=-1)
    top = torch.topk(logp, 2, dim=-1)
    tokens = torch.tensor([picked[b] for b in rows], device=logp.device)
    chosen = logp.gather(1, tokens[:, None])[:, 0]
    other = torch.where(top.indices[:, 0] == tokens, top.values[:, 1], top.values[:, 0])
    pairs = torch.stack([chosen, other], dim=1).tolist()
    return {b: (float(a), float(o)) for b, (a, o) in zip(rows, pairs)}
