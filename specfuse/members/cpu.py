"""What this machine's CPU is: its feature flags, and whether torch is held to its AVX2 kernels.

Stdlib only, so that a command can read them before anything heavy loads. Here, below the members,
because a member compiles by them (hf/compiled.py); models/hardware.py builds its rules on them.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    found = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    return frozenset(found.group(1).split()) if found else frozenset()


def held_to_avx2() -> bool:
    """torch held to its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) on a CPU with AVX-512, as the AVX2
    benchmarks run it: then torch.compile must not share compiled graphs with the CPU's own kernels.

    Inductor takes its vector width from ATEN_CPU_CAPABILITY, but its graph cache key does not
    (torch 2.13): a graph compiled under one capability was served under the other, and drafted
    NaNs or corrupted the heap. Such a process compiles its graphs afresh (hf/compiled.py).
    """
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    return capability == "avx2" and "avx512f" in cpu_flags()


__all__ = ["cpu_flags", "held_to_avx2"]
