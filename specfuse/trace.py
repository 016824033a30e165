"""The trace: one run (id, prompt, members, config, rounds, result) as one versioned JSON document.

The prompt is what the members were shown: a string (`"prompt"`), or a conversation (`"messages"`, a
list of {role, content}, since version 3); the other key is null.

Writes with dump_trace / save_trace and reads back with load_trace / parse_trace. The format is
declared once, as TraceDocument: its field names and types are the record dataclasses' own
(records.py), so a field added there is written and read without a change here. pydantic validates
every document against it (document_adapter(), strict: a "1" is no int), and the same declaration is
the format's JSON Schema (json_schema(), docs/trace.schema.json); only the checks across fields are
written by hand. A malformed, oversized or foreign file gets a TraceError that names the place
(`trace.rounds[0].chosen: expected int, got float`), never a crash.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import typing
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import GetCoreSchemaHandler, TypeAdapter, ValidationError
from pydantic_core import CoreConfig, CoreSchema, ErrorDetails

from .config import RETIRED_KEYS, EnsembleConfig
from .errors import ConfigError, TraceError
from .prompts import Conversation, Message, Prompt, as_prompt, conversation
from .records import ECHO, ROUND_STOP_REASONS, Branch, Result, Round, summarize

SCHEMA = "specfuse.trace"
VERSION = 3  # CHANGELOG.md records what each version added
READS = (1, 2, 3)
MAX_TRACE_BYTES = 20 * 1024 * 1024  # a 1,000-round trace of 8 members is a few MB
MAX_KEYS = 1000  # in one object; the largest record (EnsembleConfig) has 31 fields


def new_trace_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Trace:
    prompt: Prompt  # a string, or the conversation (a list of messages or dicts is checked and kept as one)
    members: tuple[str, ...]
    config: EnsembleConfig
    rounds: tuple[Round, ...]
    id: str = field(default_factory=new_trace_id)  # made once per run; a branch names its parent's
    branch: Branch | None = None  # set when this run was branched from another trace

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", as_prompt(self.prompt))

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
        "prompt": trace.prompt if isinstance(trace.prompt, str) else None,
        "messages": None if isinstance(trace.prompt, str) else [m.as_dict() for m in trace.prompt],
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
    doc = read_document(text, max_bytes)
    try:
        document = _value(doc, TraceDocument, "trace")
    except TraceError:
        _check_config(doc.get("config"))  # a bad setting is named in the settings' own words
        raise
    kept = {f.name: getattr(document, f.name) for f in dataclasses.fields(Trace) if f.name != "prompt"}
    trace = Trace(prompt=_prompt(document.prompt, document.messages), **kept)
    _check_trace(trace)
    return trace


def read_document(text: str | bytes, max_bytes: int = MAX_TRACE_BYTES) -> dict[str, Any]:
    """A trace file's JSON in the current version's form, not yet validated: within `max_bytes`, a
    JSON object of this format, of a version this build reads, upgraded to this version, without
    the settings that are no longer a run's (config.RETIRED_KEYS). TraceError otherwise."""
    if isinstance(text, str) and len(text) > max_bytes:  # every character takes a byte or more
        raise TraceError(f"the trace is {len(text):,} characters, over the limit of {max_bytes:,} bytes")
    # surrogatepass: a lone surrogate (from a JSON-decoded upload) counts its 3 bytes, not a crash
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TraceError(f"the trace is {size:,} bytes; the limit is {max_bytes:,}")
    try:  # plain data only: nothing in the text is called or imported
        doc = json.loads(text, object_hook=_few_keys)
    except TraceError:
        raise
    except (ValueError, RecursionError) as e:
        raise TraceError(f"not a JSON document: {e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise TraceError(f'not a specfuse trace (expected "schema": "{SCHEMA}")')
    version = doc.get("version")
    if type(version) is not int or version not in READS:  # not True, not 2.0
        raise TraceError(
            f"trace version {version!r} is not supported; this build reads versions "
            f"{', '.join(map(str, READS))}"
        )
    if version == 1:
        doc = _upgrade_v1(doc, text)
    if version in (1, 2):
        doc = {**doc, "version": VERSION, "messages": None}  # version 2's prompt was always a string
    config = doc.get("config")
    if isinstance(config, dict) and not config.keys().isdisjoint(RETIRED_KEYS):
        doc["config"] = {k: v for k, v in config.items() if k not in RETIRED_KEYS}
    return doc


def _upgrade_v1(doc: dict[str, Any], text: str | bytes) -> dict[str, Any]:
    """Version 1 had no id, no branch and no token scores, and eligible was optional (empty: all)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    doc = {**doc, "version": 2, "id": hashlib.sha256(raw).hexdigest()[:32], "branch": None}
    rounds = doc.get("rounds")  # the id is the file's hash: stable across loads
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


# -- the declaration: a document of this version, validated by pydantic ---------------------------

# The format's name and version, Trace's own fields (their types come from the record dataclasses:
# a field added there is written, read and in the schema without a change here) and the run's
# result (for other readers; this one recomputes it from the rounds).
TraceDocument = dataclasses.make_dataclass(
    "TraceDocument",
    [
        ("schema", Literal[SCHEMA]),  # type: ignore[valid-type]
        ("version", Literal[VERSION]),  # type: ignore[valid-type]
        ("prompt", str | None),  # a string prompt; null when the prompt is a conversation
        ("messages", tuple[Message, ...] | None),  # the conversation; null when the prompt is a string
        *((k, v) for k, v in typing.get_type_hints(Trace).items() if k != "prompt"),
        ("result", Result | None),
    ],
)
# Fields a document must carry although the record has a default (the default is there for
# hand-built records in tests and views); required since version 2.
REQUIRED = {(Round, "eligible"), (Round, "token_scores")}
# Every record of a document: strict values (no "1" for 1, no 1 for true, finite numbers only) and
# no key beyond the declared ones.
DOCUMENT_CONFIG: CoreConfig = {"strict": True, "extra_fields_behavior": "forbid", "allow_inf_nan": False}


class _DocumentForm:
    """A type as trace documents hold it, for pydantic (`Annotated[T, _DocumentForm()]`): records
    take DOCUMENT_CONFIG and REQUIRED; lists and objects stand for tuples and records (json.loads
    gives lists and dicts; the values inside stay strict); a list stops at its first bad item, so
    that an upload of a million bad items costs one error, not millions."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        schema = copy.deepcopy(TypeAdapter(source).core_schema)
        _document_form(schema)
        return schema


def _document_form(schema: CoreSchema) -> None:
    for node in _nodes(schema):
        kind = node.get("type")
        if kind in ("tuple", "list", "dataclass"):
            node["strict"] = False  # the container's own type only
        if kind == "list" or (kind == "tuple" and "variadic_item_index" in node):
            node["fail_fast"] = True
        if kind == "dataclass":
            node["config"] = {**node.get("config", {}), **DOCUMENT_CONFIG}
            for f in node["schema"]["fields"]:
                if (node["cls"], f["name"]) in REQUIRED and f["schema"]["type"] == "default":
                    f["schema"] = f["schema"]["schema"]


def _nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every dict in a core schema, each before the ones inside it."""
    if isinstance(node, dict):
        yield node
    if isinstance(node, (dict, list)):
        for value in node.values() if isinstance(node, dict) else node:
            yield from _nodes(value)


def _few_keys(obj: dict[str, Any]) -> dict[str, Any]:
    if len(obj) > MAX_KEYS:  # refused while parsing: pydantic would report each unknown key
        raise TraceError(f"not a specfuse trace: an object of {len(obj):,} keys (the limit is {MAX_KEYS:,})")
    return obj


@functools.cache
def _adapter(hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(Annotated[hint, _DocumentForm()])


def document_adapter() -> TypeAdapter[Any]:
    """pydantic's TypeAdapter of TraceDocument in its document form: parse_trace validates with it,
    json_schema() describes it, tools/trace_schema.py checks files with it. Built once."""
    return _adapter(TraceDocument)


def json_schema() -> dict[str, Any]:
    """The format as a JSON Schema (docs/trace.schema.json): documents of this version, as written."""
    doc = document_adapter().json_schema(mode="validation")
    doc["title"] = f"specfuse trace, version {VERSION}"
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return doc


def _value(value: Any, hint: Any, where: str) -> Any:
    """`value` (parsed JSON) as the type `hint` says, in its document form; a TraceError naming
    the place (`where` and the path below it) otherwise."""
    try:
        return _adapter(hint).validate_python(value)
    except ValidationError as e:
        raise TraceError(_complaint(e.errors(include_url=False), where)) from e


# -- pydantic's complaint in the reader's words: where (trace.rounds[0].chosen) and what ----------

_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")
_EXPECTED = {
    "int_type": "int",
    "string_type": "str",
    "bool_type": "bool",
    "float_type": "a number",
    "tuple_type": "a list",
    "list_type": "a list",
    "dataclass_type": "an object",
    "dataclass_exact_type": "an object",
}


def _check_config(config: Any) -> None:
    if isinstance(config, dict):
        try:
            EnsembleConfig.from_dict(config)
        except (ConfigError, TypeError) as e:
            raise TraceError(f"trace config is invalid: {e}") from e


def _complaint(errors: list[ErrorDetails], where: str) -> str:
    """The first error: `where` followed by its place, then what is wrong there."""
    first = errors[0]
    loc, kind, value = first["loc"], first["type"], first["input"]
    place, parent = _place(where, loc), _place(where, loc[:-1])
    beside = [e for e in errors if e["loc"][:-1] == loc[:-1]]  # in the same object or list
    if kind in _UNKNOWN:  # every unknown key of that object
        return f"{parent}: unknown keys {sorted(str(e['loc'][-1]) for e in beside if e['type'] in _UNKNOWN)}"
    if kind == "missing" and isinstance(loc[-1], int):  # a fixed-length list (a pair) fell short
        length = max(int(e["loc"][-1]) for e in beside if e["type"] == "missing") + 1
        return f"{parent}: expected {length} items, got {len(value)}"
    if kind == "missing":
        return f"{parent}: missing {loc[-1]!r}"
    if kind == "too_long":
        return f"{place}: expected {first['ctx']['max_length']} items, got {len(value)}"
    if kind == "finite_number" or (kind == "float_type" and _json_name(value) == "int"):
        return f"{place}: not a finite number"  # inf, nan, or an integer past 1e308
    if kind in _EXPECTED:
        return f"{place}: expected {_EXPECTED[kind]}, got {_json_name(value)}"
    error = first.get("ctx", {}).get("error")
    return f"{place}: {error if isinstance(error, Exception) else first['msg']}"


def _place(where: str, loc: tuple[int | str, ...]) -> str:
    return where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _json_name(value: Any) -> str:
    names = {dict: "object", list: "list", str: "str", bool: "bool", int: "int", float: "float"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# -- the hand-written part: what one field's type cannot say -------------------------------------


def _prompt(prompt: str | None, messages: Conversation | None) -> Prompt:
    """The trace's prompt from its two keys: exactly one is set; messages are a well-formed
    conversation (roles in order, ending with the user's: prompts.conversation's checks)."""
    if (prompt is None) == (messages is None):
        raise TraceError(
            "trace: expected either prompt (a string) or messages (a conversation), "
            + ("not both" if prompt is not None else "got neither")
        )
    if prompt is not None:
        return prompt
    try:
        return conversation(messages)
    except ConfigError as e:
        said = str(e)  # "messages[i]: …" names the message; the empty conversation names none
        raise TraceError(
            f"trace.{said}" if said.startswith("messages[") else f"trace.messages: {said}"
        ) from e


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
    if not r.verified and not set(r.verifiers) <= set(r.active):
        # Scored only for a request's log-probabilities (the API's logprobs): by its own drafters.
        raise TraceError(f"{where}: an unverified round (a lone or agreed draft) is scored by its drafters")
    drafters = tuple(x.member for x in r.candidates)
    extra = typed is not None and typed not in members and drafters == (*r.active, typed)
    extra = extra or (not r.active and drafters == (ECHO,) and ECHO not in members)  # a scored text
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
                if (
                    len(ts.tokens) != len(ts.logits)
                    or len(ts.logprobs) not in (0, len(ts.tokens))
                    or len(ts.top) not in (0, len(ts.tokens))
                ):
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
