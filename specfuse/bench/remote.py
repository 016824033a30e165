"""Benchmark: the default trio served by llama-server (one process each) against the same trio in-process.

Also owns starting and stopping a local llama-server for a catalogue model (the benchmark and the
real-server test use it). Prints tokens per second and first-segment latency side by side, with
ratios. Knows nothing about scoring: it runs the Ensemble and reads its Result.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..config import EnsembleConfig
from ..engine import Ensemble
from ..errors import SpecfuseError
from ..flags import Parser, add_loading_flags, add_settings
from ..models.cache import assemble_gguf, cache_root
from ..models.catalogue import CATALOGUE

log = logging.getLogger(__name__)

PROMPT = "Write a numbered list of five tips for learning to cook, one sentence each."


def llama_server_binary() -> Path:
    """Where `make llama-server` (tools/build_llama.sh) puts the binary; it may be absent."""
    root = os.environ.get("LLAMA_DIR") or Path.home() / ".cache" / "specfuse" / "llama.cpp"
    return Path(root).expanduser() / "bin" / "llama-server"


def gguf_of(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The verified GGUF file of a catalogue model (assembled into the cache when it comes in parts)."""

    return assemble_gguf(CATALOGUE[name], cache_root(cache_dir) / "gguf")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def llama_server(
    gguf: Path, *, threads: int = 1, ctx: int = 4096, binary: Path | None = None, wait_s: float = 120.0
) -> Iterator[str]:
    """Run llama-server on `gguf` at a free 127.0.0.1 port; yields its URL, stops it on exit."""
    binary = binary or llama_server_binary()
    if not binary.is_file():
        raise SpecfuseError(f"llama-server is not built at {binary}; run `make llama-server`")
    port = _free_port()
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                raise SpecfuseError(
                    f"llama-server exited at start: {(proc.stderr.read() if proc.stderr else '')[-800:]}"
                )
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if json.loads(r.read()).get("status") == "ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SpecfuseError(f"llama-server at {url} was not ready within {wait_s:.0f} s")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run(members: Sequence[Any], prompt: str, max_new_tokens: int, parallel: str) -> dict[str, float]:

    config = EnsembleConfig(score="logprob", max_new_tokens=max_new_tokens)
    ensemble = Ensemble(members, config, parallel=parallel)
    ensemble.run("Say hello.", EnsembleConfig(score="logprob", max_new_tokens=10))  # warm-up
    result = ensemble.run(prompt)
    return {
        "tokens": result.tokens,
        "rounds": result.rounds,
        "seconds": result.seconds,
        "tokens_per_s": result.tokens / result.seconds if result.seconds else 0.0,
        "first_segment_s": result.first_segment_latency_s,
    }


def run(
    names: Sequence[str],
    prompt: str,
    max_new_tokens: int,
    threads: int,
    dtype: str,
    servers: Sequence[str] = (),
) -> dict[str, Any]:
    """Both setups on one prompt: in-process members, then one llama-server per member.

    With `servers` (specs of running servers), those are benchmarked instead, against the models
    their `?tokenizer=` names loaded in-process.
    """
    from contextlib import ExitStack

    from ..members.remote.member import parse_server_spec  # only when serving
    from ..models.placement import load_members

    if servers:
        names = [parse_server_spec(s).tokenizer for s in servers]
    local = load_members(names, dtype=dtype)
    report: dict[str, Any] = {"models": list(names), "prompt": prompt, "max_new_tokens": max_new_tokens}
    report["in_process"] = _run(local, prompt, max_new_tokens, "off")
    del local
    with ExitStack() as stack:
        if not servers:
            urls = [stack.enter_context(llama_server(gguf_of(n), threads=threads)) for n in names]
            servers = [f"llama-server:{u}#{n}?tokenizer={n}" for n, u in zip(names, urls)]
        served = load_members(servers)
        report["llama_server"] = _run(served, prompt, max_new_tokens, "auto")
        report["servers"] = list(servers)
    report["load_average"] = os.getloadavg()
    return report


def format_report(report: dict[str, Any]) -> str:
    a, b = report["in_process"], report["llama_server"]
    lines = [
        f"models: {', '.join(report['models'])} | {report['max_new_tokens']} tokens | score: logprob",
        f"{'':<16}{'in-process':>12}{'served':>14}{'ratio':>8}",
    ]
    for key, label in (("tokens_per_s", "tokens/s"), ("first_segment_s", "first segment s")):
        ratio = b[key] / a[key] if a[key] else float("nan")
        lines.append(f"{label:<16}{a[key]:>12.2f}{b[key]:>14.2f}{ratio:>8.2f}")
    lines.append(f"rounds: {a['rounds']} / {b['rounds']} | load average: {report['load_average']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:

    parser = Parser(
        prog="python -m specfuse.bench remote",
        description="The trio in-process vs one llama-server each (issue 10). Run on an idle machine.",
    )
    add_loading_flags(parser, only=("models", "dtype"))
    add_settings(parser, only=("max_new_tokens",), defaults={"max_new_tokens": 120})
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads per process (-t)")
    parser.add_argument(
        "--servers", nargs="+", default=(), metavar="SPEC", help="running servers to measure instead"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        report = run(args.models, args.prompt, args.max_new_tokens, args.threads, args.dtype, args.servers)
    except SpecfuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
