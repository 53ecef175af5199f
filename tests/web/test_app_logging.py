"""The app configures no logging of its own: the program that builds it keeps its root logger (a test, a notebook)."""

from __future__ import annotations

import logging
from pathlib import Path

from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app


def test_building_the_app_leaves_the_root_logger_alone(tmp_path: Path) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    create_app(Settings(data_dir=tmp_path / "data", demo=False))
    # Litestar's default would add a handler bound to the stream of the moment (here pytest's capture, closed after
    # the test: a thread logging later wrote "--- Logging error ---") and raise the root level to INFO
    assert root.handlers == handlers
    assert root.level == level
