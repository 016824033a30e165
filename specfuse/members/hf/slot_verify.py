"""Verification on static slots (issue 52): every run's candidates scored by a member in one padded
pass on its KV slots (slots.py), captured as a CUDA graph per bucket on a GPU, the same step
uncaptured on a CPU.

The eager pass (verifying.py, scoring.py) packs each run's candidates as blocks, an anchor and
the candidate's tokens, after the run's own cache. Here each run's blocks become a prefix tree
first: tokens that candidates reach by the same tokens from the same anchor (drafts that begin
alike: a common first word, or whole drafts alike) are one node, read once, as llama.cpp's verify
pass does (llamacpp/decode.py.candidate_items). A node sees the cached columns before its block's
anchor and its own ancestors in the tree, nothing else, so its hidden state and its keys are those
each block would have had alone.

A step serves a bucket of runs (slots.BUCKETS), a bucket of tree nodes per run (VERIFY_TOKENS) and
a width of columns: row r's node j is written at column len(run r) + j, after the run's committed
keys (loaded into the slot as for a draft), at its own position for the rotary embedding; padding
nodes and rows see only themselves. Its input is one buffer of [rows, tokens, 4 + tokens] integers
(token, position, column, anchor, then the node's row of the ancestor matrix), so a replay costs one
copy in. Afterwards each run's nodes are laid out again in the eager pass's order (every block
whole, `node_of`), all runs at once (`Read`): its hidden states for the scores, and its keys and
values, gathered out of the slots and kept beside the run's cache (PackedPass.side) rather than
appended to it as the eager pass does, so that accept() notes where the chosen candidate's are
(tailed.py) and the next load joins them, where appending every block and then moving the winner's
into place took four or more copies a layer and run (a kernel launch each on a GPU: 3,584 a round
per member at 32 runs of a 28-layer model). A prompt's read (read_after) appends its keys: they are
committed. A run with more nodes than the largest bucket, or a store in use, verifies eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from . import transfer
from .scoring import Block
from .slots import bucket_of, width_of
from .state import Beside

if TYPE_CHECKING:
    from .slots import SlotStore

VERIFY_TOKENS = (16, 32, 64, 128, 256)  # tree nodes per row of a step; more: the eager pass
CHANNELS = 4  # token, position, column, anchor; then the ancestor row


@dataclass(frozen=True)
class Tree:
    """One run's candidate blocks as a prefix tree: each node's token, position, parent (-1: a root,
    an anchor) and its block's anchor position; and, for each token of the eager layout (the blocks
    one after another), the node that reads it."""

    tokens: tuple[int, ...]
    positions: tuple[int, ...]
    parents: tuple[int, ...]
    anchors: tuple[int, ...]
    node_of: tuple[int, ...]


def tree(blocks: Sequence[Block]) -> Tree:
    """The prefix tree of a run's blocks: a token reached from the same anchor by the same tokens
    is one node (its context, and so its keys and hidden state, are the same in every block)."""
    tokens: list[int] = []
    positions: list[int] = []
    parents: list[int] = []
    anchors: list[int] = []
    node_of: list[int] = []
    nodes: dict[tuple[int, int, int], int] = {}  # (parent, anchor position at a root, token) → node
    for block in blocks:
        parent = -1
        for depth, token in enumerate(block.tokens):
            key = (parent, block.start if parent < 0 else 0, token)
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = len(tokens)
                tokens.append(token)
                positions.append(block.start + depth)
                parents.append(parent)
                anchors.append(block.start)
            node_of.append(node)
            parent = node
    return Tree(tuple(tokens), tuple(positions), tuple(parents), tuple(anchors), tuple(node_of))


def tokens_of(nodes: int) -> int | None:
    """The bucket of tree nodes per row that holds `nodes`; None: more than the largest."""
    return next((b for b in VERIFY_TOKENS if b >= nodes), None)


def inputs(trees: Sequence[Tree], lengths: Sequence[int], rows: int, tokens: int) -> torch.Tensor:
    """The step's input buffer on the CPU, [rows, tokens, CHANNELS + tokens]: each run's nodes after
    its `lengths` committed tokens; padding nodes and rows see only themselves. Built in numpy: torch's
    indexing of a CPU tensor row by row cost seven operations a run (about 1.5 µs each)."""
    host = np.zeros((rows, tokens, CHANNELS + tokens), dtype=np.int64)
    host[:, :, 2] = np.arange(tokens)  # padding rows: columns 0.., nothing committed
    host[:, :, CHANNELS:] = np.eye(tokens, dtype=np.int64)
    for r, (t, length) in enumerate(zip(trees, lengths)):
        n = len(t.tokens)
        host[r, :, 1] = length  # padding nodes: at the first free position
        host[r, :, 2] += length
        host[r, :n, 0] = t.tokens
        host[r, :n, 1] = t.positions
        host[r, :n, 3] = t.anchors
        host[r, :n, CHANNELS : CHANNELS + n] = ancestors(t.parents)
    return torch.from_numpy(host)


def ancestors(parents: Sequence[int]) -> np.ndarray:
    """The [n, n] matrix of who sees whom in a tree: each node its ancestors and itself (parents
    come before their children). In numpy: a few microseconds a node, where torch's indexing of
    the input buffer row by row took tens."""
    out = np.eye(len(parents), dtype=np.int64)
    for node, parent in enumerate(parents):
        if parent >= 0:
            out[node, :node] = out[parent, :node]
    return out


def placeholder(store: SlotStore, rows: int, tokens: int, width: int) -> torch.Tensor:
    """A buffer for capturing the step: every row padding, written at the last columns (no
    committed key of any run reaches there: the width leaves room for a run's tokens after it)."""
    host = inputs([], [], rows, tokens)
    host[:, :, 2] += width - tokens
    return host.to(store.member.device)


def step(
    store: SlotStore, rows: int, tokens: int, width: int
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The verification step for a bucket (slots.StepMaker): a placeholder buffer, and the step."""
    return placeholder(store, rows, tokens, width), lambda buffer: forward(store, buffer)


def forward(store: SlotStore, buffer: torch.Tensor) -> torch.Tensor:
    """The step itself, fixed in shape for a bucket of rows and tokens and a width: the input buffer
    → the final hidden states [rows, tokens, H]. Captured as is on CUDA: no host synchronisation."""
    member, width = store.member, store.shape.width
    tokens, positions, columns, anchors = (buffer[..., c] for c in range(CHANNELS))  # [rows, Q]
    ancestors = buffer[..., CHANNELS:] != 0  # [rows, Q, Q]
    count = tokens.shape[1]
    store.shape.columns = columns
    column = torch.arange(width, device=buffer.device)[None, :]  # [1, W]
    node = column - columns[:, :1]  # [rows, W]: the node a column holds, where in [0, Q)
    packed = (node >= 0) & (node < count)
    node = node.clamp(0, count - 1)
    # A node sees the committed columns before its anchor, and the columns of its ancestors.
    allowed = torch.gather(ancestors, 2, node[:, None, :].expand(-1, count, -1)) & packed[:, None, :]
    committed = column < columns[:, :1]  # [rows, W]: the run's own tokens (row r: its length)
    allowed |= (column[:, None, :] < anchors[:, :, None]) & committed[:, None, :]
    near = None
    if member.sliding_window is not None:
        key_positions = torch.where(packed, torch.gather(positions, 1, node), column)  # [rows, W]
        near = key_positions[:, None, :] > positions[:, :, None] - member.sliding_window
    return store.read(tokens, positions, allowed, near)


@dataclass(frozen=True)
class Read:
    """What a step on the slots read for each run, in the eager layout (its blocks one after
    another): its hidden states [tokens, H], and per layer every run's keys and values
    [n, kv heads, P, head dim] (run r's first sizes[r] tokens, then padding), gathered out of the
    slots (the next step overwrites those)."""

    hidden: list[torch.Tensor]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    sizes: list[int]
    stacked: tuple[torch.Tensor, torch.Tensor] | None = None  # every layer's kv at once (a Stack's)

    def beside(self, r: int) -> Beside:
        """Run r's keys and values, to keep beside its cache (PackedPass.side)."""
        return Beside(self.kv, r, self.sizes[r], self.stacked)

    def append(self, caches: Sequence[DynamicCache]) -> None:
        """Each run's keys and values appended to its cache (a prompt's: committed from now on)."""
        for r, cache in enumerate(caches):
            layers, beside = cast("list[DynamicLayer]", cache.layers), self.beside(r)
            for mine, (keys, values) in zip(layers, beside.columns(0, beside.size)):
                assert mine.keys is not None and mine.values is not None
                mine.keys = torch.cat([mine.keys, keys], dim=-2)
                mine.values = torch.cat([mine.values, values], dim=-2)


def verify(
    store: SlotStore,
    caches: Sequence[DynamicCache],
    blocks: Sequence[Sequence[Block]],
    *,
    kind: str = "verify",
) -> Read | None:
    """Every run's blocks read in one step on the slots (`caches`: the runs' own, holding exactly
    their committed tokens, which stay as they are); None: nothing done, verify eagerly (too many
    nodes, a store in use or unsupported). `kind` counts the pass in the store's counts ("verify",
    or "prefill": read_after's)."""
    trees = [tree(b) for b in blocks]
    tokens = tokens_of(max(len(t.tokens) for t in trees))
    if tokens is None:
        return None
    lengths = [c.get_seq_length() for c in caches]
    width = width_of(max(lengths) + tokens)
    if not store.hold(caches, "verify", tokens, width):
        return None
    try:
        rows, n = bucket_of(len(caches)), len(caches)
        host = inputs(trees, lengths, rows, tokens)
        key = ("verify", rows, tokens, width)
        store.counts[f"{kind}_replays"] += key in store.graphs
        store.counts["prefills" if kind == "prefill" else "verifies"] += 1
        hidden = store.run(key, host, lambda x: forward(store, x))
        # Every run's nodes in the eager layout, all runs at once (a gather per layer, not one per
        # run): [n, P] nodes, a short run's padded with its last (read again, never used).
        sizes = [len(t.node_of) for t in trees]
        padded = [list(t.node_of) + [t.node_of[-1]] * (max(sizes) - len(t.node_of)) for t in trees]
        nodes = transfer.tensor_on(padded, hidden.device)  # [n, P]
        laid = torch.gather(hidden[:n], 1, nodes[:, :, None].expand(-1, -1, hidden.shape[-1]))  # a copy
        columns = (nodes + transfer.tensor_on(lengths, nodes.device)[:, None])[:, None, :, None]
        if store.stack is not None and store.stacked:  # every layer's in one gather (slot_layer.Stack)
            keys, values = store.stack.at_width(width)  # [layers, rows, kv heads, width, head dim]
            at = columns[None].expand(keys.shape[0], -1, keys.shape[2], -1, keys.shape[4])
            both = torch.gather(keys[:, :n], 3, at), torch.gather(values[:, :n], 3, at)
            kv = [(both[0][i], both[1][i]) for i in range(keys.shape[0])]
        else:
            kv, both = [], None
            for layer in store.layers:
                assert layer.keys is not None and layer.values is not None
                at = columns.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])  # [n, kv heads, P, D]
                kv.append((torch.gather(layer.keys[:n], 2, at), torch.gather(layer.values[:n], 2, at)))
        return Read([laid[r, :size] for r, size in enumerate(sizes)], kv, sizes, both)
    finally:
        store.end()


def read_after(
    store: SlotStore, caches: Sequence[DynamicCache], rows: Sequence[Sequence[int]]
) -> list[torch.Tensor] | None:
    """Each row's tokens (a prompt's, at most VERIFY_TOKENS[-1]) read after its run's cache in one
    verification step: a chain, one block anchored just past the cache (it sees every cached
    column). A prefill on the slots, captured on a GPU where the eager pass is launch-bound. The
    tokens' hidden states [n, H], their keys and values appended to the caches; None: read eagerly."""
    blocks = [[Block(cache.get_seq_length(), tuple(row))] for cache, row in zip(caches, rows)]
    read = verify(store, caches, blocks, kind="prefill")
    if read is None:
        return None
    read.append(caches)
    return read.hidden


__all__ = [
    "VERIFY_TOKENS",
    "Read",
    "Tree",
    "ancestors",
    "forward",
    "inputs",
    "placeholder",
    "read_after",
    "step",
    "tokens_of",
    "tree",
    "verify",
]
