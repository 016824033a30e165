"""The command line: `python -m specfuse` / `specfuse` streams an ensemble answer round by round.

A consumer of Ensemble.stream(): the answer goes to stdout as it grows, per-round progress to
stderr, the trace to --trace. Every user-fixable error exits 2 with a one-line reason.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from .config import MAX_SEGMENT_LEN, NORMALIZATIONS, PARALLEL_MODES, SCORE_MODES, EnsembleConfig
from .engine import Ensemble, check_prompt
from .errors import ConfigError, SpecfuseError
from .records import Round
from .trace import Trace, save_trace

if TYPE_CHECKING:
    from .members import Member

HELP_WIDTH = 100  # fixed, so that the README's copy of --help does not depend on the terminal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specfuse",
        description="Several language models answer one prompt together, segment by segment (SpecEM).",
        epilog="Models: catalogue names (see --list-models), local checkpoint folders, or hub ids "
        "(owner/name; needs a hub connection). Exit status 2 means bad input; the reason is printed.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH, max_help_position=32),
    )
    parser.add_argument("prompt", nargs="?", help="the prompt; '-' reads it from stdin")
    add = parser.add_argument
    add("--models", default="smollm2-135m,gemma3-270m,qwen2.5-coder-0.5b", help="comma-separated members")
    add(
        "--segment-len", type=int, default=10, metavar="L", help=f"tokens per candidate, 1..{MAX_SEGMENT_LEN}"
    )
    add("--max-new-tokens", type=int, default=256, metavar="N", help="answer budget in tokens")
    add("--max-rounds", type=int, default=None, metavar="K", help="stop after K rounds")
    add("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    add("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass, (0, 1]")
    add("--seed", type=int, default=0, metavar="S", help="sampling seed; member i uses S + i")
    add("--score", choices=SCORE_MODES, default="logit", help="mean raw logit (paper) or mean log-prob")
    add("--normalization", choices=NORMALIZATIONS, default="zsoftmax", help="row normalization of scores")
    add("--no-self-scores", action="store_true", help="ignore each verifier's score of its own candidate")
    add("--no-feedback", action="store_true", help="keep the weights uniform")
    add("--learning-rate", type=float, default=1.0, metavar="A", help="α in η_k = α / (N √k)")
    add("--no-exit", action="store_true", help="never let a member leave the drafting set")
    add("--exit-threshold", type=float, default=0.5, metavar="D", help="δ: exit when p_i < δ / |A_k|")
    add("--exit-warmup", type=int, default=3, metavar="K", help="no exit before K rounds")
    add("--exit-min-active", type=int, default=2, metavar="M", help="never fewer drafting members than M")
    add("--exited-no-verify", action="store_true", help="exited members stop scoring too")
    add("--no-echo-guard", action="store_true", help="let a candidate that only repeats the prompt win")
    add("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    add("--device", default="cpu", help="cpu, cuda, cuda:K, auto (one model per GPU), per-gpu")
    add("--device-map", default=None, help="accelerate device map for large models, e.g. auto")
    add("--dtype", default="auto", help="auto (per device), float32, bfloat16, float16")
    add("--parallel", choices=PARALLEL_MODES, default="auto", help="draft/verify members concurrently")
    add(
        "--cache-dir",
        default=None,
        help="converted-model cache (default $SPECFUSE_CACHE or ~/.cache/specfuse)",
    )
    add("--trust-remote-code", action="store_true", help="allow model code from checkpoints (off by default)")
    add("--trace", default=None, metavar="PATH", help="write the run as a JSON trace")
    add("--quiet", action="store_true", help="no progress on stderr")
    add("--list-models", action="store_true", help="list the catalogue and exit")
    return parser


def config_from_args(args: argparse.Namespace) -> EnsembleConfig:
    """The EnsembleConfig the flags describe (validated: a bad value raises ConfigError)."""
    return EnsembleConfig(
        segment_len=args.segment_len,
        max_new_tokens=args.max_new_tokens,
        max_rounds=args.max_rounds,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        score=args.score,
        normalization=args.normalization,
        self_scores=not args.no_self_scores,
        feedback=not args.no_feedback,
        learning_rate=args.learning_rate,
        exit=not args.no_exit,
        exit_threshold=args.exit_threshold,
        exit_warmup=args.exit_warmup,
        exit_min_active=args.exit_min_active,
        exited_verify=not args.exited_no_verify,
        echo_guard=not args.no_echo_guard,
        stop_strings=tuple(args.stop),
        parallel=args.parallel,
    )


def parse_models(spec: str, sampling: bool) -> list[str]:
    """Member names from `a,b,c`. The same model twice only makes sense when sampling."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ConfigError("--models is empty; name at least one model")
    if len(set(names)) != len(names) and not sampling:
        raise ConfigError(
            "the same model twice would draft identical candidates under greedy decoding; "
            "set --temperature > 0 or list different models"
        )
    return names


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
    parser = build_parser()
    args = parser.parse_args(argv)
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
    from . import catalogue  # imports torch: only once the flags are known to be sound

    if args.list_models:
        for name, entry in catalogue.CATALOGUE.items():
            print(f"{name:<20} {entry.params:>6}  {entry.licence}", file=out)
        return 0
    config = config_from_args(args)
    prompt = sys.stdin.read() if args.prompt == "-" else (args.prompt or "")
    check_prompt(prompt)
    names = parse_models(args.models, config.sampling)
    members = _load(names, args, err)
    ensemble = Ensemble(members, config)
    rounds: list[Round] = []
    try:
        for r in ensemble.stream(prompt):
            rounds.append(r)
            out.write(r.winner.text)
            out.flush()
            if not args.quiet:
                print(progress_line(r), file=err)
    finally:  # an interrupted run still leaves its trace
        if args.trace and rounds:
            save_trace(Trace(prompt, ensemble.names, config, tuple(rounds)), args.trace)
    out.write("\n")
    if not args.quiet and rounds:
        result = Trace(prompt, ensemble.names, config, tuple(rounds)).result
        wins = ", ".join(f"{m} {n}" for m, n in result.wins)
        print(
            f"stop: {result.stop_reason} | {result.rounds} rounds | {result.tokens} tokens | "
            f"{result.seconds:.1f}s | first segment {result.first_segment_latency_s:.2f}s | "
            f"calls saved by exit {result.calls_saved_by_exit} | wins: {wins}",
            file=err,
        )
    return 0


def _load(names: Sequence[str], args: argparse.Namespace, err: TextIO) -> list[Member]:
    """Load each distinct model once; a repeated name becomes another member sharing its weights."""
    from transformers.utils import logging as hf_logging

    from . import catalogue
    from .members import HFMember

    hf_logging.disable_progress_bar()  # one bar of ours, not one per model and per step
    unique = list(dict.fromkeys(names))
    progress = None if args.quiet else catalogue.tqdm_progress("loading")
    loaded = catalogue.load_members(
        unique,
        device=args.device,
        dtype=args.dtype,
        device_map=args.device_map,
        cache_dir=args.cache_dir,
        allow_paths=True,  # the person at the command line is the operator
        trust_remote_code=args.trust_remote_code,
        progress=progress,
    )
    if progress is not None:
        progress(1.0, "loaded")
    by_name = dict(zip(unique, loaded))
    members: list[Member] = []
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        base = by_name[name]
        if seen[name] == 1:
            members.append(base)
        elif not isinstance(base, HFMember):  # a served member: its server holds the weights
            raise ConfigError(f"{name} is served by an inference server; list it once")
        else:
            members.append(
                HFMember(
                    f"{name}#{seen[name]}",
                    base.model,
                    base.tokenizer,
                    prompt_format=base.prompt_format,
                    device=base.device,
                )
            )
    return members


if __name__ == "__main__":
    sys.exit(main())
