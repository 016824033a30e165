"""LlamaCppMember's verification (a mixin of member.py's member): every request's candidates in one
batch of sequences, each candidate a copy of its request's slot (shared cells, not copied bytes)
plus its own tokens, the tokens candidates begin with alike decoded once (candidate_items); with
own_draft_scores, a member's own candidate keeps the values it was drafted with.

These methods are the member's own, read apart; they build on decode.py's slots and decode calls
(LlamaDecoding), and what else they use of the member is declared below, for the type checker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...records import Candidate, TokenScores
from .. import drafting
from ..protocol import Verdict
from .decode import (
    SCORE_SEQUENCES,
    CandidatePath,
    Item,
    LlamaDecoding,
    LlamaState,
    candidate_items,
    logit_and_logprob,
    top_tokens,
)

# Per request: its shared context length, and per candidate (keep, tail, its own drafted values or None).
Plan = tuple[int, list[tuple[int, list[int], tuple[tuple[float, float], ...] | None]]]


class LlamaVerifying(LlamaDecoding):
    """LlamaCppMember's score and score_many: raw scores with their evidence, token by token."""

    if TYPE_CHECKING:  # LlamaCppMember's (member.py)
        end_marker: tuple[int, ...]
        share_prefixes: bool

        def encode(self, text: str) -> list[int]: ...

    def score(self, state: LlamaState, candidates: Sequence[Candidate]) -> list[float]:
        return self.score_many([state], [candidates])[0][0]

    def score_many(
        self, states: Sequence[LlamaState], candidates: Sequence[Sequence[Candidate]]
    ) -> list[Verdict]:
        """Every request's raw scores, all candidates in one batch of sequences, with the evidence."""
        out: list[Verdict] = []
        with self.lock:
            group: list[int] = []
            for r in range(len(states)):
                held = sum(len(candidates[i]) for i in group)
                if group and (len(group) == self.slots or held + len(candidates[r]) > SCORE_SEQUENCES):
                    out += self._score_group([states[i] for i in group], [candidates[i] for i in group])
                    group = []
                group.append(r)
            if group:
                out += self._score_group([states[i] for i in group], [candidates[i] for i in group])
        return out

    def _score_group(
        self, states: Sequence[LlamaState], candidates: Sequence[Sequence[Candidate]]
    ) -> list[Verdict]:
        slots = self._claim(states)
        plans = self._plan(states, slots, candidates)
        sequence = self.slots
        wanted: list[list[tuple[int, int, int]]] = []  # per item: the (request, candidate, tail index)s
        kept: list[list[tuple[int, tuple[int, ...]]]] = []  # per request: (sequence, its tokens)
        values: list[list[list[tuple[float, float]]]] = []
        tops: dict[tuple[int, int, int], tuple[tuple[str, float], ...]] = {}  # asked: alternatives
        items: list[Item] = []
        for r, (state, slot, (shared, rows)) in enumerate(zip(states, slots, plans)):
            kept.append([])
            values.append([])
            paths = []
            for c, (keep, tail, own) in enumerate(rows):
                values[r].append(list(own) if own is not None else [(0.0, 0.0)] * len(tail))
                if own is not None:
                    continue
                kept[r].append((sequence, (*state.ids[:keep], *tail)))
                self.lib.llama_memory_seq_cp(self.memory, slot, sequence, 0, shared)
                paths.append(CandidatePath(c, sequence, (*state.ids[shared:keep], *tail), keep - 1 - shared))
                sequence += 1
            request_items, scored = candidate_items(paths, shared, self.share_prefixes)
            items += request_items
            wanted += [[(r, c, t) for c, t in each] for each in scored]
        try:
            for i, row in self._decode(items, "verify"):
                for r, c, t in wanted[i]:
                    values[r][c][t] = logit_and_logprob(row, plans[r][1][c][1][t])
                    if k := states[r].settings.top_logprobs:
                        found = top_tokens(row, k)
                        tops[r, c, t] = tuple((str(self.tokenizer.decode([a])), v) for a, v in found)
        except BaseException:
            self._drop_candidates()
            raise
        return self._verdicts(states, plans, values, kept, tops)

    def _plan(
        self, states: Sequence[LlamaState], slots: Sequence[int], candidates: Sequence[Sequence[Candidate]]
    ) -> list[Plan]:
        """Each request's scored tokens per candidate, and its context read into its slot up to the
        cells every decoded candidate copies from there."""
        plans = []  # per request: its shared context length and (keep, tail, own values) per candidate
        items: list[Item] = []
        for state, slot, cands in zip(states, slots, candidates):
            rows = []
            for cand in cands:
                keep, _, tail = drafting.scored_tokens(
                    self.encode,
                    state.ids,
                    state.prompt_len,
                    state.answer,
                    cand.text,
                    cand.final,
                    self.end_marker,
                )
                rows.append((keep, tail, self._own_values(state, cand, keep, tail)))
            decoded = [keep for keep, _, own in rows if own is None]
            shared = min(decoded, default=1) - 1  # cells every decoded candidate copies from the slot
            start = self._rewind(slot, state.ids[:shared], keep_beyond=True)
            items += [(slot, pos, state.ids[pos], False) for pos in range(start, shared)]
            plans.append((shared, rows))
        for _ in self._decode(items, "context"):  # contexts the slots lacked (a slot lent to another request)
            pass
        return plans

    def _verdicts(
        self,
        states: Sequence[LlamaState],
        plans: Sequence[Plan],
        values: Sequence[Sequence[Sequence[tuple[float, float]]]],
        kept: Sequence[list[tuple[int, tuple[int, ...]]]],
        tops: dict[tuple[int, int, int], tuple[tuple[str, float], ...]],
    ) -> list[Verdict]:
        """Each request's scores and their evidence; its kept candidate sequences noted for accept()."""
        out: list[Verdict] = []
        for r, (state, (_, rows), per_candidate, held) in enumerate(zip(states, plans, values, kept)):
            state.verified = (self.generation, tuple(held)) if held else None
            details = tuple(
                TokenScores(
                    tuple(str(self.tokenizer.decode([t])) for t in tail),
                    tuple(v[0] for v in scores),
                    tuple(v[1] for v in scores),
                    tuple(tops[r, c, t] for t in range(len(tail))) if state.settings.top_logprobs else (),
                )
                for c, ((_, tail, _), scores) in enumerate(zip(rows, per_candidate))
            )
            out.append(([d.mean(state.settings.score) for d in details], details))
        return out

    def _own_values(
        self, state: LlamaState, cand: Candidate, keep: int, tail: Sequence[int]
    ) -> tuple[tuple[float, float], ...] | None:
        """With own_draft_scores, the values of this member's own candidate as it drafted them, when it
        reads the candidate as the very tokens it drafted, in the same context; None: decode it.
        Under a quantized model's batched kernels these differ from a verify pass's in the last bits
        (up to 0.2 of a logit measured, as a request's logits already do with what shares its batch)."""
        # Alternatives were not kept while drafting: a request that asks for them decodes its own too.
        own = state.settings.own_draft_scores and cand.member == self.name and not state.settings.top_logprobs
        if not own or state.drafted is None or keep != len(state.ids):
            return None
        tokens, values = state.drafted
        if tuple(tail) != tokens[: len(tail)]:
            return None
        return values[: len(tail)]
