"""Trust from evidence: each member's say before round 1 (prior="trust"), computed from how well it
does *alone* on development sets, and kept in a small JSON file that the CLI, the app, the evaluation
and the server read (`--trust FILE`); the catalogue's own values are such a file (trust.json here).

The rule (RULE, also written into every file):
- a member's trust is its accuracy alone (correct / problems) averaged over the tasks the file has
  evidence for it on, floored at MIN_TRUST so that no member starts without any say;
- a run's starting weights are its members' trusts divided by their sum (feedback.trust_weights);
- a member the file does not name (a hub id, a folder, a served model) gets the mean trust of the
  run's members that it does name: neither favoured nor held back. With no evidence for any member
  of the mix, the start is uniform.

`python -m specfuse.eval trust REPORT.json … --out FILE` writes a file from evaluation reports (their
single-<member> systems); stdlib only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

SCHEMA = "specfuse.trust"
VERSION = 1
MIN_TRUST = 0.01
MAX_FILE_BYTES = 1024 * 1024
RULE = (
    "trust = the member's accuracy alone (correct / problems), averaged over the tasks with evidence "
    f"for it, floored at {MIN_TRUST}; starting weights = trust / sum over the run's members; a member "
    "without evidence gets the mean trust of those with it"
)
CLI_HELP = (  # --trust in every command that loads members
    "starting trust from evidence: a file written by `python -m specfuse.eval trust` "
    "(default: the catalogue's; docs/evaluation.md)"
)
PACKAGED = Path(__file__).with_name("trust.json")  # the catalogue's trust, made by the command it names


@dataclass(frozen=True)
class Evidence:
    """One member's record alone on one task: how many problems, how many right, from which report."""

    member: str
    task: str  # "gsm8k", "ifeval", …: the problems' id prefix
    correct: int
    problems: int
    source: str  # the report it was read from

    @property
    def accuracy(self) -> float:
        return self.correct / self.problems if self.problems else 0.0


def compute(evidence: Sequence[Evidence]) -> dict[str, float]:
    """Member → trust, by RULE."""
    by_member: dict[str, list[float]] = {}
    for e in evidence:
        by_member.setdefault(e.member, []).append(e.accuracy)
    return {m: max(MIN_TRUST, sum(a) / len(a)) for m, a in by_member.items()}


def document(evidence: Sequence[Evidence], command: str | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "rule": RULE,
        "command": command,
        "trust": compute(evidence),
        "evidence": [asdict(e) for e in evidence],
    }


def write_trust(
    path: str | os.PathLike[str], evidence: Sequence[Evidence], command: str | None = None
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(document(evidence, command), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return path


def load_trust(path: str | os.PathLike[str] = PACKAGED) -> dict[str, float]:
    """Member name → trust from a trust file; a clear ConfigError for anything else."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path.name}: a trust file is at most {MAX_FILE_BYTES} bytes")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"cannot read the trust file {str(path)!r}: {e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
        raise ConfigError(f"{path.name} is not a trust file (schema {SCHEMA!r}, version {VERSION})")
    table = doc.get("trust")
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1
        for k, v in table.items()
    ):
        raise ConfigError(f"{path.name}: 'trust' must map member names to numbers in (0, 1]")
    return {k: float(v) for k, v in table.items()}


def apply_trust(members: Sequence[Any], table: Mapping[str, float]) -> None:
    """Give each member its trust from `table` (by name); members it does not name keep none, and
    the engine gives them the mean of the others' (feedback.trust_weights)."""
    for member in members:
        member.trust = table.get(member.name)
