"""What the fusion tests share (tests/members/test_slot_fusion.py, test_slot_projections.py): a
random-weight decoder of an architecture, its norms' weights random too."""

from __future__ import annotations

import torch

from specfuse.bench.shapes import SHAPES, build_model

from .conftest import tiny_model


def decoder(arch: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random-weight decoder of `arch` (Gemma 2 at the bench's tiny widths, the others the tests'
    tiny models), its norms' weights random too (not their ones or zeros)."""
    if arch == "gemma2":
        model = build_model(arch, SHAPES["tiny"]["gemma-2-9b"][1], "cpu", dtype, seed=4)
    else:
        model = tiny_model(arch, 64, seed=4).to(dtype)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.normal_()
    return model.base_model
