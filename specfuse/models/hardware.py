"""What this machine's CPU can do, and what `--quantize auto` becomes on it for one user or for many.

Imports no torch: the commands decide and say why before anything heavy loads. The rule comes from
`python -m specfuse.bench serve --profile` on two CPU kinds (docs/serve.md, "Defaults by hardware"):

- one request at a time on a CPU, llama.cpp's 4-bit blocks answer 2-3x faster than torch, bf16 or fp32;
- many requests at once on a CPU without native bf16 (AVX2 only, most laptops): llama.cpp still
  serves the most, fp32 torch batches better but starts too far behind;
- many requests at once on a CPU with native bf16 (avx512_bf16 or amx_bf16): torch's bf16 matrix
  products batch well enough to serve more than llama.cpp (see BF16_SERVES_MORE);
- on a GPU the members run in torch.

ATEN_CPU_CAPABILITY=avx2 (or default) keeps torch on its AVX2 kernels: bf16 is then done in software,
so such a process counts as one without native bf16 (how the AVX2 figures were measured on a CPU
with AVX-512).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..members.cpu import cpu_flags

USERS = ("one", "many")  # who a command serves: one person's requests in turn, or many at once

# Whether bf16 torch serves many users faster than llama.cpp on a CPU with native bf16 (docs/serve.md).
BF16_SERVES_MORE = True


def native_bf16() -> bool:
    """bf16 matrix products in the CPU's own instructions (avx512_bf16, amx_bf16), and torch let use them."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if capability and not capability.startswith("avx512"):
        return False
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_kind() -> str:
    """The CPU in the words the docs' tables use."""
    if native_bf16():
        return "a CPU with native bf16"
    return "a CPU without native bf16" + (" (AVX2)" if "avx2" in cpu_flags() else "")


@dataclass(frozen=True)
class AutoBackend:
    """What `--quantize auto` becomes for a model with a GGUF file, and why."""

    quantize: str  # "gguf" (llama.cpp) or "none" (torch)
    reason: str

    def message(self, command: str) -> str:
        """The start-up line: the choice, its reason, and how to override it."""
        chosen = "llama.cpp (--quantize gguf)" if self.quantize == "gguf" else "torch (--quantize none)"
        other = "none" if self.quantize == "gguf" else "gguf"
        return f"{command}: members in {chosen}: {self.reason}; --quantize {other} overrides it"


def auto_backend(users: str, on_cpu: bool, llama_cpp: bool | None = None) -> AutoBackend:
    """The back end that measured fastest here for `users` ("one" or "many"), with the reason."""
    if users not in USERS:
        raise ValueError(f"users must be one of {USERS}, got {users!r}")
    if not on_cpu:
        return AutoBackend("none", "on a GPU the members run in torch")
    if llama_cpp is None:
        llama_cpp = importlib.util.find_spec("llama_cpp") is not None
    dtype = "bf16" if native_bf16() else "fp32"
    if not llama_cpp:
        return AutoBackend("none", f"llama-cpp-python is not installed (make llama-cpp), so {dtype} torch")
    if users == "one":
        return AutoBackend("gguf", f"one request at a time, llama.cpp answers 2-3x faster than {dtype} torch")
    if native_bf16() and BF16_SERVES_MORE:
        return AutoBackend(
            "none", f"on {cpu_kind()}, bf16 torch serves many requests at once faster than llama.cpp"
        )
    return AutoBackend(
        "gguf", f"on {cpu_kind()}, llama.cpp serves many requests at once faster than {dtype} torch"
    )


def settle_auto(quantize: str, users: str, device: str, say: Callable[[str], None], command: str) -> str:
    """A command's --quantize with "auto" settled for its users on its device, the choice and its
    reason said (`say`) at start-up: "auto" where llama.cpp is chosen (each GGUF model in llama.cpp,
    the others in torch: models.names.resolve_quantize), "none" where torch is; any other value as
    it is, unsaid."""
    if quantize != "auto":
        return quantize
    on_cpu = device == "cpu" or (device == "auto" and not _gpus())
    choice = auto_backend(users, on_cpu)
    say(choice.message(command))
    return "auto" if choice.quantize == "gguf" else "none"


def _gpus() -> int:
    import torch  # only for --device auto, where the members load in torch anyway

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


__all__ = ["USERS", "AutoBackend", "auto_backend", "cpu_flags", "cpu_kind", "native_bf16", "settle_auto"]
