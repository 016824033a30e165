"""Settings declared once: setting() marks a dataclass field with its help, choices, bounds and group;
settings_of() reads them (Setting: what every view that offers or checks a setting needs); check_setting
and check_fields enforce them with ConfigError messages that name the setting and its range.

The machinery only: which settings a run has is specfuse.config's EnsembleConfig (and MemberSettings),
the operator's engine.ServerSettings, the API's Limits. Stdlib only.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ConfigError


def setting(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
    group: str = "run",
) -> Any:
    """One field of a settings dataclass (EnsembleConfig, engine.ServerSettings, the API's Limits) with
    its documentation: the single source for the flags, the app's form and the API's schema.

    `dataclasses.fields(cls)[i].metadata` holds help (one line), choices (for a string setting),
    low/high (inclusive bounds) or above/below (exclusive ones: `above=0` is "> 0"), which check_setting
    enforces and sliders, the flags' help and the OpenAPI schema show, and group (where the app places
    it: run, sampling, scoring, feedback, exit, devices).
    """
    if above is not None and low is not None or below is not None and high is not None:
        raise TypeError("a bound is either inclusive (low, high) or exclusive (above, below), not both")
    meta = {
        "help": help,
        "choices": choices,
        "low": low if above is None else above,
        "high": high if below is None else below,
        "low_open": above is not None,
        "high_open": below is not None,
        "group": group,
    }
    if isinstance(default, (list, tuple, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _finite_number(value: Any) -> bool:
    """A real number a float can hold (an int past 1e308 cannot: math.isfinite would raise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def show(value: Any, width: int = 60) -> str:
    """A value for an error message, cut short: a setting may come from anyone (an API body)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    try:
        text = repr(value)
    except ValueError:  # a container holding an integer too long to print
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= width else text[: width - 1] + "…"


def _within(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _integer_range(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"an integer in {low:g}..{high:g}"
    if low == 0:
        return "a non-negative integer"
    if low is not None:
        return f"an integer ≥ {low:g}"
    return "an integer" if high is None else f"an integer ≤ {high:g}"


@dataclass(frozen=True)
class Setting:
    """One field of a settings dataclass, as every view that offers or checks it needs it."""

    name: str
    kind: Any  # the type without None: int, float, bool, str, tuple[float, ...] or tuple[str, ...]
    optional: bool  # None is a value too (no limit)
    default: Any
    help: str
    choices: tuple[str, ...] | None  # a str setting's values
    low: float | None  # the bounds check_setting enforces: inclusive, or exclusive where *_open
    high: float | None
    group: str  # where the app places it: run, sampling, scoring, feedback, exit
    low_open: bool = False  # low itself is refused: "> low"
    high_open: bool = False

    @property
    def bounds(self) -> str:
        """The bounds in words for help and errors: "1..256", "(0, 1]", "≥ 0", "> 0"; "" for none."""
        low, high = self.low, self.high
        if low is not None and high is not None:
            if not (self.low_open or self.high_open):
                return f"{low:g}..{high:g}"
            return f"{'(' if self.low_open else '['}{low:g}, {high:g}{')' if self.high_open else ']'}"
        if low is not None:
            return f"{'>' if self.low_open else '≥'} {low:g}"
        return "" if high is None else f"{'<' if self.high_open else '≤'} {high:g}"

    @property
    def item(self) -> Any:
        """A tuple setting's item type (float, str); None for a scalar."""
        return typing.get_args(self.kind)[0] if typing.get_origin(self.kind) is tuple else None


@functools.cache
def settings_of(of: Any) -> tuple[Setting, ...]:
    """Every setting() field of a settings dataclass, in order (fields declared without setting(), with
    no help, left out); read once per class: the one place the type hints are read."""
    hints = typing.get_type_hints(of)
    out = []
    for f in fields(of):
        if "help" not in f.metadata:
            continue
        kind, args = hints[f.name], typing.get_args(hints[f.name])
        optional = type(None) in args and typing.get_origin(kind) is not tuple
        if optional:
            (kind,) = [a for a in args if a is not type(None)]
        default = f.default_factory() if callable(f.default_factory) else f.default
        meta: Mapping[str, Any] = f.metadata
        out.append(
            Setting(
                f.name, kind, optional, default, meta["help"], meta.get("choices"), meta.get("low"),
                meta.get("high"), meta.get("group", "run"), meta.get("low_open", False),
                meta.get("high_open", False),
            )
        )  # fmt: skip
    return tuple(out)


def check_fields(instance: Any) -> None:
    """Every setting() field of a frozen settings dataclass checked (check_setting) and normalized in
    place: what __post_init__ calls first."""
    for s in settings_of(instance.__class__):
        object.__setattr__(instance, s.name, check_setting(s, getattr(instance, s.name)))


def check_setting(setting: Setting, value: Any) -> Any:
    """`value` checked against the setting's type, choices and bounds (ConfigError naming it and
    its range); tuples normalized from lists, ints to floats where the setting is a float."""
    name, low, high, choices = setting.name, setting.low, setting.high, setting.choices
    if setting.optional and value is None:
        return None
    hint = setting.kind
    if setting.item is not None:
        kind = setting.item
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} must be a tuple of {kind.__name__}, got {show(value)}")
        if kind is float and all(_finite_number(v) for v in value):
            return tuple(float(v) for v in value)
        if not all(isinstance(v, kind) for v in value):
            raise ConfigError(f"{name} must be a tuple of {kind.__name__}, got {show(value)}")
        return tuple(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {show(value)}")
    elif hint is int:
        if not isinstance(value, int) or isinstance(value, bool) or not _within(value, low, high):
            raise ConfigError(f"{name} must be {_integer_range(low, high)}, got {show(value)}")
    elif hint is float:
        if not _finite_number(value):
            raise ConfigError(f"{name} must be a finite number, got {show(value)}")
        if (low is not None and (value <= low if setting.low_open else value < low)) or (
            high is not None and (value >= high if setting.high_open else value > high)
        ):
            both, closed = low is not None and high is not None, not (setting.low_open or setting.high_open)
            shown = f"[{low:g}, {high:g}]" if both and closed else setting.bounds
            raise ConfigError(f"{name} must be {'in ' if both else ''}{shown}, got {show(value)}")
        value = float(value)
    elif hint is str and not isinstance(value, str):
        raise ConfigError(f"{name} must be text, got {show(value)}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {show(value)}")
    return value
