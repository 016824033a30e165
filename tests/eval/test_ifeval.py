"""IFEval in the evaluation: the packaged rows, the real checker (with NLTK's punkt tables from
llama-index-core), the paper's four accuracies, and the command end to end."""

from __future__ import annotations

import json

import pytest

import specfuse.eval.cli as ev
from specfuse.eval import ifeval
from specfuse.eval.outcomes import load_outcomes
from specfuse.eval.problems import DataError, Outcome, Problem, parse_rows

from ..repo_tools import load_tool
from ..scripted import ScriptedMember


def problem(*instructions: tuple[str, dict], prompt: str = "Write something.") -> Problem:
    pairs = tuple((i, json.dumps(k, sort_keys=True)) for i, k in instructions)
    return Problem("ifeval-9999", prompt, "gold", raw=True, instructions=pairs)


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


ROWS = [
    {
        "key": 1,
        "prompt": "Answer without any commas.",
        "instruction_id_list": ["punctuation:no_comma"],
        "kwargs": [{}],
    },
    {
        "key": 2,
        "prompt": "Answer in capital letters; end with 'Is there anything else I can help with?'.",
        "instruction_id_list": ["change_case:english_capital", "startend:end_checker"],
        "kwargs": [{}, {"end_phrase": "Is there anything else I can help with?"}],
    },
]


# -- the data ------------------------------------------------------------------------------------------


def test_the_packaged_file_has_541_rows_and_the_default_takes_the_300_development_rows():
    dev = ifeval.load_ifeval()
    assert len(dev) == 300 and dev[0].id == "ifeval-0000" and dev[-1].id == "ifeval-0299"
    confirm = ifeval.load_ifeval(rows=ifeval.CONFIRM_ROWS)
    assert len(confirm) == 241 and confirm[0].id == "ifeval-0300" and confirm[-1].id == "ifeval-0540"
    assert all(p.raw and p.instructions for p in dev + confirm)
    assert not {p.question for p in dev} & {p.question for p in confirm}


@pytest.mark.parametrize(
    "text, message", [("300", "FIRST:END"), ("5:5", "FIRST < END"), ("a:b", "FIRST:END"), ("-1:4", "0 ≤")]
)
def test_bad_rows_are_refused_with_the_expected_form(text, message):
    with pytest.raises(DataError, match=message):
        parse_rows(text)


def test_rows_beyond_the_file_and_malformed_rows_name_the_file_and_line(tmp_path):
    path = write_rows(tmp_path / "if.jsonl", ROWS)
    assert [p.id for p in ifeval.load_ifeval(path, range(0, 2))] == ["ifeval-0000", "ifeval-0001"]
    with pytest.raises(DataError, match="has 2 rows"):
        ifeval.load_ifeval(path, range(0, 3))
    unknown = dict(ROWS[0], instruction_id_list=["no:such_rule"])
    with pytest.raises(DataError, match=r"if.jsonl:2: .*unknown instruction ids \['no:such_rule'\]"):
        ifeval.load_ifeval(write_rows(path, [ROWS[0], unknown]), range(0, 2))
    uneven = dict(ROWS[1], kwargs=[{}])
    with pytest.raises(DataError, match="equal length"):
        ifeval.load_ifeval(write_rows(path, [uneven]), range(0, 1))
    with pytest.raises(DataError, match="no IFEval file"):
        ifeval.load_ifeval(tmp_path / "missing.jsonl", range(0, 1))


# -- the checker ---------------------------------------------------------------------------------------


def test_strict_and_loose_differ_as_the_paper_defines_them():
    no_comma = problem(("punctuation:no_comma", {}))
    assert ifeval.grade(no_comma, "Plain words only.") == ((True,), (True,))
    # loose also reads the answer without its first line (a preamble such as "Sure, here it is:")
    assert ifeval.grade(no_comma, "Sure, here it is:\nPlain words only.") == ((False,), (True,))
    assert ifeval.grade(no_comma, "One, two.\nThree, four.\nFive, six.") == ((False,), (False,))


def test_sentences_are_counted_with_nltks_real_punkt_tables_not_a_naive_split():
    counted = problem(("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"}))
    # Punkt knows "Dr." and "Mr." are abbreviations: one sentence here (a split on ". " would see three)
    assert ifeval.grade(counted, "Dr. Smith met Mr. Jones at noon.") == ((False,), (False,))
    assert ifeval.grade(counted, "Dr. Smith met Mr. Jones. They talked.") == ((True,), (True,))


def test_language_detection_is_real_and_repeatable():
    french = problem(("language:response_language", {"language": "fr"}))
    text = "Le chat dort sur le canapé pendant que la pluie tombe doucement sur la ville."
    assert ifeval.grade(french, text) == ((True,), (True,))
    assert ifeval.grade(french, "The cat sleeps on the sofa while the rain falls on the town.")[0] == (False,)
    assert {ifeval.grade(french, "Bonjour tout le monde, merci.") for _ in range(5)} == {((True,), (True,))}


def test_a_row_the_checker_fills_in_at_random_grades_the_same_every_time():
    """Row 19 asks for the letter '#' at least 4 times: the checker picks a random letter instead;
    the grade is seeded by the problem, so it is the same on every call and in every process."""
    row = ifeval.load_ifeval(rows=range(19, 20))[0]
    assert (
        dict(row.instructions)["keywords:letter_frequency"]
        == '{"let_frequency": 4, "let_relation": "at least", "letter": "#"}'
    )
    answer = "a quick brown fox jumps over the lazy dog, again and again and again."
    grades = {ifeval.grade(row, answer) for _ in range(8)}
    assert len(grades) == 1
    import random

    random.seed(1)
    expected = random.random()
    random.seed(1)
    ifeval.grade(row, answer)
    assert random.random() == expected  # the caller's random state is left as it was


def test_an_empty_answer_follows_nothing():
    assert ifeval.grade(problem(("punctuation:no_comma", {})), "  ") == ((False,), (False,))


def test_the_four_accuracies_count_prompts_and_instructions():
    def outcome(strict, loose):
        return Outcome("s", "p", None, all(strict), 0.0, 0, 0, (), followed=strict, followed_loose=loose)

    outcomes = [outcome((True, True), (True, True)), outcome((True, False, False), (True, True, False))]
    assert ifeval.metrics(outcomes) == {
        "prompt_strict": 0.5,
        "prompt_loose": 0.5,
        "instruction_strict": 3 / 5,
        "instruction_loose": 4 / 5,
    }


def test_by_group_counts_instructions_kept_per_group_and_system():
    a = Problem("ifeval-0000", "x", "g", raw=True, instructions=(("punctuation:no_comma", "{}"),))
    b = Problem(
        "ifeval-0001",
        "y",
        "g",
        raw=True,
        instructions=(("change_case:english_capital", "{}"), ("punctuation:no_comma", "{}")),
    )

    def outcome(system, problem, followed):
        return Outcome(system, problem.id, None, all(followed), 0.0, 0, 0, (), followed=followed)

    outcomes = [
        outcome("single-m", a, (True,)),
        outcome("single-m", b, (False, True)),
        outcome("ensemble", a, (False,)),
        outcome("ensemble", b, (True, False)),
    ]
    assert ifeval.by_group(outcomes, [a, b]) == [
        {"instruction group": "change_case", "instruction count": 1, "single-m": 0.0, "ensemble": 1.0},
        {"instruction group": "punctuation", "instruction count": 2, "single-m": 1.0, "ensemble": 0.0},
    ]
    # a problem no outcome covers adds nothing; a system that met no instruction of a group gets None
    only_a = ifeval.by_group([outcome("single-m", a, (True,))], [a, b])
    assert only_a == [{"instruction group": "punctuation", "instruction count": 1, "single-m": 1.0}]


# -- the command ---------------------------------------------------------------------------------------


def scripted(name: str, text: str) -> ScriptedMember:
    return ScriptedMember(name, [(text, True)], lambda candidate: float(len(candidate)))


def test_ifeval_end_to_end_grades_each_system_and_writes_the_four_accuracies(tmp_path, monkeypatch, capsys):
    # "loud" follows both of row 2's rules and breaks no rule of row 1; "quiet" writes commas.
    loud = scripted("loud", "HELLO THERE MY FRIEND. IS THERE ANYTHING ELSE I CAN HELP WITH?")
    quiet = scripted("quiet", "hello, there")
    import specfuse.eval.cli

    monkeypatch.setattr(specfuse.eval.cli, "parse_models", lambda values, hub: ["loud", "quiet"])
    monkeypatch.setattr(ev, "_load", lambda names, dtype: [loud, quiet])
    data = write_rows(tmp_path / "if.jsonl", ROWS)
    args = ["ifeval", "--data", str(data), "--rows", "0:2", "--runs", str(tmp_path / "runs")]
    args += ["--out", str(tmp_path / "bench"), "--no-png", "--systems", "single-loud,single-quiet,ensemble"]
    assert ev.main(args) == 0, capsys.readouterr().err
    document = json.loads((tmp_path / "bench" / "ifeval.json").read_text())
    rows = {r["system"]: r for r in document["summary"]}
    assert rows["single-loud"]["prompt_strict"] == 1.0 and rows["single-loud"]["instruction_strict"] == 1.0
    assert rows["single-quiet"]["prompt_strict"] == 0.0
    assert rows["single-quiet"]["instruction_strict"] == 0.0  # a comma (row 1); lower case, no end (row 2)
    assert all(set(ifeval.METRICS) <= set(r) for r in rows.values())
    assert rows["single-loud"]["accuracy"] == rows["single-loud"]["prompt_strict"]
    assert {(p["system"], p["baseline"]) for p in document["paired"]} >= {("ensemble", "single-loud")}
    groups = {r["instruction group"]: r for r in document["by_group"]}
    assert set(groups) == {"punctuation", "change_case", "startend"}
    assert groups["startend"]["single-loud"] == 1.0 and groups["startend"]["single-quiet"] == 0.0
    assert groups["punctuation"]["instruction count"] == 1
    page = (tmp_path / "bench" / "ifeval.md").read_text()
    assert "## By instruction group" in page and "| change_case | 1 |" in page
    assert (tmp_path / "bench" / "ifeval-groups.csv").exists()
    assert (tmp_path / "bench" / "ifeval-groups.html").exists()
    # read back from the report and from the runs folder: the same verdicts per instruction
    again = {(o.system, o.problem): o.followed for o in load_outcomes(tmp_path / "bench" / "ifeval.json")}
    assert again[("single-loud", "ifeval-0001")] == (True, True)
    runs = {(o.system, o.problem): o.followed for o in load_outcomes(tmp_path / "runs", data)}
    assert runs[("single-quiet", "ifeval-0001")] == (False, False)
    # tools/paired_runs.py pairs two systems' runs and splits them by instruction group as well
    tool = load_tool("paired_runs")
    pair = tool.compare(f"{tmp_path / 'runs'}:single-loud", f"{tmp_path / 'runs'}:single-quiet", str(data))
    assert (pair["only_a"], pair["only_b"]) == (2, 0)
    assert {r["instruction group"]: (r["a"], r["b"]) for r in pair["by_group"]} == {
        "change_case": (1.0, 0.0),
        "punctuation": (1.0, 0.0),
        "startend": (1.0, 0.0),
    }


def test_self_consistency_is_refused_for_ifeval(tmp_path, monkeypatch, capsys):
    import specfuse.eval.cli

    monkeypatch.setattr(specfuse.eval.cli, "parse_models", lambda values, hub: ["loud"])
    data = write_rows(tmp_path / "if.jsonl", ROWS)
    args = ["ifeval", "--data", str(data), "--rows", "0:1", "--systems", "sc3-loud", "--runs", str(tmp_path)]
    assert ev.main(args) == 2
    assert "IFEval has no answer to vote on" in capsys.readouterr().err


def test_ifeval_runs_on_tiny_models(tiny_members, tmp_path, monkeypatch):
    import specfuse.eval.cli

    monkeypatch.setattr(specfuse.eval.cli, "parse_models", lambda values, hub: [m.name for m in tiny_members])
    monkeypatch.setattr(ev, "_load", lambda names, dtype: list(tiny_members))
    args = ["ifeval", "--rows", "0:2", "--max-new-tokens", "8", "--segment-len", "4", "--batch-size", "2"]
    args += ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "bench"), "--no-png"]
    args += ["--systems", f"single-{tiny_members[0].name},ensemble"]
    assert ev.main(args) == 0
    document = json.loads((tmp_path / "bench" / "ifeval.json").read_text())
    assert [r["problems"] for r in document["summary"]] == [2, 2]
    for o in document["outcomes"]:
        assert len(o["followed"]) == len(o["followed_loose"]) >= 1 and o["predicted"].endswith("followed")
