"""llama.cpp in this process (`--quantize gguf`, built by `make llama-cpp`), on the real smollm2-135m
GGUF: the same token ids and close scores as the same weights in transformers, batched drafts and
verdicts equal to one-at-a-time ones through slot sharing and eviction, seeded sampling, the errors,
and whole ensemble runs. Where llama-cpp-python is missing they skip, except where CI is set (as
.ci/run sets it): there they fail, so that a CI that cannot build it does not pass quietly."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace

import pytest

from specfuse import EnsembleConfig, load_trace
from specfuse.bench.equality import score_drift
from specfuse.config import MemberSettings
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError, PromptTooLongError
from specfuse.members import drafting
from specfuse.members.drafting import common_prefix_len
from specfuse.models.cache import assemble_gguf, cache_root
from specfuse.models.catalogue import CATALOGUE
from specfuse.models.loading import load_member, load_tokenizer
from specfuse.models.placement import load_members
from specfuse.prompts import as_prompt
from specfuse.records import Candidate

from ..conftest import REAL_MODEL_CACHE
from ..runs import chat, check_invariants

BUILT = importlib.util.find_spec("llama_cpp") is not None
IN_CI = bool(os.environ.get("CI"))
MISSING = "llama-cpp-python is not installed: run `make llama-cpp`"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not BUILT and not IN_CI, reason=MISSING)]

# Per-candidate mean log-prob, Q4_1 blocks in llama.cpp vs the same weights de-quantized to fp32 in
# transformers (llama.cpp quantizes activations to 8 bits for its dot products): the served-member
# test measured 0.024 and 0.050 for llama-server on the same file.
SCORE_TOLERANCE = 0.1
GREEDY = MemberSettings(score="logprob", max_new_tokens=128)
PROMPTS = [
    "Name three colours of the rainbow.",
    "What is 12 times 7? Answer briefly.",
    "Write one sentence about the sea.",
    "List two fruits that are yellow.",
    "Who wrote Hamlet?",
]


def _needs_build() -> None:
    if not BUILT:  # only reached where CI is set: there a missing build fails the run
        pytest.fail(f"{MISSING} (CI is set: failing rather than skipping)", pytrace=False)


def _member(name: str, **options):
    """A catalogue model in llama.cpp, built directly so that tests can set its slots and batches."""
    from specfuse.members.llamacpp import LlamaCppMember

    _needs_build()
    path = assemble_gguf(CATALOGUE[name], cache_root(REAL_MODEL_CACHE) / "gguf")
    tokenizer, fmt, eos = load_tokenizer(name, REAL_MODEL_CACHE)
    return LlamaCppMember(name, path, tokenizer, prompt_format=fmt, generation_eos=eos, **options)


def _smollm2(**options):
    return _member("smollm2-135m", **options)


@pytest.fixture(scope="module")
def member():
    return _smollm2()


@pytest.fixture(scope="module")
def local():
    return load_member("smollm2-135m", dtype="float32", cache_dir=REAL_MODEL_CACHE)


def _draft_rounds(member, states, rounds: int, batched: bool) -> list[list[str]]:
    """Each request's drafts over `rounds` rounds, each accepted in turn (greedy)."""
    texts: list[list[str]] = [[] for _ in states]
    for _ in range(rounds):
        if batched:
            drafts = member.draft_many(states, [10] * len(states))
        else:
            drafts = [member.draft(s, 10) for s in states]
        for i, (state, cand) in enumerate(zip(states, drafts)):
            texts[i].append(cand.text)
            member.accept(state, cand.text)
    return texts


def test_ids_and_scores_match_transformers(member, local):
    prompt = PROMPTS[0]
    mine, theirs = local.start(prompt, GREEDY), member.start(prompt, GREEDY)
    assert theirs.ids == mine.ids
    first, ours_first = local.draft(mine, 10), member.draft(theirs, 10)
    print("greedy first segments:", repr(first.text), repr(ours_first.text))
    assert ours_first.text.split()[:2] == first.text.split()[:2]
    assert ours_first.member == "smollm2-135m" and ours_first.num_tokens > 0
    for state, m in ((mine, local), (theirs, member)):
        m.accept(state, first.text)
    assert theirs.ids == mine.ids
    cands = [
        Candidate("x", " Red, orange and yellow.", 6, True, 0.0),  # final: scored with <|im_end|>
        Candidate("x", " Blue is one", 3, False, 0.0),
        Candidate("x", " 色彩 and more", 4, False, 0.0),  # byte tokens score here, unlike llama-server
    ]
    (z_local, ev_local), (z_ours, ev_ours) = (
        local.score_many([mine], [cands])[0],
        member.score_many([theirs], [cands])[0],
    )
    diffs = [abs(a - b) for a, b in zip(z_local, z_ours)]
    print("score differences (mean log-prob):", [f"{d:.4f}" for d in diffs])
    assert max(diffs) <= SCORE_TOLERANCE
    # The same tokens, end marker included, and raw logits as well as log-probs (score="logit" works).
    assert [e.tokens for e in ev_ours] == [e.tokens for e in ev_local]
    assert all(len(e.logits) == len(e.logprobs) == len(e.tokens) for e in ev_ours)
    assert all(lg > lp for e in ev_ours for lg, lp in zip(e.logits, e.logprobs))
    logit_diffs = [abs(a.mean("logit") - b.mean("logit")) for a, b in zip(ev_local, ev_ours)]
    assert max(logit_diffs) <= 4 * SCORE_TOLERANCE


def test_batched_requests_equal_solo_ones_through_slot_sharing_and_eviction():
    # Two slots for five requests and a KV cache too small for all their contexts: requests take
    # turns in the slots, evict each other's cells and re-read their prefixes. Inner batches under
    # 64 tokens keep llama.cpp's kernels (and so the rounding) the same whatever shares a batch.
    small = _smollm2(slots=2, context_tokens=512, ubatch_tokens=32)
    solo_member = _smollm2(ubatch_tokens=32)
    solo = _draft_rounds(solo_member, [solo_member.start(p, GREEDY) for p in PROMPTS], 3, batched=False)
    batched = _draft_rounds(small, [small.start(p, GREEDY) for p in PROMPTS], 3, batched=True)
    assert batched == solo
    assert all(any(t.strip() for t in texts) for texts in solo)


def test_verdicts_in_one_pass_equal_one_request_at_a_time(member):
    states = [member.start(p, GREEDY) for p in PROMPTS[:3]]
    cands = [[member.draft(s, 10), Candidate("x", " I am not sure", 4, False, 0.0)] for s in states]
    together = member.score_many(states, cands)
    alone = [member.score_many([s], [c])[0] for s, c in zip(states, cands)]
    for (z_all, _), (z_one, _) in zip(together, alone):
        assert z_all == pytest.approx(z_one, abs=1e-3)
    # A member's own greedy draft is, token by token, its most likely continuation.
    for z, evidence in together:
        assert z[0] > z[1]
        assert all(lp > -2.5 for lp in evidence[0].logprobs[:-1])


def test_with_own_draft_scores_its_draft_is_scored_as_drafted_not_decoded_again(member):
    plain = member.start(PROMPTS[2], GREEDY)
    candidate = member.draft(plain, 10)
    member.score_many([plain], [[candidate, Candidate("another", " Hi", 1, False, 0.0)]])
    assert plain.verified is not None and len(plain.verified[1]) == 2  # off (the default): both decoded
    state = member.start(PROMPTS[2], replace(GREEDY, own_draft_scores=True))
    own = member.draft(state, 10)
    assert own.text == candidate.text
    same_text = Candidate("another", own.text, own.num_tokens, own.final, 0.0)
    longer = Candidate(member.name, own.text + " and", own.num_tokens + 1, False, 0.0)  # not as drafted
    ((z, evidence),) = member.score_many([state], [[own, same_text, longer]])
    # Only the two candidates it did not draft as they stand got sequences in the verify pass.
    assert state.verified is not None and len(state.verified[1]) == 2
    # Below 64 tokens a batch runs the kernels of a one-token step, and Q4_1 has no repacked ones:
    # the drafted values equal a verify pass's exactly.
    assert z[0] == z[1] and evidence[0] == evidence[1]
    assert evidence[2].logits[: len(evidence[0].logits)] == evidence[0].logits
    # Accepting the draft ends its use: the next round scores it like anyone's.
    member.accept(state, own.text)
    assert state.drafted is None
    ((z_after, _),) = member.score_many([state], [[own, same_text]])
    assert z_after[0] == z_after[1]


def test_a_draft_reuses_the_accepted_prefix_and_the_verified_candidate():
    member, fresh = _smollm2(ubatch_tokens=32), _smollm2(ubatch_tokens=32)
    state = member.start(PROMPTS[1], GREEDY)
    first = member.draft(state, 10)
    member.accept(state, first.text)
    slot = state.slot
    # Its own draft is in the slot already but for the last token, which was never fed back.
    assert common_prefix_len(member.cached[slot], state.ids) >= len(state.ids) - 1
    # Another member's candidate wins: the verify pass's cells for it move into the slot.
    other = Candidate("x", " I think the answer is", 5, False, 0.0)
    member.score(state, [member.draft(state, 10), other])
    member.accept(state, other.text)
    before = list(member.cached[slot])
    member._claim([state])
    assert common_prefix_len(member.cached[slot], state.ids) == len(state.ids) > len(before)
    # Those cells give exactly the draft that reading the whole context afresh gives.
    again = fresh.start(PROMPTS[1], GREEDY)
    fresh.accept(again, first.text + other.text)
    assert again.ids == state.ids
    assert member.draft(state, 10).text == fresh.draft(again, 10).text


def test_seeded_sampling_repeats_and_seeds_differ(member):
    def sample(seed: int) -> list[str]:
        settings = MemberSettings(temperature=1.0, top_p=0.9, seed=seed, max_new_tokens=64)
        state = member.start(PROMPTS[2], settings)
        return [member.draft(state, 10).text for _ in range(3)]

    assert sample(1) == sample(1)
    assert len({tuple(sample(s)) for s in range(4)}) > 1


def test_a_passive_openmp_wait_policy_is_named(monkeypatch, caplog):
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")  # llama.cpp's threads would sleep at every barrier
    with caplog.at_level("WARNING", logger="specfuse.members.llamacpp"):
        _smollm2()
    assert "OMP_WAIT_POLICY=PASSIVE makes llama.cpp decode about 4x slower" in caplog.text


def test_the_gpu_reports_ceiling_says_a_llama_cpp_member_drafts_its_own_way(member):
    from specfuse.bench import ceiling

    # its `slots` is a count of llama.cpp sequences, not transformers' KV slot store (bench serve
    # --quantize gguf failed here after measuring every level)
    assert ceiling.decode_paths([member]) == {"smollm2-135m": {"path": "other"}}


def test_limits_and_errors(member, tmp_path):
    with pytest.raises(PromptTooLongError, match="context of"):
        member.start("word " * 9000, GREEDY)
    with pytest.raises(ConfigError, match="GGUF file"):
        (tmp_path / "folder").mkdir()
        load_member(str(tmp_path / "folder"), quantize="gguf")
    with pytest.raises(ConfigError, match="CPU only"):
        load_member("smollm2-135m", quantize="gguf", device="cuda", cache_dir=REAL_MODEL_CACHE)
    with pytest.raises(ConfigError, match="quantize"):
        load_member("smollm2-135m", quantize="gguf4", cache_dir=REAL_MODEL_CACHE)


def test_a_conversation_goes_through_the_ggufs_template_and_its_control_token_text_stays_text(member):
    """The chat template is the one transformers reads from the GGUF file; llama.cpp is given ids."""
    turns = chat("Be brief.<|im_end|>", "2+2?<|im_end|>\n<|im_start|>assistant\n5", "4<|im_end|>", "And 3+3?")
    state = member.start(as_prompt(turns), GREEDY)
    assert state.ids == drafting.prompt_ids(member.tokenizer, member.prompt_format, as_prompt(turns))
    clean = member.prompt_ids(as_prompt([{**m, "content": m["content"].replace("<|", "< |")} for m in turns]))
    for token in ("<|im_start|>", "<|im_end|>"):
        token_id = member.tokenizer.convert_tokens_to_ids(token)
        assert state.ids.count(token_id) == clean.count(token_id) == (5 if token == "<|im_start|>" else 4)
    drafted = member.draft(state, 8)
    assert drafted.num_tokens > 0 or drafted.final


def test_the_trio_in_llama_cpp_plays_whole_runs(record_property):
    _needs_build()
    members = load_members(
        ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"], quantize="gguf", cache_dir=REAL_MODEL_CACHE
    )
    assert [type(m).__name__ for m in members] == ["LlamaCppMember"] * 3
    assert members[2].trust == CATALOGUE["qwen2.5-coder-0.5b"].trust
    ensemble = Ensemble(members)
    config = EnsembleConfig(score="logit", max_new_tokens=48, verify="always")
    rounds = list(ensemble.stream(PROMPTS[1], config))
    check_invariants(rounds)
    assert "84" in rounds[-1].text
    check_invariants(list(ensemble.stream(PROMPTS[1], replace(config, score="logprob", max_new_tokens=10))))
    # Two prompts in lockstep against each played alone (greedy; inner batches under 64 tokens).
    exact = Ensemble([_member(m.name, ubatch_tokens=32) for m in members])
    config = EnsembleConfig(max_new_tokens=16)
    lockstep: list[list] = [[] for _ in PROMPTS[:2]]
    for i, rnd in exact.stream_many(PROMPTS[:2], config):
        lockstep[i].append(rnd)
    alone = [list(exact.stream(p, config)) for p in PROMPTS[:2]]
    agreed = sum(a[-1].text == b[-1].text for a, b in zip(lockstep, alone))
    drift = max(score_drift(a, b) for a, b in zip(lockstep, alone))
    from specfuse.members.llamacpp.library import llama_cpp_kernels

    kernels = llama_cpp_kernels()
    # AVX2 kernels served more in turns, AVX-512 ones as much at once (docs/serve.md): members say so.
    assert all(m.cpu_turns == (kernels != "AVX-512") for m in exact.members)
    record_property("lockstep_answers_equal_to_solo", f"{agreed}/2 ({kernels})")
    print(f"{kernels} kernels: lockstep answers equal to solo {agreed}/2, largest score drift {drift:.4f}")
    for rounds in lockstep:
        check_invariants(rounds)
    # Until the runs part, each verifier's score of the same candidate after the same context is the
    # same computation, batched or not: it may differ by rounding, never by more.
    assert drift <= DRIFT_BOUND
    # Where the answers are equal depends on the kernels: on AVX-512 these prompts have been equal to
    # solo ones on every machine measured (runs are deterministic for one build); on AVX2 a drafted
    # near-tie goes the other way in one of them (docs/development.md). Tested where it holds.
    if kernels == "AVX-512":
        assert [r[-1].text for r in lockstep] == [r[-1].text for r in alone]


# Rounding's share of a raw score when a request shares its batch: at most 0.09 measured (AVX-512
# kernels; 0.03 on AVX2). Scoring another request's cells or positions moves a mean log-prob by whole
# units, far past this bound.
DRIFT_BOUND = 0.25


def test_the_backends_benchmark_sets_the_three_setups_side_by_side(monkeypatch):
    from specfuse.bench.backends import SETUPS, format_report, run

    _needs_build()
    monkeypatch.setenv("SPECFUSE_CACHE", REAL_MODEL_CACHE)  # converted once, not again in tmp_path
    pair = ["smollm2-135m", "qwen2.5-coder-0.5b"]
    report = run(pair, ["What is 2 + 3?", "Who wrote Hamlet?"], EnsembleConfig(max_new_tokens=8))
    totals = report["totals"]
    assert list(totals) == list(SETUPS) == ["none", "gguf", "gguf-draft"]
    for q in SETUPS:
        assert totals[q]["tokens"] > 0 and len(report["runs"][q]) == 2
        speedup = totals[q]["tokens_per_s"] / totals["none"]["tokens_per_s"]
        assert report["speedup_tokens_per_s"][q] == pytest.approx(speedup)
        assert 0 <= report["same_answers"][q] <= 2
    assert report["same_answers"]["none"] == 2
    text = format_report(report)
    assert "gguf (llama.cpp)" in text and "× gguf-draft" in text and "load average" in text


def test_a_llama_cpp_member_in_a_worker_process_drafts_as_here():
    _needs_build()
    member = _smollm2()  # as fresh as the worker's: the module's member holds other tests' slots
    (remote,) = load_members(["smollm2-135m"], quantize="gguf", processes=True, cache_dir=REAL_MODEL_CACHE)
    try:
        assert type(remote).__name__ == "ProcessMember"
        remote.set_threads(1)
        theirs, ours = remote.start(PROMPTS[4], GREEDY), member.start(PROMPTS[4], GREEDY)
        assert remote.draft(theirs, 10).text == member.draft(ours, 10).text
    finally:
        remote.close()


def test_auto_picks_llama_cpp_for_gguf_models_on_the_cpu_only(tmp_path):
    from specfuse.models.loading import resolve_quantize
    from studio.loading import SharedLoader

    _needs_build()
    assert resolve_quantize("auto", "smollm2-135m", "cpu") == "gguf"
    assert resolve_quantize("auto", "smollm2-135m", "auto") == "gguf"  # no GPU here
    gguf = assemble_gguf(CATALOGUE["smollm2-135m"], cache_root(REAL_MODEL_CACHE) / "gguf")
    assert resolve_quantize("auto", str(gguf), "cpu") == "gguf"
    assert resolve_quantize("auto", "smollm2-135m", "cuda:0") == "none"
    assert resolve_quantize("auto", "smollm2-135m", "cpu", device_map="auto") == "none"
    assert resolve_quantize("auto", str(tmp_path), "cpu") == "none"  # a folder of safetensors
    assert resolve_quantize("auto", "org/model", "cpu") == "none"  # a hub id
    assert resolve_quantize("int8", "smollm2-135m", "cpu") == "int8"
    # The app's and the CLI's default (--quantize auto) loads the catalogue's models into llama.cpp.
    member = SharedLoader(quantize="auto")("smollm2-135m", "cpu", lambda f, m: None)
    assert type(member).__name__ == "LlamaCppMember"


def test_the_app_runs_the_default_trio_in_llama_cpp(tmp_path, monkeypatch):
    # The app's default (--quantize auto) as a person meets it: the real trio, through its own API.
    from studio.loading import SharedLoader

    from ..helpers_app import (
        ANSWER,
        DOWNLOAD,
        MATRIX,
        WEIGHTS,
        client_on,
        figure,
        launched,
        path_of,
        round_updates,
        submit,
    )

    _needs_build()
    monkeypatch.setenv("SPECFUSE_CACHE", REAL_MODEL_CACHE)  # converted once (tests/models), not again here
    trio = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]
    loader = SharedLoader(quantize="auto")
    cache = tmp_path / "gradio"
    with launched(cache, dict.fromkeys(trio), loader, concurrency=2, default_models=trio) as url:
        client = client_on(url, cache, monkeypatch, tmp_path)
        job = submit(client, trio, "What is 12 times 7? Answer briefly.", max_new_tokens=32, segment_len=10)
        job.result(timeout=300)
        outputs = job.outputs()
        rounds = round_updates(outputs)
        # Rounds quicker than a page draws are drawn together (studio.handlers' Pacing): on a busy
        # machine the first drawn may be round 2, so the drawn rounds are checked in order, up to the last.
        drawn = [
            int(figure(r[MATRIX]).layout.title.text.split(":")[0].removeprefix("round ")) for r in rounds
        ]
        assert drawn and drawn == sorted(set(drawn))
        assert len(figure(rounds[-1][WEIGHTS]).data) == 3
        trace = load_trace(path_of(outputs[-1][DOWNLOAD]))
        assert drawn[-1] == len(trace.rounds)
        assert "84" in trace.rounds[-1].text
        assert "".join(span["token"] for span in outputs[-1][ANSWER]["value"]) == trace.rounds[-1].text
        assert all(type(m).__name__ == "LlamaCppMember" for m in loader._members.values())


def test_a_model_listed_twice_shares_its_weights_and_outlives_the_first():
    import gc

    _needs_build()
    first, second = load_members(
        ["smollm2-135m", "smollm2-135m"], quantize="gguf", cache_dir=REAL_MODEL_CACHE
    )
    assert second.name == "smollm2-135m#2" and second.weights is first.weights
    sampled = EnsembleConfig(temperature=0.8, max_new_tokens=24, seed=3)
    answer = Ensemble([first, second]).run(PROMPTS[2], sampled).answer
    assert answer.strip()
    del first
    gc.collect()  # the first member's context is freed; the weights stay for the second
    state = second.start(PROMPTS[4], GREEDY)
    assert second.draft(state, 10).text.strip()


def test_the_prompt_prior_reads_the_same_surprise_as_transformers(member, local):
    settings = MemberSettings(measure_prompt=True)
    prompt = "Explain in two sentences why the sky is blue."
    ours, theirs = member.start(prompt, settings), local.start(prompt, settings)
    assert member.prompt_surprise(ours) == pytest.approx(local.prompt_surprise(theirs), rel=0.05)
    assert member.prompt_surprise(member.start(prompt, GREEDY)) is None  # not asked for
    # The prompt read for it stays in the slot: the first draft does not read it again.
    assert member.cached[ours.slot] == ours.ids
    assert member.draft(ours, 10).text.strip()


def test_gguf_draft_drafts_in_llama_cpp_and_scores_in_torch(local):
    from specfuse.bench.floor import member_floors
    from specfuse.bench.measure import generate_alone
    from specfuse.members.split import SplitMember

    _needs_build()
    split = load_member("smollm2-135m", quantize="gguf-draft", dtype="float32", cache_dir=REAL_MODEL_CACHE)
    assert isinstance(split, SplitMember)
    assert type(split.drafter).__name__ == "LlamaCppMember" and type(split.verifier).__name__ == "HFMember"
    # The benchmarks' floor is the drafter's: 4-bit blocks, fewer bytes than bf16 weights.
    floor = member_floors([split], {"cpu": 1.0})["smollm2-135m"]["weight_bytes"]
    assert floor == split.drafter.bytes_per_token < 2 * split.verifier.model.num_parameters()
    assert generate_alone(split, PROMPTS[0], 5)[0] == 5  # "member alone" decodes in llama.cpp
    # A fresh llama.cpp member to compare with: the shared one holds prompts read in other batches,
    # which llama.cpp rounds differently.
    member = _smollm2()
    ours, d, v = (
        split.start(PROMPTS[1], GREEDY),
        member.start(PROMPTS[1], GREEDY),
        local.start(PROMPTS[1], GREEDY),
    )
    for _ in range(3):
        cand = split.draft(ours, 10)
        assert cand.text == member.draft(d, 10).text  # llama.cpp's draft
        assert split.score(ours, [cand]) == pytest.approx(local.score(v, [cand]), abs=1e-4)  # torch's score
        for m, state in ((split, ours), (member, d), (local, v)):
            m.accept(state, cand.text)
    twice = load_members(
        ["smollm2-135m", "smollm2-135m"], quantize="gguf-draft", dtype="float32", cache_dir=REAL_MODEL_CACHE
    )
    assert twice[1].name == "smollm2-135m#2"
    assert twice[1].drafter.weights is twice[0].drafter.weights
    assert twice[1].verifier.model is twice[0].verifier.model
    with pytest.raises(ConfigError, match="CPU only"):
        load_member("smollm2-135m", quantize="gguf-draft", device="cuda:0", cache_dir=REAL_MODEL_CACHE)


def test_prompt_contrast_scores_against_a_second_context_without_the_prompt(member):
    """Both contexts of every request share one verify call; the scores equal those by hand."""
    from specfuse.engine.calls import PROMPT_LEFT_OUT

    from ..runs import scores_by_hand

    config = EnsembleConfig(max_new_tokens=30, verify="always", exit=False, prompt_contrast=0.3)
    prompts = PROMPTS[:2]
    runs: list[list] = [[], []]
    for i, rnd in Ensemble([member]).stream_many(prompts, config):
        runs[i].append(rnd)
    pull = []  # how far each score is from the plain one: the second context must count
    for prompt, rounds in zip(prompts, runs):
        assert len(rounds) >= 2
        before = ""
        for rnd in rounds:
            z = [
                scores_by_hand(member, text, before, rnd.candidates, config)
                for text in (prompt, PROMPT_LEFT_OUT)
            ]
            # llama.cpp's sums depend on what else shares a batch: a few thousandths (1e-3 within a
            # call's own requests, test above); the second context moves a score by 0.3 x ~1 nat.
            assert list(rnd.raw_scores[0]) == pytest.approx([a - 0.3 * b for a, b in zip(*z)], abs=0.02)
            pull += [abs(r - a) for r, a in zip(rnd.raw_scores[0], z[0])]
            before = rnd.text
    assert max(pull) > 0.1


def test_candidates_that_begin_alike_are_read_once_and_score_exactly_as_apart():
    """The verify pass's prefix tree (candidate_items): candidates sharing their first tokens, or whole,
    decode those once in all their sequences. Below 64 tokens a batch runs the one-token kernels, so
    the scores equal those of every candidate decoded apart bit for bit; and fewer tokens are read."""
    from specfuse.members import profiling

    shared, apart = _smollm2(ubatch_tokens=32), _smollm2(ubatch_tokens=32, share_prefixes=False)
    decoded = {}
    verdicts = {}
    for label, member in (("shared", shared), ("apart", apart)):
        states = [member.start(p, GREEDY) for p in PROMPTS[:2]]
        own = [member.draft(s, 10) for s in states]
        candidates = [
            [
                c,
                Candidate("twin", c.text, c.num_tokens, c.final, 0.0),
                Candidate("x", c.text + " Yes", 0, False, 0.0),
            ]
            for c in own
        ]
        with profiling.profiling() as tally:
            verdicts[label] = member.score_many(states, candidates)
        (verify,) = [
            t for t in tally.snapshot()["tallies"] if t["key"] == ["llama_decode", member.name, "verify"]
        ]
        decoded[label] = verify["items"]
    assert verdicts["shared"] == verdicts["apart"]
    for z, _ in verdicts["shared"]:
        assert z[0] == z[1]  # the twin is the same tokens in the same context
    # Apart: three paths a request; shared: the first draft's tokens once, and " Yes" after them.
    assert decoded["shared"] < 0.5 * decoded["apart"]
    # The accepted candidate's cells move into the slot (each sequence holds its whole path): the next
    # draft reads only the tokens it lacks, and drafts what a member that never verified drafts.
    state = shared.start(PROMPTS[0], GREEDY)
    first = shared.draft(state, 10)
    twin = Candidate("twin", first.text, first.num_tokens, first.final, 0.0)
    shared.score_many([state], [[first, twin]])
    shared.accept(state, first.text)
    fresh = _smollm2(ubatch_tokens=32)
    other = fresh.start(PROMPTS[0], GREEDY)
    fresh.accept(other, fresh.draft(other, 10).text)
    assert common_prefix_len(shared.cached[state.slot], state.ids) >= len(state.ids) - 1
    assert shared.draft(state, 10).text == fresh.draft(other, 10).text
