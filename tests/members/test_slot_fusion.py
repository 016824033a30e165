"""Fewer kernels on the KV slots (members/hf/fusion.py): each architecture's RMSNorm class is matched
to the form it computes by a probe (scaled by the weight, or by one plus the weight in float32), and
its rotary embedding, rotated for queries and keys at once, gives the modelling module's own bits; a
decoder with both fused gives its own hidden states (fp32: to the last bits; bf16: the Gemma form
exactly, the Llama form within a unit in the last place); a norm of another form and an interleaved
rotation keep their own; each switch (this one, and folded attention's) is undone when the last of
two overlapping passes ends, and a slot pass uses it where an eager pass does not."""

from __future__ import annotations

import importlib
import threading

import pytest
import torch

from specfuse.config import MemberSettings
from specfuse.members.hf import attention, fusion

from ..conftest import tiny_member
from ..helpers_fusion import decoder

# (architecture, the form its RMSNorm computes): the tests' tiny models and Gemma 2 at toy widths.
FORMS = [
    ("llama", "weight"), ("qwen2", "weight"), ("gemma3", "one plus weight"), ("gemma2", "one plus weight")
]  # fmt: skip


def rms_norms(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


@pytest.mark.parametrize(("arch", "form"), FORMS)
def test_each_architectures_norm_is_matched_to_the_form_it_computes(arch, form):
    model = decoder(arch)
    assert {fusion.form_of(m) for m in rms_norms(model)} == {form}
    made = fusion.plan(model)
    assert [m for m, _ in made.norms] == rms_norms(model)  # every one, in order
    assert [home.__name__.rsplit("_", 1)[-1] for home in made.rotary] == [arch]  # its modelling module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("arch", "form"), FORMS)
def test_a_decoder_with_fused_norms_gives_its_own_hidden_states(arch, form, dtype):
    model = decoder(arch, dtype)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state.float()
        with fusion.fused(model):
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


class PickyRMSNorm(OddRMSNorm):
    """Named like one, refuses the probe (it wants a 3-D input): not fused, and no error."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError("three dimensions, please")
        return super().forward(x)


def test_a_norm_the_probe_cannot_run_keeps_its_own_forward():
    assert fusion.form_of(PickyRMSNorm(8)) is None
    assert not fusion.rotary_exact(lambda q, k, cos, sin: (q,))  # a rotary of another signature


def test_a_norm_of_another_form_keeps_its_own_forward():
    model = torch.nn.Sequential(OddRMSNorm(8), torch.nn.Linear(8, 8))
    assert fusion.form_of(model[0]) is None
    assert fusion.plan(model).norms == []
    x = torch.randn(2, 8)
    with fusion.fused(model):
        assert "forward" not in vars(model[0])
        torch.testing.assert_close(model(x), model[1](model[0].forward(x)))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "gemma3"])
def test_queries_and_keys_rotated_at_once_give_the_modelling_modules_own_bits(arch):
    home = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    assert fusion.rotary_exact(home.apply_rotary_pos_emb)
    own, fused = home.apply_rotary_pos_emb, fusion.both_at_once(home.apply_rotary_pos_emb)
    q, k = torch.randn(3, 28, 5, 128, dtype=torch.bfloat16), torch.randn(3, 4, 5, 128, dtype=torch.bfloat16)
    angles = torch.randn(3, 5, 128)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    for want, got in zip(own(q, k, cos, sin), fused(q, k, cos, sin), strict=True):
        assert torch.equal(want, got)


def test_a_rotation_of_another_kind_keeps_its_own():
    # Cohere rotates interleaved pairs: refused by the probe. Phi-3 rotates part of each head (cos
    # narrower than it): handed back to its own function.
    from transformers.models.cohere import modeling_cohere
    from transformers.models.phi3 import modeling_phi3

    assert not fusion.rotary_exact(modeling_cohere.apply_rotary_pos_emb)
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)
    angles = torch.randn(1, 3, 8)
    own = modeling_phi3.apply_rotary_pos_emb
    for want, got in zip(
        own(q, k, angles.cos(), angles.sin()),
        fusion.both_at_once(own)(q, k, angles.cos(), angles.sin()),
        strict=True,
    ):
        assert torch.equal(want, got)


@pytest.mark.parametrize("switch", [attention.folded, fusion.fused], ids=["folded", "fused"])
def test_a_switch_is_undone_when_the_last_of_two_overlapping_passes_ends(switch):
    member = tiny_member("gemma-meta", decode="graphs")
    base, norm = member.base, rms_norms(member.base)[0]
    (home,) = fusion.plan(base).rotary

    def state() -> tuple[object, ...]:  # what either switch changes
        return base.config._attn_implementation, home.apply_rotary_pos_emb, "forward" in vars(norm)

    own = state()
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with switch(base):
            inside.set()
            release.wait(5)

    other = threading.Thread(target=hold)
    other.start()
    inside.wait(5)
    with switch(base):
        switched = state()
    assert switched != own and state() == switched  # the other pass is still inside
    release.set()
    other.join()
    assert state() == own


def test_a_draft_on_the_slots_fuses_and_an_eager_pass_does_not():
    from transformers.models.llama import modeling_llama

    member = tiny_member("llama-bytes", decode="graphs")
    member.slots.fuse = True  # a GPU's default; on a CPU torch.rms_norm runs as many operations
    norm, own = member.base.norm, modeling_llama.apply_rotary_pos_emb
    seen: list[tuple[bool, bool]] = []  # (norm fused, rotary switched) at each pass's last norm
    handle = norm.register_forward_pre_hook(
        lambda module, args: seen.append(
            ("forward" in vars(module), modeling_llama.apply_rotary_pos_emb is not own)
        )
    )
    try:
        states = [member.start(prompt, MemberSettings(max_new_tokens=50)) for prompt in ("Hi", "Dear diary,")]
        member.draft_many(states, [4, 4])
    finally:
        handle.remove()
    assert seen[:2] == [(False, False)] * 2  # the prompts, read eagerly
    assert seen[-1] == (True, True) and seen.count((True, True)) >= 3  # the steps on the slots
    assert "forward" not in vars(norm) and modeling_llama.apply_rotary_pos_emb is own
