"""The trace: one run (id, prompt, members, config, rounds, result) as one versioned JSON document.

Writes with dump_trace / save_trace and reads back with load_trace / parse_trace. The field names
and types come from the record dataclasses themselves (records.py), so a field added there is
written and read without a change here; only the checks across fields are written by hand. A
malformed, oversized or foreign file gets a TraceError, never a crash. Stdlib only.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import types
import typing
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import EnsembleConfig
from .errors import ConfigError, TraceError
from .records import ROUND_STOP_REASONS, Branch, Result, Round, summarize

SCHEMA = "specfuse.trace"
VERSION = 2  # CHANGELOG.md records what each version added
READS = (1, 2)
MAX_TRACE_BYTES = 20 * 1024 * 1024  # a 1,000-round trace of 8 members is a few MB
# Record fields that a document of this version must carry although the dataclass has a default
# (the default is there for hand-built records in tests and views).
REQUIRED_SINCE = {2: {(Round, "eligible"), (Round, "token_scores")}}


def new_trace_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Trace:
    prompt: str
    members: tuple[str, ...]
    config: EnsembleConfig
    rounds: tuple[Round, ...]
    id: str = field(default_factory=new_trace_id)  # made once per run; a branch names its parent's
    branch: Branch | None = None  # set when this run was branched from another trace

    @property
    def result(self) -> Result:
        return summarize(self.rounds)


def dump_trace(trace: Trace) -> str:
    """The trace as JSON text (tuples become lists)."""
    document = {
        "schema": SCHEMA,
        "version": VERSION,
        "id": trace.id,
        "branch": asdict(trace.branch) if trace.branch is not None else None,
        "prompt": trace.prompt,
        "members": list(trace.members),
        "config": trace.config.to_dict(),
        "rounds": [asdict(_explicit(r)) for r in trace.rounds],
        "result": asdict(trace.result) if trace.rounds else None,
    }
    return json.dumps(document, ensure_ascii=False, indent=1, allow_nan=False)


def _explicit(r: Round) -> Round:
    # A hand-built Round may leave eligible empty ("all"); the file always says it.
    return r if r.eligible else dataclasses.replace(r, eligible=(True,) * len(r.candidates))


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write atomically: a crash halfway never leaves half a trace under the final name."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(dump_trace(trace), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_trace(path: str | os.PathLike[str], max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read and validate the trace at `path`; a file over `max_bytes` is refused before it is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise TraceError(f"cannot read trace {str(path)!r}: {e.strerror or e}") from e
    if size > max_bytes:
        raise TraceError(f"trace {path.name!r} is {size:,} bytes; the limit is {max_bytes:,}")
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)  # bytes, not characters; the file may have grown since stat
    except OSError as e:
        raise TraceError(f"cannot read trace {path.name!r}: {e.strerror or e}") from e
    if len(data) > max_bytes:
        raise TraceError(f"trace {path.name!r} is over {max_bytes:,} bytes; the limit is {max_bytes:,}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"trace {path.name!r} is not UTF-8 text: {e}") from e
    return parse_trace(text, max_bytes)


def parse_trace(text: str | bytes, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Validate and rebuild a trace from JSON text (this version or an older one); `max_bytes`
    counts the text's UTF-8 bytes (a character may take four)."""
    if isinstance(text, str) and len(text) > max_bytes:  # every character takes a byte or more
        raise TraceError(f"the trace is {len(text):,} characters, over the limit of {max_bytes:,} bytes")
    # surrogatepass: a lone surrogate (from a JSON-decoded upload) counts its 3 bytes, not a crash
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TraceError(f"the trace is {size:,} bytes; the limit is {max_bytes:,}")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TraceError(f"not a JSON document: {e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise TraceError(f'not a specfuse trace (expected "schema": "{SCHEMA}")')
    version = doc.get("version")
    if version not in READS or isinstance(version, bool):
        raise TraceError(
            f"trace version {version!r} is not supported; this build reads versions "
            f"{', '.join(map(str, READS))}"
        )
    if version == 1:
        doc = _upgrade_v1(doc, text)
    known = {f.name for f in dataclasses.fields(Trace)} | {"schema", "version", "result"}
    if set(doc) - known:
        raise TraceError(f"trace: unknown keys {sorted(set(doc) - known)}")
    try:
        config = EnsembleConfig.from_dict(_expect(doc, "config", "trace", dict))
    except (ConfigError, TypeError) as e:
        raise TraceError(f"trace config is invalid: {e}") from e
    values: dict[str, Any] = {"config": config}
    hints = _hints(Trace)
    for f in dataclasses.fields(Trace):
        if f.name != "config":
            values[f.name] = _value(_expect(doc, f.name, "trace"), hints[f.name], f"trace.{f.name}", version)
    trace = Trace(**values)
    _check_trace(trace)
    return trace


def _upgrade_v1(doc: dict[str, Any], text: str | bytes) -> dict[str, Any]:
    """Version 1 had no id, no branch and no token scores, and eligible was optional (empty: all)."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    doc = {**doc, "id": hashlib.sha256(raw).hexdigest()[:32], "branch": None}  # stable across loads
    rounds = doc.get("rounds")
    if isinstance(rounds, list):
        doc["rounds"] = [_upgrade_round_v1(r) for r in rounds]
    return doc


def _upgrade_round_v1(r: Any) -> Any:
    if not isinstance(r, dict):
        return r
    r = {**r, "token_scores": r.get("token_scores", [])}
    if not r.get("eligible") and isinstance(r.get("candidates"), list):
        r["eligible"] = [True] * len(r["candidates"])
    return r


# -- the generic part: a JSON value checked against a type hint from the records ------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _value(value: Any, hint: Any, where: str, version: int) -> Any:
    """`value` (parsed JSON) as the type `hint` says: dataclasses, tuples, `X | None` and scalars."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return _value(value, hint, where, version)
    if origin is tuple:
        if not isinstance(value, list):
            raise TraceError(f"{where}: expected a list, got {_json_name(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(v, args[0], f"{where}[{i}]", version) for i, v in enumerate(value))
        if len(value) != len(args):
            raise TraceError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_value(v, a, f"{where}[{i}]", version) for i, (v, a) in enumerate(zip(value, args)))
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _record(hint, value, where, version)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TraceError(f"{where}: expected a number, got {_json_name(value)}")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer past 1e308: JSON has no bound on digits
            finite = False
        if not finite:
            raise TraceError(f"{where}: not a finite number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where}: expected int, got {_json_name(value)}")
        return value
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise TraceError(f"{where}: expected {hint.__name__}, got {_json_name(value)}")
        return value
    raise TypeError(f"trace.py cannot read a field of type {hint!r} ({where})")  # a records.py change


def _record(cls: type, obj: Any, where: str, version: int) -> Any:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected an object, got {_json_name(obj)}")
    fields = dataclasses.fields(cls)
    unknown = set(obj) - {f.name for f in fields}
    if unknown:
        raise TraceError(f"{where}: unknown keys {sorted(unknown)}")
    required = {name for c, name in REQUIRED_SINCE.get(version, ()) if c is cls}
    values = {}
    for f in fields:
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if f.name in obj:
            values[f.name] = _value(obj[f.name], _hints(cls)[f.name], f"{where}.{f.name}", version)
        elif not has_default or f.name in required:
            raise TraceError(f"{where}: missing {f.name!r}")
    return cls(**values)


def _expect(doc: dict[str, Any], key: str, where: str, kind: type | None = None) -> Any:
    if key not in doc:
        raise TraceError(f"{where}: missing {key!r}")
    if kind is not None and not isinstance(doc[key], kind):
        raise TraceError(f"{where}.{key}: expected {kind.__name__}, got {_json_name(doc[key])}")
    return doc[key]


def _json_name(value: Any) -> str:
    names = {dict: "object", list: "list", str: "str", bool: "bool", int: "int", float: "float"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# -- the hand-written part: what one field's type cannot say -------------------------------------


def _check_trace(trace: Trace) -> None:
    if not trace.rounds:  # nothing to replay or summarize: a run stopped before its first round
        raise TraceError("rounds: a trace holds at least one round, this one has none")
    if not trace.id or len(trace.id) > 64:
        raise TraceError("trace.id: expected a non-empty id of at most 64 characters")
    if trace.branch is not None:
        b = trace.branch
        if b.parent == trace.id or not b.parent:
            raise TraceError("trace.branch.parent: a branch names another trace's id")
        if b.k < 1 or b.k > len(trace.rounds):
            raise TraceError(f"trace.branch.k: round {b.k} is not in this trace")
    answer = ""
    for i, r in enumerate(trace.rounds):
        if r.k != i + 1:
            raise TraceError(f"rounds[{i}].k: expected round {i + 1}, got {r.k}")
        typed = trace.branch.origin if trace.branch is not None and trace.branch.k == r.k else None
        _check_round(r, f"rounds[{i}]", trace.members, typed)
        answer += r.winner.text
        if r.text != answer:
            raise TraceError(f"rounds[{i}]: the answer is not the concatenation of the chosen candidates")
    for i, r in enumerate(trace.rounds[:-1]):
        if r.stop_reason is not None:
            raise TraceError(f"rounds[{i}].stop_reason: only the last round may carry a stop reason")


def _check_round(r: Round, where: str, members: Sequence[str], typed: str | None = None) -> None:
    """`typed`: the origin of a segment a person typed into this (branch) round, an extra candidate."""
    n, c, v = len(r.members), len(r.candidates), len(r.verifiers)
    if (
        r.members != tuple(members)
        or not set(r.active) <= set(members)
        or not set(r.verifiers) <= set(members)
    ):
        raise TraceError(f"{where}: members do not match the trace's members")
    if not r.verified and r.verifiers:
        raise TraceError(f"{where}: an unverified round (a lone or agreed draft) has no verifiers")
    drafters = tuple(x.member for x in r.candidates)
    extra = typed is not None and typed not in members and drafters == (*r.active, typed)
    if c == 0 or (drafters != r.active and not extra):
        raise TraceError(f"{where}: expected one candidate per active member, in the same order")
    if not 0 <= r.chosen < c:
        raise TraceError(f"{where}.chosen: {r.chosen} is not a candidate index")
    if r.stop_reason is not None and r.stop_reason not in ROUND_STOP_REASONS:
        raise TraceError(
            f"{where}.stop_reason: {r.stop_reason!r} is not one of {', '.join(ROUND_STOP_REASONS)}"
        )
    for key in ("raw_scores", "scores"):
        _shape(getattr(r, key), f"{where}.{key}", v, c)
    for key, length in (
        ("aggregate", c),
        ("rewards", c),
        ("eligible", c),
        ("weights_before", n),
        ("weights_after", n),
    ):
        if len(getattr(r, key)) != length:
            raise TraceError(f"{where}.{key}: expected {length} values, got {len(getattr(r, key))}")
    if len(r.timings) not in (0, n):  # () in hand-built records
        raise TraceError(f"{where}.timings: expected {n} values, got {len(r.timings)}")
    if r.token_scores:
        _shape(r.token_scores, f"{where}.token_scores", v, c)
        for i, row in enumerate(r.token_scores):
            for j, ts in enumerate(row):
                if len(ts.tokens) != len(ts.logits) or len(ts.logprobs) not in (0, len(ts.tokens)):
                    raise TraceError(
                        f"{where}.token_scores[{i}][{j}]: tokens, logits and logprobs (when kept) "
                        "differ in length"
                    )
    for j, e in enumerate(r.exits):
        if e.k != r.k or e.member not in r.active:
            raise TraceError(f"{where}.exits[{j}]: {e.member!r} cannot exit in round {e.k} from round {r.k}")


def _shape(matrix: Sequence[Sequence[Any]], where: str, rows: int, cols: int) -> None:
    if len(matrix) != rows:
        raise TraceError(f"{where}: expected {rows} rows, got {len(matrix)}")
    for i, row in enumerate(matrix):
        if len(row) != cols:
            raise TraceError(f"{where}[{i}]: expected {cols} values, got {len(row)}")
