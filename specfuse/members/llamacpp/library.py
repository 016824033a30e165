"""llama.cpp's C side for LlamaCppMember: the library loaded once (its log silenced), the CPU kernels
its build runs, a GGUF file's weights (LlamaModel, shared by the members on them) and its own
description. Nothing here knows the Member protocol: member.py builds a member on these.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from pathlib import Path
from typing import Any

from ...errors import ConfigError, ModelLoadError

BUILD_HINT = "run `make llama-cpp` (builds llama-cpp-python from its pinned sdist once; docs/benchmarks.md)"

_init_lock = threading.Lock()
_lib: Any = None
_quiet_log: Any = None  # the C callback that silences llama.cpp's log; kept alive here


def llama_cpp_module() -> Any:
    """llama-cpp-python's low-level bindings, the backend initialised once and its log silenced."""
    global _lib, _quiet_log
    with _init_lock:
        if _lib is None:
            try:
                import llama_cpp
            except ImportError as e:
                raise ConfigError(
                    f"llama.cpp in process needs llama-cpp-python, not installed: {BUILD_HINT}"
                ) from e
            _quiet_log = llama_cpp.llama_log_callback(lambda level, text, data: None)
            llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _lib = llama_cpp
        return _lib


def llama_cpp_kernels() -> str:
    """The CPU kernels this build of llama.cpp runs: "AVX-512", "AVX2" or "other" (its system info)."""
    info = llama_cpp_module().llama_print_system_info().decode()
    if "AVX512 = 1" in info:
        return "AVX-512"
    return "AVX2" if "AVX2 = 1" in info else "other"


class LlamaModel:
    """A GGUF file loaded by llama.cpp (weights only), freed when the last member on it is gone."""

    def __init__(self, lib: Any, name: str, path: Path) -> None:
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        self.pointer = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.pointer:
            raise ModelLoadError(f"{name}: llama.cpp could not load {path} (not a GGUF model it knows?)")
        weakref.finalize(self, lib.llama_model_free, self.pointer)


def model_dtype(lib: Any, model: Any) -> str:
    """The model's own description, as a member's dtype: e.g. "gguf qwen2 1B Q4_K - Medium"."""
    desc = ctypes.create_string_buffer(128)
    lib.llama_model_desc(model, desc, len(desc))
    return f"gguf {desc.value.decode(errors='replace')}"


__all__ = ["BUILD_HINT", "LlamaModel", "llama_cpp_kernels", "llama_cpp_module", "model_dtype"]
