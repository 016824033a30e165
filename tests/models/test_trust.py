"""Trust from evidence: the rule, the file, the command that writes it, and a run that starts from it."""

from __future__ import annotations

import json

import pytest

import specfuse.eval.cli as ev
from specfuse import feedback
from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError
from specfuse.models import catalogue
from specfuse.models import trust as trust_file
from specfuse.models.trust import Evidence

from ..scripted import ScriptedMember


def report(path, rows):
    """A minimal evaluation report: its outcomes (system, problem, correct)."""
    outcomes = [{"system": s, "problem": p, "predicted": None, "correct": c} for s, p, c in rows]
    path.write_text(json.dumps({"outcomes": outcomes}))
    return path


def test_trust_is_the_mean_accuracy_over_tasks_floored():
    evidence = [
        Evidence("q", "gsm8k", 30, 100, "a"),
        Evidence("q", "ifeval", 10, 100, "b"),
        Evidence("s", "gsm8k", 0, 100, "a"),
    ]
    assert trust_file.compute(evidence) == {"q": pytest.approx(0.2), "s": trust_file.MIN_TRUST}


def test_the_command_reads_singles_from_reports_counts_each_problem_once_and_writes_it(tmp_path, capsys):
    first = report(
        tmp_path / "a.json",
        [
            ("single-q", "gsm8k-0000", True),
            ("single-q", "gsm8k-0001", False),
            ("ensemble", "gsm8k-0000", True),
        ],
    )
    second = report(
        tmp_path / "b.json",
        [
            ("single-q", "gsm8k-0001", True),
            ("single-s", "ifeval-0000", True),
            ("single-q", "ifeval-0000", False),
        ],
    )
    out = tmp_path / "trust.json"
    assert ev.main(["trust", str(first), str(second), "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    counts = {(e["member"], e["task"]): (e["correct"], e["problems"]) for e in document["evidence"]}
    assert counts == {("q", "gsm8k"): (1, 2), ("s", "ifeval"): (1, 1), ("q", "ifeval"): (0, 1)}
    # q: 1/2 on gsm8k, 0/1 on ifeval; the floor applies to the mean, not to each task
    assert document["trust"] == {"q": pytest.approx((0.5 + 0.0) / 2), "s": 1.0}
    assert document["command"].startswith("python -m specfuse.eval trust") and document["rule"]
    assert trust_file.load_trust(out) == document["trust"]
    assert "trust q" in capsys.readouterr().out
    nothing = report(tmp_path / "c.json", [("ensemble", "gsm8k-0000", True)])
    assert ev.main(["trust", str(nothing), "--out", str(tmp_path / "x.json")]) == 2
    assert "no single-<member> systems" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "cannot read the trust file"),
        ('{"schema": "other", "version": 1}', "is not a trust file"),
        ('{"schema": "specfuse.trust", "version": 1, "trust": {"a": 1.5}}', r"numbers in \(0, 1\]"),
        ('{"schema": "specfuse.trust", "version": 1, "trust": {"a": true}}', r"numbers in \(0, 1\]"),
        ('{"schema": "specfuse.trust", "version": 1, "trust": ["a"]}', "must map member names"),
    ],
)
def test_a_bad_trust_file_is_refused_with_a_reason(tmp_path, content, message):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        trust_file.load_trust(path)
    with pytest.raises(ConfigError, match="cannot read"):
        trust_file.load_trust(tmp_path / "missing.json")


def test_the_catalogues_trust_is_the_packaged_files_output_of_the_command():
    document = json.loads(trust_file.PACKAGED.read_text())
    assert document["command"].startswith("python -m specfuse.eval trust ")
    evidence = [Evidence(**e) for e in document["evidence"]]
    assert trust_file.compute(evidence) == pytest.approx(document["trust"])  # the rule made these numbers
    for name in catalogue.DEFAULT_MEMBERS:
        assert catalogue.CATALOGUE[name].trust == pytest.approx(document["trust"][name])
    assert {e.task for e in evidence} == {"gsm8k", "ifeval"}  # evidence from both development sets


def test_a_run_starts_from_the_files_trust_and_a_member_without_evidence_gets_the_mean(tmp_path):
    members = [ScriptedMember(n, [("done", True)], lambda text: 1.0) for n in ("a", "b", "c")]
    path = tmp_path / "trust.json"
    trust_file.write_trust(path, [Evidence("a", "gsm8k", 6, 10, "r"), Evidence("b", "gsm8k", 2, 10, "r")])
    trust_file.apply_trust(members, trust_file.load_trust(path))
    assert [m.trust for m in members] == [0.6, 0.2, None]
    rnd = next(iter(Ensemble(members).stream("Q?", EnsembleConfig(max_new_tokens=8))))
    assert rnd.weights_before == pytest.approx((0.6 / 1.2, 0.2 / 1.2, 0.4 / 1.2))
    assert list(rnd.weights_before) == pytest.approx(feedback.trust_weights([0.6, 0.2, None]))


def test_an_evaluation_refuses_traces_run_from_other_trust(tmp_path):
    """Trust is not a config setting, so the runs check the starting weights: new trust, new runs."""
    from specfuse.eval.outcomes import EvalError
    from specfuse.eval.problems import Problem
    from specfuse.eval.runs import ensemble_system, run_systems

    members = [ScriptedMember(n, [("The answer is 4.", True)], lambda text: 1.0) for n in ("a", "b")]
    members[0].trust, members[1].trust = 0.6, 0.2
    config = EnsembleConfig(max_new_tokens=16)
    systems = [ensemble_system("ensemble", ["a", "b"], config)]
    problems = [Problem("gsm8k-0000", "2 + 2?", "4")]
    first = run_systems(members, systems, problems, tmp_path)
    assert first[0].correct
    again = run_systems(members, systems, problems, tmp_path)  # same trust: loaded, not re-run
    assert again[0].traces == first[0].traces and members[0].calls.count(("start", problems[0].prompt)) == 1
    members[1].trust = 0.6  # a new trust file: 0.50 / 0.50 instead of 0.75 / 0.25
    stale = r"started from weights 0\.750, 0\.250, but the trust in use now gives 0\.500"
    with pytest.raises(EvalError, match=stale):
        run_systems(members, systems, problems, tmp_path)
    uniform = [ensemble_system("ensemble", ["a", "b"], EnsembleConfig(max_new_tokens=16, prior="uniform"))]
    with pytest.raises(EvalError, match="another config"):  # a config change is caught as before
        run_systems(members, uniform, problems, tmp_path)
