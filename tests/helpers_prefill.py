"""What the prefill tests share (tests/members/test_batched_prefill.py, test_slot_prefill.py): a
prompt format whose contexts all begin with a system turn, and the check that two reads of one
prompt left the same request state."""

from __future__ import annotations

import pytest
import torch

from specfuse.members.hf.state import HFState
from specfuse.prompts import PromptFormat

SYSTEM = PromptFormat(kind="chat", system="You answer in one short sentence, plainly.")


def assert_same_state(got: HFState, want: HFState, member) -> None:
    assert got.ids == want.ids and got.prompt_len == want.prompt_len and got.answer == want.answer == ""
    assert len(got.cache.layers) == len(want.cache.layers)
    for mine, theirs in zip(got.cache.layers, want.cache.layers):
        for name in ("keys", "values"):
            a, b = getattr(mine, name), getattr(theirs, name)
            assert a.shape == b.shape and a.shape[0] == 1 and a.shape[-2] == len(want.ids)
            assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())
            assert a.untyped_storage().nbytes() == a.numel() * a.element_size()  # its own, not the batch's
    assert got.cache.get_seq_length() == len(want.ids)
    assert torch.allclose(got.last_hidden, want.last_hidden, atol=1e-5)
    with torch.inference_mode():  # the next token each would pick
        assert int(member.head.logits(got.last_hidden[None]).argmax()) == int(
            member.head.logits(want.last_hidden[None]).argmax()
        )
    if want.surprise is None:
        assert got.surprise is None
    else:
        assert got.surprise == pytest.approx(want.surprise, abs=1e-5)
    if want.generator is None:
        assert got.generator is None
    else:
        assert torch.equal(got.generator.get_state(), want.generator.get_state())
