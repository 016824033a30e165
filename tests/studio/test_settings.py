"""The settings form: one widget per EnsembleConfig field, and the config read back from it."""

from __future__ import annotations

import dataclasses

import gradio as gr
import pytest

from specfuse import ConfigError, EnsembleConfig
from studio import settings


def test_the_settings_form_has_a_widget_for_every_config_field():
    with gr.Blocks():
        form = settings.build_settings(EnsembleConfig())
    assert sorted(form) == sorted(f.name for f in dataclasses.fields(EnsembleConfig))
    assert isinstance(form["feedback"], gr.Checkbox)
    assert isinstance(form["normalization"], gr.Radio) and isinstance(form["verify"], gr.Dropdown)
    assert "parallel" not in form  # where members run is the operator's (--parallel), not a run's
    assert isinstance(form["exit_threshold"], gr.Slider) and isinstance(form["seed"], gr.Number)
    assert form["top_p"].minimum == 0.05  # the override table narrows what the metadata allows
    assert form["segment_len"].info == EnsembleConfig.__dataclass_fields__["segment_len"].metadata["help"]


def test_the_config_is_read_back_from_the_form_by_field_name():
    values = {f.name: getattr(EnsembleConfig(), f.name) for f in dataclasses.fields(EnsembleConfig)}
    values |= {"segment_len": 4.0, "max_rounds": None, "stop_strings": "END\n\nSTOP", "feedback": False}
    config = settings.config_from_form(values)
    assert config.segment_len == 4 and config.max_rounds is None and not config.feedback
    assert config.stop_strings == ("END", "STOP")
    assert settings.config_from_form({"max_rounds": 3.0}).max_rounds == 3


def test_make_config_refuses_fractional_whole_numbers():
    with pytest.raises(ConfigError, match="segment len must be a whole number"):
        settings.config_from_form({"segment_len": 2.5})


def test_an_optional_number_is_a_text_box_so_opening_its_accordion_cannot_turn_empty_into_zero():
    """Issue 24, item 9: an empty gr.Number became 0 when Settings opened, and every run then failed
    with Gradio's 'Value 0 is less than minimum value 1.', which names no field."""
    with gr.Blocks():
        form = settings.build_settings(EnsembleConfig())
    assert isinstance(form["max_rounds"], gr.Textbox) and form["max_rounds"].value == ""
    assert settings.config_from_form({"max_rounds": ""}).max_rounds is None
    assert settings.config_from_form({"max_rounds": " 4 "}).max_rounds == 4
    with pytest.raises(ConfigError, match="max rounds must be a number, got 'lots'"):
        settings.config_from_form({"max_rounds": "lots"})
    with pytest.raises(ConfigError, match="max_rounds"):  # EnsembleConfig names the field and its bound
        settings.config_from_form({"max_rounds": "0"})


def test_an_api_callers_strings_are_read_as_what_they_say():
    """Issue 24, item 14: the string "false" for a checkbox became True."""
    assert settings.config_from_form({"feedback": "false"}).feedback is False
    assert settings.config_from_form({"feedback": "True"}).feedback is True
    with pytest.raises(ConfigError, match="feedback must be true or false"):
        settings.config_from_form({"feedback": "maybe"})
    assert settings.config_from_form({"learning_rate": "0.5"}).learning_rate == 0.5
    with pytest.raises(ConfigError, match="must be a whole number"):
        settings.config_from_form({"segment_len": "nan"})


def test_one_per_line_settings_become_the_fields_tuple_or_a_clear_error():
    """Weights typed one per line were refused as text ('0.5' is not a float); an API caller's 1 or
    [1] for a one-per-line field was a TypeError traceback (a Hypothesis probe found it)."""
    assert settings.config_from_form({"initial_weights": "0.5\n0.25"}).initial_weights == (0.5, 0.25)
    assert settings.config_from_form({"initial_weights": [1, 3]}).initial_weights == (1.0, 3.0)
    assert settings.config_from_form({"stop_strings": ["END", "STOP"]}).stop_strings == ("END", "STOP")
    with pytest.raises(ConfigError, match="initial weights must be text with one value per line, got int"):
        settings.config_from_form({"initial_weights": 1})
    with pytest.raises(ConfigError, match="stop strings must be text, one per line"):
        settings.config_from_form({"stop_strings": [1]})
    with pytest.raises(ConfigError, match="initial weights must be a number, got 'x'"):
        settings.config_from_form({"initial_weights": "x"})
