"""Batched drafting on static slots: a member's fixed KV store, one decoding step per batch-size
bucket, captured as a CUDA graph on a GPU (issue 52).

Every draft the scheduler asks of a member (HFMember.draft_many: all its runs, a forward pass per
token) decodes here on the "graphs" decode path. The store holds `rows` slots of `capacity` tokens
per layer ([rows, kv heads, capacity, head dim]), allocated once: at a draft's start the runs'
committed keys and values (their own DynamicCaches, which prefill, packed verification and accept()
keep using) are loaded into slots 0..n-1 on the device, so runs join and leave between rounds with
no reallocation or recapture; a step of fewer rows may be wider than `capacity` in the same memory
(slot_layer.py), leaving the other widths' graphs valid. Column p of a row holds position p; a step
writes each row's new keys at its own position (a scatter), and the mask shows each row its columns up
to its position (within the window for sliding-window layers). The draft's own keys are left behind,
as eagerly cropped.

A step runs on a bucket of rows (BUCKETS, then powers of two) and a width of columns (a power of two
from MIN_WIDTH); rows past the draft's own are padding (a placeholder at position 0 of a slot no run
holds this draft). On CUDA each (bucket, width) step, forward pass and output head, is captured once
as a torch.cuda.CUDAGraph (a few forward passes' time, not a compilation): at start-up (prepare, said
as "capturing graphs k/n") for the buckets a first request needs, else at first use; a replay reads
its tokens and positions from one small input buffer. Verification's steps (slot_verify.py) are
captured the same way, in the same pool. A capture that fails turns capture off for the member, with
a warning, and the same steps run uncaptured, as they do on a CPU, where the greedy answers equal the
eager path's (tests/members/test_slots.py). Why not transformers' own continuous batching: docs/gpu.md.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from ...config import DECODE_MODES
from ...errors import ConfigError
from .. import profiling
from . import attention, fusion, transfer
from .scoring import float_mask
from .slot_layer import Shape, SlotLayer, Stack
from .state import ModelView
from .tailed import Loads, pieces, plain, run_parts

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32)  # rows per captured step; larger batches take the next power of two
# The narrowest step, in columns; wider ones double. 512: a run up to ~480 tokens (a chat's turns) never
# waits for a capture at first use (0.2 s a step); the masked columns cost a lone run's step < 0.2 %.
MIN_WIDTH = 512
WARMUP_STEPS = 2  # uncaptured runs of a step before its capture (cuBLAS handles, lazy allocations)
# Start-up (prepare): the verification buckets captured before the first request (query tokens per
# row: N candidates of L + 1 tokens, N = 3 and L = 10 make 33; a prompt is read 256 tokens a step,
# prefill.on_slots), and the columns the store is made with: rows x columns it holds without a new
# allocation (which drops every graph), a lone run of 16,384 tokens as well as 32 runs of 512.
STARTUP_VERIFY = (16, 32, 64, 128, 256)
STARTUP_CAPACITY = MIN_WIDTH
_CAPTURING = threading.Lock()  # one CUDA graph capture at a time in the process (_capture)


def resolved(mode: str, device: str) -> str:
    """The decode path a member on `device` takes for `mode` (DECODE_MODES): "graphs" or "eager"."""
    if mode not in DECODE_MODES:
        raise ConfigError(f"decode must be one of {', '.join(DECODE_MODES)}, got {mode!r}")
    if mode == "auto":
        return "graphs" if str(device).startswith("cuda") else "eager"
    return mode


def bucket_of(rows: int) -> int:
    """The rows of the step that serves `rows` runs: the smallest bucket that holds them."""
    return next((b for b in BUCKETS if b >= rows), 1 << max(0, rows - 1).bit_length())


def width_of(columns: int) -> int:
    """The columns of the step that serves rows reaching `columns` positions."""
    width = MIN_WIDTH
    while width < columns:
        width *= 2
    return width


class _Member(ModelView, Protocol):
    """What of an HFMember this module uses (member.py imports this module, not the other way round)."""

    @property
    def head(self) -> Any: ...


@dataclass
class _Graph:
    """One captured step: its graph, its input buffer (a draft's [2, rows]: tokens, positions; a
    verification's: slot_verify.py) and its output (a draft's logits [rows, V], a verification's
    hidden states), overwritten by the next replay of the graph."""

    graph: Any  # torch.cuda.CUDAGraph
    inputs: torch.Tensor
    output: torch.Tensor


# A step's key among a member's graphs: ("draft", rows, 1, width) or ("verify", rows, tokens, width).
Key = tuple[str, int, int, int]
# A step of another kind (verification: slot_verify.step): for a store and a bucket of rows, tokens
# per row and width, its input buffer filled with harmless placeholders, and the step itself.
StepMaker = Callable[
    ["SlotStore", int, int, int], tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]
]


class SlotStore:
    """A member's slots and its decoding steps, one draft at a time (a second draft that finds the
    store in use, from another thread, decodes eagerly)."""

    def __init__(
        self,
        member: _Member,
        *,
        capture: bool | None = None,
        unsupported: str | None = None,
        verifier: StepMaker | None = None,
    ) -> None:
        self.member = member
        # The verification step's maker (slot_verify.step); None: this store drafts, and prepares, only.
        self.verifier = verifier
        on_gpu = str(member.device).startswith("cuda")
        # CUDA graphs where there is CUDA; `capture=True` on a CPU is refused, not ignored.
        if capture and not on_gpu:
            raise ValueError(f"{member.name}: CUDA graphs need a CUDA device, not {member.device}")
        self.capture = on_gpu if capture is None else capture
        # Switches for an A/B run (bench serve --slots-off): drafts a step ahead (drafting.py), attention
        # folded (attention.py), loads batched (_load), norms and rotary fused (fusion.py; planned before
        # any capture), projections merged within (projections.py), prompts read here (prefill.on_slots).
        self.ahead, self.fold, self.batched, self.fuse, self.prefill = on_gpu, True, on_gpu, on_gpu, True
        self.merge = on_gpu
        self.stacked = True  # a load's write and a verification's gather for every layer at once (Stack)
        if self.fuse and unsupported is None:
            with _CAPTURING:  # the merged projections' old weights given back: no capture under way
                fusion.plan(member.base, release=on_gpu)
        self.disabled = unsupported  # why this member always drafts eagerly, if it does
        self.capture_off: str | None = None  # why its steps run uncaptured, if they do
        self.rows = self.capacity = 0
        self.layers: list[SlotLayer] = []
        self.cache: Cache | None = None
        self.shape = Shape()
        self.graphs: dict[Key, _Graph] = {}
        self.pool: Any = None
        self.counts = {"drafts": 0, "steps": 0, "replays": 0, "captures": 0, "busy": 0}
        # Verification steps, by what they served: candidates, or prompts read (slot_verify.read_after).
        self.counts |= {"verifies": 0, "verify_replays": 0, "prefills": 0, "prefill_replays": 0}
        self.capture_seconds = 0.0
        # Milliseconds of GPU time one replay of each step at MIN_WIDTH took, replays alone and back
        # to back (time_replays: bench serve's, never a start-up's): set beside the weight-read
        # floor, what the step's kernels cost without the host's work around them.
        self.replay_ms: dict[Key, float] = {}
        self._lock = threading.Lock()
        self.loads = Loads()
        self.stack: Stack | None = None  # the layers' slots in one allocation, where they are alike

    # -- a draft's begin and end ---------------------------------------------------------------

    def begin(self, caches: Sequence[DynamicCache], steps: int) -> bool:
        """Take the store for one draft: the runs' `caches` copied into slots 0..n-1, room for
        `steps` more tokens each, the step for their bucket ready (captured on CUDA). False: the
        store cannot take it (unsupported, or in use by another thread): draft eagerly."""
        lengths = [c.get_seq_length() for c in caches]
        # One column past the draft's last: the column a capture writes at, never seen.
        if not self.hold(caches, "draft", 1, width_of(max(lengths) + steps + 2)):
            return False
        self.counts["drafts"] += 1
        return True

    def hold(self, caches: Sequence[DynamicCache], kind: str, tokens: int, width: int) -> bool:
        """Take the store for one call of `kind` ("draft", "verify": its step's `tokens` per row,
        `width` columns): the runs' caches copied into slots 0..n-1, the step ready. False: the
        store cannot take it (unsupported, or in use by another thread); True: end() it."""
        if self.disabled or not plain(caches):
            return False
        if not self._lock.acquire(blocking=False):
            self.counts["busy"] += 1
            return False
        try:
            rows = bucket_of(len(caches))
            self._allocate(rows, width, caches[0])
            self.ready((kind, rows, tokens, width))
            self._load(caches)
        except BaseException:
            self._lock.release()
            raise
        return True

    def end(self) -> None:
        self._lock.release()

    # -- one step ----------------------------------------------------------------------------------

    def step(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Each run's next `tokens` at its `positions` → the logits [n, V] float32 after them (n =
        the draft's runs; the bucket's padding rows are dropped). Read them before the next step:
        a captured step's output is overwritten by the next replay."""
        rows, n = self.shape.rows, len(tokens)
        host = torch.zeros(2, rows, dtype=torch.long)  # padding rows: token 0 at position 0
        host[0, :n] = torch.tensor(list(tokens))
        host[1, :n] = torch.tensor(list(positions))
        return self.step_on(host)[:n]

    def step_on(self, inputs: torch.Tensor) -> torch.Tensor:
        """step() on a whole input buffer [2, rows] (tokens, positions; padding rows included),
        on the CPU or already on the device (a draft a step ahead: drafting.py) → the logits
        [rows, V] float32, the graph's output where it was captured."""
        self.counts["steps"] += 1
        return self.run(("draft", self.shape.rows, 1, self.shape.width), inputs, self._forward)

    def run(
        self, key: Key, host: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """The step `key` on the inputs `host` (on the CPU or the device): its graph's replay where it
        was captured (its output is overwritten by the next replay), else `forward` uncaptured. A
        draft's replays are counted here, a verification step's by what it served (slot_verify.py)."""
        graph = self.graphs.get(key)
        if graph is None:
            return forward(transfer.to_device(host, self.member.device))
        transfer.copy_into(graph.inputs, host)
        with profiling.timed("forward", self.member.name, items=key[1]):  # the hooks do not see a replay
            graph.graph.replay()
        if key[0] == "draft":
            self.counts["replays"] += 1
        return graph.output

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The step itself, fixed in shape for a bucket and width: tokens and positions [2, rows] →
        logits [rows, V] float32. Captured as is on CUDA: no host synchronisation inside."""
        member, width = self.member, self.shape.width
        tokens, positions = inputs[0][:, None], inputs[1][:, None]  # [rows, 1]
        self.shape.columns = positions  # a draft's token is written at its own position
        column = torch.arange(width, device=inputs.device)[None, :]
        allowed = column <= positions  # [rows, width]: each row's own columns up to its position
        window = member.sliding_window
        near = None if window is None else (column > positions - window)[:, None, :]
        hidden = self.read(tokens, positions, allowed[:, None, :], near)
        return cast("torch.Tensor", member.head.logits(hidden[:, -1]))

    def read(
        self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, near: torch.Tensor | None
    ) -> torch.Tensor:
        """The decoder over the slots, for a draft's step and a verification's alike: `tokens` and
        `positions` [rows, Q]; `allowed` [rows, Q, width], which columns each query sees; `near`
        (a sliding-window model's only) which of them lie within its window. Each row's new keys
        and values land in its slot (self.shape.columns says where); the final hidden states
        [rows, Q, H]. Captured as is on CUDA: no host synchronisation."""
        dtype = self.member.dtype
        full = float_mask(allowed[:, None], dtype)
        mask: torch.Tensor | dict[str, torch.Tensor] = full
        if near is not None:
            mask = {"full_attention": full, "sliding_attention": float_mask((allowed & near)[:, None], dtype)}
        base, off, merge = self.member.base, contextlib.nullcontext(), self.merge
        with attention.folded(base) if self.fold else off, fusion.fused(base, merge) if self.fuse else off:
            out = base(
                input_ids=tokens,
                position_ids=positions,
                attention_mask=mask,
                past_key_values=self.cache,
                use_cache=True,
            )
        return cast("torch.Tensor", out.last_hidden_state)

    # -- the store and its graphs --------------------------------------------------------------

    def _allocate(self, rows: int, width: int, like: DynamicCache) -> None:
        """Slots for at least `rows` runs of `width` columns, shaped like `like`'s layers; a store
        that holds fewer rows x columns is replaced (and its graphs, which read its memory)."""
        first = pieces(like.layers[0], 0)[0]  # [kv heads, n, head dim]; a tail left unjoined
        if (
            self.layers
            and self.layers[0].fits(rows, width)  # fewer rows may be wider in the same memory
            and (self.layers[0].memory[0].dtype, self.layers[0].memory[0].device)
            == (first.dtype, first.device)
        ):
            return
        rows, width = max(rows, self.rows), max(width, self.capacity)
        self.layers, self.cache, self.graphs, self.pool = [], None, {}, None  # freed before the new one
        self.stack = None
        firsts = [tuple(pieces(layer, w)[0] for w in (0, 1)) for layer in like.layers]
        shapes = {(k.shape[0], k.shape[2], v.shape[0], v.shape[2]) for k, v in firsts}
        if len(shapes) == 1:  # every layer alike: one allocation each for keys and values
            (keys, values), n = firsts[0], len(firsts)
            k = keys.new_zeros(n, rows, keys.shape[0], width, keys.shape[2])
            v = values.new_zeros(n, rows, values.shape[0], width, values.shape[2])
            self.stack = Stack(k, v)
            layers = self.stack.layers(self.shape)
        else:
            layers = [
                SlotLayer(
                    keys.new_zeros(rows, keys.shape[0], width, keys.shape[2]),
                    values.new_zeros(rows, values.shape[0], width, values.shape[2]),
                    self.shape,
                )
                for keys, values in firsts
            ]
        self.layers, self.rows, self.capacity = layers, rows, width
        self.cache = Cache(layers=list(layers))
        size = sum(t.nbytes for x in layers for t in (x.keys, x.values) if t is not None)
        log.info("%s: KV slots for %d runs of %d tokens (%.0f MB)", self.member.name, rows, width, size / 1e6)

    def _load(self, caches: Sequence[DynamicCache]) -> None:
        """Each run's committed keys and values into its slot (row r: the r-th run): `batched` (a
        GPU), one concatenation and one indexed write for every layer at once (`stacked`) or a layer
        at a time, whatever the runs (_load_batched); else a copy per run and layer (a CPU: there
        bf16's indexed write measured 3.3x slower than the copies)."""
        load = self.loads.begin()
        # A layer at a time, two runs' copies are as many launches; stacked, one run's are 56 or more.
        if self.batched and (len(caches) > 2 or (self.stack is not None and self.stacked)):
            self._load_batched(caches, load)
        else:
            for r, cache in enumerate(caches):
                for mine, theirs in zip(self.layers, cache.layers):
                    for name in ("keys", "values"):
                        kept = getattr(theirs, name)  # [1, kv heads, n, head dim]
                        getattr(mine, name)[r, :, : kept.shape[2]].copy_(kept[0])
                self.loads.seen(cache.layers, load)
        self.loads.release(load)

    def _load_batched(self, caches: Sequence[DynamicCache], load: int) -> None:
        """_load's GPU way: every run's keys (accept()'s noted winners among them, tailed.py) in one
        concatenation and one indexed write, for every layer at once where the store is a Stack (each
        run's layers one block there: tailed.run_parts) or a layer at a time; each run's layers rebased
        on that concatenation."""
        lengths = [c.get_seq_length() for c in caches]
        begins = [0, *itertools.accumulate(lengths)][:-1]
        total, n = sum(lengths), len(self.layers)
        stack = self.stack if self.stacked else None
        # Each key's layer, slot row and column, in numpy (an arange a run in torch: an operation
        # each), copied to the device at once.
        where = np.repeat(np.stack([np.arange(len(caches)), begins]), lengths, axis=1)
        where[1] = np.arange(total) - where[1]
        if stack is not None:
            where = np.concatenate([np.repeat(np.arange(n), total)[None], np.tile(where, n)])
        index = tuple(transfer.to_device(torch.from_numpy(where), self.member.device))
        if stack is not None:  # [kv heads, layers, keys, head dim] each
            joined = [torch.cat([p for c in caches for p in run_parts(c.layers, w)], dim=2) for w in (0, 1)]
            for w, whole in enumerate(stack.at_width(self.shape.width)):
                whole[index[0], index[1], :, index[2]] = joined[w].flatten(1, 2).transpose(0, 1)
            for cache, begin in zip(caches, begins):
                self.loads.rebase_all(cache, begin, (joined[0], joined[1]), load)
        else:
            for i, mine in enumerate(self.layers):
                layers = [cache.layers[i] for cache in caches]
                joined = [torch.cat([p for x in layers for p in pieces(x, w)], dim=1) for w in (0, 1)]
                for w, name in enumerate(("keys", "values")):  # [kv heads, keys, head dim] each
                    getattr(mine, name)[index[0], :, index[1]] = joined[w].transpose(0, 1)
                as_one = (joined[0][:, None], joined[1][:, None])  # [kv heads, 1 layer, keys, head dim]
                self.loads.rebase(layers, 0, begins, as_one, load)
        self.loads.track(caches)

    def ready(self, key: Key, *, run: bool = False) -> None:
        """Make the step `key` ready for the shape now set: captured on CUDA (once), and with `run`
        (start-up's warm-up) run once uncaptured where it is not captured."""
        kind, rows, _, width = key
        self.shape.rows, self.shape.width = rows, width
        for layer in self.layers:
            layer.at_width(width)
        if self.capture and not self.capture_off and key not in self.graphs:
            self._capture(key)
        if run and key not in self.graphs:
            inputs, forward = self._step_of(key)
            forward(inputs)

    def _step_of(self, key: Key) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """A step's input buffer, filled with harmless placeholders, and the step itself."""
        kind, rows, tokens, width = key
        if kind == "verify":
            assert self.verifier is not None, "a verification step on a store made without a verifier"
            return self.verifier(self, rows, tokens, width)
        inputs = torch.zeros(2, rows, dtype=torch.long, device=self.member.device)
        inputs[1].fill_(width - 1)  # beyond every draft's columns: nothing anyone sees is touched
        return inputs, self._forward

    def _capture(self, key: Key) -> None:
        """The step `key` as a CUDA graph; a failure turns capture off for the member. One capture at
        a time in the process (_CAPTURING), and none of torch.cuda.graph's device-wide
        synchronize() and empty_cache() before it: members at once, each capturing in its own thread
        (parallel="on"), broke each other's captures that way on an H200 (one thread's synchronize
        while another captured: "operation not permitted when stream is capturing")."""
        device = torch.device(self.member.device)
        began = time.perf_counter()
        try:
            with _CAPTURING:
                inputs, forward = self._step_of(key)
                current = torch.cuda.current_stream(device)
                side = torch.cuda.Stream(device)
                side.wait_stream(current)
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_STEPS):
                        forward(inputs)
                    if self.pool is None:
                        self.pool = torch.cuda.graph_pool_handle()
                    graph = torch.cuda.CUDAGraph()
                    # thread_local: another member's thread may launch work while this one captures;
                    # only this thread's calls are checked.
                    graph.capture_begin(self.pool, capture_error_mode="thread_local")
                    try:
                        output = forward(inputs)
                    finally:
                        graph.capture_end()
                current.wait_stream(side)
        except Exception as e:
            self.capture_off = f"CUDA graph capture failed: {type(e).__name__}: {e}"
            log.warning(
                "%s: drafting and verifying uncaptured on KV slots (%s)", self.member.name, self.capture_off
            )
            return
        seconds = time.perf_counter() - began
        self.graphs[key] = _Graph(graph, inputs, output)
        self.counts["captures"] += 1
        self.capture_seconds += seconds
        kind, rows, tokens, width = key
        log.info(
            "%s: captured the %s step for %d rows x %d tokens x %d columns in %.2f s",
            *(self.member.name, kind, rows, tokens, width, seconds),
        )

    # -- start-up --------------------------------------------------------------------------------

    @torch.inference_mode()  # as every draft and verification: the store's tensors are theirs
    def prepare(
        self,
        like: DynamicCache,
        progress: Callable[[float, str], None] | None = None,
        *,
        rows: Sequence[int] = BUCKETS,
        verify_tokens: Sequence[int] = STARTUP_VERIFY,
        capacity: int = STARTUP_CAPACITY,
    ) -> int:
        """Every step a first request is likely to need, made ready before anyone waits for it: a
        draft per bucket of `rows` and a verification per bucket of rows and `verify_tokens`, at
        MIN_WIDTH columns, in a store of `capacity` columns shaped like `like` (a warm-up's cache).
        Captured on CUDA; where capture is off (a CPU, or a capture that failed) each step runs
        once uncaptured, the same code. Each step is said through `progress` ("NAME: capturing
        graphs k/n"); a failed capture is said once, logged, and the rest left uncaptured and
        unrun. Returns how many steps were captured."""
        if self.disabled:  # this member drafts and verifies eagerly: nothing to make ready
            return 0
        say = progress or (lambda fraction, message: None)
        keys: list[Key] = [("draft", r, 1, MIN_WIDTH) for r in rows]
        if self.verifier is not None:
            keys += [("verify", r, q, MIN_WIDTH) for r in rows for q in verify_tokens]
        name, before = self.member.name, self.counts["captures"]
        with self._lock:
            self._allocate(max(rows), max(capacity, MIN_WIDTH), like)
            for k, key in enumerate(keys, 1):
                how = "" if self.capture else " (uncaptured: no CUDA graphs on this device)"
                say((k - 1) / len(keys), f"{name}: capturing graphs {k}/{len(keys)}{how}")
                trying = self.capture and not self.capture_off
                self.ready(key, run=not self.capture)
                if trying and self.capture_off:
                    said = f"{name}: capturing graphs failed: steps run uncaptured ({self.capture_off})"
                    say(k / len(keys), said)
                    break
        captured = self.counts["captures"] - before
        seconds = self.capture_seconds
        log.info("%s: %d of %d steps captured at start-up in %.1f s", name, captured, len(keys), seconds)
        return captured

    def time_replays(self, times: int = 3) -> None:
        """replay_ms for every step captured at MIN_WIDTH: one replay to warm, then `times` timed by
        CUDA events, while no draft holds the store (the profile cannot tell the kernels from the
        host's work). The next draft's load overwrites what they write. A failure leaves them out."""
        keys = [key for key in self.graphs if key[3] == MIN_WIDTH]
        try:
            with self._lock, torch.cuda.device(torch.device(self.member.device)):
                for key in keys:
                    graph = self.graphs[key].graph
                    graph.replay()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(times):
                        graph.replay()
                    end.record()
                    end.synchronize()
                    self.replay_ms[key] = start.elapsed_time(end) / times
        except Exception as e:  # a figure for the benchmark, never a reason to fail it
            said = f"{type(e).__name__}: {e}"
            log.warning("%s: timing the captured steps failed (%s)", self.member.name, said)


__all__ = ["BUCKETS", "SlotStore", "bucket_of", "resolved", "width_of"]
