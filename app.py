"""SpecFuse Studio, the Gradio app's entry point (and the Hugging Face Space's app_file).

Arguments, queue and launch; the app itself is the studio package (views, settings form, panels,
handlers, layout). No torch at import: members load in the background once it starts (or when a run asks
for them, with --load-on-run).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gradio as gr
import httpx  # a Gradio dependency

from specfuse import SpecfuseError
from specfuse.engine import ServerSettings
from specfuse.flags import Parser, add_loading_flags, add_settings, from_args
from specfuse.heap import freeze_survivors
from specfuse.models.catalogue import CATALOGUE
from specfuse.models.hardware import settle_auto
from specfuse.models.quantize_options import check_quantize, cpu_only
from specfuse.models.trust import load_trust
from specfuse.trace import MAX_TRACE_BYTES
from studio import DEVICES, SharedLoader, build_demo
from studio.i18n import gradio_own
from studio.loading import installed_models, served_members, usable_devices
from studio.room_page import serve_room
from studio.serving import DEFAULT_CONCURRENCY, STATUS_TIMER_GUARD, ApiRoute, PageHead, Schedulers

ASSETS = Path(__file__).resolve().parent / "assets"


def serve(
    demo: gr.Blocks,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    max_size: int = 16,
    concurrency: int = 1,
    run_history: bool = False,
    prevent_thread_lock: bool = False,
    api: Any = None,
    then: Callable[[], None] | None = None,
    freeze: bool = False,
) -> tuple[Any, str, str | None]:
    """Queue (bounded) and launch with the Gradio 6 conventions: theme and CSS in launch(), no SSR.

    `api`: an ASGI app (specfuse.serve.api.create_app) answering /v1/… and /health on the same port.
    `then`: called once the page answers (app.preparation: the members load while it is read).
    `freeze`: this process serves until it stops: once the page answers, what start-up made (the
    libraries, the page, members loaded before it) is kept out of the garbage collector's full passes
    (specfuse.heap), which would otherwise walk it in the middle of someone's round."""
    css_path = ASSETS / "app.css"
    demo.queue(max_size=max_size, default_concurrency_limit=concurrency)
    room = serve_room(demo)  # a class's phones: a slot each, and no "Queue is full" when they join
    launched = _launch_patiently(
        demo,
        server_name=host,
        server_port=port,
        share=share,
        ssr_mode=False,  # SSR needs Node 24+
        run_history=run_history,
        footer_links=["api", "settings"],
        i18n=gradio_own(),
        max_file_size=MAX_TRACE_BYTES,
        theme=gr.themes.Soft(),
        css_paths=[css_path] if css_path.exists() else None,
        prevent_thread_lock=True,
        quiet=prevent_thread_lock,
        **room,
    )
    PageHead(STATUS_TIMER_GUARD, demo).mount(launched[0])
    if api is not None:
        ApiRoute(api).mount(launched[0])
    if freeze:  # before `then`: nobody's run is under way yet, and no member is half loaded
        freeze_survivors(lambda line: print(line, file=sys.stderr))
    if then is not None:  # after launch: loading (torch's import, conversions) then slows no page
        then()
    if not prevent_thread_lock:
        demo.block_thread()
    return launched


UNREACHABLE = "When localhost is not accessible"  # the start of Gradio's own message
PATIENCE_S = 30.0


def _launch_patiently(demo: gr.Blocks, **launch: Any) -> tuple[Any, str, str | None]:
    """demo.launch, but a page that answers late is still a page.

    Gradio asks its new server for "/" and, at the first answer later than 3 s, stops
    with "When localhost is not accessible…" though the server runs. On a busy machine (members
    converting, another process on both cores) the first answer can take longer: ask again for up to
    PATIENCE_S, then either carry on exactly as launch would have (no share link, nothing inline) or
    say what is wrong."""
    try:
        return demo.launch(**launch)
    except ValueError as error:
        if launch.get("share") or not str(error).startswith(UNREACHABLE):
            raise
        address = str(demo.local_url)  # set once the server runs
        if not _answers(address, PATIENCE_S):
            demo.close()
            raise SpecfuseError(
                f"the app started on {address} but that address did not answer within "
                f"{PATIENCE_S:.0f} s: is a proxy set for local addresses (HTTP_PROXY without NO_PROXY)?"
            ) from error
        demo.share_url = None
        return demo.server_app, address, None


def _answers(url: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.head(url, timeout=max(0.5, deadline - time.monotonic())).status_code < 400:
                return True
        time.sleep(0.25)
    return False


def space_arguments() -> list[str] | None:
    """On a Hugging Face Space (started as plain `python app.py`): the arguments in spaces_config.yaml.

    SPECFUSE_APP_ARGS overrides them anywhere; None elsewhere, so argparse reads the command line.
    """
    if "SPECFUSE_APP_ARGS" in os.environ:
        return shlex.split(os.environ["SPECFUSE_APP_ARGS"])
    config = Path(__file__).resolve().parent / "spaces_config.yaml"
    if not os.environ.get("SPACE_ID") or not config.exists():
        return None
    import yaml  # a Gradio dependency

    return shlex.split(str(yaml.safe_load(config.read_text(encoding="utf-8")).get("app_args", "")))


def _is_spec(name: str) -> bool:
    """A served member's spec (ENGINE:URL…): only a name with a URL can be one, so only such names ask."""
    if "://" not in name:
        return False
    from specfuse.members.remote.member import is_server_spec

    return is_server_spec(name)


def build_parser() -> Parser:
    parser = Parser(prog="app.py", description="SpecFuse Studio: the Gradio app.")
    parser.add_argument(
        "--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), help="address to bind"
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="open a public gradio.live link")
    parser.add_argument(
        "--allow-paths", action="store_true", help="let users name local checkpoint folders or hub ids"
    )
    add_loading_flags(
        parser,
        only=("models", "device", "dtype", "quantize", "trust", "decode", "processes"),
        defaults={"device": "auto"},
        devices=DEVICES,
        users="one user, or many with --share or another --host",
        models_help="the members selected at start",
    )
    parser.add_argument("--preload", action="store_true", help="load the default members before serving")
    parser.add_argument(
        "--load-on-run",
        action="store_true",
        help="load members only when a run asks for them (default: the --models start loading, and "
        "warm up, in the background as the app starts; this keeps memory free until then)",
    )
    parser.add_argument("--queue-size", type=int, default=16, help="requests waiting at most")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="runs at once: --batch-size of them play in one batch, the others see their place in line "
        "(default %(default)s)",
    )
    operator = ("batch_size", "parallel", "max_paused", "pause_idle_s", "prefill_chunk")
    add_settings(parser, of=ServerSettings, only=operator)  # the API's --queue and --join-wait: its own
    parser.add_argument(
        "--api",
        action="store_true",
        help="also serve the OpenAI-compatible API at /v1 on the same port, through the same batch "
        "(loads --models before serving; docs/serve.md)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SPECFUSE_API_KEY"),
        help="with --api: require 'Authorization: Bearer KEY' on /v1 (default $SPECFUSE_API_KEY)",
    )
    parser.add_argument(
        "--eval-dir", type=Path, help="an evaluation run folder to browse its failure cases in the app"
    )
    parser.add_argument("--run-history", action="store_true", help="keep Gradio's per-browser run history")
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="SPEC",
        help="offer a served member, ENGINE:URL#NAME[?tokenizer=...] (repeatable; docs/remote.md)",
    )
    return parser


def parse_args(parser: Parser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """app.py's arguments: `argv`, else the Space's (spaces_config.yaml) when started bare on one, else
    the command line. A bad value exits with status 2 and says which."""
    args = parser.parse_args(space_arguments() if argv is None and len(sys.argv) == 1 else argv)
    if min(args.concurrency, args.queue_size) < 1:
        parser.exit(2, "error: --concurrency and --queue-size must be at least 1\n")
    try:
        from_args(args, ServerSettings)  # the operator's settings, checked by their declaration
    except SpecfuseError as e:
        parser.exit(2, f"error: {e}\n")
    return args


def operator_schedulers(args: argparse.Namespace) -> Schedulers:
    """The app's schedulers, with the operator's settings (--batch-size, --parallel, step mode's
    bounds, --prefill-chunk: ServerSettings)."""
    return Schedulers(settings=from_args(args, ServerSettings))


def settle_quantize(args: argparse.Namespace) -> str:
    """--quantize with auto chosen, and said, for this app's users: a page others can reach (--share,
    an address other than loopback) serves many at once, else one person (models/hardware.py)."""
    users = "many" if args.share or args.host not in ("127.0.0.1", "localhost", "::1") else "one"
    return settle_auto(args.quantize, users, args.device, lambda line: print(line, file=sys.stderr), "app.py")


def preparation(
    args: argparse.Namespace, loader: SharedLoader, members: list[str]
) -> Callable[[], None] | None:
    """What starts loading the default members in the background once the page answers (while it is
    read; a Run pressed earlier waits for this load), placed as a Run places them; None with
    --load-on-run, or where they load before serving (--preload, --api). A device setting that cannot
    work here starts nothing (the Run says why)."""
    from specfuse.models.devices import plan_devices

    if args.load_on_run or args.preload or args.api:
        return None

    def start() -> None:
        with contextlib.suppress(SpecfuseError):
            loader.prepare(members, plan_devices(len(members), args.device))

    return start


def shared_loader(args: argparse.Namespace, trust: Mapping[str, float] | None) -> SharedLoader:
    """The members every session shares, loaded as the operator's flags say."""
    return SharedLoader(
        allow_paths=args.allow_paths,
        trusted=[*args.models, *args.server],
        dtype=args.dtype,
        quantize=args.quantize,
        processes="auto" if args.processes is None else args.processes,
        trust=trust,
        decode=args.decode,
    )


def offered_members(args: argparse.Namespace) -> tuple[dict[str, str], list[str], list[str]]:
    """(served members by name, the names offered, the names picked at first). Offered: only what can
    work here: installed catalogue models (plus what the operator named); served members by their
    names only (SpecfuseError for a server spec that cannot be used)."""
    installed = installed_models()
    specs = [*(m for m in args.models if _is_spec(m)), *args.server]
    named = [m for m in args.models if m not in specs and (m not in CATALOGUE or m in installed)]
    served = served_members(list(dict.fromkeys(specs)), taken=[*installed, *named])
    name_of = {spec: name for name, spec in served.items()}
    defaults = [name_of.get(m, m) for m in args.models if m in specs or m in named]
    return served, list(dict.fromkeys([*installed, *named, *served])), defaults


def main(argv: Sequence[str] | None = None) -> None:
    from specfuse.models.devices import plan_devices

    parser = build_parser()
    args = parse_args(parser, argv)

    try:
        trust = load_trust(args.trust) if args.trust is not None else None
        check_quantize(args.quantize)
    except SpecfuseError as e:
        parser.exit(2, f"error: {e}\n")
    devices = usable_devices()
    args.quantize = settle_quantize(args)
    if cpu_only(args.quantize):  # offer no other device
        if args.device not in ("auto", "cpu"):
            parser.exit(2, f"error: --quantize {args.quantize} runs on the CPU only; use --device cpu\n")
        args.device, devices = "cpu", ["cpu"]
    loader = shared_loader(args, trust)
    try:
        served, choices, defaults = offered_members(args)
    except SpecfuseError as e:
        parser.exit(2, f"error: {e}\n")
    schedulers = operator_schedulers(args)
    api = None
    if args.preload or args.api:
        from specfuse.models.placement import load_each, tqdm_progress

        try:
            members = load_each(
                args.models, plan_devices(len(args.models), args.device), loader, tqdm_progress("loading")
            )
        except SpecfuseError as e:
            parser.exit(2, f"error: {e}\n")
        if args.api:  # the API's scheduler is the app's: browser and API users share its batch
            from specfuse.serve.api import create_app

            api = create_app(schedulers.of(members), api_key=args.api_key)
    preparing = preparation(args, loader, [served.get(m, m) for m in defaults])
    demo = build_demo(
        loader,
        choices=choices,
        default_models=defaults,
        allow_paths=args.allow_paths,
        device=args.device,
        devices=devices,
        plan_devices=plan_devices,
        concurrency_limit=args.concurrency,
        eval_dir=args.eval_dir,
        served=served,
        schedulers=schedulers,
    )
    try:
        serve(
            demo,
            host=args.host,
            port=args.port,
            share=args.share,
            max_size=args.queue_size,
            concurrency=args.concurrency,
            run_history=args.run_history,
            api=api,
            then=preparing,
            freeze=True,
        )
    finally:
        schedulers.close()


if __name__ == "__main__":
    main()
