"""The command line: `python -m specfuse` / `specfuse` streams an ensemble answer round by round.

An entry point only (its flags are flags.py's, as every main's). A consumer of Ensemble.stream(): the
answer goes to stdout as it grows, per-round progress to stderr, the trace to --trace; `specfuse
export` (handout/cli.py) turns a saved trace into a page or a slide. Every user-fixable error exits 2
with a one-line reason.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from .engine import Ensemble, ServerSettings, check_prompt
from .errors import ConfigError, SpecfuseError
from .flags import LOADING, Parser, add_loading_flags, add_settings, config_from_args, parse_models
from .models.catalogue import CATALOGUE, DEFAULT_MEMBERS
from .records import Round
from .trace import Trace, save_trace

if TYPE_CHECKING:
    from .members.protocol import Member

# `specfuse export …` (specfuse/handout/cli.py): a first argument of exactly this word is the command,
# not a prompt (a prompt that is just that word goes through stdin: echo export | specfuse -).
EXPORT = "export"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="specfuse",
        description="Several language models answer one prompt together, segment by segment (SpecEM).",
        epilog="Models: catalogue names (see --list-models), local checkpoint folders, or hub ids "
        "(owner/name; needs a hub connection). Exit status 2 means bad input; the reason is printed. "
        "A saved run to take home: specfuse export TRACE.json --html OUT.html (one offline page) or "
        "--png OUT.png --round K (a slide); see specfuse export --help.",
    )
    parser.add_argument("prompt", nargs="?", help="the prompt; '-' reads it from stdin")
    add = parser.add_argument
    add_loading_flags(parser, only=("models",), defaults={"models": ",".join(DEFAULT_MEMBERS)})
    add_settings(parser)
    add_loading_flags(parser, only=LOADING[1:])
    add_settings(parser, of=ServerSettings, only=("parallel",))  # where members run; no batch here
    add("--device-map", default=None, help="accelerate device map for large models, e.g. auto")
    add(
        "--compile",
        action="store_true",
        help="transformers members draft in a static KV cache with a torch.compile'd step: CUDA graphs "
        "on a GPU (H100: 2.92x as fast as eager drafts; docs/gpu.md), no gain on a CPU. Implies "
        "--quantize none; compiles once per member at the first draft (about a minute for a 7B model)",
    )
    add("--trust-remote-code", action="store_true", help="allow model code from checkpoints (off by default)")
    add("--trace", default=None, metavar="PATH", help="write the run as a JSON trace")
    add("--quiet", action="store_true", help="no progress on stderr")
    add("--list-models", action="store_true", help="list the catalogue and exit")
    add(
        "--verify-cache",
        action="store_true",
        help="hash every file of every cached catalogue model now (loads re-hash only files whose size "
        "or times changed); exit 1 if any is damaged (the next load rebuilds it)",
    )
    return parser


def progress_line(r: Round) -> str:
    """One stderr line per round: winner, margin, exits, speed."""
    line = (
        f"round {r.k:>3} | {r.winner.member} won by {r.margin:.3f} | {len(r.active)} drafting | "
        f"{r.seconds:.2f}s | +{r.winner.num_tokens} tok"
    )
    for e in r.exits:
        line += f" | {e.member} exits ({e.reason})"
    if r.stop_reason:
        line += f" | stop: {r.stop_reason}"
    return line


def main(
    argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == [EXPORT]:
        from .handout.cli import main as export

        return export(given[1:], out, err)
    parser = build_parser()
    args = parser.parse_args(given)
    logging.basicConfig(level=logging.WARNING, stream=err, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(args, out, err)
    except SpecfuseError as e:
        print(f"specfuse: error: {e}", file=err)
        return 2
    except KeyboardInterrupt:
        print("\nspecfuse: interrupted", file=err)
        return 130


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.list_models:
        for name, entry in CATALOGUE.items():
            print(f"{name:<20} {entry.params:>6}  {entry.licence}", file=out)
        return 0
    if args.verify_cache:
        return _verify_cache(args.cache_dir, out)
    config = config_from_args(args)
    prompt = read_prompt(args.prompt)
    check_prompt(prompt)
    names = parse_models(args.models, sampling=config.sampling)
    if args.trace is not None:
        check_writable(args.trace)  # before minutes of loading, not after the answer
    if args.compile and args.quantize not in ("auto", "none"):
        raise ConfigError(
            f"--compile compiles transformers' own decoding; it does not combine with --quantize "
            f"{args.quantize} (leave --quantize out, or drop --compile)"
        )
    from .models.loading import check_member_name  # brings torch: only once the flags are sound

    for name in names:  # an unknown name is refused before any note, bar or loading
        check_member_name(name)
    if len(names) == 1 and not args.quiet:
        print(
            f"specfuse: note: one member ({names[0]}) means plain decoding by that model, no ensemble; "
            "list two or more models to ensemble them",
            file=err,
        )
    from .models.hardware import settle_auto

    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=err))
    args.quantize = settle_auto(args.quantize, "one", args.device, say, "specfuse")
    members = _load(names, args, err)
    ensemble = Ensemble(members, config, parallel=args.parallel)
    trace = Trace(prompt, ensemble.names, config, ())
    rounds: list[Round] = []
    try:
        for r in ensemble.stream(prompt):
            rounds.append(r)
            out.write(r.winner.text)
            out.flush()
            if not args.quiet:
                print(progress_line(r), file=err)
    finally:  # an interrupted run still leaves its trace
        trace = dataclasses.replace(trace, rounds=tuple(rounds))
        if args.trace is not None and rounds:
            try:
                save_trace(trace, Path(args.trace).expanduser())
            except OSError as e:
                raise SpecfuseError(f"could not write the trace to {args.trace!r}: {e.strerror or e}") from e
    out.write("\n")
    if not args.quiet and rounds:
        result = trace.result
        wins = ", ".join(f"{m} {n}" for m, n in result.wins)
        print(
            f"stop: {result.stop_reason} | {result.rounds} rounds | {result.tokens} tokens | "
            f"{result.seconds:.1f}s | first segment {result.first_segment_latency_s:.2f}s | "
            f"calls saved by exit {result.calls_saved_by_exit} | wins: {wins}",
            file=err,
        )
    return 0


def _verify_cache(cache_dir: str | None, out: TextIO) -> int:
    """--verify-cache: each catalogue model's cache, hashed in full; 1 when any file is damaged."""
    from .models.cache import verify_cache

    damaged = 0
    for name in CATALOGUE:
        problem = verify_cache(name, cache_dir)
        if problem is not None and not problem.startswith("absent"):
            damaged += 1
        print(f"{name:<20} {problem or 'intact'}", file=out)
    return 1 if damaged else 0


def read_prompt(arg: str | None) -> str:
    """The prompt from the command line, or from standard input for '-', as strictly valid UTF-8."""
    if arg == "-":
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read()
        if isinstance(data, bytes):
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"standard input is not valid UTF-8 (byte {e.start}: {data[e.start : e.start + 1]!r}); "
                    "convert it first, e.g. with iconv -t UTF-8"
                ) from None
        arg = data
    text = arg or ""
    try:  # undecodable argv bytes arrive as lone surrogates
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"the prompt is not valid UTF-8 text (character {e.start})") from None
    return text


def check_writable(path: str) -> None:
    """Refuse a trace path that could not be written, before minutes of loading: empty, a folder, an
    unknown ~user, a missing parent, or a place that refuses a file (read-only, /proc, …).

    Permission bits say too little (root passes every os.access check, /proc refuses files anyway),
    so the file is really opened for appending: an existing one is left as it was, a new one removed.
    """
    if not path.strip():
        raise ConfigError("--trace is empty; give a file name, e.g. run.json")
    try:
        target = Path(path).expanduser()
    except RuntimeError as e:  # "~nosuchuser/…": no such home directory
        raise ConfigError(f"--trace {path!r}: {e}; give a path without ~user") from None
    parent = target.parent
    if target.is_dir():
        raise ConfigError(f"--trace {path!r} is a folder; give a file name, e.g. {path.rstrip('/')}/run.json")
    if not parent.is_dir():
        raise ConfigError(f"--trace {path!r}: the folder {str(parent)!r} does not exist; create it first")
    existed = target.exists()
    try:
        with open(target, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ConfigError(
            f"--trace {path!r} cannot be written ({e.strerror or e}); choose another path"
        ) from None
    if not existed:
        target.unlink(missing_ok=True)


def _load(names: Sequence[str], args: argparse.Namespace, err: TextIO) -> list[Member]:
    """The members, loaded as the flags say; a model listed twice shares its weights (load_members)."""
    from transformers.utils import logging as hf_logging

    from .models.placement import load_members
    from .models.trust import apply_trust, load_trust

    hf_logging.disable_progress_bar()  # one bar of ours, not one per model and per step
    with _progress_bar(err, args.quiet) as progress:
        members = load_members(
            names,
            device=args.device,
            dtype=args.dtype,
            device_map=args.device_map,
            cache_dir=args.cache_dir,
            allow_paths=True,  # the person at the command line is the operator
            trust_remote_code=args.trust_remote_code,
            progress=progress,
            processes="auto" if args.processes is None else args.processes,
            quantize="none" if args.compile else args.quantize,
            compile_decode=args.compile,
            decode=args.decode,
        )
        if args.trust is not None:
            apply_trust(members, load_trust(args.trust))
        progress(1.0, "loaded")
    return members


@contextlib.contextmanager
def _progress_bar(err: TextIO, quiet: bool) -> Iterator[Callable[[float, str], None]]:
    """A loading bar on stderr whose line is always finished, so an error never prints onto it."""
    if quiet:
        yield lambda fraction, message: None
        return
    from tqdm import tqdm

    bar = tqdm(total=100, desc="loading", file=err, bar_format="{percentage:3.0f}%|{bar:20}| {desc}")
    # A warning logged while the bar is drawn (the cache rebuilding a file, say) would print onto the
    # bar's line: while it is shown, log lines go through tqdm, which moves the bar below them.
    root = logging.getLogger()
    handlers = root.handlers
    root.handlers = [_BarHandler(err, handlers)]

    def update(fraction: float, message: str) -> None:
        bar.n = round(100 * min(max(fraction, 0.0), 1.0))
        bar.set_description_str(message, refresh=False)
        bar.refresh()

    try:
        yield update
    finally:
        root.handlers = handlers
        bar.close()  # ends the bar's line (tqdm writes the newline), also when loading failed


class _BarHandler(logging.Handler):
    """Log records formatted as the CLI's own handlers would, written above a tqdm bar."""

    def __init__(self, stream: TextIO, handlers: Sequence[logging.Handler]) -> None:
        super().__init__()
        self.stream = stream
        self.formatter = next((h.formatter for h in handlers if h.formatter), None)
        self.level = min((h.level for h in handlers), default=logging.NOTSET)

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(self.format(record), file=self.stream)


if __name__ == "__main__":
    sys.exit(main())
