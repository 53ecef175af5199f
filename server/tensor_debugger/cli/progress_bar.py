"""A progress bar on standard error, drawn only when it is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30, unit: str = "MB") -> None:
        """`unit`: "MB" (done and total are bytes) or "pairs"."""
        self.label = label
        self.unit = unit
        self.suffix = ""  # said after the figures
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
        bar = "#" * filled + "-" * (self.width - filled)
        if self.unit == "MB":
            rate = done / max(now - self.started, 1e-9) / 1e6
            figures = f"{done / 1e6:9.1f} MB {rate:7.1f} MB/s"
        else:
            figures = f"{done} of {total} {self.unit}"
        self.stream.write(f"\r{self.label} [{bar}] {fraction:6.1%} {figures}{self.suffix}\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


class StatusLine:
    """A compare's progress on standard error (a terminal only), one line per step: each run's ingest in bytes,
    with the pairs compared so far while the candidate ingests, then the pairs computed after the plan."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._bar: ProgressBar | None = None
        self._step = ""
        self._early = (0, 0)  # pairs compared while ingesting, of them outside tolerance

    def update(self, step: str, done: int, total: int) -> None:
        """`compare.requests.StepProgress`."""
        if step == "early":
            self._early = (done, total)
            if self._bar is not None:
                self._bar.suffix = self._early_text()
            return
        if step != self._step:
            self.close()
            self._step = step
            unit = "pairs" if step == "compare" else "MB"
            self._bar = ProgressBar(step, self.stream, unit=unit)
            self._bar.suffix = self._early_text() if step.startswith("ingest") else ""
        assert self._bar is not None
        self._bar.update(done, total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _early_text(self) -> str:
        compared, failed = self._early
        return f", {compared} pairs compared ({failed} outside tolerance)" if compared else ""
