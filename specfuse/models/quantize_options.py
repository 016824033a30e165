"""The --quantize setting without torch: its choices, their check, and the flag's help, written once
for every command that loads members (specfuse, specfuse-serve, app.py, python -m specfuse.eval and
python -m specfuse.bench, serve included).

quantize.py does the quantizing (and imports torch); the command lines import this module instead,
so that `--help` and the app's start stay free of torch.
"""

from __future__ import annotations

from ..errors import ConfigError

QUANTIZE = ("none", "int8", "int4", "gguf", "gguf-draft", "auto")
LLAMA_CPP = ("gguf", "gguf-draft")  # the settings that run a GGUF file in llama.cpp
_CHOICES = (
    "none: bf16/fp32 weights in torch; int8, int4: each model's Linear weights quantized in torch "
    "after it loads; gguf: a GGUF model (the catalogue's, or a .gguf file) run in llama.cpp in this "
    "process, in the file's own 4-bit blocks (make llama-cpp); gguf-draft: drafts in llama.cpp as "
    "with gguf, scores in bf16 torch as with none (both loaded); auto: what measured fastest on this "
    "machine, said at start-up: gguf for GGUF models on the CPU where llama-cpp-python is installed, "
    "else none, and none for many users at once on a CPU with native bf16 (docs/serve.md). "
    "int8/int4/gguf/gguf-draft: CPU only; docs/benchmarks.md"
)
CLI_HELP = f"{_CHOICES} (default none)"  # the evaluation and the benchmarks: the same back end everywhere


def quantize_help(default: str, users: str = "one user") -> str:
    """The flag's help for a command whose default is `default`, "auto" chosen for `users` (words)."""
    if default != "auto":
        return f"{_CHOICES} (default {default})"
    return f"{_CHOICES} (default auto, chosen for {users})"


def cpu_only(quantize: str) -> bool:
    """int8, int4, gguf and gguf-draft run on the CPU only; none runs anywhere, and auto picks per device."""
    return quantize not in ("none", "auto")


def check_quantize(quantize: str) -> str:
    """`quantize` if it is one of QUANTIZE, else a ConfigError that lists them."""
    if quantize not in QUANTIZE:
        raise ConfigError(f"Unknown quantize {quantize!r}; choose one of: {', '.join(QUANTIZE)}.")
    return quantize


__all__ = ["CLI_HELP", "LLAMA_CPP", "QUANTIZE", "check_quantize", "cpu_only", "quantize_help"]
