"""EnsembleConfig: one setting() per field is the single source of the CLI's flags, the defaults and
the validation; the config round-trips through the trace's JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest

from specfuse.cli import build_parser, config_from_args
from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble
from specfuse.errors import ConfigError

from ..scripted import ScriptedMember

FIELDS = dataclasses.fields(EnsembleConfig)
HINTS = typing.get_type_hints(EnsembleConfig)


def base_type(name: str):
    args = typing.get_args(HINTS[name])
    return next(a for a in args if a is not type(None)) if type(None) in args else HINTS[name]


def other_value(field: dataclasses.Field):
    """A valid value different from the field's default, chosen from its type and metadata alone
    (so a field added later is covered without touching this file)."""
    default = getattr(EnsembleConfig(), field.name)
    kind, meta = base_type(field.name), field.metadata
    if kind is bool:
        return not default
    if typing.get_origin(kind) is tuple:
        return ("<<END>>", "\n\n") if typing.get_args(kind)[0] is str else (1,)
    if meta.get("choices"):
        return next(c for c in meta["choices"] if c != default)
    if kind is str:
        return "x" if default != "x" else "y"
    low, high = meta.get("low"), meta.get("high")
    start = default if default is not None else (low if low is not None else 0)
    if kind is int:
        value = int(start) + 1
        return value if high is None or value <= high else int(low) + 1
    if kind is float:
        if high is not None:
            middle = (max(low if low is not None else high - 1.0, 0.0 if low is None else low) + high) / 2
            return middle if middle != default else (middle + high) / 2
        return float(start) + 0.25
    raise AssertionError(f"test_config cannot make a value for {field.name}: {kind}")


def flag_for(name: str) -> list[str]:
    """The option strings the parser gives the field (a bool has --x and --no-x)."""
    actions = [a for a in build_parser()._actions if a.dest == name and a.help != "==SUPPRESS=="]
    assert len(actions) == 1, f"{name}: expected one CLI flag, found {len(actions)}"
    return actions[0].option_strings


def argv_for(field: dataclasses.Field, value) -> list[str]:
    flags = flag_for(field.name)
    if isinstance(value, bool):
        return [next(f for f in flags if f.startswith("--no-") == (not value))]
    if isinstance(value, tuple):
        return [x for item in value for x in (flags[0], str(item))]
    return [flags[0], str(value)]


def parse(argv: list[str]) -> EnsembleConfig:
    return config_from_args(build_parser().parse_args([*argv, "prompt"]))


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_every_setting_is_reachable_from_the_cli(field):
    value = other_value(field)
    assert value != getattr(EnsembleConfig(), field.name)
    config = parse(argv_for(field, value))
    assert getattr(config, field.name) == value
    others = {f.name for f in FIELDS} - {field.name}
    assert all(getattr(config, n) == getattr(EnsembleConfig(), n) for n in others)


def test_the_cli_defaults_are_the_configs_defaults():
    assert parse([]) == EnsembleConfig()
    parser = build_parser()
    for field in FIELDS:
        if typing.get_origin(base_type(field.name)) is not tuple:
            assert parser.get_default(field.name) == getattr(EnsembleConfig(), field.name), field.name


def test_help_shows_every_settings_help_and_default():
    text = " ".join(build_parser().format_help().split())  # undo the wrapping
    for field in FIELDS:
        assert " ".join(field.metadata["help"].split()) in text, field.name
        assert flag_for(field.name)[0] in text


def test_old_spellings_of_switches_still_work():
    config = parse(["--no-feedback", "--no-exit", "--exited-no-verify", "--no-self-scores", "--stop", "X"])
    assert (config.feedback, config.exit, config.exited_verify, config.self_scores) == (False,) * 4
    assert config.stop_strings == ("X",)
    assert parse(["--max-rounds", "none"]).max_rounds is None


def test_every_setting_has_help_and_a_group():
    for field in FIELDS:
        assert field.metadata["help"] and field.metadata["group"], field.name


def bounds_cases():
    """For every field: a value just outside each bound its setting() declares, and a wrong type."""
    for field in FIELDS:
        kind, meta = base_type(field.name), field.metadata
        if meta.get("low") is not None:
            yield field.name, meta["low"] - 1
        if meta.get("high") is not None:
            yield field.name, meta["high"] + 1
        if meta.get("choices"):
            yield field.name, "no-such-choice"
        if kind in (int, float):
            yield field.name, True  # a bool is not a number
            yield field.name, "3"
        if kind is float:
            yield field.name, math.nan
        if kind is bool:
            yield field.name, 1
        if typing.get_origin(kind) is tuple:
            yield field.name, "not a tuple"


@pytest.mark.parametrize(("name", "value"), list(bounds_cases()))
def test_values_outside_a_settings_metadata_are_refused_with_its_name(name, value):
    with pytest.raises(ConfigError, match=name):
        EnsembleConfig(**{name: value})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"segment_len": 0}, "segment_len must be an integer in 1..256, got 0"),
        ({"temperature": -1.0}, "temperature must be ≥ 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"exit_threshold": 1.5}, r"exit_threshold must be in \[0, 1\]"),
        ({"exit_temperature": 0.0}, "exit_temperature must be > 0"),
        ({"normalization": "l2"}, "normalization must be one of zsoftmax, minmax, sum, none"),
        ({"stop_strings": ("",)}, "stop_strings must be a tuple of non-empty strings"),
        ({"stop_strings": (3,)}, "stop_strings must be a tuple of str"),
    ],
)
def test_validation_messages_say_the_range(values, message):
    with pytest.raises(ConfigError, match=message):
        EnsembleConfig(**values)


def test_a_bad_flag_value_exits_2_naming_the_setting(capsys):
    from specfuse.cli import main

    assert main(["--exit-threshold", "2", "hi"]) == 2
    assert "exit_threshold must be in [0, 1]" in capsys.readouterr().err


def test_to_dict_and_from_dict_round_trip_through_json():
    changed = EnsembleConfig(**{f.name: other_value(f) for f in FIELDS})
    assert all(getattr(changed, f.name) != getattr(EnsembleConfig(), f.name) for f in FIELDS)
    for config in (EnsembleConfig(), changed):
        data = json.loads(json.dumps(config.to_dict()))
        assert EnsembleConfig.from_dict(data) == config
    assert EnsembleConfig(stop_strings=["a"]).stop_strings == ("a",)  # lists become tuples
    with pytest.raises(ConfigError, match="unknown config keys: bogus"):
        EnsembleConfig.from_dict({**EnsembleConfig().to_dict(), "bogus": 1})


def test_a_config_stored_with_parallel_by_an_earlier_version_still_loads():
    # `parallel` was a run setting until it became the ensemble's (where members run): traces and
    # runs folders written before still carry it, and load as they were, without it.
    stored = {**EnsembleConfig(segment_len=7).to_dict(), "parallel": "on"}
    assert EnsembleConfig.from_dict(stored) == EnsembleConfig(segment_len=7)
    assert "parallel" not in EnsembleConfig().to_dict()
    with pytest.raises(ConfigError, match="parallel must be one of auto, on, off, got 'sometimes'"):
        Ensemble([ScriptedMember("a", ["x"], len)], parallel="sometimes")


def test_an_integer_without_an_upper_bound_takes_any_size():
    """Seeds such as 1234567890 are common; a setting with no `high` has no hidden cap."""
    assert EnsembleConfig(seed=2**40).seed == 2**40
    with pytest.raises(ConfigError, match="seed must be a non-negative integer, got -1"):
        EnsembleConfig(seed=-1)


def test_a_seed_past_int64_and_a_temperature_too_small_to_sample_are_refused():
    """torch takes seeds below 2**64 (member i uses seed + i); logits / 1e-210 are infinite."""
    assert EnsembleConfig(seed=2**63 - 1).seed == 2**63 - 1
    with pytest.raises(ConfigError, match=r"seed must be at most 2\*\*63 - 1"):
        EnsembleConfig(seed=2**64)
    # A seed of 401 digits (hypothesis found it, from an API body) is named, not printed whole.
    with pytest.raises(ConfigError, match=r"got an integer of about 401 digits$"):
        EnsembleConfig(seed=10**400)
    assert EnsembleConfig(temperature=1e-5).temperature == 1e-5
    with pytest.raises(ConfigError, match=r"temperature must be 0 \(greedy\) or at least 1e-05, got 1e-210"):
        EnsembleConfig(temperature=1e-210)
