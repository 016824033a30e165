"""Names → members: the one loading path, for one member or an ensemble, here, in processes or served.

Knows nothing about drafting, scoring or rounds: it hands back members and stops there. Which kind of
member a name is, and who may name it, is names.py's; this module builds the member.
"""

from __future__ import annotations

import functools
import logging
import os
import struct
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specfuse.errors import ConfigError, ModelLoadError
from specfuse.members.process import ProcessMember, wanted
from specfuse.members.workers import cpu_cores
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
# load_member's defaults: an option left at its default is not passed (a `load` may not take it).
_LOAD_DEFAULTS = {"compile_decode": False, "quantize": "none", "decode": "auto"}


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


# ---- an ensemble: placement, worker processes, a model listed twice -------------------------------


def load_in_process(
    name_or_path: str, *, threads: int | None = None, load: MemberLoad | None = None, **options: Any
) -> ProcessMember:
    """`load(name_or_path, **options)` (load_member by default) in a worker process of its own.

    `threads`: the process's torch intra-op threads (a CPU member's share of the cores); None leaves
    torch's default. `load` and `options` go to a spawned process, so they must pickle.
    """
    build = functools.partial(load or load_member, name_or_path, **options)
    return ProcessMember(build, threads=threads)


def load_each(
    names: Sequence[str],
    devices: Sequence[str],
    load: Callable[[str, str, Progress], Member],
    progress: Progress | None = None,
) -> list[Member]:
    """`load(name, device, progress)` for each name on its device, in order; member i of n reports
    its progress as the i-th n-th part of the whole."""
    members: list[Member] = []
    for i, (name, device) in enumerate(zip(names, devices, strict=True)):

        def step(fraction: float, message: str, i: int = i) -> None:
            if progress is not None:
                progress((i + fraction) / len(names), message)

        members.append(load(name, device, step))
    return members


def load_members(
    names: Sequence[str],
    *,
    device: str = "cpu",
    devices: Sequence[str] | None = None,
    dtype: str = "auto",
    device_map: str | dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    allow_paths: bool = True,
    allow_servers: bool | None = None,
    trusted: Collection[str] = (),
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    processes: bool | str = False,
    ensemble_devices: Sequence[str] | None = None,
    load: MemberLoad | None = None,
    compile_decode: bool = False,
    quantize: str = "none",
    decode: str = "auto",
) -> list[Member]:
    """The members of one ensemble, in the order of `names`: the one loading path of the CLI, the
    app, the benchmarks and the evaluation.

    Where: `devices` (one per name), else plan_devices over the distinct names and `device`; with
    `device_map` accelerate spreads each model over the devices instead. Which names: catalogue names
    always, paths and hub ids with `allow_paths`, server specs with `allow_servers` (default: as
    `allow_paths`), and any name in `trusted` (the operator's own) as if both were allowed.

    `processes` (True/"on", False/"off" or "auto": where processes.processes_pay_off on the devices
    of `ensemble_devices`, default these members'): each model loads in a worker process of its own,
    with an equal share of the cores until a run sets its share; a served member stays here. Worker
    processes are spawned: a script that loads with processes must guard its top level with
    `if __name__ == "__main__":`.

    A model listed twice loads once: each later listing is another member, `name#2`, … on the same
    weights (Member.sharing). A worker process or a server cannot share, so with processes on, or a
    server spec listed twice, that is a ConfigError; under "auto" a repeated model keeps every
    member here. Whether a repeat makes sense (only when sampling) is the caller's decision.

    `load` loads one member here (default load_member; the app passes its own, tests a scripted one).
    `compile_decode` goes to each load (only when True, so that a `load` without it keeps working),
    as does `quantize` (only when not "none") and `decode` (only when not "auto").
    """
    check_quantize(quantize)
    check_decode(decode)
    load_here = load or load_member
    distinct = list(dict.fromkeys(names))
    placed = _placement(names, distinct, devices, device, device_map)
    in_processes = _in_processes(names, distinct, placed, processes, device_map, ensemble_devices)
    sharing = len(ensemble_devices or distinct)
    servers = allow_paths if allow_servers is None else allow_servers

    def one(name: str, place: str, step: Progress) -> Member:
        options: dict[str, Any] = dict(
            device=place,
            dtype=dtype,
            device_map=device_map,
            cache_dir=cache_dir,
            allow_paths=allow_paths or name in trusted,
            allow_servers=servers or name in trusted,
            trust_remote_code=trust_remote_code,
        )
        given = {"compile_decode": compile_decode, "quantize": quantize, "decode": decode}
        options.update({k: v for k, v in given.items() if v != _LOAD_DEFAULTS[k]})
        if not in_processes or is_server(name):
            return load_here(name, progress=step, **options)
        return _load_in_own_process(name, place, step, load_here, sharing, options)

    return _with_repeats(names, dict(zip(distinct, load_each(distinct, placed, one, progress))))


def _placement(
    names: Sequence[str],
    distinct: Sequence[str],
    devices: Sequence[str] | None,
    device: str,
    device_map: str | dict[str, Any] | None,
) -> list[str]:
    """The device of each distinct name: its own in `devices` (one per name), else plan_devices over
    them on `device`; with `device_map`, `device` for each (accelerate spreads each model)."""
    if devices is not None:
        if len(devices) != len(names):
            raise ConfigError(f"{len(devices)} devices for {len(names)} members")
        return [devices[names.index(n)] for n in distinct]
    return plan_devices(len(distinct), device) if device_map is None else [device] * len(distinct)


def _in_processes(
    names: Sequence[str],
    distinct: Sequence[str],
    placed: Sequence[str],
    processes: bool | str,
    device_map: str | dict[str, Any] | None,
    ensemble_devices: Sequence[str] | None,
) -> bool:
    """Whether the members load in worker processes of their own (load_members's `processes`), or
    the ConfigError that says why a model listed twice cannot share its weights."""
    repeated = [n for n in distinct if names.count(n) > 1]
    for name in repeated:
        if is_server(name):
            raise ConfigError(f"{name} is served by an inference server; list it once")
    if processes == "auto" and (device_map is not None or repeated):
        processes = False  # "auto" is for whole members, each listed once
    local = [d for n, d in zip(distinct, placed) if not is_server(n)]
    in_processes = wanted(processes, ensemble_devices or local, cpu_cores())
    if in_processes and repeated:
        raise ConfigError(f"{repeated[0]}: with --processes, list each model once")
    return in_processes


def _load_in_own_process(
    name: str, place: str, step: Progress, load_here: MemberLoad, sharing: int, options: dict[str, Any]
) -> Member:
    """`name` loaded by `load_here` in a worker process; a CPU member's threads are its equal share
    of the cores among `sharing` members."""
    step(0.0, f"loading {name} in a process of its own")
    threads = max(1, cpu_cores() // sharing) if place.startswith("cpu") else None
    member = load_in_process(name, threads=threads, load=load_here, **options)
    step(1.0, f"{name} loaded")
    return member


def _with_repeats(names: Sequence[str], loaded: dict[str, Member]) -> list[Member]:
    """The members in the order of `names`: a name's first listing is its loaded member, each later
    one another member, `name#2`, … on the same weights (Member.sharing)."""
    members: list[Member] = []
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        first = loaded[name]
        members.append(first if seen[name] == 1 else first.sharing(f"{name}#{seen[name]}"))
    return members


# ---- progress on a terminal -----------------------------------------------------------------------


def tqdm_progress(desc: str) -> Progress:
    """A progress callback that drives a tqdm bar on stderr, closed when the fraction reaches 1."""
    from tqdm import tqdm

    bar = tqdm(total=100, desc=desc, file=sys.stderr, bar_format="{percentage:3.0f}%|{bar:20}| {desc}")

    def update(fraction: float, message: str) -> None:
        bar.n = round(100 * min(max(fraction, 0.0), 1.0))
        bar.set_description_str(message, refresh=False)
        bar.refresh()
        if fraction >= 1.0:
            bar.close()

    return update
