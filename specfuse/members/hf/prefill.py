"""Batched prefill: several requests' prompts read in one forward pass per chunk, then each row split
into a cache of its own, laid out as a prompt read alone leaves it.

The rows are right-padded: every prompt starts at position 0 of an empty cache, so the positions
and the causal mask the model makes by itself are right for every row, and a real token never sees
the placeholders after it (they only ever come later). The placeholders' keys and values are cut off
when the rows are split. A pass takes at most `chunk_tokens` query tokens in all (rows × columns),
the bound a single prompt's chunked prefill keeps, so memory stays what it was per pass.

Prompts of very different lengths would waste most of a pass on placeholders: rows are grouped,
longest first, so that a group's placeholders are at most half its real tokens (PAD_SHARE).

Every prompt's context begins with the same tokens (a chat template's system turn and the user
turn's opening: 24 of the 34-94 tokens of Qwen's and SmolLM2's contexts for the app's examples).
A member reads them once (Head) and starts each prompt's cache from a copy of their keys and values.
On the KV slots (the "graphs" decode path: a GPU's default) prompts are read in the slots'
verification steps instead (on_slots): up to 32 prompts' next 256 tokens a step, captured as a CUDA
graph on a GPU, where the eager pass's thousands of small kernels make it launch-bound (the H200's
profile: 50-75 ms a member for one prompt of at most 300 tokens, where reading its weights takes 4-5).
Knows nothing about tokenizers or requests: member.py hands it token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from . import slot_verify
from .slots import BUCKETS, SlotStore

# A group of rows pads each to its longest; the placeholders may add at most this share of the
# group's real tokens (a bound on the wasted work, chosen, not measured: a 2000-token prompt is
# not read beside seven 50-token ones as 8 × 2000 tokens).
PAD_SHARE = 0.5


def groups(lengths: Sequence[int], chunk_tokens: int) -> list[list[int]]:
    """Indices into `lengths`, in groups to read together: longest first, at most `chunk_tokens`
    rows a group, placeholders at most PAD_SHARE of each group's real tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    real = 0
    for i in order:
        if out:
            group = out[-1]
            longest = lengths[group[0]]
            padded = longest * (len(group) + 1)
            if len(group) < chunk_tokens and padded <= (1 + PAD_SHARE) * (real + lengths[i]):
                group.append(i)
                real += lengths[i]
                continue
        out.append([i])
        real = lengths[i]
    return out


@dataclass(frozen=True)
class Head:
    """The tokens every prompt's context begins with, read once: their keys and values per layer
    ([1, heads, n, head_dim]) and their final hidden states [n, H]."""

    ids: tuple[int, ...]
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    hidden: torch.Tensor

    def covers(self, ids: Sequence[int]) -> bool:
        """Whether a context begins with the head and goes on past it."""
        n = len(self.ids)
        return 0 < n < len(ids) and tuple(ids[:n]) == self.ids

    def cache(self, rows: int = 1) -> DynamicCache:
        """A fresh cache holding the head, for `rows` rows. DynamicCache copies what it is given, so
        the head itself is never written to."""
        return DynamicCache([(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self.kv])


def read_head(ids: Sequence[int], forward: Callable[[Sequence[int], DynamicCache], torch.Tensor]) -> Head:
    """Read `ids` once with `forward` (tokens after a cache → their final hidden states)."""
    cache = DynamicCache()
    hidden = forward(ids, cache) if ids else torch.empty(0)
    return Head(tuple(ids), tuple(_keys_values(layer) for layer in cache.layers), hidden)


def _keys_values(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return layer.keys, layer.values


def forward_rows(
    base: Any,
    rows: Sequence[Sequence[int]],
    chunk_tokens: int,
    device: str,
    placeholder: int,
    head: Head | None = None,
) -> tuple[DynamicCache, torch.Tensor]:
    """Read several prompts at once into one fresh cache (after `head`, if given, which every row
    then shares): [B, longest] tokens, right-padded with `placeholder`, fed `chunk_tokens // B`
    columns a pass. Returns the cache and the final hidden states [B, longest, H] of the rows' own
    tokens (a row's placeholders' states are meaningless)."""
    longest = max(len(r) for r in rows)
    ids = torch.tensor([[*r, *[placeholder] * (longest - len(r))] for r in rows], device=device)
    width = max(1, chunk_tokens // len(rows))
    cache = head.cache(len(rows)) if head is not None else DynamicCache()
    parts = []
    for begin in range(0, longest, width):
        out = base(input_ids=ids[:, begin : begin + width], past_key_values=cache, use_cache=True)
        parts.append(out.last_hidden_state)
    return cache, torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def split(cache: DynamicCache, lengths: Sequence[int]) -> list[DynamicCache]:
    """Row b of a batched cache as a cache of its own, its first lengths[b] positions only (the
    placeholders dropped). DynamicCache copies what it is given (its layers concatenate onto an empty
    tensor), so no row keeps the whole batch's tensors alive."""
    rows = []
    for b, n in enumerate(lengths):
        kv = [
            tuple(getattr(layer, name)[b : b + 1, :, :n] for name in ("keys", "values"))
            for layer in cache.layers
        ]
        rows.append(DynamicCache(kv))
    return rows


def empty(store: SlotStore) -> DynamicCache | None:
    """A cache of no tokens with the store's layers' shapes (a prompt read on the slots from its
    first token: the slots take plain layers of keys only); None: the store has no slots yet."""
    pairs = [(layer.keys, layer.values) for layer in store.layers]
    empty = [(k[:1, :, :0], v[:1, :, :0]) for k, v in pairs if k is not None and v is not None]
    return DynamicCache(empty) if empty and len(empty) == len(pairs) else None


def on_slots(
    store: SlotStore,
    caches: Sequence[DynamicCache],
    rows: Sequence[Sequence[int]],
    eager: Callable[[Sequence[int], DynamicCache], torch.Tensor],
) -> list[torch.Tensor]:
    """Each row's tokens read after its cache on the store's slots, part after part (at most the
    largest bucket of runs, each its next VERIFY_TOKENS[-1] tokens, a step); what the slots do not
    take (a store in use by another thread, one that cannot hold these caches) read by `eager`
    (tokens after a cache → their hidden states), row by row. The rows' final hidden states."""
    done = [0] * len(rows)
    parts: list[list[torch.Tensor]] = [[] for _ in rows]
    most, longest = BUCKETS[-1], slot_verify.VERIFY_TOKENS[-1]
    slotted = True
    while slotted and (live := [i for i, row in enumerate(rows) if done[i] < len(row)]):
        for batch in (live[k : k + most] for k in range(0, len(live), most)):
            takes = [rows[i][done[i] : done[i] + longest] for i in batch]
            hidden = slot_verify.read_after(store, [caches[i] for i in batch], takes)
            if hidden is None:
                slotted = False
                break
            for i, take, h in zip(batch, takes, hidden):
                parts[i].append(h)
                done[i] += len(take)
    for i, row in enumerate(rows):
        if done[i] < len(row):
            parts[i].append(eager(row[done[i] :], caches[i]))
    return [torch.cat(p) if len(p) > 1 else p[0] for p in parts]


__all__ = ["PAD_SHARE", "Head", "empty", "forward_rows", "groups", "on_slots", "read_head", "split"]
