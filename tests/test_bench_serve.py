"""`python -m specfuse.bench serve` on tiny models: every level runs through the live API, and the
report carries the figures the docs quote (a timing script, checked for shape, never for speed)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from specfuse.bench.serve import PROMPTS, format_table, main, percentile, run_serve
from specfuse.config import VERIFY_MODES, EnsembleConfig
from specfuse.models.loading import load_members
from specfuse.models.quantize import QuantizedLinear


def test_percentile_interpolates_between_ranks():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.95) == 5.0


def test_the_serving_benchmark_reports_each_level_against_one_at_a_time(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=8)
    report = run_serve(tiny_members, levels=(1, 2, 8), requests=4, max_tokens=8, config=config)
    levels = report["levels"]
    assert list(levels) == ["1", "2", "8"] and report["batch_size"] == 8
    for level in levels.values():
        assert level["errors"] == [] and level["tokens"] > 0 and level["tokens_per_s"] > 0
        assert level["first_segment_p95_s"] >= level["first_segment_median_s"] > 0
        assert level["same_answers_as_one_at_a_time"] == 4  # fp32 greedy: batching changes nothing
        assert len(level["load_before"]) == 3
    assert levels["1"]["aggregate_speedup"] == 1.0
    table = format_table(report)
    assert "targets (8 clients against one at a time)" in table and "load avg" in table


def test_each_client_sends_its_share_so_that_levels_keep_their_clients_busy(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=8)
    report = run_serve(tiny_members, levels=(1, 4), per_client=3, max_tokens=8, config=config)
    one, four = report["levels"]["1"], report["levels"]["4"]
    assert (one["requests"], four["requests"]) == (8, 12)  # the baseline at least 8; 4 × 3
    assert four["prompts"] == [PROMPTS[i % len(PROMPTS)] for i in range(12)]  # the same mix as alone
    assert four["same_answers_as_one_at_a_time"] == 12  # each against its prompt's solo answer
    assert "3 requests per client (at least 8), join wait 0.25 s" in format_table(report).splitlines()[0]


def test_the_command_quantizes_sets_any_setting_and_says_so_in_its_report(
    tiny_checkpoints, monkeypatch, tmp_path
):
    loaded = []

    def recording(names, **options):
        loaded.extend(load_members(names, **options))
        return loaded

    monkeypatch.setattr("specfuse.models.loading.load_members", recording)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # main sets it when unset: undone after the test
    out = tmp_path / "serve"
    argv = ["--models", *tiny_checkpoints, "--quantize", "int8", "--set", "verify=disagree",
            "--set", "stop_strings=Zq|Qz", "--levels", "1,2", "--requests", "2", "--max-tokens", "4",
            "--segment-len", "4", "--join-wait", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    for member in loaded:
        layers = [m for m in member.model.modules() if isinstance(m, nn.Linear | QuantizedLinear)]
        assert layers and all(type(m) is QuantizedLinear and m.weight.dtype == torch.int8 for m in layers)
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["quantize"] == "int8" and report["config"]["verify"] == "disagree"
    assert report["config"]["stop_strings"] == ["Zq", "Qz"] and report["config"]["segment_len"] == 4
    assert all(level["errors"] == [] for level in report["levels"].values())
    header = out.with_suffix(".txt").read_text().splitlines()[0]
    assert ", int8 weights, batch size 2," in header and ", join wait 0.0 s;" in header
    assert header.endswith("; settings: segment_len=4, verify=disagree, stop_strings=Zq|Qz")


def test_a_bad_set_exits_2_naming_the_key_before_loading(monkeypatch, capsys):
    monkeypatch.setattr("specfuse.models.loading.load_members", lambda *a, **k: pytest.fail("loaded"))
    for setting, message in [
        ("nope=1", "unknown setting 'nope'; valid keys: segment_len"),
        ("verify=sometimes", f"verify='sometimes': expected one of {', '.join(VERIFY_MODES)}"),
        ("segment_len", "'segment_len' is not KEY=VALUE"),
    ]:
        with pytest.raises(SystemExit) as exit:
            main(["--set", setting])
        err = capsys.readouterr().err
        assert exit.value.code == 2 and f"argument --set: {message}" in err, err
    assert main(["--set", "segment_len=0"]) == 2  # parsed, then refused by the config's own check
    assert "segment_len" in capsys.readouterr().err
