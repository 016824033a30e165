"""Fewer kernels in the KV slots' steps (issue 52): RMSNorm as one fused kernel, the rotary
embedding of queries and keys at once, and the projections that read one input as one product
(projections.py).

A captured step replays every kernel of the forward pass as a graph node of its own, a few
microseconds each however little it does; at a batch of one that, more than the weights, may be
most of the step (tools/slot_launches.py --step counts them). transformers writes two things out in small
operations, and both are switched here for the slots' own passes (`fused`, SlotStore.read):

- **RMSNorm**: to float32, square, mean, add epsilon, reciprocal square root, two products, back to
  the model's dtype, per norm (Llama-3.1-8B: 65 norms a step, Gemma-2-9B: 169). `torch.rms_norm` is
  one fused kernel on CUDA where the input and the weight share a dtype (torch 2.8 on); a CPU runs it
  as those same operations. Two forms are in use, and which one a class computes is not guessed from
  its name: each is checked against the module's own forward on a probe (`plan`), and a class that
  matches neither keeps its own forward.
  - scaled by the weight (Llama, Qwen2, Mistral …): rms_norm(x, w), in the model's dtype.
    transformers rounds the normalised x to that dtype before the product, the fused kernel after
    it: in bfloat16 they may differ by one unit in the last place.
  - scaled by one plus the weight, in float32 (Gemma 2 and 3): rms_norm(x.float(), 1 + w.float()),
    back to the model's dtype; 1 + w is made once, when the plan is made.
- **The rotary embedding**: `apply_rotary_pos_emb` of the model's modelling module rotates the
  queries and the keys apart, five kernels each. Here both are rotated as one tensor (their heads
  side by side: a view where the merged projection left them so, else a concatenation) by four
  kernels, the sine's sign taken once a pass rather than the rotated half's once a layer: the same
  arithmetic in the same order, so the same bits. It is a
  function of the modelling module, not a module of the model, so it is switched in the modelling
  module while a slot pass is inside: another thread's pass on a model of that family meanwhile
  computes the same bits too. A module whose function the probe does not reproduce bit for bit
  (Cohere's interleaved rotation) keeps its own, and a partial rotation (Phi-3's, a cos narrower
  than the head) is handed to its own at each call.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from . import projections
from .switch import Switch

Norms = list[tuple[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]]
Form = Callable[[torch.Tensor, float], Callable[[torch.Tensor], torch.Tensor]]
Rotary = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Plan:
    """What `fused` switches for a model: each RMSNorm with its fused forward, the modelling
    modules whose rotary embedding is rotated for queries and keys at once, and the groups of
    projections computed as one product (projections.py)."""

    norms: Norms
    rotary: tuple[ModuleType, ...]
    merged: tuple[projections.Group, ...]


# Each model's plan, made once (by its weights' identity: two members sharing a model share it).
_PLANS: weakref.WeakKeyDictionary[torch.nn.Module, Plan] = weakref.WeakKeyDictionary()
_PLANNING = threading.Lock()  # two members' stores made at once in two threads


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
    tolerance = 1e-5 if weight.dtype == torch.float32 else 2e-2
    try:
        with torch.no_grad():
            want = module(probe).float()
            for name, form in FORMS.items():
                got = form(weight, eps)(probe).float()
                if got.shape == want.shape and bool(
                    ((got - want).abs() <= tolerance * (1 + want.abs())).all()
                ):
                    return name
    except Exception:  # a norm this probe cannot run (weights elsewhere, another signature): its own
        return None
    return None


def plan(model: torch.nn.Module, release: bool = False) -> Plan:
    """`model`'s plan, made once a model. Made by the store on a GPU before any capture: its probes
    read back. `release`: the CUDA memory cached since, the projections' weights before they were
    merged, given back to the device (else it stays reserved, in blocks too small for the merged
    ones: 8–9 GB a 7–9B model); only where no capture is under way in the process."""
    with _PLANNING:
        made = _PLANS.get(model)
        if made is None:
            made = _PLANS[model] = Plan(_norms(model), _rotary_modules(model), projections.merge(model))
            if release and made.merged and torch.cuda.is_available():
                torch.cuda.empty_cache()
    return made


def _norms(model: torch.nn.Module) -> Norms:
    """Each RMSNorm of `model` with the fused forward of its class's form (probed once a class)."""
    forms: dict[type, str | None] = {}
    out: Norms = []
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


def both_at_once(original: Rotary) -> Rotary:
    """`original` (a modelling module's apply_rotary_pos_emb) with queries and keys rotated as one
    tensor; what it does not cover (another unsqueeze, a partial rotation) goes to `original`."""

    def rotate(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
    ) -> Any:
        if not (
            unsqueeze_dim == 1
            and q.dim() == k.dim() == 4
            and (q.shape[0], *q.shape[2:]) == (k.shape[0], *k.shape[2:])
            and cos.shape[-1] == q.shape[-1]
            and q.dtype == k.dtype == cos.dtype == sin.dtype
        ):
            return original(q, k, cos, sin, unsqueeze_dim)
        x = _side_by_side(q, k)  # [B, query heads + key heads, Q, D]
        half = x.shape[-1] // 2
        # rotate_half(x) * sin, as [x2, x1] * [-sin1, sin2]: (-a) * b and a * (-b) are the same bits
        rotated = torch.cat([x[..., half:], x[..., :half]], dim=-1)
        out = x * cos.unsqueeze(1) + rotated * _signed(sin, half).unsqueeze(1)
        return out[:, : q.shape[1]], out[:, q.shape[1] :]

    return rotate


def _side_by_side(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q's heads and then k's as one tensor: a view where k's heads follow q's in memory (their
    projections merged into one product, projections.py), else a copy."""
    strides = [*q.stride()]
    strides[1] = width = q.shape[-1]  # head after head
    if (
        all(size == 1 or t.stride(d) == strides[d] for t in (q, k) for d, size in enumerate(t.shape))
        and q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
        and k.storage_offset() == q.storage_offset() + q.shape[1] * width
    ):  # (a dimension of one row may have any stride)
        shape = (q.shape[0], q.shape[1] + k.shape[1], *q.shape[2:])
        return q.as_strided(shape, strides, q.storage_offset())
    return torch.cat([q, k], dim=1)


_LOCAL = threading.local()  # .inside: fused passes this thread is in; .signed: [(sin, its signed form)]


def _signed(sin: torch.Tensor, half: int) -> torch.Tensor:
    """[-sin1, sin2]: made once a pass of this thread for each sin its layers get (one; Gemma 3: a
    local and a global one), else at each call."""
    held: list[tuple[torch.Tensor, torch.Tensor]] = getattr(_LOCAL, "signed", None) or []
    for seen, signed in held:
        if seen is sin:
            return signed
    signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    if getattr(_LOCAL, "inside", 0):
        _LOCAL.signed = [*held, (sin, signed)]
    return signed


def rotary_exact(original: Rotary) -> bool:
    """Whether both_at_once(original) gives `original`'s bits, in float32 and bfloat16."""
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        q, k = (torch.randn(2, heads, 3, 8, generator=generator).to(dtype) for heads in (4, 2))
        angles = torch.randn(2, 3, 8, generator=generator)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        try:
            want, got = original(q, k, cos, sin), both_at_once(original)(q, k, cos, sin)
            if not all(torch.equal(a, b) for a, b in zip(want, got, strict=True)):
                return False
        except Exception:  # another signature or shape: its own
            return False
    return True


def _rotary_modules(model: torch.nn.Module) -> tuple[ModuleType, ...]:
    """The modelling modules of `model`'s layers whose apply_rotary_pos_emb both_at_once matches."""
    found: dict[str, ModuleType] = {}
    for module in model.modules():
        home = sys.modules.get(type(module).__module__)
        if home is not None and callable(getattr(home, "apply_rotary_pos_emb", None)):
            found.setdefault(home.__name__, home)
    return tuple(home for home in found.values() if rotary_exact(home.apply_rotary_pos_emb))


def _norms_on(model: torch.nn.Module, norms: Norms) -> Norms:
    for module, forward in norms:
        module.forward = forward  # type: ignore[method-assign]  # the instance's, over its class's
    return norms


def _norms_off(model: torch.nn.Module, norms: Norms) -> None:
    for module, _ in norms:
        del module.forward  # its class's forward again


def _rotary_on(home: ModuleType, _: None) -> Rotary:
    original: Rotary = home.apply_rotary_pos_emb
    home.apply_rotary_pos_emb = both_at_once(original)  # type: ignore[attr-defined]
    return original


def _rotary_off(home: ModuleType, original: Rotary) -> None:
    home.apply_rotary_pos_emb = original  # type: ignore[attr-defined]


_NORMS, _ROTARY = Switch(_norms_on, _norms_off), Switch(_rotary_on, _rotary_off)


@contextmanager
def fused(model: torch.nn.Module, merge: bool = True) -> Iterator[None]:
    """`model`'s RMSNorms and rotary embedding computed by their fused forms (plan(model)) inside,
    and, if `merge`, its groups of projections as one product each."""
    made = plan(model)
    with ExitStack() as inside:
        inside.enter_context(_NORMS.inside(model, made.norms))
        if merge:
            inside.enter_context(projections.merged(model, made.merged))
        for home in made.rotary:
            inside.enter_context(_ROTARY.inside(home))
        _LOCAL.inside = getattr(_LOCAL, "inside", 0) + 1
        try:
            yield
        finally:
            _LOCAL.inside -= 1
            _LOCAL.signed = None


__all__ = ["FORMS", "Plan", "both_at_once", "form_of", "fused", "plan", "rotary_exact"]
