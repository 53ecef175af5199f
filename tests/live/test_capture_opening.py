"""A local capture opens its data dir (making the database where it is new) and begins its run on a thread of its
own while the block runs: with values="summary" the opening overlaps the forward, and what it raises is said when
the block ends, nothing stored; with values="full" the run is needed at once, and a data dir that cannot be used
stops the capture before the block runs. Labels are read at once either way."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import RunRecord, SessionRecord
from torch import nn


def stored_runs(data_dir: Path) -> list[tuple[str, str, str]]:
    services = open_services(Settings(data_dir=data_dir, demo=False))
    try:
        with services.sessions() as db:
            rows = db.execute(
                select(SessionRecord.name, RunRecord.label, RunRecord.status).join(
                    SessionRecord, RunRecord.session_id == SessionRecord.id
                )
            )
            return [(name, label, status) for name, label, status in rows]
    finally:
        services.close()


def test_a_summary_capture_into_a_new_data_dir_begins_its_run_while_the_block_runs(tmp_path: Path) -> None:
    """The run is begun ("ingesting") by the time the block's forward ends, by another thread than the block's,
    and made ready when the block ends."""
    data = tmp_path / "new"
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    opened_by: list[str] = []
    original = open_services

    def watched(*args: object, **kwargs: object) -> object:
        opened_by.append(threading.current_thread().name)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    import tensor_debugger.services as services_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(services_module, "open_services", watched)
        with torch.no_grad(), capture(net, "s", "r", data_dir=data, level="op", values="summary") as result:
            net(torch.randn(2, 4))
    assert opened_by == ["capture-open"]
    assert result.run_id is not None and result.tensors > 0
    assert stored_runs(data) == [("s", "r", "ready")]


def test_a_data_dir_that_cannot_be_opened_is_said_when_a_summary_blocks_ends(tmp_path: Path) -> None:
    """A data dir that is a file: the summary capture's block runs, and its end raises the error naming the path,
    nothing stored anywhere; the full capture raises it before its block runs."""
    not_a_folder = tmp_path / "data"
    not_a_folder.write_text("a file, not a data dir")
    net = nn.Linear(4, 4)
    ran: list[str] = []
    with (
        pytest.raises(OSError, match="data"),
        torch.no_grad(),
        capture(net, "s", "r", data_dir=not_a_folder, values="summary"),
    ):
        net(torch.randn(2, 4))
        ran.append("summary")
    with pytest.raises(OSError, match="data"), torch.no_grad(), capture(net, "s", "r", data_dir=not_a_folder):
        ran.append("full")
    assert ran == ["summary"]
    assert not_a_folder.read_text() == "a file, not a data dir"


@pytest.mark.parametrize("values", ["summary", "full"])
def test_a_block_that_raises_keeps_no_run_in_a_new_data_dir(tmp_path: Path, values: str) -> None:
    """The block raising while (or after) the run is begun: the run is removed, its new session too."""
    data = tmp_path / "new"
    net = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="boom"), capture(net, "s", "r", data_dir=data, values=values):
        net(torch.randn(2, 4))
        raise ValueError("boom")
    assert stored_runs(data) == []


def test_a_wrong_label_is_said_before_the_block_runs(tmp_path: Path) -> None:
    net = nn.Linear(4, 4)
    ran: list[str] = []
    with (
        pytest.raises(InvalidInputError, match="run label"),
        capture(net, "s", "   ", data_dir=tmp_path / "data", values="summary"),
    ):
        ran.append("block")
    assert ran == []
