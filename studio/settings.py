"""The settings form, built from EnsembleConfig's settings, and the config read back from it.

One mapping from a setting's type and description (help, choices, low, high, group; see
specfuse.config.settings) to a widget, plus a small override table for widget choices. A field added
to EnsembleConfig appears in the form without a change here. Knows nothing about runs or rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gradio as gr

from specfuse import ConfigError, EnsembleConfig
from specfuse.config import Setting, settings

GROUPS = ("run", "sampling", "scoring", "feedback", "exit", "gate")

# Where the metadata alone would give a poor widget: a label, a slider's practical range, a radio.
OVERRIDES: dict[str, dict[str, Any]] = {
    "segment_len": {"label": "Segment length L", "high": 64},
    "max_new_tokens": {"label": "Max new tokens", "high": 1024},
    "max_rounds": {"label": "Max rounds (empty: no limit)"},
    "temperature": {"label": "Temperature (0 = greedy)", "high": 2.0, "step": 0.05},
    "top_p": {"label": "Top-p", "low": 0.05, "step": 0.05},
    "learning_rate": {"label": "Learning-rate scale α", "high": 10.0, "step": 0.1},
    "exit_threshold": {"label": "Exit threshold δ", "step": 0.05},
    "exit_warmup": {"label": "Exit warm-up (rounds)", "high": 20},
    "exit_temperature": {"label": "Exit temperature τ₀"},
    "feedback": {"label": "Online feedback"},
    "exit": {"label": "Model exit"},
    "self_scores": {"label": "Include self-scores"},
    "score": {"label": "Score", "widget": "radio"},
    "normalization": {"label": "Normalization", "widget": "radio"},
    "stop_strings": {"label": "Stop strings (one per line)"},
}


def _label(name: str) -> str:
    return name.replace("_", " ").capitalize()


def widget(setting: Setting, value: Any) -> gr.components.Component:
    """The one widget for one setting: bool → Checkbox, choices → Dropdown (or Radio), a number with
    both bounds → Slider, other numbers → Number, a tuple of strings → Textbox (one per line)."""
    kind, optional = setting.kind, setting.optional
    described = {"help": setting.help, "choices": setting.choices, "low": setting.low, "high": setting.high}
    meta = {**described, **OVERRIDES.get(setting.name, {})}
    common: dict[str, Any] = {
        "label": meta.get("label") or _label(setting.name),
        "info": meta.get("help"),
        "elem_id": f"setting-{setting.name}",
    }
    low, high = meta.get("low"), meta.get("high")
    if kind is bool:
        return gr.Checkbox(bool(value), **common)
    if meta.get("choices"):
        if meta.get("widget") == "radio":
            return gr.Radio(list(meta["choices"]), value=value, **common)
        return gr.Dropdown(list(meta["choices"]), value=value, **common)
    if kind in (int, float) and optional:
        # A text box, not a Number: an empty Number turns into 0 when its accordion opens, and
        # Gradio then refuses every run with a message that names no field (issue 24, item 9).
        return gr.Textbox("" if value is None else str(value), placeholder="empty: no limit", **common)
    if kind in (int, float):
        step = meta.get("step", 1 if kind is int else 0.01)
        if low is not None and high is not None:
            return gr.Slider(low, high, value=value, step=step, **common)
        precision = 0 if kind is int else None
        return gr.Number(value, precision=precision, step=step, minimum=low, maximum=high, **common)
    if setting.item is not None:
        return gr.Textbox("\n".join(str(v) for v in value or ()), lines=2, **common)
    return gr.Textbox("" if value is None else str(value), **common)


def build_settings(defaults: EnsembleConfig) -> dict[str, gr.components.Component]:
    """The form, one widget per EnsembleConfig field, grouped by the fields' `group`; by field name.

    Call it inside a Blocks context: it renders the groups as accordions.
    """
    rows = settings()
    groups = [g for g in GROUPS if any(s.group == g for s in rows)]
    groups += sorted({s.group for s in rows} - set(groups))
    widgets: dict[str, gr.components.Component] = {}
    for group in groups:
        with gr.Accordion(group.capitalize(), open=group == "run"):
            for setting in rows:
                if setting.group == group:
                    widgets[setting.name] = widget(setting, getattr(defaults, setting.name))
    return widgets


def _number(value: Any, name: str) -> float:
    """A form number: sliders and number boxes send floats, text boxes and API callers strings."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(f"{_label(name).lower()} must be a number, got {value[:40]!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{_label(name).lower()} must be a number, got {type(value).__name__}")
    return value


def _whole(value: Any, name: str) -> int:
    """A form number that must be a whole number."""
    number = _number(value, name)
    if number != number or number in (float("inf"), float("-inf")) or number != int(number):
        raise ConfigError(f"{_label(name).lower()} must be a whole number, got {value!r}")
    return int(number)


def _items(value: Any, name: str, item: type) -> tuple[Any, ...]:
    """A one-per-line text box (or an API caller's list) as the field's tuple: stop strings stay
    text, weights become numbers."""
    if isinstance(value, str):
        lines: list[Any] = [line for line in value.split("\n") if line]
    elif isinstance(value, (list, tuple)):
        lines = list(value)
    else:
        raise ConfigError(
            f"{_label(name).lower()} must be text with one value per line, got {type(value).__name__}"
        )
    if item is str:
        if not all(isinstance(v, str) for v in lines):
            raise ConfigError(f"{_label(name).lower()} must be text, one per line")
        return tuple(lines)
    return tuple(_whole(v, name) if item is int else _number(v, name) for v in lines)


def _flag(value: Any, name: str) -> bool:
    """A checkbox: True/False, or an API caller's "true"/"false" (bool("false") would be True)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{_label(name).lower()} must be true or false, got {str(value)[:40]!r}")


def config_from_form(values: Mapping[str, Any]) -> EnsembleConfig:
    """The run's EnsembleConfig from the form's values by field name; EnsembleConfig validates them.

    Fields missing from `values` keep their defaults (an API caller may send only some).
    """
    kwargs: dict[str, Any] = {}
    for setting in settings():
        name, kind = setting.name, setting.kind
        if name not in values:
            continue
        value = values[name]
        if setting.optional and (value is None or (isinstance(value, str) and not value.strip())):
            kwargs[name] = None
        elif kind is bool:
            kwargs[name] = _flag(value, name)
        elif kind is int:
            kwargs[name] = _whole(value, name)
        elif kind is float:
            kwargs[name] = _number(value, name)
        elif setting.item is not None:
            kwargs[name] = _items(value, name, setting.item)
        else:
            kwargs[name] = value
    return EnsembleConfig(**kwargs)


def form_value(setting: Setting, value: Any) -> Any:
    """A setting's value as its widget holds it (the inverse of config_from_form for that field)."""
    if setting.kind is bool or setting.choices:
        return value
    if setting.kind in (int, float) and setting.optional:
        return "" if value is None else str(value)
    if setting.kind in (int, float):
        return value
    if setting.item is not None:
        return "\n".join(str(v) for v in value or ())
    return "" if value is None else str(value)


def form_values(config: EnsembleConfig) -> dict[str, Any]:
    """Every widget's value for `config`, by field name (a lesson's settings filling the form)."""
    return {s.name: form_value(s, getattr(config, s.name)) for s in settings()}
