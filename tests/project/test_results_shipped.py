"""The study the app ships in results/eval/ (results/README.md): found from the folder by its name
and its page beside it, and every failure case it names replays from a copy in the tree."""

from __future__ import annotations

from pathlib import Path

from studio import failures

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "results/eval/gsm8k.json"


def test_the_folder_opens_the_shipped_gsm8k_study_and_each_named_copy_is_in_the_tree(tmp_path, monkeypatch):
    # A fresh clone writes every file at once: the largest report beside its page is the study, and
    # the paired comparisons (JSON without a page) are not taken for reports. A copy of the folder,
    # so that the times are a clone's whatever this checkout's edits did to them.
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    for path in (ROOT / "results/eval").glob("*.*"):
        (eval_dir / path.name).write_bytes(path.read_bytes())
    (eval_dir / "gsm8k-cases").symlink_to(ROOT / "results/eval/gsm8k-cases")
    monkeypatch.chdir(ROOT)
    run = failures.load_eval(eval_dir)
    study = eval_dir / STUDY.name
    assert run.report == study
    assert run.ensemble() == "guarded" and run.best_member == "qwen2.5-coder-0.5b"
    assert len(run.problems()) == 150 and len(run.copies) == 24
    missing = [copy for copy in run.copies.values() if not (ROOT / copy).is_file()]
    assert not missing, missing
    monkeypatch.chdir(ROOT / "results")  # resolved from the report's folder, not the working one
    case = next(o for o in run.outcomes if (o.system, o.problem) in run.copies)
    assert run.trace(case) is not None and run.trace(case).is_file()
