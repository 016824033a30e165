"""Real clients' side of the live-server tests (test_serve_*): the API served on a scheduler for a
block, the official `openai` client on it, the requests a client leaves unfinished (a stream hung up,
a socket closed), an offline GSM8K task for lm-evaluation-harness and its run, and an ASGI wrapper
that keeps what the server was sent (to check what a client nobody here wrote really put in its
requests)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai

from specfuse.bench.serve import running
from specfuse.serve.api import create_app

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "dev.jsonl"
TASK = """\
task: {name}
custom_dataset: !function utils.load
test_split: test
{fewshot}output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer.split('#### ')[-1]}}}}"
generation_kwargs:
  until: ["Question:"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: 12
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
filter_list:
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: take_first
metadata:
  version: 1.0
"""
# The few-shot examples come from a split of their own (the problems after the test rows).
FEWSHOT = "fewshot_split: train\n"
UTILS = """\
from pathlib import Path

import datasets


def load(**kwargs):
    here = Path(__file__).parent
    files = {"test": str(here / "rows.jsonl")}
    if (here / "shots.jsonl").is_file():
        files["train"] = str(here / "shots.jsonl")
    return datasets.load_dataset("json", data_files=files)
"""


@contextlib.contextmanager
def api_on(scheduler, wrap: Callable[[Any], Any] | None = None, **options) -> Iterator[tuple[str, Any]]:
    """The API on `scheduler` (create_app's `options`: limits, api_key), `wrap`ped if given (Recorder),
    live on a free loopback port for the block: its URL and the app served. The scheduler is closed
    afterwards."""
    try:
        app = create_app(scheduler, **options)
        app = wrap(app) if wrap else app
        with running(app) as url:
            yield url, app
    finally:
        scheduler.close()


def openai_client(url: str, **options) -> openai.OpenAI:
    """The official client on the API at `url`: no retries (a test sees the first answer), 120 s."""
    return openai.OpenAI(
        base_url=url + "/v1", **({"api_key": "EMPTY", "max_retries": 0, "timeout": 120} | options)
    )


def hang_up(url: str, prompt: str) -> None:
    """A long completion streamed, one chunk of it read, then the connection closed."""
    body = {"model": "specfuse", "prompt": prompt, "stream": True, "max_tokens": 200}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        next(response.iter_lines())


@contextlib.contextmanager
def unanswered(url: str, path: str, body: dict) -> Iterator[None]:
    """`body` POSTed whole to `path` on a socket of its own, closed when the block ends, its answer
    never read: a client that went away."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        yield


def send_and_close(url: str, prompt: str, rng: random.Random) -> None:
    """A whole completion request sent, its socket closed up to 0.3 s later (drawn from `rng`)."""
    with unanswered(url, "/v1/completions", {"model": "specfuse", "prompt": prompt, "max_tokens": 200}):
        time.sleep(rng.uniform(0.0, 0.3))


def gsm8k_task(folder: Path, name: str, rows: int, shots: int = 0, shortest: bool = False) -> Path:
    """A task `name` over the first `rows` problems of the GSM8K development slice, with the next
    `shots` problems as its few-shot split; its folder (for --include_path). `shortest`: the
    problems in order of their question's length (few-shot prompts that fit a tiny member's context)."""
    folder.mkdir()
    lines = GSM8K.read_text(encoding="utf-8").splitlines()
    if shortest:
        lines.sort(key=lambda line: len(json.loads(line)["question"]))
    (folder / f"{name}.yaml").write_text(TASK.format(name=name, fewshot=FEWSHOT if shots else ""))
    (folder / "utils.py").write_text(UTILS)
    (folder / "rows.jsonl").write_text("\n".join(lines[:rows]) + "\n", encoding="utf-8")
    if shots:
        (folder / "shots.jsonl").write_text("\n".join(lines[rows : rows + shots]) + "\n", encoding="utf-8")
    return folder


def run_lm_eval(
    url: str,
    folder: Path,
    name: str,
    out: Path,
    *extra: str,
    concurrent: int = 3,
    timeout: float = 240,
    completions: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`lm_eval` against the server's chat endpoint on the task in `folder`, offline, its caches
    under out's parent; `extra`: more of its flags (--num_fewshot, --limit, …). `completions`: its
    `local-completions` model on /v1/completions instead (loglikelihood tasks: echo, and the
    server's /tokenize as its tokenizer)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(out.parent / "hf"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    path, model = (
        ("completions", "local-completions")
        if completions
        else ("chat/completions", "local-chat-completions")
    )
    model_args = f"model=specfuse,base_url={url}/v1/{path},num_concurrent={concurrent},max_retries=1"
    chat = () if completions else ("--apply_chat_template",)
    args = [
        *(sys.executable, "-m", "lm_eval", "--model", model),
        *("--model_args", f"{model_args},timeout=120", *chat),
        *("--tasks", name, "--include_path", str(folder), "--output_path", str(out), "--log_samples"),
        *extra,
    ]
    return subprocess.run(args, cwd=out.parent, env=env, capture_output=True, text=True, timeout=timeout)


class Recorder:
    """An ASGI app around `app` that keeps the JSON body of every POST it passes on (`bodies`)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[Any] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False) and message["type"] == "http.request"
        try:
            self.bodies.append(json.loads(body))
        except ValueError:
            self.bodies.append(body)
        given = False

        async def again() -> dict:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the client's disconnect, when it comes

        await self.app(scope, again, send)

    def chats(self) -> list[list[dict]]:
        """The `messages` of each chat request so far, in order."""
        return [b["messages"] for b in self.bodies if isinstance(b, dict) and "messages" in b]
