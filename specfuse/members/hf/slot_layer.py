"""One layer's KV slots as transformers' attention sees them (a cache layer), and the step under way
(its rows, its columns, where its tokens are written): members/hf/slots.py's store holds one per layer.

A layer's memory is allocated once for `rows` runs of `capacity` columns, and a step of another width
sees the same memory shaped [the rows that fit, kv heads, width, head dim]: a step of fewer rows may
be wider than the capacity without a new allocation (a lone run of 3,000 tokens fits a store made
for 32 runs of 512). A captured step reads its view's addresses, which every width shares, so a
step of a new width leaves the other widths' graphs valid; only a step that needs more rows ×
columns than the memory holds makes the store allocate again (and drop every graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers.cache_utils import CacheLayerMixin


@dataclass
class Shape:
    """The step under way: its rows and columns, and where each row's new tokens are written
    ([rows, tokens] tensor of columns, the step's own input, which the layers scatter at: a draft's
    token at its position, a verification's packed tokens after the row's committed ones)."""

    rows: int = 0
    width: int = 0
    columns: torch.Tensor | None = None


class SlotLayer(CacheLayerMixin):
    """One layer's slots, seen by the model as a cache of `shape.rows` rows and `shape.width`
    columns: update() writes each row's new keys and values at that row's own position. `keys` and
    `values` are the memory seen at the width set last (at_width)."""

    is_compileable = True
    is_sliding = False  # every layer keeps all columns; the sliding window is in the mask

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, shape: Shape) -> None:
        super().__init__()
        self.memory = (keys, values)  # [rows, kv heads, capacity, head dim] each, contiguous
        self.keys, self.values, self.shape = keys, values, shape
        self.is_initialized = True
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def at_width(self, width: int) -> None:
        """`keys` and `values` seen as [rows that fit, kv heads, width, head dim] in the same memory
        (views, made once a width)."""
        views = self._views.get(width)
        if views is None:
            k, v = (_shaped(tensor, width) for tensor in self.memory)
            views = self._views[width] = (k, v)
        self.keys, self.values = views

    def fits(self, rows: int, width: int) -> bool:
        """Whether `rows` rows of `width` columns fit in this layer's memory."""
        keys = self.memory[0]
        return rows * width <= keys.shape[0] * keys.shape[2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocated by the store, never lazily."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, width, columns = self.shape.rows, self.shape.width, self.shape.columns
        assert self.keys is not None and self.values is not None and columns is not None
        keys, values = self.keys[:rows, :, :width], self.values[:rows, :, :width]
        at = columns[:, None, :, None]  # [rows, 1, tokens, 1]: each row's tokens at its own columns
        keys.scatter_(2, at.expand_as(key_states), key_states)
        values.scatter_(2, at.expand_as(value_states), value_states)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.shape.width, 0

    def get_seq_length(self) -> int:
        return self.shape.width

    def get_max_length(self) -> int:
        return int(self.keys.shape[2]) if self.keys is not None else 0


class Stack:
    """Every layer's slots in one allocation for keys and one for values, [layers, rows, kv heads,
    capacity, head dim] (where the layers' shapes agree): each SlotLayer's memory is one layer of it,
    so that a load writes every layer's keys at once and a verification gathers every layer's at
    once, an operation a load or a gather instead of one a layer (28 to 42 launches each on a GPU)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.memory = (keys, values)
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def layers(self, shape: Shape) -> list[SlotLayer]:
        keys, values = self.memory
        return [SlotLayer(keys[i], values[i], shape) for i in range(keys.shape[0])]

    def at_width(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values seen as [layers, rows that fit, kv heads, width, head dim]: each layer as
        its SlotLayer sees it at that width (views, made once a width)."""
        views = self._views.get(width)
        if views is None:
            views = self._views[width] = cast(
                "tuple[torch.Tensor, torch.Tensor]", tuple(_stacked(t, width) for t in self.memory)
            )
        return views


def _stacked(memory: torch.Tensor, width: int) -> torch.Tensor:
    """`memory` [layers, rows, heads, capacity, dim] seen as _shaped sees each layer."""
    layers, _, heads, _, dim = memory.shape
    row = heads * width * dim
    fit = memory[0].numel() // row
    return memory.view(layers, -1)[:, : fit * row].view(layers, fit, heads, width, dim)


def _shaped(memory: torch.Tensor, width: int) -> torch.Tensor:
    """`memory` [rows, heads, capacity, dim] seen as [its size // (heads · width · dim), heads, width,
    dim]: the rows that fit, each `width` columns, one after another."""
    _, heads, _, dim = memory.shape
    row = heads * width * dim
    return memory.view(-1)[: memory.numel() // row * row].view(-1, heads, width, dim)


__all__ = ["Shape", "SlotLayer", "Stack"]
