"""Compiled decoding for an HFMember's drafts: a static KV cache and a `torch.compile`d decode step
(mode "reduce-overhead" on a GPU: CUDA graphs), opt in with `compile_decode=True`.

Only the drafting loop of one request (batch 1) changes. The request's own DynamicCache stays what
prefill, packed verification and accept() use, unchanged: at the first step of a draft its keys and
values are copied into a preallocated static cache (a device-to-device copy of the committed
tokens), the draft decodes there, and its tokens' keys and values are simply left behind, as the
eager path crops them away. The accepted segment is then moved into place in the DynamicCache as
before. A batch of requests (stream_many) drafts eagerly, as does a request that finds the static
cache in use by another thread, a GPU member drafting at once with others on a CUDA stream of its
own (its graphs failed there), or a model whose layers are not all full or sliding-window attention.
A compilation that fails (at any step) turns compiled decoding off for the member, with a warning,
and the draft goes on eagerly: the tokens it decoded so far are fed to its own cache.

A lone request's packed verification pass runs compiled too (`verify`): its candidates, padded to a
block of 64 or 256 tokens, are read after the committed tokens in the same static cache, with the
packed mask widened to the cache, and their keys and values are then appended to the request's own
DynamicCache, where the eager pass would have left them: accept() and everything after it are
unchanged. A pass longer than MAX_VERIFY_TOKENS runs eagerly.

The static cache is sized, at a request's first compiled draft, for the whole request: its prompt,
its answer budget and a verification block after them, in powers of two from 256 tokens. Each new
size is one compilation (and, on a GPU, one set of CUDA graphs: tens of seconds for a 7B model), so
a request never grows the cache in the middle of its answer; a longer request grows it once. Each
member compiles its own copy of the step function, so that members do not share torch.compile's
per-function limit of recompilations.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from ..cpu import held_to_avx2
from ..drafting import UTF8_GRACE_TOKENS, TokenState
from .scoring import chunk_mask, float_mask
from .state import ModelView
from .tailed import TailedLayer

log = logging.getLogger(__name__)

MIN_CAPACITY = 256  # the smallest static cache, in tokens; larger ones double
# A compiled verification pass reads a block of 64 tokens (three segments of 10 and their anchors fit
# with room to spare), or of 256; longer ones (long typed segments) run eagerly. Two sizes keep the
# compilations few: one per block size and static cache size.
VERIFY_BLOCKS = (64, 256)
MAX_VERIFY_TOKENS = VERIFY_BLOCKS[-1]
_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
R = TypeVar("R")


class _Member(ModelView, Protocol):
    """What of an HFMember this module uses (member.py imports this module, not the other way round)."""

    @property
    def model(self) -> Any: ...
    @property
    def compiled(self) -> CompiledDecoder | None: ...
    def hidden_states(self, ids: Sequence[int], cache: DynamicCache) -> torch.Tensor: ...


@dataclass
class _Draft:
    """One request's draft in progress on this thread."""

    capacity: int  # tokens the static cache must hold for it
    held: bool = False  # the static cache is this draft's (the lock is held)
    eager: bool = False  # this draft decodes eagerly (from its first step, or since a failure)
    start: int = -1  # the position of its first step in the static cache
    fed: list[int] = field(default_factory=list)  # the tokens decoded there so far


# torch.compile's backend where the caller names none: inductor, which on a CPU generates and compiles
# C++ (tens of seconds a member); the tests that check wiring rather than inductor set "aot_eager".
DEFAULT_BACKEND = "inductor"


class CompiledDecoder:
    """A member's static cache and compiled decode step, shared by its requests one at a time."""

    def __init__(
        self, member: _Member, *, backend: str | Callable[..., Any] | None = None, mode: str | None = None
    ) -> None:
        self.member = member
        on_gpu = str(member.device).startswith("cuda")
        self.backend = backend or DEFAULT_BACKEND
        # CUDA graphs on a GPU; on a CPU inductor's default (there are no graphs to capture).
        self.mode = mode if mode is not None else ("reduce-overhead" if on_gpu else None)
        self.cudagraphs = on_gpu and self.mode == "reduce-overhead"
        self.disabled = unsupported(member)  # why this member always decodes eagerly, if it does
        self.counts = {"static": 0, "eager": 0, "batched": 0}  # drafts, by how they decoded
        self.verified = 0  # lone verification passes run compiled
        self.verify_off: str | None = None  # why verification passes run eagerly (drafts may not)
        # A won draft's trimmed tokens, taken over at the member's next draft (take_over): one
        # compiled step each under CUDA graphs, where an eager forward of a 7B model costs three to
        # six of them (H100); one eager forward of all elsewhere (on a CPU it costs about one step).
        self.take_over_in_steps = self.cudagraphs
        self._lock = threading.Lock()
        self._local = threading.local()
        self._static: _Static | None = None
        # torch held to its AVX2 kernels on a bigger CPU (cpu.held_to_avx2): no compiled graph
        # shared with the CPU's own kernels through the caches, in either direction, and the code an
        # AVX2-only CPU would get (AVX2, FMA, F16C, BMI2). Options, because inductor's settings are
        # per thread and members compile in their own threads.
        self.options: dict[str, str | int | bool | Callable[..., Any]] | None = None
        if not on_gpu and self.mode is None and held_to_avx2():
            self.options = {"fx_graph_cache": False}
            if not os.environ.get("TORCHINDUCTOR_CPP_MARCH"):  # the operator's choice stands
                self.options["cpp.march"] = "x86-64-v3"
        self._compiled = self._own_compiled(_decode)
        self._compiled_verify = self._own_compiled(_verify)

    def _own_compiled(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """`step` compiled as a function of this member's own (its own code object): torch.compile
        keeps its compilations, and counts them against its limit, per code object."""
        code = step.__code__.replace(co_name=f"{step.__name__}_{abs(hash(self.member.name))}")
        mine = types.FunctionType(code, step.__globals__, code.co_name, step.__defaults__)
        return torch.compile(
            mine, backend=self.backend, mode=self.mode, options=self.options, fullgraph=True, dynamic=False
        )

    # -- a draft's begin and end (drafting(), around HFMember.draft_many) ----------------------------

    def open(self, states: Sequence[TokenState], budgets: Sequence[int]) -> None:
        if len(states) != 1:
            self.counts["batched"] += 1
            self._local.draft = None
            return
        (state,) = states
        this_draft = len(state.ids) + max(0, budgets[0]) + UTF8_GRACE_TOKENS + 1
        # Room for the whole request (its last draft and its last verification pass) from the first.
        whole_request = state.prompt_len + state.settings.max_new_tokens + VERIFY_BLOCKS[0]
        self._local.draft = _Draft(max(this_draft, whole_request))

    def close(self) -> None:
        draft: _Draft | None = getattr(self._local, "draft", None)
        self._local.draft = None
        if draft is None:
            return
        if draft.eager:
            self.counts["eager"] += 1
        elif draft.held:
            self.counts["static"] += 1
        if draft.held:
            self._lock.release()

    # -- one step (HFMember._step) ---------------------------------------------------------------

    def step(self, token: int, position: int, cache: DynamicCache) -> torch.Tensor | None:
        """The hidden state [1, H] after `token` at `position`, decoded in the static cache; None:
        decode this step eagerly, in `cache`, as the rest of this draft."""
        draft: _Draft | None = getattr(self._local, "draft", None)
        if draft is None or draft.eager:
            return None
        if not draft.held:
            if not self._take(cache, position):
                draft.eager = True
                return None
            draft.held, draft.start = True, position
        elif position != draft.start + len(draft.fed):  # never: draft_many steps one at a time
            raise RuntimeError(f"{self.member.name}: a compiled step at {position}, out of order")
        try:
            if not draft.fed:
                self._load(cache, position, draft.capacity)
            assert self._static is not None
            hidden = self._run(token, position, self._static)
        except Exception as e:  # a compilation (or recompilation) that failed: go on eagerly
            self.disabled = f"torch.compile failed: {type(e).__name__}: {e}"
            log.warning(
                "%s: compiled decoding is off, decoding eagerly (%s)", self.member.name, self.disabled
            )
            draft.eager = True
            # The request's cache still ends where the draft began: its tokens go there now.
            return self.member.hidden_states([*draft.fed, token], cache)[-1][None]
        draft.fed.append(token)
        return hidden

    # -- a lone request's verification pass (HFMember.verify_many) ------------------------------

    def verify(self, cache: DynamicCache, layout: Any) -> torch.Tensor | None:
        """The hidden states [1, Q, H] of one request's packed pass (`layout`, scoring.lay_out, after
        the `cache` of its committed tokens), read in the static cache with a compiled step; their
        keys and values are appended to `cache` as an eager pass leaves them. None: run it eagerly
        (nothing changed)."""
        length, prefix = layout.length, layout.width
        if self.verify_off or length > MAX_VERIFY_TOKENS or not self._take(cache, prefix):
            return None
        try:
            block = next(size for size in VERIFY_BLOCKS if size >= length)
            self._load(cache, prefix, prefix + block)
            static = self._static
            assert static is not None
            input_ids, position_ids, mask = _widened(layout, block, static.capacity, self.member)
            if self.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            hidden = self._compiled_verify(self.member, input_ids, position_ids, mask, static.cache)
            hidden = hidden[:, :length].clone()  # a CUDA graph's output is overwritten by its next replay
            layers = cast("list[DynamicLayer]", cache.layers)
            new = slice(prefix, prefix + length)
            grown = [  # every layer's first, then all assigned: a failure leaves `cache` whole
                (_cat(theirs.keys, mine.keys, new), _cat(theirs.values, mine.values, new))
                for mine, theirs in zip(static.layers, layers)
            ]
            for theirs, (keys, values) in zip(layers, grown):
                theirs.keys, theirs.values = keys, values
        except Exception as e:  # compiled verification off (drafts stay compiled), this pass eager
            self.verify_off = f"torch.compile failed: {type(e).__name__}: {e}"
            log.warning(
                "%s: compiled verification is off, verifying eagerly (%s)", self.member.name, self.verify_off
            )
            return None
        finally:
            self._lock.release()
        self.verified += 1
        return hidden

    def _take(self, cache: DynamicCache, length: int) -> bool:
        """Whether a request whose `cache` should hold its `length` committed tokens may use the
        static cache now; True: this thread holds its lock (the caller releases it)."""
        return not (
            self.disabled
            or self._off_the_default_stream()
            or cache.get_seq_length() != length
            or any(type(layer) not in (DynamicLayer, TailedLayer) for layer in cache.layers)
        ) and self._lock.acquire(blocking=False)

    def _off_the_default_stream(self) -> bool:
        """A member drafting at once with others, in a thread on a CUDA stream of its own: its CUDA
        graphs are not replayed there. On an H100 that failed (an index assertion in an inductor
        kernel, most likely a race between the member's stream and the graphs'), so these drafts
        decode eagerly."""
        if not self.cudagraphs:
            return False
        device = torch.device(self.member.device)
        return bool(torch.cuda.current_stream(device) != torch.cuda.default_stream(device))

    def _run(self, token: int, position: int, static: _Static) -> torch.Tensor:
        device = self.member.device
        input_ids = torch.tensor([[token]], device=device)
        position_ids = torch.tensor([[position]], device=device)
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are read already
        hidden = self._compiled(self.member, input_ids, position_ids, static.cache, static.capacity)
        return hidden.clone()  # a CUDA graph's output is overwritten by its next replay

    @torch.inference_mode()  # as in a draft: the compiled step was traced there
    def replay(self, token: int, position: int) -> torch.Tensor:
        """One compiled step at `position` in the static cache as the last request left it, outside
        any draft, with no read back: a benchmark times the step's own work this way (the slot at
        `position` is overwritten; the next draft loads the cache afresh)."""
        if self._static is None:
            raise RuntimeError(f"{self.member.name}: no static cache yet (draft once first)")
        return self._run(token, position, self._static)

    @property
    def capacity(self) -> int:
        """Tokens the static cache holds now (0: none made yet)."""
        return self._static.capacity if self._static is not None else 0

    def _load(self, cache: DynamicCache, length: int, capacity: int) -> None:
        """The static cache, holding `cache`'s `length` tokens and room for `capacity` in all."""
        theirs = [(layer.keys, layer.values) for layer in cast("list[DynamicLayer]", cache.layers)]
        static, (first, _) = self._static, theirs[0]
        assert first is not None
        if static is None or static.capacity < capacity or static.keys_like != (first.dtype, first.device):
            size = MIN_CAPACITY
            while size < capacity:
                size *= 2
            self._static = None  # free the smaller one before the larger one is made
            layers = [StaticLayer(max_cache_len=size) for _ in theirs]
            for mine, (keys, values) in zip(layers, theirs):
                assert keys is not None and values is not None
                mine.lazy_initialization(keys, values)
            static = self._static = _Static(
                Cache(layers=list(layers)), layers, size, (first.dtype, first.device)
            )
        for mine, (keys, values) in zip(static.layers, theirs):
            assert mine.keys is not None and mine.values is not None
            assert keys is not None and values is not None
            mine.keys[:, :, :length].copy_(keys)
            mine.values[:, :, :length].copy_(values)
            mine.cumulative_length.fill_(length)


@dataclass
class _Static:
    """The static cache, its layers as made, and its size."""

    cache: Cache
    layers: list[StaticLayer]
    capacity: int
    keys_like: tuple[torch.dtype, torch.device]


def _decode(
    member: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: Cache, width: int
) -> torch.Tensor:
    """One decoding step in a static cache of `width` slots: the masks hide the slots past the
    position (and, for sliding-window layers, those before the window); returns the hidden state [1, H]."""
    column = torch.arange(width, device=input_ids.device)[None, :]
    allowed = column <= position_ids
    full = float_mask(allowed[:, None, None, :], member.dtype)
    mask: torch.Tensor | dict[str, torch.Tensor] = full
    if member.sliding_window is not None:
        near = column > position_ids - member.sliding_window
        mask = {
            "full_attention": full,
            "sliding_attention": float_mask((allowed & near)[:, None, None, :], member.dtype),
        }
    return _verify(member, input_ids, position_ids, mask, cache)[:, -1]


def _verify(member: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Any, cache: Cache) -> Any:
    """Tokens [1, W] after the committed ones in a static cache, seen as `mask` says (a packed
    verification block; one decoding step); returns the hidden states [1, W, H]."""
    out = member.base(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=mask,
        past_key_values=cache,
        use_cache=True,
    )
    return out.last_hidden_state


def _cat(committed: torch.Tensor | None, static: torch.Tensor | None, new: slice) -> torch.Tensor:
    """A layer's committed keys (or values) followed by the static cache's at `new`."""
    assert committed is not None and static is not None
    return torch.cat([committed, static[:, :, new]], dim=-2)


def _widened(
    layout: Any, block: int, capacity: int, member: _Member
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | dict[str, torch.Tensor]]:
    """The packed pass of one request as a block of `block` tokens in a static cache of `capacity`:
    its ids and positions padded (each padding token at the first free position, seeing only itself)
    and its mask [1, 1, block, capacity], the packed mask in its first columns and nothing visible
    past them."""
    length, prefix = layout.length, layout.width
    device = layout.input_ids.device
    pad = block - length
    input_ids = torch.nn.functional.pad(layout.input_ids, (0, pad), value=0)  # any token: unseen
    position_ids = torch.nn.functional.pad(layout.position_ids, (0, pad), value=prefix)
    packed = chunk_mask(layout, 0, length, member.dtype, member.sliding_window)
    rows = torch.arange(length, block, device=device)

    def widen(mask: torch.Tensor) -> torch.Tensor:
        wide = torch.full(
            (1, 1, block, capacity), torch.finfo(mask.dtype).min, dtype=mask.dtype, device=device
        )
        wide[:, :, :length, : prefix + length] = mask
        wide[0, 0, rows, prefix + rows] = 0.0  # a padding token sees itself: no row is all masked
        return wide

    if isinstance(packed, dict):
        return input_ids, position_ids, {kind: widen(m) for kind, m in packed.items()}  # type: ignore[return-value]
    return input_ids, position_ids, widen(packed)


def unsupported(member: Any) -> str | None:
    """Why a member cannot decode in a static cache of full-attention layers, or None."""
    model = member.model
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if not kinds <= _LAYER_TYPES:
        return f"layer types {sorted(kinds - _LAYER_TYPES)}"
    if len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1:
        return "a model spread over several devices"
    return None


def take_over(member: _Member, tokens: Sequence[int], position: int, cache: DynamicCache) -> torch.Tensor:
    """The hidden state [1, H] after a draft's first `tokens`, known before it decodes (a won draft's
    trimmed tail, HFMember.draft_many) and fed from `position`: as compiled steps in the static cache
    where the member's decoder takes them over in steps, else by one eager forward into `cache`."""
    decoder = member.compiled
    if decoder is None or not decoder.take_over_in_steps:
        return member.hidden_states(tokens, cache)[-1][None]
    hidden = None
    for i, token in enumerate(tokens):
        hidden = decoder.step(token, position + i, cache)
        if hidden is None:  # this draft decodes eagerly from here on: `cache` holds tokens[:i]
            return member.hidden_states(tokens[i:], cache)[-1][None]
    assert hidden is not None, "nothing to take over"
    return hidden


def drafting(method: Callable[..., R]) -> Callable[..., R]:
    """Around HFMember.draft_many: tells the member's compiled decoder (if it has one) where a
    draft begins and ends, however it ends."""

    @functools.wraps(method)
    def wrapper(member: _Member, states: Sequence[TokenState], budgets: Sequence[int]) -> R:
        decoder = member.compiled
        if decoder is None:
            return method(member, states, budgets)
        decoder.open(states, budgets)
        try:
            return method(member, states, budgets)
        finally:
            decoder.close()

    return wrapper
