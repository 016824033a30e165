"""Debian's chromium as everything here drives it through Playwright: the browser tests (conftest's
`browser`) and the screenshots (assets/make_*.py, run as scripts from the repository root). Neither
pytest nor playwright is imported here: the scripts import this module too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
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
    """Debian's chromium, headless, under `playwright` (a sync_playwright() context): no download."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
