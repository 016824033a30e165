"""Attention on the KV slots without copying the keys and values once per query head (issue 52).

A model with grouped-query attention (Qwen2.5-7B: 28 query heads on 4 key/value heads; Llama-3.1-8B
32 on 8; Gemma-2-9B 16 on 8) keeps one key and value per group of query heads. transformers' eager
attention, and its SDPA attention whenever a mask is given (as every step on the slots gives one),
first repeat each key and value for every head of its group (repeat_kv): a step of Qwen2.5-7B at
32 rows and 512 columns writes 6.6 GB of copies and reads them again, beside the 15 GB of weights
the step reads, where the slots' own keys and values are 0.9 GB. Here the group's query heads are
folded into the query length instead: queries [rows, kv heads, group × Q, D] against the keys and
values as they are, [rows, kv heads, W, D], one SDPA call (or, for soft-capped scores, Gemma 2's,
the same products by hand), the mask repeated along the folded queries (a few MB). Same products,
same softmax; only their rounding may differ.

SlotStore.read (slots.py) switches a member's model to this function for its own forward passes
only (`folded`, a context manager); the masks there are always 4-D float masks.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

from .switch import Switch

NAME = "specfuse_folded"


def folded_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """An attention function for transformers' AttentionInterface: query [B, H, Q, D], key and
    value [B, K, W, D] (H a multiple of K), attention_mask [B, 1, Q, W] float (added to the scores)
    → the output [B, Q, H, D], as eager_attention_forward returns it (without the weights)."""
    if (
        attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or kwargs.get("s_aux") is not None
    ):
        raise NotImplementedError(
            f"{NAME}: a [B, 1, Q, W] float mask and no attention sinks, as the slots give"
        )
    rows, heads, count, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    # Head h reads key head h // group (repeat_kv's order): the group's heads, one after another.
    queries = query.reshape(rows, kv_heads, group * count, dim)
    mask = attention_mask[:, :, :, :width]
    if group > 1:
        mask = (
            mask[:, :, None]
            .expand(rows, mask.shape[1], group, count, width)
            .reshape(rows, -1, group * count, width)
        )
    if softcap is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            queries, key, value, attn_mask=mask, scale=scale
        )
    else:  # the scale and the cap's division in one product, its product and the mask in one sum
        scores = torch.matmul(queries, key.transpose(2, 3)).mul_(scale / softcap).tanh_()
        scores = torch.add(mask, scores, alpha=softcap)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(weights, value)
    return out.reshape(rows, heads, count, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, folded_attention)
# Masks made while a model is switched (another thread's eager pass on the same model, at that
# moment) are eager's: 4-D float masks, which folded_attention takes.
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)


def _switch_on(config: Any, _: None) -> Any:
    own = config._attn_implementation
    config._attn_implementation = NAME
    return own


def _switch_off(config: Any, own: Any) -> None:
    config._attn_implementation = own


_FOLDED = Switch(_switch_on, _switch_off)


def folded(model: Any) -> AbstractContextManager[None]:
    """`model` (a decoder: its config names its attention) attending with folded_attention inside."""
    return _FOLDED.inside(model.config)


__all__ = ["NAME", "folded", "folded_attention"]
