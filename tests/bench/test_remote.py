"""The served-vs-in-process benchmark's pure parts: the report table and a missing binary."""

from __future__ import annotations

from pathlib import Path

import pytest

from specfuse.bench.remote import format_report, llama_server, llama_server_binary
from specfuse.errors import SpecfuseError


def test_the_report_puts_both_setups_side_by_side_with_ratios():
    row = {"tokens": 100, "rounds": 10, "seconds": 10.0, "tokens_per_s": 10.0, "first_segment_s": 1.0}
    report = {
        "models": ["a", "b"],
        "max_new_tokens": 100,
        "in_process": row,
        "llama_server": {**row, "tokens_per_s": 25.0, "first_segment_s": 0.5},
        "load_average": (1.0, 1.0, 1.0),
    }
    text = format_report(report)
    assert "tokens/s" in text and "2.50" in text and "0.50" in text and "load average" in text


def test_a_missing_binary_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_DIR", str(tmp_path))
    assert llama_server_binary() == tmp_path / "bin" / "llama-server"
    with pytest.raises(SpecfuseError, match="make llama-server"), llama_server(Path("model.gguf")):
        pass
