"""The served members' engines: one small adapter per inference server for its JSON (SGLang's
/generate, vLLM's OpenAI-compatible /v1/completions, llama-server's /completion).

Each turns token ids into the server's request and its reply into token ids and log-probabilities:
tokenize, generate and the log-probs of candidates after their contexts. How requests travel is
transport.py's (Http); what a served member does with them is member.py's (RemoteMember).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...config import MemberSettings
from ...errors import ConfigError
from ...segments import REPLACEMENT
from .transport import Http


@dataclass(frozen=True)
class Generated:
    ids: list[int]  # the tokens generated, including a stop token if the server kept it
    stopped: bool  # ended at a stop or end-of-generation token (not at the token limit)


class Adapter:
    """What differs between engines: the JSON of tokenize, generate and prompt log-probs."""

    engine = ""

    def __init__(
        self,
        http: Http,
        model: str | None,
        stop_ids: frozenset[int] = frozenset(),
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        self.http, self.model, self.stop_ids, self.decode = http, model, stop_ids, decode

    def connect(self) -> int | None:
        """Check the server is up; returns its context length when it says."""
        raise NotImplementedError

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def generate(
        self, ids: Sequence[int], n: int, settings: MemberSettings, seed: int, stop_ids: Sequence[int]
    ) -> Generated:
        raise NotImplementedError

    def logprobs(
        self, contexts: Sequence[Sequence[int]], tails: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Log-probability of each tail token after its context ([candidates][tail tokens])."""
        raise NotImplementedError


def _floats(values: Sequence[Any], n: int, http: Http, path: str) -> list[float]:
    out = [float(v) for v in values]
    if len(out) != n or not all(math.isfinite(v) or v == -math.inf for v in out):
        raise http.malformed(path, f"expected {n} log-probs, got {values!r:.120}")
    return out


class SGLang(Adapter):
    """SGLang's native /generate: token-id prompts; input log-probs from logprob_start_len on."""

    engine = "sglang"

    def connect(self) -> int | None:
        out = self.http.call("/tokenize", {"prompt": "a", "add_special_tokens": False})
        return out.get("max_model_len") if isinstance(out, dict) else None

    def tokenize(self, text: str) -> list[int]:
        out = self.http.call("/tokenize", {"prompt": text, "add_special_tokens": False})
        return [int(t) for t in out["tokens"]]

    def generate(
        self, ids: Sequence[int], n: int, settings: MemberSettings, seed: int, stop_ids: Sequence[int]
    ) -> Generated:
        params: dict[str, Any] = {
            "max_new_tokens": n,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "stop_token_ids": list(stop_ids),
            "no_stop_trim": True,
            "skip_special_tokens": False,
        }
        if settings.temperature > 0:
            params["sampling_seed"] = seed
        out = self.http.call("/generate", {"input_ids": list(ids), "sampling_params": params})
        meta = out["meta_info"]
        if "output_ids" in out:
            new = [int(t) for t in out["output_ids"]]
        else:
            new = [int(entry[1]) for entry in meta["output_token_logprobs"]]
        finish = meta.get("finish_reason") or {}
        return Generated(new, isinstance(finish, dict) and finish.get("type") == "stop")

    def logprobs(
        self, contexts: Sequence[Sequence[int]], tails: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        payload = {
            "input_ids": [list(c) + list(t) for c, t in zip(contexts, tails)],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            # The radix cache serves the context; only the candidates are computed.
            "logprob_start_len": [len(c) - 1 for c in contexts],
        }
        out = self.http.call("/generate", payload)
        if not isinstance(out, list) or len(out) != len(tails):
            raise self.http.malformed("/generate", f"expected a list of {len(tails)} results")
        rows = []
        for result, tail in zip(out, tails):
            entries = result["meta_info"]["input_token_logprobs"][1 : 1 + len(tail)]  # entry 0 is null
            if [int(e[1]) for e in entries] != list(tail):
                raise self.http.malformed("/generate", "input_token_logprobs name other tokens")
            rows.append(_floats([e[0] for e in entries], len(tail), self.http, "/generate"))
        return rows


class VLLM(Adapter):
    """vLLM's OpenAI-compatible /v1/completions with token-id prompts and prompt_logprobs."""

    engine = "vllm"

    def connect(self) -> int | None:
        models = self.http.call("/v1/models")["data"]
        if not models:
            raise self.http.malformed("/v1/models", "no model served")
        if self.model is None:
            self.model = str(models[0]["id"])
        served = {str(m["id"]): m for m in models}
        if self.model not in served:
            raise ConfigError(f"{self.http.where()} serves {', '.join(served)}, not {self.model!r}")
        return served[self.model].get("max_model_len")

    def tokenize(self, text: str) -> list[int]:
        out = self.http.call("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        return [int(t) for t in out["tokens"]]

    def generate(
        self, ids: Sequence[int], n: int, settings: MemberSettings, seed: int, stop_ids: Sequence[int]
    ) -> Generated:
        payload = {
            "model": self.model,
            "prompt": list(ids),
            "max_tokens": n,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "seed": seed,
            "stop_token_ids": list(stop_ids),
            "skip_special_tokens": False,
            "return_token_ids": True,
        }
        choice = self.http.call("/v1/completions", payload)["choices"][0]
        return Generated([int(t) for t in choice["token_ids"]], choice.get("finish_reason") == "stop")

    def logprobs(
        self, contexts: Sequence[Sequence[int]], tails: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        # Requests with prompt log-probs skip vLLM's prefix cache: each candidate re-reads its context.
        payload = {
            "model": self.model,
            "prompt": [list(c) + list(t) for c, t in zip(contexts, tails)],
            "max_tokens": 1,  # vLLM generates at least one token; it is ignored
            "temperature": 0,
            "prompt_logprobs": 0,
        }
        choices = sorted(self.http.call("/v1/completions", payload)["choices"], key=lambda c: c["index"])
        if len(choices) != len(tails):
            raise self.http.malformed("/v1/completions", f"expected {len(tails)} choices")
        rows = []
        for choice, context, tail in zip(choices, contexts, tails):
            entries = choice["prompt_logprobs"][len(context) : len(context) + len(tail)]
            values = [entry[str(token)]["logprob"] for entry, token in zip(entries, tail)]
            rows.append(_floats(values, len(tail), self.http, "/v1/completions"))
        return rows


class LlamaServer(Adapter):
    """llama.cpp's llama-server /completion. It has no prompt log-probs: a grammar of token ids forces
    the candidate as the continuation and its sampled-token log-probs are read, with the context
    served from the slot's prompt cache."""

    engine = "llama-server"

    def connect(self) -> int | None:
        props = self.http.call("/props")
        settings = props.get("default_generation_settings", {}) if isinstance(props, dict) else {}
        n_ctx = settings.get("n_ctx") or (props.get("n_ctx") if isinstance(props, dict) else None)
        return int(n_ctx) if n_ctx else None

    def tokenize(self, text: str) -> list[int]:
        out = self.http.call("/tokenize", {"content": text, "add_special": False, "parse_special": True})
        return [int(t) for t in out["tokens"]]

    def _complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        base = {"cache_prompt": True, "return_tokens": True, "stream": False}
        out = self.http.call("/completion", {**base, **payload})
        if not isinstance(out, dict):
            raise self.http.malformed("/completion", "not an object")
        return out

    def generate(
        self, ids: Sequence[int], n: int, settings: MemberSettings, seed: int, stop_ids: Sequence[int]
    ) -> Generated:
        # Neutral samplers, so that temperature and top_p mean what they mean in-process.
        sampling = {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0, "min_p": 0.0}
        out = self._complete({"prompt": list(ids), "n_predict": n, "seed": seed, **sampling})
        return Generated([int(t) for t in out["tokens"]], out.get("stop_type") == "eos")

    def logprobs(
        self, contexts: Sequence[Sequence[int]], tails: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        rows = []
        for context, tail in zip(contexts, tails):
            # llama.cpp can neither force nor report a token that splits a UTF-8 character (a byte
            # token): those are left out of the candidate's mean, each run of whole tokens is forced
            # in one request on top of the cached context.
            values: list[float] = []
            start = 0
            while start < len(tail):
                whole = self._whole(tail[start])
                end = start + 1
                while end < len(tail) and self._whole(tail[end]) == whole:
                    end += 1
                if whole:
                    values += self._forced([*context, *tail[:start]], list(tail[start:end]))
                start = end
            if not values:  # only byte tokens: let the model spell the text its own way
                values = self._spelled(context, tail)
            rows.append(values)
        return rows

    def _whole(self, token: int) -> bool:
        return self.decode is None or REPLACEMENT not in self.decode([token])

    def _forced(self, prompt: list[int], tokens: list[int]) -> list[float]:
        """Log-probs of `tokens` after `prompt`, forced by a grammar of token ids."""
        forced = list(tokens)
        while forced and forced[-1] in self.stop_ids:
            forced.pop()
        # A grammar cannot hold an end-of-generation token: once it is complete only those may
        # follow, and logit_bias leaves just ours. The log-probs are the model's own (before both).
        payload: dict[str, Any] = {
            "prompt": prompt,
            "n_predict": len(tokens),
            "grammar": "root ::= " + (" ".join(f"<[{t}]>" for t in forced) or '""'),
            "n_probs": 1,
            "temperature": 0,
        }
        if len(forced) < len(tokens):
            payload["logit_bias"] = [[t, False] for t in sorted(self.stop_ids) if t != tokens[len(forced)]]
        out = self._complete(payload)
        got = [int(t) for t in out["tokens"]]
        if got != tokens[: len(got)] or not got:
            raise self.http.malformed("/completion", f"the grammar was not followed: {got} for {tokens}")
        values, entries = [], iter(out["completion_probabilities"])
        entry = next(entries, None)
        for token in tokens:
            if entry is not None and int(entry["id"]) == token:
                values.append(float(entry["logprob"]))
                entry = next(entries, None)
        return values

    def _spelled(self, context: Sequence[int], tail: Sequence[int]) -> list[float]:
        text = self.decode(list(tail)) if self.decode is not None else ""
        literal = json.dumps(text, ensure_ascii=False)  # GBNF string literals escape as JSON does
        out = self._complete(
            {
                "prompt": list(context),
                "n_predict": 4 * len(tail) + 4,
                "grammar": f"root ::= {literal}",
                "n_probs": 1,
                "temperature": 0,
            }
        )
        values = [float(e["logprob"]) for e in out["completion_probabilities"]]
        if not values:
            raise self.http.malformed("/completion", "no completion_probabilities")
        return values


ADAPTERS: dict[str, type[Adapter]] = {a.engine: a for a in (SGLang, VLLM, LlamaServer)}
ENGINES = tuple(ADAPTERS)


__all__ = ["ADAPTERS", "ENGINES", "Adapter", "Generated", "LlamaServer", "SGLang", "VLLM"]
