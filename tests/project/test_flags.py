"""Every main's flags come from one declaration (specfuse/flags.py, and the setting() fields it turns
into flags): no main declares --models, --dtype, --segment-len or an operator setting of its own, and
the operator's settings are checked once, by ServerSettings, wherever a scheduler starts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import app
from specfuse.bench import serve as bench_serve
from specfuse.cli import build_parser as cli_parser
from specfuse.config import EnsembleConfig, settings
from specfuse.engine import Scheduler, ServerSettings
from specfuse.errors import ConfigError
from specfuse.flags import FLAG_NAMES, Parser, add_loading_flags, add_settings, from_args
from specfuse.limits import Limits
from specfuse.serve.cli import build_parser as serve_parser
from specfuse.serve.schema import SpecfuseOptions
from studio.serving import Schedulers

from ..scripted import ScriptedMember

ROOT = Path(__file__).resolve().parents[2]
# Flags every main shares: the loading flags, the run settings the benchmarks vary, and the operator's.
SHARED = ("models", "dtype", "quantize", "trust", "decode", "processes", "cache-dir", "segment-len")
SHARED += ("max-new-tokens", "batch-size", "queue", "join-wait", "parallel", "max-paused", "pause-idle")
SHARED += ("prefill-chunk", "max-prompt-chars", "request-timeout", "traces")
# The evaluation's --batch-size is how many prompts play in lockstep (stream_many), not a scheduler's.
OWN = {("--batch-size", "specfuse/eval/cli.py")}


def _declarations() -> dict[str, list[str]]:
    """Each shared flag → the files whose code names it as the first argument of a call."""
    pattern = re.compile(r"\(\s*\"(--(?:" + "|".join(map(re.escape, SHARED)) + r"))\"")
    found: dict[str, list[str]] = {}
    for path in [*(ROOT / "specfuse").rglob("*.py"), *(ROOT / "tools").glob("*.py"), ROOT / "app.py"]:
        where = str(path.relative_to(ROOT))
        for flag in pattern.findall(path.read_text(encoding="utf-8")):
            if (flag, where) not in OWN:
                found.setdefault(flag, []).append(where)
    return found


def test_each_shared_flag_is_declared_once_in_flags_py():
    found = _declarations()
    assert {flag: files for flag, files in found.items() if files != ["specfuse/flags.py"]} == {}
    assert {"--models", "--dtype", "--quantize"} <= set(found)  # the pattern does find a declaration


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: a for a in parser._actions for option in a.option_strings}


@pytest.mark.parametrize(
    "parser",
    [serve_parser(), app.build_parser(), cli_parser(), bench_serve._parser()],
    ids=["serve", "app", "cli", "bench-serve"],
)
def test_every_mains_operator_flags_are_the_declared_settings(parser):
    """Each operator flag a main offers is made from its ServerSettings field: name, dest, type, help."""
    actions, offered = _actions(parser), 0
    for setting in settings(ServerSettings):
        flag = FLAG_NAMES.get(setting.name, "--" + setting.name.replace("_", "-"))
        if flag in actions:
            offered += 1
            action = actions[flag]
            assert action.dest == setting.name and action.help.startswith(setting.help)
            assert action.choices == setting.choices
            if setting.optional:  # unset by "none", else read as its kind (prefill_chunk: the device's)
                assert action.type("none") is None and action.type("5") == setting.kind("5")
            else:
                assert action.type is setting.kind or setting.choices
    assert offered >= 1


def test_a_mains_own_defaults_go_through_defaults_not_a_second_flag():
    parser = Parser(prog="x")
    add_settings(parser, only=("segment_len", "max_new_tokens"), defaults={"max_new_tokens": 300})
    add_loading_flags(parser, only=("models", "quantize"), defaults={"quantize": "none"})
    args = parser.parse_args(["--segment-len", "4"])
    assert (args.segment_len, args.max_new_tokens, args.quantize) == (4, 300, "none")
    assert from_args(args) == EnsembleConfig(segment_len=4, max_new_tokens=300)
    shown = " ".join(parser.format_help().split())
    assert "(≥ 1; default: 300)" in shown and "(default none)" in shown
    with pytest.raises(ValueError, match="not a setting of EnsembleConfig offered here: top_p"):
        add_settings(Parser(), only=("segment_len",), defaults={"top_p": 0.5})
    with pytest.raises(ValueError, match="not a loading flag of this main: dtype"):
        add_loading_flags(Parser(), only=("models",), defaults={"dtype": "float32"})


def test_the_operator_settings_are_checked_once_wherever_a_scheduler_starts():
    members = [ScriptedMember("one", ["a "], len)]
    for bad, message in [
        ({"batch_size": 0}, "batch_size must be an integer ≥ 1, got 0"),
        ({"queue": -1}, "queue must be a non-negative integer, got -1"),
        ({"join_wait": float("nan")}, "join_wait must be a finite number, got nan"),
        ({"pause_idle_s": 0.0}, r"pause_idle_s must be > 0, got 0.0"),
        ({"prefill_chunk": True}, "prefill_chunk must be a non-negative integer, got True"),
        ({"parallel": "sometimes"}, "parallel must be one of auto, on, off"),
    ]:
        for make in (ServerSettings, lambda **kw: Scheduler(members, **kw), Schedulers):
            with pytest.raises(ConfigError, match=re.escape(message)):
                make(**bad)
    with pytest.raises(ConfigError, match="request_timeout_s must be > 0, got 0"):
        Limits(request_timeout_s=0)


def test_open_bounds_reach_the_checks_the_help_and_the_openapi_schema():
    for value in (0.0, 1.5):
        with pytest.raises(ConfigError, match=r"top_p must be in \(0, 1\]"):
            EnsembleConfig(top_p=value)
    assert EnsembleConfig(top_p=1.0).top_p == 1.0 and EnsembleConfig(top_p=1e-9).top_p == 1e-9
    with pytest.raises(ConfigError, match="exit_temperature must be > 0, got 0.0"):
        EnsembleConfig(exit_temperature=0.0)
    properties = SpecfuseOptions.model_json_schema()["properties"]
    top_p = next(s for s in properties["top_p"]["anyOf"] if s.get("type") == "number")
    assert (top_p.get("exclusiveMinimum"), top_p.get("maximum"), "minimum" in top_p) == (0.0, 1.0, False)
    exit_t = next(s for s in properties["exit_temperature"]["anyOf"] if s.get("type") == "number")
    assert exit_t.get("exclusiveMinimum") == 0.0
    seg = next(s for s in properties["segment_len"]["anyOf"] if s.get("type") == "integer")
    assert (seg.get("minimum"), seg.get("maximum")) == (1, 256)
    assert "nucleus sampling mass, in (0, 1] (default: 1.0)" in " ".join(cli_parser().format_help().split())
