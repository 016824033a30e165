"""An in-process stand-in for SGLang, vLLM and llama-server, backed by a tiny HF model.

It speaks each engine's JSON (the fields RemoteMember uses) on 127.0.0.1, on a free port, and
computes with a real model, so the numbers a remote member reads are real. Faults on demand:
`slow` (seconds to wait before answering), `malformed` (answer non-JSON), `stop()` (vanish), and
`fault` (every request) or `next_faults` (one each, for the next requests) naming one of FAULTS.
It records each request's path, payload and headers.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

# What a misbehaving server does instead of answering:
FAULTS = (
    "hang",  # never answers
    "trickle",  # sends its headers, then one byte every `trickle_s`
    "malformed",  # 200 with a body that is not JSON
    "shape",  # 200 with JSON of the wrong shape
    "html",  # 200 with an HTML page (a proxy's or a login page)
    "http500",  # an internal error, with an HTML body
    "http503",  # "loading the model, try again"
    "reset",  # closes the connection without answering
    "dies",  # sends its headers and part of the body, then closes the connection
    "redirect",  # 307 to `redirect_to`
    "big",  # 200 with a JSON body of `big_bytes`, its length announced
    "flood",  # the same without a length: the body ends when the connection does
)
HTML = b"<html><body><h1>Oops</h1><a href='https://attacker.example/'>click</a></body></html>"


class StubServer:
    def __init__(self, engine: str, member, *, trim_stop: bool = False) -> None:
        self.engine = engine
        self.model = member.model
        self.tokenizer = member.tokenizer
        self.eos = member.tokenizer.eos_token_id
        self.trim_stop = trim_stop  # leave out the stop token it ended at (as some servers do)
        self.slow = 0.0
        self.malformed = False
        self.fault: str | None = None  # on every request
        self.next_faults: list[str] = []  # one per request, before `fault`
        self.trickle_s = 0.2
        self.redirect_to = "http://127.0.0.1:9/elsewhere"
        self.big_bytes = 10_000
        self.stopped = threading.Event()  # ends hanging and trickling answers
        self.requests: list[tuple[str, dict]] = []
        self.headers: list[dict[str, str]] = []
        self.clients: list[tuple[str, int]] = []  # each request's client address: one per connection
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()  # one request at a time, as one GPU would
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers: clients reuse connections

            def log_message(self, *args) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                stub.connections.add(self.connection)

            def do_GET(self) -> None:
                self._answer(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                self._answer(json.loads(self.rfile.read(length)))

            def _answer(self, payload) -> None:
                stub.requests.append((self.path, payload))
                stub.headers.append(dict(self.headers))
                stub.clients.append(self.client_address)
                if stub.slow:
                    time.sleep(stub.slow)
                fault = stub.next_faults.pop(0) if stub.next_faults else stub.fault
                if fault is not None:
                    stub.misbehave(self, fault)
                    return
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
        """Vanish as a killed server does: no new connections, the open ones cut."""
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()
        for connection in list(self.connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    # -- faults ------------------------------------------------------------------------------------

    def misbehave(self, handler: BaseHTTPRequestHandler, fault: str) -> None:
        def send(status: int, body: bytes, kind="application/json", length=None, **headers) -> None:
            handler.send_response(status)
            handler.send_header("Content-Type", kind)
            handler.send_header("Content-Length", str(len(body) if length is None else length))
            for key, value in headers.items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(body)
            handler.wfile.flush()

        def cut() -> None:  # the connection ends here
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)

        if fault == "hang":
            self.stopped.wait(300)
        elif fault == "trickle":
            send(200, b"", length=1000)
            for _ in range(1000):
                if self.stopped.wait(self.trickle_s):
                    break
                try:
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                except OSError:  # the client gave up
                    break
        elif fault == "malformed":
            send(200, b"{this is not json")
        elif fault == "shape":
            send(200, b'{"unexpected": ["shape"]}')
        elif fault == "html":
            send(200, HTML, kind="text/html")
        elif fault in ("http500", "http503"):
            send(int(fault[4:]), HTML, kind="text/html")
        elif fault == "reset":
            cut()
        elif fault == "dies":
            send(200, b'{"tokens": [1, 2', length=1000)
            cut()
        elif fault == "redirect":
            send(307, b"", Location=self.redirect_to)
        elif fault == "big":
            send(200, json.dumps({"padding": "x" * self.big_bytes}).encode())
        elif fault == "flood":
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()
            handler.wfile.write(json.dumps({"padding": "x" * self.big_bytes}).encode())
            cut()
        else:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")

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
