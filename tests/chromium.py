"""Debian's chromium as everything here drives it through Playwright: the browser tests (conftest's
`browser`) and the screenshots (assets/make_*.py, run as scripts from the repository root). Neither
pytest nor playwright is imported here: the scripts import this module too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
# The same Blink without the browser's own windows and UI pages (Debian's chromium-headless-shell, the
# build Playwright itself runs headless): a Gradio page costs about a quarter less CPU to open in it
# (6.2–7.4 CPU-s against 8.7–10.2, the page and its first seconds, on two AVX2 cores). Chromium where
# it is not installed.
HEADLESS_SHELL = Path("/usr/bin/chromium-headless-shell")


def executable() -> Path:
    """The browser the tests drive: the headless shell if installed, else chromium."""
    return HEADLESS_SHELL if HEADLESS_SHELL.exists() else CHROMIUM


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright: Any) -> Any:
    """Debian's chromium (its headless shell where installed) under `playwright` (a sync_playwright()
    context): no download."""
    return playwright.chromium.launch(executable_path=str(executable()), args=CHROMIUM_ARGS, headless=True)
