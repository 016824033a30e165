"""Tests for models/devices.py: dtype and device choice."""

from __future__ import annotations

import pytest
import torch

from specfuse.errors import ConfigError
from specfuse.models import devices
from specfuse.models.devices import plan_devices, resolve_dtype


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_resolve_dtype_explicit_and_unknown():
    assert resolve_dtype("float32", "cpu") is torch.float32
    assert resolve_dtype("bfloat16", "cuda:0") is torch.bfloat16
    assert resolve_dtype("float16", "cpu") is torch.float16
    with pytest.raises(ConfigError, match="Unknown dtype 'fp8'"):
        resolve_dtype("fp8", "cpu")


def test_resolve_dtype_auto(monkeypatch):
    monkeypatch.setattr(devices, "native_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") is torch.bfloat16
    monkeypatch.setattr(devices, "native_bf16", lambda: False)
    assert resolve_dtype("auto", "cpu") is torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", "cuda:1") is torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", "cuda") is torch.bfloat16


def test_plan_devices_without_gpu(no_gpu):
    assert plan_devices(3, "cpu") == ["cpu"] * 3
    assert plan_devices(2, "auto") == ["cpu", "cpu"]
    assert plan_devices(0, "cpu") == []
    with pytest.raises(ConfigError, match="CUDA is not available"):
        plan_devices(1, "cuda")
    with pytest.raises(ConfigError, match="no GPU"):
        plan_devices(1, "per-gpu")
    with pytest.raises(ConfigError, match="Unknown device 'tpu'"):
        plan_devices(1, "tpu")


def test_plan_devices_with_two_gpus(two_gpus):
    assert plan_devices(3, "auto") == ["cuda:0", "cuda:1", "cuda:0"]
    assert plan_devices(3, "per-gpu") == ["cuda:0", "cuda:1", "cuda:0"]
    assert plan_devices(2, "cuda") == ["cuda:0", "cuda:0"]
    assert plan_devices(2, "cuda:1") == ["cuda:1", "cuda:1"]
    assert plan_devices(1, "cpu") == ["cpu"]
    with pytest.raises(ConfigError, match="only 2 GPU"):
        plan_devices(1, "cuda:2")
