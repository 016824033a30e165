"""How many torch operations one round launches outside the KV slots' steps, by runs (issue 52).

On a GPU each operation outside a captured step is a kernel launch the host pays for (about 11 us
of CPU time each: 1.9 ms an accept of about 170 operations in the H200 profile), and that profile
found this work growing with the runs at 32 clients. The operations are the same on any device,
only uncaptured, so they are counted here on a CPU, for members with the real layer counts of the
GPU check's shapes (bench/shapes.py: Qwen2.5-7B 28 layers, Llama-3.1-8B 32, Gemma-2-9B 42) at tiny
widths: per member and round, a draft of L = 10 tokens for every run, a verification of three
candidates a run, and an accept per run, with the loads into the slots batched (a GPU's way,
SlotStore.batched) and not. A step's own forward pass is one replay on a GPU and is not counted.

With --prefill: the kernels a prompt's read launches (start_many, in bfloat16): eagerly, the model's
own forward pass (the slots' prefill off), against on the slots (prefill.on_slots), where each step
is one replay on a GPU and counted as one.

With --step: the kernels inside one captured step instead (a replay runs every one of them, each a
graph node of a few microseconds however little it does), a draft's and a verification's, one run,
in bfloat16 as on the GPU, with the RMSNorms, the rotary embedding and the projections fused
(SlotStore.fuse, a GPU's default; members/hf/fusion.py, projections.py) and not. A fused norm
(torch.rms_norm) is counted as the one kernel CUDA runs it as; a CPU runs its parts.

    .venv/bin/python tools/slot_launches.py [--runs 1,8,32]
    .venv/bin/python tools/slot_launches.py --step
    .venv/bin/python tools/slot_launches.py --prefill [--runs 1,8,32]
    .venv/bin/python tools/slot_launches.py --host [--runs 1,8,32]

With --host: milliseconds of the host's work a round outside the steps, by phase (the steps' own time
taken out): on a GPU, Python and torch's dispatcher between replays. Timed on this CPU at tiny widths
and a vocabulary of 512, so each operation's own arithmetic, small, is in it too (the same in two
trees compared): an A/B of host work, and its order of magnitude, not a GPU figure. What the members
leave alive is frozen out of the garbage collector's full passes first, as a server does.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfuse.bench import gpu  # noqa: E402
from specfuse.bench.shapes import SHAPES  # noqa: E402
from specfuse.config import MemberSettings  # noqa: E402
from specfuse.heap import freeze_survivors  # noqa: E402
from specfuse.members.hf import fusion  # noqa: E402
from specfuse.records import Candidate  # noqa: E402

SEGMENT = 10
PREFILL_TOKENS = 290  # the GPU check's longest prompts, in its byte tokenizer


# Operations that launch no kernel on a GPU besides views: allocations, a host tensor taken in.
FREE = {"empty.memory_format", "empty_strided.default", "lift_fresh.default"}


class Ops(TorchDispatchMode):
    """Counts the torch operations that launch a kernel on a GPU (not views, not allocations), by
    phase, except inside a step (paused). Reads back to the host (.tolist(), bool()) are not seen
    on a CPU tensor, so they are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.phase, self.paused, self.counts = "", False, Counter[str]()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # `to` may return its input (then a view) or convert it (a kernel): told apart by the result.
        copied = func.__name__.startswith("to.") and out.data_ptr() != args[0].data_ptr()
        if not self.paused and (copied or not func.is_view) and func.__name__ not in FREE:
            self.counts[self.phase] += _launches(func, args)
        return out


def _launches(func: Any, args: Any) -> int:
    """A kernel's launches on CUDA: one, but a concatenation copies its inputs in batches, one launch
    each (ATen's parallel_cat: 128 contiguous inputs a launch, 64 when any is strided)."""
    if func.__name__ not in ("cat.default", "cat.out"):
        return 1
    inputs = args[0]
    batch = 128 if all(t.is_contiguous() for t in inputs) else 64
    return -(-len(inputs) // batch)


class FusedNorms(TorchFunctionMode):
    """Counts a torch.rms_norm as one kernel (CUDA's fused one), its parts on a CPU not at all."""

    def __init__(self, ops: Ops) -> None:
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is not torch.rms_norm or self.ops.paused:
            return func(*args, **(kwargs or {}))
        self.ops.counts[self.ops.phase] += 1
        self.ops.paused = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.ops.paused = False


# Reads back to the host: each waits for everything queued on the stream before it.
READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.nonzero, torch.nonzero,
         torch.Tensor.cpu, torch.Tensor.numpy}  # fmt: skip


class Syncs(TorchFunctionMode):
    """Counts, by phase, the calls that would make the host wait for a CUDA stream's queued work:
    reads back (READS, and indexing by a boolean mask, whose count is read first) and
    torch.tensor(..., device=...), a copy from pageable host memory. Copies through
    members/hf/transfer.py (pinned, queued) are not counted, nor a host tensor's .to(device),
    which a CPU cannot tell from a device tensor's (a no-op there)."""

    def __init__(self, ops: Ops) -> None:
        super().__init__()
        self.ops, self.counts = ops, Counter[str]()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        masked = func is torch.Tensor.__getitem__ and _boolean(args[1])
        copied = func is torch.tensor and kwargs.get("device") is not None
        if not self.ops.paused and (func in READS or masked or copied):
            self.counts[self.ops.phase] += 1
        return func(*args, **kwargs)


def _boolean(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def shapes() -> dict[str, Any]:
    """The real shapes' layer counts at the tiny shapes' widths."""
    real = SHAPES["real"]
    return {name: (arch, {**cfg, "num_hidden_layers": real[name][1]["num_hidden_layers"]})
            for name, (arch, cfg) in SHAPES["tiny"].items()}  # fmt: skip


def started(member: Any, runs: int) -> list[Any]:
    """`runs` requests' states on `member`, their prompts read."""
    settings = MemberSettings(max_new_tokens=200, score="logprob")
    return [member.start(f"Question {i}: what is {i} + {i}?", settings) for i in range(runs)]


def one_round(member: Any, states: Sequence[Any], mark: Callable[[str], None]) -> None:
    """One round of `member` for `states`: a draft of L tokens each, three candidates each verified,
    the first accepted; mark(phase) as each phase begins, mark("") at the end."""
    mark("draft")
    drafts = member.draft_many(states, [SEGMENT] * len(states))
    mark("verify")
    texts = [[d.text, d.text[: len(d.text) // 2] + "x", "An answer"] for d in drafts]
    member.verify_many(states, [[Candidate("m", t, 3, False, 0.0) for t in row] for row in texts])
    mark("accept")
    for state, row in zip(states, texts):
        member.accept(state, row[0])
    mark("")


def round_ops(member: Any, runs: int, ops: Ops) -> dict[str, int]:
    """One round's operations for `runs` runs of `member`, by phase, and the steps it ran: the
    second round of the runs, so that what a round leaves for the next (accept()'s tails, joined at
    the next load: tailed.py) is counted where it is paid."""
    states = started(member, runs)
    one_round(member, states, lambda phase: None)
    store = member.slots
    steps = store.counts["steps"] + store.counts["verifies"]
    ops.counts.clear()
    with ops:
        one_round(member, states, lambda phase: setattr(ops, "phase", phase))
    return {**ops.counts, "steps": store.counts["steps"] + store.counts["verifies"] - steps}


class Clock:
    """Milliseconds by phase on the host's clock, less the time inside the store's steps (`timed`
    wraps its run)."""

    def __init__(self) -> None:
        self.ms, self.phase, self.at, self.stepping, self.stepped = Counter[str](), "", 0.0, 0.0, 0.0

    def timed(self, run: Any) -> Any:
        def step(*args: Any) -> Any:
            began = time.perf_counter()
            try:
                return run(*args)
            finally:
                self.stepping += time.perf_counter() - began

        return step

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        if self.phase:
            self.ms[self.phase] += (now - self.at - (self.stepping - self.stepped)) * 1e3
        self.phase, self.at, self.stepped = phase, now, self.stepping


def host_members(names: Sequence[str] | None = None) -> list[Any]:
    """The shapes' members (`names`, default all) for timing the host's work: bfloat16 on this CPU,
    one torch thread, their KV slots the GPU's way (ahead, batched, fused)."""
    # bench/shapes.py's "layers": a vocabulary of 512, whose arithmetic on this CPU (4,096 took about half
    # of a verification's time at 32 runs) is microseconds on a GPU; the host's work is not.
    SHAPES["host-time"] = {
        name: shape for name, shape in SHAPES["layers"].items() if names is None or name in names
    }
    members = gpu.build_members("host-time", ["cpu"], "bfloat16", decode="graphs")
    torch.set_num_threads(1)
    for member in members:
        store = member.slots
        store.ahead = store.batched = store.fuse = True
    return members


def print_host(runs: Sequence[int], rounds: int = 3) -> None:
    """What the host spends a round outside the steps, by phase (a round's mean of `rounds` after
    one not timed), on one thread, in bfloat16, the GPU's way (ahead, batched, fused)."""
    members = host_members()
    freeze_survivors(lambda line: None)  # as a server does once its members are ready (specfuse/heap.py)
    print(
        f"host ms a round outside the steps (torch {torch.__version__}; bfloat16, one thread, a vocabulary "
        f"of 512; L = {SEGMENT})"
    )
    print("member          layers  runs    draft   verify   accept    total")
    for member in members:
        store = member.slots
        clock = Clock()
        store.run = clock.timed(store.run)
        for n in runs:
            states = started(member, n)
            one_round(member, states, lambda phase: None)
            clock.ms.clear()
            for _ in range(rounds):
                one_round(member, states, clock.mark)
            draft, verify, accept = (clock.ms[p] / rounds for p in ("draft", "verify", "accept"))
            figures = f"{draft:>8.1f} {verify:>8.1f} {accept:>8.1f} {draft + verify + accept:>8.1f}"
            print(f"{member.name:<15} {member.model.config.num_hidden_layers:>6} {n:>5} {figures}")


def print_syncs(runs: Sequence[int]) -> None:
    members = gpu.build_members("launch-count", ["cpu"], "float32", decode="graphs")
    print(
        f"host waits for the GPU a round causes outside the steps (torch {torch.__version__}; L = {SEGMENT})"
    )
    print("member          runs   draft  verify  accept   steps")
    for member in members:
        store = member.slots
        store.ahead = store.batched = store.fuse = True  # a GPU's way
        fusion.plan(member.base)  # as a GPU's store makes it, before any step (its probes read back)
        for n in runs:
            ops = Ops()
            syncs = Syncs(ops)
            with syncs:
                steps = round_ops(member, n, ops)["steps"]
            c = syncs.counts
            print(f"{member.name:<15} {n:>4} {c['draft']:>7} {c['verify']:>7} {c['accept']:>7} {steps:>7}")


def step_kernels(member: Any) -> dict[str, int]:
    """The kernels inside one draft step and one verification step of one run, on `member`'s slots."""
    ops = Ops()
    store, inner = member.slots, member.slots.run

    def counted(key: Any, host: Any, forward: Any) -> Any:
        ops.phase, ops.paused = key[0], False
        try:
            return inner(key, host, forward)
        finally:
            ops.phase, ops.paused = "", True

    ops.paused, store.run = True, counted
    state = member.start("Question: what is 2 + 2?", MemberSettings(max_new_tokens=200, score="logprob"))
    try:
        with ops, FusedNorms(ops):
            (draft,) = member.draft_many([state], [3])  # two steps: the first token is the prompt's
            candidates = [Candidate("m", t, 3, False, 0.0) for t in (draft.text, "An answer")]
            member.verify_many([state], [candidates])
    finally:
        store.run = inner
    steps = store.counts["steps"]
    return {"draft": ops.counts["draft"] // max(1, steps), "verify": ops.counts["verify"]}


def print_steps() -> None:
    members = gpu.build_members("launch-count", ["cpu"], "bfloat16", decode="graphs")
    print(f"kernels inside one captured step, one run (torch {torch.__version__}; bfloat16; a rms_norm: 1)")
    print("member          layers  norms   draft step        verification step")
    print("                                unfused  fused    unfused  fused")
    for member in members:
        figures = []
        fusion.plan(member.base)  # as a GPU's store makes it, before any step
        for fuse in (False, True):
            member.slots.fuse = fuse
            member.slots.counts["steps"] = 0
            figures.append(step_kernels(member))
        (off, on), layers = figures, member.model.config.num_hidden_layers
        count = sum(1 for m in member.base.modules() if type(m).__name__.endswith("RMSNorm"))
        row = f"{off['draft']:>8} {on['draft']:>6} {off['verify']:>10} {on['verify']:>6}"
        print(f"{member.name:<15} {layers:>6} {count:>6} {row}")


def steps_paused(run: Any, ops: Ops, *, counted: bool = False) -> Any:
    """A store's `run` (one step) with `ops` paused inside it; `counted`: the step counted as the one
    replay it is on a GPU."""

    def paused(*args: Any, **kwargs: Any) -> Any:
        ops.counts[ops.phase] += counted
        ops.paused = True
        try:
            return run(*args, **kwargs)
        finally:
            ops.paused = False

    return paused


def prefill_kernels(member: Any, runs: int) -> dict[str, int]:
    """The kernels `runs` prompts of PREFILL_TOKENS read together launch, eagerly and on the slots (a
    step there: one replay)."""
    ops, store = Ops(), member.slots
    inner = store.run
    prompts = [f"{i:03d}" + "x" * (PREFILL_TOKENS - 3) for i in range(runs)]
    settings = [MemberSettings(max_new_tokens=16)] * runs
    store.run = steps_paused(inner, ops, counted=True)
    try:
        with ops:
            for phase in ("eager", "slots"):
                ops.phase, store.prefill = phase, phase == "slots"
                member.start_many(prompts, settings)
    finally:
        store.run, store.prefill = inner, True
    return dict(ops.counts)


def print_prefill(runs: Sequence[int]) -> None:
    members = gpu.build_members("launch-count", ["cpu"], "bfloat16", decode="graphs")
    how = f"torch {torch.__version__}; bfloat16; {PREFILL_TOKENS} tokens a prompt"
    print(f"kernels a prompt's read launches ({how})")
    print("member          layers  prompts    eager  on the slots (a step: 1)")
    for member in members:
        member.slots.fuse = True  # a GPU's way
        fusion.plan(member.base)
        member.draft(member.start("Say hello.", MemberSettings(max_new_tokens=4)), 2)  # the slots made
        layers = member.model.config.num_hidden_layers
        for n in runs:
            c = prefill_kernels(member, n)
            print(f"{member.name:<15} {layers:>6} {n:>8} {c['eager']:>8} {c['slots']:>13}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="1,8,32", help="run counts (default 1,8,32)")
    parser.add_argument("--step", action="store_true", help="count the kernels inside one step instead")
    parser.add_argument("--syncs", action="store_true", help="count where the host waits for the GPU instead")
    parser.add_argument(
        "--prefill", action="store_true", help="count a prompt's read, eager and on the slots"
    )
    parser.add_argument("--host", action="store_true", help="time the host's work outside the steps instead")
    args = parser.parse_args(argv)
    runs = [int(r) for r in args.runs.split(",")]
    SHAPES["launch-count"] = shapes()
    if args.host:
        print_host(runs)
        return 0
    if args.step:
        print_steps()
        return 0
    if args.prefill:
        print_prefill(runs)
        return 0
    if args.syncs:
        print_syncs(runs)
        return 0
    members = gpu.build_members("launch-count", ["cpu"], "float32", decode="graphs")
    ops = Ops()
    for member in members:  # the store made at its largest once, the template's head read
        round_ops(member, max(runs), ops)
    for member in members:
        member.slots.run = steps_paused(member.slots.run, ops)
    print(
        f"kernels a round launches outside the steps (torch {torch.__version__}; L = {SEGMENT}, 3 candidates)"
    )
    print("member          layers  runs  loads     draft  verify  accept   total  per run  steps")
    for member in members:
        layers = member.model.config.num_hidden_layers
        for n in runs:
            for batched in (False, True):
                member.slots.batched = batched
                c = Counter(round_ops(member, n, ops))
                total = c["draft"] + c["verify"] + c["accept"]
                figures = f"{c['draft']:>6} {c['verify']:>7} {c['accept']:>7} {total:>7} {total / n:>8.0f}"
                how = f"{member.name:<15} {layers:>6} {n:>5}  {'batched' if batched else 'copies':<8}"
                print(f"{how}{figures} {c['steps']:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
