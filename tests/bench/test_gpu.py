"""The GPU benchmark's logic on the CPU: real 7-9B shapes (on the meta device), and the whole run on
tiny shapes of the same architectures."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specfuse.bench import gpu as bench_gpu
from specfuse.bench import shapes
from specfuse.members.hf import compiled as compiled_decoding

from ..conftest import REAL_MODEL_CACHE
from ..helpers_bench import assert_ratios


@pytest.mark.parametrize("name", list(shapes.SHAPES["real"]))
def test_the_real_shapes_have_the_published_sizes(name):
    arch, values = shapes.SHAPES["real"][name]
    model = shapes.build_model(arch, values, "meta", torch.bfloat16, seed=0)  # no memory used
    expected = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "gemma2": "Gemma2ForCausalLM"}
    assert type(model).__name__ == expected[arch]
    assert model.num_parameters() == pytest.approx(shapes.EXPECTED_PARAMS[name], rel=0.01)
    assert model.config.vocab_size == values["vocab_size"]


@pytest.mark.parametrize("name", list(shapes.SHAPES["trio"]))
def test_the_trio_shapes_are_the_installed_models_shapes(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    from specfuse.models.cache import ensure_cached
    from specfuse.models.catalogue import CATALOGUE

    arch, values = shapes.SHAPES["trio"][name]
    shaped = shapes.build_model(arch, values, "meta", torch.bfloat16, seed=0)
    config = AutoConfig.from_pretrained(ensure_cached(CATALOGUE[name], REAL_MODEL_CACHE))
    with torch.device("meta"):
        real = AutoModelForCausalLM.from_config(config)
    assert type(shaped).__name__ == type(real).__name__
    assert shaped.num_parameters() == real.num_parameters()
    assert shaped.config.tie_word_embeddings == real.config.tie_word_embeddings


def test_the_whole_benchmark_runs_on_tiny_shapes_and_reports_finite_ratios():
    members = bench_gpu.build_members("tiny", ["cpu"], "float32")
    assert [type(m.model).__name__ for m in members] == [
        "Qwen2ForCausalLM",
        "LlamaForCausalLM",
        "Gemma2ForCausalLM",
    ]
    report = bench_gpu.run_gpu_bench(members, max_new_tokens=20, segment_len=5, repeats=1)
    for parallel in ("off", "on"):
        mode = report["modes"][parallel]
        assert_ratios(mode)
        assert mode["tokens"] == 20
        # Random weights behind the biased head: printable ASCII, one byte per token.
        assert mode["answer"] and mode["answer"].isascii() and mode["answer"].isprintable()
    assert report["modes"]["on"]["same_answer_as_in_turn"] is True
    table = bench_gpu.format_table(report)
    assert "at once (threads)" in table and "× the slowest member alone" in table  # no CUDA streams on a CPU
    assert table.count("× the floor") == len(report["single"])  # each member beside its floor
    assert all(s["floor_ratio"] > 1 for s in report["single"].values())
    json.dumps(report)


def test_compiled_members_are_timed_by_their_own_drafts_beside_eager_drafts_in_one_run(monkeypatch):
    """--compile: each member alone is its compiled drafting (generate beside it), and the ensemble
    in turn runs once more with its drafts eager; in fp32 both answers are the same text. The report's
    bookkeeping, not inductor, is under test: "aot_eager" compiles the same graphs without generating
    C++ (inductor took 139 s here; test_compiled_decoding.py runs it)."""
    monkeypatch.setattr(compiled_decoding, "DEFAULT_BACKEND", "aot_eager")
    members = bench_gpu.build_members("tiny", ["cpu"], "float32", compile_decode=True)
    report = bench_gpu.run_gpu_bench(members, max_new_tokens=20, segment_len=5, repeats=1, modes=("off",))
    assert set(report["modes"]) == {"off", "eager"}
    for mode in report["modes"].values():  # where the rounds went: shares of their wall time
        assert sum(mode["phases"].values()) == pytest.approx(1.0)
        assert 0 < mode["phases"]["draft_share"] < 1 and 0 < mode["phases"]["verify_share"] < 1
        assert set(mode["phase_ms_per_member"]) == set(report["single"])
        each = mode["phase_ms_per_member"].values()
        assert sum(p["wins"] for p in each) == mode["rounds"]  # every round has one winner
        assert sum(p["tokens_taken_over"] for p in each) == mode["decode_steps_saved"]
    for single in report["single"].values():
        assert 15 <= single["tokens"] <= 20 and single["generate_s_per_token"] > 0  # a draft may trim its end
        # The compiled step and the head alone, beside the draft loop's time per token and the floor.
        assert 0 < single["bare_step_s"] < single["s_per_token"] * 5
        ratio = single["bare_step_s"] / single["floor_s_per_token"]
        assert single["bare_step_floor_ratio"] == pytest.approx(ratio)
    compiled = report["compiled"]
    assert compiled["same_answer_as_eager"] is True
    assert compiled["speedup_in_turn"] > 0
    for name, drafts in compiled["drafts"].items():
        # Warm-up: a draft alone, the ensemble twice (4 rounds each), a draft alone again; then two
        # timed drafts alone (the whole budget, one segment), the timed ensemble's 4 rounds and one
        # one-round run, and the bare step's draft of two tokens. The eager mode's drafts do not count.
        assert drafts == {"static": 1 + 2 * 4 + 1 + 2 + 1 + 4 + 1, "eager": 0, "batched": 0}, name
        assert compiled["disabled"][name] is None
        assert compiled["verified"][name] > 0  # lone verification passes ran compiled too
    table = bench_gpu.format_table(report)
    assert "in turn, eager" in table and "compiled drafts:" in table and "; generate " in table
    assert "; the compiled step and head alone " in table
    assert "off: a round's draft / verify per member, rounds won, tokens taken over: " in table
    assert "eager: shares of a round's wall time: draft " in table
    json.dumps(report)


@pytest.mark.slow
def test_the_command_adds_one_process_per_member_and_writes_its_report(tmp_path, capsys):
    """The whole command, as it runs on a GPU, with every mode (processes included) on tiny shapes."""
    out = tmp_path / "gpu.json"
    argv = ["--shapes", "tiny", "--device", "cpu", "--max-new-tokens", "20", "--segment-len", "5"]
    assert bench_gpu.main([*argv, "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["modes"]) == {"off", "on", "processes"}
    mode = report["modes"]["processes"]
    assert (
        mode["tokens"] == 20 and math.isfinite(mode["overhead_vs_slowest"]) and mode["speedup_vs_in_turn"] > 0
    )
    assert mode["answer"].isascii() and mode["answer"].isprintable()
    assert "at once (one process per member)" in capsys.readouterr().out


@pytest.mark.slow
def test_the_bare_decoding_race_reports_all_three_ways(tmp_path):
    out = tmp_path / "race.json"
    argv = ["--shapes", "tiny", "--device", "cpu", "--dtype", "float32", "--max-new-tokens", "8"]
    assert bench_gpu.main([*argv, "--workers", "--json", str(out)]) == 0
    race = json.loads(out.read_text())
    assert all(race[k] > 0 for k in ("in_turn_s", "threads_s", "processes_s"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where there is no GPU")
def test_asking_for_a_gpu_where_there_is_none_is_one_clear_line(capsys):
    assert bench_gpu.main(["--shapes", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "torch sees no GPU" in err and "Traceback" not in err


def test_help(capsys):
    with pytest.raises(SystemExit) as done:
        bench_gpu.main(["--help"])
    assert done.value.code == 0 and "--devices" in capsys.readouterr().out
