"""A run's cache layer whose last columns may still lie in a verification's keys (issue 52).

accept() after a verification on the KV slots appended the winner's keys and values to the run's
cache, a concatenation a layer for keys and values: a kernel launch each on a GPU, 1,792 a round a
member at 32 runs of a 28-layer model, two thirds of the launches a round makes outside the steps
(tools/slot_launches.py). Now accept() only notes where they are (`Tail`: the verification's keys,
the run's row and the winner's columns), and the next load into the slots (slots.SlotStore._load),
which concatenates every run's keys anyway to write them into the slots in one indexed write a
layer, takes the winner's columns into that concatenation and rebases the run's layer on its part
of it: no kernel of its own. Whatever else reads a layer's `keys` or `values` (an eager pass, a
crop, a copy a run into the slots on a CPU) gets them joined first, so the rest of the code, and
transformers', sees a plain DynamicLayer.

Where the slots hold every layer in one allocation (slot_layer.Stack), a load rebases all of a run's
layers at the same columns of its concatenation, and the verification's keys are one gather of every
layer: the next load then takes the run whole (`run_parts`: a view of its span and one of its tail),
not two views a layer (3,584 a load at 32 runs of a 28-layer model).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

Pair = tuple[torch.Tensor, torch.Tensor]  # keys and values
Span = tuple[Pair, int, int, int]  # (a load's concatenations, a layer's place in them, begin, end)
IDLE_LOADS = 8  # a store's loads a layer may go unloaded before it is copied out (Loads)


@dataclass(frozen=True)
class Tail:
    """The winner's keys and values where a verification left them: per layer every run's
    [runs, kv heads, nodes, head dim] (state.Beside.kv), this run's row, and its columns; and, from
    a stacked store's one gather, every layer's at once (`stacked`: [layers, runs, kv heads, nodes,
    head dim]; None from a store a layer at a time)."""

    kv: list[Pair]
    row: int
    begin: int
    count: int
    stacked: Pair | None = None

    def piece(self, layer: int, which: int) -> torch.Tensor:
        """Layer `layer`'s keys (which=0) or values (1) of the winner, [kv heads, count, head dim]."""
        return self.kv[layer][which][self.row, :, self.begin : self.begin + self.count]

    def block(self, which: int) -> torch.Tensor:
        """Every layer's keys (which=0) or values (1) of the winner, [kv heads, layers, count, head
        dim]: two views, where `piece` is one a layer."""
        assert self.stacked is not None, "a tail of a store a layer at a time"
        return self.stacked[which][:, self.row, :, self.begin : self.begin + self.count].transpose(0, 1)


def _joined(which: int) -> property:
    """TailedLayer's `keys` (which=0) or `values` (1): read or written joined, under the lock (a
    write keeps the other's tail: it is joined first)."""

    def read(layer: TailedLayer) -> torch.Tensor | None:
        with layer._lock:
            layer._join()
            return layer._kv[which]

    def write(layer: TailedLayer, tensor: torch.Tensor | None) -> None:
        with layer._lock:
            layer._join()
            layer._kv[which] = tensor

    return property(read, write)


class TailedLayer(DynamicLayer):
    """A DynamicLayer (full attention) that holds its committed keys and values in up to two parts:
    its own (tensors, or a span of a load's concatenation, not yet sliced: a view made at every load
    for every run and layer is host work too), and a Tail after them, not joined to them. Reading
    `keys` or `values` joins them (one concatenation each); `pieces` and `rebase` let a load into the
    slots do it with no kernel of its own."""

    def __init__(self, layer: DynamicLayer, index: int) -> None:
        # Not CacheLayerMixin.__init__: it empties keys and values, which are its own parts here.
        self.dtype, self.device, self.is_initialized = layer.dtype, layer.device, True
        self._kv: list[torch.Tensor | None] = [layer.keys, layer.values]
        # A span of a load's concatenations: (keys and values [kv heads, layers, N, head dim], this
        # layer's place among those layers, begin, end); None: its own tensors in _kv.
        self._span: Span | None = None
        self.index = index  # its layer number: which of a Tail's layers is its own
        self.tail: Tail | None = None
        # The store's count of loads: at which one it was last loaded (`seen`), and the one whose
        # concatenation its keys and values are views of (`based`; None: memory of its own).
        self.seen: int | None = None
        self.based: int | None = None
        # Each change whole: a store's load may copy out (detach) the layer of a run that another
        # caller of the member (another scheduler's thread) is using.
        self._lock = threading.Lock()

    keys = _joined(0)  # type: ignore[assignment]
    values = _joined(1)  # type: ignore[assignment]

    def get_seq_length(self) -> int:
        """The committed tokens, the tail's among them, without joining them."""
        with self._lock:
            return self._length()

    def _length(self) -> int:
        """Under the lock: get_seq_length."""
        if self._span is not None:
            held = self._span[3] - self._span[2]
        else:
            own = self._kv[0]
            held = 0 if own is None or own.numel() == 0 else own.shape[-2]
        return held + (self.tail.count if self.tail is not None else 0)

    def defer(self, keep: int, tail: Tail) -> None:
        """accept()'s: the layer's first `keep` columns, then the `tail` (not joined yet)."""
        with self._lock:
            if self.tail is not None:  # still pending (no load since the last accept): joined first
                self._join()
            if self._span is not None:
                joined, j, begin, end = self._span
                self._span = (joined, j, begin, min(end, begin + keep))
            elif self._kv[0] is not None and self._kv[0].shape[-2] != keep:
                self._kv = [cast(torch.Tensor, t)[..., :keep, :] for t in self._kv]
            self.tail = tail

    def _join(self) -> None:
        """Under the lock: its parts as one tensor each, the span sliced, the tail concatenated."""
        if self._span is not None:
            (keys, values), j, begin, end = self._span
            self._span, self._kv = None, [keys[None, :, j, begin:end], values[None, :, j, begin:end]]
        tail = self.tail
        if tail is not None:
            self.tail, self.based = None, None
            own = cast("list[torch.Tensor]", self._kv)
            self._kv = [torch.cat([own[w], tail.piece(self.index, w)[None]], dim=-2) for w in (0, 1)]

    def pieces(self, which: int) -> list[torch.Tensor]:
        """Its keys (which=0) or values (1) as [kv heads, n, head dim] parts, in order, unjoined."""
        with self._lock:
            if self._span is not None:
                joined, j, begin, end = self._span
                own = joined[which][:, j, begin:end]
            else:
                own = cast(torch.Tensor, self._kv[which])[0]
            return [own] if self.tail is None else [own, self.tail.piece(self.index, which)]

    def rebase(self, joined: Pair, j: int, begin: int, load: int) -> None:
        """Its keys and values a span of load `load`'s concatenations of every run's ([kv heads,
        layers, N, head dim] each), where its own are layer j's from column `begin`: the tail joined by
        that copy."""
        with self._lock:
            end = begin + self._length()
            self._span, self.tail, self.based = (joined, j, begin, end), None, load
            self._kv = [None, None]  # its earlier tensors not kept alive

    def detach(self) -> None:
        """Its keys and values copied out of a load's concatenation, which they no longer keep alive."""
        with self._lock:
            self._join()
            self._kv, self.based = [None if t is None else t.clone() for t in self._kv], None


def tailed(cache: DynamicCache) -> list[TailedLayer]:
    """`cache`'s layers (full layers: what the slots take), each made a TailedLayer where it is not."""
    layers = cache.layers
    for i, layer in enumerate(layers):
        if type(layer) is not TailedLayer:
            layers[i] = TailedLayer(cast(DynamicLayer, layer), i)
    return cast("list[TailedLayer]", layers)


def defer(cache: DynamicCache, keep: int, tail: Tail) -> None:
    """accept() on the KV slots: each layer of `cache` keeps its first `keep` columns, then its part
    of the `tail`, joined later."""
    for layer in tailed(cache):
        layer.defer(keep, tail)


class Loads:
    """A store's loads and the layers rebased on their concatenations. A concatenation holds every
    run's keys of that load, and lives as long as any layer based on it: a layer that is not loaded
    again while the others move on (its run left the store's calls for a while: a member not asked in
    gated rounds, one that left the run under the loop guard, a batch of two loaded a copy a run) is
    copied out of it once IDLE_LOADS loads have passed without it, so that it keeps no other run's
    keys alive for long. Not at the next load: a round makes several (the draft's, a second draft's
    under the gate, the verification's, newcomers' prompts read), each of some of the runs only, and a
    copy is two launches a layer."""

    def __init__(self) -> None:
        self.count = 0
        # The runs' caches a batched load rebased (a cache's layers are loaded and rebased together).
        self._based: weakref.WeakSet[DynamicCache] = weakref.WeakSet()

    def begin(self) -> int:
        self.count += 1
        return self.count

    def rebase(self, layers: Sequence[Any], j: int, begins: Sequence[int], joined: Pair, load: int) -> None:
        """One layer of every run of load `load`, loaded from `joined` (layer j of its layers, the
        runs' columns from `begins`): each seen, and those with a tail rebased on it."""
        for layer, begin in zip(layers, begins):
            if type(layer) is TailedLayer:
                layer.seen = load
                if layer.tail is not None:
                    layer.rebase(joined, j, begin, load)

    def rebase_all(self, cache: DynamicCache, begin: int, joined: Pair, load: int) -> None:
        """Every layer of a run of load `load`, loaded from `joined` (every layer's, at `begin`): all
        rebased on it, as one block (run_parts takes it whole at the next load)."""
        for i, layer in enumerate(tailed(cache)):
            layer.seen = load
            layer.rebase(joined, i, begin, load)

    def seen(self, layers: Sequence[Any], load: int) -> None:
        for layer in layers:
            if type(layer) is TailedLayer:
                layer.seen = load

    def track(self, caches: Sequence[DynamicCache]) -> None:
        """The caches of a batched load: their layers may be views of its concatenations now."""
        self._based.update(caches)

    def release(self, load: int) -> None:
        """After load `load`: the caches idle for IDLE_LOADS loads copied out of what they were based on."""
        for cache in list(self._based):
            head = cache.layers[0]
            if type(head) is TailedLayer and head.seen is not None and load - head.seen < IDLE_LOADS:
                continue  # loaded lately
            for layer in cache.layers:
                if type(layer) is TailedLayer and layer.based is not None:
                    layer.detach()
            self._based.discard(cache)


def plain(caches: Sequence[DynamicCache]) -> bool:
    """Whether every cache is a DynamicCache of full layers (what prefill and accept() make; a
    TailedLayer's own keys are read unjoined)."""
    return all(
        isinstance(cache, DynamicCache)
        and cache.layers
        and all(
            (type(layer) is TailedLayer and layer.is_initialized)
            or (type(layer) is DynamicLayer and layer.keys is not None)
            for layer in cache.layers
        )
        for cache in caches
    )


def run_parts(layers: Sequence[Any], which: int) -> list[torch.Tensor]:
    """A run's keys (which=0) or values (1) of every layer, as [kv heads, layers, n, head dim] parts
    in order. Where its layers are one block (every layer a span of the same concatenation at the same
    columns, with one tail of a stacked store or none: Loads.rebase_all made them so) they are views
    of it, two or four for the run where `pieces` makes two or four a layer; else its layers' parts
    stacked (a launch a part)."""
    # Read without the layers' locks: a span or a tail is replaced whole, never changed in place, and
    # the views taken here are of the tensors the spans name.
    head = layers[0]
    span, tail = head._span if type(head) is TailedLayer else None, getattr(head, "tail", None)
    if (
        span is not None
        and span[1] == 0
        and span[0][0].shape[1] == len(layers)
        and (tail is None or tail.stacked is not None)
        and all(
            type(layer) is TailedLayer
            and layer.tail is tail
            and (s := layer._span) is not None
            and s[0] is span[0]
            and s[1:] == (i, *span[2:])
            for i, layer in enumerate(layers)
        )
    ):
        joined, _, begin, end = span
        own = joined[which][:, :, begin:end]
        return [own] if tail is None else [own, tail.block(which)]
    each = [pieces(layer, which) for layer in layers]
    if len({tuple(p.shape[1] for p in parts) for parts in each}) > 1:  # layers not alike: each joined
        each = [[torch.cat(parts, dim=1)] if len(parts) > 1 else parts for parts in each]
    return [torch.stack(part, dim=1) for part in zip(*each)]


def pieces(layer: Any, which: int) -> list[torch.Tensor]:
    """A run's layer's keys (which=0) or values (1) as [kv heads, n, head dim] parts, unjoined."""
    if type(layer) is TailedLayer:
        return layer.pieces(which)
    return [cast(torch.Tensor, layer.keys if which == 0 else layer.values)[0]]


__all__ = ["IDLE_LOADS", "Loads", "Tail", "TailedLayer", "defer", "pieces", "plain", "run_parts", "tailed"]
