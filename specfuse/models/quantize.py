"""Weight-only quantization of a loaded model's Linear layers on the CPU: int8 or int4, opt in.

Decoding reads every weight once per token, so a member's time per token on a CPU is bound by the
bytes of its weights (bench/floor.py). `quantize_model(model, "int8")` replaces each nn.Linear with a
QuantizedLinear that keeps int8 codes and one scale per output row, and multiplies with torch's own
CPU kernel (`torch._weight_int8pack_mm`): a quarter of fp32's bytes, half of bf16's. "int4" keeps
4-bit codes in groups of 32 to 128 inputs with a scale and an offset per group (the kernel behind
`torch.ops.aten._weight_int4pack_mm_for_cpu`), for the layers whose shapes that kernel takes (inputs
divisible by 32, outputs by 16); the output head and any other layer stay int8. Activations stay in
the model's dtype (bf16 or fp32). Embeddings and norms are untouched.

No package is needed: torchao 0.18's Int8WeightOnlyConfig converts the whole int8 weight to the
activations' dtype at every eager call, and its int4 configs have no CPU path (docs/benchmarks-log.md).

The quantized weight of each layer is a QuantizedWeight: a tensor of the codes themselves (so that
`numel() * element_size()` is its real size, and the floor counts what a step reads), carrying its
scales, that also answers `F.linear(x, w)` and `w[rows]` (dequantized rows), the two uses the
members' own output head makes of `head.weight` (members/hf/scoring.py OutputHead).

The choices, their check and the --quantize flag's help live in quantize_options.py, without torch,
for the command lines to import.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
from torch import nn

from specfuse.errors import ConfigError

from .quantize_options import QUANTIZE, check_quantize

log = logging.getLogger(__name__)

INT4_GROUPS = (128, 64, 32)  # the largest that divides a layer's inputs is taken
INT4_ROWS = 16  # the int4 CPU kernel packs output rows in blocks of 16


class QuantizedWeight(torch.Tensor):
    """A Linear weight's codes (int8 [N, K], or int4 packed two to a byte as uint8 [N, K/2]) with
    their scales: `scales` [N] (int8) or `scales_and_zeros` [K/group, N, 2] (int4)."""

    bits: int
    scales: torch.Tensor
    group_size: int
    in_features: int

    @staticmethod
    def __new__(
        cls, codes: torch.Tensor, scales: torch.Tensor, bits: int, in_features: int, group_size: int = 0
    ) -> QuantizedWeight:
        weight = torch.Tensor._make_subclass(cls, codes, False)
        weight.scales, weight.bits, weight.in_features, weight.group_size = (
            scales,
            bits,
            in_features,
            group_size,
        )
        return weight

    def codes(self) -> torch.Tensor:
        """The codes as a plain tensor (the same storage)."""
        with torch._C.DisableTorchFunctionSubclass():
            return self.view(self.shape)

    def scale_bytes(self) -> int:
        return self.scales.numel() * self.scales.element_size()

    def dequantize_rows(self, rows: Any) -> torch.Tensor:
        """Rows of the weight in the scales' dtype (an int8 weight only: the output head's)."""
        if self.bits != 8:
            raise NotImplementedError("rows of an int4 weight: the output head is kept int8")
        codes = self.codes()
        return codes[rows].to(self.scales.dtype) * self.scales[rows].unsqueeze(-1)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            return quantized_linear(*args, **kwargs)
        if func is torch.Tensor.__getitem__ and isinstance(args[0], QuantizedWeight):
            return args[0].dequantize_rows(args[1])
        if func is torch.Tensor.detach:  # nn.Parameter(weight) detaches it: keep what it carries
            weight = args[0]
            return QuantizedWeight(
                weight.codes().detach(), weight.scales, weight.bits, weight.in_features, weight.group_size
            )
        with torch._C.DisableTorchFunctionSubclass():  # everything else sees the plain codes
            return func(*args, **kwargs)


def quantized_linear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ dequantized(weight).T + bias, without dequantizing: [..., K] → [..., N], in x's dtype."""
    codes, rows = weight.codes(), x.reshape(-1, x.shape[-1]).contiguous()
    if weight.bits == 8:
        scales = weight.scales if weight.scales.dtype == x.dtype else weight.scales.to(x.dtype)
        out = torch._weight_int8pack_mm(rows, codes, scales)
        n = codes.shape[0]
    else:
        sz = weight.scales if weight.scales.dtype == x.dtype else weight.scales.to(x.dtype)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, codes, weight.group_size, sz)
        n = sz.shape[1]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], n)


class QuantizedLinear(nn.Module):
    """An nn.Linear whose weight is a QuantizedWeight (a frozen parameter, for inference only)."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.in_features, out_features
        self.weight = cast(QuantizedWeight, nn.Parameter(weight, requires_grad=False))
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        weight = self.weight
        group = f", group_size={weight.group_size}" if weight.bits == 4 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int{weight.bits}{group}"


def int8_weight(w: torch.Tensor) -> QuantizedWeight:
    """Symmetric per-row int8: codes in [-127, 127], scale = the row's largest |w| / 127."""
    w32 = w.detach().float()
    scales = (w32.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    codes = torch.round(w32 / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(codes, scales.to(w.dtype), 8, w.shape[1])


def int4_group(w: torch.Tensor) -> int | None:
    """The int4 group size for a [N, K] weight, or None when the CPU kernel cannot take it."""
    n, k = w.shape
    if n % INT4_ROWS:
        return None
    return next((g for g in INT4_GROUPS if k % g == 0), None)


def int4_weight(w: torch.Tensor, group_size: int) -> QuantizedWeight:
    """Asymmetric int4 per group of `group_size` inputs: w ≈ (code - 8) * scale + zero, code in 0..15
    (the int4 CPU kernel's convention: zero is the value of code 8)."""
    n, k = w.shape
    groups = w.detach().float().reshape(n, k // group_size, group_size)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    codes = torch.round((groups - low) / scales).clamp(0, 15).to(torch.int32).reshape(n, k)
    zeros = low + 8 * scales
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    sz = torch.stack([scales[..., 0], zeros[..., 0]], dim=-1).transpose(0, 1).contiguous()  # [K/g, N, 2]
    return QuantizedWeight(packed, sz.to(w.dtype), 4, k, group_size)


def quantize_model(model: nn.Module, quantize: str) -> nn.Module:
    """Replace `model`'s nn.Linear layers by QuantizedLinear ones, in place ("none": unchanged).

    The model must be on the CPU. An output head tied to the input embedding is untied: the head
    becomes int8, the embedding (of which a step reads one row) keeps its dtype.
    """
    if check_quantize(quantize) == "none":
        return model
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    if any(m.weight.device.type != "cpu" for _, m in linears):
        raise ConfigError(f"quantize={quantize!r} runs on the CPU only; load the model with device='cpu'")
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    counts = {4: 0, 8: 0}
    for name, linear in linears:
        group = int4_group(linear.weight) if quantize == "int4" and linear is not head else None
        weight = int8_weight(linear.weight) if group is None else int4_weight(linear.weight, group)
        counts[weight.bits] += 1
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, QuantizedLinear(weight, linear.bias, linear.out_features))
    log.info("%s: %d Linear layers int4, %d int8", type(model).__name__, counts[4], counts[8])
    return model


__all__ = [
    "QUANTIZE",
    "QuantizedLinear",
    "QuantizedWeight",
    "check_quantize",
    "quantize_model",
    "quantized_linear",
]
