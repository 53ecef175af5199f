"""Debian's Chromium, driven by Playwright: one browser for the whole run (tests/web/conftest.py's `browser`)."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
# no sandbox (tests run as root here), no GPU, and none of Chromium's own network traffic
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
