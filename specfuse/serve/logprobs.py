"""The ensemble's log-probabilities (docs/api.md#log-probabilities): each token of an answer (or of a
text given to be scored, echo) with the weighted aggregate of its verifiers' log-probabilities, and
its alternatives, read off the rounds' token evidence (Round.token_scores), in OpenAI's two shapes.

The members tokenize differently, so the tokens are one tokenization, the reference: the round's
first verifier's as it read the segment in context (an answer), or the server's reference tokenizer's
(echo: what /tokenize gives). Each verifier's own tokens are laid on it by character offsets: a
verifier's token counts toward the reference token in which it ends. Pure: no model, no HTTP.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import feedback
from ..config import EnsembleConfig
from ..records import Round, TokenScores

Span = tuple[int, int]  # [start, end) in characters


@dataclass(frozen=True)
class Scored:
    """One token of the answer: its text (the answer is the concatenation), where it begins in the
    answer, its log-probability (None: the first token of an echoed text, which nothing precedes) and
    its alternatives (piece, log-probability), likeliest first."""

    text: str
    offset: int
    logprob: float | None
    top: tuple[tuple[str, float], ...] = ()


REPLACEMENT = "\ufffd"  # what a piece holding part of a character's bytes decodes to
RESYNC_CHARS = 8  # how far a piece that does not follow on is looked for (after split characters)


def spans_in(pieces: Sequence[str], text: str) -> list[Span]:
    """Each piece's span in `text`, which the pieces spell from its start. A piece holding part of a
    multi-byte character (U+FFFD in it) covers its whole characters and the character it is part
    of (every part of one character ends where it ends); a piece found a little further on gives the
    characters skipped to the piece before it; a piece not in the text (an end marker) is (where the
    text stopped, -1): it begins there and counts toward no character."""
    out: list[Span] = []
    pos = 0
    for i, piece in enumerate(pieces):
        if text.startswith(piece, pos):
            out.append((pos, pos + len(piece)))
            pos += len(piece)
            continue
        if REPLACEMENT in piece:
            clean = piece.replace(REPLACEMENT, "")
            begin = pos
            pos += len(clean) if text.startswith(clean, pos) else 0
            out.append((begin, min(len(text), pos + 1)))
            following = pieces[i + 1] if i + 1 < len(pieces) else ""
            if pos < len(text) and REPLACEMENT not in following[:1]:
                pos += 1  # the last part of the character
            continue
        found = text.find(piece, pos, pos + RESYNC_CHARS + len(piece)) if piece else -1
        if found > pos and out:
            out[-1] = (out[-1][0], found)
            out.append((found, found + len(piece)))
            pos = found + len(piece)
        else:
            out.append((pos, -1))
    return out


def shift_of(pieces: Sequence[str], before: str, segment: str) -> int:
    """How many characters of the answer before the segment a verifier's pieces begin with: one that
    re-tokenized the end of the answer (a merge across the boundary) scored that tail first."""
    joined = "".join(pieces)
    clean = joined.split(REPLACEMENT, 1)[0]  # the part that can be compared character for character
    for s in range(min(len(clean), len(before)) + 1):
        if before.endswith(clean[:s]) and (clean[s:].startswith(segment) or segment.startswith(clean[s:])):
            return s
    return 0


def _row(ts: TokenScores, before: str, segment: str) -> tuple[TokenScores, list[Span], int]:
    """A verifier's token evidence, its tokens' spans (in its own coordinates) and the shift to the
    segment's (a span minus the shift: characters from the segment's start)."""
    shift = shift_of(ts.tokens, before, segment)
    return ts, spans_in(ts.tokens, before[len(before) - shift :] + segment), shift


def _on_reference(ts: TokenScores, spans: Sequence[Span], shift: int, ref: Sequence[Span]) -> list[float]:
    """A verifier's log-probabilities laid on the reference tokens: each of its tokens shares its
    log-probability among the reference tokens it overlaps, by characters (so a verifier's total over
    any stretch of whole tokens is its own); a token outside the segment (the end of the answer
    before it, its end marker, text cut at a stop string) counts nowhere."""
    out = [0.0] * len(ref)
    ends = [b for _, b in ref]  # non-decreasing: the reference tokens are in order
    for (start, end), value in zip(spans, ts.logprobs):
        if end < 0:
            continue
        start, end = start - shift, end - shift
        width = end - start
        r = bisect.bisect_right(ends, start)  # the first reference token ending after `start`
        while r < len(ref) and ref[r][0] < max(end, start + 1):
            a, b = ref[r]
            if width <= 0:  # an empty piece: to the token it stands in
                out[r] += value if a <= start < b else 0.0
                break
            overlap = min(end, b) - max(start, a)
            if overlap > 0:
                out[r] += value * overlap / width
            r += 1
    return out


def _alternatives(
    rows: Sequence[tuple[TokenScores, list[Span], int]],
    at: int,
    weights: Sequence[float],
    cfg: EnsembleConfig,
) -> dict[str, float]:
    """The alternatives at character `at` of the segment: every verifier that has a token beginning
    there gives its own top-k; each piece is scored by the same weighted aggregate over the verifiers
    that list it (the others' weights renormalized away, as aggregate() does for a left-out vote)."""
    votes: dict[str, list[tuple[float, float]]] = {}
    for (ts, spans, shift), w in zip(rows, weights):
        if not ts.top:
            continue
        for u, (start, _) in enumerate(spans):
            if start - shift == at:
                for piece, value in ts.top[u]:
                    votes.setdefault(piece, []).append((value, w))
                break
    out = {}
    for piece, pairs in votes.items():
        values, ws = [v for v, _ in pairs], [w for _, w in pairs]
        names = [str(i) for i in range(len(values))]
        out[piece] = feedback.aggregate(
            [[v] for v in values], ws, names, ["-"], True, cfg.aggregation, cfg.outlier_gap
        )[0]
    return out


def round_tokens(
    rnd: Round, cfg: EnsembleConfig, top: int, reference: Sequence[Span] | None = None
) -> list[Scored]:
    """The tokens of round `rnd`'s segment, each with the weighted aggregate (cfg.aggregation, the
    verifiers' weights that round, their self-scores left out where cfg.self_scores is off) of the
    verifiers' log-probabilities, and its `top` alternatives. `reference`: the tokens' spans in the
    segment (echo); None: the first verifier's own. Offsets are from the start of the answer. A
    round without token evidence (a back end that keeps none) is one token without a log-probability."""
    winner = rnd.winner
    segment = winner.text
    base = len(rnd.text) - len(segment)
    before = rnd.text[:base]
    if not segment:
        return []
    if not rnd.token_scores or any(not row[rnd.chosen].logprobs for row in rnd.token_scores):
        return [Scored(segment, base, None)]
    rows = [_row(row[rnd.chosen], before, segment) for row in rnd.token_scores]
    if reference is None:  # the first verifier's tokens of the segment, cut to it
        _, spans, shift = rows[0]
        cut = [(max(0, a - shift), min(len(segment), b - shift)) for a, b in spans if b >= 0]
        reference = [(a, b) for a, b in cut if b > a]
    reference = [(min(a, len(segment)), min(max(a, b), len(segment))) for a, b in reference]
    index = {m: i for i, m in enumerate(rnd.members)}
    weights = [rnd.weights_before[index[v]] for v in rnd.verifiers]
    on_ref = [_on_reference(ts, spans, shift, reference) for ts, spans, shift in rows]
    values = feedback.aggregate(
        [list(r) for r in on_ref],
        weights,
        rnd.verifiers,
        [winner.member] * len(reference),
        cfg.self_scores,
        cfg.aggregation,
        cfg.outlier_gap,
    )
    out = []
    done = 0  # the answer's characters given to a token so far: the tokens' texts make the segment
    for (a, b), value in zip(reference, values):
        begin = max(a, done)
        text = segment[begin:b]
        done = max(done, b)
        alternatives: tuple[tuple[str, float], ...] = ()
        if top:
            found = _alternatives(rows, a, weights, cfg)
            found[text] = value  # the chosen token's own entry is its log-probability
            alternatives = tuple(sorted(found.items(), key=lambda kv: -kv[1])[:top])
        out.append(Scored(text, base + begin, value, alternatives))
    return out


def next_token(rnd: Round, cfg: EnsembleConfig) -> Scored | None:
    """Echo with max_tokens 1: the token the ensemble finds likeliest after the scored text, by the
    same aggregate over the alternatives every verifier gives at the text's end (where each scored its
    end marker). None when no verifier kept alternatives."""
    segment = rnd.winner.text
    rows = [_row(row[0], "", segment) for row in rnd.token_scores]
    index = {m: i for i, m in enumerate(rnd.members)}
    weights = [rnd.weights_before[index[v]] for v in rnd.verifiers]
    found = _alternatives(rows, len(segment), weights, cfg)
    if not found:
        return None
    piece, value = max(found.items(), key=lambda kv: kv[1])
    ranked = tuple(sorted(found.items(), key=lambda kv: -kv[1]))
    return Scored(piece, len(segment), value, ranked)


def answer_tokens(rounds: Sequence[Round], cfg: EnsembleConfig, top: int) -> list[Scored]:
    """Every token of the answer, round by round."""
    return [t for rnd in rounds for t in round_tokens(rnd, cfg, top)]


# ---- OpenAI's shapes ------------------------------------------------------------------------------


def chat_content(tokens: Sequence[Scored]) -> list[dict[str, object]]:
    """choices[i].logprobs.content: {token, logprob, bytes, top_logprobs} per token."""

    def entry(text: str, value: float | None) -> dict[str, object]:
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return [{**entry(t.text, t.logprob), "top_logprobs": [entry(p, v) for p, v in t.top]} for t in tokens]


def legacy(tokens: Sequence[Scored], top: int) -> dict[str, object]:
    """/v1/completions' logprobs: tokens, token_logprobs, top_logprobs (a dict per token, the chosen
    token always in it, as OpenAI's; null where the token has no log-probability), text_offset."""
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [
            None if t.logprob is None else dict(t.top) | {t.text: t.logprob} if top else None for t in tokens
        ],
        "text_offset": [t.offset for t in tokens],
    }


# ---- what a request asks ------------------------------------------------------------------------


MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's limit on chat's top_logprobs)


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def alternatives_field(field: str, value: Any) -> Any:
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOP_LOGPROBS
    ):
        raise ValueError(f"{field} must be an integer in 0..{MAX_TOP_LOGPROBS}; got {repr(value)[:40]}")
    return value


class Refused(ValueError):
    """A request's log-probability fields refused: ask.py answers it as its ApiError (this module
    is read by schema.py and ask.py, so it reads neither)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def asked_for(
    request: Any, kind: str, sent: dict[str, str], body: dict[str, Any]
) -> tuple[int | None, bool, int | None]:
    """(alternatives per token, or None when no log-probability is asked; echo; the max_tokens
    sent), the combinations OpenAI refuses refused by name."""
    budget_field = sent.get("max_new_tokens", "max_tokens")
    budget = getattr(request, budget_field, None)
    if kind == "chat" and body.get("echo") not in (None, False):
        raise Refused(400, "echo is a /v1/completions field: it scores a prompt's text", param="echo")
    if kind == "text" and body.get("top_logprobs") not in (None, 0):
        raise Refused(
            400,
            "top_logprobs is a chat field; on /v1/completions, logprobs is the number of alternatives",
            param="top_logprobs",
        )
    if kind == "chat":
        if request.top_logprobs and not request.logprobs:
            raise Refused(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if budget == 0:
            raise Refused(400, f"{budget_field} must be at least 1", param=budget_field)
        return (request.top_logprobs or 0) if request.logprobs else None, False, budget
    echo = bool(request.echo)
    if budget == 0 and not echo:
        raise Refused(
            400,
            f"{budget_field} must be at least 1 (0 only with echo: the prompt scored)",
            param=budget_field,
        )
    if echo and budget is not None and budget > 1:
        raise Refused(
            400,
            f"echo scores the prompt: {budget_field} must be 0 (the prompt alone) or 1 (and the "
            "ensemble's likeliest next token)",
            param=budget_field,
        )
    return request.logprobs, echo, budget


def detokenized(ids: tuple[int, ...], detokenize: Callable[[list[int]], str] | None, limit: int) -> str:
    """A prompt sent as token ids, as text: the server's reference tokenizer's (/tokenize)."""
    if detokenize is None:
        raise Refused(
            400, "this server takes prompts as text only (it has no reference tokenizer)", param="prompt"
        )
    if len(ids) > limit:  # a token is at least one character
        raise Refused(
            413,
            f"the prompt has {len(ids):,} tokens; the limit is {limit:,} characters",
            param="prompt",
            code="context_length_exceeded",
        )
    try:
        return detokenize(list(ids))
    except Exception as e:  # an id beyond the vocabulary
        raise Refused(
            400, f"the prompt's token ids are not the reference tokenizer's: {e}", param="prompt"
        ) from None


class Reference:
    """The server's reference tokenizer: the first loaded member's (a transformers tokenizer). It
    gives /tokenize, /detokenize and /tokenizer_info (what lm-eval's remote tokenizer reads, so that
    its token counts are ours), a prompt sent as ids its text, and an echoed text its tokens."""

    def __init__(self, tokenizer: Any, context: int | None) -> None:
        self.tokenizer = tokenizer
        self.context = context

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        size = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {size}")
        return str(self.tokenizer.decode(list(ids)))

    def spans(self, text: str, ids: Sequence[int] | None = None) -> list[Span]:
        """The reference tokens of `text` (its own ids when the client sent ids, else /tokenize's),
        as spans of it."""
        ids = list(ids) if ids is not None else self.encode(text)
        return spans_in([str(self.tokenizer.decode([t])) for t in ids], text)

    def info(self) -> dict[str, object]:
        t = self.tokenizer
        return {
            "tokenizer_class": type(t).__name__,
            "eos_token": t.eos_token,
            "bos_token": t.bos_token,
            "pad_token": t.pad_token,
            "model_max_length": self.context,
            "chat_template": getattr(t, "chat_template", None),
        }
