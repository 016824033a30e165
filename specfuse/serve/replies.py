"""OpenAI's response bodies from the engine's records: a whole completion, the streamed chunks, the
usage, the `specfuse` summary of a run, and the model list.

Knows nothing about HTTP or the scheduler: api.py sends what these return.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import Result, Round
from .ask import Ask
from .schema import ENSEMBLE_MODEL


def finish_reason(stop_reason: str) -> str:
    """OpenAI's finish_reason for the engine's stop reason: "length" when a budget ended it."""
    return "length" if stop_reason in ("budget", "rounds", "cancelled") else "stop"


def summary(trace_id: str, members: Sequence[str], rounds: Sequence[Round], result: Result) -> dict[str, Any]:
    """The response's `specfuse` object: rounds, winners per member, exits, gated rounds (config.gate:
    the gatekeeper was sure, the others were not asked) and the trace's id."""
    return {
        "trace_id": trace_id,
        "members": list(members),
        "rounds": result.rounds,
        "wins": dict(result.wins),
        "exits": [{"member": e.member, "round": e.k, "reason": e.reason} for r in rounds for e in r.exits],
        "gated_rounds": sum(r.gated for r in rounds),
        "gated": [
            {"round": r.k, "member": r.gate.member, "measure": r.gate.measure}
            | {"confidence": r.gate.confidence, "threshold": r.gate.threshold, "reason": r.gate.reason}
            for r in rounds
            if r.gate is not None and r.gate.passed
        ],
        "stop_reason": result.stop_reason,
        "seconds": round(result.seconds, 3),
    }


def usage(prompt_tokens: int, result: Result | None) -> dict[str, int]:
    completion = result.tokens if result is not None else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def completion(
    ask: Ask,
    rid: str,
    created: int,
    text: str,
    finish: str,
    extra: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A whole (non-streamed) response: chat.completion or text_completion; `logprobs` its choice's
    (logprobs.py's shapes), when asked."""
    if ask.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": ask.model, "choices": [choice], **extra}


def several(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """n whole answers (n > 1) as one response: choice i is run i's (seed + i); the usage counts the
    prompt once and every run's answer; `specfuse.choices` holds each run's summary (its trace id)."""
    if len(answers) == 1:
        return dict(answers[0])
    first = answers[0]
    choices = [{**a["choices"][0], "index": i} for i, a in enumerate(answers)]
    completion_tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    prompt_tokens = first["usage"]["prompt_tokens"]
    out = {k: v for k, v in first.items() if k not in ("choices", "usage", "specfuse")}
    out["choices"] = choices
    out["usage"] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    out["specfuse"] = {"choices": [a.get("specfuse") for a in answers]}
    return out


def chunk(
    ask: Ask,
    rid: str,
    created: int,
    text: str | None,
    finish: str | None = None,
    extra: dict[str, Any] | None = None,
    *,
    first: bool = False,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk of choice `index` (n > 1: run index's), with its tokens' `logprobs` when
    asked; text None: a chunk without a choice (the usage chunk)."""
    choices: list[dict[str, Any]] = []
    if text is not None and ask.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        choices = [
            {
                "index": index,
                "delta": delta if text or first else {},
                "logprobs": logprobs,
                "finish_reason": finish,
            }
        ]
    elif text is not None:
        choices = [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]
    obj = "chat.completion.chunk" if ask.kind == "chat" else "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": ask.model,
        "choices": choices,
        **(extra or {}),
    }


def models(names: Sequence[str], created: int, contexts: Sequence[int | None] = ()) -> dict[str, Any]:
    """GET /v1/models: the ensemble, then each member alone, each with its context length in tokens
    (`context_length`, and vLLM's `max_model_len`) where known: a member's is its model's; the
    ensemble's is the smallest of its members', since every member reads the whole conversation."""
    known = [c for c in contexts if isinstance(c, int) and c > 0]
    ensemble = min(known) if known and len(known) == len(names) else None
    rows = []
    for name, context in ((ENSEMBLE_MODEL, ensemble), *zip(names, contexts or [None] * len(names))):
        row: dict[str, Any] = {"id": name, "object": "model", "created": created, "owned_by": "specfuse"}
        if isinstance(context, int) and context > 0:
            row["context_length"] = row["max_model_len"] = context
        rows.append(row)
    return {"object": "list", "data": rows}
