"""models/hardware.py: the CPU's kind and what --quantize auto becomes for one user or many, said at
start-up by each command (and torch-free, so that it can be said before anything heavy loads)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specfuse.models import hardware
from specfuse.models.hardware import auto_backend, native_bf16, settle_auto

from ..conftest import free_port


@pytest.fixture
def cpu(monkeypatch):
    """Pretend the CPU has these flags (and torch its default kernels)."""
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)

    def have(*flags: str) -> None:
        monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))

    return have


def test_native_bf16_needs_the_instructions_and_torch_allowed_to_use_them(cpu, monkeypatch):
    cpu("avx2", "avx512f", "avx512_bf16")
    assert native_bf16()
    assert hardware.cpu_kind() == "a CPU with native bf16"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # torch kept on AVX2 kernels: bf16 in software
    assert not native_bf16()
    assert hardware.cpu_kind() == "a CPU without native bf16 (AVX2)"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    assert native_bf16()
    cpu("avx2", "amx_bf16")
    assert native_bf16()
    cpu("avx2", "fma")
    assert not native_bf16()


def test_torch_is_held_to_avx2_only_by_its_capability_on_a_cpu_with_avx512(monkeypatch):
    from specfuse.members import cpu

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not cpu.held_to_avx2()  # torch's own kernels
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    assert cpu.held_to_avx2()
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # its own kernels: AVX2
    assert not cpu.held_to_avx2()


def test_llama_cpp_for_one_user_anywhere_on_a_cpu_and_for_many_without_native_bf16(cpu):
    cpu("avx2")
    one, many = auto_backend("one", True, llama_cpp=True), auto_backend("many", True, llama_cpp=True)
    assert one.quantize == many.quantize == "gguf"
    assert "without native bf16 (AVX2)" in many.reason and "fp32 torch" in many.reason
    cpu("avx2", "avx512_bf16")
    assert auto_backend("one", True, llama_cpp=True).quantize == "gguf"
    many = auto_backend("many", True, llama_cpp=True)
    assert many.quantize == "none" and "bf16 torch serves many" in many.reason
    # Without llama-cpp-python, or on a GPU, torch.
    assert auto_backend("one", True, llama_cpp=False).quantize == "none"
    assert "make llama-cpp" in auto_backend("one", True, llama_cpp=False).reason
    assert auto_backend("one", False, llama_cpp=True).quantize == "none"
    with pytest.raises(ValueError, match="users"):
        auto_backend("everyone", True)


def test_a_command_says_its_choice_and_how_to_override_it_and_keeps_an_explicit_one(cpu, monkeypatch):
    cpu("avx2")
    monkeypatch.setattr(hardware.importlib.util, "find_spec", lambda name: object())
    said: list[str] = []
    assert settle_auto("auto", "many", "cpu", said.append, "specfuse-serve") == "auto"
    assert said == [
        "specfuse-serve: members in llama.cpp (--quantize gguf): on a CPU without native bf16 (AVX2), "
        "llama.cpp serves many requests at once faster than fp32 torch; --quantize none overrides it"
    ]
    cpu("avx512_bf16")
    assert settle_auto("auto", "many", "cpu", said.append, "specfuse-serve") == "none"
    assert said[-1].endswith("--quantize gguf overrides it")
    assert settle_auto("int8", "many", "cpu", said.append, "x") == "int8" and len(said) == 2


def test_the_server_says_its_choice_at_start_up():
    server = subprocess.Popen(
        [sys.executable, "-m", "specfuse.serve", "--models", "smollm2-135m", "--port", str(free_port())],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = ""
        for line in server.stderr:  # type: ignore[union-attr]
            if "members in" in line or "listening" in line:
                said = line
                break
    finally:
        server.terminate()
        server.wait(30)
    expected = auto_backend("many", True)
    assert f"--quantize {expected.quantize})" in said and expected.reason in said
