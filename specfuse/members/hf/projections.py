"""One matrix product where a layer reads one input through several projections, in the KV slots'
steps (issue 52): queries, keys and values (q_proj, k_proj, v_proj), and the MLP's gate and up
(gate_proj, up_proj).

transformers multiplies the same hidden states by each projection's weight apart: seven products a
layer, each a kernel of its own in a captured step, and at a batch of one each a matrix-vector
product too small to keep the GPU's memory busy (Qwen2.5-7B's keys and values: 3,584 × 512 each).
Serving engines store such weights as one matrix; so does this, for the slots' own passes: four
products a layer.

- **No second copy of the weights.** When a model's plan is made (fusion.plan), each group's weights
  are copied into one matrix, their rows one after another, and each projection's weight becomes a
  view of its rows: the same values, and the eager path's products read the same numbers as before.
  Only plain `torch.nn.Linear`s on one device, in one dtype, all with a bias or none, without hooks
  (accelerate's offloading, a quantised layer) are merged.
- **Whichever projection of a group is called first** computes the merged product and keeps it for
  this thread; the others called on the same input tensor (the same object) take their part of it,
  a view, with no kernel. A projection called on another input, or whose weight no longer lies in
  its group's matrix (the model moved or converted since), computes its own product.
- **Only in a thread inside a slot pass** (`merged`): the projections' forwards are switched for
  every thread while a pass is inside (Switch), but another thread's eager pass meanwhile computes
  its own products, so the eager path's bits do not depend on what runs beside it. In float32 the
  merged product may round differently from three products in the last bits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

import torch
from torch.nn import functional

from .switch import Switch

# The projections, by attribute name, that each read the same input in the modelling code.
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


@dataclass(frozen=True)
class Group:
    """Linears that read one input, their weights the rows of `weight` in order (and their biases
    of `bias`)."""

    parts: tuple[torch.nn.Linear, ...]
    weight: torch.Tensor
    bias: torch.Tensor | None

    def intact(self) -> bool:
        """Whether each part's weight is still its rows of `weight` (a model moved or converted since
        holds copies)."""
        start, row = self.weight.data_ptr(), self.weight.stride(0) * self.weight.element_size()
        for part in self.parts:
            if part.weight.data_ptr() != start or part.weight.dtype != self.weight.dtype:
                return False
            start += part.out_features * row
        return True


def mergeable(parts: tuple[Any, ...]) -> TypeGuard[tuple[torch.nn.Linear, ...]]:
    """Whether `parts` can share one matrix: plain Linears (not a quantised subclass) on one device,
    in one dtype, reading inputs of one width, all with a bias or none, without hooks."""
    if not all(type(part) is torch.nn.Linear for part in parts):
        return False
    weights = [part.weight for part in parts]
    biases = [part.bias for part in parts]
    dtype = weights[0].dtype
    return (
        len({(w.device, w.dtype, w.shape[1]) for w in weights}) == 1
        and not weights[0].is_meta
        and all(w.is_contiguous() for w in weights)
        and (all(b is None for b in biases) or all(b is not None and b.dtype == dtype for b in biases))
        and not any(hasattr(part, "_hf_hook") or "forward" in vars(part) for part in parts)
        and not any(part._forward_hooks or part._forward_pre_hooks for part in parts)
    )


def _onto(parts: tuple[torch.nn.Linear, ...], name: str) -> torch.Tensor:
    """`parts`' tensors `name` copied into one, each part's becoming a view of its rows."""
    whole = torch.cat([getattr(part, name).detach() for part in parts])
    start = 0
    for part in parts:
        own = getattr(part, name)
        view = whole[start : start + own.shape[0]]
        setattr(part, name, torch.nn.Parameter(view, requires_grad=own.requires_grad))
        start += own.shape[0]
    return whole


def merge(model: torch.nn.Module) -> tuple[Group, ...]:
    """`model`'s groups of projections, each made to share one matrix (its weights rebound as views of
    it: the memory of one group's copy at a time more, meanwhile)."""
    groups = []
    for module in model.modules():
        for names in GROUPS:
            parts = tuple(getattr(module, name, None) for name in names)
            if not mergeable(parts):
                continue
            with torch.no_grad():
                weight = _onto(parts, "weight")
                bias = _onto(parts, "bias") if parts[0].bias is not None else None
            groups.append(Group(parts, weight, bias))
    return tuple(groups)


_LOCAL = threading.local()  # .inside: slot passes this thread is in; .held: the last merged product


def _forward(group: Group, index: int) -> Callable[[torch.Tensor], torch.Tensor]:
    part = group.parts[index]
    sizes = [p.out_features for p in group.parts]

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not getattr(_LOCAL, "inside", 0) or not group.intact():
            return functional.linear(x, part.weight, part.bias)
        held = getattr(_LOCAL, "held", None)
        if held is None or held[0] is not group or held[1] is not x:
            product = functional.linear(x, group.weight, group.bias)
            held = _LOCAL.held = (group, x, product.split(sizes, dim=-1))
        return cast("torch.Tensor", held[2][index])

    return forward


def _on(model: torch.nn.Module, groups: tuple[Group, ...]) -> tuple[Group, ...]:
    for group in groups:
        for index, part in enumerate(group.parts):
            part.forward = _forward(group, index)  # type: ignore[method-assign,assignment]  # over its class's
    return groups


def _off(model: torch.nn.Module, groups: tuple[Group, ...]) -> None:
    for group in groups:
        for part in group.parts:
            del part.forward  # its class's forward again


_SWITCH = Switch(_on, _off)


@contextmanager
def merged(model: torch.nn.Module, groups: tuple[Group, ...]) -> Iterator[None]:
    """Inside, this thread's passes through `model` compute each of `groups` as one product."""
    with _SWITCH.inside(model, groups):
        _LOCAL.inside = getattr(_LOCAL, "inside", 0) + 1
        try:
            yield
        finally:
            _LOCAL.inside -= 1
            _LOCAL.held = None  # the last product, released


__all__ = ["GROUPS", "Group", "merge", "mergeable", "merged"]
