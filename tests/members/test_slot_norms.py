"""RMSNorms fused on the KV slots (members/hf/norms.py): each architecture's norm class is matched to
the form it computes by a probe (scaled by the weight, or by one plus the weight in float32), a
decoder with its norms fused gives its own hidden states (fp32: to the last bits; bf16: the Gemma
form exactly, the Llama form within a unit in the last place), a norm of another form keeps its own
forward, the switch is undone after overlapping passes, and a slot pass uses it where an eager pass
does not."""

from __future__ import annotations

import threading

import pytest
import torch

from specfuse.bench.shapes import SHAPES, build_model
from specfuse.config import MemberSettings
from specfuse.members.hf import norms

from ..conftest import tiny_member, tiny_model

# (architecture, the form its RMSNorm computes): the tests' tiny models and Gemma 2 at toy widths.
FORMS = [
    ("llama", "weight"), ("qwen2", "weight"), ("gemma3", "one plus weight"), ("gemma2", "one plus weight")
]  # fmt: skip


def decoder(arch: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random-weight decoder of `arch`, its norms' weights random too (not their ones or zeros)."""
    if arch == "gemma2":
        model = build_model(arch, SHAPES["tiny"]["gemma-2-9b"][1], "cpu", dtype, seed=4)
    else:
        model = tiny_model(arch, 64, seed=4).to(dtype)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.normal_()
    return model.base_model


def rms_norms(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


@pytest.mark.parametrize(("arch", "form"), FORMS)
def test_each_architectures_norm_is_matched_to_the_form_it_computes(arch, form):
    model = decoder(arch)
    assert {norms.form_of(m) for m in rms_norms(model)} == {form}
    assert [m for m, _ in norms.plan(model)] == rms_norms(model)  # every one, in order


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("arch", "form"), FORMS)
def test_a_decoder_with_fused_norms_gives_its_own_hidden_states(arch, form, dtype):
    model = decoder(arch, dtype)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state.float()
        with norms.fused(model):
            assert all("forward" in vars(m) for m in rms_norms(model))
            got = model(input_ids=ids).last_hidden_state.float()
    assert not any("forward" in vars(m) for m in rms_norms(model))  # undone
    if dtype == torch.float32 or form == "one plus weight":
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:  # transformers rounds to bf16 before the weight's product, the fused kernel after it
        torch.testing.assert_close(got, want, atol=0.1, rtol=0.02)


class OddRMSNorm(torch.nn.Module):
    """Named like one, computes something else (a mean of absolute values): not fused."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(size))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x.abs().mean(-1, keepdim=True) + self.eps) * self.weight


def test_a_norm_of_another_form_keeps_its_own_forward():
    model = torch.nn.Sequential(OddRMSNorm(8), torch.nn.Linear(8, 8))
    assert norms.form_of(model[0]) is None
    assert norms.plan(model) == []
    x = torch.randn(2, 8)
    with norms.fused(model):
        assert "forward" not in vars(model[0])
        torch.testing.assert_close(model(x), model[1](model[0].forward(x)))


def test_the_switch_is_undone_when_the_last_of_two_overlapping_passes_ends():
    member = tiny_member("gemma-meta", decode="graphs")
    norm = rms_norms(member.base)[0]
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with norms.fused(member.base):
            inside.set()
            release.wait(5)

    other = threading.Thread(target=hold)
    other.start()
    inside.wait(5)
    with norms.fused(member.base):
        assert "forward" in vars(norm)
    assert "forward" in vars(norm)  # the other pass is still inside
    release.set()
    other.join()
    assert "forward" not in vars(norm)


def test_a_draft_on_the_slots_fuses_its_norms_and_an_eager_pass_does_not():
    member = tiny_member("llama-bytes", decode="graphs")
    member.slots.fuse = True  # a GPU's default; on a CPU torch.rms_norm runs the same operations
    norm = member.base.norm
    seen: list[bool] = []
    handle = norm.register_forward_pre_hook(lambda module, args: seen.append("forward" in vars(module)))
    try:
        states = [member.start(prompt, MemberSettings(max_new_tokens=50)) for prompt in ("Hi", "Dear diary,")]
        member.draft_many(states, [4, 4])
    finally:
        handle.remove()
    assert seen[:2] == [False, False]  # the prompts, read eagerly
    assert seen[-1] and seen.count(True) >= 3  # the steps on the slots
    assert "forward" not in vars(norm)
