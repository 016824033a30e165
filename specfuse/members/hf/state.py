"""HFState: one request's context in an HFMember (its tokens, KV cache, random generator), and the
packed pass a verification may leave in that cache for accept().

Its own module so that member.py and the member's drafting and verifying halves (drafting.py,
verifying.py), which member.py imports, all name it without an import circle; ModelView, what of an
HFMember its helpers (compiled.py, slots.py) read, is here for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from ...prompts import Prompt
from ..drafting import TokenState


@dataclass(frozen=True)
class Beside:
    """A pass's keys and values kept beside a run's cache (a pass on the KV slots, slot_verify.py):
    per layer every run's [runs, kv heads, nodes, head dim], and this run's row and token count.
    Sliced where used (accept() takes the winner's columns), not a view a layer at every pass: at 32
    runs of Gemma-2-9B's 42 layers those views were 2,700 tensor operations a verification."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    row: int
    size: int
    stacked: tuple[torch.Tensor, torch.Tensor] | None = None  # kv's layers at once: [layers, runs, …]

    def columns(self, begin: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the run's keys and values of its packed tokens [begin, begin + count), each
        [1, kv heads, count, head dim] (views)."""
        r, end = self.row, begin + count
        return [(keys[r : r + 1, :, begin:end], values[r : r + 1, :, begin:end]) for keys, values in self.kv]


@dataclass
class PackedPass:
    """What the last verify pass left for accept(): its keys and values in the cache beyond the
    committed tokens (the eager pass), or beside it (`side`: on the KV slots, slot_verify.py)."""

    texts: tuple[str, ...]  # candidate texts, in block order
    starts: tuple[int, ...]  # anchor position of each block
    text_tokens: tuple[tuple[int, ...], ...]  # tokens of each candidate's text (no end marker)
    offsets: tuple[int, ...]  # where each block begins in the packed tokens
    last_hidden: tuple[torch.Tensor, ...]  # [H] hidden state after each candidate's text
    prefix_len: int  # committed length when the pass ran
    # Each candidate after the answer, as the member tokenizes them (what accept() would tokenize
    # again). The answer is the state's: only accept() changes it, and it drops the pass first.
    encoded: tuple[tuple[int, ...], ...]
    # The pass's keys and values where they were not appended to the cache (a pass on the KV
    # slots); None: in the cache after prefix_len.
    side: Beside | None = None


@dataclass
class Reading:
    """A prompt being read in parts (chunked prefill, HFMember.prefill_many): how far it is."""

    prompt: Prompt
    done: int = 0  # tokens of the prompt in the cache so far
    # Their final hidden states, kept only to measure the prompt's surprise once it is read whole.
    hidden: list[torch.Tensor] = field(default_factory=list)


@dataclass
class HFState(TokenState):
    """One request's context in one member: the cache holds exactly `ids` (plus a packed pass)."""

    cache: DynamicCache
    last_hidden: torch.Tensor  # [H]: final hidden state of ids[-1], predicts the next token
    generator: torch.Generator | None
    packed: PackedPass | None = field(default=None)
    surprise: float | None = None  # nats per byte of the prompt's own text (settings.measure_prompt)
    # Greedy drafts trimmed back to a word boundary: (the ids the draft continued, its kept tokens,
    # the tokens trimmed away). If the kept text wins, the next greedy draft begins with exactly the
    # trimmed tokens, so they are taken over instead of decoded again.
    trimmed: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    reading: Reading | None = None  # opened, its prompt not yet read whole (open_many); None: read


class ModelView(Protocol):
    """What of an HFMember the helpers it imports read (they cannot import member.py back)."""

    @property
    def name(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def sliding_window(self) -> int | None: ...
    @property
    def base(self) -> Any: ...  # the decoder without its output head


__all__ = ["Beside", "HFState", "ModelView", "PackedPass", "Reading"]
