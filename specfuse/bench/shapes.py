"""Random-weight models with real shapes, for the timing benchmarks: the configs of real 7-9B models
and of the default trio, written out (no hub is needed), an in-memory byte-level tokenizer, and an
output head biased to printable ASCII so that random weights still write decodable text.

Timing does not depend on the weights, so no checkpoint is needed: each model is built from its real
config with random weights, directly on its device. The vocabulary keeps its real size (the output
head is a real share of the cost).
"""

from __future__ import annotations

from typing import Any

# The real configs (config.json of each model), written out: no hub is needed to run this.
SHAPES: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "real": {
        "qwen2.5-7b": (
            "qwen2",
            dict(
                hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6,
                rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
            ),
        ),
        "llama-3.1-8b": (
            "llama",
            dict(
                hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=5e5,
                rope_scaling={
                    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
                rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
            ),
        ),
        "gemma-2-9b": (
            "gemma2",
            dict(
                hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
                num_key_value_heads=8, head_dim=256, vocab_size=256000, max_position_embeddings=8192,
                rope_theta=10000.0, sliding_window=4096, attn_logit_softcapping=50.0,
                final_logit_softcapping=30.0, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
                hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
            ),
        ),
    },
}  # fmt: skip
# The same architectures, small enough for a CPU test of the whole benchmark.
SHAPES["tiny"] = {
    name: (arch, {**cfg, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096,
                  **({"head_dim": 16, "query_pre_attn_scalar": 16} if arch == "gemma2" else {})})
    for name, (arch, cfg) in SHAPES["real"].items()
}  # fmt: skip
# The real shapes' layer counts at the tiny shapes' widths, a vocabulary of 512 (the byte tokenizer fits):
# the host's work between a GPU's steps (every run's every layer), on a CPU whose arithmetic then costs
# little. What tools/slot_launches.py counts and times, and bench serve --shapes layers A/Bs.
SHAPES["layers"] = {
    name: (
        arch,
        {**cfg, "num_hidden_layers": SHAPES["real"][name][1]["num_hidden_layers"], "vocab_size": 512},
    )
    for name, (arch, cfg) in SHAPES["tiny"].items()
}
# The default trio's own configs (random weights): the CPU path timed on a machine with more cores
# than this project's 2, where the real checkpoints cannot travel.
SHAPES["trio"] = {
    "smollm2-135m": (
        "llama",
        dict(
            hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
            rope_theta=1e5, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu",
        ),
    ),
    "gemma3-270m": (
        "gemma3_text",
        dict(
            hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
            num_key_value_heads=1, head_dim=256, vocab_size=262144, max_position_embeddings=32768,
            query_pre_attn_scalar=256, sliding_window=512, rms_norm_eps=1e-6,
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        ),
    ),
    "qwen2.5-coder-0.5b": (
        "qwen2",
        dict(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
            rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
        ),
    ),
}  # fmt: skip
EXPECTED_PARAMS = {"qwen2.5-7b": 7.62e9, "llama-3.1-8b": 8.03e9, "gemma-2-9b": 9.24e9}  # published sizes
SPECIALS = ("<|eos|>",)


def byte_tokenizer() -> Any:
    """Byte-level BPE without merges, built in memory: 256 byte tokens and an end-of-sequence."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab[SPECIALS[0]] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIALS[0], pad_token=SPECIALS[0])


def build_config(arch: str, values: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(arch, **values)


def build_model(arch: str, values: dict[str, Any], device: str, dtype: Any, seed: int) -> Any:
    """A random-weight model of this shape, made on `device` (a 9B model never passes through CPU RAM)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(arch, values)
    torch.manual_seed(seed)
    with torch.device(device):
        # sdpa where transformers has it; Gemma-2's soft-capped attention is eager-only (flash-attention
        # aside, which is not installed by default).
        attention = "eager" if arch == "gemma2" else "sdpa"
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    return model.eval()


def ascii_head(model: Any, tokenizer: Any) -> None:
    """Replace the output head by the same weights plus a bias that rules out every token but the
    printable ASCII bytes: the vocabulary keeps its real size, the text stays decodable."""
    import torch

    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True, device=head.weight.device)
    biased.weight = head.weight
    with torch.no_grad():
        bias = torch.full((head.out_features,), -1e4, device=head.weight.device)
        for token, index in tokenizer.get_vocab().items():
            text = tokenizer.convert_tokens_to_string([token])
            if len(text) == 1 and text.isascii() and text.isprintable():
                bias[index] = 0.0
        biased.bias = torch.nn.Parameter(bias.to(head.weight.dtype), requires_grad=False)
    model.set_output_embeddings(biased)
