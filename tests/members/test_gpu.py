"""CUDA paths: skipped here (no GPU on the project's machines); run them where torch sees a GPU."""

from __future__ import annotations

import functools

import pytest
import torch

from specfuse import EnsembleConfig
from specfuse.config import MemberSettings
from specfuse.engine import Ensemble
from specfuse.members.hf import HFMember
from specfuse.members.process import ProcessMember
from specfuse.members.workers import run_concurrently
from specfuse.records import Candidate

from ..conftest import TINY_SPECS, tiny_member

pytestmark = pytest.mark.gpu


def on(device: str, name: str, compile_decode: bool = False) -> HFMember:
    cpu = tiny_member(name)
    return HFMember(name, cpu.model.to(device), cpu.tokenizer, device=device, compile_decode=compile_decode)


@pytest.mark.parametrize("spec", list(TINY_SPECS))
def test_packed_scores_on_the_gpu_equal_the_cpus(spec):
    cands = [Candidate("x", t, 1, f, 0.0) for t, f in [(" blue sea", False), (" 大海。", True)]]
    scores = []
    for device in ("cpu", "cuda"):
        member = on(device, spec)
        state = member.start("Describe the sea.", MemberSettings())
        member.accept(state, "The sea is")
        scores.append(member.score(state, cands))
    assert scores[1] == pytest.approx(scores[0], abs=1e-3)


def test_one_member_per_gpu_drafts_concurrently_and_matches_sequential():
    devices = [f"cuda:{i % torch.cuda.device_count()}" for i in range(3)]
    members = [on(d, name) for d, name in zip(devices, TINY_SPECS)]
    seq = Ensemble(members, EnsembleConfig(max_new_tokens=24), parallel="off").run("Hi")
    par = Ensemble(members, EnsembleConfig(max_new_tokens=24), parallel="on").run("Hi")
    assert seq.answer == par.answer


def test_sampling_on_the_gpu_is_reproducible():
    member = on("cuda", "gemma-meta")
    config = EnsembleConfig(temperature=1.0, top_p=0.9, seed=5, max_new_tokens=16)
    assert Ensemble([member], config).run("Sing").answer == Ensemble([member], config).run("Sing").answer


def test_members_on_one_gpu_on_their_own_streams_match_members_in_turn():
    members = [on("cuda:0", name) for name in TINY_SPECS]
    config = EnsembleConfig(max_new_tokens=24, segment_len=4)
    assert not run_concurrently(members, "auto")  # one GPU: streams only when asked
    turns = Ensemble(members, config, parallel="off").run("Hi")
    streams = Ensemble(members, config, parallel="on").run("Hi")
    assert turns.answer == streams.answer and turns.wins == streams.wins


# -- compiled decoding (members/hf/compiled.py): CUDA graphs, mode "reduce-overhead", inductor ------------


@pytest.fixture(scope="module")
def eager_and_compiled():
    """The three tiny members on the GPU in fp32, eager, and the same models drafting compiled."""
    eager = [on("cuda:0", name) for name in TINY_SPECS]
    compiled = [HFMember(m.name, m.model, m.tokenizer, device="cuda:0", compile_decode=True) for m in eager]
    return eager, compiled


def test_compiled_drafts_with_cuda_graphs_play_the_same_rounds_as_eager_drafts(eager_and_compiled):
    from torch._dynamo.utils import counters

    eager, compiled = eager_and_compiled
    config = EnsembleConfig(segment_len=6, max_new_tokens=27, exit=False)
    prompt = "Why is the sky blue? Explain it to a child."
    turns = list(Ensemble(eager, config, parallel="off").stream(prompt))
    graphs = list(Ensemble(compiled, config, parallel="off").stream(prompt))
    assert [r.text for r in graphs] == [r.text for r in turns]
    assert [r.winner.member for r in graphs] == [r.winner.member for r in turns]
    assert len({r.winner.member for r in turns}) >= 2  # members went on from one another's segments
    for member in compiled:
        decoder = member.compiled
        assert decoder.cudagraphs and decoder.disabled is None, decoder.disabled
        assert decoder.counts["static"] >= len(turns) - 1 and decoder.counts["eager"] == 0
        assert decoder.verified > 0 and decoder.verify_off is None  # verification passes compiled too
    assert counters["inductor"].get("cudagraph_skips", 0) == 0  # every step replayed a CUDA graph


def test_compiled_members_at_once_on_their_own_streams_draft_eagerly_and_match_in_turn(eager_and_compiled):
    # CUDA graphs replayed from threads on the members' own streams failed on an H100 (an index
    # assertion in an inductor kernel): there the drafts decode eagerly, and the answer stays the same.
    _, compiled = eager_and_compiled
    config = EnsembleConfig(segment_len=6, max_new_tokens=27, exit=False)
    turns = Ensemble(compiled, config, parallel="off").run("Hi")
    before = [dict(m.compiled.counts) for m in compiled]
    streams = Ensemble(compiled, config, parallel="on").run("Hi")
    assert streams.answer == turns.answer and streams.wins == turns.wins
    for member, counts in zip(compiled, before):
        assert member.compiled.counts["static"] == counts["static"]
        assert member.compiled.counts["eager"] > counts["eager"]
        assert member.compiled.disabled is None


def test_compiled_drafts_in_worker_processes_on_one_gpu_match_eager_drafts_here(eager_and_compiled):
    # Several members on one GPU load in worker processes by default (CLI, app): there each drafts
    # compiled, with its CUDA graphs, at once with the others.
    eager, _ = eager_and_compiled
    config = EnsembleConfig(segment_len=6, max_new_tokens=27, exit=False)
    prompt = "Why is the sky blue? Explain it to a child."
    workers = [ProcessMember(functools.partial(on, "cuda:0", name, True)) for name in TINY_SPECS]
    try:
        assert run_concurrently(workers, "auto")
        there = Ensemble(workers, config).run(prompt)
        here = Ensemble(eager, config, parallel="off").run(prompt)
        assert there.answer == here.answer and there.wins == here.wins
    finally:
        for worker in workers:
            worker.close()
