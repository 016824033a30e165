"""Copies between the host and a CUDA device that do not hold up the host (issue 52).

A copy onto a CUDA device from ordinary (pageable) host memory, as `torch.tensor(data, device=...)`
and `.to(device)` make one, first waits for every kernel already queued on the stream: a round's
few small copies (a step's tokens, a verification's node indices and targets) each made the host
wait for the step before them, instead of queueing the work after it while the GPU ran. From pinned
memory with `non_blocking` the copy is queued like a kernel; PyTorch's pinned-memory cache keeps the
host buffer until it is done. A read back to the host waits only where it is read (`read_later`).
On a CPU both are plain copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`: on CUDA queued behind the stream's work, not waited for."""
    if torch.device(device).type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def tensor_on(
    data: Sequence[Any], device: torch.device | str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """torch.tensor(data) on `device`, copied as to_device does."""
    return to_device(torch.tensor(data, dtype=dtype), device)


def copy_into(buffer: torch.Tensor, host: torch.Tensor) -> None:
    """`host` copied into `buffer` (a captured step's input, on the device), as to_device does."""
    if buffer.device.type == "cuda" and host.device.type == "cpu":
        buffer.copy_(host.pin_memory(), non_blocking=True)
    else:
        buffer.copy_(host)


def read_later(values: torch.Tensor) -> Callable[[], list[Any]]:
    """`values` as lists on the host, read when called: on CUDA copied now (pinned memory, behind
    the work already enqueued, not behind what is enqueued next) and waited for then."""
    if values.device.type != "cuda":
        return values.tolist
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()

    def read() -> list[Any]:
        copied.synchronize()
        return host.tolist()

    return read


__all__ = ["copy_into", "read_later", "tensor_on", "to_device"]
