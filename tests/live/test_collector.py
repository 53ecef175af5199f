"""The cyclic garbage collector during a capture: the process's objects frozen while it runs, given back after."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from tensor_debugger import capture
from tensor_debugger.live.recorder import record
from torch import nn


def test_a_capture_freezes_the_objects_before_it_and_gives_them_back_after(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert gc.get_freeze_count() == 0
    during: list[int] = []
    with torch.no_grad(), capture(model, "s", "r", data_dir=tmp_path, level="op", values="summary") as result:
        during.append(gc.get_freeze_count())
        model(torch.ones(2, 4))
    assert during[0] > 0 and gc.get_freeze_count() == 0
    assert result.tensors > 0
    with torch.no_grad(), record(model, level="op", values="summary"):
        during.append(gc.get_freeze_count())
        model(torch.ones(2, 4))
    assert during[1] > 0 and gc.get_freeze_count() == 0


def test_a_block_that_raises_gives_the_objects_back_and_a_freeze_of_the_users_stays(tmp_path: Path) -> None:
    model = nn.Linear(4, 4)
    with pytest.raises(RuntimeError, match="the user's"), capture(model, "s", "r", data_dir=tmp_path):
        model(torch.ones(1, 4))
        raise RuntimeError("the user's error")
    assert gc.get_freeze_count() == 0
    gc.freeze()  # the user's own freeze: left as it is, during and after
    try:
        with torch.no_grad(), capture(model, "s", "r2", data_dir=tmp_path, values="summary"):
            model(torch.ones(1, 4))
        assert gc.get_freeze_count() > 0  # not given back by the capture (its own freeze would be 0 after)
    finally:
        gc.unfreeze()
