"""`specfuse-serve` / `python -m specfuse.serve`: load the members, start the Scheduler, serve the
OpenAI-compatible API with uvicorn (on 127.0.0.1 unless told otherwise).

Knows nothing about the routes (api.py) or the batch (specfuse.engine); its flags are
flags.py's (the run settings, the operator's ServerSettings, the requests' Limits, each declared once),
and a bad flag exits 2 with one line, as the CLI's.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from ..engine import Scheduler, ServerSettings
from ..engine.scheduler import load_in_background
from ..errors import ConfigError, SpecfuseError
from ..flags import (
    LOADING,
    Parser,
    add_loading_flags,
    add_settings,
    config_from_args,
    from_args,
    parse_models,
)
from ..heap import freeze_survivors
from ..limits import Limits
from ..models.catalogue import DEFAULT_MEMBERS
from ..models.quantize_options import check_quantize, cpu_only

if TYPE_CHECKING:
    from ..config import EnsembleConfig
    from ..models.preparation import Preparation

log = logging.getLogger("specfuse.serve")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="specfuse-serve",
        description="Serve the ensemble through an OpenAI-compatible API (/v1/chat/completions, "
        "/v1/completions, /v1/models, /v1/traces/ID), many requests at once in one rolling batch.",
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    add("--port", type=int, default=8000, help="port (default 8000)")
    members = ",".join(DEFAULT_MEMBERS)
    defaults = {"models": members, "processes": False}
    add_loading_flags(parser, only=LOADING, defaults=defaults, users="many users at once")
    add(
        "--api-key",
        default=os.environ.get("SPECFUSE_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default $SPECFUSE_API_KEY; none: no key)",
    )
    add_settings(parser, of=ServerSettings)
    add_settings(parser, of=Limits)
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
    operator, limits = from_args(args, ServerSettings), from_args(args, Limits)  # checked: ConfigError
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
    app = create_app(api_key=args.api_key, limits=limits)

    preparation, load = _loading(args, names, config, quantize, trust, operator)
    app.state.serving.preparing = preparation.snapshot

    def ready(scheduler: Scheduler) -> None:
        freeze_survivors(log.info)  # start-up is over: its objects out of the collector's full passes
        app.state.serving.attach(scheduler)
        where = " (each in a worker process of its own)" if args.processes else ""
        log.info(
            "serving %s%s, batch size %d, queue %d",
            ", ".join(scheduler.names),
            where,
            args.batch_size,
            args.queue,
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
    operator: ServerSettings,
) -> tuple[Preparation, Callable[[], Scheduler]]:
    """What the members' preparation is doing (each member's steps logged with their times, and said
    by /health while they run), and the load that makes the scheduler (each member warmed up)."""
    from ..models.names import resolve_quantize
    from ..models.placement import load_members
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
            processes=args.processes,
        )
        preparation.ready()
        if trust is not None:
            apply_trust(members, trust)
        return Scheduler(members, config, operator)

    return preparation, load
