"""The app in a real browser: Playwright drives Debian's chromium."""
