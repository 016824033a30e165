"""The evaluation: answers, systems and variants, resumable batched runs, statistics, reports."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from specfuse.config import EnsembleConfig
from specfuse.errors import ConfigError
from specfuse.eval import cli as ev
from specfuse.eval import report as eval_report
from specfuse.eval import stats, variants

from ..helpers_eval import CONFIG, scripted, write_data


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She pays 3 * 4 = 12 dollars. The answer is 12.", "12"),
        ("The answer is $1,250.", "1250"),
        ("so 18.00 in total. The answer is: 18.00", "18"),
        ("The answer is 5. Wait, 7 eggs... The answer is 6.", "6"),
        ("First 3, then 4, so 9 apples", "9"),
        ("The answer is -4 degrees", "-4"),
        ("The answer is **42**.", "42"),
        ("It costs 0.5 dollars each, 2.50 total", "2.5"),
        ("no number here", None),
        ("The answer is N.", None),
    ],
)
def test_the_final_number_is_extracted_from_tricky_replies(text, expected):
    assert ev.extract_answer(text) == expected


def test_wilson_interval_matches_known_values_and_stays_in_bounds():
    low, high = ev.wilson(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-3) and high == pytest.approx(0.9433, abs=1e-3)
    assert ev.wilson(0, 5)[0] == 0.0 and ev.wilson(5, 5)[1] == pytest.approx(1.0)
    assert ev.wilson(0, 0) == (0.0, 1.0)


def test_majority_vote_ties_go_to_the_first_sample():
    assert ev.majority(["3", "4", "4"]) == "4"
    assert ev.majority(["3", "4", None]) == "3"
    assert ev.majority([None, None]) is None


def test_problems_load_with_their_gold_numbers(tmp_path):
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl", 3), limit=2)
    assert [(p.id, p.gold) for p in problems] == [("gsm8k-0000", "2"), ("gsm8k-0001", "3")]


def test_rows_pick_problems_by_line_and_keep_their_ids_so_runs_of_other_rows_pair_up(tmp_path):
    data = write_data(tmp_path / "d.jsonl", 5)
    problems = ev.load_problems(data, rows=range(2, 4))
    assert [(p.id, p.gold) for p in problems] == [("gsm8k-0002", "4"), ("gsm8k-0003", "5")]
    assert [p.id for p in ev.load_problems(data, limit=1, rows=range(3, 5))] == ["gsm8k-0003"]
    with open(data, "a") as f:
        f.write("not json\n")  # line 5, beyond the rows asked for: never read
    assert len(ev.load_problems(data, rows=range(0, 5))) == 5
    with pytest.raises(ev.DataError, match="has 5 lines; --rows asks up to row 7"):
        ev.load_problems(write_data(tmp_path / "e.jsonl", 5), rows=range(2, 8))


@pytest.mark.parametrize("rows", ["4", "3:1", "a:b"])
def test_bad_gsm8k_rows_exit_2_before_loading(tmp_path, capsys, rows):
    data = write_data(tmp_path / "d.jsonl")
    assert ev.main(["gsm8k", "--data", str(data), "--rows", rows, "--runs", str(tmp_path / "r")]) == 2
    assert "--rows" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no data file"),
        ('{"question": "q", "answer": "#### 3"}\nnot json\n', "d.jsonl:2: malformed line"),
        ('{"question": "q"}\n', "d.jsonl:1: malformed line"),
        ('{"question": "q", "answer": "no marker"}\n', "d.jsonl:1: malformed line"),
    ],
)
def test_bad_data_exits_2_with_a_one_line_reason(tmp_path, capsys, content, message):
    data = tmp_path / "d.jsonl"
    if content is not None:
        data.write_text(content)
    assert ev.main(["gsm8k", "--data", str(data), "--runs", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_an_unknown_model_exits_2(tmp_path, capsys):
    data = write_data(tmp_path / "d.jsonl")
    args = ["gsm8k", "--data", str(data), "--models", "no-such-model", "--runs", str(tmp_path / "r")]
    assert ev.main(args) == 2
    assert "Unknown model 'no-such-model'" in capsys.readouterr().err


# -- systems, variants and resumable batched runs (scripted members: no torch) -------------------------


def no_generation(*args, **kwargs):
    raise AssertionError("a saved trace was generated again")


def forbid_runs(monkeypatch):
    monkeypatch.setattr(ev.Ensemble, "stream", no_generation)
    monkeypatch.setattr(ev.Ensemble, "stream_many", no_generation)


def test_default_systems_run_once_and_a_second_run_loads_every_trace(tmp_path, monkeypatch):
    members = [scripted("a", 2), scripted("b", 3)]
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl"))
    runs = tmp_path / "runs"
    first = ev.evaluate(members, problems, runs, config=CONFIG, batch_size=2)
    assert ev.systems_of(first) == [
        "single-a",
        "single-b",
        "ensemble",
        "ensemble-no-feedback",
        "ensemble-no-exit",
        "sc2-a",  # a is right on problem 0 (gold 2), b on none
    ]
    folders = sorted(d.name for d in runs.iterdir())
    assert folders == [
        "ensemble-no-exit@a+b",
        "ensemble-no-feedback@a+b",
        "ensemble@a+b",
        "sc-a",
        "single-a",
        "single-b",
    ]
    assert len(list(runs.rglob("*.json"))) == 2 * (2 + 3 + 2)
    assert not list(runs.rglob("*.part"))
    forbid_runs(monkeypatch)
    assert ev.evaluate(members, problems, runs, config=CONFIG, batch_size=2) == first


def test_systems_filter_runs_only_the_named_systems(tmp_path):
    members = [scripted("a", 2), scripted("b", 3)]
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl"))
    out = ev.evaluate(members, problems, tmp_path, config=CONFIG, systems=["single-b", "paper", "sc3-b"])
    assert ev.systems_of(out) == ["single-b", "paper", "sc3-b"]
    assert sorted(d.name for d in tmp_path.iterdir() if d.is_dir()) == ["paper@a+b", "sc-b", "single-b"]
    assert len(list((tmp_path / "sc-b").glob("gsm8k-0001-s*.json"))) == 3


def test_an_unknown_system_is_refused_with_the_valid_names():
    with pytest.raises(ConfigError, match=r"unknown system 'ensembel'.*single-a.*paper"):
        ev.plan_systems(["a", "b"], CONFIG, ["ensembel"])
    with pytest.raises(ConfigError, match="ensembles need"):
        ev.plan_systems(["a"], CONFIG, ["ensemble"])


def test_batches_group_pending_runs_of_the_same_members(tmp_path, monkeypatch):
    members = [scripted("a", 2), scripted("b", 3)]
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl", 3))
    sizes = []
    original = ev.Ensemble.stream_many

    def recording(self, prompts, config=None, batch_size=None):
        sizes.append((self.names, len(prompts), batch_size))
        return original(self, prompts, config, batch_size=batch_size)

    monkeypatch.setattr(ev.Ensemble, "stream_many", recording)
    systems = ["single-a", "ensemble", "ensemble-no-exit"]
    ev.evaluate(members, problems, tmp_path, config=CONFIG, systems=systems, batch_size=2)
    # One rolling batch per member set: every pending run of it, at most 2 under way at once.
    assert sizes == [(("a",), 3, 2), (("a", "b"), 6, 2)]


def test_a_trace_in_the_leads_layout_is_reused_as_it_is(tmp_path, monkeypatch):
    """The single traces under /work/runs/gsm8k were written by _run_or_load before this layout."""
    members = [scripted("a", 2), scripted("b", 3)]
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl", 1))
    base = EnsembleConfig(max_new_tokens=256)
    path = tmp_path / "single-a" / "gsm8k-0000.json"
    ev._run_or_load(ev.Ensemble([members[0]], base), ev.build_prompt(problems[0].question), base, path)
    forbid_runs(monkeypatch)
    [got] = ev.evaluate(members, problems, tmp_path, config=base, systems=["single-a"])
    assert got.correct and got.traces == (str(path),)


def test_a_trace_made_with_another_config_is_an_error_not_a_silent_mix(tmp_path):
    members = [scripted("a", 2)]
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl", 1))
    ev.evaluate(members, problems, tmp_path, config=CONFIG)
    with pytest.raises(ev.EvalError, match=r"max_new_tokens 12 vs 13"):
        ev.evaluate(members, problems, tmp_path, config=EnsembleConfig(max_new_tokens=13, segment_len=4))


def test_a_failing_run_is_recorded_counts_as_wrong_and_is_not_rerun(tmp_path, monkeypatch):
    """'paper' divides by the row sum, which refuses negative raw scores: that problem fails alone."""
    members = [scripted("a", 2, score=-5.0), scripted("b", 3, score=-5.0)]
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl"))
    out = ev.evaluate(members, problems, tmp_path, config=CONFIG, systems=["paper", "ensemble"], batch_size=2)
    paper = [o for o in out if o.system == "paper"]
    assert all(o.error and "sum" in o.error and not o.correct and o.predicted is None for o in paper)
    assert len(list((tmp_path / "paper@a+b").glob("*.error.json"))) == 2
    assert all(o.error is None and o.traces for o in out if o.system == "ensemble")
    forbid_runs(monkeypatch)
    assert ev.evaluate(members, problems, tmp_path, config=CONFIG, systems=["paper", "ensemble"]) == out


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("lr2:learning_rate=2", {"learning_rate": 2.0}),
        ("x:exit=false,feedback=on,max_rounds=none", {"exit": False, "feedback": True, "max_rounds": None}),
        ("x:max_rounds=7,normalization=minmax", {"max_rounds": 7, "normalization": "minmax"}),
        ("x:stop_strings=END|###", {"stop_strings": ("END", "###")}),
        ("same-as-default:", {}),
    ],
)  # fmt: skip
def test_variants_parse_values_by_the_fields_type(spec, expected):
    assert variants.parse_variant(spec)[1] == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("x:learnign_rate=2", r"unknown setting 'learnign_rate'; valid keys: segment_len, .*learning_rate"),
        ("x:exit=maybe", "exit='maybe': expected true or false"),
        ("x:normalization=softmax", "expected one of zsoftmax, minmax, sum, none"),
        ("x:segment_len=2.5", "segment_len='2.5': expected an integer"),
        ("x:max_rounds=many", "expected an integer or none"),
        ("x:exit", "'exit' is not key=value"),
        ("no-colon", "expected NAME:key=value"),
        ("Bad Name:exit=0", "lower-case letters"),
        ("paper:exit=0", "is a built-in system"),
        ("single-x:exit=0", "reserved"),
    ],
)
def test_bad_variants_name_the_key_and_the_valid_values(spec, message):
    with pytest.raises(ConfigError, match=message):
        variants.parse_variant(spec)


def test_a_variant_out_of_range_is_refused_by_the_config_itself():
    with pytest.raises(ConfigError, match="variant tiny: segment_len must be an integer in 1..256"):
        variants.build_configs(CONFIG, {"tiny": variants.parse_variant("tiny:segment_len=0")[1]})


def test_variants_load_from_json_and_toml_files(tmp_path):
    (tmp_path / "v.json").write_text('{"lr2": {"learning_rate": 2, "exit": false}}')
    (tmp_path / "v.toml").write_text("[lr2]\nlearning_rate = 2\nexit = false\n")
    expected = {"lr2": {"learning_rate": 2.0, "exit": False}}
    assert (
        variants.load_variants(tmp_path / "v.json") == variants.load_variants(tmp_path / "v.toml") == expected
    )
    (tmp_path / "bad.json").write_text('{"lr2": {"exit": "maybe"}}')
    with pytest.raises(ConfigError, match="bad.json: lr2: exit='maybe'"):
        variants.load_variants(tmp_path / "bad.json")


def test_toml_variants_fall_back_to_tomli_where_there_is_no_tomllib(tmp_path, monkeypatch):
    """Python 3.10 has no tomllib (`import tomllib` crashed there); tomli, declared for < 3.11, parses."""
    import tomllib

    (tmp_path / "v.toml").write_text("[lr2]\nlearning_rate = 2\n")
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on 3.10: `import tomllib` fails
    stand_in = types.ModuleType("tomli")  # tomli is the parser tomllib was taken from: the same API
    stand_in.loads = tomllib.loads  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tomli", stand_in)
    assert variants.toml_parser() is stand_in
    assert variants.load_variants(tmp_path / "v.toml") == {"lr2": {"learning_rate": 2.0}}
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(ConfigError, match="^reading a TOML variants file on Python < 3.11 needs tomli"):
        variants.load_variants(tmp_path / "v.toml")


def test_tomli_is_declared_for_the_pythons_without_tomllib():
    root = Path(__file__).resolve().parents[2]
    assert "tomli>=2,<3; python_version < '3.11'" in (root / "pyproject.toml").read_text()
    assert 'tomli==2.5.0; python_version < "3.11"' in (root / "requirements.txt").read_text()


def test_a_named_variant_runs_under_its_own_folder_with_its_config(tmp_path):
    members = [scripted("a", 2), scripted("b", 3)]
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl", 1))
    named = {"lr2": {"learning_rate": 2.0}}
    [got] = ev.evaluate(members, problems, tmp_path, config=CONFIG, systems=["lr2"], variants=named)
    assert got.system == "lr2" and got.traces[0].endswith("lr2@a+b/gsm8k-0000.json")
    assert (
        json.loads((tmp_path / "lr2@a+b" / "gsm8k-0000.json").read_text())["config"]["learning_rate"] == 2.0
    )


# -- statistics -----------------------------------------------------------------------------------------


def brute_force_mcnemar(b, c):
    """Σ of the binomial(b + c, 1/2) probabilities no larger than the observed one (two-sided)."""
    n = b + c
    pmf = [stats.math.comb(n, i) / 2**n for i in range(n + 1)]
    return min(1.0, sum(p for p in pmf if p <= pmf[b] * (1 + 1e-12)))


def test_mcnemar_matches_known_values_and_a_brute_force_binomial_sum():
    assert stats.mcnemar_exact(0, 5) == pytest.approx(0.0625)
    assert stats.mcnemar_exact(4, 4) == 1.0 and stats.mcnemar_exact(0, 0) == 1.0
    assert stats.mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    for b in range(13):
        for c in range(13):
            assert stats.mcnemar_exact(b, c) == pytest.approx(brute_force_mcnemar(b, c)), (b, c)
            assert stats.mcnemar_exact(b, c) == stats.mcnemar_exact(c, b)


def test_paired_counts_the_four_cells():
    a = [True, True, False, False, True, False]
    b = [True, False, True, False, False, False]
    got = stats.paired(a, b)
    assert (got["both_right"], got["only_a"], got["only_b"], got["both_wrong"]) == (1, 2, 1, 2)
    assert got["difference"] == pytest.approx(1 / 6) and got["p_value"] == 1.0
    assert got["ci_a"] == stats.wilson(3, 6)
    with pytest.raises(ValueError):
        stats.paired([True], [True, False])


LOOPING = (
    "Janet has 16 eggs. She eats 3 of them. She sells the rest at the market for $2 each. "
    "She sells the rest at the market for $2 each. She sells the rest at the market for $2 each. "
    "She sells the rest at the market for $2 each."
)
SOLUTION = (
    "Janet's ducks lay 16 eggs. She eats 3 and bakes with 4, so 16 - 3 - 4 = 9 eggs are left.\n"
    "She sells 9 eggs at $2 each: 9 * 2 = 18.\nSo she makes 9 * 2 = $18 every day.\nThe answer is 18."
)
RESTATING = (
    "1. Identify the number of bolts of blue fiber in the robe.\n2. Calculate the number of bolts of white "
    "fiber.\n\nStep 1: Identify the number of bolts of blue fiber in the robe.\nThe robe takes 2 bolts of "
    "blue fiber.\n\nStep 2: the number of bolts of blue fiber halved is 1.\nStep 3: Add the number of bolts "
    "of blue fiber and white fiber: 2 + 1 = 3.\n\nThus, the answer is 3."
)
QUESTION_LOOP = (
    "".join(
        f"{i}.  Josh buys a house for $80,000.  He puts in $50,000.  How much profit did he make?\n\n"
        for i in range(1, 5)
    )
    + "5.  Josh buys a house"
)
EARLY_ONLY = "Say it: one two three four five six. " * 3 + " ".join(f"word{i}" for i in range(40))
CODE = """def fib(n):
    if n == 0:
        return 0
    if n == 1:
        return 1
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b

print(fib(1))
print(fib(2))
print(fib(10))
"""


@pytest.mark.parametrize(
    ("text", "looped"),
    [
        (LOOPING, True),
        ("Step one. " + "The answer is 18. " * 3, True),  # a 4-word sentence, three times, at the end
        (EARLY_ONLY, False),  # repeated early, then it moves on
        (RESTATING, False),  # restates "the number of bolts of blue fiber" five times: not stuck
        (QUESTION_LOOP, True),  # the question again and again, list numbers between, cut off mid-copy
        (
            "So, 0.06 days.\n\n" + "The answer is 0.06.\n\n" * 3 + "The answer is 0.",  # cut off
            True,
        ),
        ("\n".join(str(4 * i) for i in range(40)), False),  # a counting list is not one block repeated
        ("and then " * 10, True),  # a loop inside one endless line
        ("Yes. Yes. Yes.", False),  # too short to call a loop
        ("长城是中国的象征。" * 5, True),
        (SOLUTION, False),  # repeats numbers and "9 * 2", never a 6-word n-gram three times
        (CODE, False),  # short lines repeat in code
        ("", False),
        ("The answer is 18.", False),
    ],
)
def test_the_loop_metric_flags_answers_that_end_in_repetition(text, looped):
    assert stats.ends_in_loop(text) is looped


def test_distinct_n_counts_unique_word_ngrams():
    assert stats.distinct_n("a b a b", 2) == pytest.approx(2 / 3)
    assert stats.distinct_n("A, b. A b!", 2) == pytest.approx(2 / 3)  # case and punctuation ignored
    assert stats.distinct_n("one", 2) is None
    metrics = stats.text_metrics([LOOPING, SOLUTION])
    assert metrics["loop_share"] == 0.5 and 0 < metrics["distinct_3"] < 1


# -- reports ----------------------------------------------------------------------------------------


def test_reports_write_the_page_tables_charts_and_cases_and_load_back(tmp_path):
    members = [scripted("a", 2), scripted("b", 3)]
    problems = ev.load_problems(write_data(tmp_path / "d.jsonl"))
    runs = tmp_path / "runs"
    systems = ["single-a", "single-b", "ensemble", "paper"]
    outcomes = ev.evaluate(members, problems, runs, config=CONFIG, systems=systems)
    document = eval_report.write_reports(
        outcomes, problems, tmp_path / "out", "RESULTS-tiny.v1", png=False, title="Tiny | study",
        command="python -m specfuse.eval gsm8k --data d.jsonl", config=CONFIG,
    )  # fmt: skip
    for suffix in (".md", ".csv", "-paired.csv", ".json", ".html", "-paired.html"):
        assert (tmp_path / "out" / f"RESULTS-tiny.v1{suffix}").is_file(), suffix  # a dot in a name survives
    page = (tmp_path / "out" / "RESULTS-tiny.v1.md").read_text()
    assert "python -m specfuse.eval gsm8k --data d.jsonl" in page and "## Paired comparisons" in page
    assert "Tiny \\| study" in page and "Loop share" in page
    rows = {r["system"]: r for r in document["summary"]}
    assert rows["single-a"]["accuracy"] == 0.5 and {"loop_share", "distinct_2", "distinct_3"} <= set(
        rows["ensemble"]
    )
    baselines = {(r["system"], r["baseline"]) for r in document["paired"]}
    assert ("ensemble", "single-a") in baselines and ("ensemble", "paper") in baselines
    assert set(document["failure_cases"]) == {"ensemble", "paper"}

    assert ev.load_outcomes(tmp_path / "out" / "RESULTS-tiny.v1.json") == outcomes
    from_runs = ev.load_outcomes(runs, tmp_path / "d.jsonl")
    assert sorted((o.system, o.problem, o.correct, o.gold) for o in from_runs) == sorted(
        (o.system, o.problem, o.correct, o.gold) for o in outcomes
    )
    both = ev.disagreements(outcomes, "single-a", "single-b")
    assert [(a.problem, b.problem) for a, b in both["only_a"]] == [("gsm8k-0000", "gsm8k-0000")]


def test_a_report_row_may_leave_out_the_run_figures_but_not_its_system(tmp_path):
    path = tmp_path / "RESULTS-x.json"
    row = {"system": "ensemble", "problem": "p1", "predicted": "7", "correct": True, "later": 1}
    path.write_text(json.dumps({"outcomes": [row | {"traces": "runs/ensemble/p1.json"}]}))
    (outcome,) = ev.load_outcomes(path)
    assert outcome == ev.Outcome("ensemble", "p1", "7", True, 0.0, 0, 0, ("runs/ensemble/p1.json",))
    path.write_text(json.dumps({"outcomes": [{"problem": "p1", "predicted": "7", "correct": True}]}))
    with pytest.raises(ev.EvalError, match="not an evaluation report: an outcome without a system"):
        ev.load_outcomes(path)


def test_failure_cases_list_both_directions_against_the_best_member(tmp_path):
    def outcome(system, problem, correct, trace="t.json"):
        return ev.Outcome(system, problem, "1" if correct else "2", correct, 1.0, 1, 1, (trace,))

    outcomes = [
        outcome("single-a", "p0", True),
        outcome("single-a", "p1", True),
        outcome("single-a", "p2", False),
        outcome("single-b", "p0", False),
        outcome("single-b", "p1", False),
        outcome("single-b", "p2", False),
        outcome("ensemble", "p0", False, str(tmp_path / "ensemble" / "p0.json")),
        outcome("ensemble", "p1", True),
        outcome("ensemble", "p2", True, str(tmp_path / "ensemble" / "p2.json")),
    ]
    cases = eval_report.failure_cases(outcomes)
    assert cases["best_member"] == "a"
    assert [c["problem"] for c in cases["wrong_best_right"]] == ["p0"]
    assert [c["problem"] for c in cases["right_best_wrong"]] == ["p2"]
    assert cases["wrong_best_right"][0]["system_trace"].endswith("p0.json")


# -- end to end on tiny models ------------------------------------------------------------------------


def tiny_cli(monkeypatch, tiny_members):
    import specfuse.eval.cli

    monkeypatch.setattr(specfuse.eval.cli, "parse_models", lambda values, hub: [m.name for m in tiny_members])
    monkeypatch.setattr(ev, "_load", lambda names, dtype: list(tiny_members))


def test_gsm8k_end_to_end_on_tiny_members_in_batches_of_two(tiny_members, tmp_path, monkeypatch, capsys):
    tiny_cli(monkeypatch, tiny_members)
    data = write_data(tmp_path / "d.jsonl", 3)
    args = ["gsm8k", "--data", str(data), "--limit", "3", "--max-new-tokens", "12", "--segment-len", "4"]
    args += ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "bench"), "--no-png"]
    args += [
        "--batch-size",
        "2",
        "--systems",
        "single-llama-bytes,ensemble,lr2",
        "--variant",
        "lr2:learning_rate=2",
    ]
    assert ev.main(args) == 0, capsys.readouterr().err
    assert "ensemble" in capsys.readouterr().out
    mix = "llama-bytes+qwen-merges+gemma-meta"
    assert len(list((tmp_path / "runs" / f"lr2@{mix}").glob("*.json"))) == 3
    page = (tmp_path / "bench" / "gsm8k.md").read_text()
    assert "--variant lr2:learning_rate=2" in page and "lr2" in page
    outcomes = ev.load_outcomes(tmp_path / "bench" / "gsm8k.json")
    assert len(outcomes) == 9 and all(o.gold is not None for o in outcomes)


def test_open_ended_mode_reports_loops_without_accuracy(tiny_members, tmp_path, monkeypatch):
    tiny_cli(monkeypatch, tiny_members)
    prompts = tmp_path / "p.txt"
    prompts.write_text("Say hello.\n\n用一句话介绍长城。\n")
    args = ["open-ended", "--prompts", str(prompts), "--max-new-tokens", "8", "--segment-len", "4"]
    args += ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "bench"), "--no-png"]
    args += ["--systems", "ensemble", "--batch-size", "2"]
    assert ev.main(args) == 0
    document = json.loads((tmp_path / "bench" / "open.json").read_text())
    [row] = document["summary"]
    assert row["problems"] == 2 and "accuracy" not in row and "loop_share" in row
    assert document["paired"] == [] and "## Answers" in (tmp_path / "bench" / "open.md").read_text()


def test_throughput_runs_both_ways_and_reports_the_ratio(tiny_members):
    problems = ev.open_problems()[:2]
    config = EnsembleConfig(max_new_tokens=8, segment_len=4)
    report = ev.throughput(tiny_members[:2], problems, config, batch_size=2, repeats=2)
    assert report["problems"] == 2 and report["stream_per_hour"] > 0 and report["batched_per_hour"] > 0
    assert report["ratio"] == pytest.approx(report["batched_per_hour"] / report["stream_per_hour"])
    assert len(report["load_averages"]) == 1 + 2 * 2 and report["same_answers"] <= 2
    assert "problems/hour" in ev.format_throughput(report)


def test_a_singles_trace_stays_valid_when_only_ensemble_settings_change():
    """Singles are shared by every study: a new ensemble default must not invalidate them, while a
    new budget must."""
    from specfuse.eval.runs import _differences

    old = EnsembleConfig(max_new_tokens=256, score="logit", repeat_penalty=0.0, exit_min_active=2)
    new = EnsembleConfig(max_new_tokens=256)
    assert _differences(old, new, solo=True) == []
    assert _differences(old, new) != []
    assert _differences(old, EnsembleConfig(max_new_tokens=128), solo=True) == ["max_new_tokens 256 vs 128"]


def test_a_variant_can_set_starting_weights():
    name, settings = variants.parse_variant("trusted:initial_weights=0.15|0.15|0.7,prior=uniform")
    assert name == "trusted" and settings == {"initial_weights": (0.15, 0.15, 0.7), "prior": "uniform"}
    with pytest.raises(ConfigError, match="numbers separated by"):
        variants.parse_variant("bad:initial_weights=a|b")
