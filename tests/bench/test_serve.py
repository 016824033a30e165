"""`python -m specfuse.bench serve` on tiny models: every level runs through the live API, and the
report carries the figures the docs quote (a timing script, checked for shape, never for speed)."""

from __future__ import annotations

import gc
import json
import time
from dataclasses import replace

import pytest
import torch
from torch import nn

from specfuse.bench import serve
from specfuse.bench.serve import PROMPTS, format_table, main, percentile, run_serve, running, warm_up
from specfuse.bench.serve_report import capture_lines, parted_at, parting_lines
from specfuse.bench.serve_shapes import load_shapes, shapes_config
from specfuse.config import VERIFY_MODES, EnsembleConfig
from specfuse.engine import Scheduler
from specfuse.errors import SpecfuseError
from specfuse.models.placement import load_members
from specfuse.models.quantize import QuantizedLinear
from specfuse.serve.api import create_app


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
    assert all(level["parted_at"] == [None] * 4 for level in levels.values())  # all equal to solo
    assert report["parted_in"] == tiny_members[0].name
    table = format_table(report)
    assert "targets (8 clients against one at a time)" in table and "load avg" in table
    assert "batched answers against the solo answer to the same prompt:" in table
    assert "    8 clients: 4 of 4 equal" in table


def test_steps_captured_inside_a_timed_level_are_said():
    # A step first needed in a level is captured while it is timed (a GPU's): its seconds are in the
    # level's figures, so the table says how many and how long, level by level; none, nothing said.
    levels = {"1": {"clients": 1, "captures": 6, "capture_s": 1.04}, "8": {"clients": 8, "captures": 0}}
    assert capture_lines({"levels": levels}) == [
        "",
        "steps captured at first use inside a timed level: 1 clients: 6 in 1.0 s",
    ]
    assert capture_lines({"levels": {"1": {"clients": 1}}}) == []  # reports from before they were counted


def test_where_a_batched_answer_parts_from_the_solo_one(tiny_members):
    encode = tiny_members[0].encode
    assert parted_at("The sky is blue.", "The sky is blue.", encode) is None
    solo, batched = "The sky is blue today.", "The sky is red today."
    index = parted_at(solo, batched, encode)
    same = encode("The sky is ")
    assert index is not None and encode(solo)[:index] == encode(batched)[:index]
    assert encode(solo)[index] != encode(batched)[index] and len(same) - 1 <= index <= len(same)
    assert parted_at("abc", "abd") == 2 and parted_at("abc", "abcd") == 3  # characters, no tokenizer
    # A level's answers against the solo answers to the same prompts, as the table says them.
    results = {
        "1": {"clients": 1, "prompts": ["p", "q"], "answers": [solo, "x"], "tokens_per_s": 1.0,
              "first_segment_p95_s": 1.0, "first_segment_median_s": 1.0},
        "4": {"clients": 4, "prompts": ["p", "q", "p", "r"], "answers": [batched, "x", solo, "y"],
              "tokens_per_s": 2.0, "first_segment_p95_s": 1.0, "first_segment_median_s": 1.0},
    }  # fmt: skip
    serve.compare_to_solo(results, encode)
    assert results["4"]["parted_at"] == [index, None, None]  # "r" had no solo answer
    assert results["4"]["same_answers_as_one_at_a_time"] == 2
    lines = parting_lines({"levels": results, "parted_in": "tiny"})
    assert lines[-1] == f"    4 clients: 2 of 3 equal; the others part at tiny tokens {index}"
    assert lines[-2] == "    1 clients: 2 of 2 equal"


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

    monkeypatch.setattr("specfuse.models.placement.load_members", recording)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # main sets it when unset: undone after the test
    out = tmp_path / "serve"
    argv = ["--models", *tiny_checkpoints, "--quantize", "int8", "--set", "verify=disagree",
            "--set", "stop_strings=Zq|Qz", "--levels", "1,2", "--requests", "2", "--max-tokens", "4",
            "--segment-len", "4", "--join-wait", "0", "--parallel", "off", "--profile",
            "--against", "gate=true", "--out", str(out)]  # fmt: skip
    try:
        assert main(argv) == 0  # which freezes what start-up left (heap.freeze_survivors)
        assert gc.get_freeze_count() > 100_000  # torch's and transformers' objects, at least
    finally:
        gc.unfreeze()  # this test process goes on: its frozen objects collectable again
    for member in loaded:
        layers = [m for m in member.model.modules() if isinstance(m, nn.Linear | QuantizedLinear)]
        assert layers and all(type(m) is QuantizedLinear and m.weight.dtype == torch.int8 for m in layers)
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["quantize"] == "int8" and report["config"]["verify"] == "disagree"
    assert report["config"]["stop_strings"] == ["Zq", "Qz"] and report["config"]["segment_len"] == 4
    assert all(level["errors"] == [] for level in report["levels"].values())
    text = out.with_suffix(".txt").read_text()
    header = text.splitlines()[0]
    assert ", int8 weights, batch size 2," in header and ", join wait 0.0 s, members at once: off;" in header
    # --profile: each level says where its time went, from its own tallies.
    for clients, level in report["levels"].items():
        assert any(t["key"] == ["phase", "verify"] and t["calls"] >= 1 for t in level["profile"]["tallies"])
        assert f"where the time went at {clients} clients" in text
    assert report["parallel"] == "off" and "torch forward" in text
    assert header.endswith("; settings: segment_len=4, verify=disagree, stop_strings=Zq|Qz")
    assert report["against"]["settings"] == {"gate": True} and report["config"]["gate"] is False
    assert "tokens/s under gate=True over the default's, level by level: 1 clients ×" in text
    # each level counts the collector's full passes in it; start-up's objects were frozen
    assert report["gc_frozen"] > 100_000 and all(
        level["gc_full_passes"] >= 0 for level in report["levels"].values()
    )
    assert (
        f"full garbage collections, {report['gc_frozen']:,} objects frozen at start-up: 1 clients: " in text
    )


def test_a_bad_set_exits_2_naming_the_key_before_loading(monkeypatch, capsys):
    monkeypatch.setattr("specfuse.models.placement.load_members", lambda *a, **k: pytest.fail("loaded"))
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
    with pytest.raises(SystemExit) as exit:
        main(["--against", "nope=1"])
    assert exit.value.code == 2 and "argument --against: unknown setting 'nope'" in capsys.readouterr().err
    assert main(["--against", "gate_threshold=5"]) == 2  # a log probability: refused by the config


def test_random_weight_shapes_run_the_same_path_on_a_cpu_and_the_report_says_where(tmp_path, monkeypatch):
    """`--shapes tiny --device cpu`: bench gpu's members (real architectures, random weights, a byte
    tokenizer, nothing downloaded) behind the live server; what the GPU run's report will carry."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # main sets it when unset: undone after the test
    out = tmp_path / "gpu-serve"
    argv = ["--shapes", "tiny", "--device", "cpu", "--levels", "1,2", "--per-client", "1",
            "--min-requests", "2", "--max-tokens", "24", "--segment-len", "6", "--deadline", "600",
            "--decode", "graphs", "--slots-off", "fold", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    # An A/B run's switch: the model's own attention on the slots (ahead, batched, fuse, merge: a GPU's only).
    off = dict.fromkeys(("ahead", "fold", "batched", "fuse", "merge"), False)
    assert all(p["options"] == {**off, "prefill": True, "stacked": True} for p in report["decode"].values())
    assert report["members"] == ["qwen2.5-7b", "llama-3.1-8b", "gemma-2-9b"]
    where = (report["shapes"], report["device"], report["dtype"], report["gpu"])
    assert where == ("tiny", "cpu", "float32", None)
    assert set(report["versions"]) == {"python", "torch", "cuda", "transformers"}
    assert (report["min_requests"], report["per_client"], report["deadline_s"]) == (2, 1, 600)
    config = report["config"]
    settings = (config["exit"], config["prior"], config["stop_strings"], config["segment_len"])
    assert settings == (False, "uniform", [], 6)
    assert report["skipped"] == [] and report["seconds"] > 0
    for clients, level in report["levels"].items():
        assert level["clients"] == int(clients) and level["requests"] == 2 and not level["cut_short"]
        assert level["errors"] == [] and level["peak_gpu_gb"] is None  # on a GPU: its peak memory
        # The biased head: printable ASCII, never an end of sequence, so every answer is full length.
        assert level["tokens"] == 2 * 24 and all(len(a) == 24 and a.isprintable() for a in level["answers"])
        assert level["first_segment_p95_s"] >= level["first_segment_median_s"] > 0
        assert level["tokens_per_s"] > 0 and level["p95_first_segment_ratio"] > 0
        assert level["same_answers_as_one_at_a_time"] == 2  # fp32 greedy; on a GPU in bf16 only counted
        assert (level["captures"], level["capture_s"]) == (0, 0)  # a CPU captures nothing, then or before
    assert report["levels"]["1"]["aggregate_speedup"] == 1.0
    table = out.with_suffix(".txt").read_text()
    assert "cores, float32; random weights, tiny shapes), batch size 2, 24 tokens" in table.splitlines()[0]
    assert "settings: segment_len=6, prior=uniform, exit=False" in table and "versions: python" in table
    # On the KV slots (uncaptured on a CPU): every member drafted and verified there, and each
    # level's answers are the solo ones (fp32), said in the table.
    assert all(
        p["path"] == "slots" and p["verifies"] > 0 and p["drafts"] > 0 for p in report["decode"].values()
    )
    assert report["parted_in"] == "qwen2.5-7b" and "    2 clients: 2 of 2 equal" in table


def test_members_in_worker_processes_play_the_same_answers_and_are_read_where_they_live(
    tmp_path, monkeypatch
):
    """`--processes`: each member built in a worker process of its own (members at once, the app's
    default where members share a GPU); the report's slot counts, weight bytes, dtype and token
    partings come from the workers, and the answers are those of the same members in this process."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "gpu-serve-processes"
    argv = ["--shapes", "tiny", "--device", "cpu", "--levels", "1,2", "--per-client", "1",
            "--min-requests", "2", "--max-tokens", "16", "--segment-len", "6", "--decode", "graphs",
            "--slots-off", "fold", "--processes", "--no-freeze", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["processes"] is True and report["dtype"] == "float32"
    assert report["parted_in"] == "qwen2.5-7b" and all(b > 0 for b in report["weight_bytes"].values())
    for p in report["decode"].values():  # counted in each worker, the switch turned off there
        assert p["path"] == "slots" and p["drafts"] > 0 and p["verifies"] > 0 and p["prefills"] > 0
        assert p["options"]["fold"] is False and p["options"]["prefill"] is True
    members = load_shapes("tiny", "cpu", "float32", "graphs")
    config = shapes_config(6, 16)  # the command's own: --segment-len 6, --max-tokens 16
    here = run_serve(members, levels=(2,), per_client=1, min_requests=2, max_tokens=16, config=config)
    there = report["levels"]["2"]
    assert dict(zip(there["prompts"], there["answers"])) == dict(
        zip(here["levels"]["2"]["prompts"], here["levels"]["2"]["answers"])
    )
    assert there["peak_gpu_gb"] is None and there["errors"] == []
    assert "each member in a worker process of its own" in out.with_suffix(".txt").read_text().splitlines()[0]
    assert here["processes"] is False


def test_shapes_build_their_own_members(monkeypatch, capsys):
    monkeypatch.setattr("specfuse.bench.serve_shapes.load_shapes", lambda *a: pytest.fail("built"))
    assert main(["--shapes", "tiny", "--quantize", "int8"]) == 2
    assert "--shapes builds its own members" in capsys.readouterr().err


def test_a_deadline_cuts_the_level_under_way_short_and_skips_the_rest(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=8)
    with pytest.raises(SpecfuseError, match="deadline passed before the first level"):
        run_serve(tiny_members, levels=(1,), max_tokens=8, config=config, stop_at=time.perf_counter())
    report = run_serve(
        tiny_members, levels=(1, 2), min_requests=10_000, max_tokens=8, config=config,
        stop_at=time.perf_counter() + 4,
    )  # fmt: skip
    one = report["levels"]["1"]
    assert list(report["levels"]) == ["1"] and report["skipped"] == [2]
    assert one["cut_short"] and 0 < one["requests"] < one["requests_planned"] == 10_000
    table = format_table(report)
    assert f"cut short: {one['requests']} of 10000 sent" in table
    assert "skipped (the deadline had passed): 2 clients" in table


def test_the_gpu_warm_up_runs_a_whole_answer_then_every_client_at_once(tiny_members, monkeypatch):
    calls = []
    one, level = serve.one_request, serve.run_level

    def one_request(url, prompt, max_tokens, settings=None):
        calls.append(("alone", max_tokens))
        return one(url, prompt, max_tokens, settings)

    def run_level(url, clients, requests, max_tokens, stop_at=None):
        calls.append((clients, len(requests), max_tokens))
        return level(url, clients, requests, max_tokens, stop_at)

    monkeypatch.setattr(serve, "one_request", one_request)
    monkeypatch.setattr(serve, "run_level", run_level)
    scheduler = Scheduler(tiny_members, EnsembleConfig(segment_len=4, max_new_tokens=12), batch_size=3)
    try:
        with running(create_app(scheduler)) as url:
            warm_up(url, scheduler.config, 3, 12, full=True)
            # The whole budget alone, then three clients at once for two segments (their requests).
            assert calls == [("alone", 12), (3, 3, 8), *[("alone", 8)] * 3]
            calls.clear()
            warm_up(url, scheduler.config, 3, 12, full=False)
            assert calls == [("alone", 8)]  # on a CPU: one short request, as before
    finally:
        scheduler.close()


def test_the_serving_benchmark_reports_the_share_of_gated_rounds(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=8, gate=True, gate_threshold=-100.0)
    report = run_serve(tiny_members, levels=(1, 2), requests=2, max_tokens=8, config=config)
    for level in report["levels"].values():
        assert level["rounds"] >= 2 and level["gated_share"] == 1.0  # a gate that always passes
    assert "gated rounds 100% of" in format_table(report)
    plain = replace(config, gate=False)
    ungated = run_serve(tiny_members, levels=(1,), requests=2, max_tokens=8, config=plain)
    assert ungated["levels"]["1"]["gated_share"] == 0.0 and "gated rounds" not in format_table(ungated)


def test_against_measures_every_level_again_under_other_settings_in_the_same_run(tiny_members):
    config = EnsembleConfig(segment_len=4, max_new_tokens=8)
    against = {"gate": True, "gate_threshold": -100.0}  # a gate that always passes
    report = run_serve(tiny_members, levels=(1, 2), requests=2, max_tokens=8, config=config, against=against)
    assert report["config"]["gate"] is False and report["against"]["settings"] == against
    for clients in ("1", "2"):
        default, other = report["levels"][clients], report["against"]["levels"][clients]
        assert default["errors"] == other["errors"] == [] and other["requests"] == 2
        assert default["gated_share"] == 0.0 and other["gated_share"] == 1.0  # sent with each request
        assert other["speedup_over_default"] == pytest.approx(other["tokens_per_s"] / default["tokens_per_s"])
    assert report["against"]["levels"]["1"]["aggregate_speedup"] == 1.0  # its own one-at-a-time
    lines = format_table(report).splitlines()
    settings = "gate=True, gate_threshold=-100.0"
    under = lines.index(f"under {settings} (sent with each request; each level right after the one above):")
    assert lines[under + 1].split()[0] == "1" and lines[under + 2].split()[0] == "2"
    assert lines[under + 3].startswith(f"tokens/s under {settings} over the default's")
