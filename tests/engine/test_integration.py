"""The real default models from their PyPI packages: invariants of real runs, never golden text."""

from __future__ import annotations

import io

import pytest
import torch

from specfuse import EnsembleConfig, Trace, load_trace, save_trace
from specfuse.cli import main
from specfuse.config import MemberSettings
from specfuse.engine import Ensemble
from specfuse.models.loading import load_member
from specfuse.records import Candidate

from ..conftest import REAL_MODEL_CACHE
from ..runs import check_invariants

pytestmark = pytest.mark.slow

GSM8K = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?"
)


def test_the_default_trio_answers_a_gsm8k_problem(real_members, tmp_path):
    ensemble = Ensemble(list(real_members.values()), EnsembleConfig(segment_len=5, max_new_tokens=15))
    rounds = list(ensemble.stream(GSM8K))
    assert len(rounds) >= 3
    check_invariants(rounds)
    path = save_trace(Trace(GSM8K, ensemble.names, ensemble.config, tuple(rounds)), tmp_path / "t.json")
    assert load_trace(path).rounds == tuple(rounds)


def test_chinese_and_code_keep_every_character(real_members):
    pair = [real_members["smollm2-135m"], real_members["qwen2.5-coder-0.5b"]]
    for prompt in (
        "用一句话介绍长城。",
        "Write a Python function eggs_per_day(total, eaten) that returns the rest.",
    ):
        rounds = list(Ensemble(pair, EnsembleConfig(max_new_tokens=16)).stream(prompt))
        check_invariants(rounds)


def test_packed_scores_equal_separate_passes_on_a_real_model():
    member = load_member("smollm2-135m", dtype="float32", cache_dir=REAL_MODEL_CACHE)
    state = member.start("Name a colour.", MemberSettings())
    member.accept(state, "The colour")
    texts = [" is blue.", " red", " of the sky is blue", "ful 色彩"]
    packed = member.score(state, [Candidate("x", t, 1, t.endswith("."), 0.0) for t in texts])
    for text, z in zip(texts, packed):
        fresh = member.start("Name a colour.", MemberSettings())
        member.accept(fresh, "The colour")
        alone = member.score(fresh, [Candidate("x", text, 1, text.endswith("."), 0.0)])[0]
        assert z == pytest.approx(alone, abs=1e-3)
    assert member.dtype == torch.float32


def test_cli_refuses_a_prompt_beyond_smollm2s_context():
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["--models", "smollm2-135m", "--quiet", "--cache-dir", REAL_MODEL_CACHE, "word " * 9000],
        stdout=out,
        stderr=err,
    )
    assert code == 2 and "context of 8192" in err.getvalue()
