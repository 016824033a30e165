"""Where members run: the device settings, one device per member, and the dtype that suits each device.

Knows nothing about model names, files or members: loading.py asks it where and in what to load.
"""

from __future__ import annotations

import re

import torch

from specfuse.config import DECODE_MODES
from specfuse.errors import ConfigError

from .hardware import native_bf16

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICE_CHOICES = ("cpu", "cuda", "cuda:K", "auto", "per-gpu")


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """The torch dtype for `dtype` ("auto", "float32", "bfloat16", "float16") on `device`.

    "auto": bfloat16 on a CPU with native bf16 (hardware.native_bf16), else float32; on CUDA
    bfloat16 where supported, else float16.
    """
    if dtype in DTYPES:
        return DTYPES[dtype]
    if dtype != "auto":
        raise ConfigError(f"Unknown dtype {dtype!r}; choose one of: auto, {', '.join(DTYPES)}.")
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if native_bf16() else torch.float32


def gpu_count() -> int:
    """The CUDA GPUs visible to this process (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_devices(n: int, device: str) -> list[str]:
    """One torch device string for each of `n` members.

    "cpu": all on the CPU · "cuda" / "cuda:K": all on that GPU · "auto": round-robin over the GPUs,
    or the CPU when there are none · "per-gpu": round-robin over the GPUs, which must exist.
    """
    if n < 0:
        raise ConfigError(f"Cannot place {n} members.")
    gpus = gpu_count()
    if device == "cpu":
        return ["cpu"] * n
    if device == "cuda" or re.fullmatch(r"cuda:\d+", device):
        if gpus == 0:
            raise ConfigError(f"Device {device!r} asked for, but CUDA is not available; use --device cpu.")
        index = int(device.partition(":")[2] or 0)
        if index >= gpus:
            raise ConfigError(f"Device {device!r} asked for, but only {gpus} GPU(s) are visible.")
        return [f"cuda:{index}"] * n
    if device in ("auto", "per-gpu"):
        if gpus == 0:
            if device == "per-gpu":
                raise ConfigError("Device 'per-gpu' asked for, but no GPU is visible; use --device cpu.")
            return ["cpu"] * n
        return [f"cuda:{i % gpus}" for i in range(n)]
    raise ConfigError(f"Unknown device {device!r}; choose one of: {', '.join(DEVICE_CHOICES)}.")


def check_decode(decode: str) -> None:
    """A clear error for a decode path (how a transformers member drafts on its device) that is not
    one of config.DECODE_MODES."""
    if decode not in DECODE_MODES:
        raise ConfigError(f"decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
