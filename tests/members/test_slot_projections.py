"""The projections that read one input, computed as one product in the KV slots' passes
(members/hf/projections.py): each layer's q/k/v and gate/up weights become views of one matrix with
the same values (the eager pass's bits unchanged); inside a slot pass a decoder computes four products
a layer where it computed seven and gives its own hidden states; another thread's pass meanwhile, a
model converted since, a projection called alone or out of order, and layers that cannot share a
matrix compute their own; queries and keys left side by side are rotated without a copy; drafts on
the slots are the same with the merge on and off; seven more architectures merge what they can."""

from __future__ import annotations

import importlib
import threading

import pytest
import torch
from torch.nn import functional
from torch.overrides import TorchFunctionMode

from specfuse.config import MemberSettings
from specfuse.members.hf import fusion, projections

from ..conftest import tiny_member
from ..helpers_fusion import decoder

ARCHS = ["llama", "qwen2", "gemma2", "gemma3"]  # qwen2's q/k/v have biases


class Products(TorchFunctionMode):
    """Counts the calls of torch.nn.functional.linear (one matrix product each)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is functional.linear
        return func(*args, **(kwargs or {}))


def forward(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`model`'s last hidden states for `ids` and how many products it computed."""
    with torch.no_grad(), Products() as products:
        out = model(input_ids=ids).last_hidden_state
    return out, products.count


def layers(model: torch.nn.Module) -> int:
    return int(model.config.num_hidden_layers)


IDS = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("arch", ARCHS)
def test_each_layers_projections_become_views_of_one_matrix_with_the_same_values(arch):
    model = decoder(arch)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    want, products = forward(model, IDS)
    assert products == 7 * layers(model)
    groups = fusion.plan(model).merged
    assert [len(g.parts) for g in groups] == [3, 2] * layers(model)  # q/k/v and gate/up, every layer
    for group in groups:
        assert group.intact()
        rows = group.weight.shape[0]
        assert rows == sum(part.out_features for part in group.parts)
        for part in group.parts:  # lies inside the group's matrix
            offset = part.weight.data_ptr() - group.weight.data_ptr()
            assert 0 <= offset < rows * group.weight.stride(0) * group.weight.element_size()
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], value) for name, value in before.items())
    got, products = forward(model, IDS)  # an eager pass: its own seven products, the same bits
    assert products == 7 * layers(model) and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_decoder_with_merged_projections_computes_four_products_a_layer_and_its_own_states(arch, dtype):
    model = decoder(arch, dtype)
    want, _ = forward(model, IDS)
    with fusion.fused(model):
        got, products = forward(model, IDS)
    assert products == 4 * layers(model)
    assert not any("forward" in vars(m) for g in fusion.plan(model).merged for m in g.parts)  # undone
    if dtype == torch.float32:
        torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=1e-5)
    else:  # the fused norms round once where transformers rounds twice (test_slot_fusion)
        torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.02)


def test_another_threads_pass_meanwhile_computes_its_own_products():
    model = decoder("qwen2")
    want, _ = forward(model, IDS)
    inside, release = threading.Event(), threading.Event()
    seen: list[tuple[torch.Tensor, int]] = []

    def other() -> None:
        inside.wait(5)
        seen.append(forward(model, IDS))
        release.set()

    thread = threading.Thread(target=other)
    thread.start()
    with fusion.fused(model):
        assert all("forward" in vars(m) for g in fusion.plan(model).merged for m in g.parts)
        inside.set()
        release.wait(5)
        mine = forward(model, IDS)
    thread.join()
    ((theirs, products),) = seen
    assert products == 7 * layers(model) and torch.equal(theirs, want)
    assert mine[1] == 4 * layers(model)


def test_a_model_converted_after_its_plan_computes_its_own_products():
    model = decoder("llama")
    groups = fusion.plan(model).merged
    model.double()  # each weight converted on its own: no longer the group's rows
    assert not any(group.intact() for group in groups)
    want, _ = forward(model, IDS)
    with fusion.fused(model):
        got, products = forward(model, IDS)
    assert products == 7 * layers(model)
    # (transformers' norm computes in float32 whatever the dtype, the fused one in float64 here)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class Block(torch.nn.Module):
    """Calls its projections as transformers does not: up before gate, k on another input, v never."""

    def __init__(self) -> None:
        super().__init__()
        for name, size in [("q_proj", 8), ("k_proj", 4), ("v_proj", 4), ("gate_proj", 6), ("up_proj", 6)]:
            setattr(self, name, torch.nn.Linear(5, size, bias=False))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [self.up_proj(x), self.gate_proj(x), self.q_proj(x), self.k_proj(y)]


def test_projections_called_out_of_order_or_on_another_input_give_their_own_products():
    block = Block()
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    want = block(x, y)
    (qkv, gate_up) = projections.merge(block)
    with projections.merged(block, (qkv, gate_up)), Products() as products:
        got = block(x, y)
    # up computes gate/up at once and gate takes its part; q computes q/k/v; k, on y, its own
    assert products.count == 3
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


class Quantised(torch.nn.Linear):
    """A subclass of Linear (as a quantised layer is): its weight is not what it multiplies by."""


def test_layers_that_cannot_share_a_matrix_keep_their_own():
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
    assert projections.mergeable((a, b))
    assert not projections.mergeable((a, torch.nn.Linear(4, 2, bias=False)))  # a bias and none
    assert not projections.mergeable((a, torch.nn.Linear(3, 2)))  # inputs of another width
    assert not projections.mergeable((a, torch.nn.Linear(4, 2).double()))  # another dtype
    assert not projections.mergeable((a, Quantised(4, 2)))
    assert not projections.mergeable((a, None))  # a group without all its projections
    hooked = torch.nn.Linear(4, 2)
    hooked.register_forward_hook(lambda module, args, out: out * 2)
    assert not projections.mergeable((a, hooked))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2"])
def test_queries_and_keys_side_by_side_are_rotated_without_a_copy_to_the_same_bits(arch, dtype):
    home = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    heads, keys, width = 4, 2, 16
    generator = torch.Generator().manual_seed(3)
    merged = torch.randn(3, 5, (heads + 2 * keys) * width, generator=generator).to(dtype)  # [B, Q, q|k|v]
    q = merged[..., : heads * width].view(3, 5, heads, width).transpose(1, 2)
    k = merged[..., heads * width : (heads + keys) * width].view(3, 5, keys, width).transpose(1, 2)
    angles = torch.randn(3, 5, width, generator=generator)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    joined = fusion._side_by_side(q, k)
    assert joined.data_ptr() == q.data_ptr() and torch.equal(joined, torch.cat([q, k], dim=1))  # a view
    apart = fusion._side_by_side(q.contiguous(), k.contiguous())
    assert apart.data_ptr() != q.data_ptr() and torch.equal(apart, joined)  # a copy
    for want, got in zip(
        home.apply_rotary_pos_emb(q, k, cos, sin),
        fusion.both_at_once(home.apply_rotary_pos_emb)(q, k, cos, sin),
        strict=True,
    ):
        assert torch.equal(want, got)
    one = merged[:1, :1]  # a single query: its dimensions of one may have any stride
    q1 = one[..., : heads * width].view(1, 1, heads, width).transpose(1, 2)
    k1 = one[..., heads * width : (heads + keys) * width].view(1, 1, keys, width).transpose(1, 2)
    assert fusion._side_by_side(q1, k1).data_ptr() == q1.data_ptr()


def test_a_draft_on_the_slots_merges_unless_turned_off_and_drafts_the_same():
    """SlotStore.merge (bench serve --slots-off merge, for an A/B run) on the slots' steps."""
    drafts, products, steps = [], [], []
    for merge in (True, False):
        member = tiny_member("llama-bytes", decode="graphs")
        member.slots.fuse, member.slots.merge = True, merge  # a GPU's defaults, then merge turned off
        states = [member.start(prompt, MemberSettings(max_new_tokens=50)) for prompt in ("Hi", "Dear diary,")]
        before = member.slots.counts["steps"]
        with Products() as counted:
            drafts.append([draft.text for draft in member.draft_many(states, [4, 4])])
        products.append(counted.count)
        steps.append(member.slots.counts["steps"] - before)
    assert drafts[0] == drafts[1] and steps[0] == steps[1] >= 3  # the first token is the prompt's
    assert (
        products[1] - products[0] == steps[0] * 3 * member.model.config.num_hidden_layers
    )  # 4 a layer, not 7


@pytest.mark.gpu
def test_gpu_a_plan_made_with_release_gives_the_old_weights_memory_back():
    """On CUDA: merging leaves the projections' old weights in the allocator's cache, in blocks too
    small for the merged ones (the device's reserved memory grows by the merged bytes) unless the plan
    releases them, as a store's does (SlotStore: fusion.plan(..., release=True))."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=1024, intermediate_size=4096, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2,
    )  # fmt: skip
    grown = []
    for release in (False, True):
        model = LlamaForCausalLM(config).to("cuda").base_model
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        groups = fusion.plan(model, release=release).merged
        merged = sum(group.weight.numel() * group.weight.element_size() for group in groups)
        grown.append((torch.cuda.memory_reserved() - before) / merged)
        del model, groups
    assert grown[0] > 0.5 and grown[1] < 0.25  # (blocks under 10 MB share 20 MB segments)


@pytest.mark.parametrize("arch", ["mistral", "qwen3", "olmo2", "starcoder2", "phi3", "cohere", "qwen2_moe"])
def test_other_architectures_merge_what_reads_one_input_and_give_their_own_states(arch):
    """Beyond the tests' three: q/k normed per head (qwen3) or whole (olmo2), an MLP without a gate
    (starcoder2: q/k/v only), projections already merged upstream (phi3: nothing to merge), an
    interleaved rotation (cohere), experts beside a shared MLP (qwen2_moe): fp32, the same states."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        arch, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=100, pad_token_id=None, bos_token_id=None,
        eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).base_model.eval()
    want, own = forward(model, IDS)
    groups = fusion.plan(model).merged
    with fusion.fused(model):
        got, products = forward(model, IDS)
    merged = sum(len(group.parts) - 1 for group in groups)  # the products a merge saves
    assert (arch == "phi3") == (merged == 0) and products == own - merged
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
