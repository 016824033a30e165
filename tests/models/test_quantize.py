"""Quantized weights on the CPU (models/quantize.py, --quantize): int8 and int4 Linear layers on
tiny random-weight models of three architectures, through the real loading path, the Ensemble, the
floor and the three command lines.

How close to fp32 is asserted by teacher forcing: the fp32 model's own greedy continuation (40
tokens after each of 3 prompts) is fed to the quantized model, which must pick the same next token
at ≥ 90% of the 120 positions for int8 and ≥ 50% for int4 (measured: int8 98 to 99% on every
architecture; int4 96 to 98%, gemma3 68%). Chance is 1 in ~270 tokens, so broken codes, scales or
packing fail at once. Comparing free-running greedy answers instead would be fragile: random weights
give near-flat logits (top-two margins down to 1e-4, below int8's logit error of ~3e-3), so one
flipped token early changes everything after it, and which token flips depends on the kernels.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from specfuse.bench.floor import weight_bytes
from specfuse.config import EnsembleConfig, MemberSettings
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError
from specfuse.members.hf import HFMember
from specfuse.members.hf.scoring import OutputHead
from specfuse.models import loading, placement
from specfuse.models.quantize import QuantizedLinear, QuantizedWeight, quantize_model

from ..conftest import TINY_SPECS, tiny_member

NAMES = list(TINY_SPECS)  # llama-bytes, qwen-merges, gemma-meta
PROMPTS = ["Why is the sky blue?", "Write a haiku about the sea.", "List three prime numbers."]
AGREEMENT = {"int8": 0.9, "int4": 0.5}


def quantized_member(name: str, quantize: str) -> HFMember:
    member = tiny_member(name)
    quantize_model(member.model, quantize)
    return HFMember(member.name, member.model, member.tokenizer, device="cpu")  # its head read anew


def linears(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear | QuantizedLinear)}


@pytest.mark.parametrize("name", NAMES)
def test_int8_weights_are_a_quarter_of_fp32_and_the_floor_counts_them(name):
    fp32 = tiny_member(name).model
    before = {n: m.weight.numel() * m.weight.element_size() for n, m in linears(fp32).items()}
    floor_before = weight_bytes(fp32)
    model = quantize_model(tiny_member(name).model, "int8")
    after = linears(model)
    assert after.keys() == before.keys() and all(type(m) is QuantizedLinear for m in after.values())
    for n, m in after.items():
        weight = m.weight
        assert isinstance(weight, QuantizedWeight) and isinstance(weight, nn.Parameter)
        assert weight.dtype == torch.int8 and not weight.requires_grad
        assert weight.numel() * weight.element_size() * 4 == before[n]  # exactly a quarter
        assert weight.scale_bytes() == m.out_features * 4  # one fp32 scale per output row
    # The floor: codes, scales and what stays fp32 (norms; an untied embedding is not read whole).
    assert 0.25 * floor_before < weight_bytes(model) < 0.3 * floor_before
    assert model.get_input_embeddings().weight.dtype == torch.float32  # a step reads one row of it


@pytest.mark.parametrize("name", NAMES)
def test_int4_packs_two_codes_a_byte_and_keeps_the_head_int8(name):
    fp32 = tiny_member(name).model
    before = {n: m.weight.numel() * m.weight.element_size() for n, m in linears(fp32).items()}
    model = quantize_model(tiny_member(name).model, "int4")
    head = model.get_output_embeddings()
    for n, m in linears(model).items():
        nbytes = m.weight.numel() * m.weight.element_size()
        if m is head:
            assert m.weight.bits == 8 and nbytes * 4 == before[n]
        else:
            assert m.weight.bits == 4 and m.weight.dtype == torch.uint8 and nbytes * 8 == before[n]
    assert weight_bytes(model) < 0.25 * weight_bytes(fp32)


def teacher_forced_agreement(name: str, quantize: str, tokens: int = 40) -> float:
    """The share of positions where the quantized model's next token is fp32's greedy one."""
    fp32, quantized = tiny_member(name), quantized_member(name, quantize)
    same = total = 0
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = fp32.tokenizer(prompt, return_tensors="pt").input_ids
            seq = ids
            for _ in range(tokens):
                nxt = fp32.model(seq).logits[0, -1].argmax()
                seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
            picked = quantized.model(seq).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
            same += int((picked == seq[0, ids.shape[1] :]).sum())
            total += tokens
    return same / total


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("name", NAMES)
def test_the_quantized_model_picks_fp32s_greedy_tokens(name, quantize):
    agreement = teacher_forced_agreement(name, quantize)
    print(f"{name} {quantize}: {agreement:.3f}")
    assert agreement >= AGREEMENT[quantize]


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_the_output_head_scores_rows_as_its_full_logits(quantize):
    """OutputHead reads head.weight itself: F.linear over it, and rows of it for token logits."""
    member = quantized_member("gemma-meta", quantize)  # tied head, untied by quantizing; soft-capped
    head = OutputHead(member.model)
    hidden = torch.randn(5, 32)
    targets = torch.tensor([0, 7, 100, 255, 3])
    full = head.logits(hidden)
    assert full.shape == (5, len(member.tokenizer)) and full.dtype == torch.float32
    torch.testing.assert_close(head.token_logits(hidden, targets), full[torch.arange(5), targets])
    model_logits = member.model.lm_head(hidden).float()  # the module's own forward, the same numbers
    torch.testing.assert_close(head.logits(hidden), torch.tanh(model_logits / 30.0) * 30.0)


@pytest.mark.parametrize("score", ["logit", "logprob"])
def test_quantized_members_draft_and_score_in_an_ensemble(score):
    members = [
        quantized_member("llama-bytes", "int8"),
        quantized_member("qwen-merges", "int4"),
        quantized_member("gemma-meta", "int8"),
    ]
    config = EnsembleConfig(segment_len=6, max_new_tokens=18, exit=False, score=score)
    rounds = list(Ensemble(members, config).stream("Why is the sky blue?"))
    assert rounds and rounds[-1].stop_reason == "budget"
    assert isinstance(rounds[-1].text, str) and rounds[-1].text
    for r in rounds:
        assert len(r.candidates) == 3 and all(c.num_tokens > 0 for c in r.candidates)
        assert all(math.isfinite(z) for row in r.raw_scores for z in row)
        assert all(math.isfinite(y) for y in r.aggregate)


def test_quantized_drafts_compile_as_they_run_eagerly():
    from specfuse.members.hf.compiled import CompiledDecoder

    eager, compiled = quantized_member("llama-bytes", "int8"), quantized_member("llama-bytes", "int8")
    compiled.compiled = CompiledDecoder(compiled, backend="aot_eager")
    settings = MemberSettings(max_new_tokens=200)
    a = eager.draft(eager.start("Why is the sky blue?", settings), 12)
    b = compiled.draft(compiled.start("Why is the sky blue?", settings), 12)
    assert a.text == b.text and compiled.compiled.counts["static"] == 1 and compiled.compiled.disabled is None


def test_load_member_quantizes_a_checkpoint_and_shares_it(tiny_checkpoints):
    members = placement.load_members([tiny_checkpoints[0]] * 2, quantize="int8")
    assert members[1].name.endswith("#2") and members[1].model is members[0].model
    assert all(type(m) is QuantizedLinear for m in linears(members[0].model).values())
    plain = loading.load_member(tiny_checkpoints[0])
    assert not any(type(m) is QuantizedLinear for m in linears(plain.model).values())


def test_a_member_in_a_worker_process_is_quantized_there(tiny_checkpoints):
    from specfuse.members.process import ProcessMember

    def scores(member) -> list[float]:  # a draft's own score: the same where the weights are the same
        state = member.start("Why is the sky blue?", MemberSettings(max_new_tokens=50))
        return member.score(state, [member.draft(state, 8)])

    (there,) = placement.load_members(tiny_checkpoints[:1], processes=True, quantize="int4")
    try:
        assert type(there) is ProcessMember
        here = scores(loading.load_member(tiny_checkpoints[0], quantize="int4"))
        assert scores(there) == pytest.approx(here, abs=1e-5)
        assert scores(loading.load_member(tiny_checkpoints[0])) != pytest.approx(here, abs=1e-5)
    finally:
        there.close()


@pytest.mark.parametrize("call", ["load_member", "load_members", "quantize_model"])
def test_an_unknown_quantize_is_a_config_error(call, tiny_checkpoints, monkeypatch):
    monkeypatch.setattr(loading, "_from_pretrained", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ConfigError, match=r"Unknown quantize 'int3'; choose one of: none, int8, int4"):
        if call == "load_member":
            loading.load_member(tiny_checkpoints[0], quantize="int3")
        elif call == "load_members":
            placement.load_members(tiny_checkpoints, quantize="int3")
        else:
            quantize_model(tiny_member("llama-bytes").model, "int3")


def test_quantize_is_refused_off_the_cpu_before_loading(tiny_checkpoints, monkeypatch):
    monkeypatch.setattr(loading, "_from_pretrained", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ConfigError, match="runs on the CPU only"):
        loading.load_member(tiny_checkpoints[0], device_map="auto", quantize="int8")


# -- the command lines ------------------------------------------------------------------------------


def test_specfuse_quantize_reaches_load_member(tiny_checkpoints, monkeypatch):
    from ..helpers_cli import run_cli

    seen = []
    real = loading.load_member

    def recording(name, **options):
        member = real(name, **options)
        seen.append((options.get("quantize"), type(member.model.get_output_embeddings()).__name__))
        return member

    monkeypatch.setattr(placement, "load_member", recording)  # the name load_members calls
    code, out, err = run_cli(
        "--models", ",".join(tiny_checkpoints), "--quantize", "int4", "--max-new-tokens", "4", "hi"
    )
    assert code == 0, err
    assert seen == [("int4", "QuantizedLinear")] * 2
    code, out, err = run_cli("--models", ",".join(tiny_checkpoints), "--quantize", "fp8", "hi")
    assert code == 2 and "Unknown quantize 'fp8'" in err


class Stop(ConfigError):
    pass


@pytest.mark.parametrize("command", ["bench", "eval"])
def test_bench_and_eval_pass_quantize_to_load_members(command, tiny_checkpoints, monkeypatch, capsys):
    seen = []

    def fake_load_members(names, **options):
        seen.append((list(names), options.get("quantize")))
        raise Stop("stop before the run")

    monkeypatch.setattr(placement, "load_members", fake_load_members)
    if command == "bench":
        from specfuse.bench.core import main
    else:
        from specfuse.eval.cli import main
    argv = ["throughput"] if command == "eval" else []
    argv += ["--models", *tiny_checkpoints, "--quantize", "int8"]
    assert main(argv) == 2
    assert seen == [(tiny_checkpoints, "int8")]
    assert "stop before the run" in capsys.readouterr().err
