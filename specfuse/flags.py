"""Every main's flags, declared once: the parser, where and how members load, and one flag per
setting() field (the run's EnsembleConfig, the operator's ServerSettings, the API's Limits).

Used by the CLI (cli.py), the API server (serve/cli.py), the app (app.py), every benchmark (bench/),
the evaluation (eval/cli.py) and the tools. A main picks the flags it offers with `only=` and its own
defaults with `defaults=`; the name, type, bounds and help of each flag are said here alone. No torch
at import.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from .config import DECODE_HELP, DECODE_MODES, EnsembleConfig, Setting, settings
from .errors import ConfigError, UnknownModelError
from .models.catalogue import CATALOGUE, DEFAULT_MEMBERS
from .models.quantize_options import quantize_help
from .models.trust import CLI_HELP as TRUST_HELP

HELP_WIDTH = 100  # fixed, so that the README's copy of --help does not depend on the terminal
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Flags whose names are not the generic rule (`--field-name`; a bool also gets `--no-field-name`).
FLAG_NAMES = {
    "stop_strings": "--stop",
    "pause_idle_s": "--pause-idle",
    "request_timeout_s": "--request-timeout",
}
OLD_ALIASES = {"exited_verify": "--exited-no-verify"}  # store_false spellings that keep working
METAVARS = {int: "N", float: "X", str: "TEXT"}
UNITS = {
    "pause_idle_s": "SECONDS",
    "join_wait": "SECONDS",
    "request_timeout_s": "SECONDS",
    "prefill_chunk": "TOKENS",
}
GROUPS = {  # the --help section of each settings class, by its name
    "EnsembleConfig": "run settings (the same ones the app shows)",
    "ServerSettings": "operator settings: how the loaded members serve runs (docs/serve.md)",
    "Limits": "what one request may ask for (docs/limits.md)",
}
# Where and how members load: add_loading_flags's names, in --help's order.
LOADING = ("models", "device", "dtype", "quantize", "trust", "decode", "processes", "cache_dir")
TRIO = "the trio: " + ", ".join(DEFAULT_MEMBERS)

T = TypeVar("T")


class Parser(argparse.ArgumentParser):
    """argparse, with its reason always on one line: a rejected argument is quoted as typed, and an
    argument holding a line break ("\\n0") would otherwise spread the reason over several lines.
    --help is wrapped at HELP_WIDTH whatever the terminal."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault(
            "formatter_class",
            lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH, max_help_position=32),
        )
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        flat = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message)
        super().error(flat)


def add_loading_flags(
    parser: argparse.ArgumentParser,
    *,
    only: Collection[str] = LOADING,
    defaults: Mapping[str, Any] | None = None,
    devices: Sequence[str] | None = None,
    users: str = "one user",
    models_help: str | None = None,
) -> None:
    """Where and how members load, the same flags wherever members load: --models, --device, --dtype,
    --quantize, --trust, --decode, --processes, --cache-dir (those in `only`). `defaults` changes a
    default (models: a list takes several arguments, a string one comma-separated argument, the CLI's
    way, since a prompt follows it); `users` says in words whom --quantize auto chooses for (one
    person's requests in turn, or many at once: models/hardware.py)."""
    unknown = set(only) - set(LOADING) | set(defaults or {}) - set(only)
    if unknown:
        raise ValueError(f"not a loading flag of this main: {', '.join(sorted(unknown))}")
    given: dict[str, Any] = {
        "models": list(DEFAULT_MEMBERS),
        "device": "cpu",
        "dtype": "auto",
        "quantize": "auto",
    }
    given |= {"decode": "auto", "trust": None, "processes": None, "cache_dir": None, **(defaults or {})}

    def add(flag: str, **options: Any) -> None:  # only the flags this main offers, with its defaults
        if (name := flag[2:].replace("-", "_")) in only:
            parser.add_argument(flag, default=given[name], **options)

    add("--models", **_models_flag(given["models"], models_help))
    add(
        "--device",
        choices=devices,
        help="cpu, cuda, cuda:K, auto (one model per GPU), per-gpu (default %(default)s)",
    )
    add("--dtype", choices=DTYPES, help="auto (per device), float32, bfloat16, float16")
    add("--quantize", help=quantize_help(given["quantize"], users))
    add("--trust", metavar="FILE", help=TRUST_HELP)
    add("--decode", choices=DECODE_MODES, help=DECODE_HELP)
    processes_help = PROCESSES_HELP + (PROCESSES_AUTO if given["processes"] is None else PROCESSES_OFF)
    add("--processes", action=argparse.BooleanOptionalAction, help=processes_help)
    add("--cache-dir", help="converted-model cache (default $SPECFUSE_CACHE or ~/.cache/specfuse)")


PROCESSES_HELP = "each member in a worker process of its own, so members at once do not share one GIL. "
PROCESSES_AUTO = (
    "Neither flag (auto): when several members share a GPU or a CPU with 8 or more cores, where processes "
    "measured faster than threads (H100: 1.64x vs in turn, threads 0.91x; 16-core Xeon: 1.54x, threads "
    "1.10x), and never for a model listed twice"
)
PROCESSES_OFF = (
    "Default off: the members in this process, in turn on one GPU, the way measured there for many users at "
    "once (worker processes there are not measured yet: docs/gpu.md)"
)


def _models_flag(default: Any, help: str | None) -> dict[str, Any]:
    """--models: several arguments (a list default), or one comma-separated one (a string default)."""
    if isinstance(default, str):
        return {"help": help or "comma-separated members"}
    shown = TRIO if default is None or list(default) == list(DEFAULT_MEMBERS) else ", ".join(default)
    return {"nargs": "+", "help": help or f"catalogue names (default {shown})"}


def add_settings(
    parser: argparse.ArgumentParser,
    *,
    only: Collection[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    of: type = EnsembleConfig,
    shown: Mapping[str, str] | None = None,
) -> None:
    """One flag per setting() field of `of` (EnsembleConfig: the run settings; ServerSettings: the
    operator's; Limits: the API's), typed, bounded, defaulted and documented from its declaration.
    `only`: those fields alone; `defaults`: this main's own defaults; `shown`: a default said in words
    in --help where the value itself would not say it (None: "the largest level")."""
    declared = settings(of)
    names = [s.name for s in declared]
    unknown = set(only or ()) - set(names) | set(defaults or {}) - set(only or names)
    if unknown:
        raise ValueError(f"not a setting of {of.__name__} offered here: {', '.join(sorted(unknown))}")
    group = parser.add_argument_group(GROUPS.get(of.__name__, of.__name__))
    for setting in declared:
        if only is None or setting.name in only:
            default = (defaults or {}).get(setting.name, setting.default)
            _add_setting(group, setting, default, (shown or {}).get(setting.name))


def _add_setting(group: Any, setting: Setting, default: Any, shown: str | None) -> None:
    name = setting.name
    flag = FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
    help = _help(setting, default, shown)
    if setting.kind is bool:
        group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=default, help=help)
        if name in OLD_ALIASES:
            group.add_argument(OLD_ALIASES[name], dest=name, action="store_false", help=argparse.SUPPRESS)
    elif setting.item is not None:
        group.add_argument(
            flag,
            dest=name,
            action="append",
            default=None,  # append would add to a non-empty default instead of replacing it
            type=setting.item,
            metavar=METAVARS.get(setting.item, "VALUE"),
            help=f"{setting.help} (repeatable)",
        )
    else:
        group.add_argument(
            flag,
            dest=name,
            type=_or_none(setting.kind) if setting.optional else setting.kind,
            default=default,
            choices=setting.choices,
            metavar=None if setting.choices else UNITS.get(name, METAVARS.get(setting.kind, "VALUE")),
            help=help,
        )


def _or_none(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.strip().lower() == "none" else kind(text)

    parse.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its errors
    return parse


def _help(setting: Setting, default: Any, shown: str | None) -> str:
    bounds = setting.bounds
    bounds = f"{bounds}; " if bounds and not setting.help.endswith(bounds) else ""
    if shown is None:
        plain = default is None or isinstance(default, bool)
        shown = {None: "none", True: "on", False: "off"}.get(default, default) if plain else default
    return f"{setting.help} ({bounds}default: {shown})".replace("%", "%%")


def from_args(args: argparse.Namespace, of: type[T] = EnsembleConfig, **fixed: Any) -> T:  # type: ignore[assignment]
    """The settings the flags describe (validated: a bad value raises ConfigError naming it): every
    field of `of` that this main offers as a flag, the declared default for the others, `fixed` on top.

    Built from the fields, never listed by hand: a new setting() field arrives here by itself.
    """
    values = {}
    for setting in settings(of):
        if not hasattr(args, setting.name):
            continue
        value = getattr(args, setting.name)
        if isinstance(value, list):
            value = tuple(value)
        if value is not None or setting.optional:
            values[setting.name] = value  # an unrepeated repeatable flag (None) keeps the field's default
    return of(**{**values, **fixed})


def config_from_args(args: argparse.Namespace) -> EnsembleConfig:
    """The EnsembleConfig the run settings' flags describe (a bad value raises ConfigError)."""
    return from_args(args, EnsembleConfig)


def parse_models(
    values: str | Sequence[str] | None, *, sampling: bool = False, hub: bool = True
) -> list[str]:
    """Member names from --models, for every entry point: `a,b,c`, or several such arguments
    (nargs="+"); None: the default trio. The same model twice only makes sense when sampling.

    `hub=False` (the benchmarks and the evaluation, which never download) refuses at once, before
    any loading, a name that is neither a catalogue name, a checkpoint folder nor a server spec."""
    given = DEFAULT_MEMBERS if values is None else [values] if isinstance(values, str) else values
    names = [n.strip() for arg in given for n in arg.split(",") if n.strip()]
    if not names:
        raise ConfigError("--models is empty; name at least one model")
    if not hub:
        from .models.loading import check_member_name  # brings torch

        for name in names:
            if check_member_name(name).kind == "hub":
                raise UnknownModelError(
                    f"Unknown model {name!r}; known: {', '.join(CATALOGUE)}, a local checkpoint folder "
                    "or a server spec (docs/remote.md)."
                )
    if len(set(names)) != len(names) and not sampling:
        raise ConfigError(
            f"--models names a model twice ({', '.join(names)}): the same model twice would draft "
            "identical candidates under greedy decoding; set --temperature > 0 or list different models"
        )
    return names


def command_line(prog: str, argv: Iterable[str] | None) -> str:
    """The command as typed, for a report's footer ("command: …"): `prog` and its arguments."""
    import sys

    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])
