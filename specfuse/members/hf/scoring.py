"""Verify-in-line: pack every candidate into one forward pass on top of a verifier's cached prefix.

Builds the packed input (blocks of tokens, restarted position ids, a float 4-D mask per attention
kind) and reads scores off the final hidden states with only the rows of the output head that are
needed. A pack longer than CHUNK_TOKENS is fed in chunks, each with its own rows of the mask, so
that memory grows linearly with a candidate's length. Knows nothing about texts, chat formats or the
round loop: member.py hands it token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Query tokens per forward pass, in verification (packed candidates) and prefill (a prompt, a branch's
# answer). A pass of C queries after K keys holds a [C, K] mask and [heads, C, K] attention weights:
# with C fixed, memory grows with K, linearly. Whole, a typed segment of 9k tokens needed a [9k, 9k]
# mask and attention per head (the app grew by 21 GB and was killed). Ordinary rounds (N candidates
# of L + 1 tokens) fit in one pass, as do ordinary prompts, so they run as before.
CHUNK_TOKENS = 512
# Log-probabilities need every token's logit: they are made LOGPROB_ROWS rows by VOCAB_SLICE tokens
# at a time, with a running log-sum-exp across the slices. A whole [9k, 152k] float32 block would be
# 5.5 GB; a slice is 8 MB, so the passes over it (float32, soft-capping, exp) stay in the CPU's
# cache instead of streaming rows of 262k floats through memory, while the head's weights are read
# once per LOGPROB_ROWS rows: for the candidates of 8 requests, Gemma 3's head took 169 ms, against
# 459 ms made candidate by candidate over whole rows (tools/verify_logprob.py, verify-logprob.txt).
LOGPROB_ROWS = 256
VOCAB_SLICE = 8192
# On a GPU the same running log-sum-exp takes slices of up to this many bytes of float32 logits
# (LOGPROB_ROWS rows of Gemma 2's 256k tokens: 262 MB, one slice): each slice is a dozen kernel
# launches, and small ones left a GPU launch-bound (issue 52), with no cache to stay within.
GPU_LOGPROB_BYTES = 1 << 30

# A packed block is one candidate: an *anchor* (the last prefix token it builds on, recomputed at
# its own position so that it yields the logit of the candidate's first token) followed by the
# candidate's tokens. Usually the anchor is the last cached token; when the candidate re-tokenizes
# the end of the answer (a merge across the boundary), the anchor sits earlier and the block carries
# the re-tokenized tail. Either way one rule covers both, and no logit is kept from an earlier pass.


@dataclass(frozen=True)
class Block:
    start: int  # absolute position of the anchor: the block sees cached positions [0, start)
    tokens: tuple[int, ...]  # anchor first, then the tokens to score


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor  # [1, Q], Q = Σ len(block.tokens)
    position_ids: torch.Tensor  # [1, Q]: each block restarts at its own anchor position
    offsets: tuple[int, ...]  # [blocks]: where each block begins inside the Q packed tokens
    attention_mask: torch.Tensor | dict[str, torch.Tensor]  # [1, 1, Q, P + Q] float, 0 or finfo.min


@dataclass(frozen=True)
class PackedRows:
    """Several requests' packed blocks, one batch row each, after a stacked (left-padded) cache."""

    input_ids: torch.Tensor  # [B, Q], Q = the longest row; shorter rows end in placeholders
    position_ids: torch.Tensor  # [B, Q]
    offsets: tuple[tuple[int, ...], ...]  # [B][blocks]: where each block begins in its row
    attention_mask: torch.Tensor | dict[str, torch.Tensor]  # [B, 1, Q, T + Q] float
    length: int  # Q


def pack(
    blocks: Sequence[Block],
    prefix_len: int,
    dtype: torch.dtype,
    device: torch.device | str,
    sliding_window: int | None = None,
) -> Packed:
    """Pack candidate blocks after a cache of `prefix_len` tokens.

    A token of block b at position p may see cached keys at positions < b.start and the earlier
    tokens of block b itself; never another block. With `sliding_window`, a second mask keyed
    "sliding_attention" also hides keys more than window - 1 positions back (Gemma-style layers).
    No row is ever fully masked: each token sees itself.
    """
    rows = pack_rows([blocks], [prefix_len], dtype, device, sliding_window)
    return Packed(rows.input_ids, rows.position_ids, rows.offsets[0], rows.attention_mask)


def pack_rows(
    rows: Sequence[Sequence[Block]],
    prefix_lens: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str,
    sliding_window: int | None = None,
) -> PackedRows:
    """Pack each request's blocks into its own batch row (see pack for the visibility rule), with the
    mask of all Q packed tokens at once: [B, 1, Q, T + Q], which grows with Q². Verification feeds a
    Layout chunk by chunk instead (chunk_mask); this whole-mask form is for short packs and tests.

    The cache holds T = max(prefix_lens) columns per row, row r left-padded by T - prefix_lens[r]:
    the padding is never visible. Rows shorter than the longest end in placeholder tokens that
    see only themselves.
    """
    layout = lay_out(rows, prefix_lens, device)
    return PackedRows(
        input_ids=layout.input_ids,
        position_ids=layout.position_ids,
        offsets=layout.offsets,
        attention_mask=chunk_mask(layout, 0, layout.length, dtype, sliding_window),
        length=layout.length,
    )


@dataclass(frozen=True)
class Layout:
    """Where each packed token sits and what it may see, as per-token vectors (no Q × Q matrix): the
    mask of any run of queries is built from it when that run is fed (chunk_mask), so that a long
    candidate costs memory in proportion to its length, not to its square."""

    input_ids: torch.Tensor  # [B, Q]
    position_ids: torch.Tensor  # [B, Q]
    offsets: tuple[tuple[int, ...], ...]  # [B][blocks]: where each block begins in its row
    length: int  # Q
    width: int  # T: cached columns per row (left-padded to the longest)
    q_owner: torch.Tensor  # [B, Q]: block index of each packed token (placeholders: their own)
    q_start: torch.Tensor  # [B, Q]: its block's anchor position (cached keys below it are visible)
    k_pos: torch.Tensor  # [B, T + Q]: position of each key (padding: negative)
    k_owner: torch.Tensor  # [B, T + Q]: -1 for cached keys, else the packed token's owner
    k_valid: torch.Tensor  # [B, T + Q]: False for left padding


def lay_out(
    rows: Sequence[Sequence[Block]], prefix_lens: Sequence[int], device: torch.device | str
) -> Layout:
    """The packed tokens of each request's blocks, one batch row each (see pack_rows)."""
    width = max(prefix_lens)
    q_len = max(sum(len(b.tokens) for b in blocks) for blocks in rows)
    ids_rows, pos_rows, owner_rows, start_rows, offsets_rows = [], [], [], [], []
    k_pos_rows, k_owner_rows, k_valid_rows = [], [], []
    for blocks, prefix_len in zip(rows, prefix_lens):
        if not blocks:
            raise ValueError("nothing to pack")
        ids: list[int] = []
        pos: list[int] = []
        owner: list[int] = []
        offsets: list[int] = []
        for b, block in enumerate(blocks):
            if not block.tokens or not 0 <= block.start < prefix_len + 1:
                raise ValueError(f"bad block {b}: start {block.start}, {len(block.tokens)} tokens")
            offsets.append(len(ids))
            ids.extend(block.tokens)
            pos.extend(range(block.start, block.start + len(block.tokens)))
            owner.extend([b] * len(block.tokens))
        starts = [blocks[o].start for o in owner]
        for extra in range(q_len - len(ids)):  # placeholders: each its own block, seeing itself
            ids.append(ids[-1])
            pos.append(prefix_len)
            owner.append(-2 - extra)
            starts.append(0)
        pad = width - prefix_len
        cached = torch.arange(width, device=device)
        q_pos = torch.tensor(pos, device=device)
        k_pos_rows.append(torch.cat([cached - pad, q_pos]))
        cache_owner = torch.full((width,), -1, device=device)
        k_owner_rows.append(torch.cat([cache_owner, torch.tensor(owner, device=device)]))
        k_valid_rows.append(torch.cat([cached >= pad, torch.ones(q_len, dtype=torch.bool, device=device)]))
        ids_rows.append(ids)
        pos_rows.append(pos)
        owner_rows.append(owner)
        start_rows.append(starts)
        offsets_rows.append(tuple(offsets))
    return Layout(
        input_ids=torch.tensor(ids_rows, device=device),
        position_ids=torch.tensor(pos_rows, device=device),
        offsets=tuple(offsets_rows),
        length=q_len,
        width=width,
        q_owner=torch.tensor(owner_rows, device=device),
        q_start=torch.tensor(start_rows, device=device),
        k_pos=torch.stack(k_pos_rows),
        k_owner=torch.stack(k_owner_rows),
        k_valid=torch.stack(k_valid_rows),
    )


def chunk_mask(
    layout: Layout, begin: int, end: int, dtype: torch.dtype, sliding_window: int | None = None
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The float mask of packed queries [begin, end) fed after the cache and packed tokens < begin:
    [B, 1, end - begin, T + end]. A query never sees a packed token after itself, so the keys past
    `end` are not needed: the rows are exactly those of the whole mask, cut at column T + end."""
    keys = layout.width + end
    k_pos, k_owner = layout.k_pos[:, None, :keys], layout.k_owner[:, None, :keys]  # [B, 1, K]
    q_owner, q_start = layout.q_owner[:, begin:end, None], layout.q_start[:, begin:end, None]  # [B, C, 1]
    device = layout.k_pos.device
    k_index = torch.arange(keys, device=device)[None, None, :]
    q_index = (torch.arange(begin, end, device=device) + layout.width)[None, :, None]
    # In place, so that a chunk holds a few [C, K] booleans and one float mask at a time.
    allowed = k_pos < q_start  # [B, C, K]: cached keys before the block's anchor …
    allowed &= (k_owner == -1) & layout.k_valid[:, None, :keys]  # … that are cached, not padding
    same_block = k_owner == q_owner
    same_block &= k_index <= q_index  # the block's own tokens up to the query itself
    allowed |= same_block
    del same_block
    full = float_mask(allowed[:, None], dtype)  # [B, 1, C, K]
    if sliding_window is None:
        return full
    near = k_pos > layout.position_ids[:, begin:end, None] - sliding_window  # within the window
    near &= allowed
    return {"full_attention": full, "sliding_attention": float_mask(near[:, None], dtype)}


def float_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility mask as 0 / finfo.min in the model's dtype.

    Float masks, because with eager attention a boolean mask is silently wrong (MODELS.md).
    [.., Q, K] → [B, 1, Q, K] when given [Q, K] (one row) or [B, 1, Q, K] unchanged in shape.
    """
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    out = torch.where(allowed, zero, blocked)
    return out[None, None] if out.dim() == 2 else out


def vocab_slice(device_type: str, rows: int) -> int:
    """Vocabulary tokens per slice of a log-probability pass of `rows` rows on a device of that type:
    VOCAB_SLICE on a CPU (its cache), as many as GPU_LOGPROB_BYTES hold on a GPU."""
    if device_type != "cuda":
        return VOCAB_SLICE
    return max(VOCAB_SLICE, GPU_LOGPROB_BYTES // (4 * max(1, rows)))


def sliding_window_of(config: object) -> int | None:
    """The sliding window of a model whose layers mix full and sliding attention, else None."""
    layer_types = getattr(config, "layer_types", None) or ()
    window = getattr(config, "sliding_window", None)
    return int(window) if window and "sliding_attention" in layer_types else None


class OutputHead:
    """The model's output head applied to chosen rows only, as the model itself would apply it.

    Scoring needs one logit per candidate token, not a full vocabulary row for every position:
    `token_logits` multiplies each hidden state by the single head row of its target token. The
    post-processing of the head (Gemma's final soft-capping, Cohere's and Granite's scales) is
    reproduced, and tested against the model's own logits.
    """

    def __init__(self, model: Any) -> None:
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings")
        self.weight: torch.Tensor = head.weight  # [V, H]
        self.bias: torch.Tensor | None = getattr(head, "bias", None)  # [V] or None
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.softcap: float | None = getattr(config, "final_logit_softcapping", None)
        self.scale = float(getattr(config, "logit_scale", 1.0) or 1.0)
        self.divide = float(getattr(config, "logits_scaling", 1.0) or 1.0)

    def _finish(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's post-processing of a fresh product, in place (full vocabulary rows are large:
        each pass over them costs about as much as the product that made them)."""
        logits = logits.float()  # a copy from bf16; the product itself when already float32
        if self.scale != 1.0:
            logits.mul_(self.scale)
        if self.divide != 1.0:
            logits.div_(self.divide)
        if self.softcap:
            logits.div_(self.softcap).tanh_().mul_(self.softcap)
        return logits

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits, float32: [..., H] → [..., V], on the head's device."""
        hidden = hidden.to(self.weight.device)  # an accelerate device map may put the head elsewhere
        return self._finish(torch.nn.functional.linear(hidden, self.weight, self.bias))

    def token_logits(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Raw logits of `targets` only: [T, H], [T] → [T], float32."""
        hidden, targets = hidden.to(self.weight.device), targets.to(self.weight.device)
        rows = self.weight[targets]  # [T, H]
        raw = (hidden * rows).sum(-1)
        if self.bias is not None:
            raw = raw + self.bias[targets]
        return self._finish(raw)

    def token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of `targets`: [T, H], [T] → [T], float32: each target's logit less the
        log-sum-exp of its row, both from the same products, made LOGPROB_ROWS × VOCAB_SLICE at a
        time (each row's normalizer is its own, so the chunking changes nothing but rounding)."""
        return self.token_logprobs_top(hidden, targets, 0)[0]

    def token_logprobs_top(
        self, hidden: torch.Tensor, targets: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """token_logprobs, and each row's k likeliest tokens: ([T], [T, k] log-probabilities, [T, k]
        token ids), likeliest first, from the same products (a running top-k across the slices)."""
        hidden, targets = hidden.to(self.weight.device), targets.to(self.weight.device)
        out = [
            self._row_logprobs(hidden[b : b + LOGPROB_ROWS], targets[b : b + LOGPROB_ROWS], k)
            for b in range(0, len(hidden), LOGPROB_ROWS)
        ]
        if not out:
            empty = hidden.new_zeros((0, k), dtype=torch.float32)
            return hidden.new_zeros(0, dtype=torch.float32), empty, empty.long()
        return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out]), torch.cat([o[2] for o in out])

    def _row_logprobs(
        self, hidden: torch.Tensor, targets: torch.Tensor, k: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = len(hidden)
        top = torch.full((rows,), -torch.inf, device=hidden.device)  # running max of each row
        total = torch.zeros(rows, device=hidden.device)  # Σ exp(logit - top)
        picked = torch.zeros(rows, device=hidden.device)  # the target's logit
        best = torch.full((rows, k), -torch.inf, device=hidden.device)  # running top-k logits …
        best_ids = torch.zeros((rows, k), dtype=torch.long, device=hidden.device)  # … and their ids
        size = vocab_slice(self.weight.device.type, rows)
        for begin in range(0, len(self.weight), size):
            end = begin + size
            bias = self.bias[begin:end] if self.bias is not None else None
            logits = self._finish(torch.nn.functional.linear(hidden, self.weight[begin:end], bias))
            # Each target's logit, where its slice holds it: on the device, no read back per slice.
            inside = (targets >= begin) & (targets < end)
            at = (targets - begin).clamp(0, logits.shape[-1] - 1)[:, None]
            picked = torch.where(inside, logits.gather(1, at)[:, 0], picked)
            if k:  # before the slice is turned into exponentials in place
                values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
                merged, order = torch.cat([best, values], -1).topk(k, dim=-1)
                best, best_ids = merged, torch.cat([best_ids, ids + begin], -1).gather(-1, order)
            new_top = torch.maximum(top, logits.amax(dim=-1))
            total = total * torch.exp(top - new_top) + logits.sub_(new_top[:, None]).exp_().sum(dim=-1)
            top = new_top
        norm = top + torch.log(total)
        return picked - norm, best - norm[:, None], best_ids
