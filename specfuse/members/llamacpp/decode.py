"""LlamaCppMember's decoding machinery (a mixin of member.py's member): its KV cache's slots and
candidate sequences, llama_decode calls in batches, and what a row of logits gives (a token picked,
a token's logit and log-probability).

One llama.cpp context per member holds a unified KV cache shared by sequences: the first `slots`
keep recent requests' contexts, the next SCORE_SEQUENCES hold a verify pass's candidates. These
methods are the member's own, read apart; what they use of it is declared below, for the type checker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...config import MemberSettings
from ...errors import MemberError
from .. import drafting, profiling
from ..drafting import TokenState, common_prefix_len
from ..workers import thread_share

SCORE_SEQUENCES = 48  # candidates one verify pass holds at once (more go in further passes)
BATCH_TOKENS = 512  # tokens per llama_decode call


@dataclass
class LlamaState(TokenState):
    """One request's context in one llama.cpp member; its KV lives in whichever slot holds it."""

    slot: int | None = None  # the slot that last held this request's context (a hint: slots are shared)
    drafts: int = 0  # drafts made so far: each sampled draft gets its own seed
    # The last verify pass's candidate sequences and the tokens in each, while they are kept (its
    # generation): the accepted candidate's cells move into the slot instead of being decoded again.
    verified: tuple[int, tuple[tuple[int, tuple[int, ...]], ...]] | None = None
    surprise: float | None = None  # nats per byte of the prompt's own text (settings.measure_prompt)
    # This member's own draft from these ids: its tokens and each one's (logit, logprob) as drafted.
    # With own_draft_scores, verification takes its own candidate's values from here.
    drafted: tuple[tuple[int, ...], tuple[tuple[float, float], ...]] | None = None
    reading: Any = None  # opened (open_many): its prompt, until prefill_many has read it whole
    # While read in parts with settings.measure_prompt: the negative log-likelihood of each of the
    # question's own tokens so far, by the position that predicts it.
    nll: dict[int, float] | None = None


# A token to decode: (sequence, position, token id, whether its logits are wanted). A verify pass's
# token that begins several candidates at once belongs to all their sequences (a tuple of them).
Item = tuple[int | tuple[int, ...], int, int, bool]


def sequences_of(seq: int | tuple[int, ...]) -> tuple[int, ...]:
    return seq if isinstance(seq, tuple) else (seq,)


class LlamaDecoding:
    """LlamaCppMember's slots, candidate sequences and decode calls."""

    if TYPE_CHECKING:  # LlamaCppMember's (member.py)
        name: str
        lib: Any
        ctx: Any
        batch: Any
        memory: Any
        slots: int
        threads: int
        n_vocab: int
        cached: list[list[int]]
        last_used: list[float]
        generation: int
        _threads_now: int
        lock: threading.Lock
        tokenizer: Any
        prompt_format: Any

    def _claim(self, states: Sequence[LlamaState], drop: bool = True) -> list[int]:
        """A distinct slot per request: the one holding the longest prefix of its context, else the
        least recently used. `drop` False: the last verify pass's candidates stay (a prompt read
        between a round's accept and the next draft leaves the accepted cells to be adopted)."""
        taken: list[int] = []
        now = time.monotonic()
        for state in states:
            free = [s for s in range(self.slots) if s not in taken]
            best = max(free, key=lambda s: (common_prefix_len(self.cached[s], state.ids), s == state.slot))
            if common_prefix_len(self.cached[best], state.ids) == 0:
                best = min(free, key=lambda s: self.last_used[s])
            taken.append(best)
            state.slot = best
            self.last_used[best] = now
            self._adopt(state, best)
        if drop:
            self._drop_candidates()
        return taken

    def prefill_many(self, states: Sequence[LlamaState], budget: int) -> list[bool]:
        """Decode at most `budget` more prompt tokens in all into the requests' slots, the first's
        first (with the logits that measure a prompt's surprise, when asked for)."""
        with self.lock:
            for state in states:
                if state.reading is not None and budget > 0:
                    budget -= self._read_part(state, budget)
        return [state.reading is None for state in states]

    def _read_part(self, state: LlamaState, budget: int) -> int:
        """Decode at most `budget` more of the prompt into the request's slot (chunked prefill); the
        tokens decoded. Its last token is left to the first draft, which decodes it for its logits;
        a slot lent to another request meanwhile is read again from where they part."""
        (slot,) = self._claim([state], drop=False)
        span = None
        if state.settings.measure_prompt:
            span = drafting.prompt_span(self.tokenizer, self.prompt_format, state.reading, state.ids)
        wanted = {t - 1: state.ids[t] for t in span[0]} if span else {}  # position t-1 predicts token t
        if wanted and state.nll is None:  # a cached prefix would skip positions whose logits are wanted
            self.lib.llama_memory_seq_rm(self.memory, slot, -1, -1)
            self.cached[slot], state.nll = [], {}
        end = state.prompt_len - 1
        upto = min(end, common_prefix_len(self.cached[slot], state.ids[:end]) + budget)
        start = self._rewind(slot, state.ids[:upto], keep_beyond=True)
        items: list[Item] = [(slot, p, state.ids[p], p in wanted) for p in range(start, upto)]
        for i, row in self._decode(items, "prompt"):
            assert state.nll is not None
            state.nll[items[i][1]] = -logit_and_logprob(row, wanted[items[i][1]])[1]
        if upto == end:
            if span is not None:
                state.surprise = sum((state.nll or {}).values()) / max(1, span[1])
            state.reading = None
        return upto - start

    def _adopt(self, state: LlamaState, slot: int) -> None:
        """Move the cells of the request's verified candidate that its context now continues with
        (the accepted one) into its slot: what HFMember's reuse of verified keys and values does."""
        if state.verified is None or state.verified[0] != self.generation:
            return
        seq, tokens = max(state.verified[1], key=lambda kept: common_prefix_len(kept[1], state.ids))
        state.verified = None
        have, reach = common_prefix_len(self.cached[slot], state.ids), common_prefix_len(tokens, state.ids)
        if reach > have and self.lib.llama_memory_seq_rm(self.memory, slot, have, -1):
            self.lib.llama_memory_seq_cp(self.memory, seq, slot, have, reach)
            self.cached[slot] = list(state.ids[:reach])

    def _drop_candidates(self) -> None:
        for seq in range(self.slots, self.slots + SCORE_SEQUENCES):
            self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self.generation += 1

    def _rewind(self, slot: int, ids: Sequence[int], keep_beyond: bool = False) -> int:
        """Cut the slot back to its common prefix with `ids`; returns the first position to decode.
        The last token is always decoded again (its logits are the next token's), unless
        `keep_beyond`: then only missing tokens are, and cells past `ids` stay if `ids` is a prefix."""
        cached = self.cached[slot]
        start = common_prefix_len(cached, ids)
        if keep_beyond and start == len(ids):
            return start
        if not keep_beyond:
            start = min(start, len(ids) - 1)
        if not self.lib.llama_memory_seq_rm(self.memory, slot, start, -1):
            self.lib.llama_memory_seq_rm(self.memory, slot, -1, -1)
            start = 0
        del cached[start:]
        cached.extend(ids[start:])  # decoded by the caller's next _decode
        return start

    def _decode(self, items: Sequence[Item], what: str) -> Iterator[tuple[int, np.ndarray]]:
        """Decode `items` in order, BATCH_TOKENS at a time; yields (item index, logits row) for the
        items whose logits are wanted. A row is llama.cpp's own buffer: read it before the next.
        `what`: the purpose the profile counts the calls under (draft, verify, prompt)."""
        batch = self.batch
        for begin in range(0, len(items), BATCH_TOKENS):
            chunk = items[begin : begin + BATCH_TOKENS]
            used: set[int] = set()
            for j, (seq, pos, token, wants) in enumerate(chunk):
                seqs = sequences_of(seq)
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = token, pos, len(seqs)
                for k, s in enumerate(seqs):
                    batch.seq_id[j][k] = s
                batch.logits[j] = wants
                used.update(seqs)
            batch.n_tokens = len(chunk)
            self._use_threads()
            began = time.perf_counter()
            status = self.lib.llama_decode(self.ctx, batch)
            if status == 1 and self._evict(used):
                status = self.lib.llama_decode(self.ctx, batch)
            if profiling.active():
                seconds = time.perf_counter() - began
                profiling.add("llama_decode", self.name, what, seconds=seconds, items=len(chunk))
                profiling.add("llama_sequences", self.name, what, seconds=0.0, items=len(used))
                profiling.add("threads", self.name, seconds=0.0, items=self._threads_now)
                began = time.perf_counter()
            if status != 0:
                for seq in {s for s in used if s < self.slots}:  # its cells are unknown now
                    self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
                    self.cached[seq] = []
                why = "its KV cache is full" if status == 1 else f"status {status}"
                raise MemberError(
                    f"{self.name}: llama.cpp could not decode ({why}); "
                    "fewer requests at once or a shorter answer budget"
                )
            rows = 0
            for j, (seq, _, token, wants) in enumerate(chunk):
                if isinstance(seq, int) and seq < self.slots and len(self.cached[seq]) <= batch.pos[j]:
                    self.cached[seq].append(token)  # a drafted token, now in the slot's cells
                if wants:
                    rows += 1
                    row = self.lib.llama_get_logits_ith(self.ctx, j)
                    yield begin + j, np.ctypeslib.as_array(row, (self.n_vocab,))
            # The caller's time with the rows (picking a token, a log-softmax each), in Python
            profiling.add("llama_rows", self.name, what, seconds=time.perf_counter() - began, items=rows)

    def _evict(self, busy: set[int]) -> bool:
        """Free the slots this call does not use, to make room; whether any cells were freed."""
        idle = [s for s in range(self.slots) if s not in busy and self.cached[s]]
        for s in idle:
            self.lib.llama_memory_seq_rm(self.memory, s, -1, -1)
            self.cached[s] = []
        return bool(idle)

    def _use_threads(self) -> None:
        """This member's share of the cores now (members at once), else all it was given."""
        threads = thread_share() or self.threads
        if threads != self._threads_now:
            self.lib.llama_set_n_threads(self.ctx, threads, threads)
            self._threads_now = threads


@dataclass(frozen=True)
class CandidatePath:
    """One candidate of a verify pass, as the tokens its sequence decodes from the pass's start."""

    candidate: int  # its index among the request's candidates
    sequence: int  # its KV sequence
    tokens: tuple[int, ...]  # the context's tokens it re-reads, then its own (the tail)
    first_scored: int  # the index in `tokens` whose logits score the tail's first token


def candidate_items(
    paths: Sequence[CandidatePath], start: int, share: bool
) -> tuple[list[Item], list[list[tuple[int, int]]]]:
    """A verify pass's tokens for one request's candidates, each path at positions from `start`; and
    for each item the (candidate, tail index) pairs its logits score. With `share` the paths form a
    prefix tree: a token that candidates reach by the same tokens is decoded once, in all their
    sequences, and its logits score each of them. Candidates often begin alike (drafts that agree on
    their first words, or whole drafts alike), and a member's context then reads them once, not once
    per candidate. The items come parents first, as a sequence's positions must."""
    items: list[tuple[list[int], int, int]] = []
    scored: list[list[tuple[int, int]]] = []
    nodes: dict[tuple[int, int], int] = {}  # shared: (parent item, -1 at the root; token) → item
    for path in paths:
        parent = -1
        for t, token in enumerate(path.tokens):
            key = (parent, token) if share else (-1 - path.sequence, t)  # unshared: its own
            i = nodes.get(key)
            if i is None:
                i = nodes[key] = len(items)
                items.append(([], start + t, token))
                scored.append([])
            items[i][0].append(path.sequence)
            if path.first_scored <= t < len(path.tokens) - 1:
                scored[i].append((path.candidate, t - path.first_scored))
            parent = i
    out: list[Item] = [
        (seqs[0] if len(seqs) == 1 else tuple(seqs), pos, token, bool(scored[i]))
        for i, (seqs, pos, token) in enumerate(items)
    ]
    return out, scored


def logit_and_logprob(row: np.ndarray, token: int) -> tuple[float, float]:
    """A token's raw logit and its log-probability under the row's softmax."""
    top = float(row.max())
    logit = float(row[token])
    return logit, logit - top - float(np.log(np.exp(row - top).sum()))


def top_tokens(row: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The row's k likeliest tokens with their log-probabilities, likeliest first."""
    top = float(row.max())
    norm = top + float(np.log(np.exp(row - top).sum()))
    best = np.argpartition(row, -k)[-k:] if k < len(row) else np.arange(len(row))
    ranked = sorted((int(t) for t in best), key=lambda t: -float(row[t]))
    return [(t, float(row[t]) - norm) for t in ranked]


def token_and_runner_up(row: np.ndarray, token: int) -> tuple[float, float]:
    """The log-probability of `token` and of the most likely other token, under the row's softmax
    (a draft's confidence, for the gate)."""
    top = float(row.max())
    norm = top + float(np.log(np.exp(row - top).sum()))
    two = np.argpartition(row, -2)[-2:]
    other = max((int(t) for t in two if int(t) != token), key=lambda t: float(row[t]))
    return float(row[token]) - norm, float(row[other]) - norm


def pick(row: np.ndarray, settings: MemberSettings, rng: np.random.Generator | None) -> int:
    """The next token: the argmax when greedy, else a sample at the temperature within top_p."""
    if rng is None:
        return int(row.argmax())
    logits = row.astype(np.float64) / settings.temperature
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if settings.top_p >= 1.0:
        return int(rng.choice(len(probs), p=probs))
    order = np.argsort(-probs)
    keep = order[: int(np.searchsorted(np.cumsum(probs[order]), settings.top_p)) + 1]
    return int(rng.choice(keep, p=probs[keep] / probs[keep].sum()))


__all__ = [
    "BATCH_TOKENS",
    "SCORE_SEQUENCES",
    "Item",
    "LlamaDecoding",
    "CandidatePath",
    "LlamaState",
    "candidate_items",
    "logit_and_logprob",
    "pick",
    "sequences_of",
    "top_tokens",
]
