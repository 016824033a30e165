"""`specfuse-serve` / `python -m specfuse.serve`: load the members, start the Scheduler, serve the
OpenAI-compatible API with uvicorn (on 127.0.0.1 unless told otherwise).

Knows nothing about the routes (api.py) or the batch (specfuse.engine); the run settings are the CLI's
own flags (specfuse.cli.add_settings), and a bad flag exits 2 with one line, as there.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from ..cli import (
    HELP_WIDTH,
    Parser,
    add_loading_flags,
    add_settings,
    add_step_flags,
    check_step_flags,
    config_from_args,
    parse_models,
)
from ..engine import DEFAULT_BATCH_SIZE, DEFAULT_JOIN_WAIT, DEFAULT_QUEUE, Scheduler
from ..engine.scheduler import load_in_background
from ..errors import ConfigError, SpecfuseError
from ..models.catalogue import DEFAULT_MEMBERS
from ..models.quantize_options import check_quantize, cpu_only
from .schema import Limits

if TYPE_CHECKING:
    from ..config import EnsembleConfig
    from ..models.preparation import Preparation

log = logging.getLogger("specfuse.serve")


def build_parser() -> argparse.ArgumentParser:
    limits = Limits()
    parser = Parser(
        prog="specfuse-serve",
        description="Serve the ensemble through an OpenAI-compatible API (/v1/chat/completions, "
        "/v1/completions, /v1/models, /v1/traces/ID), many requests at once in one rolling batch.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH, max_help_position=32),
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    add("--port", type=int, default=8000, help="port (default 8000)")
    add("--models", default=",".join(DEFAULT_MEMBERS), help="comma-separated members (as the CLI takes them)")
    add_loading_flags(parser, quantize="auto", processes=False, users="many users at once")
    add(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help="requests under way at once (default %(default)s)",
    )
    add(
        "--queue",
        type=int,
        default=DEFAULT_QUEUE,
        help="requests waiting beyond those; more get 429 (default %(default)s)",
    )
    add(
        "--join-wait",
        type=float,
        default=DEFAULT_JOIN_WAIT,
        help="seconds the next round may wait for new requests when some have just ended (at most "
        "a tenth of a round; 0: never) (default %(default)s)",
    )
    add_step_flags(parser)
    add(
        "--api-key",
        default=os.environ.get("SPECFUSE_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default $SPECFUSE_API_KEY; none: no key)",
    )
    add(
        "--max-prompt-chars",
        type=int,
        default=limits.max_prompt_chars,
        help="longest prompt, in characters; longer: 413 (default %(default)s)",
    )
    add(
        "--max-tokens",
        type=int,
        default=limits.max_tokens,
        help="largest max_tokens a request may ask (default %(default)s)",
    )
    add(
        "--request-timeout",
        type=float,
        default=limits.request_timeout_s,
        help="seconds a request may take, time in line included (default %(default)s)",
    )
    add(
        "--traces",
        type=int,
        default=limits.traces,
        help="recent traces kept for GET /v1/traces/ID (default %(default)s)",
    )
    add_settings(parser)
    return parser


def main(argv: Sequence[str] | None = None, stderr: TextIO | None = None) -> int:
    err = stderr or sys.stderr
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=err, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _serve(args)
    except SpecfuseError as e:
        print(f"specfuse-serve: error: {e}", file=err)
        return 2


def _serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    names = parse_models(args.models, sampling=config.sampling)
    for flag in ("batch_size", "max_prompt_chars", "max_tokens", "traces"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.queue < 0 or not args.join_wait >= 0 or not args.request_timeout > 0:  # nan included
        raise ConfigError("--queue and --join-wait must be ≥ 0 and --request-timeout > 0")
    check_step_flags(args)
    check_quantize(args.quantize)  # before listening: the members load after the port is open
    if cpu_only(args.quantize) and args.device.startswith(("cuda", "per-gpu")):
        raise ConfigError(f"--quantize {args.quantize} runs on the CPU only; use --device cpu")
    import uvicorn

    from ..models.hardware import settle_auto
    from ..models.loading import check_member_name
    from ..models.trust import load_trust
    from .api import create_app

    for name in names:
        check_member_name(name)
    quantize = settle_auto(args.quantize, "many", args.device, log.info, "specfuse-serve")
    trust = load_trust(args.trust) if args.trust is not None else None  # a bad file: refused at once
    limits = Limits(args.max_prompt_chars, args.max_tokens, args.request_timeout, args.traces)
    app = create_app(api_key=args.api_key, limits=limits)

    preparation, load = _loading(args, names, config, quantize, trust)
    app.state.serving.preparing = preparation.snapshot

    def ready(scheduler: Scheduler) -> None:
        app.state.serving.attach(scheduler)
        log.info(
            "serving %s, batch size %d, queue %d", ", ".join(scheduler.names), args.batch_size, args.queue
        )

    def failed(e: BaseException) -> None:
        preparation.failed(e)
        failures.append(e)
        log.error("loading failed: %s", e)
        server.should_exit = True

    failures: list[BaseException] = []
    served = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=10
    )
    server = uvicorn.Server(served)
    load_in_background(load, ready, failed)
    log.info("listening on http://%s:%d/v1 (loading %s)", args.host, args.port, ", ".join(names))
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises Ctrl-C after shutting down
        server.run()
    scheduler = app.state.serving.scheduler
    if scheduler is not None:
        scheduler.close()
    if failures:
        raise (
            failures[0]
            if isinstance(failures[0], SpecfuseError)
            else SpecfuseError(f"loading failed: {failures[0]}")
        )
    return 0


def _loading(
    args: argparse.Namespace,
    names: list[str],
    config: EnsembleConfig,
    quantize: str,
    trust: dict[str, float] | None,
) -> tuple[Preparation, Callable[[], Scheduler]]:
    """What the members' preparation is doing (each member's steps logged with their times, and said
    by /health while they run), and the load that makes the scheduler (each member warmed up)."""
    from ..models.loading import load_members
    from ..models.names import resolve_quantize
    from ..models.preparation import Preparation, warmed
    from ..models.trust import apply_trust

    preparation = Preparation(
        names, lambda name: resolve_quantize(quantize, name, args.device), log.info, args.cache_dir
    )

    def load() -> Scheduler:  # the server answers 503 (and /health "loading") until this is done
        members = load_members(
            names,
            device=args.device,
            dtype=args.dtype,
            cache_dir=args.cache_dir,
            quantize=quantize,
            progress=preparation.progress,
            load=warmed,
            decode=args.decode,
        )
        preparation.ready()
        if trust is not None:
            apply_trust(members, trust)
        return Scheduler(
            members,
            config,
            batch_size=args.batch_size,
            queue=args.queue,
            join_wait=args.join_wait,
            parallel=args.parallel,
            max_paused=args.max_paused,
            pause_idle_s=args.pause_idle,
            prefill_chunk=args.prefill_chunk,
        )

    return preparation, load
