"""Folded grouped-query attention (members/hf/attention.py), what the KV slots attend with: the
same outputs as transformers' own eager attention (which copies each key and value once per query
head first), soft-capped (Gemma 2) or not, for groups of 1, 2 and 7 query heads per key head, one
query a row (a draft's step) or several (a verification's); the switch of a model's attention is
what a slot pass uses (undone after overlapping passes: test_slot_fusion.py)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
from transformers.models.llama.modeling_llama import eager_attention_forward as llama_eager

from specfuse.config import MemberSettings
from specfuse.members.hf import attention
from specfuse.members.hf.scoring import float_mask

from ..conftest import tiny_member


class _Heads(torch.nn.Module):
    """What eager_attention_forward reads of its module."""

    def __init__(self, groups: int, head_dim: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.head_dim, self.training = groups, head_dim, False


@pytest.mark.parametrize("softcap", [None, 20.0])
@pytest.mark.parametrize("queries", [1, 5])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (28, 4)])
def test_folded_attention_equals_eager_attention(heads, kv_heads, queries, softcap):
    torch.manual_seed(heads + queries)
    rows, width, dim = 3, 11, 16
    query = torch.randn(rows, heads, queries, dim)
    key, value = torch.randn(rows, kv_heads, width, dim), torch.randn(rows, kv_heads, width, dim)
    allowed = torch.rand(rows, 1, queries, width) > 0.4
    allowed[..., 0] = True  # every query sees something
    mask = float_mask(allowed, torch.float32)
    module = _Heads(heads // kv_heads, dim)
    eager = gemma2_eager if softcap else llama_eager
    kwargs = {"softcap": softcap} if softcap else {}
    want, _ = eager(module, query, key, value, mask, scaling=dim**-0.5, **kwargs)
    got, weights = attention.folded_attention(module, query, key, value, mask, scaling=dim**-0.5, **kwargs)
    assert weights is None and got.shape == want.shape == (rows, queries, heads, dim)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert not torch.allclose(got[:, :, : heads // 2], got[:, :, heads // 2 :], atol=1e-3)  # heads differ


def test_folded_attention_refuses_what_the_slots_never_give():
    query, key = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(NotImplementedError, match="float mask"):
        attention.folded_attention(_Heads(2, 8), query, key, key, None)


def test_a_draft_on_the_slots_attends_folded_and_an_eager_pass_does_not():
    member = tiny_member("qwen-merges", decode="graphs")
    seen: list[str] = []
    layer = member.base.layers[0].self_attn
    handle = layer.register_forward_pre_hook(
        lambda module, args: seen.append(module.config._attn_implementation)
    )
    try:
        states = [member.start(prompt, MemberSettings(max_new_tokens=50)) for prompt in ("Hi", "Dear diary,")]
        member.draft_many(states, [4, 4])
    finally:
        handle.remove()
    own = member.base.config._attn_implementation
    assert own != attention.NAME
    assert own in seen[:2]  # the prompts, read eagerly
    assert seen[-1] == attention.NAME and seen.count(attention.NAME) >= 3  # the steps on the slots
