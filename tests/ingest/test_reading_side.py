"""The reading side of an ingest (the copy of a run's files, the readers, the writer, the chunk loop) imports no
SQLAlchemy, so that it could run before the database's side is imported (issue 31: a first compare's start-up),
and a database error met while a file is copied still stops the run instead of failing that file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.exc import OperationalError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.run_copy import RunCopy
from tensor_debugger.ingest.runs import archive_limits
from tensor_debugger.ingest.taps import TensorTap
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.dtypes import LogicalDtype

READING_SIDE = (
    "tensor_debugger.ingest.run_copy",
    "tensor_debugger.ingest.writer",
    "tensor_debugger.ingest.block_readers",
    "tensor_debugger.ingest.tensor_files",
    "tensor_debugger.ingest.fingerprints",
    "tensor_debugger.store.arrays",
    "tensor_debugger.store.chunk_reader",
    "tensor_debugger.compare.compute.chunk_loop",
    "tensor_debugger.engine.streaming",
    "tensor_debugger.engine.where",
)


def test_the_reading_side_imports_no_sqlalchemy() -> None:
    probe = (
        f"import sys\nfor name in {READING_SIDE!r}:\n    __import__(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


class _RaisingTap:
    """A run's tap that raises `error` at the first tensor the copy begins (as a comparison's database read may)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.closed = False

    def tensor(
        self, name: str, key: str, shape: tuple[int, ...], dtype: LogicalDtype, chunks: tuple[int, ...]
    ) -> TensorTap | None:
        raise self.error

    def close(self) -> None:
        self.closed = True


def test_a_database_error_stops_the_run_and_any_other_error_fails_the_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    np.save(run / "x.npy", np.arange(64, dtype=np.float32))
    services = open_services(Settings(data_dir=tmp_path / "data", demo=False))
    try:
        copy = RunCopy(
            services.store, services.settings, archive_limits(services.settings), services.ingestor.kernel, None, None
        )
        staging = tmp_path / "staging"
        staging.mkdir()
        locked = OperationalError("SELECT 1", {}, Exception("database is locked"))
        with pytest.raises(OperationalError):
            copy.run(1, [InputFile(run, "run")], staging, None, None, _RaisingTap(locked))
        stored, problems, _ = copy.run(2, [InputFile(run, "run")], staging, None, None, _RaisingTap(ValueError("odd")))
        assert stored == []
        assert [p.file for p in problems] == ["run/x.npy"]
        assert "odd" in problems[0].reason
    finally:
        services.close()
