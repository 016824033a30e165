"""RMSNorm as one fused kernel in the KV slots' steps (issue 52).

transformers writes each model's RMSNorm out in elementary operations: to float32, square, mean, add
epsilon, reciprocal square root, two products, back to the model's dtype. A GPU launches each as a
kernel of its own, inside a captured step too (a graph replays every node): Llama-3.1-8B has 65
norms a step, Gemma-2-9B 169, so eight kernels each is 520 and 1,352 small kernels a draft step
(tools/slot_launches.py --step counts them). `torch.rms_norm` is one fused kernel on CUDA where the
input and the weight share a dtype (torch 2.8 on); on a CPU it runs as those same operations.

Two forms are in use, and which one a class computes is not guessed from its name: each candidate
form is checked against the module's own forward on a probe (`plan`), and a class that matches
neither keeps its own forward.
- scaled by the weight (Llama, Qwen2, Mistral …): rms_norm(x, w), in the model's dtype. transformers
  rounds the normalised x to that dtype before the product, the fused kernel after it: in bfloat16
  they may differ by one unit in the last place.
- scaled by one plus the weight, in float32 (Gemma 2 and 3): rms_norm(x.float(), 1 + w.float()),
  back to the model's dtype; 1 + w is made once, when the plan is made.

SlotStore.read (slots.py) switches a member's norms to these for its own passes only (`fused`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from .switch import Switch

Plan = list[tuple[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]]
# Each model's plan, made once (by its weights' identity: two members sharing a model share it).
_PLANS: weakref.WeakKeyDictionary[torch.nn.Module, Plan] = weakref.WeakKeyDictionary()
Form = Callable[[torch.Tensor, float], Callable[[torch.Tensor], torch.Tensor]]


def _scaled(weight: torch.Tensor, eps: float) -> Callable[[torch.Tensor], torch.Tensor]:
    shape = (weight.shape[0],)
    return lambda x: torch.rms_norm(x, shape, weight, eps)


def _one_plus(weight: torch.Tensor, eps: float) -> Callable[[torch.Tensor], torch.Tensor]:
    shape, scale = (weight.shape[0],), 1.0 + weight.detach().float()
    return lambda x: torch.rms_norm(x.float(), shape, scale, eps).to(x.dtype)


FORMS: dict[str, Form] = {"weight": _scaled, "one plus weight": _one_plus}


def _eps(module: torch.nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def form_of(module: torch.nn.Module) -> str | None:
    """Which of FORMS computes what `module`'s own forward does, on a probe in its dtype and device
    (None: none does, or it is not an RMSNorm with one weight vector and an epsilon)."""
    weight, eps = getattr(module, "weight", None), _eps(module)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or eps is None:
        return None
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(3, weight.shape[0], generator=generator).to(weight.device, weight.dtype)
    with torch.no_grad():
        want = module(probe).float()
        for name, form in FORMS.items():
            got = form(weight, eps)(probe).float()
            tolerance = 1e-5 if weight.dtype == torch.float32 else 2e-2
            if got.shape == want.shape and bool(((got - want).abs() <= tolerance * (1 + want.abs())).all()):
                return name
    return None


def plan(model: torch.nn.Module) -> Plan:
    """Each RMSNorm of `model` with the fused forward of its class's form (probed once a class),
    made once a model. Made by the store on a GPU before any capture: a probe reads back."""
    made = _PLANS.get(model)
    if made is None:
        made = _PLANS[model] = _plan(model)
    return made


def _plan(model: torch.nn.Module) -> Plan:
    forms: dict[type, str | None] = {}
    out: Plan = []
    for module in model.modules():
        kind = type(module)
        if not kind.__name__.endswith("RMSNorm"):
            continue
        if kind not in forms:
            forms[kind] = form_of(module)
        name, eps, weight = forms[kind], _eps(module), getattr(module, "weight", None)
        if name is not None and eps is not None and isinstance(weight, torch.Tensor):
            out.append((module, FORMS[name](weight, eps)))
    return out


def _switch_on(model: torch.nn.Module, norms: Plan) -> Plan:
    for module, forward in norms:
        module.forward = forward  # type: ignore[method-assign]  # the instance's, over its class's
    return norms


def _switch_off(model: torch.nn.Module, norms: Plan) -> None:
    for module, _ in norms:
        del module.forward  # its class's forward again


def fused(model: torch.nn.Module) -> AbstractContextManager[None]:
    """`model`'s RMSNorms computed by their fused forms (plan(model)) inside."""
    return _FUSED.inside(model, plan(model))


_FUSED = Switch(_switch_on, _switch_off)

__all__ = ["FORMS", "Plan", "form_of", "fused", "plan"]
