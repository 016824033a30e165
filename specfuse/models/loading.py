"""A name → one member, here or served: the one loading path of a single member.

Knows nothing about drafting, scoring or rounds: it hands back a member and stops there. Which kind of
member a name is, and who may name it, is names.py's; this module builds the member; where an
ensemble's members load (devices, worker processes, a model listed twice) is placement.py's.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specfuse.errors import ConfigError, ModelLoadError
from specfuse.prompts import CHAT, QA_COMPLETION, PromptFormat

from .cache import Progress, assemble_gguf, cache_root, ensure_cached, no_progress
from .catalogue import CATALOGUE
from .devices import check_decode, gpu_count, plan_devices, resolve_dtype
from .names import (  # Loader, LoadRequest, load_tokenizer, resolve_quantize: importable here too
    Loader,
    LoadRequest,
    hub_failure,
    is_dir,
    is_gguf,
    is_hub_id,
    is_server,
    load_tokenizer,
    offline,
    pick_loader,
    resolve_quantize,
)
from .quantize import check_quantize, quantize_model
from .quantize_options import LLAMA_CPP

if TYPE_CHECKING:
    import torch

    from specfuse.members.hf import HFMember
    from specfuse.members.protocol import Member

log = logging.getLogger(__name__)

MemberLoad = Callable[..., "Member"]  # load_member's signature: (name, *, device, progress, **options)


# ---- one name → one member, here ------------------------------------------------------------------


def _from_pretrained(
    source: str | Path,
    dtype: torch.dtype,
    device_map: Any,
    trust_remote_code: bool,
    local_only: bool,
    gguf_file: str | None = None,
) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": local_only}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map=device_map, **kwargs)
    return model, tokenizer


def _load_catalogue(req: LoadRequest) -> Member:
    entry = CATALOGUE[req.name]
    if req.quantize in LLAMA_CPP:
        gguf = assemble_gguf(entry, cache_root(req.cache_dir) / "gguf", req.progress)
        return _in_llama_cpp(req, gguf, entry.trust, _load_catalogue)
    member = _load_hf(req, ensure_cached(entry, req.cache_dir, req.progress), None, True, entry.prompt_format)
    member.trust = entry.trust
    return member


def _load_folder(req: LoadRequest) -> HFMember:
    return _load_hf(req, Path(req.name).expanduser(), None, True, None)


def _load_gguf(req: LoadRequest) -> Member:
    path = Path(req.name).expanduser()
    if req.quantize in LLAMA_CPP:
        return _in_llama_cpp(req, path, None, _load_gguf)
    return _load_hf(req, path.parent, path.name, True, None)  # de-quantized at every load: slow, uncached


def _load_hub(req: LoadRequest) -> HFMember:
    return _load_hf(req, req.name, None, offline(), None)


def _load_llamacpp(req: LoadRequest, path: Path, trust: float | None) -> Member:
    """A GGUF file's model run by llama.cpp in this process, in the file's own quantization."""
    if req.device_map is not None or not req.device.startswith(("cpu", "auto")):
        raise ConfigError(
            f"{req.name}: quantize={req.quantize!r} runs llama.cpp on the CPU only; use --device cpu"
        )
    from specfuse.members.llamacpp.library import llama_cpp_module
    from specfuse.members.llamacpp.member import LlamaCppMember

    llama_cpp_module()  # says how to build it before anything loads
    tokenizer, prompt_format, eos = load_tokenizer(req.name, req.cache_dir, req.progress)
    req.progress(0.9, f"{req.name}: loading {path.name} into llama.cpp")
    start = time.perf_counter()
    member = LlamaCppMember(req.name, path, tokenizer, prompt_format=prompt_format, generation_eos=eos)
    member.trust = trust
    log.info("%s: loaded %s into llama.cpp in %.1f s", req.name, path.name, time.perf_counter() - start)
    req.progress(1.0, f"{req.name}: ready in llama.cpp")
    return member


def _in_llama_cpp(
    req: LoadRequest, path: Path, trust: float | None, load_in_torch: Callable[[LoadRequest], Member]
) -> Member:
    """quantize="gguf": the GGUF file in llama.cpp; "gguf-draft": that member drafts, and the same
    model loaded in torch by `load_in_torch` scores (members/split.py says why)."""
    drafter = _load_llamacpp(req, path, trust)
    if req.quantize == "gguf":
        return drafter
    from specfuse.members.split import SplitMember

    return SplitMember(drafter, load_in_torch(replace(req, quantize="none")))


def _load_server(req: LoadRequest) -> Member:
    """A member served by SGLang, vLLM or llama-server: only its tokenizer loads here."""
    from specfuse.members.remote.member import RemoteMember, parse_server_spec

    spec = parse_server_spec(req.name)
    req.progress(0.5, f"{spec.name}: loading the tokenizer ({spec.tokenizer})")
    tokenizer, prompt_format, eos = load_tokenizer(spec.tokenizer, req.cache_dir, req.progress)
    member = RemoteMember(
        spec.name,
        spec.engine,
        spec.url,
        tokenizer,
        prompt_format=prompt_format,
        timeout=spec.timeout,
        model=spec.model,
        generation_eos=eos,
        auth=spec.auth,  # sent as basic auth, never shown (spec.url holds no credentials)
        proxy=spec.proxy,
    )
    req.progress(0.9, f"{spec.name}: reaching {spec.url}")
    member.connect()
    req.progress(1.0, f"{spec.name}: ready at {spec.url}")
    return member


# The order matters: a server spec holds slashes, a hub id looks like a relative path.
LOADERS: tuple[Loader, ...] = (
    Loader("catalogue", lambda name: name in CATALOGUE, "anyone", _load_catalogue),
    Loader("server", is_server, "servers", _load_server),
    Loader("folder", is_dir, "paths", _load_folder),
    Loader("gguf", is_gguf, "paths", _load_gguf),
    Loader("hub", is_hub_id, "paths", _load_hub),
)


def check_member_name(name: str, *, allow_paths: bool = True, allow_servers: bool | None = None) -> Loader:
    """The loader for `name`, or the error that says why it cannot be a member.

    The one place member names are checked, for the CLI, the app, the benchmark and the evaluation.
    `allow_servers` (default: as `allow_paths`) admits server specs; the app allows them only for
    the specs the operator gave at start, so that a browser user can never make it reach a URL.
    """
    return pick_loader(name, LOADERS, allow_paths=allow_paths, allow_servers=allow_servers)


def load_member(
    name_or_path: str,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    device_map: str | dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    allow_paths: bool = True,
    allow_servers: bool | None = None,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    compile_decode: bool = False,
    quantize: str = "none",
    decode: str = "auto",
) -> Member:
    """Load a catalogue model, a local checkpoint folder (or .gguf file), a hub id or a server spec
    (`ENGINE:URL#NAME?tokenizer=...`, see members/remote/member.py) as a member.

    `device` is one torch device ("cpu", "cuda", "cuda:1", "auto"); `device_map` ("auto" or a
    dict) instead lets accelerate spread one model over several GPUs. Catalogue models are cached
    as safetensors under `cache_dir` (default $SPECFUSE_CACHE or ~/.cache/specfuse).
    `compile_decode`, `decode` (config.DECODE_MODES): how an in-process transformers model drafts
    (members/hf/compiled.py, members/hf/slots.py; docs/gpu.md); a served member ignores them.
    `quantize` ("none", "int8", "int4"): an in-process model's Linear weights are quantized after it
    loads, on the CPU only (models/quantize.py); "gguf": a catalogue model or .gguf file runs in
    llama.cpp in this process (members/llamacpp/member.py); "gguf-draft": drafts there and scores in bf16
    torch (members/split.py); "auto": gguf where that can run (resolve_quantize), else none. A served
    member ignores it.
    """
    check_quantize(quantize)
    check_decode(decode)
    loader = check_member_name(name_or_path, allow_paths=allow_paths, allow_servers=allow_servers)
    quantize = resolve_quantize(quantize, name_or_path, device, device_map)
    request = LoadRequest(
        name_or_path,
        device,
        dtype,
        device_map,
        cache_dir,
        trust_remote_code,
        progress or no_progress,
        compile_decode,
        quantize,
        decode,
    )
    return loader.load(request)


def _load_hf(
    req: LoadRequest,
    source: str | Path,
    gguf_file: str | None,
    local_only: bool,
    prompt_format: PromptFormat | None,
) -> HFMember:
    """Load a transformers model from `source` (a folder, a GGUF file's folder or a hub id)."""
    if req.quantize in LLAMA_CPP:
        raise ConfigError(
            f"{req.name}: quantize={req.quantize!r} runs a GGUF file in llama.cpp; "
            "name a catalogue model or a .gguf file"
        )
    device = req.device
    if req.device_map is None:
        device = plan_devices(1, device)[0]
        torch_dtype = resolve_dtype(req.dtype, device)
    else:
        torch_dtype = resolve_dtype(req.dtype, "cuda" if gpu_count() else "cpu")
    if req.quantize != "none" and (req.device_map is not None or not device.startswith("cpu")):
        raise ConfigError(f"{req.name}: quantize={req.quantize!r} runs on the CPU only; use --device cpu")
    name_or_path, report = req.name, req.progress
    report(0.9, f"{name_or_path}: loading")
    start = time.perf_counter()
    try:
        model, tokenizer = _from_pretrained(
            source, torch_dtype, req.device_map, req.trust_remote_code, local_only, gguf_file
        )
    except OSError as e:  # includes ConnectionError and huggingface_hub's offline errors
        if isinstance(source, str):
            raise ModelLoadError(hub_failure(name_or_path, e)) from e
        raise ModelLoadError(f"Could not load {name_or_path!r} from {source}: {e}") from e
    except (ValueError, KeyError, ImportError, struct.error) as e:  # struct.error: a truncated GGUF file
        raise ModelLoadError(f"Could not load {name_or_path!r}: {e}") from e
    model.eval()
    if req.device_map is None:
        model.to(device)
    quantize_model(model, req.quantize)
    member_device = str(model.get_input_embeddings().weight.device)
    if prompt_format is None:
        prompt_format = CHAT if getattr(tokenizer, "chat_template", None) else QA_COMPLETION
    log.info(
        "%s: loaded %s (%s%s) on %s in %.1f s",
        name_or_path,
        type(model).__name__,
        torch_dtype,
        "" if req.quantize == "none" else f", {req.quantize} weights",
        member_device,
        time.perf_counter() - start,
    )
    report(1.0, f"{name_or_path}: ready on {member_device}")
    from specfuse.members.hf import HFMember  # brings transformers: only once a model loads here

    return HFMember(
        name_or_path,
        model,
        tokenizer,
        prompt_format=prompt_format,
        device=member_device,
        compile_decode=req.compile_decode,
        decode=req.decode,
    )
