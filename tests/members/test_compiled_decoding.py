"""Compiled decoding (members/hf/compiled.py): drafts in a static KV cache with a torch.compile'd step
give exactly the eager drafts' answers in fp32 greedy, on three architectures (gemma3 with its
sliding-window layers), after another member's segment is accepted, with a budget that ends
mid-segment, a trimmed draft's tail taken over, a static cache sized for a whole request, and
batches (which draft eagerly). A lone request's verification pass runs compiled too: the same
scores (to 1e-4), and the keys and values it leaves let accept() and the next draft go on exactly
as after an eager pass.

Most tests compile with the "aot_eager" backend: dynamo captures the whole step, static cache
included, and AOTAutograd functionalizes its in-place updates, without inductor's code generation
(half a minute on this CPU). One test runs the CPU default, inductor, for real, on the CPU's own
kernels and on AVX2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specfuse.config import EnsembleConfig, MemberSettings
from specfuse.engine import Ensemble
from specfuse.members.cpu import cpu_flags
from specfuse.members.hf.compiled import MIN_CAPACITY, VERIFY_BLOCKS, CompiledDecoder
from specfuse.records import Candidate

from ..conftest import TINY_SPECS, ascii_only, tiny_member
from ..runs import PROMPTS, same_rounds

FAST = "aot_eager"
NAMES = list(TINY_SPECS)  # llama-bytes, qwen-merges, gemma-meta
GREEDY = MemberSettings(max_new_tokens=200)


def compiled_member(name: str, backend=FAST):
    member = tiny_member(name)
    member.compiled = CompiledDecoder(member, backend=backend)
    return member


@pytest.fixture(scope="module")
def eager_members():
    return [tiny_member(name) for name in NAMES]


@pytest.fixture(scope="module")
def compiled_members():
    return [compiled_member(name) for name in NAMES]


def drafts_of(member, prompt: str, plan) -> list[tuple[str, int, bool]]:
    """Draft, accept and draft again as `plan` says: [(budget, text to accept or None for the
    draft's own)]; the candidates' (text, tokens, reused)."""
    state = member.start(prompt, GREEDY)
    out = []
    for budget, accept in plan:
        cand = member.draft(state, budget)
        out.append((cand.text, cand.num_tokens, cand.reused_tokens))
        member.accept(state, cand.text if accept is None else accept)
    return out


def test_an_ensemble_plays_the_same_rounds_with_compiled_drafts(eager_members, compiled_members):
    # 27 tokens in segments of 6: the budget ends in the middle of the last segment.
    config = EnsembleConfig(segment_len=6, max_new_tokens=27, exit=False)
    prompt = "Why is the sky blue? Explain it to a child."
    eager = list(Ensemble(eager_members, config).stream(prompt))
    passes = [m.compiled.verified for m in compiled_members]
    compiled = list(Ensemble(compiled_members, config).stream(prompt))
    same_rounds(eager, compiled)  # texts exactly; scores to 1e-4 (threads)
    for member, before in zip(compiled_members, passes):  # every verification pass ran compiled too
        assert member.compiled.verified - before == sum(member.name in r.verifiers for r in compiled) > 0
    winners = [r.candidates[r.chosen].member for r in eager]
    print("winners:", winners, "| answer:", repr(eager[-1].text))
    assert len(set(winners[:-1])) >= 2  # members accepted one another's segments, and drafted on
    assert eager[-1].stop_reason == "budget"
    for member in compiled_members:
        assert member.compiled.counts["static"] >= len(eager) - 1
        assert member.compiled.counts["eager"] == 0 and member.compiled.disabled is None


@pytest.mark.parametrize("name", NAMES)
def test_drafts_after_another_text_and_mid_word_budgets(name, eager_members, compiled_members):
    eager, compiled = eager_members[NAMES.index(name)], compiled_members[NAMES.index(name)]
    plan = [
        (7, None),
        (9, None),
        (5, " the other member's words, "),  # another member's segment
        (3, None),
        (11, "x"),  # a budget ending mid-word, then a text that ends mid-word
        (6, None),
    ]
    prompt = "Tell me about the lighthouse by the sea."
    want = drafts_of(eager, prompt, plan)
    assert drafts_of(compiled, prompt, plan) == want


def test_a_trimmed_tail_taken_over_then_decoding_on_in_the_static_cache():
    """Printable ASCII only (conftest.ascii_only), so that drafts have words to trim and their
    text re-tokenizes exactly: a won draft's trimmed tokens are taken over, by one eager forward into
    the request's cache (as on a CPU) or as compiled steps (as under CUDA graphs), and the draft then
    decodes on in the static cache. Both give eager drafting's rounds."""

    def run(backend, in_steps=False):
        members = [ascii_only(tiny_member(name)) for name in NAMES[:2]]
        forwards = []
        for member in members:
            member.compiled = CompiledDecoder(member, backend=backend) if backend else None
            if member.compiled:
                member.compiled.take_over_in_steps = in_steps
            eager = member.hidden_states
            member.hidden_states = lambda ids, cache, f=eager: forwards.append(len(ids)) or f(ids, cache)
        config = EnsembleConfig(segment_len=6, max_new_tokens=40)
        return list(Ensemble(members, config).stream("Once upon a time there was")), members, forwards

    (eager, _, _), (compiled, members, forwards), (stepped, stepping, forwards_stepped) = (
        run(None),
        run(FAST),
        run(FAST, in_steps=True),
    )
    same_rounds(eager, compiled)
    same_rounds(eager, stepped)
    takeovers = sum(c.reused_tokens > 0 for r in compiled for c in r.candidates)
    assert takeovers > 0
    # The same calls, less one eager forward per take-over: those tokens went through compiled steps.
    assert len(forwards) - len(forwards_stepped) == takeovers
    for m, before in zip(stepping, members):
        assert m.compiled.counts == before.compiled.counts and m.compiled.counts["static"] > 0


def test_a_request_sizes_the_static_cache_for_its_whole_answer_and_a_longer_one_grows_it(eager_members):
    # Each new size is a compilation (tens of seconds for a 7B model on a GPU): a request must not
    # grow the cache in the middle of its answer.
    eager, compiled = eager_members[0], compiled_member(NAMES[0])
    short, long = "Why is the sky blue?", "the sea and the sky " * 14
    whole = {p: len(eager.prompt_ids(p)) + GREEDY.max_new_tokens + VERIFY_BLOCKS[0] for p in (short, long)}
    assert len(eager.prompt_ids(short)) + 8 + 5 < MIN_CAPACITY < whole[short] <= 2 * MIN_CAPACITY
    assert 2 * MIN_CAPACITY < whole[long] <= 4 * MIN_CAPACITY
    state = compiled.start(short, GREEDY)
    compiled.draft(state, 8)  # 8 tokens would fit in the smallest cache; the whole answer would not
    assert compiled.compiled.capacity == 2 * MIN_CAPACITY
    plan = [(8, None), (8, " and then"), (8, None)]
    assert drafts_of(compiled, long, plan) == drafts_of(eager, long, plan)
    assert compiled.compiled.capacity == 4 * MIN_CAPACITY


def test_batches_draft_eagerly_and_match(eager_members, compiled_members):
    config = EnsembleConfig(segment_len=5, max_new_tokens=16, exit=False)
    runs = {}
    for key, members in (("eager", eager_members), ("compiled", compiled_members)):
        before = [m.compiled.counts.copy() if m.compiled else {} for m in members]
        rounds: list[list] = [[] for _ in PROMPTS]
        for i, rnd in Ensemble(members, config).stream_many(PROMPTS):
            rounds[i].append(rnd)
        runs[key] = rounds
        if key == "compiled":
            for m, was in zip(members, before):
                assert m.compiled.counts["batched"] > was["batched"]
    for a, b in zip(runs["eager"], runs["compiled"]):
        same_rounds(a, b)


def test_a_busy_static_cache_leaves_the_draft_eager(eager_members, compiled_members):
    eager, compiled = eager_members[2], compiled_members[2]
    decoder = compiled.compiled
    prompt = "Once upon a time"
    want = eager.draft(eager.start(prompt, GREEDY), 10)
    state = compiled.start(prompt, GREEDY)
    before = decoder.counts.copy()
    with decoder._lock:  # another thread's draft holds it
        got = compiled.draft(state, 10)
    assert (got.text, got.num_tokens) == (want.text, want.num_tokens)
    assert decoder.counts["eager"] == before["eager"] + 1
    assert decoder.counts["static"] == before["static"]
    assert compiled.draft(state, 10).text == want.text  # released: static again
    assert decoder.counts["static"] == before["static"] + 1
    assert state.cache.get_seq_length() == len(state.ids)  # the draft left the request's cache as it was


CANDIDATES = (" blue sea and sky", " the light", " scattering, 大海。")


def scored(member, candidates=CANDIDATES):
    """A verification pass over `candidates` after a short answer, then the first one accepted and a
    draft after it: (scores, the draft's text, the cache's length against the request's tokens)."""
    state = member.start("Why is the sky blue? Explain it to a child.", GREEDY)
    member.accept(state, " Because")
    cands = [Candidate("x", text, 3, False, 0.0) for text in candidates]
    scores = member.score(state, cands)
    member.accept(state, candidates[0])  # its keys and values moved into place from the pass
    draft = member.draft(state, 8)
    return scores, draft.text, (state.cache.get_seq_length(), len(state.ids))


@pytest.mark.parametrize("name", NAMES)
def test_a_lone_verification_pass_runs_compiled_and_scores_as_eager(name, eager_members, compiled_members):
    eager, compiled = eager_members[NAMES.index(name)], compiled_members[NAMES.index(name)]
    before = compiled.compiled.verified
    want_scores, want_draft, _ = scored(eager)
    got_scores, got_draft, (cached, ids) = scored(compiled)
    assert got_scores == pytest.approx(want_scores, abs=1e-4)
    assert got_draft == want_draft and cached == ids
    assert compiled.compiled.verified == before + 1 and compiled.compiled.disabled is None


def test_a_long_pass_or_a_busy_cache_verifies_eagerly(eager_members, compiled_members):
    eager, compiled = eager_members[0], compiled_members[0]
    decoder, before = compiled.compiled, compiled.compiled.verified
    long = (" word" * 60, " the light")  # 300 bytes: past MAX_VERIFY_TOKENS packed tokens
    assert scored(compiled, long)[0] == pytest.approx(scored(eager, long)[0], abs=1e-4)
    with decoder._lock:  # another thread's draft holds the static cache
        assert scored(compiled)[0] == pytest.approx(scored(eager)[0], abs=1e-4)
    assert decoder.verified == before and decoder.disabled is None


def test_a_verification_that_fails_goes_on_eagerly_and_drafts_stay_compiled(eager_members, caplog):
    member = tiny_member(NAMES[1])
    member.compiled = decoder = CompiledDecoder(member, backend=FAST)

    def fails(*args):
        raise RuntimeError("recompilation failed")

    decoder._compiled_verify = fails
    with caplog.at_level("WARNING"):
        got = scored(member)
    want = scored(eager_members[1])
    assert got[0] == pytest.approx(want[0], abs=1e-4) and got[1:] == want[1:]
    assert decoder.verify_off and "recompilation failed" in decoder.verify_off and decoder.verified == 0
    assert decoder.disabled is None and decoder.counts["static"] == 1  # the draft stayed compiled
    assert "compiled verification is off" in caplog.text


def broken_backend(graph, example_inputs):
    raise RuntimeError("this backend cannot compile anything")


def test_a_compilation_that_fails_turns_compiled_decoding_off(caplog):
    member = compiled_member("llama-bytes", backend=broken_backend)
    want = drafts_of(tiny_member("llama-bytes"), "Once upon a time", [(6, None), (6, None)])
    with caplog.at_level("WARNING"):
        assert drafts_of(member, "Once upon a time", [(6, None), (6, None)]) == want
    assert member.compiled.disabled and "decoding eagerly" in caplog.text
    assert member.compiled.counts == {"static": 0, "eager": 2, "batched": 0}


def test_a_step_that_fails_mid_draft_goes_on_eagerly(eager_members):
    """A recompilation can fail in the middle of a draft (on a CPU, a new thread count is one): the
    tokens decoded in the static cache so far are fed to the request's own cache, and it goes on."""
    eager = eager_members[1]
    member = tiny_member(NAMES[1])
    member.compiled = decoder = CompiledDecoder(member, backend=FAST)
    compiled, calls = decoder._compiled, []

    def third_fails(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("recompilation failed")
        return compiled(*args)

    decoder._compiled = third_fails
    plan = [(8, None), (8, None)]
    prompt = "Why is the sky blue?"
    assert drafts_of(member, prompt, plan) == drafts_of(eager, prompt, plan)
    assert len(calls) == 3 and decoder.disabled and "recompilation failed" in decoder.disabled
    assert decoder.counts == {"static": 0, "eager": 2, "batched": 0}


# torch held to its AVX2 kernels, as the AVX2 benchmarks run it on a CPU with AVX-512 (docs/serve.md).
AVX2_DRAFTS = """
import json
from concurrent.futures import ThreadPoolExecutor
from tests.conftest import tiny_member
from specfuse.config import MemberSettings

def drafts(member):  # its own draft accepted, then another member's segment, then its own again
    state = member.start("Tell me about the lighthouse by the sea.", MemberSettings(max_new_tokens=200))
    out = []
    for accepted in (None, " and the sea", None):
        cand = member.draft(state, 6)
        out.append(cand.text)
        member.accept(state, accepted or cand.text)
    return out

compiled = tiny_member("gemma-meta", compile_decode=True)
with ThreadPoolExecutor(1) as pool:  # in a thread of its own, as a member drafts in a batch
    drafted = pool.submit(drafts, compiled).result()
decoder = compiled.compiled
print(json.dumps([drafts(tiny_member("gemma-meta")), drafted, decoder.counts, decoder.backend, decoder.mode]))
"""


@pytest.mark.slow
def test_inductor_s_drafts_equal_the_eager_ones_on_this_cpu_s_kernels_and_on_avx2(tmp_path):
    # The CPU default, inductor without CUDA graphs, for real: on the CPU's own kernels, then (on a CPU
    # with AVX-512, where torch can be held to other kernels than its own) held to AVX2, then on its
    # own again. On an AVX2-only CPU the last two would repeat the first exactly (33 s).
    # Inductor's graph cache did not key on the kernels torch is held to: after a compilation on this
    # CPU's own kernels the AVX2 run was served that graph and drafted NaNs, and the other way round
    # the heap broke (cpu.held_to_avx2). One cache for all three runs, as a developer's machine has.
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CPP_MARCH", "ATEN_CPU_CAPABILITY")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)
    root = Path(__file__).resolve().parents[2]
    runs = []
    for capability in (None, "avx2", None) if "avx512f" in cpu_flags() else (None,):
        run_env = env | ({"ATEN_CPU_CAPABILITY": capability} if capability else {})
        done = subprocess.run(
            [sys.executable, "-c", AVX2_DRAFTS],
            cwd=root,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for eager, compiled, counts, backend, mode in runs:
        assert compiled == eager and len(eager) == 3 and counts == {"static": 3, "eager": 0, "batched": 0}
        assert backend == "inductor" and mode is None
    assert all(run[0] == runs[0][0] for run in runs)  # fp32 on both kernels: the same tokens


def test_loading_and_the_gpu_benchmark_turn_it_on(tiny_checkpoints, capsys):
    from specfuse.bench import gpu as bench_gpu
    from specfuse.models.loading import load_member
    from specfuse.models.placement import load_members

    assert load_member(tiny_checkpoints[0], dtype="float32").compiled is None
    one = load_member(tiny_checkpoints[0], dtype="float32", compile_decode=True)
    assert isinstance(one.compiled, CompiledDecoder)
    first, second = load_members([tiny_checkpoints[0]] * 2, dtype="float32", compile_decode=True)
    assert first.compiled is not None and second.compiled is not None  # a shared model too
    assert all(m.compiled is not None for m in bench_gpu.build_members("tiny", ["cpu"], "float32", True))
    assert bench_gpu.build_one("tiny", 0, "cpu", "float32").compiled is None
    with pytest.raises(SystemExit):
        bench_gpu.main(["--help"])
    assert "--compile" in capsys.readouterr().out
