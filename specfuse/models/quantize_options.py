"""The --quantize setting without torch: its choices, their check, and the flag's help, written once
for every command that loads members (specfuse, specfuse-serve, app.py, python -m specfuse.eval and
python -m specfuse.bench, serve included).

quantize.py does the quantizing (and imports torch); the command lines import this module instead,
so that `--help` and the app's start stay free of torch.
"""

from __future__ import annotations

from ..errors import ConfigError

QUANTIZE = ("none", "int8", "int4")
CLI_HELP = (  # --quantize in every command that loads members
    f"{', '.join(QUANTIZE)}: each model's Linear weights quantized after it loads, on the CPU only "
    "(default none; fewer bytes read per token; docs/benchmarks.md)"
)


def check_quantize(quantize: str) -> str:
    """`quantize` if it is one of QUANTIZE, else a ConfigError that lists them."""
    if quantize not in QUANTIZE:
        raise ConfigError(f"Unknown quantize {quantize!r}; choose one of: {', '.join(QUANTIZE)}.")
    return quantize


__all__ = ["CLI_HELP", "QUANTIZE", "check_quantize"]
