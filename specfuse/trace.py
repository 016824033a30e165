"""The trace: one run (prompt, members, config, rounds, result) as one versioned JSON document.

Writes with dump_trace / save_trace and reads back with load_trace / parse_trace, validating every
field so that a malformed, oversized or foreign file gets a TraceError, never a crash. Stdlib only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .config import EnsembleConfig
from .errors import ConfigError, TraceError
from .records import STOP_REASONS, Candidate, ExitEvent, MemberTiming, Result, Round, summarize

SCHEMA = "specfuse.trace"
VERSION = 1
MAX_TRACE_BYTES = 20 * 1024 * 1024  # a 1,000-round trace of 8 members is a few MB


@dataclass(frozen=True)
class Trace:
    prompt: str
    members: tuple[str, ...]
    config: EnsembleConfig
    rounds: tuple[Round, ...]

    @property
    def result(self) -> Result:
        return summarize(self.rounds)


def dump_trace(trace: Trace) -> str:
    """The trace as JSON text (tuples become lists)."""
    document = {
        "schema": SCHEMA,
        "version": VERSION,
        "prompt": trace.prompt,
        "members": list(trace.members),
        "config": trace.config.to_dict(),
        "rounds": [asdict(r) for r in trace.rounds],
        "result": asdict(trace.result) if trace.rounds else None,
    }
    return json.dumps(document, ensure_ascii=False, indent=1, allow_nan=False)


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write atomically: a crash halfway never leaves half a trace under the final name."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(dump_trace(trace), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_trace(path: str | os.PathLike[str]) -> Trace:
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise TraceError(f"cannot read trace {str(path)!r}: {e.strerror or e}") from e
    if size > MAX_TRACE_BYTES:
        raise TraceError(f"trace {path.name!r} is {size:,} bytes; the limit is {MAX_TRACE_BYTES:,}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read trace {path.name!r}: {e}") from e
    return parse_trace(text)


def parse_trace(text: str | bytes) -> Trace:
    """Validate and rebuild a trace from JSON text."""
    if len(text) > MAX_TRACE_BYTES:
        raise TraceError(f"the trace is {len(text):,} bytes; the limit is {MAX_TRACE_BYTES:,}")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TraceError(f"not a JSON document: {e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise TraceError(f'not a specfuse trace (expected "schema": "{SCHEMA}")')
    if doc.get("version") != VERSION:
        raise TraceError(f"trace version {doc.get('version')!r} is not supported; this build reads {VERSION}")
    prompt = _typed(doc, "prompt", str, "trace")
    members = tuple(_str_list(doc, "members", "trace"))
    try:
        config = EnsembleConfig.from_dict(_typed(doc, "config", dict, "trace"))
    except (ConfigError, TypeError) as e:
        raise TraceError(f"trace config is invalid: {e}") from e
    rounds = tuple(_round(r, i, members) for i, r in enumerate(_typed(doc, "rounds", list, "trace")))
    answer = ""
    for r in rounds:
        answer += r.winner.text
        if r.text != answer:
            raise TraceError(
                f"rounds[{r.k - 1}]: the answer is not the concatenation of the chosen candidates"
            )
    return Trace(prompt, members, config, rounds)


# -- validation helpers: each names the place it looked at ----------------------------------------


def _typed(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise TraceError(f"{where}: missing {key!r}")
    value = obj[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise TraceError(f"{where}.{key}: expected a number, got {value!r}")
    if not isinstance(value, kind):
        raise TraceError(f"{where}.{key}: expected {_kind_name(kind)}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceError(f"{where}.{key}: not a finite number")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def _str_list(obj: Any, key: str, where: str) -> list[str]:
    values = _typed(obj, key, list, where)
    if not all(isinstance(v, str) for v in values):
        raise TraceError(f"{where}.{key}: expected a list of strings")
    return values


def _floats(obj: Any, key: str, where: str, length: int | None = None) -> tuple[float, ...]:
    values = _typed(obj, key, list, where)
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise TraceError(f"{where}.{key}: expected finite numbers")
        out.append(float(v))
    if length is not None and len(out) != length:
        raise TraceError(f"{where}.{key}: expected {length} values, got {len(out)}")
    return tuple(out)


def _matrix(obj: Any, key: str, where: str, rows: int, cols: int) -> tuple[tuple[float, ...], ...]:
    values = _typed(obj, key, list, where)
    if len(values) != rows:
        raise TraceError(f"{where}.{key}: expected {rows} rows, got {len(values)}")
    return tuple(_floats({"row": row}, "row", f"{where}.{key}[{i}]", cols) for i, row in enumerate(values))


NUMBER = (int, float)


def _record(cls: type, obj: Any, where: str, types: dict[str, Any]) -> Any:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected an object")
    names = {f.name for f in fields(cls)}
    if set(obj) - names:
        raise TraceError(f"{where}: unknown keys {sorted(set(obj) - names)}")
    return cls(**{name: _coerce(_typed(obj, name, kind, where), kind) for name, kind in types.items()})


def _coerce(value: Any, kind: Any) -> Any:
    return float(value) if kind == NUMBER else value


def _round(obj: Any, i: int, members: Sequence[str]) -> Round:
    where = f"rounds[{i}]"
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected an object")
    candidates = tuple(
        _record(
            Candidate,
            c,
            f"{where}.candidates[{j}]",
            {"member": str, "text": str, "num_tokens": int, "final": bool, "seconds": NUMBER},
        )
        for j, c in enumerate(_typed(obj, "candidates", list, where))
    )
    exits = tuple(
        _record(
            ExitEvent,
            e,
            f"{where}.exits[{j}]",
            {"member": str, "k": int, "keep_probability": NUMBER, "threshold": NUMBER, "reason": str},
        )
        for j, e in enumerate(_typed(obj, "exits", list, where))
    )
    timings = tuple(
        _record(
            MemberTiming,
            t,
            f"{where}.timings[{j}]",
            {"member": str, "draft_s": NUMBER, "verify_s": NUMBER, "accept_s": NUMBER},
        )
        for j, t in enumerate(_typed(obj, "timings", list, where))
    )
    round_members = tuple(_str_list(obj, "members", where))
    active = tuple(_str_list(obj, "active", where))
    verifiers = tuple(_str_list(obj, "verifiers", where))
    n, c, v = len(round_members), len(candidates), len(verifiers)
    if (
        round_members != tuple(members)
        or not set(active) <= set(members)
        or not set(verifiers) <= set(members)
    ):
        raise TraceError(f"{where}: members do not match the trace's members")
    if c == 0 or len(active) != c:
        raise TraceError(f"{where}: expected one candidate per active member")
    chosen = _typed(obj, "chosen", int, where)
    if not 0 <= chosen < c:
        raise TraceError(f"{where}.chosen: {chosen} is not a candidate index")
    stop = obj.get("stop_reason")
    if stop is not None and stop not in STOP_REASONS:
        raise TraceError(f"{where}.stop_reason: {stop!r} is not one of {', '.join(STOP_REASONS)}")
    known = {f.name for f in fields(Round)}
    if set(obj) - known:
        raise TraceError(f"{where}: unknown keys {sorted(set(obj) - known)}")
    return Round(
        k=_typed(obj, "k", int, where),
        members=round_members,
        active=active,
        verifiers=verifiers,
        candidates=candidates,
        raw_scores=_matrix(obj, "raw_scores", where, v, c),
        scores=_matrix(obj, "scores", where, v, c),
        aggregate=_floats(obj, "aggregate", where, c),
        chosen=chosen,
        margin=float(_typed(obj, "margin", NUMBER, where)),
        weights_before=_floats(obj, "weights_before", where, n),
        weights_after=_floats(obj, "weights_after", where, n),
        rewards=_floats(obj, "rewards", where, c),
        exits=exits,
        timings=timings,
        seconds=float(_typed(obj, "seconds", NUMBER, where)),
        elapsed=float(_typed(obj, "elapsed", NUMBER, where)),
        text=_typed(obj, "text", str, where),
        stop_reason=stop,
        eligible=_eligible(obj, where, c),
    )


def _eligible(obj: dict[str, Any], where: str, count: int) -> tuple[bool, ...]:
    values = obj.get("eligible", [])
    if not isinstance(values, list) or not all(isinstance(v, bool) for v in values):
        raise TraceError(f"{where}.eligible: expected a list of booleans")
    if values and len(values) != count:
        raise TraceError(f"{where}.eligible: expected {count} values, got {len(values)}")
    return tuple(values)
