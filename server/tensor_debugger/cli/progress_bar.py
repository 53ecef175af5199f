"""A progress bar on standard error, drawn only when it is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.enabled = self.stream.isatty()
        self.started = time.perf_counter()
        self._last = 0.0

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        fraction = done / total if total else 1.0
        filled = int(self.width * fraction)
        rate = done / max(now - self.started, 1e-9) / 1e6
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {fraction:6.1%} {done / 1e6:9.1f} MB {rate:7.1f} MB/s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
