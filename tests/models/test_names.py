"""A catalogue model's tokenizer read straight from its GGUF file (models/names.py, issue 58): one read
of the file instead of AutoTokenizer's two, and the same tokenizer AutoTokenizer made when the model
was converted (the session's converted folders are AutoTokenizer's own output)."""

from __future__ import annotations

import pytest

from specfuse.models.cache import cached_folder
from specfuse.models.catalogue import CATALOGUE, DEFAULT_MEMBERS
from specfuse.models.names import load_tokenizer

from ..conftest import REAL_MODEL_CACHE

TEXTS = [
    "Hello world",
    "  spaces  and\ttabs\n\nnewlines ",
    "中文和代码 def f(x): return x**2",
    "<|im_start|>user\nhi<|im_end|> <start_of_turn>model <eos>",
    "émojis 🎉🎉 and \u202ertl",
    "1234567890 3.14159 -0.5e-3",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.mark.slow
@pytest.mark.parametrize("name", DEFAULT_MEMBERS)
def test_a_catalogue_tokenizer_from_its_gguf_file_is_the_one_autotokenizer_made(real_members, name, tmp_path):
    folder = cached_folder(CATALOGUE[name], REAL_MODEL_CACHE)
    assert folder is not None  # real_members converted it, through AutoTokenizer
    reference = real_members[name].tokenizer
    tokenizer, _, _ = load_tokenizer(name, tmp_path)  # an empty cache: from the GGUF file
    assert cached_folder(CATALOGUE[name], tmp_path) is None
    assert type(tokenizer).__name__ == type(reference).__name__
    assert tokenizer.get_vocab() == reference.get_vocab()
    assert tokenizer.all_special_tokens == reference.all_special_tokens
    for special in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(tokenizer, special) == getattr(reference, special), special
    assert tokenizer.chat_template == reference.chat_template
    texts = list(TEXTS)
    if reference.chat_template:
        chat = reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        assert tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == chat
        texts.append(chat)
    for text in texts:
        ids = reference.encode(text)
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.decode(ids) == reference.decode(ids), text
