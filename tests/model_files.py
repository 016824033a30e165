"""Model files for the specfuse.models tests: fake catalogue entries and a tiny saved checkpoint."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from specfuse.models.catalogue import ModelEntry
from specfuse.prompts import CHAT


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


def save_tiny_checkpoint(folder: Path, chat_template: str | None, intermediate_size: int = 32) -> None:
    """A one-layer Llama with a six-word tokenizer; `intermediate_size` sets the weights' size (2**17:
    25 MB, a file large enough for damage between the blocks a sampled fingerprint reads)."""
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
        intermediate_size=intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    hf.save_pretrained(folder)
