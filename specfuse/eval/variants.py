"""Named ensemble configurations for studies: the built-in systems, --variant NAME:key=value and files.

Works generically from `config.settings()`: a field added to the config is a variant
key at once, its value parsed by the field's type and checked by its choices and by __post_init__.
Knows nothing about models or runs.
"""

from __future__ import annotations

import argparse
import json
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import config
from ..config import PAPER, EnsembleConfig
from ..errors import ConfigError

# System name → (the settings that differ from the evaluation's base config, one line of help).
BUILTIN: dict[str, tuple[dict[str, Any], str]] = {
    "ensemble": ({}, "the ensemble with the project's defaults"),
    "ensemble-no-feedback": ({"feedback": False}, "ablation: weights stay uniform"),
    "ensemble-no-exit": ({"exit": False}, "ablation: every member drafts every round"),
    # Real members' mean raw logits are positive (11–20 in every stored trace), so 'sum' runs on
    # them; a row it cannot normalize fails that one problem, which then counts as wrong (error).
    "paper": (
        dict(PAPER),
        "the paper's rule: mean raw logit, each row divided by its sum (refuses non-positive rows)",
    ),
}
DEFAULT_ENSEMBLES = ("ensemble", "ensemble-no-feedback", "ensemble-no-exit")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_RESERVED = re.compile(r"single-.*|sc\d+-.*|sc-.*")
_TRUE, _FALSE, _NONE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}, {"none", "null"}


def parse_value(key: str, value: Any, where: str = "") -> Any:
    """A config value from text (or a JSON/TOML value), by the field's type; ConfigError naming the key."""
    setting = config.setting_named(key)
    if setting is None:
        keys = ", ".join(s.name for s in config.settings())
        raise ConfigError(f"{where}unknown setting {key!r}; valid keys: {keys}")
    kind, optional, choices = setting.kind, setting.optional, setting.choices
    text = value.strip() if isinstance(value, str) else None

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{where}{key}={value!r}: expected {expected}")

    if optional and (value is None or (text is not None and text.lower() in _NONE)):
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise bad("true or false")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text is not None and re.fullmatch(r"[+-]?\d+", text):
            return int(text)
        raise bad("an integer" + (" or none" if optional else ""))
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return float(text) if text is not None else _raise()
        except ValueError:
            raise bad("a number" + (" or none" if optional else "")) from None
    if kind is str:
        if text is None or (choices and text not in choices):
            raise bad(f"one of {', '.join(choices)}" if choices else "text")
        return text
    if setting.item is not None:  # "a|b" in text, a list in a file
        item = setting.item
        if isinstance(value, (list, tuple)):
            parts: list[Any] = list(value)
        elif text is not None:
            parts = [s for s in text.split("|") if s]
        else:
            raise bad("values separated by |")
        if item is float:  # initial_weights: 0.15|0.15|0.7
            if any(isinstance(p, bool) for p in parts):
                raise bad("numbers separated by |")
            try:
                return tuple(float(p) for p in parts)
            except (TypeError, ValueError):
                raise bad("numbers separated by |") from None
        if all(isinstance(p, str) for p in parts):
            return tuple(parts)
        raise bad("strings separated by |")
    raise bad(getattr(kind, "__name__", None) or str(kind))  # a field type this parser does not know yet


def _raise() -> Any:
    raise ValueError


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"variant name {name!r}: use lower-case letters, digits, '.', '_' and '-' (it names a folder)"
        )
    if name in BUILTIN:
        raise ConfigError(f"variant name {name!r} is a built-in system; choose another name")
    if _RESERVED.fullmatch(name):
        raise ConfigError(f"variant name {name!r} is reserved (single-*, sc<K>-* name other systems)")
    return name


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """'NAME:key=value,key=value' → (NAME, settings); 'NAME:' alone is the defaults under a new name."""
    name, colon, body = spec.partition(":")
    if not colon:
        raise ConfigError(f"--variant {spec!r}: expected NAME:key=value,key=value")
    name = check_name(name.strip())
    settings: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--variant {name}: {item!r} is not key=value")
        settings[key.strip()] = parse_value(key.strip(), value, f"--variant {name}: ")
    return name, settings


def toml_parser() -> types.ModuleType:
    """The TOML parser: the standard library's tomllib (Python 3.11+), else tomli, the same parser from
    PyPI (declared for Python < 3.11)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as e:
            raise ConfigError(
                "reading a TOML variants file on Python < 3.11 needs tomli: pip install tomli "
                "(or give the variants as JSON)"
            ) from e
    return tomllib


def load_variants(path: str | Path) -> dict[str, dict[str, Any]]:
    """Named variants from a JSON object or a TOML file: {name: {key: value, …}, …}."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read variants file {str(path)!r}: {e.strerror or e}") from e
    parse = toml_parser().loads if path.suffix.lower() == ".toml" else json.loads
    try:
        data: Any = parse(text)
    except ValueError as e:
        raise ConfigError(f"{path.name}: not valid {path.suffix.lstrip('.') or 'JSON'}: {e}") from e
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"{path.name}: expected a table of named variants, {{name: {{key: value}}}}")
    return {
        check_name(name): {k: parse_value(k, v, f"{path.name}: {name}: ") for k, v in body.items()}
        for name, body in data.items()
    }


def build_configs(
    base: EnsembleConfig,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, EnsembleConfig]:
    """System name → config, for the built-in ensembles and the named variants (validated here)."""
    out: dict[str, EnsembleConfig] = {}
    named = {**{k: v for k, (v, _) in BUILTIN.items()}, **(variants or {})}
    for name, settings in named.items():
        try:
            out[name] = replace(base, **settings)
        except ConfigError as e:
            raise ConfigError(f"variant {name}: {e}") from e
    return out


def describe(variants: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, str]:
    """System name → a one-line description (built-ins: their help; variants: their settings)."""
    out = {name: help_ for name, (_, help_) in BUILTIN.items()}
    for name, settings in (variants or {}).items():
        out[name] = ", ".join(f"{k}={v}" for k, v in settings.items()) or "the defaults"
    return out


def settings_text(variants: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """--variant arguments that recreate these variants (for the rerun command in a report)."""
    out = []
    for name, settings in variants:
        body = ",".join(f"{k}={'|'.join(v) if isinstance(v, tuple) else v}" for k, v in settings.items())
        out.append(f"{name}:{body}")
    return out


def parse_setting(text: str) -> tuple[str, Any]:
    """--set's KEY=VALUE (the benchmarks) → (key, value), parsed by the field's type (parse_value);
    an unknown key or a bad value is an argparse error (exit 2) that names the key."""
    key, eq, value = text.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. verify=disagree)")
    try:
        return key.strip(), parse_value(key.strip(), value)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_set_option(
    parser: argparse.ArgumentParser, help: str, flag: str = "--set", dest: str = "settings"
) -> None:
    """A benchmark's repeatable `--set KEY=VALUE` (into args.<dest>, as (key, value) pairs); `flag`
    names another option of the same form (bench serve's --against)."""
    parser.add_argument(
        flag,
        dest=dest,
        action="append",
        default=[],
        type=parse_setting,
        metavar="KEY=VALUE",
        help=help,
    )
