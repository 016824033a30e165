"""An in-process stand-in for SGLang, vLLM and llama-server, backed by a tiny HF model.

It speaks each engine's JSON (the fields RemoteMember uses) on 127.0.0.1, on a free port, and
computes with a real model, so the numbers a remote member reads are real. Faults on demand:
`slow` (seconds to wait before answering), `malformed` (answer non-JSON), `stop()` (vanish).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


class StubServer:
    def __init__(self, engine: str, member, *, trim_stop: bool = False) -> None:
        self.engine = engine
        self.model = member.model
        self.tokenizer = member.tokenizer
        self.eos = member.tokenizer.eos_token_id
        self.trim_stop = trim_stop  # leave out the stop token it ended at (as some servers do)
        self.slow = 0.0
        self.malformed = False
        self.requests: list[tuple[str, dict]] = []
        self.lock = threading.Lock()  # one request at a time, as one GPU would
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._answer(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                self._answer(json.loads(self.rfile.read(length)))

            def _answer(self, payload) -> None:
                stub.requests.append((self.path, payload))
                if stub.slow:
                    time.sleep(stub.slow)
                if stub.malformed:
                    body = b"{this is not json"
                else:
                    try:
                        with stub.lock:
                            out = stub.route(self.path, payload)
                    except LookupError as e:
                        self.send_error(404, str(e))
                        return
                    except RuntimeError as e:
                        self.send_error(500, str(e))
                        return
                    body = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the model ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()  # [T, V]
        return torch.log_softmax(logits, dim=-1)

    def generate(self, ids, n, stop_ids, temperature=0.0, seed=0) -> tuple[list[int], bool]:
        generator = torch.Generator().manual_seed(seed)
        out: list[int] = []
        for _ in range(n):
            row = self.logprobs(ids + out)[-1]
            if temperature > 0:
                token = int(torch.multinomial(torch.softmax(row / temperature, -1), 1, generator=generator))
            else:
                token = int(row.argmax())
            out.append(token)
            if token in stop_ids:
                return (out[:-1] if self.trim_stop else out), True
        return out, False

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def scored(self, ids: list[int], start: int) -> list[float]:
        """Log-prob of ids[t] given ids[:t], for t from start on."""
        lp = self.logprobs(ids)
        return [float(lp[t - 1, ids[t]]) for t in range(start, len(ids))]

    # -- the engines' JSON ---------------------------------------------------------------------------

    def route(self, path: str, p: dict | None):
        if path == "/tokenize":
            text = p.get("prompt", p.get("content"))
            tokens = self.tokenize(text)
            if self.engine == "llama-server":
                return {"tokens": tokens}
            return {"tokens": tokens, "count": len(tokens), "max_model_len": 512}
        if self.engine == "sglang" and path == "/generate":
            return self.sglang(p)
        if self.engine == "vllm" and path == "/v1/models":
            return {"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 512}]}
        if self.engine == "vllm" and path == "/v1/completions":
            return self.vllm(p)
        if self.engine == "llama-server" and path == "/props":
            return {"default_generation_settings": {"n_ctx": 512}, "total_slots": 1}
        if self.engine == "llama-server" and path == "/completion":
            return self.llama(p)
        raise LookupError(path)

    def sglang(self, p: dict):
        params = p.get("sampling_params", {})
        batch = isinstance(p["input_ids"][0], list)
        prompts = p["input_ids"] if batch else [p["input_ids"]]
        starts = p.get("logprob_start_len", -1)
        starts = starts if isinstance(starts, list) else [starts] * len(prompts)
        results = []
        for ids, start in zip(prompts, starts):
            n = params.get("max_new_tokens", 128)
            stops = set(params.get("stop_token_ids", [])) | {self.eos}
            new, stopped = self.generate(
                ids, n, stops, params.get("temperature", 0), params.get("sampling_seed", 0)
            )
            finish = (
                {"type": "stop", "matched": new[-1] if new else self.eos} if stopped else {"type": "length"}
            )
            meta = {"finish_reason": finish, "prompt_tokens": len(ids), "completion_tokens": len(new)}
            if p.get("return_logprob"):
                values = self.scored(ids, start + 1)
                meta["input_token_logprobs"] = [[None, ids[start], None]] + [
                    [v, t, None] for v, t in zip(values, ids[start + 1 :])
                ]
            results.append({"text": self.tokenizer.decode(new), "output_ids": new, "meta_info": meta})
        return results if batch else results[0]

    def vllm(self, p: dict):
        prompts = p["prompt"] if isinstance(p["prompt"][0], list) else [p["prompt"]]
        choices = []
        for i, ids in enumerate(prompts):
            stops = set(p.get("stop_token_ids", [])) | {self.eos}
            new, stopped = self.generate(
                ids, p["max_tokens"], stops, p.get("temperature", 0), p.get("seed", 0)
            )
            choice = {
                "index": i,
                "text": self.tokenizer.decode(new),
                "finish_reason": "stop" if stopped else "length",
                "stop_reason": None,
            }
            if p.get("return_token_ids"):
                choice["token_ids"], choice["prompt_token_ids"] = new, ids
            if p.get("prompt_logprobs") is not None:
                values = self.scored(ids, 1)
                choice["prompt_logprobs"] = [None] + [
                    {str(t): {"logprob": v, "rank": 1, "decoded_token": self.tokenizer.decode([t])}}
                    for v, t in zip(values, ids[1:])
                ]
            choices.append(choice)
        return {"id": "cmpl-stub", "object": "text_completion", "model": p["model"], "choices": choices}

    def llama(self, p: dict):
        ids, n = p["prompt"], p["n_predict"]
        if "grammar" in p:  # only the grammars RemoteMember sends: root ::= <[a]> <[b]> ... or ""
            literal = p["grammar"].removeprefix("root ::= ")
            if literal.startswith('"') and literal != '""':  # a string: the stub spells it canonically
                forced = self.tokenize(json.loads(literal))
            else:
                forced = [int(t) for t in re.findall(r"<\[(\d+)\]>", p["grammar"])]
                # As llama.cpp: an end-of-generation or a byte token breaks a grammar of token ids.
                if self.eos in forced or any("\ufffd" in self.tokenizer.decode([t]) for t in forced):
                    raise RuntimeError(f"Unexpected empty grammar stack: {forced}")
            new = forced[:n]
            if len(new) < n:  # the grammar is complete: only end-of-generation may follow
                new.append(self.eos)
            stopped = bool(new) and new[-1] == self.eos
        else:
            new, stopped = self.generate(ids, n, {self.eos}, p.get("temperature", 0.8), p.get("seed", 0))
        out = {
            "content": self.tokenizer.decode(new),
            "tokens": new,
            "stop": True,
            "stop_type": "eos" if stopped else "limit",
            "tokens_evaluated": len(ids),
        }
        if p.get("n_probs", 0) > 0:
            values = self.scored(ids + new, len(ids))
            out["completion_probabilities"] = [
                {"id": t, "token": self.tokenizer.decode([t]), "logprob": v, "bytes": [], "top_logprobs": []}
                for t, v in zip(new, values)
            ]
        return out
